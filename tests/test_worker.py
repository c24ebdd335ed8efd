"""`Worker`: sessions resolved anywhere are resumed by a worker; cut-off turns are recovered."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from handrail import (
    Agent,
    Approve,
    Engine,
    Runtime,
    SessionBusyError,
    ToolContext,
    UserError,
    Worker,
    tool,
)
from handrail.models import ModelRequest
from handrail.store import MemoryStore
from handrail.testing import FunctionModel, call

ran: list[str] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


@tool(permission="write")
async def refund(ctx: ToolContext[None], order: str) -> str:
    """Refund an order."""
    ran.append(order)
    return f"refunded {order}"


def answer(request: ModelRequest) -> Any:
    if request.messages[-1].role == "user":
        return call("refund", order=request.messages[-1].text)
    return "Refunded."


def engine(store: MemoryStore, name: str) -> Engine:
    runtime = Runtime(model=FunctionModel(answer))
    return Engine(Agent("a", tools=[refund]), store=store, runtime=runtime, worker_id=name)


async def eventually(condition: Any) -> None:
    async with asyncio.timeout(5):
        while not await condition():  # noqa: ASYNC110 - polling the store is the point
            await asyncio.sleep(0.01)


async def test_a_decision_on_one_worker_is_resumed_by_another():
    store = MemoryStore()
    api, background = engine(store, "api"), engine(store, "background")
    stop = asyncio.Event()
    task = asyncio.create_task(Worker(background, poll_interval=60).run(stop))
    events = [e async for e in api.submit("s1", "A1")]
    await api.resolve("s1", events[-1].pending[0], Approve())

    async def completed() -> bool:
        record = await store.load("s1")
        return record is not None and record.status == "completed"

    await eventually(completed)  # woken by the decision, long before the next poll
    assert ran == ["A1"]
    stop.set()
    await store.notify("s1")  # any wake-up lets the loop see `stop`
    await task


async def test_a_sweep_resumes_what_a_missed_wake_up_left_and_recovers_dead_workers():
    store = MemoryStore()
    api = engine(store, "api")
    events = [e async for e in api.submit("s1", "A1")]
    await api.resolve("s1", events[-1].pending[0], Approve())  # nobody listens: missed

    # Another worker starts a turn of s2 and stops right after it is on record.
    turn = aiter(engine(store, "dead").submit("s2", "B2"))
    assert (await anext(turn)).type == "run-started"
    await turn.aclose()  # type: ignore[attr-defined]

    worker = Worker(engine(store, "sweeper"), poll_interval=60)
    moved = await worker.sweep()
    assert sorted(moved) == ["s1", "s2"]
    assert ran == ["A1"]  # s1 finished; s2's turn went on and now waits for its approval
    assert (await api.session("s2")).pending
    assert not await worker.advance("nope")
    # What the worker drove is in the sessions' event logs, for a client to stream.
    resumed = [e["type"] for _, e in await store.events("s1")]
    assert resumed[0] == "run-started" and resumed[-1] == "run-completed"
    assert "tool-call-completed" in resumed
    recovered = [e["type"] for _, e in await store.events("s2")]
    assert recovered[-2:] == ["approval-required", "run-suspended"]


def test_a_worker_needs_a_positive_poll_interval():
    with pytest.raises(UserError, match="poll_interval"):
        Worker(engine(MemoryStore(), "w"), poll_interval=0)


# -- sweeps on schedule, no window, many at once, errors kept to their session ---------------


async def cut_off(store: MemoryStore, session: str) -> None:
    """A turn whose worker died right after it was on record (its lease given back)."""
    turn = aiter(engine(store, "dead").submit(session, "B2"))
    assert (await anext(turn)).type == "run-started"
    await turn.aclose()  # type: ignore[attr-defined]


async def test_sweeps_run_on_schedule_while_wake_ups_keep_coming():
    store = MemoryStore()
    await cut_off(store, "s1")
    stop = asyncio.Event()
    worker = Worker(engine(store, "w"), poll_interval=0.05)
    task = asyncio.create_task(worker.run(stop))

    async def chatter() -> None:
        while not stop.is_set():
            await store.notify("other")  # a wake-up about another session, again and again
            await asyncio.sleep(0.005)

    noise = asyncio.create_task(chatter())

    async def recovered() -> bool:
        return bool((await engine(store, "x").session("s1")).pending)

    await eventually(recovered)  # the sweep came on time: s1 waits on its card again
    stop.set()
    await asyncio.gather(task, noise)


async def test_a_decided_session_is_found_however_many_newer_ones_wait():
    store = MemoryStore()
    api = engine(store, "api")
    events = [e async for e in api.submit("old", "A1")]
    await api.resolve("old", events[-1].pending[0], Approve())  # its wake-up is lost
    for n in range(120):  # then many newer sessions suspend, waiting for people
        [_ async for _ in api.submit(f"new-{n}", f"N{n}")]
    assert await Worker(engine(store, "w"), poll_interval=60).sweep() == ["old"]
    assert ran == ["A1"]


async def test_a_worker_drives_up_to_its_concurrency_at_once():
    store = MemoryStore()
    started, release = asyncio.Event(), asyncio.Event()
    running: list[str] = []

    @tool(permission="write")
    async def slow(order: str) -> str:
        """Slow refund."""
        running.append(order)
        if len(running) >= 3:
            started.set()
        await release.wait()
        return "ok"

    def ask(request: ModelRequest) -> Any:
        if request.messages[-1].role == "user":
            return call("slow", order=request.messages[-1].text)
        return "Done."

    def make(name: str) -> Engine:
        runtime = Runtime(model=FunctionModel(ask))
        return Engine(Agent("a", tools=[slow]), store=store, runtime=runtime, worker_id=name)

    api = make("api")
    for n in range(5):
        events = [e async for e in api.submit(f"s{n}", f"O{n}")]
        await api.resolve(f"s{n}", events[-1].pending[0], Approve())
    worker = Worker(make("w"), poll_interval=0.05, concurrency=3)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    async with asyncio.timeout(5):
        await started.wait()
    await asyncio.sleep(0.1)  # more sweeps come: no fourth session starts
    assert len(running) == 3
    release.set()

    async def all_done() -> bool:
        return len(running) == 5

    await eventually(all_done)
    stop.set()
    await task


async def test_an_error_in_one_session_is_logged_kept_off_and_never_stops_the_worker(
    caplog: pytest.LogCaptureFixture,
):
    store = MemoryStore()
    api = engine(store, "api")
    events = [e async for e in api.submit("good", "A1")]
    await api.resolve("good", events[-1].pending[0], Approve())
    bad = await store.load("good")
    assert bad is not None
    bad.id, bad.version = "bad", 0
    bad.data = {**bad.data, "schema_version": 99}  # a row this handrail cannot read
    await store.save(bad)

    worker = Worker(engine(store, "w"), poll_interval=0.05)
    with caplog.at_level("ERROR", logger="handrail.worker"):
        moved = await worker.sweep()
    assert moved == ["good"]  # the good one went on, the bad one did not stop it
    assert any("'bad'" in r.getMessage() and r.exc_info for r in caplog.records)
    # Parked for its back-off: no worker claims it meanwhile.
    assert await store.claim(10**10, "other", ttl=30) == []


# -- draining, health --------------------------------------------------------------------------


def slow_engine(
    store: MemoryStore, name: str, release: asyncio.Event, started: list[str]
) -> Engine:
    @tool(permission="write")
    async def slow(order: str) -> str:
        """A refund that waits for `release`."""
        started.append(order)
        await release.wait()
        ran.append(order)
        return "ok"

    def ask(request: ModelRequest) -> Any:
        if request.messages[-1].role == "user":
            return call("slow", order=request.messages[-1].text)
        return "Done."

    runtime = Runtime(model=FunctionModel(ask))
    return Engine(Agent("a", tools=[slow]), store=store, runtime=runtime, worker_id=name)


async def decided(engine: Engine, session_id: str, text: str) -> None:
    events = [e async for e in engine.submit(session_id, text)]
    await engine.resolve(session_id, events[-1].pending[0], Approve())


async def test_a_drain_takes_no_new_work_and_lets_the_turns_being_driven_finish():
    store = MemoryStore()
    release, started = asyncio.Event(), []
    api = slow_engine(store, "api", release, started)
    await decided(api, "s1", "A1")
    worker = Worker(slow_engine(store, "w", release, started), poll_interval=0.02, listen=False)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop, grace=60))

    async def in_the_tool() -> bool:
        return started == ["A1"]

    await eventually(in_the_tool)
    stop.set()
    await decided(api, "s2", "B2")  # decided during the drain: left for another worker
    await asyncio.sleep(0.1)  # several sweep intervals
    assert not task.done()  # s1's turn is still running: the drain waits for it
    release.set()
    await task
    assert ran == ["A1"]
    assert (await store.load("s1")).status == "completed"  # type: ignore[union-attr]
    assert (await store.load("s2")).status == "suspended"  # type: ignore[union-attr]
    assert worker.stats.moved == 1 and worker.stats.resumed == 1


async def test_past_the_grace_a_turn_is_cut_off_and_its_lease_given_back(
    caplog: pytest.LogCaptureFixture,
):
    store = MemoryStore()
    release, started = asyncio.Event(), []
    await decided(slow_engine(store, "api", release, started), "s1", "A1")
    worker = Worker(slow_engine(store, "w", release, started), poll_interval=0.02, listen=False)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop, grace=0.05))

    async def in_the_tool() -> bool:
        return started == ["A1"]

    await eventually(in_the_tool)
    with caplog.at_level("WARNING", logger="handrail.worker"):
        stop.set()
        await task
    assert ran == []
    assert any("cut off" in r.getMessage() and "s1" in r.getMessage() for r in caplog.records)
    # Its lease is free: another worker recovers the turn at once (a recovery card: the
    # refund started and may have run).
    other = Worker(engine(store, "other"), poll_interval=60)
    assert await other.sweep() == ["s1"]
    assert other.stats.recovered == 1
    state = await engine(store, "x").session("s1")
    assert [c.kind for c in state.pending.values()] == ["recovery"]


async def test_the_health_line_says_what_the_worker_did_and_names_its_lease_owner(
    caplog: pytest.LogCaptureFixture,
):
    store = MemoryStore()
    late = [0.0]
    api = engine(store, "api")
    await decided(api, "s1", "A1")
    # s2's card expires: nobody decides it in time.
    runtime = Runtime(
        model=FunctionModel(answer), pending_ttl=10, clock=lambda: time.time() + late[0]
    )
    timed = Engine(Agent("a", tools=[refund]), store=store, runtime=runtime, worker_id="w")
    [_ async for _ in timed.submit("s2", "B2")]
    late[0] = 11
    worker = Worker(timed, poll_interval=0.02, listen=False, health_interval=0.05)
    stop = asyncio.Event()
    with caplog.at_level("INFO", logger="handrail.worker"):
        task = asyncio.create_task(worker.run(stop))

        def said() -> list[str]:
            return [r.getMessage() for r in caplog.records if "health:" in r.getMessage()]

        def total(what: str) -> int:
            return sum(int(n) for line in said() for n in re.findall(rf"{what} (\d+)", line))

        async def both_told() -> bool:
            return total("resumed") == 2

        await eventually(both_told)
        stop.set()
        await task
    assert all(
        line.startswith(f"handrail worker {timed.lease_owner}: health: in the last 0.05 s ")
        for line in said()
    )
    assert (total("swept"), total("moved"), total("expired"), total("failed")) == (2, 2, 1, 0)
    assert ran == ["A1"]  # s2's refund expired: it never ran
    stats = worker.stats
    assert (stats.swept, stats.moved, stats.resumed, stats.expired) == (2, 2, 2, 1)


def test_a_health_interval_must_be_positive():
    with pytest.raises(UserError, match="health_interval"):
        Worker(engine(MemoryStore(), "w"), health_interval=0)


# -- two processes on one store: a turn another drives is not a turn cut off ----------------

SHARED = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@contextlib.asynccontextmanager
async def two_stores(kind: str, tmp_path: Path) -> AsyncIterator[tuple[Any, Any]]:
    """Two stores on one database, as two processes open it (each counts its calls)."""
    from flaky_store import FlakyStore
    from store.conftest import PG_DSN, empty_pg_schema, skip_without_postgres

    opened: list[Any] = []
    schema = f"shared_{secrets.token_hex(4)}"
    for _ in range(2):
        if kind == "sqlite":
            from handrail.store import SqliteStore

            opened.append(SqliteStore(tmp_path / "shared.db", poll_interval=0.01))
        else:
            skip_without_postgres()
            from handrail.store import PostgresStore

            opened.append(await PostgresStore.connect(PG_DSN, schema=schema, pool_size=2))
    if kind == "postgres":
        await empty_pg_schema(schema)
    try:
        yield FlakyStore(opened[0]), FlakyStore(opened[1])  # no faults: they count the calls
    finally:
        for store in opened:
            await store.close()
        if kind == "postgres":
            import psycopg

            async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as db:
                await db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


WRITES = ("save", "log_started", "log_finished", "append_events", "release_lease")


def recovering(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "recovering session" in r.getMessage()]


@pytest.mark.parametrize("kind", SHARED)
async def test_a_worker_leaves_a_turn_another_process_drives_without_a_false_alarm(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    release, started = asyncio.Event(), []
    async with two_stores(kind, tmp_path) as (first_store, second_store):
        _, turn = await refund_under_way(first_store, release, started)
        before = await first_store.load("s1")
        second = slow_engine(second_store, "w", release, started)
        worker = Worker(second, poll_interval=60, listen=False)
        with caplog.at_level("DEBUG", logger="handrail.engine"):
            with pytest.raises(SessionBusyError):
                await second.advance("s1")
            assert not await worker.advance("s1")  # a wake-up for it: passed over
        assert recovering(caplog) == []
        drives = [r for r in caplog.records if r.name in ("handrail.engine", "handrail.worker")]
        assert not [r.getMessage() for r in drives if r.levelno >= logging.WARNING]
        assert any("driven by another process" in r.getMessage() for r in caplog.records)
        # Nothing written, nor the tool-call log read: the lease said "another's" first.
        assert not {m: n for m, n in second_store.calls.items() if m in WRITES or m == "tool_log"}
        assert (await second_store.load("s1")).version == before.version  # type: ignore[union-attr]
        release.set()
        events = await turn
    assert events[-1].type == "run-completed" and ran == ["A1"]
    assert worker.stats.failed == 0 and worker.stats.moved == 0


@pytest.mark.parametrize("kind", SHARED)
async def test_a_turn_whose_lease_lapsed_is_still_recovered_with_the_warning(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    release, started = asyncio.Event(), []
    async with two_stores(kind, tmp_path) as (first_store, second_store):
        first, turn = await refund_under_way(first_store, release, started)
        turn.cancel()  # the process dies inside the refund...
        with contextlib.suppress(asyncio.CancelledError):
            await turn
        # ...holding its lease, which lapses (a cancelled drive gives it back: take it again).
        assert await first_store.acquire_lease("s1", first.lease_owner, 0.05)
        second = slow_engine(second_store, "w", release, started)
        await asyncio.sleep(0.2)
        with caplog.at_level("WARNING", logger="handrail.engine"):
            result = await second.advance("s1")
        assert result is not None and result.outcome == "suspended"
        (warning,) = recovering(caplog)
        assert second.lease_owner in warning and "'s1'" in warning
        state = await second.session("s1")
        assert [c.kind for c in state.pending.values()] == ["recovery"]  # it may have run
    assert ran == []


async def refund_under_way(
    store: Any, release: asyncio.Event, started: list[str]
) -> tuple[Engine, asyncio.Task[Any]]:
    """An engine of its own driving session s1's decided refund, held inside the slow tool."""
    first = slow_engine(store, "api", release, started)
    await decided(first, "s1", "A1")
    turn = asyncio.create_task(drain(first.resume("s1")))
    await eventually(lambda: _true(started == ["A1"]))
    return first, turn


