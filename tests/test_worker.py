"""`Worker`: sessions resolved anywhere are resumed by a worker; cut-off turns are recovered."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from handrail import Agent, Approve, Engine, Runtime, ToolContext, UserError, Worker, tool
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
