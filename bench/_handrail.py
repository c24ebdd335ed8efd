"""handrail's side of the benchmarks: the same scenarios as the peers, on FunctionModel."""

from __future__ import annotations

import asyncio
import time

from handrail import Agent, Runtime, tool
from handrail.models import ModelRequest
from handrail.testing import FunctionModel, Step, call

NAME = "handrail"


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool(name="add")
async def add_async(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
async def wait(ms: int, n: int) -> int:
    """Sleep a while (`n` tells the calls apart: identical calls would be deduplicated)."""
    await asyncio.sleep(ms / 1000)
    return ms


def _loop_model(steps: int) -> FunctionModel:
    """Calls `add` once per model turn, `steps` times, then answers."""

    def answer(request: ModelRequest) -> Step:
        done = sum(1 for m in request.messages if m.role == "assistant")
        return call("add", a=1, b=done) if done < steps else "done"

    return FunctionModel(answer)


async def s1(steps: int = 20, *, sync_tool: bool = True) -> float:
    agent = Agent("bench", tools=[add if sync_tool else add_async], max_iterations=steps + 1)
    runtime = Runtime(model=_loop_model(steps))
    start = time.perf_counter_ns()
    result = await agent.run("go", runtime=runtime)
    elapsed = time.perf_counter_ns() - start
    assert result.state.usage.tool_calls == steps, result.state.usage
    return elapsed / steps / 1000


async def s2() -> float:
    def answer(request: ModelRequest) -> Step:
        if len(request.messages) == 1:
            return [call("wait", ms=50, n=i) for i in range(5)]
        return "done"

    agent = Agent("bench", tools=[wait])
    start = time.perf_counter_ns()
    result = await agent.run("go", runtime=Runtime(model=FunctionModel(answer)))
    elapsed = time.perf_counter_ns() - start
    assert result.state.usage.tool_calls == 5
    return elapsed / 1e6


async def s3(n: int = 1000) -> float:
    agent = Agent("bench", tools=[add_async])
    runtime = Runtime(model=_loop_model(3))
    start = time.perf_counter_ns()
    results = await asyncio.gather(*(agent.run("go", runtime=runtime) for _ in range(n)))
    elapsed = time.perf_counter_ns() - start
    assert all(r.state.usage.tool_calls == 3 for r in results)
    return elapsed / 1e9