async def _true(value: bool) -> bool:
    return value


async def drain(run: Any) -> list[Any]:
    return [e async for e in run]


async def test_a_turn_that_ends_while_a_worker_asks_for_its_lease_is_not_recovered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Read while running, the turn ends (its lease given back) before the worker's ask."""
    release, started = asyncio.Event(), []
    turn: asyncio.Task[list[Any]] | None = None

    class Racing(MemoryStore):
        async def acquire_lease(self, session_id: str, owner: str, ttl: float) -> bool:
            if owner.startswith("w#") and turn is not None and not turn.done():
                release.set()  # the first process's turn ends right now
                await turn
            return await super().acquire_lease(session_id, owner, ttl)

    store = Racing()
    first = slow_engine(store, "api", release, started)
    await decided(first, "s1", "A1")
    turn = asyncio.create_task(drain(first.resume("s1")))
    await eventually(lambda: _true(started == ["A1"]))
    second = slow_engine(store, "w", release, started)
    with caplog.at_level("WARNING", logger="handrail.engine"):
        assert await second.advance("s1") is None  # read again: nothing left to do
    assert recovering(caplog) == []
    assert (await turn)[-1].type == "run-completed" and ran == ["A1"]
    assert (await store.load("s1")).status == "completed"  # type: ignore[union-attr]


