"""The inbox index (`SessionStore.waiting`) says what a full scan of the sessions says, always.

Every store, through an engine: sessions raise cards, have them decided, resumed, expired,
deleted, exported and imported, saved through a store that fails; after each step the index
(one query) lists exactly the cards a scan (every suspended session loaded) lists, in the same
order. The inbox pages built on it (`Engine.pending`, `Inbox.sessions`) match the rule
`Engine.resolve` checks, applied to every session. And a store of the schema before the index
(SQLite and PostgreSQL) builds it when opened.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.flaky_store import FlakyStore

from handrail import Agent, Approve, Decider, DecisionPolicy, Domain, Engine, Reject, Runtime, tool
from handrail.engine import StoreRetry
from handrail.exceptions import StoreError, StoreUnavailableError
from handrail.models import ModelRequest
from handrail.store import MemoryStore, SessionRecord, SessionStore, WaitingCard
from handrail.testing import FunctionModel, call

from .conftest import PG_DSN, Clock, StoreFactory, skip_without_postgres

FIXTURES = Path(__file__).parent / "fixtures"


@tool(name="laptops.wipe", permission="destructive")
def wipe(laptop: str) -> str:
    """Wipe a laptop."""
    return f"wiped {laptop}"


@tool(name="mail.send", permission="write")
def send(to: str) -> str:
    """Send a mail."""
    return f"sent to {to}"


def answer(request: ModelRequest) -> Any:
    """`wipe X` asks one wipe, `both X` a wipe and a mail (two cards), else a mail."""
    last = request.messages[-1]
    if last.role != "user":
        return "Done."
    verb, _, what = last.text.partition(" ")
    if verb == "wipe":
        return call("laptops.wipe", laptop=what)
    if verb == "both":
        return [call("laptops.wipe", laptop=what), call("mail.send", to=what)]
    return call("mail.send", to=what)


async def no_sleep(seconds: float) -> None:
    await asyncio.sleep(0)


def make_engine(store: SessionStore, clock: Clock) -> Engine:
    return Engine(
        Domain(
            agents=[Agent("desk", tools=[wipe, send])],
            policies={"destructive": DecisionPolicy(roles={"it-admin"}, four_eyes=True)},
        ),
        store=store,
        runtime=Runtime(model=FunctionModel(answer), clock=clock, pending_ttl=3600.0),
        store_retry=StoreRetry(attempts=2, delay=0.0, sleep=no_sleep),
    )


async def ask(engine: Engine, session: str, text: str, user: str, org: str = "acme") -> None:
    async for _ in engine.submit(session, text, org_id=org, user_id=user):
        pass


async def scan(engine: Engine, org: str | None) -> list[tuple[str, str, str, str]]:
    """Every waiting card of `org`, as the inbox read them before the index: every session."""
    found: list[tuple[str, str, str, str]] = []
    offset = 0
    while page := await engine.store.list(org_id=org, status="suspended", offset=offset):
        for summary in page:
            state = await engine.session(summary.id, org_id=summary.org_id, user_id=summary.user_id)
            found += [(summary.id, i, c.tool_name, c.kind) for i, c in state.pending.items()]
        offset += len(page)
    return found


async def indexed(store: SessionStore, org: str | None) -> list[tuple[str, str, str, str]]:
    """The same, off the index: one query (and the summaries it carries are the sessions')."""
    rows = await store.waiting(org_id=org, limit=10_000)
    for row in rows:
        assert row.session == await store.summary(row.session.id)
    return [(r.session.id, r.card.tool_call_id, r.card.tool, r.card.kind) for r in rows]


async def agree(engine: Engine, org: str | None = "acme") -> list[tuple[str, str, str, str]]:
    expected = await scan(engine, org)
    assert await indexed(engine.store, org) == expected
    return expected


async def test_the_index_follows_every_step_of_a_session(store: SessionStore, clock: Clock) -> None:
    engine = make_engine(store, clock)
    assert await agree(engine) == []
    await ask(engine, "s1", "wipe L-1", "ana")
    clock.advance(1)
    await ask(engine, "s2", "both L-2", "al")
    clock.advance(1)
    await ask(engine, "s3", "mail x@acme", "ana")
    await ask(engine, "g1", "wipe G-1", "eve", org="globex")
    clock.advance(1)
    cards = await agree(engine)
    assert [(s, tool) for s, _, tool, _ in cards] == [
        ("s3", "mail.send"),
        ("s2", "laptops.wipe"),
        ("s2", "mail.send"),
        ("s1", "laptops.wipe"),
    ]
    assert len(await agree(engine, "globex")) == 1
    assert len(await indexed(store, None)) == 5  # every organisation's

    # a decision on one of two cards: the other waits, its session moved to the top
    bo = Decider(user_id="bo", roles={"it-admin"}, org_id="acme")
    wipe_2 = cards[1][1]
    await engine.resolve("s2", wipe_2, Approve(by="bo"), decider=bo)
    top, *_ = await agree(engine)
    assert (top[0], top[2]) == ("s2", "mail.send")
    # decided and resumed: nothing of it is left
    await engine.resolve("s2", cards[2][1], Reject(by="al"), org_id="acme", user_id="al")
    async for _ in engine.resume("s2", org_id="acme", user_id="al"):
        pass
    assert "s2" not in {s for s, *_ in await agree(engine)}

    # expired: the card is settled, the session waits for its resumption
    clock.advance(7200)
    assert set(await engine.expire_due()) >= {"s1", "s3"}
    assert await agree(engine) == []
    assert len(await agree(engine, "globex")) == 0

    # a new card, then the session deleted: its rows go with it
    await ask(engine, "s4", "wipe L-4", "ana")
    assert len(await agree(engine)) == 1
    assert await store.delete("s4")
    assert await agree(engine) == []

    # exported and imported (over itself, and anew): the rows come from the session itself
    await ask(engine, "s5", "both L-5", "di")
    document = await store.export("s5")
    await store.import_(document, overwrite=True)
    assert len(await agree(engine)) == 2
    assert await store.delete("s5")
    assert await agree(engine) == []
    await store.import_(document)
    assert len(await agree(engine)) == 2


async def test_pages_of_the_index_are_the_index(store: SessionStore, clock: Clock) -> None:
    engine = make_engine(store, clock)
    for n in range(7):
        await ask(engine, f"s{n}", ("both " if n % 3 == 0 else "wipe ") + f"L-{n}", "ana")
        clock.advance(0 if n % 2 else 1)  # some sessions updated at the same time
    whole = await store.waiting(org_id="acme", limit=100)
    pages: list[Any] = []
    after = None
    while page := await store.waiting(org_id="acme", limit=2, after=after):
        pages += page
        after = page[-1].key
    assert [r.key for r in pages] == [r.key for r in whole] and len(whole) == 10
    wipes = await store.waiting(org_id="acme", limit=100, tool="laptops.wipe")
    assert [r.key for r in wipes] == [r.key for r in whole if r.card.tool == "laptops.wipe"]
    assert await store.waiting(org_id="acme", kind="batch") == []
    first = whole[-1].card.created_at
    assert first is not None
    late = await store.waiting(org_id="acme", raised_after=first)
    assert len(late) == len([r for r in whole if (r.card.created_at or 0) > first]) < 10
    reach = await store.waiting(org_id="acme", reach=("al", frozenset({"mail.send"})))
    assert {r.card.tool for r in reach} == {"mail.send"} and len(reach) == 3
    assert await store.waiting(org_id="acme", exclude_user="ana") == []
    with pytest.raises(ValueError):
        await store.waiting(org_id="acme", limit=-1)


async def test_the_inbox_pages_are_the_rule_applied_to_every_session(
    store: SessionStore, clock: Clock
) -> None:
    engine = make_engine(store, clock)
    people = ["ana", "al", "bo", "di"]
    for n in range(12):
        text = ("wipe", "both", "mail x")[n % 3] + f" {n}"
        await ask(engine, f"s{n:02}", text, people[n % 4])
        clock.advance(n % 2)
    deciders = [
        Decider(user_id="bo", roles={"it-admin"}, org_id="acme"),
        Decider(user_id="ana", org_id="acme"),
        Decider(user_id="di", roles={"sales"}, org_id="acme"),
    ]
    for decider in deciders:
        expected = []
        offset = 0
        while page := await store.list(org_id="acme", status="suspended", offset=offset):
            for summary in page:
                state = await engine.session(summary.id, org_id="acme", user_id=summary.user_id)
                expected += [(summary.id, i) for i in engine.decidable(state, decider)]
            offset += len(page)
        for limit in (1, 3, 50):
            got: list[tuple[str, str]] = []
            cursor = None
            while True:
                page_ = await engine.pending("acme", decider, limit=limit, cursor=cursor)
                assert len(page_.cards) == limit or page_.next is None  # full pages
                got += [(c.session_id, c.tool_call_id) for c in page_.cards]
                if (cursor := page_.next) is None:
                    break
            assert got == expected, decider
        sessions = await engine.inbox.sessions("acme", decider, limit=100)
        assert [s.id for s in sessions] == list(dict.fromkeys(s for s, _ in expected))


async def test_a_failed_save_leaves_the_index_as_the_session(
    make_store: StoreFactory, clock: Clock
) -> None:
    inner = await make_store()
    engine = make_engine(inner, clock)
    await ask(engine, "s1", "both L-1", "ana")
    cards = await agree(engine)
    # The store is away for the resolution's save (every try): nothing is written.
    flaky = FlakyStore(inner, fail={"save": [1]}, down_for=10, only_method=True)
    broken = make_engine(flaky, clock)  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailableError):
        await broken.resolve("s1", cards[1][1], Reject(by="ana"), org_id="acme", user_id="ana")
    assert await agree(engine) == cards
    # The save is made and its answer lost: the engine finds it made; the index follows.
    flaky = FlakyStore(inner, fail={"save": [1]}, lost_reply=True)
    lossy = make_engine(flaky, clock)  # type: ignore[arg-type]
    await lossy.resolve("s1", cards[1][1], Reject(by="ana"), org_id="acme", user_id="ana")
    assert await agree(engine) == cards[:1]


