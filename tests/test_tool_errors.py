"""Typed tool errors: every failure handrail produces carries its code, end to end."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, get_args

import pytest

from handrail import (
    Agent,
    Engine,
    ModelResponse,
    ModelRetry,
    Reject,
    RunState,
    Runtime,
    ToolCallPart,
    ToolErrorCode,
    ToolResult,
    tool,
)
from handrail.store import MemoryStore
from handrail.store.sqlite import SqliteStore
from handrail.testing import FunctionModel, ScriptedModel, call, sequential_ids


@tool
def lookup(order_id: str) -> dict[str, str]:
    """Look an order up."""
    return {"id": order_id, "status": "shipped"}


@tool(name="orders.refund", permission="write")
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    return f"refunded {amount}"


@tool(executor="client")
def open_tab(url: str) -> str:
    """Open a tab in the user's browser."""
    raise AssertionError("a client tool never runs here")


@tool
def broken(order_id: str) -> str:
    """Always raises."""
    raise RuntimeError("the database is down")


@tool(timeout=0.01)
async def slow(order_id: str) -> str:
    """Never finishes in time."""
    await asyncio.Event().wait()
    return "never"


@tool
def reserve(sku: str) -> str:
    """Reserve an item."""
    raise ModelRetry(f"{sku} is out of stock", code="out_of_stock")


@tool
def cancel(order_id: str) -> ToolResult:
    """Cancel an order."""
    return ToolResult.failure(f"{order_id} has shipped already", code="already_shipped")


TOOLS = [lookup, refund, open_tab, broken, slow, reserve, cancel]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def engine_for(steps: list[Any], store: Any = None, **runtime: Any) -> Engine:
    runtime.setdefault("clock", Clock())
    rt = Runtime(model=ScriptedModel(steps), ids=sequential_ids(), **runtime)
    return Engine(Agent("support", tools=TOOLS), store=store or MemoryStore(), runtime=rt)


def failed(state: RunState) -> list[ToolCallPart]:
    return [
        p for m in state.messages for p in m.tool_calls if p.result is not None and not p.result.ok
    ]


async def one_turn(steps: list[Any], **runtime: Any) -> tuple[list[Any], RunState]:
    engine = engine_for(steps, **runtime)
    events = [e async for e in engine.submit("s1", "go")]
    return events, await engine.session("s1")


def cut(*parts: Any) -> ModelResponse:
    return ModelResponse(parts=list(parts), finish_reason="length", stop_reason="max_tokens")


# One case per code: the model's steps, the runtime, and the code of the failed call.
RUN_CASES: dict[str, tuple[list[Any], dict[str, Any]]] = {
    "unknown_tool": ([[call("orders.delete", order_id="A1")], "ok"], {}),
    "invalid_arguments": ([[call("lookup", order="A1")], "ok"], {}),
    "permission_denied": (
        [[call("orders.refund", order_id="A1", amount=5)], "ok"],
        {"allowed_permissions": frozenset({"read"})},
    ),
    "policy_denied": (
        [
            [
                call("orders.refund", order_id="A1", amount=5),
                call("orders.refund", order_id="A2", amount=5),
            ]
        ],
        {"max_approvals_per_turn": 1},
    ),
    "not_available": ([[call("open_tab", url="https://x")], "ok"], {}),
    "timed_out": ([[call("slow", order_id="A1")], "ok"], {}),
    "tool_error": ([[call("broken", order_id="A1")], "ok"], {}),
    "tools_not_allowed": (
        [
            [call("lookup", order_id="A1")],
            [call("lookup", order_id="A1")],  # reused: at 1, the next request asks for no tools
            [call("broken", order_id="A1")],
            "ok",
        ],
        {"max_reused_responses": 1},
    ),
    "incomplete_response": (
        [cut(ToolCallPart(id="c1", name="lookup", raw_args='{"order_id": "A1"}')), "ok"],
        {},
    ),
    "out_of_stock": ([[call("reserve", sku="S1")], "ok"], {}),
    "already_shipped": ([[call("cancel", order_id="A1")], "ok"], {}),
}


@pytest.mark.parametrize("code", list(RUN_CASES))
async def test_each_failure_of_a_run_carries_its_code_in_the_event_and_the_history(code: str):
    steps, runtime = RUN_CASES[code]
    events, state = await one_turn(steps, **runtime)
    parts = failed(state)
    assert [p.result.code for p in parts][-1:] == [code]  # type: ignore[union-attr]
    finished = [e for e in events if e.type == "tool-call-completed" and not e.ok]
    assert finished[-1].code == code
    assert finished[-1].summary  # always a line to show
    assert "\n" not in finished[-1].summary


