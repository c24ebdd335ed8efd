"""What is particular to `PostgresStore`: start-up, migration, the server's clock, JSON."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from handrail import AuditEntry, SessionRecord, StoreError

from .conftest import PG_DSN, empty_pg_schema, skip_without_postgres

pytestmark = pytest.mark.postgres

try:
    import psycopg

    from handrail.store import PostgresStore
    from handrail.store.postgres import MIGRATIONS, SCHEMA_VERSION, mask_dsn
except ImportError:  # reported loudly by skip_without_postgres
    pass


@pytest.fixture
async def fresh_schema(pg_schema: str) -> AsyncIterator[str]:
    """A schema nobody has made yet, dropped after the test."""
    schema = f"{pg_schema}_fresh"
    yield schema
    async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
        await connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
async def store(pg_schema: str) -> AsyncIterator[PostgresStore]:
    async with PostgresStore(PG_DSN, schema=pg_schema) as store:
        await empty_pg_schema(pg_schema)
        yield store


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        (
            "postgresql://ann:s3cret@db:5432/app",
            "user=ann password=*** dbname=app host=db port=5432",
        ),
        ("host=db password=s3cret user=ann", "user=ann password=*** host=db"),
        ("postgresql://ann@db/app", "user=ann dbname=app host=db"),
        ("not a dsn password=s3cret", "not a dsn password=***"),
    ],
)
def test_a_dsns_password_is_masked(dsn: str, masked: str) -> None:
    skip_without_postgres()
    assert mask_dsn(dsn) == masked


async def test_an_unreachable_server_fails_at_start_up_with_the_fix() -> None:
    skip_without_postgres()
    dsn = "postgresql://postgres:s3cret@127.0.0.1:1/test"
    with pytest.raises(StoreError) as caught:
        await PostgresStore.connect(dsn, connect_timeout=2)
    message = str(caught.value)
    assert "s3cret" not in message
    assert "password=***" in message and "port=1" in message
    assert "Check that the server is running" in message


def test_a_schema_must_be_a_plain_name() -> None:
    skip_without_postgres()
    with pytest.raises(ValueError, match="schema"):
        PostgresStore(PG_DSN, schema='x"; DROP TABLE y; --')


def test_a_pool_has_at_least_one_connection() -> None:
    skip_without_postgres()
    with pytest.raises(ValueError, match="pool_size"):
        PostgresStore(PG_DSN, pool_size=0)


async def test_opening_twice_is_harmless_and_a_closed_store_stays_closed(pg_schema: str) -> None:
    store = PostgresStore(PG_DSN, schema=pg_schema)
    await store.open()
    await store.open()
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.open()
    with pytest.raises(StoreError, match="closed"):
        async with store.listen():
            pass


async def test_workers_starting_at_once_make_the_schema_once(fresh_schema: str) -> None:
    stores = await asyncio.gather(
        *(PostgresStore.connect(PG_DSN, schema=fresh_schema, pool_size=1) for _ in range(6))
    )
    try:
        await stores[0].save(SessionRecord(id="s-1"))
        assert await stores[5].load("s-1") is not None
    finally:
        for store in stores:
            await store.close()
    async with await psycopg.AsyncConnection.connect(PG_DSN) as connection:
        cursor = await connection.execute(
            f'SELECT version FROM "{fresh_schema}".handrail_schema_version'
        )
        assert await cursor.fetchall() == [(v,) for v in range(1, SCHEMA_VERSION + 1)]


async def test_a_version_1_schema_is_migrated_and_keeps_its_sessions(fresh_schema: str) -> None:
    s = f'"{fresh_schema}"'
    async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
        await connection.execute(f"CREATE SCHEMA {s}")
        await connection.execute(
            f"CREATE TABLE {s}.handrail_schema_version "
            f"(version integer PRIMARY KEY, applied_at double precision NOT NULL)"
        )
        for statement in MIGRATIONS[1]:
            await connection.execute(statement.format(s=s))
        await connection.execute(f"INSERT INTO {s}.handrail_schema_version VALUES (1, 0)")
        await connection.execute(
            f"INSERT INTO {s}.handrail_sessions "
            f"VALUES ('s-1', NULL, NULL, 'active', 1, 0, 0, NULL, '{{}}')"
        )
    async with PostgresStore(PG_DSN, schema=fresh_schema) as store:
        assert await store.load("s-1") is not None
        assert await store.append_events("s-1", [{"type": "run-started"}]) == 1
        assert (await store.append_audit(AuditEntry(org_id="acme", session_id="s-1"))).seq == 1
    async with await psycopg.AsyncConnection.connect(PG_DSN) as connection:
        cursor = await connection.execute(
            f"SELECT version FROM {s}.handrail_schema_version ORDER BY version"
        )
        assert await cursor.fetchall() == [(v,) for v in range(1, SCHEMA_VERSION + 1)]


async def test_a_schema_from_a_newer_handrail_is_refused(fresh_schema: str) -> None:
    async with PostgresStore(PG_DSN, schema=fresh_schema) as store:
        await store.save(SessionRecord(id="s-1"))
    async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
        await connection.execute(
            f'INSERT INTO "{fresh_schema}".handrail_schema_version VALUES (%s, 0)',
            (SCHEMA_VERSION + 1,),
        )
    with pytest.raises(StoreError, match=rf"version {SCHEMA_VERSION + 1}, newer .* upgrade"):
        await PostgresStore.connect(PG_DSN, schema=fresh_schema)


async def test_by_default_times_come_from_the_servers_clock(store: PostgresStore) -> None:
    before = time.time()
    saved = await store.save(SessionRecord(id="s-1"))
    assert before - 5 < saved.created_at == saved.updated_at < time.time() + 5
    assert await store.acquire_lease("s-1", "w1", ttl=60)
    assert not await store.acquire_lease("s-1", "w2", ttl=60)


async def test_a_row_that_is_not_an_object_raises_a_store_error(store: PostgresStore) -> None:
    await store.save(SessionRecord(id="bad", data={"n": 1}))
    async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
        await connection.execute(
            f"UPDATE \"{store.schema}\".handrail_sessions SET data = '[1]' WHERE id = 'bad'"
        )
    with pytest.raises(StoreError, match=r"Session 'bad'.*JSON list, not an object"):
        await store.load("bad")


async def test_the_store_opens_on_first_use(pg_schema: str) -> None:
    store = PostgresStore(PG_DSN, schema=pg_schema)
    try:
        assert await store.load("nope") is None
    finally:
        await store.close()


async def test_a_listener_whose_connection_dies_is_told(store: PostgresStore) -> None:
    async with store.listen() as wakeups:
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as admin:
            await admin.execute(  # only this test's listener: the server is shared
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = %s",
                (f'LISTEN "{store.channel}"',),
            )
        with pytest.raises(StoreError, match="Lost the PostgreSQL connection"):
            async with asyncio.timeout(5):
                await anext(wakeups)


async def test_the_pool_says_how_it_is_used(pg_schema: str) -> None:
    store = PostgresStore(PG_DSN, schema=pg_schema, pool_size=3)
    assert store.pool_stats() == {}  # not open yet
    try:
        await asyncio.gather(*(store.events(f"s-{n}") for n in range(6)))
        stats = store.pool_stats()
    finally:
        await store.close()
    assert stats["pool_max"] == 3
    assert 1 <= stats["pool_size"] <= 3
    assert stats["requests_num"] >= 6


async def test_event_notices_work_with_the_longest_schema_name(pg_schema: str) -> None:
    schema = f"{pg_schema}_{'x' * 54}"[:54]
    try:
        async with PostgresStore(PG_DSN, schema=schema) as writer:
            assert len(writer.events_channel) <= 63  # PostgreSQL's longest name
            async with (
                PostgresStore(PG_DSN, schema=schema) as reader,
                reader.listen_events() as notices,
            ):
                await writer.append_events("s-1", [{"type": "run-started"}])
                async with asyncio.timeout(5):
                    assert await anext(notices) == ("s-1", 1)
    finally:
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as admin:
            await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def test_an_append_is_not_failed_by_its_notice(
    store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.events_channel = ""  # PostgreSQL refuses to notify an empty channel
    assert await store.append_events("s-1", [{"type": "run-started"}]) == 1
    assert await store.append_events("s-1", [{"type": "run-completed"}]) == 2
    assert [seq for seq, _ in await store.events("s-1")] == [1, 2]
    async with asyncio.timeout(5):
        while not any("Could not announce" in r.message for r in caplog.records):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