class ApartStore(MemoryStore):
    """A store written before the grouped writes: a save takes no `lease=`, `release=`..."""

    async def save(self, record: Any) -> Any:  # type: ignore[override]
        return await super().save(record)

    async def log_started(self, session_id: str, tool_call_id: str, **fields: Any) -> Any:
        fields.pop("lease", None)
        return await super().log_started(session_id, tool_call_id, **fields)


async def test_with_a_store_that_does_not_group_a_busy_turn_is_left_and_a_lapsed_one_recovered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release, started = asyncio.Event(), []
    store = ApartStore()
    first = slow_engine(store, "api", release, started)
    assert not first._core.grouping
    await decided(first, "s1", "A1")
    turn = asyncio.create_task(drain(first.resume("s1")))
    await eventually(lambda: _true(started == ["A1"]))
    second = slow_engine(store, "w", release, started)
    with caplog.at_level("WARNING", logger="handrail.engine"):
        with pytest.raises(SessionBusyError):
            await second.advance("s1")
        assert recovering(caplog) == []
        turn.cancel()  # now the first process dies inside the refund (its lease given back)
        with contextlib.suppress(asyncio.CancelledError):
            await turn
        result = await second.advance("s1")
    assert result is not None and result.outcome == "suspended"
    assert len(recovering(caplog)) == 1
    assert [c.kind for c in (await second.session("s1")).pending.values()] == ["recovery"]
    assert await store.acquire_lease("s1", "someone else", 1.0)  # given back once suspended


