"""The support-desk demo: the scenario through the public API, and `python -m handrail.demo`."""

from __future__ import annotations

import io
import itertools
import os
import subprocess
import sys
from typing import Any

import pytest
from rich.console import Console

from handrail import ContextStore, ModelRetry, ToolContext
from handrail.demo import CUSTOMER_MESSAGE, Desk, build_scenario
from handrail.demo.__main__ import main
from handrail.demo.support_desk import lookup_order, refund_order, refund_policy


async def play() -> tuple[Any, list[Any], Any]:
    scenario = build_scenario()
    run = scenario.run_stream()
    events = [e async for e in run]
    return scenario, events, run.result


def squeezed(events: list[Any]) -> list[str]:
    """Event types in order, a run of text deltas counted once."""
    return [kind for kind, _ in itertools.groupby(e.type for e in events)]


async def test_the_scenario_looks_up_in_parallel_streams_then_suspends_on_the_refund():
    scenario, events, result = await play()
    assert squeezed(events) == [
        "run-started",
        "agent-started",
        "usage",
        "tool-call-started",  # orders.lookup and policy.refunds: both start ...
        "tool-call-completed",  # ... before either completes
        "text-delta",
        "usage",
        "tool-call-started",
        "approval-required",
        "run-suspended",
    ]
    started = [e for e in events if e.type == "tool-call-started"]
    completed = [e for e in events if e.type == "tool-call-completed"]
    assert [e.name for e in started] == ["orders.lookup", "policy.refunds", "orders.refund"]
    assert sorted(e.name for e in completed) == ["orders.lookup", "policy.refunds"]
    assert all(e.ok for e in completed)
    digests = {e.name: e.digest for e in completed}
    assert digests == {
        "orders.lookup": {"order": "A1042", "status": "delivered", "total": "€84.00"},
        "policy.refunds": {"reason": "damaged", "refund": "full", "window": "30 days"},
    }
    reply = "".join(e.delta for e in events if e.type == "text-delta")
    assert reply.startswith("I'm sorry your order arrived damaged")

    (approval,) = [e for e in events if e.type == "approval-required"]
    assert approval.name == "orders.refund"
    assert approval.args == {"order_id": "A1042", "amount": 84.0, "reason": "damaged on arrival"}
    assert approval.amendable == ["amount"]
    assert approval.prompt == "Refund this order?"
    assert events[-1].pending == [approval.tool_call_id] == result.pending

    assert result.outcome == "suspended"
    scenario.model.assert_complete()
    assert len(scenario.model.calls) == 2
    assert scenario.desk.refunds == []


async def test_both_lookups_are_one_model_turn():
    _, _, result = await play()
    user, lookups, reply = result.state.messages
    assert user.role == "user" and user.text == CUSTOMER_MESSAGE
    assert [c.name for c in lookups.tool_calls] == ["orders.lookup", "policy.refunds"]
    assert [c.status for c in lookups.tool_calls] == ["completed", "completed"]
    assert [c.name for c in reply.tool_calls] == ["orders.refund"]
    assert reply.tool_calls[0].status == "waiting"
    assert result.state.usage.requests == 2
    assert result.state.usage.tool_calls == 2


def context(desk: Desk) -> ToolContext[Desk]:
    return ToolContext(
        deps=desk,
        context=ContextStore(),
        agent="support",
        tool_name="test",
        tool_call_id="call_1",
        run_id="run_1",
    )


def test_the_tools_work_over_the_desk_database():
    desk = Desk()
    ctx = context(desk)
    assert lookup_order(ctx, order_id=" a1042 ")["status"] == "delivered"
    assert refund_policy(ctx, reason="changed-mind")["return_needed"] is True
    refund = refund_order(ctx, order_id="A1042", amount=20.5, reason="one cup chipped")
    assert refund == {
        "refund": "R0001",
        "order": "A1042",
        "amount": "€20.50",
        "reason": "one cup chipped",
    }
    assert desk.refunds == [refund]
    assert Desk().refunds == []  # every desk starts from a fresh copy


@pytest.mark.parametrize(
    ("order_id", "amount", "error"),
    [("Z9", 1.0, "There is no order 'Z9'"), ("A1042", 84.01, "at most its total, €84.00")],
)
def test_a_bad_refund_is_an_error_the_model_can_read(order_id: str, amount: float, error: str):
    desk = Desk()
    with pytest.raises(ModelRetry, match=error):
        refund_order(context(desk), order_id=order_id, amount=amount, reason="x")
    assert desk.refunds == []


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS")
    }
    return subprocess.run(
        [sys.executable, "-m", "handrail.demo", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        encoding="utf-8",
        env={**env, "PYTHONIOENCODING": "utf-8"},
        timeout=30,
    )


def test_python_m_handrail_demo_runs_offline_without_a_terminal():
    done = run_demo()
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    out = done.stdout
    assert "Model: SCRIPTED (offline, deterministic)" in out
    assert 'pip install "handrail[openai]"' in out
    assert "✓ orders.lookup → order A1042 · status delivered · total €84.00" in out
    assert "Approval required · orders.refund" in out
    assert "Refund this order?" in out
    assert "amendable fields: amount" in out
    assert "Run suspended" in out
    assert "\x1b[" not in out  # no colours or cursor moves in a pipe


def test_model_flag_is_refused_until_real_providers_exist(capsys: pytest.CaptureFixture[str]):
    done = run_demo("--model", "x")
    assert (done.returncode, done.stdout) == (2, "")
    assert "real model providers are not available in this version" in done.stderr
    assert main(["--model", "x"]) == 2  # the same, in process
    out, err = capsys.readouterr()
    assert out == ""
    assert "--model x: real model providers are not available in this version" in err
    assert 'pip install "handrail[openai]"' in err


@pytest.mark.parametrize("interactive", [False, True])
def test_the_demo_draws_the_same_story_live_or_line_by_line(interactive: bool):
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=100,
        force_terminal=interactive,
        force_interactive=interactive,
        color_system=None,
    )
    assert main([], console=console) == 0
    out = buffer.getvalue()
    assert "✓ policy.refunds → reason damaged · refund full · window 30 days" in out
    assert "colleague will approve it shortly." in out
    assert "⏸ orders.refund → waiting for approval" in out
    assert "tool calls    3 (2 ran, 1 waiting for approval)" in out
    assert "session       3 messages" in out
