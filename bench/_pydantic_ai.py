"""PydanticAI's side of the benchmarks: `Agent.run` driven by a scripted `FunctionModel`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from pydantic_ai import Agent, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

NAME = "pydantic-ai"
PACKAGE = "pydantic-ai-slim"

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


# A real model reports usage; without it FunctionModel estimates tokens over the whole history.
USAGE = RequestUsage(input_tokens=1, output_tokens=1)


def _response(*parts: TextPart | ToolCallPart) -> ModelResponse:
    return ModelResponse(parts=list(parts), usage=USAGE)


def _loop_model(steps: int) -> FunctionModel:
    """Calls `add` once per model turn, `steps` times, then answers.

    The function is async: FunctionModel runs a plain `def` in a worker thread.
    """

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(m, ModelResponse) for m in messages)
        if done < steps:
            return _response(ToolCallPart("add", {"a": 1, "b": done}, tool_call_id=f"c{done}"))
        return _response(TextPart("done"))

    return FunctionModel(answer)


async def _timed_run(agent: Agent[None, str], expected_calls: int) -> int:
    global calls
    calls = 0
    start = time.perf_counter_ns()
    result = await agent.run("go")
    elapsed = time.perf_counter_ns() - start
    assert result.output == "done", result.output
    assert calls == expected_calls, calls
    return elapsed


async def s1(steps: int = 20, *, sync_tool: bool = True) -> float:
    tool: Callable[..., object] = add if sync_tool else add_async
    agent = Agent(_loop_model(steps), tools=[Tool(tool, name="add")])
    return await _timed_run(agent, steps) / steps / 1000


async def s2() -> float:
    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return _response(
                *(ToolCallPart("wait", {"ms": 50, "n": i}, tool_call_id=f"c{i}") for i in range(5))
            )
        return _response(TextPart("done"))

    agent = Agent(FunctionModel(answer), tools=[wait])
    return await _timed_run(agent, 5) / 1e6


async def s3(n: int = 1000) -> float:
    global calls
    calls = 0
    agent = Agent(_loop_model(3), tools=[Tool(add_async, name="add")])
    start = time.perf_counter_ns()
    results = await asyncio.gather(*(agent.run("go") for _ in range(n)))
    elapsed = time.perf_counter_ns() - start
    assert all(r.output == "done" for r in results)
    assert calls == 3 * n, calls
    return elapsed / 1e9
