"""A turn's events in the session's event log, carried by the turn's saves (`Engine.log_run`).

A server or a worker keeps each turn's events in the session's event log. The turn's saves
carry them, in their transactions: the first write (the user's message) carries
`run-started`, the last (the answer) the rest, the event that ends the turn included; a group
goes on its own only when no save carries it in time. What is logged is what was shown, in
order, each event once; a drive that stops before it writes logs nothing; a drive that fails
logs what it showed, never an end it did not reach.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest

from handrail import Agent, Approve, Engine, Runtime, Worker, tool
from handrail.events import EVENT
from handrail.exceptions import SessionBusyError, StoreUnavailableError, UserError
from handrail.models import ModelRequest
from handrail.store import MemoryStore, SessionStore, SqliteStore
from handrail.testing import FunctionModel, Step, call
from test_durable_writes import Commits

GATE = asyncio.Event()


@tool(name="orders.lookup")
def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped"}


@tool(name="orders.wait")
async def wait(order_id: str) -> str:
    """Look an order up, slowly (until the test lets it go)."""
    await GATE.wait()
    return "found"


@tool(name="orders.refund", permission="write")
def refund(order_id: str) -> str:
    """Refund an order (gated)."""
    return "refunded"


CALLS: dict[str, Step] = {
    "text": "Hello there.",
    "read": call("orders.lookup", order_id="A1"),
    "slow": call("orders.wait", order_id="A1"),
    "gated": call("orders.refund", order_id="A1"),
}


def answer(request: ModelRequest) -> Step:
    last = request.messages[-1]
    return CALLS[last.text.split()[0]] if last.role == "user" else "Done."


def engine_on(store: SessionStore) -> Engine:
    ids = itertools.count()
    return Engine(
        Agent("a", tools=[lookup, wait, refund]),
        store=store,
        runtime=Runtime(model=FunctionModel(answer), ids=lambda p: f"{p}_{next(ids)}"),
    )


async def logged_run(
    engine: Engine, session_id: str, text: str, **log: Any
) -> tuple[list[dict[str, Any]], list[tuple[int, list[dict[str, Any]]]]]:
    """A turn run with its events logged: what it showed (as logged), and each group told."""
    groups: list[tuple[int, list[dict[str, Any]]]] = []
    run = engine.submit(session_id, text)
    engine.log_run(session_id, run, on_logged=lambda last, es: groups.append((last, es)), **log)
    shown = [EVENT.dump_python(event, mode="json") async for event in run]
    return shown, groups


@pytest.mark.parametrize("shape", ["text", "read"])
async def test_a_turns_events_ride_in_its_saves_and_cost_no_commit_of_their_own(
    tmp_path: Path, shape: str
) -> None:
    store = SqliteStore(tmp_path / "h.db", audit_key=None)
    engine = engine_on(store)
    try:
        await logged_run(engine, "s", f"{shape} first")  # (the session's first turn)
        counter = Commits()
        await store._call(lambda db: db.set_trace_callback(counter), None)
        shown, groups = await logged_run(engine, "s", f"{shape} again", every=60.0)
        await store._call(lambda db: db.set_trace_callback(None), None)
        assert counter.writing == 2  # the message accepted, the answer: the engine's own
        # Two groups: `run-started` with the message, the rest with the answer.
        assert [[e["type"] for e in es][:1] for _, es in groups] == [
            ["run-started"],
            [groups[1][1][0]["type"]],
        ]
        assert len(groups[0][1]) == 1 and groups[1][1][-1]["type"] == "run-completed"
        first_turn = groups[0][0] - 1
        assert await store.events("s", after=first_turn) == list(enumerate(shown, first_turn + 1))
    finally:
        await store.close()


async def test_a_worker_turn_logs_its_events_with_its_saves(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "h.db", audit_key=None)
    engine = engine_on(store)
    try:
        events = [e async for e in engine.submit("s", "gated please")]
        card = events[-1].pending[0]  # type: ignore[attr-defined]
        await engine.resolve("s", card, Approve(by="ops"))
        before = len(await store.events("s"))
        counter = Commits()
        await store._call(lambda db: db.set_trace_callback(counter), None)
        result = await engine.advance("s")  # as a worker drives it: events to the log
        await store._call(lambda db: db.set_trace_callback(None), None)
        assert result is not None and result.outcome == "completed"
        assert counter.writing == 3  # `started`, the result, the answer: nothing more
        logged = [e["type"] for _, e in await store.events("s", after=before)]
        assert logged[0] == "run-started" and logged[-1] == "run-completed"
        assert "tool-call-completed" in logged
    finally:
        await store.close()


async def test_a_woken_worker_turn_claims_its_wake_up_without_a_commit(tmp_path: Path) -> None:
    """The wake-up claim writes nothing: a woken worker's turn makes a driven turn's commits."""
    deciding = SqliteStore(tmp_path / "h.db", audit_key=None)
    working = SqliteStore(tmp_path / "h.db", audit_key=None, poll_interval=0.01)
    api, worker = engine_on(deciding), Worker(engine_on(working), poll_interval=60)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        events = [e async for e in api.submit("s", "gated please")]
        await asyncio.sleep(0.2)  # subscribed, swept (nothing due)
        counter = Commits()
        await working._call(lambda db: db.set_trace_callback(counter), None)
        await api.resolve("s", events[-1].pending[0], Approve(by="ops"))  # wakes the worker
        async with asyncio.timeout(5):
            while getattr(await deciding.summary("s"), "status", None) != "completed":  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        await working._call(lambda db: db.set_trace_callback(None), None)
        assert worker.stats.woken == 1 and worker.stats.resumed == 1
        assert counter.writing == 3  # `started`, the result, the answer: nothing more
    finally:
        stop.set()
        await task
        await deciding.close()
        await working.close()


async def test_a_turn_that_waits_logs_what_it_showed_before_it_ends() -> None:
    store = MemoryStore()
    engine = engine_on(store)
    GATE.clear()
    groups: list[tuple[int, list[dict[str, Any]]]] = []
    run = engine.submit("s", "slow please")
    engine.log_run("s", run, every=0.01, on_logged=lambda last, es: groups.append((last, es)))
    turn = asyncio.create_task(run.finish())
    async with asyncio.timeout(5):
        # A group goes on its own while the tool waits.
        while not any(e["type"] == "tool-call-started" for _, e in await store.events("s")):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert not turn.done()
    GATE.set()
    await turn
    logged = await store.events("s")
    assert [seq for seq, _ in logged] == list(range(1, len(logged) + 1))  # each once, in order
    assert logged[-1][1]["type"] == "run-completed"
    assert len(groups) >= 3  # the message's, the waiting ones', the answer's
    told = [event for _, es in groups for event in es]
    assert told == [event for _, event in logged]


async def test_a_drive_refused_at_its_first_write_logs_nothing(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "h.db", audit_key=None)
    engine = engine_on(store)
    try:
        await engine.submit("s", "text first").finish()
        before = await store.events("s")
        assert await store.acquire_lease("s", "another worker", 30)
        run = engine.submit("s", "text again")
        log = engine.log_run("s", run)
        with pytest.raises(SessionBusyError):
            await run.finish()
        assert not log.begun
        assert await store.events("s") == before
    finally:
        await store.close()


class FailingAnswers(MemoryStore):
    """A store whose saves of a turn's answer fail, for as long as it is asked."""

    async def save(self, record: Any, **grouped: Any) -> Any:
        if record.status == "completed":
            raise ConnectionError("the database went away")
        return await super().save(record, **grouped)


