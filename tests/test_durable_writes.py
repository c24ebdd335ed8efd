"""How many commits a turn makes, per shape: what docs/durability.md says, counted in SQLite.

The commits are counted where they happen, in the store's SQLite connection (a trace of the
statements it runs): a transaction that wrote is one commit the database makes durable. The
numbers are those of the table in docs/durability.md ("What is written, and when"); each is
within one of the minimum derived there, and a change that splits a grouped write again
fails here.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest

from handrail import Agent, Approve, Engine, Reject, Runtime, tool
from handrail.exceptions import SessionBusyError
from handrail.models import ModelRequest
from handrail.store import SessionRecord, SqliteStore
from handrail.testing import FunctionModel, Step, call


@tool(name="orders.lookup")
def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped"}


@tool(name="orders.note", permission="write", approval="auto")
def note(order_id: str) -> str:
    """Note something on an order (a side effect, ungated)."""
    return "noted"


@tool(name="orders.log", permission="write", approval="auto", sequential=True)
def log(order_id: str) -> str:
    """Log something on an order (a side effect, ungated, run alone)."""
    return "logged"


@tool(name="orders.refund", permission="write")
def refund(order_id: str) -> str:
    """Refund an order (gated)."""
    return "refunded"


CALLS: dict[str, Step] = {
    "text": "Hello.",
    "read": call("orders.lookup", order_id="A1"),
    "write": call("orders.note", order_id="A1"),
    "read+write": [call("orders.lookup", order_id="A1"), call("orders.note", order_id="A1")],
    "two-sequential": [call("orders.log", order_id="A1"), call("orders.log", order_id="A2")],
    "gated": call("orders.refund", order_id="A1"),
}


def answer(request: ModelRequest) -> Step:
    last = request.messages[-1]
    return CALLS[last.text.split()[0]] if last.role == "user" else "Done."


class Commits:
    """Counts the transactions of a SQLite connection that wrote (a trace callback)."""

    def __init__(self) -> None:
        self.writing = 0
        self._open = self._wrote = False

    def __call__(self, sql: str) -> None:
        word = sql.lstrip()[:16].upper()
        if word.startswith("BEGIN"):
            self._open, self._wrote = True, False
        elif word.startswith("COMMIT"):
            self._open = False
            self.writing += self._wrote
        elif word.startswith("ROLLBACK") and not word.startswith("ROLLBACK TO"):
            self._open = False
        elif word.startswith(("INSERT", "UPDATE", "DELETE")):
            if self._open:
                self._wrote = True
            else:
                self.writing += 1


async def commits_of(tmp_path: Path, shape: str) -> tuple[int, ...]:
    """The writing commits of each call of the second turn of `shape` (the first sets up)."""
    store = SqliteStore(tmp_path / "h.db", audit_key=None)
    ids = itertools.count()
    engine = Engine(
        Agent("a", tools=[lookup, note, log, refund]),
        store=store,
        runtime=Runtime(model=FunctionModel(answer), ids=lambda p: f"{p}_{next(ids)}"),
    )
    counted: list[int] = []
    try:
        for turn in range(2):
            counter = Commits()
            await store._call(lambda db, c=counter: db.set_trace_callback(c), None)
            events = [e async for e in engine.submit("s", f"{shape} please {turn}")]
            if shape == "gated":
                assert events[-1].type == "run-suspended"
                counted = [counter.writing]
                counter.writing = 0
                await engine.resolve("s", events[-1].pending[0], Approve(by="ops"))
                counted.append(counter.writing)
                counter.writing = 0
                events = [e async for e in engine.resume("s")]
            else:
                counted = []
            assert events[-1].type == "run-completed"
            counted.append(counter.writing)
            await store._call(lambda db: db.set_trace_callback(None), None)
        record = await store.load("s")
        assert record is not None and record.status == "completed"
        assert await store.acquire_lease("s", "someone else", 10)  # the turn gave it back
        return tuple(counted)
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        # the user's message, with the lease taken; the answer, with the lease given back
        ("text", (2,)),
        ("read", (2,)),  # the read's result rides with the answer
        # ... the calls, the lease check and the call's `started`; its result; the answer
        ("write", (4,)),
        ("read+write", (4,)),
        # a second sequential call is logged `started` alone, when it starts
        ("two-sequential", (6,)),
        # submit: the message with the lease, the suspension with the lease back; resolve:
        # the decision (which wakes the workers); resume: the call's `started` with the
        # session and the lease taken, its result, the answer with the lease back
        ("gated", (2, 1, 3)),
    ],
)
async def test_a_turn_makes_the_commits_the_docs_say(
    tmp_path: Path, shape: str, expected: tuple[int, ...]
) -> None:
    assert await commits_of(tmp_path, shape) == expected


async def test_a_rejected_call_resumes_with_a_write_before_the_model_is_called(
    tmp_path: Path,
) -> None:
    """Nothing runs on resume: the lease is taken (with the session) before the model's call."""
    store = SqliteStore(tmp_path / "h.db", audit_key=None)
    counter = Commits()
    seen: list[int] = []

    def model(request: ModelRequest) -> Step:
        last = request.messages[-1]
        if last.role == "user":
            return call("orders.refund", order_id="A1")
        seen.append(counter.writing)  # what the resumption wrote before calling the model
        return "Not refunded."

    engine = Engine(
        Agent("a", tools=[refund]), store=store, runtime=Runtime(model=FunctionModel(model))
    )
    try:
        await store._call(lambda db: db.set_trace_callback(counter), None)
        events = [e async for e in engine.submit("s", "refund A1")]
        await engine.resolve("s", events[-1].pending[0], Reject(by="ops", reason="no"))
        counter.writing = 0
        events = [e async for e in engine.resume("s")]
        assert events[-1].type == "run-completed"
        # the lease with the session before the model's call; the answer with the lease back
        assert (seen, counter.writing) == ([1], 2)
        await store._call(lambda db: db.set_trace_callback(None), None)
    finally:
        await store.close()


