"""`PartitionedStore`: organisations over several stores, one engine over them all.

The first tests use memory stores (routing, refusals, the fleet-wide calls merged, checked
against one plain store given the same writes). The last ones run two real PostgreSQL
databases behind one engine and a worker: each organisation's sessions, logs and audit trail
land in its own database only, the inbox and the worker span both, and each partition's
audit trail verifies.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from handrail import (
    Agent,
    Approve,
    ConfigError,
    Engine,
    RoutingError,
    Runtime,
    SessionRecord,
    StoreError,
    ToolContext,
    Worker,
    tool,
)
from handrail.audit import AuditEntry, AuditKey, verify
from handrail.models import ModelRequest
from handrail.policy import Decider
from handrail.store import (
    MemoryStore,
    PartitionedStore,
    SessionStore,
    WaitingCard,
    WaitingRow,
    session_id_for,
)
from handrail.testing import FunctionModel, call

from .conftest import PG_HOST, PG_PORT, Clock, skip_without_postgres

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))  # partitioned_app, for the worker test
KEY = AuditKey("part-test", b"k" * 32)
HOMES = {"acme": "a", "globex": "b", "hooli": "zz"}  # hooli: a partition that does not exist


def home(org_id: str | None) -> str:
    return HOMES[org_id]  # type: ignore[index] - an unknown organisation raises KeyError


def memory_pair(clock: Clock, **options: Any) -> tuple[PartitionedStore, dict[str, MemoryStore]]:
    parts = {key: MemoryStore(clock=clock, audit_key=KEY) for key in "ab"}
    return PartitionedStore(parts, home, **options), parts


async def everything(store: MemoryStore) -> list[Any]:
    """What a memory store holds, for checking that a refused call wrote nothing."""
    sessions = await store.list(limit=1000)
    return [
        sessions,
        [await store.events(s.id) for s in sessions],
        [await store.tool_log(s.id) for s in sessions],
        await store.due(float("inf")),
        [await store.audit(org) for org in (None, "acme", "globex", "hooli")],
    ]


# -- routing -------------------------------------------------------------------------------


async def test_ids_name_their_organisations_partition_and_calls_follow_them(clock: Clock):
    store, parts = memory_pair(clock)
    acme, globex = store.id_for("acme"), store.id_for("globex", "chat-7")
    assert acme.startswith("a:") and len(acme) == 2 + 32 and globex == "b:chat-7"
    assert (store.locate(acme), store.locate(globex), store.locate("chat-7")) == ("a", "b", None)
    assert session_id_for(store, "globex", "chat-7") == "b:chat-7"
    assert session_id_for(parts["a"], "globex", "chat-7") == "chat-7"  # a plain store: as is

    await store.save(SessionRecord(id=acme, org_id="acme", data={"n": 1}))
    await store.save(SessionRecord(id=globex, org_id="globex", data={"n": 2}))
    await store.append_events(globex, [{"type": "run-started"}])
    assert await store.log_started(acme, "c1", key="k", tool="t", args={})

    assert [s.id for s in await parts["a"].list()] == [acme]
    assert [s.id for s in await parts["b"].list()] == [globex]
    assert await parts["b"].events(globex) == [(1, {"type": "run-started"})]
    assert [e.tool_call_id for e in await parts["a"].tool_log(acme)] == ["c1"]
    assert (await store.load(globex)).data == {"n": 2}  # type: ignore[union-attr]
    assert [s.id for s in await store.list(org_id="globex")] == [globex]


@pytest.mark.parametrize(
    ("org", "told"),
    [
        ("initech", ["'initech'", "KeyError", "make it name one of ['a', 'b']"]),
        ("hooli", ["'hooli'", "named 'zz'", "which is no partition", "['a', 'b']"]),
    ],
)
async def test_a_route_that_raises_or_names_no_partition_is_a_routing_error_and_writes_nothing(
    clock: Clock, org: str, told: list[str]
):
    store, parts = memory_pair(clock)
    elsewhere = MemoryStore()
    await elsewhere.save(SessionRecord(id="a:s-1", org_id=org))
    document = await elsewhere.export("a:s-1")
    before = [await everything(p) for p in parts.values()]
    with pytest.raises(RoutingError) as raised:
        store.id_for(org)
    assert raised.value.org_id == org and isinstance(raised.value, StoreError)
    for text in told:
        assert text in str(raised.value)

    attempts = [
        store.save(SessionRecord(id="a:s-1", org_id=org)),
        store.append_audit(AuditEntry(org_id=org, kind="call", session_id="a:s-1", tool="t")),
        store.audit(org),
        store.list(org_id=org),
        store.import_(document),
    ]
    for attempt in attempts:
        with pytest.raises(RoutingError, match=repr(org)):
            await attempt
    assert [await everything(p) for p in parts.values()] == before


async def test_a_session_id_that_names_no_partition_is_refused_for_writes_and_unknown_to_reads(
    clock: Clock,
):
    store, parts = memory_pair(clock)
    for write in [
        store.save(SessionRecord(id="s-1", org_id="acme")),
        store.acquire_lease("s-1", "w", 30),
        store.lease_and_load("s-1", "w", 30),
        store.append_events("s-1", [{"type": "run-started"}]),
        store.log_started("s-1", "c1", key="k", tool="t", args={}),
        store.notify("s-1"),
    ]:
        with pytest.raises(RoutingError, match=r"'s-1' names no partition .*store\.id_for"):
            await write
    assert await store.load("s-1") is None and await store.summary("s-1") is None
    assert await store.events("s-1") == [] and await store.messages("s-1") == []
    assert not await store.delete("s-1") and not await store.release_lease("s-1", "w")
    with pytest.raises(ValueError, match="must be 0 or more"):  # still checked, as any store
        await store.events("s-1", after=-1)
    assert [await p.list() for p in parts.values()] == [[], []]

    # With a default, such ids are its sessions (a store's own, before it was partitioned).
    store, parts = memory_pair(clock, default="a")
    await store.save(SessionRecord(id="s-1", org_id="acme"))
    assert [s.id for s in await parts["a"].list()] == ["s-1"]
    with pytest.raises(RoutingError, match="routes to 'b'"):  # still its org's partition only
        await store.save(SessionRecord(id="s-2", org_id="globex"))


async def test_a_session_never_lands_outside_its_organisations_partition(clock: Clock):
    store, parts = memory_pair(clock)
    wrong = "b:" + store.id_for("acme").partition(":")[2]  # acme's session, globex's partition
    before = [await everything(p) for p in parts.values()]
    with pytest.raises(RoutingError) as raised:
        await store.save(SessionRecord(id=wrong, org_id="acme"))
    assert (raised.value.session_id, raised.value.org_id, raised.value.key) == (wrong, "acme", "b")
    assert "never moves between partitions" in str(raised.value)

    own = await store.save(SessionRecord(id=store.id_for("acme"), org_id="acme"))
    own.audit = [AuditEntry(org_id="globex", kind="decision", session_id=own.id, tool="t")]
    with pytest.raises(RoutingError, match="routes to 'b'"):  # another org's entry, same save
        await store.save(own)
    await store.log_started(own.id, "c1", key="k", tool="t", args={})
    with pytest.raises(RoutingError):
        await store.log_finished(own.id, "c1", {"ok": True}, audit=own.audit[0])
    own.audit = []

    document = await store.export(own.id)
    with pytest.raises(RoutingError):  # the same session, imported under globex's partition
        await store.import_(document.replace(f'"{own.id}"', f'"{wrong}"'), overwrite=True)
    assert [await everything(p) for p in parts.values()][1] == before[1]
    assert (await store.import_(document, overwrite=True)).id == own.id


def test_a_bad_configuration_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match="at least one partition"):
        PartitionedStore({}, home)
    with pytest.raises(ConfigError, match="'e:u' is not a partition key"):
        PartitionedStore({"e:u": MemoryStore()}, home)
    with pytest.raises(ConfigError, match=r"default='c'.*\['a'\]"):
        PartitionedStore({"a": MemoryStore()}, home, default="c")
    with pytest.raises(ConfigError, match="partition 'a' is a dict, not a SessionStore"):
        PartitionedStore({"a": {}}, home)  # type: ignore[dict-item]


def test_every_protocol_call_is_routed_by_the_partitioned_store_itself():
    """A call the protocol gains must be routed here too (a `__getattr__` would hide it)."""
    protocol = {
        name
        for name, member in vars(SessionStore).items()
        if not name.startswith("_") and callable(member)
    }
    assert protocol <= set(vars(PartitionedStore)), protocol - set(vars(PartitionedStore))
    assert "lease_and_load" in vars(PartitionedStore)  # the fused trip of the partitions'


# -- the fleet-wide calls, merged -----------------------------------------------------------


async def test_fleet_wide_calls_answer_as_one_store_with_the_same_sessions_would(clock: Clock):
    store, parts = memory_pair(clock)
    plain = MemoryStore(clock=clock, audit_key=KEY)
    statuses = ["active", "suspended", "completed"]
    for n in range(30):
        org = ["acme", "globex"][n % 3 % 2]
        record = SessionRecord(
            id=store.id_for(org, f"s-{n:02}"),
            org_id=org,
            user_id=f"u{n % 2}",
            status=statuses[n % 3],  # type: ignore[arg-type]
            expires_at=None if n % 4 == 0 else 1000.0 + n % 5,  # ties across partitions
        )
        await store.save(record)
        await plain.save(record)
        clock.advance(n % 2)  # ties in updated_at too
    assert {len(await p.list(limit=100)) for p in parts.values()} == {10, 20}

    for query in [
        {},
        {"limit": 7},
        {"limit": 7, "offset": 7},
        {"offset": 25},
        {"status": "suspended", "limit": 4, "offset": 2},
        {"user_id": "u1"},
        {"org_id": "globex", "limit": 3, "offset": 1},
        {"updated_after": clock.now - 10, "updated_before": clock.now},
    ]:
        assert await store.list(**query) == await plain.list(**query), query
    for limit in (1, 5, 100):
        assert await store.due(1003.0, limit=limit) == await plain.due(1003.0, limit=limit)
    with pytest.raises(ValueError, match="0 or more"):
        await store.list(offset=-1)
    with pytest.raises(ValueError, match="status must be one of"):
        await store.list(status="waiting")  # type: ignore[arg-type]


async def test_the_inbox_index_answers_as_one_store_with_the_same_cards_would(clock: Clock):
    store, parts = memory_pair(clock)
    plain = MemoryStore(clock=clock, audit_key=KEY)
    for n in range(24):
        org = ["acme", "globex"][n % 3 % 2]
        cards = [
            WaitingCard(
                tool_call_id=f"c{n}-{k}", tool=["refund", "pay"][(n + k) % 2], kind="approval"
            )
            for k in range(n % 3)  # none, one or two cards
        ]
        record = SessionRecord(
            id=store.id_for(org, f"s-{n:02}"),
            org_id=org,
            user_id=f"u{n % 2}",
            status="suspended" if n % 4 else "active",
            cards=cards,
        )
        await store.save(record)
        await plain.save(record)
        clock.advance(n % 2)  # ties in updated_at across partitions
    for part in parts.values():
        assert await part.waiting(org_id=None)  # both hold cards

    def keys(rows: list[WaitingRow]) -> list[tuple[float, str, int]]:
        return [row.key for row in rows]

    for query in [
        {"org_id": None},
        {"org_id": None, "limit": 5},
        {"org_id": "acme"},
        {"org_id": "globex", "tool": "pay"},
        {"org_id": None, "tool": "refund", "limit": 3},
        {"org_id": None, "exclude_user": "u1"},
    ]:
        whole = await plain.waiting(**query)
        assert keys(await store.waiting(**query)) == keys(whole), query
        if len(whole) > 2:  # the page after a key, across partitions
            after = whole[1].key
            assert keys(await store.waiting(**query, after=after)) == keys(
                await plain.waiting(**query, after=after)
            ), query
    one = store.id_for("globex", "s-05")
    assert keys(await store.waiting(org_id=None, session_id=one)) == keys(
        await plain.waiting(org_id=None, session_id=one)
    )
    assert await store.waiting(org_id=None, session_id="nowhere:x") == []


async def test_claims_take_no_more_leases_than_they_return_and_reach_every_partition(
    clock: Clock,
):
    store, parts = memory_pair(clock)
    due = sorted(store.id_for(org, f"s{n}") for n in range(4) for org in ("acme", "globex"))
    for session_id in due:
        org = "acme" if session_id.startswith("a:") else "globex"
        await store.save(SessionRecord(id=session_id, org_id=org, expires_at=1.0))

    # Partition a alone could fill each claim; the partition asked first takes turns.
    first = await store.claim(clock.now, "w1", 30, limit=3)
    second = await store.claim(clock.now, "w1", 30, limit=3)
    assert [s.id for s in first] == ["a:s0", "a:s1", "a:s2"]
    assert [s.id for s in second] == ["b:s0", "b:s1", "b:s2"]
    assert await store.claim(clock.now, "w2", 30, limit=100) == [  # no lease taken unreturned
        await store.summary("a:s3"),
        await store.summary("b:s3"),
    ]
    assert await store.claim(clock.now, "w3", 30) == []  # every lease is held
    with pytest.raises(ValueError, match="ttl"):
        await store.claim(clock.now, "w3", 0)

    for key in "ab":
        assert await parts[key].acquire_lease(f"{key}:x", "api#0123456789a", 30)
    assert sorted(await store.adopt_leases("api", "api#fedcba98765")) == ["a:x", "b:x"]
    assert not await store.acquire_lease("b:x", "api#0123456789a", 30)  # adopted


async def test_listeners_hear_every_partitions_wake_ups_and_event_notices(clock: Clock):
    store, _ = memory_pair(clock)
    acme, globex = store.id_for("acme", "1"), store.id_for("globex", "2")
    async with store.listen() as wakeups, store.listen_events() as notices:
        with pytest.raises(TimeoutError):  # a reader may stop waiting, and read on after
            async with asyncio.timeout(0.02):
                await anext(wakeups)
        await store.notify(globex)
        await store.notify(acme)
        await store.append_events(acme, [{"type": "run-started"}])
        await store.append_events(globex, [{"type": "run-started"}, {"type": "text-delta"}])
        async with asyncio.timeout(1):
            assert {await anext(wakeups), await anext(wakeups)} == {acme, globex}
            assert {await anext(notices), await anext(notices)} == {(acme, 1), (globex, 2)}
        await store.close()
        async with asyncio.timeout(1):  # closing the store ends the subscriptions
            assert [w async for w in wakeups] == [] and [n async for n in notices] == []


# -- two PostgreSQL databases behind one engine ---------------------------------------------

decided: list[str] = []


@tool(permission="write")
async def refund(ctx: ToolContext[None], order: str) -> str:
    """Refund an order (gated: a person approves it)."""
    decided.append(order)
    return f"refunded {order}"


def answer(request: ModelRequest) -> Any:
    if request.messages[-1].role == "user":
        return call("refund", order=request.messages[-1].text)
    return "Refunded."


def engine(store: SessionStore, name: str) -> Engine:
    runtime = Runtime(model=FunctionModel(answer))
    return Engine(Agent("desk", tools=[refund]), store=store, runtime=runtime, worker_id=name)


def dsn(database: str) -> str:
    return f"postgresql://postgres@{PG_HOST}:{PG_PORT}/{database}"


@pytest.fixture(scope="module")
def databases() -> Iterator[dict[str, str]]:
    """Two fresh databases (the two clusters' stand-ins), dropped at the end."""
    skip_without_postgres()
    import psycopg

    names = {key: f"handrail_part_{os.getpid()}_{key}" for key in "ab"}
    with psycopg.connect(dsn("test"), autocommit=True) as connection:
        for name in names.values():
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            connection.execute(f'CREATE DATABASE "{name}"')
    yield {key: dsn(name) for key, name in names.items()}
    with psycopg.connect(dsn("test"), autocommit=True) as connection:
        for name in names.values():
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def clusters(databases: dict[str, str]) -> AsyncIterator[PartitionedStore]:
    from handrail.store import PostgresStore

    parts: dict[str, SessionStore] = {
        key: PostgresStore(url, schema="handrail", audit_key=KEY) for key, url in databases.items()
    }
    async with PartitionedStore(parts, home) as store:  # opens both: migrates their schemas
        yield store
    import psycopg

    for url in databases.values():  # the next test starts from empty databases
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
            await connection.execute("DROP SCHEMA handrail CASCADE")


async def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    """What a database holds, read past handrail: `handrail.` is the stores' schema."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
        cursor = await connection.execute(sql)
        return await cursor.fetchall()


TABLES = ["handrail_sessions", "handrail_messages", "handrail_events", "handrail_tool_log"]


@pytest.mark.postgres
async def test_one_engine_over_two_databases_keeps_each_organisation_in_its_own(
    clusters: PartitionedStore, databases: dict[str, str]
):
    decided.clear()
    api = engine(clusters, "api")
    sessions = {org: [clusters.id_for(org) for _ in range(3)] for org in ("acme", "globex")}
    for org, ids in sessions.items():
        for n, session_id in enumerate(ids):
            events = [e async for e in api.submit(session_id, f"{org}-{n}", org_id=org)]
            assert events[-1].type == "run-suspended", events[-1]

    # Each organisation's sessions, messages, events and tool calls are in its database only.
    for key, org in (("a", "acme"), ("b", "globex")):
        url = databases[key]
        assert await rows(url, "SELECT DISTINCT org_id FROM handrail.handrail_sessions") == [(org,)]
        for table in TABLES:
            column = "id" if table == "handrail_sessions" else "session_id"
            found = await rows(url, f"SELECT DISTINCT {column} FROM handrail.{table}")
            assert {s for (s,) in found} <= set(sessions[org]), (key, table, found)
        assert len(await rows(url, "SELECT 1 FROM handrail.handrail_messages")) >= 3

    # The inbox of each organisation: its own cards, from its own partition.
    pages = {
        org: await api.pending(org, Decider(user_id=f"boss@{org}", org_id=org)) for org in sessions
    }
    for org, page in pages.items():
        assert sorted(card.session_id for card in page.cards) == sorted(sessions[org])

    # One decision of each before any worker listens (only a sweep finds those), the rest
    # while a worker over both databases listens (woken by each database's NOTIFY).
    async def decide(org: str, card: Any) -> None:
        await api.resolve(
            card.session_id,
            card.tool_call_id,
            Approve(),
            decider=Decider(user_id=f"boss@{org}", org_id=org),
        )

    for org, page in pages.items():
        await decide(org, page.cards[0])
    background = engine(PartitionedStore(dict(clusters.stores), home), "background")
    stop = asyncio.Event()
    worker = asyncio.create_task(Worker(background, poll_interval=60, concurrency=8).run(stop))

    async def finished(count: int) -> None:
        async with asyncio.timeout(30):
            while len(await clusters.list(status="completed")) < count:  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # polling the store is the point

    await finished(2)  # its start-up sweep found the two decided (it listens by then)
    for org, page in pages.items():
        for card in page.cards[1:]:
            await decide(org, card)
    await finished(6)  # woken by each database's NOTIFY: the sweeps are 60 s apart
    stop.set()
    await clusters.notify(sessions["acme"][0])  # any wake-up lets the loop see `stop`
    await worker
    assert sorted(decided) == sorted(f"{org}-{n}" for org in sessions for n in range(3))
    assert background.tally["resumed"] == 6

    # Each partition's audit trail: its organisation's decisions and calls, one chain that
    # verifies; the other organisation's trail is not there.
    for key, org in (("a", "acme"), ("b", "globex")):
        trail = await clusters.stores[key].audit(org, limit=1000)
        assert trail == await clusters.audit(org, limit=1000)
        assert sorted(e.kind for e in trail) == ["call"] * 3 + ["decision"] * 3
        assert {e.session_id for e in trail} == set(sessions[org])
        assert verify(trail, keys=[KEY]) == []
        other = "globex" if org == "acme" else "acme"
        assert await clusters.stores[key].audit(other) == []
        assert await rows(
            databases[key], "SELECT DISTINCT org_id FROM handrail.handrail_audit"
        ) == [(org,)]


@pytest.mark.postgres
async def test_a_turn_the_route_refuses_writes_nothing_in_either_database(
    clusters: PartitionedStore, databases: dict[str, str]
):
    api = engine(clusters, "api")
    with pytest.raises(RoutingError, match="'initech'"):
        clusters.id_for("initech")
    refusals = [
        ("a:lost", "initech", "make it name one of"),  # the route raises
        ("a:lost", "hooli", "named 'zz'"),  # the route names no partition
        ("a:lost", "globex", "routes to 'b'"),  # the id names another partition than its org
        ("lost", "acme", "names no partition"),  # the id names none (no default)
    ]
    for session_id, org, told in refusals:
        with pytest.raises(RoutingError, match=told):
            async for _ in api.submit(session_id, "hello", org_id=org):
                pass
    for url in databases.values():
        for table in [*TABLES, "handrail_audit", "handrail_leases"]:
            assert await rows(url, f"SELECT * FROM handrail.{table}") == [], (url, table)


# -- `handrail worker` on an app whose store is partitioned ---------------------------------


async def test_handrail_worker_drives_a_partitioned_apps_sessions_in_both_partitions(
    tmp_path: Path,
):
    import partitioned_app  # tests/, as the worker process imports it

    os.environ["PARTITIONED_DIR"] = str(tmp_path)
    try:
        api = partitioned_app.app()
    finally:
        del os.environ["PARTITIONED_DIR"]
    store = api.store
    assert isinstance(store, PartitionedStore)
    sessions = {org: store.id_for(org) for org in ("acme", "globex")}
    for org, session_id in sessions.items():
        events = [e async for e in api.submit(session_id, f"{org}-1", org_id=org)]
        (call_id,) = events[-1].pending  # type: ignore[attr-defined]
        await api.resolve(session_id, call_id, Approve(), org_id=org)

    env = {**os.environ, "PARTITIONED_DIR": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("HANDRAIL_DSN", None)
    command = [sys.executable, "-c", "from handrail.cli import app; app()", "worker"]
    command += ["partitioned_app:app", "--worker-id", "w1", "--health-interval", "0"]
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = await asyncio.create_subprocess_exec(
            *command, cwd=TESTS, env=env, stdout=out, stderr=out
        )
    try:
        async with asyncio.timeout(30):
            while len(await store.list(status="completed")) < 2:
                assert worker.returncode is None, log.read_text()
                await asyncio.sleep(0.05)  # polling the store is the point
        assert sorted((tmp_path / "refunds.txt").read_text().split()) == ["acme-1", "globex-1"]
        for key, org in (("a", "acme"), ("b", "globex")):
            assert [s.id for s in await store.stores[key].list()] == [sessions[org]]
    finally:
        worker.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await worker.wait() == 0, log.read_text()
        await store.close()