async def test_a_save_refused_writes_no_card(store: SessionStore) -> None:
    card = WaitingCard(tool_call_id="c1", tool="t", kind="approval", card={"x": 1})
    saved = await store.save(SessionRecord(id="s", org_id="o", status="suspended", cards=[card]))
    assert [r.card for r in await store.waiting(org_id="o")] == [card]
    bad = WaitingCard(tool_call_id="c2", tool="t", kind="approval", card={"x": float("nan")})
    with pytest.raises(StoreError, match="'s'"):
        await store.save(
            SessionRecord(id="s", org_id="o", status="suspended", version=1, cards=[bad])
        )
    with pytest.raises(StoreError):  # the conflict: nothing written either
        await store.save(SessionRecord(id="s", org_id="o", status="suspended", cards=[]))
    assert [r.card for r in await store.waiting(org_id="o")] == [card]
    # a save without cards keeps them (and moves them with their session)...
    again = await store.save(SessionRecord(id="s", org_id="o", status="suspended", version=1))
    [row] = await store.waiting(org_id="o")
    assert row.session.version == again.version == saved.version + 1 and row.card == card
    # ...and one that is not suspended leaves none
    await store.save(SessionRecord(id="s", org_id="o", status="active", version=2))
    assert await store.waiting(org_id="o") == []


