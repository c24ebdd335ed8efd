"""How many commits a turn makes, per shape: what docs/durability.md says, counted in SQLite.

The commits are counted where they happen, in the store's SQLite connection (a trace of the
statements it runs): a transaction that wrote is one commit the database makes durable. The
numbers are those of the table in docs/durability.md ("What is written, and when"); each is
within one of the minimum derived there, and a change that splits a grouped write again
fails here.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from handrail import Agent, Approve, Engine, Runtime, tool
from handrail.models import ModelRequest
from handrail.store import SqliteStore
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
        # lease and load; the user's message; the answer, with the lease given back
        ("text", (3,)),
        ("read", (3,)),  # the read's result rides with the answer
        # ... the calls, the lease check and the call's `started`; its result; the answer
        ("write", (5,)),
        ("read+write", (5,)),
        # a second sequential call is logged `started` alone, when it starts
        ("two-sequential", (7,)),
        # submit: lease and load, message, suspension with the lease back; resolve: the
        # decision (which wakes the workers); resume: lease and load, the call's `started`
        # with the lease check, its result, the answer with the lease back
        ("gated", (3, 1, 4)),
    ],
)
async def test_a_turn_makes_the_commits_the_docs_say(
    tmp_path: Path, shape: str, expected: tuple[int, ...]
) -> None:
    assert await commits_of(tmp_path, shape) == expected
