"""LangGraph's side of the benchmarks: the prebuilt ReAct agent with a scripted chat model."""

from __future__ import annotations

import asyncio
import inspect
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph.state import CompiledStateGraph

with warnings.catch_warnings():
    # Deprecated in favour of `langchain.agents.create_agent` (the `langchain` package, not
    # installed here); it is still LangGraph's own prebuilt agent.
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent

NAME = "langgraph"
PACKAGE = "langgraph"

calls = 0  # tool executions, asserted after every run so a skipped tool can't go unnoticed


def add(a: int, b: int) -> int:
    """Add two numbers."""
    global calls
    calls += 1
    return a + b


async def add_async(a: int, b: int) -> int:
    """Add two numbers."""
    global calls
    calls += 1
    return a + b


async def wait(ms: int, n: int) -> int:
    """Sleep a while."""
    global calls
    calls += 1
    await asyncio.sleep(ms / 1000)
    return ms


Script = Callable[[list[BaseMessage]], AIMessage]


class ScriptedChatModel(BaseChatModel):
    """Answers each turn with `script(messages)`, instantly; binds tools like a real model."""

    script: Script

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, AIMessage]:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.script(messages))])

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        # The default `_agenerate` runs `_generate` in a worker thread.
        return self._generate(messages)


def _call(name: str, call_id: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def _loop_script(steps: int) -> Script:
    """Calls `add` once per model turn, `steps` times, then answers."""

    def answer(messages: list[BaseMessage]) -> AIMessage:
        done = sum(isinstance(m, AIMessage) for m in messages)
        if done < steps:
            return AIMessage("", tool_calls=[_call("add", f"c{done}", a=1, b=done)])
        return AIMessage("done")

    return answer


def _agent(script: Script, tool: Callable[..., Any], name: str) -> CompiledStateGraph:
    # `from_function(fn)` takes an async `fn` as a sync one, and returns its un-awaited coroutine.
    kind = "coroutine" if inspect.iscoroutinefunction(tool) else "func"
    tools: list[BaseTool] = [StructuredTool.from_function(name=name, **{kind: tool})]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_react_agent(ScriptedChatModel(script=script), tools)


def _input() -> dict[str, Any]:
    return {"messages": [("user", "go")]}


# One model turn and one tool turn are a superstep each; the default limit is 25.
CONFIG: Any = {"recursion_limit": 100}


async def _timed_run(agent: CompiledStateGraph, expected_calls: int) -> int:
    global calls
    calls = 0
    start = time.perf_counter_ns()
    result = await agent.ainvoke(_input(), CONFIG)
    elapsed = time.perf_counter_ns() - start
    assert result["messages"][-1].content == "done", result["messages"][-1]
    assert calls == expected_calls, calls
    return elapsed


async def s1(steps: int = 20, *, sync_tool: bool = True) -> float:
    agent = _agent(_loop_script(steps), add if sync_tool else add_async, "add")
    return await _timed_run(agent, steps) / steps / 1000


async def s2() -> float:
    def answer(messages: list[BaseMessage]) -> AIMessage:
        if len(messages) == 1:
            return AIMessage("", tool_calls=[_call("wait", f"c{i}", ms=50, n=i) for i in range(5)])
        return AIMessage("done")

    return await _timed_run(_agent(answer, wait, "wait"), 5) / 1e6


async def s3(n: int = 1000) -> float:
    global calls
    calls = 0
    agent = _agent(_loop_script(3), add_async, "add")
    start = time.perf_counter_ns()
    results = await asyncio.gather(*(agent.ainvoke(_input(), CONFIG) for _ in range(n)))
    elapsed = time.perf_counter_ns() - start
    assert all(r["messages"][-1].content == "done" for r in results)
    assert calls == 3 * n, calls
    return elapsed / 1e9