# -- the migration ---------------------------------------------------------------------------


def old_session() -> dict[str, Any]:
    """A suspended session with one waiting card (call_2), as its row was stored."""
    import json

    return dict(json.loads((FIXTURES / "session_v2.json").read_text()))


async def test_an_sqlite_store_of_the_schema_before_the_index_builds_it(tmp_path: Path) -> None:
    import json

    from handrail.store import SqliteStore
    from handrail.store.sqlite import MIGRATIONS

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE handrail_schema_version (version INTEGER PRIMARY KEY, applied_at REAL)"
    )
    for version in range(1, 5):  # the schema as handrail left it at version 4
        for statement in MIGRATIONS[version]:
            db.execute(statement)
        db.execute("INSERT INTO handrail_schema_version VALUES (?, 0)", (version,))
    stored = old_session()
    for session_id, status in (("v2", "suspended"), ("done", "completed")):
        db.execute(
            "INSERT INTO handrail_sessions (id, org_id, user_id, status, version, created_at, "
            "updated_at, expires_at, data, window_start) VALUES (?, 'acme', 'ana', ?, 3, 1, 2, "
            "NULL, ?, 0)",
            (session_id, status, json.dumps(stored["data"])),
        )
        db.executemany(
            "INSERT INTO handrail_messages VALUES (?, ?, ?)",
            [(session_id, i, json.dumps(m)) for i, m in enumerate(stored["messages"])],
        )
    db.commit()
    db.close()
    async with SqliteStore(path) as store:
        [row] = await store.waiting(org_id="acme")
        assert (row.session.id, row.card.tool_call_id, row.card.tool) == (
            "v2",
            "call_2",
            "orders.refund",
        )
        assert row.session == await store.summary("v2")
        assert (row.card.card["args"], row.card.agent) == (
            {"order_id": "A1042", "amount": 84.0},
            "desk",
        )