async def test_a_second_worker_that_read_the_same_version_loses_at_its_first_write(
    tmp_path: Path,
) -> None:
    """Two workers resume one decided turn at once: it runs once; the loser shows nothing."""
    runs: list[str] = []
    lost = asyncio.Event()

    @tool(name="orders.refund", permission="write")
    async def slow_refund(order_id: str) -> str:
        """Refund an order (gated), slowly: until the other worker has lost."""
        runs.append(order_id)
        await lost.wait()
        return "refunded"

    both_read = asyncio.Barrier(2)

    class Racing(SqliteStore):
        racing = False

        async def load(self, session_id: str) -> SessionRecord | None:
            record = await super().load(session_id)
            if self.racing:
                await both_read.wait()  # each worker has read the session, neither has written
            return record

    store = Racing(tmp_path / "h.db", audit_key=None)
    scripted = FunctionModel(
        lambda r: call("orders.refund", order_id="A1") if r.messages[-1].role == "user" else "Done."
    )

    def worker(name: str) -> Engine:
        return Engine(
            Agent("a", tools=[slow_refund]),
            store=store,
            worker_id=name,
            runtime=Runtime(model=scripted),
        )

    first, second = worker("w1"), worker("w2")
    try:
        events = [e async for e in first.submit("s", "refund A1")]
        await first.resolve("s", events[-1].pending[0], Approve(by="ops"))
        store.racing = True

        async def resume(engine: Engine) -> list[str] | SessionBusyError:
            seen: list[str] = []
            try:
                async for event in engine.resume("s"):
                    seen.append(event.type)
            except SessionBusyError as error:
                lost.set()
                assert not seen  # nothing shown before the write that lost
                return error
            return seen

        outcomes = await asyncio.gather(resume(first), resume(second))
        store.racing = False
        busy = [o for o in outcomes if isinstance(o, SessionBusyError)]
        done = [o for o in outcomes if isinstance(o, list)]
        assert len(busy) == 1 and len(done) == 1
        assert "another worker" in str(busy[0])
        assert done[0][-1] == "run-completed"
        assert runs == ["A1"]  # the side effect ran once
        log = await store.tool_log("s")
        assert [(e.tool, e.status) for e in log] == [("orders.refund", "finished")]
    finally:
        await store.close()


async def test_a_drive_that_read_a_version_saved_since_reads_it_again(tmp_path: Path) -> None:
    """A turn that ended between a drive's read and its first write: the drive starts over."""
    store = SqliteStore(tmp_path / "h.db", audit_key=None)
    engine = Engine(Agent("a"), store=store, runtime=Runtime(model=FunctionModel(lambda r: "Hi.")))
    other = Engine(Agent("a"), store=store, runtime=Runtime(model=FunctionModel(lambda r: "Yo.")))
    try:
        [e async for e in engine.submit("s", "hello")]
        loads = 0
        original = store.load

        async def load_then_let_another_turn_run(session_id: str) -> SessionRecord | None:
            nonlocal loads
            loads += 1
            record = await original(session_id)
            if loads == 1:  # another worker's whole turn, between this read and its write
                [e async for e in other.submit("s", "meanwhile")]
            return record

        store.load = load_then_let_another_turn_run  # type: ignore[method-assign]
        events = [e async for e in engine.submit("s", "again")]
        store.load = original  # type: ignore[method-assign]
        # this drive read it twice (the other's turn read it once in between)
        assert events[-1].type == "run-completed" and loads == 3
        state = await engine.session("s")
        assert [m.text for m in state.messages if m.role == "user"] == [
            "hello",
            "meanwhile",
            "again",
        ]
    finally:
        await store.close()