# -- a wake-up heard by every worker is read by one ---------------------------------------------


@contextlib.asynccontextmanager
async def shared_stores(kind: str, tmp_path: Path, count: int) -> AsyncIterator[list[Any]]:
    """`count` stores on one database, as as many processes open it."""
    from store.conftest import PG_DSN, empty_pg_schema, skip_without_postgres

    opened: list[Any] = []
    schema = f"wake_{secrets.token_hex(4)}"
    if kind == "postgres":
        skip_without_postgres()
    try:
        for _ in range(count):
            if kind == "sqlite":
                from handrail.store import SqliteStore

                opened.append(SqliteStore(tmp_path / "shared.db", poll_interval=0.01))
            else:
                from handrail.store import PostgresStore

                opened.append(await PostgresStore.connect(PG_DSN, schema=schema, pool_size=2))
        if kind == "postgres":
            await empty_pg_schema(schema)
        yield opened
    finally:
        for store in opened:
            await store.close()
        if kind == "postgres":
            import psycopg

            async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as db:
                await db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def count_loads(store: Any) -> dict[str, int]:
    """Count the store's `load` calls by session (the whole session read)."""
    loads: dict[str, int] = {}
    load = store.load

    async def counted(session_id: str) -> Any:
        loads[session_id] = loads.get(session_id, 0) + 1
        return await load(session_id)

    store.load = counted
    return loads