@pytest.mark.postgres
async def test_a_postgres_schema_before_the_index_builds_it() -> None:
    skip_without_postgres()
    import json
    import secrets

    import psycopg

    from handrail.store import PostgresStore
    from handrail.store.postgres import MIGRATIONS

    schema = f"handrail_old_{secrets.token_hex(4)}"
    s = f'"{schema}"'
    stored = old_session()
    async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
        await connection.execute(f"CREATE SCHEMA {s}")
        await connection.execute(
            f"CREATE TABLE {s}.handrail_schema_version (version integer PRIMARY KEY, "
            "applied_at double precision NOT NULL)"
        )
        for version in range(1, 5):
            for statement in MIGRATIONS[version]:
                await connection.execute(statement.format(s=s))
            await connection.execute(
                f"INSERT INTO {s}.handrail_schema_version VALUES (%s, 0)", (version,)
            )
        await connection.execute(
            f"INSERT INTO {s}.handrail_sessions (id, org_id, user_id, status, version, "
            "created_at, updated_at, data) VALUES ('v2', 'acme', 'ana', 'suspended', 3, 1, 2, %s)",
            (json.dumps(stored["data"]),),
        )
        for i, message in enumerate(stored["messages"]):
            await connection.execute(
                f"INSERT INTO {s}.handrail_messages VALUES ('v2', %s, %s)", (i, json.dumps(message))
            )
    try:
        store = await PostgresStore.connect(PG_DSN, schema=schema)
        try:
            [row] = await store.waiting(org_id="acme")
            assert (row.session.id, row.card.tool_call_id) == ("v2", "call_2")
            assert row.session == await store.summary("v2")
        finally:
            await store.close()
    finally:
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
            await connection.execute(f"DROP SCHEMA {s} CASCADE")


# -- random sequences ------------------------------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["ask", "approve", "reject", "resume", "expire", "delete", "reimport"]),
        st.integers(0, 3),  # the session
        st.sampled_from(["wipe", "both", "mail"]),
        st.sampled_from(["ana", "al"]),
    ),
    max_size=14,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
async def test_any_sequence_of_steps_keeps_the_index_equal_to_the_scan(
    ops: list[tuple[str, int, str, str]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    from handrail.store import SqliteStore

    clock = Clock()
    stores: list[SessionStore] = [
        MemoryStore(clock=clock),
        SqliteStore(tmp_path_factory.mktemp("p") / "h.db", clock=clock),
    ]
    try:
        engines = [make_engine(store, clock) for store in stores]
        bo = Decider(user_id="bo", roles={"it-admin"}, org_id="acme")
        for op, n, verb, user in ops:
            session = f"s{n}"
            for engine in engines:
                await step(engine, op, session, verb, user, bo, clock)
            clock.advance(1)
            results = [await agree(engine) for engine in engines]
            assert results[0] == results[1]
    finally:
        for store in stores:
            await store.close()


async def step(
    engine: Engine, op: str, session: str, verb: str, user: str, bo: Decider, clock: Clock
) -> None:
    store = engine.store
    summary = await store.summary(session)
    owner = summary.user_id if summary is not None else user
    try:
        if op == "ask":
            await ask(engine, session, f"{verb} x", owner or user)
        elif op in ("approve", "reject") and summary is not None:
            state = await engine.session(session, org_id="acme", user_id=owner)
            for call_id, card in list(state.pending.items())[:1]:
                by = bo if card.tool_name == "laptops.wipe" else None
                decision = Approve(by="bo") if op == "approve" else Reject(by=owner)
                if op == "reject":
                    by = None
                if by is not None:
                    await engine.resolve(session, call_id, decision, decider=by)
                else:
                    await engine.resolve(session, call_id, decision, org_id="acme", user_id=owner)
        elif op == "resume" and summary is not None:
            async for _ in engine.resume(session, org_id="acme", user_id=owner):
                pass
        elif op == "expire":
            clock.advance(4000)
            await engine.expire_due()
        elif op == "delete":
            await store.delete(session)
        elif op == "reimport" and summary is not None:
            await store.import_(await store.export(session), overwrite=True)
    except Exception as error:
        from handrail.exceptions import HandrailError

        if not isinstance(error, HandrailError):
            raise
