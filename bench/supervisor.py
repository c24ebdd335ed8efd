"""A routed turn, supervisor + 2-agent pipeline, vs LangGraph: `python -m bench.supervisor`.

One turn: the supervisor (an instant scripted model) picks the `search` route; the executor
calls one tool (`lookup`) and writes a note; the responder answers. Timed per turn with
`perf_counter_ns`, median of sequential turns after a warm-up (each turn on a fresh thread
or session, so history does not grow).

- handrail: `run_turn(Router(...))` alone (engine overhead only), and through
  `Engine.submit` on a `MemoryStore` (with the session's load, checkpoints and save).
- LangGraph: a `StateGraph` with a supervisor node (a scripted chat model whose answer names
  the route), a conditional edge, the executor as the prebuilt ReAct agent with the tool,
  and a responder node; no checkpointer.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

WARMUP, REPEAT = 30, 300


async def _median_us(turn: Callable[[int], Awaitable[Any]]) -> float:
    samples = []
    for i in range(WARMUP + REPEAT):
        start = time.perf_counter_ns()
        await turn(i)
        if i >= WARMUP:
            samples.append((time.perf_counter_ns() - start) / 1000)
    return statistics.median(samples)


def _handrail() -> tuple[Callable[[int], Awaitable[Any]], Callable[[int], Awaitable[Any]]]:
    from handrail import Agent, Domain, Engine, RouteDecision, Runtime, tool
    from handrail._turn import run_turn
    from handrail.models import ModelRequest
    from handrail.store import MemoryStore
    from handrail.testing import FunctionModel, Step, call

    @tool
    async def lookup(order_id: str) -> dict[str, str]:
        """Look an order up."""
        return {"id": order_id, "status": "delivered"}

    def answer(request: ModelRequest) -> Step:
        if request.agent == "supervisor":
            return json.dumps({"route": "search", "reason": "lookup"})
        if request.agent == "executor":
            last = request.messages[-1]
            return "Found it." if last.role == "assistant" else call("lookup", order_id="A1")
        return "Your order was delivered."

    runtime = Runtime(model=FunctionModel(answer))
    domain = Domain(
        agents=[Agent("executor", tools=[lookup], scratch=True), Agent("responder")],
        routes={"simple": ["responder"], "search": ["executor", "responder"]},
        supervisor=Agent("supervisor", output_type=RouteDecision),
    )
    router = domain.router()
    assert router is not None
    engine = Engine(domain, store=MemoryStore(), runtime=runtime)

    async def bare(i: int) -> None:
        result = await run_turn(router, "Where is A1?", runtime=runtime).finish()
        assert result.output == "Your order was delivered.", result

    async def with_engine(i: int) -> None:
        events = [e async for e in engine.submit(f"s{i}", "Where is A1?")]
        assert events[-1].output == "Your order was delivered."

    return bare, with_engine


def _langgraph() -> Callable[[int], Awaitable[Any]]:
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.graph import END, START, MessagesState, StateGraph

    from bench._langgraph import ScriptedChatModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

    @lc_tool
    async def lookup(order_id: str) -> dict[str, str]:
        """Look an order up."""
        return {"id": order_id, "status": "delivered"}

    def supervise(messages: list[BaseMessage]) -> AIMessage:
        return AIMessage(json.dumps({"route": "search", "reason": "lookup"}))

    def execute(messages: list[BaseMessage]) -> AIMessage:
        if isinstance(messages[-1], ToolMessage):
            return AIMessage("Found it.")
        call = {"name": "lookup", "args": {"order_id": "A1"}, "id": "c1", "type": "tool_call"}
        return AIMessage("", tool_calls=[call])

    def respond(messages: list[BaseMessage]) -> AIMessage:
        return AIMessage("Your order was delivered.")

    supervisor_model = ScriptedChatModel(script=supervise)
    responder_model = ScriptedChatModel(script=respond)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        executor = create_react_agent(ScriptedChatModel(script=execute), [lookup])

    class State(MessagesState):
        route: str

    async def supervisor(state: State) -> dict[str, Any]:
        decision = await supervisor_model.ainvoke(state["messages"])
        return {"route": json.loads(str(decision.content))["route"]}

    async def responder(state: State) -> dict[str, Any]:
        return {"messages": [await responder_model.ainvoke(state["messages"])]}

    graph = StateGraph(State)
    graph.add_node("supervisor", supervisor)
    graph.add_node("executor", executor)
    graph.add_node("responder", responder)
    graph.add_edge(START, "supervisor")
    graph.add_conditional_edges(
        "supervisor", lambda s: s["route"], {"search": "executor", "simple": "responder"}
    )
    graph.add_edge("executor", "responder")
    graph.add_edge("responder", END)
    app = graph.compile()

    async def turn(i: int) -> None:
        result = await app.ainvoke({"messages": [("user", "Where is A1?")]})
        assert result["messages"][-1].content == "Your order was delivered."

    return turn


async def main() -> None:
    bare, with_engine = _handrail()
    rows = [
        ("handrail run_turn (no store)", await _median_us(bare)),
        ("handrail Engine.submit (MemoryStore)", await _median_us(with_engine)),
    ]
    try:
        rows.append(
            ("LangGraph supervisor graph (no checkpointer)", await _median_us(_langgraph()))
        )
    except ImportError as exc:
        print(f"LangGraph: skipped ({exc}); install the bench extra")
    print("A routed turn: supervisor + executor (1 tool call) + responder, instant models")
    print(f"{'':46} {'µs/turn':>9} {'x run_turn':>11}")
    base = rows[0][1]
    for label, us in rows:
        print(f"{label:46} {us:9.0f} {us / base:11.1f}")


if __name__ == "__main__":
    asyncio.run(main())