async def test_a_drive_that_fails_logs_what_it_showed_and_no_end() -> None:
    store = FailingAnswers()
    engine = engine_on(store)
    engine._core.store_retry = type(engine._core.store_retry)(attempts=1)
    run = engine.submit("s", "read please")
    log = engine.log_run("s", run)
    shown = []
    with pytest.raises(StoreUnavailableError):
        async for event in run:
            shown.append(EVENT.dump_python(event, mode="json"))
    logged = [event for _, event in await store.events("s")]
    assert logged[0]["type"] == "run-started" and log.begun
    assert logged == shown  # what it showed, and nothing it did not
    assert not any(e["type"] in ("run-completed", "run-failed") for e in logged)


class OwnStore(MemoryStore):
    """A store written before saves carried events: its `save` takes no `events=`."""

    async def save(  # type: ignore[override]
        self,
        record: Any,
        *,
        lease: Any = None,
        release: Any = None,
        started: Any = (),
        notify: bool = False,
    ) -> Any:
        return await super().save(
            record, lease=lease, release=release, started=started, notify=notify
        )


async def test_a_store_whose_saves_carry_no_events_gets_them_appended() -> None:
    store = OwnStore()
    engine = engine_on(store)
    shown, groups = await logged_run(engine, "s", "read please")
    assert [event for _, event in await store.events("s")] == shown
    assert groups[0][1][0]["type"] == "run-started"


async def test_a_run_is_logged_only_from_its_start() -> None:
    engine = engine_on(MemoryStore())
    run = engine.submit("s", "text please")
    await anext(aiter(run))
    with pytest.raises(UserError, match="before iterating it"):
        engine.log_run("s", run)
    with pytest.raises(UserError, match="every=-1"):
        engine.log_run("t", engine.submit("t", "text please"), every=-1)