async def test_a_rejected_call_and_an_expired_one_carry_rejected_and_expired():
    clock = Clock()
    steps = [
        [call("orders.refund", order_id="A1", amount=5)],
        "not refunded",
        [call("orders.refund", order_id="A2", amount=5)],
        "still waiting",
    ]
    engine = engine_for(steps, clock=clock, pending_ttl=60)
    assert [e async for e in engine.submit("s1", "go")][-1].type == "run-suspended"
    await engine.resolve("s1", "call_1", Reject(reason="no", by="ana"))
    rejected = [e async for e in engine.resume("s1")]
    assert [e.code for e in rejected if e.type == "tool-call-completed"] == ["rejected"]

    assert [e async for e in engine.submit("s1", "again")][-1].type == "run-suspended"
    clock.now += 61
    assert await engine.expire_due() == ["s1"]
    expired = [e async for e in engine.resume("s1")]
    assert [e.code for e in expired if e.type == "tool-call-completed"] == ["expired"]
    state = await engine.session("s1")
    assert [p.result.code for p in failed(state)] == ["rejected", "expired"]  # type: ignore[union-attr]


async def test_an_interrupted_call_carries_interrupted():
    started = asyncio.Event()

    @tool
    async def forever() -> str:
        """Never returns."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    run = Agent("a", tools=[forever]).run_stream(
        "go", runtime=Runtime(model=ScriptedModel([[call("forever")]]))
    )

    async def interrupt_when_started() -> None:
        await started.wait()
        run.interrupt()

    interrupter = asyncio.create_task(interrupt_when_started())
    events = [e async for e in run]
    await interrupter
    assert events[-1].type == "run-failed"
    (part,) = run.result.state.messages[-1].tool_calls
    assert part.result is not None and part.result.code == "interrupted"


def test_the_documented_codes_are_every_one_handrail_produces():
    produced = {c for c in RUN_CASES if c not in ("out_of_stock", "already_shipped")}
    produced |= {"rejected", "expired", "interrupted", "pending"}
    assert set(get_args(ToolErrorCode)) == produced


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_codes_survive_a_save_and_load_and_old_results_without_one_load(
    kind: str, tmp_path: Path
):
    store: Any = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "s.db")
    engine = engine_for([[call("lookup", order="A1")], "ok"], store=store)
    _ = [e async for e in engine.submit("s1", "go")]
    reopened = engine_for([], store=store)
    (part,) = failed(await reopened.session("s1"))
    assert part.result is not None and part.result.code == "invalid_arguments"

    old = RunState.load(
        {
            **(await reopened.session("s1")).dump(),
        }
    ).dump()
    for message in old["messages"]:
        for p in message["parts"]:
            if p.get("result"):
                p["result"].pop("code", None)  # stored before codes existed
    (loaded,) = failed(RunState.load(old))
    assert loaded.result is not None and loaded.result.code is None
    assert loaded.result.error is not None
    if kind == "sqlite":
        await store.close()


async def test_a_tool_s_own_failed_result_without_a_code_gets_tool_error_and_a_summary():
    @tool
    def check(order_id: str) -> ToolResult:
        """Check an order."""
        return ToolResult(ok=False, error=f"{order_id}: no such order\n(trace follows)")

    model = FunctionModel(
        lambda r: [call("check", order_id="A9")] if r.messages[-1].role == "user" else "done"
    )
    run = Agent("a", tools=[check]).run_stream("go", runtime=Runtime(model=model))
    events = [e async for e in run]
    (done,) = [e for e in events if e.type == "tool-call-completed"]
    assert (done.code, done.summary) == ("tool_error", "A9: no such order")
    (part,) = [p for m in run.result.state.messages for p in m.tool_calls]
    assert part.result is not None and part.result.summary == "A9: no such order"


async def test_a_successful_result_without_a_summary_is_shown_with_a_derived_one():
    events, state = await one_turn([[call("lookup", order_id="A1")], "ok"])
    (done,) = [e for e in events if e.type == "tool-call-completed"]
    assert (done.ok, done.code, done.summary) == (True, None, '{"id":"A1","status":"shipped"}')
    (part,) = [p for m in state.messages for p in m.tool_calls]
    # the same line is stored with the history, where the page and a later reader find it
    assert part.result is not None and part.result.summary == done.summary
