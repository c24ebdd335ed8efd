"""Suspend -> serialize -> resume, for one approval, in each framework: `python -m bench.suspend`.

The scenario: a session that already holds 20 messages; the user asks for a refund; the model
(instant, scripted) calls a gated `refund` tool; the run pauses for approval; the paused state
is serialized; a decision approves the call; the run resumes from the serialized state, the
tool runs, the model answers. One round trip is all of that, timed with `perf_counter_ns`
(median of sequential runs after warm-up). Bytes: the size of the serialized paused state.

- handrail: `Engine.submit` -> `run-suspended` -> `Engine.resolve(Approve())` ->
  `Engine.resume`, on `MemoryStore` and on `SqliteStore` (a file in a temp directory).
- LangGraph: the prebuilt ReAct agent whose tool calls `interrupt()`, an `InMemorySaver`
  checkpointer, then `Command(resume=...)`; bytes are the checkpoint's serialized size.
- PydanticAI: a tool with `requires_approval=True`, output `[str, DeferredToolRequests]`;
  the messages serialized with `ModelMessagesTypeAdapter`, loaded back, and the run continued
  with `DeferredToolResults(approvals={id: True})`.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HISTORY = 20  # messages already in the session
WARMUP, REPEAT = 20, 200
TARGETS = {"memory": 1.0, "sqlite": 3.0}  # ms a round trip (the goals: ≤ 1 ms, ≤ 3 ms)


async def _median_ms(
    round_trip: Callable[[int], Awaitable[Any]],
    prepare: Callable[[int], Awaitable[Any]] | None = None,
) -> float:
    """Median ms of `round_trip(i)`; `prepare(i)` (untimed) sets up run i first."""
    samples: list[float] = []
    for i in range(WARMUP + REPEAT):
        if prepare is not None:
            await prepare(i)
        start = time.perf_counter_ns()
        await round_trip(i)
        if i >= WARMUP:
            samples.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(samples)


# -- handrail ----------------------------------------------------------------------------------


def _handrail_engine(store: Any) -> Any:
    from handrail import Agent, Engine, Runtime, tool
    from handrail.models import ModelRequest
    from handrail.testing import FunctionModel, Step, call

    @tool(name="orders.refund", permission="write", amendable=["amount"])
    def refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        return {"refund_id": "R-1", "amount": amount}

    def answer(request: ModelRequest) -> Step:
        last = request.messages[-1]
        if last.role == "user":
            return (
                "Noted."
                if last.text.startswith("earlier")
                else call("orders.refund", order_id="A1", amount=84)
            )
        return "Refunded 84."

    ids = itertools.count()
    runtime = Runtime(model=FunctionModel(answer), ids=lambda p: f"{p}_{next(ids)}")
    return Engine(Agent("support", tools=[refund]), store=store, runtime=runtime)


async def _handrail(store: Any) -> tuple[float, int]:
    from handrail import Approve

    engine = _handrail_engine(store)

    async def prepare(i: int) -> None:  # 20 messages of history: 10 user/assistant pairs
        for turn in range(HISTORY // 2):
            async for _ in engine.submit(f"s{i}", f"earlier question {turn}"):
                pass

    async def round_trip(i: int) -> None:
        event = await _last(engine.submit(f"s{i}", "Refund my order A1, please."))
        assert event.type == "run-suspended"
        resolution = await engine.resolve(f"s{i}", event.pending[0], Approve(by="bench"))
        assert resolution.ready
        event = await _last(engine.resume(f"s{i}"))
        assert event.type == "run-completed", event

    ms = await _median_ms(round_trip, prepare)
    # The stored state at the pause, from one more (untimed) run.
    await prepare(-1)
    await _last(engine.submit("s-1", "Refund my order A1, please."))
    record = await engine.store.load("s-1")
    return ms, len(_json(record.data)) + sum(len(_json(m)) for m in record.messages)


async def _last(run: Any) -> Any:
    return [event async for event in run][-1]


def _json(data: Any) -> bytes:
    import pydantic_core

    return pydantic_core.to_json(data)


# -- LangGraph -------------------------------------------------------------------------------


async def _langgraph() -> tuple[float, int]:
    import warnings

    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command, interrupt

    from bench._langgraph import ScriptedChatModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

    @lc_tool
    def refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        decision = interrupt({"tool": "refund", "order_id": order_id, "amount": amount})
        assert decision == "approve"
        return {"refund_id": "R-1", "amount": amount}

    def script(messages: list[BaseMessage]) -> AIMessage:
        if isinstance(messages[-1], HumanMessage):
            return AIMessage(
                "",
                tool_calls=[
                    {
                        "name": "refund",
                        "args": {"order_id": "A1", "amount": 84},
                        "id": f"c{len(messages)}",
                        "type": "tool_call",
                    }
                ],
            )
        return AIMessage("Refunded 84.")

    saver = InMemorySaver()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = create_react_agent(ScriptedChatModel(script=script), [refund], checkpointer=saver)
    history: list[Any] = []
    for turn in range(HISTORY // 2):
        history += [("user", f"earlier question {turn}"), ("assistant", "Noted.")]

    size = 0

    async def round_trip(i: int) -> None:
        nonlocal size
        config: Any = {"configurable": {"thread_id": f"t{i}"}}
        result = await agent.ainvoke(
            {"messages": [*history, ("user", "Refund my order A1, please.")]}, config
        )
        assert "__interrupt__" in result
        checkpoint = await saver.aget_tuple(config)
        assert checkpoint is not None
        size = len(saver.serde.dumps_typed(checkpoint.checkpoint)[1])
        result = await agent.ainvoke(Command(resume="approve"), config)
        assert result["messages"][-1].content == "Refunded 84."

    return await _median_ms(round_trip), size


# -- PydanticAI -----------------------------------------------------------------------------


async def _pydantic_ai() -> tuple[float, int]:
    from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
    from pydantic_ai.messages import (
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import RequestUsage

    usage = RequestUsage(input_tokens=1, output_tokens=1)

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        if isinstance(last, ModelRequest) and any(
            isinstance(p, ToolReturnPart) for p in last.parts
        ):
            return ModelResponse(parts=[TextPart("Refunded 84.")], usage=usage)
        call = ToolCallPart("refund", {"order_id": "A1", "amount": 84}, tool_call_id="c1")
        return ModelResponse(parts=[call], usage=usage)

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(answer), output_type=[str, DeferredToolRequests]
    )

    @agent.tool_plain(requires_approval=True)
    def refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        return {"refund_id": "R-1", "amount": amount}

    history: list[ModelMessage] = []
    for turn in range(HISTORY // 2):
        history.append(ModelRequest(parts=[UserPromptPart(f"earlier question {turn}")]))
        history.append(ModelResponse(parts=[TextPart("Noted.")], usage=usage))

    size = 0

    async def round_trip(i: int) -> None:
        nonlocal size
        result = await agent.run("Refund my order A1, please.", message_history=history)
        requests = result.output
        assert isinstance(requests, DeferredToolRequests)
        stored = ModelMessagesTypeAdapter.dump_json(result.all_messages())
        loaded = ModelMessagesTypeAdapter.validate_json(stored)
        approvals = {call.tool_call_id: True for call in requests.approvals}
        final = await agent.run(
            message_history=loaded, deferred_tool_results=DeferredToolResults(approvals=approvals)
        )
        assert final.output == "Refunded 84.", final.output
        size = len(stored)

    return await _median_ms(round_trip), size


# -- the table -------------------------------------------------------------------------------


async def main() -> None:
    from handrail.store import MemoryStore, SqliteStore

    rows: list[tuple[str, float, int, str]] = []
    ms, size = await _handrail(MemoryStore())
    rows.append(("handrail, MemoryStore", ms, size, _goal(ms, TARGETS["memory"])))
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "bench.db")
        try:
            ms, size = await _handrail(store)
        finally:
            await store.close()
    rows.append(("handrail, SqliteStore", ms, size, _goal(ms, TARGETS["sqlite"])))
    for label, bench in (
        ("PydanticAI, deferred approval", _pydantic_ai),
        ("LangGraph, interrupt + InMemorySaver", _langgraph),
    ):
        try:
            ms, size = await bench()
        except ImportError as exc:
            print(f"{label}: skipped ({exc}); install the bench extra", file=sys.stderr)
            continue
        rows.append((label, ms, size, ""))
    base = rows[0][1]
    print(f"Suspend -> serialize -> resume, {HISTORY}-message session, median of {REPEAT}")
    print(f"{'':40} {'ms/round trip':>14} {'x handrail':>11} {'state bytes':>12}  target")
    for label, ms, size, goal in rows:
        print(f"{label:40} {ms:14.3f} {ms / base:11.1f} {size:12,}  {goal}")


def _goal(ms: float, limit: float) -> str:
    return f"{'✓' if ms <= limit else '✗'} ≤ {limit:g} ms"


if __name__ == "__main__":
    asyncio.run(main())
