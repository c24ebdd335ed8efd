"""A repeated read never blocks the next action (issue 34, item 5), through the public API.

A response whose calls were all reused gets their results, marked as reused, and the model
goes on acting; only `Runtime.max_reused_responses` such responses in a row make the next
request ask for an answer without tools.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from handrail import (
    Agent,
    ConfigError,
    Engine,
    RunState,
    Runtime,
    ToolCallPart,
    temp_id,
    tool,
)
from handrail.models import ModelRequest
from handrail.store import MemoryStore
from handrail.testing import FunctionModel, ScriptedModel, call, sequential_ids

RAN: list[tuple[str, str]] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


@tool(name="orders.get")
def get_order(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    RAN.append(("orders.get", order_id))
    return {"order_id": order_id, "status": "pending"}


@tool(name="users.get")
def get_user(user_id: str) -> dict[str, Any]:
    """Look a user up."""
    RAN.append(("users.get", user_id))
    return {"user_id": user_id}


@tool(name="orders.cancel", permission="write", approval="auto")
def cancel_order(order_id: str) -> dict[str, Any]:
    """Cancel an order (no approval needed)."""
    RAN.append(("orders.cancel", order_id))
    return {"cancelled": order_id}


@tool(
    name="orders.refund",
    permission="write",
    mint=lambda args, i: {"refunded": args["order_id"], "ref": temp_id(i)},
)
def refund_order(order_id: str) -> dict[str, Any]:
    """Refund an order (gated: captured in a headless run)."""
    RAN.append(("orders.refund", order_id))
    return {"refunded": order_id}


TOOLS = [get_order, get_user, cancel_order, refund_order]
READ_READ_WRITE: list[Any] = [
    [call("orders.get", order_id="A1")],
    [call("orders.get", order_id="A1")],  # the same read again: reused
    [call("orders.cancel", order_id="A1")],
    "Cancelled A1.",
]


def parts(messages: list[Any]) -> list[ToolCallPart]:
    return [p for m in messages for p in m.tool_calls]


def refused(calls: list[ToolCallPart]) -> list[ToolCallPart]:
    return [p for p in calls if p.result is not None and "Not run" in (p.result.error or "")]


async def test_a_repeated_read_then_a_write_runs_the_write_live() -> None:
    model = ScriptedModel(list(READ_READ_WRITE))
    run = Agent("clerk", tools=TOOLS).run_stream(
        "Cancel A1", runtime=Runtime(model=model, ids=sequential_ids())
    )
    events = [e async for e in run]
    model.assert_complete()

    assert RAN == [("orders.get", "A1"), ("orders.cancel", "A1")]  # the write ran
    assert [r.tool_choice for r in model.calls] == ["auto"] * 4
    calls = parts(run.result.state.messages)
    assert [(p.name, p.status, p.reused_from) for p in calls] == [
        ("orders.get", "completed", None),
        ("orders.get", "completed", calls[0].id),
        ("orders.cancel", "completed", None),
    ]
    assert calls[1].result == calls[0].result
    assert refused(calls) == []
    completed = [e for e in events if e.type == "tool-call-completed"]
    assert [e.reused_from for e in completed] == [None, calls[0].id, None]
    assert run.result.output == "Cancelled A1."


async def test_a_repeated_read_then_a_gated_write_is_captured_headless_and_stored_marked() -> None:
    store = MemoryStore()
    model = ScriptedModel(
        [
            [call("orders.get", order_id="A1")],
            [call("orders.get", order_id="A1")],
            [call("orders.refund", order_id="A1")],
            "Refunded A1.",
        ]
    )
    engine = Engine(Agent("clerk", tools=TOOLS, model=model), store=store)
    result = await engine.run_headless("s1", "Refund A1")

    model.assert_complete()
    assert result.outcome == "completed" and result.text == "Refunded A1."
    assert [(a.tool, a.args, a.status) for a in result.actions] == [
        ("orders.refund", {"order_id": "A1"}, "captured")
    ]
    assert RAN == [("orders.get", "A1")]  # the read ran once; the write was captured
    assert [r.tool_choice for r in model.calls] == ["auto"] * 4
    # The stored history and the events both show which call was reused.
    calls = parts((await engine.session("s1")).messages)
    assert [p.reused_from for p in calls] == [None, calls[0].id, None]
    assert refused(calls) == []
    completed = [e for e in result.events if e.type == "tool-call-completed"]
    assert [e.reused_from for e in completed] == [None, calls[0].id, None]


async def test_a_function_model_sees_the_reused_result_and_goes_on_to_write() -> None:
    seen: list[ModelRequest] = []
    shown: list[list[ToolCallPart]] = []  # the calls each request showed, as they were then

    def respond(request: ModelRequest) -> Any:
        seen.append(request)
        shown.append([copy.copy(p) for p in parts(request.messages)])
        return READ_READ_WRITE[len(seen) - 1]

    result = await Agent("clerk", tools=TOOLS).run(
        "Cancel A1", runtime=Runtime(model=FunctionModel(respond), ids=sequential_ids())
    )
    assert RAN == [("orders.get", "A1"), ("orders.cancel", "A1")]
    assert [r.tool_choice for r in seen] == ["auto"] * 4
    first, again = shown[2]  # what the model had when it wrote
    assert (again.reused_from, again.result) == (first.id, first.result)
    assert result.output == "Cancelled A1."


async def test_parallel_calls_some_reused_some_new_keep_acting() -> None:
    model = ScriptedModel(
        [
            [call("orders.get", order_id="A1")],
            [call("orders.get", order_id="A1"), call("users.get", user_id="U1")],
            [call("orders.get", order_id="A1"), call("users.get", user_id="U1")],
            [call("orders.cancel", order_id="A1")],
            "Done.",
        ]
    )
    result = await Agent("clerk", tools=TOOLS).run(
        "go", runtime=Runtime(model=model, ids=sequential_ids(), max_reused_responses=1)
    )
    model.assert_complete()
    # A mixed response is not a repetition; the next, all reused, is the first of a streak,
    # and with a limit of one it asks for the answer: the write is then refused, said so.
    assert [r.tool_choice for r in model.calls] == ["auto", "auto", "auto", "none", "none"]
    calls = parts(result.state.messages)
    assert [p.reused_from is not None for p in calls] == [False, True, False, True, True, False]
    assert RAN == [("orders.get", "A1"), ("users.get", "U1")]
    assert [p.id for p in refused(calls)] == [calls[-1].id]


async def test_mixed_responses_never_count_towards_the_limit() -> None:
    steps: list[Any] = [[call("orders.get", order_id="A1")]]
    for n in range(4):  # each response repeats the read and adds a new one
        steps.append([call("orders.get", order_id="A1"), call("users.get", user_id=f"U{n}")])
    steps += [[call("orders.cancel", order_id="A1")], "Done."]
    model = ScriptedModel(steps)
    result = await Agent("clerk", tools=TOOLS).run(
        "go", runtime=Runtime(model=model, max_reused_responses=1)
    )
    assert {r.tool_choice for r in model.calls} == {"auto"}
    assert ("orders.cancel", "A1") in RAN
    assert refused(parts(result.state.messages)) == []


async def test_a_failed_read_is_not_reused_its_repeat_runs_again() -> None:
    attempts: list[str] = []

    @tool(name="orders.flaky")
    def flaky(order_id: str) -> str:
        """Look an order up (fails the first time)."""
        attempts.append(order_id)
        if len(attempts) == 1:
            raise RuntimeError("timeout")
        return "found"

    model = ScriptedModel(
        [
            [call("orders.flaky", order_id="A1")],
            [call("orders.flaky", order_id="A1")],
            [call("orders.flaky", order_id="A1")],  # now a repeat of a success: reused
            "ok",
        ]
    )
    result = await Agent("a", tools=[flaky]).run(
        "go", runtime=Runtime(model=model, max_reused_responses=1)
    )
    assert attempts == ["A1", "A1"]
    calls = parts(result.state.messages)
    assert [(p.status, p.reused_from) for p in calls] == [
        ("failed", None),
        ("completed", None),
        ("completed", calls[1].id),
    ]
    assert [r.tool_choice for r in model.calls] == ["auto", "auto", "auto", "none"]


@pytest.mark.parametrize("limit", [1, 2, 3])
async def test_limit_responses_in_a_row_all_reused_ask_for_an_answer_without_tools(
    limit: int,
) -> None:
    steps: list[Any] = [[call("orders.get", order_id="A1")]]
    steps += [[call("orders.get", order_id="A1")] for _ in range(limit)]
    steps += [[call("orders.cancel", order_id="A1")], "A1 is pending."]
    model = ScriptedModel(steps)
    run = Agent("clerk", tools=TOOLS).run_stream(
        "go", runtime=Runtime(model=model, ids=sequential_ids(), max_reused_responses=limit)
    )
    events = [e async for e in run]
    model.assert_complete()

    assert [r.tool_choice for r in model.calls] == ["auto"] * (limit + 1) + ["none", "none"]
    assert RAN == [("orders.get", "A1")]  # the write came when tools were refused
    calls = parts(run.result.state.messages)
    (write,) = refused(calls)
    assert write.name == "orders.cancel" and write.status == "failed"
    assert write.result is not None and write.result.error == (
        "Not run: this request asked for an answer without tool calls, because "
        f"{limit} of your responses in a row only repeated calls already made this turn "
        "(their results are above, marked as reused). Answer with what you have."
    )
    assert write.id not in [e.tool_call_id for e in events if e.type == "tool-call-started"]
    assert run.result.output == "A1 is pending."


async def test_the_default_limit_is_three() -> None:
    assert Runtime().max_reused_responses == 3
    steps: list[Any] = [[call("orders.get", order_id="A1")]] * 3
    steps += [[call("orders.cancel", order_id="A1")], "Done."]
    model = ScriptedModel(steps)
    result = await Agent("clerk", tools=TOOLS).run("go", runtime=Runtime(model=model))
    assert RAN[-1] == ("orders.cancel", "A1")  # two repeats in a row: still acting
    assert refused(parts(result.state.messages)) == []


async def test_no_limit_never_asks_for_an_answer_without_tools() -> None:
    steps: list[Any] = [[call("orders.get", order_id="A1")]] * 6 + ["Done."]
    model = ScriptedModel(steps)
    await Agent("clerk", tools=TOOLS).run(
        "go", runtime=Runtime(model=model, max_reused_responses=None)
    )
    assert {r.tool_choice for r in model.calls} == {"auto"}
    assert RAN == [("orders.get", "A1")]


def test_the_limit_must_be_at_least_one() -> None:
    with pytest.raises(ConfigError, match="max_reused_responses"):
        Runtime(max_reused_responses=0)


async def test_a_write_between_repeats_ends_reuse_and_the_streak() -> None:
    state = RunState()
    model = ScriptedModel(
        [
            [call("orders.get", order_id="A1")],
            [call("orders.get", order_id="A1")],  # reused: a streak of one
            [call("orders.cancel", order_id="A1")],
            [call("orders.get", order_id="A1")],  # after a write: runs again
            [call("orders.get", order_id="A1")],  # reused: a streak of one again
            "Done.",
        ]
    )
    await Agent("clerk", tools=TOOLS).run(
        "go", state=state, runtime=Runtime(model=model, max_reused_responses=2)
    )
    assert {r.tool_choice for r in model.calls} == {"auto"}
    assert RAN == [("orders.get", "A1"), ("orders.cancel", "A1"), ("orders.get", "A1")]


async def test_a_repeated_read_then_a_gated_write_waits_for_approval_live() -> None:
    model = ScriptedModel(
        [
            [call("orders.get", order_id="A1")],
            [call("orders.get", order_id="A1")],
            [call("orders.refund", order_id="A1")],
        ]
    )
    result = await Agent("clerk", tools=TOOLS).run(
        "Refund A1", runtime=Runtime(model=model, ids=sequential_ids())
    )
    model.assert_complete()
    calls = parts(result.state.messages)
    assert result.outcome == "suspended"
    assert result.pending == [calls[-1].id]  # the refund has its card, as any gated call
    assert (calls[-1].name, calls[-1].status) == ("orders.refund", "waiting")
    assert refused(calls) == []