@pytest.mark.parametrize("kind", SHARED)
async def test_a_wake_up_heard_by_three_workers_is_read_by_one_of_them(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each decided session is driven once; the workers that do not drive it never read it."""
    ids = [f"s{i}" for i in range(12)]
    async with shared_stores(kind, tmp_path, 4) as (deciding, *stores):
        api = engine(deciding, "api")
        cards = {}
        for session_id in ids:
            events = [e async for e in api.submit(session_id, f"A-{session_id}")]
            cards[session_id] = events[-1].pending[0]
        loads = [count_loads(store) for store in stores]
        workers = [
            Worker(engine(store, f"w{i}"), poll_interval=60, concurrency=4)
            for i, store in enumerate(stores)
        ]
        stop = asyncio.Event()
        with caplog.at_level("DEBUG", logger="handrail"):
            tasks = [asyncio.create_task(worker.run(stop)) for worker in workers]
            await asyncio.sleep(0.3)  # subscribed, swept (nothing due yet)
            await asyncio.gather(*(api.resolve(s, card, Approve()) for s, card in cards.items()))

            async def done() -> bool:
                summaries = [await deciding.summary(s) for s in ids]
                return all(s is not None and s.status == "completed" for s in summaries)

            await eventually(done)
            stop.set()
            async with asyncio.timeout(10):
                await asyncio.gather(*tasks)
    assert sorted(ran) == sorted(f"A-{s}" for s in ids)  # each refunded once
    assert sum(w.stats.moved for w in workers) == len(ids)
    assert sum(w.stats.woken for w in workers) >= 2 * len(ids)  # every worker heard them
    # Read by the worker that drove it; by no other.
    assert {s: [n.get(s, 0) > 0 for n in loads].count(True) for s in ids} == dict.fromkeys(ids, 1)
    handrail = [r for r in caplog.records if r.name in ("handrail.engine", "handrail.worker")]
    assert [r.getMessage() for r in handrail if r.levelno >= logging.WARNING] == []
    assert any("wake-up for session" in r.getMessage() for r in handrail)  # (DEBUG) left


@pytest.mark.parametrize("kind", SHARED)
async def test_a_wake_up_claim_is_one_process_s_and_only_for_a_session_that_needs_a_worker(
    kind: str, tmp_path: Path
) -> None:
    from handrail.store._base import take_wakeup

    async with shared_stores(kind, tmp_path, 2) as (first, second):
        api = engine(first, "api")
        events = [e async for e in api.submit("s1", "A1")]
        due = time.time() + 5
        async with take_wakeup(first, "s1", due=due, owner="w1") as summary:
            assert summary is None  # suspended on its card: nobody needs to read it
        await api.resolve("s1", events[-1].pending[0], Approve())
        async with take_wakeup(first, "s1", due=due, owner="w1") as summary:
            assert summary is not None and summary.id == "s1"
            async with take_wakeup(second, "s1", due=due, owner="w2") as other:
                assert other is None  # the other process's claim
        async with take_wakeup(second, "s1", due=due, owner="w2") as summary:
            assert summary is not None  # given back
        assert await first.acquire_lease("s1", "w1", 30)
        async with take_wakeup(second, "s1", due=due, owner="w2") as summary:
            assert summary is None  # a live worker's lease
        async with take_wakeup(first, "s1", due=due, owner="w1") as summary:
            assert summary is not None  # its own
        async with take_wakeup(first, "s1", due=time.time() - 60, owner="w1") as summary:
            assert summary is None  # not due yet by the clock given
