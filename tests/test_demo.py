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

from handrail import Approve, ContextStore, ModelRetry, Reject, ToolContext
from handrail.demo import CUSTOMER_MESSAGE, Desk, build_scenario
from handrail.demo.__main__ import main
from handrail.demo.support_desk import CUSTOMER_MESSAGES, lookup_order, refund_order, refund_policy


async def play() -> tuple[Any, list[Any], Any]:
    """The refund message alone (a fresh session): routed to `action`, it stops at the card."""
    scenario = build_scenario()
    run = scenario.submit(CUSTOMER_MESSAGE)
    events = [e async for e in run]
    return scenario, events, run.result


def squeezed(events: list[Any]) -> list[str]:
    """Event types in order, a run of text deltas counted once."""
    return [kind for kind, _ in itertools.groupby(e.type for e in events)]


async def test_each_message_takes_the_route_the_supervisor_chose():
    scenario = build_scenario()
    routes, replies = [], []
    for message in CUSTOMER_MESSAGES[:2]:
        events = [e async for e in scenario.submit(message)]
        routes.append(next(e.output["route"] for e in events if e.type == "agent-completed"))
        replies.append(events[-1].output)
        assert next(e.agent for e in events if e.type == "agent-started") == "supervisor"
    assert routes == ["simple", "search"]
    assert replies[0].startswith("Yes: items that arrive damaged are refunded in full")
    assert replies[1] == "Your order A1042 (€84.00) was delivered on 18 November. Anything else?"
    state = await scenario.engine.session(scenario.session_id)
    visible = [m.text for m in state.messages if m.role == "assistant" and not m.scratch]
    assert visible == replies  # the supervisor's decisions stayed in its scratch
    # ... and, once their turn is over, are kept in the history for people (never models).
    # Each in its turn: after the person's message, before the reply.
    kept = [(m.agent, m.text) for m in state.messages if m.scratch and m.role == "assistant"]
    assert kept == [
        ("supervisor", '{"route": "simple", "reason": "a policy question", "hints": {}}'),
        ("supervisor", '{"route": "search", "reason": "an order must be looked up", "hints": {}}'),
        ("executor", ""),  # its lookup
        ("executor", "Order A1042 (€84.00): delivered on 18 November 2026."),
    ]
    assert [(m.role, m.scratch) for m in state.messages] == [
        ("user", False),
        ("assistant", True),
        ("assistant", False),
        ("user", False),
        ("assistant", True),
        ("assistant", True),
        ("assistant", True),
        ("user", False),  # the executor's handoff
        ("assistant", False),
    ]


async def test_the_refund_looks_up_in_parallel_then_suspends_on_the_card():
    scenario, events, result = await play()
    agents = [e.agent for e in events if e.type == "agent-started"]
    assert agents == ["supervisor", "executor"]
    executor = events[[e.type for e in events].index("agent-started", 2) :]
    assert squeezed(executor) == [
        "agent-started",
        "usage",
        "tool-call-started",  # orders.lookup and policy.refunds: both start ...
        "tool-call-completed",  # ... before either completes
        "text-delta",
        "usage",
        "approval-required",  # the refund starts only once approved
        "run-suspended",
    ]
    completed = [e for e in events if e.type == "tool-call-completed"]
    digests = {e.name: e.digest for e in completed}
    assert digests == {
        "orders.lookup": {"order": "A1042", "status": "delivered", "total": "€84.00"},
        "policy.refunds": {"reason": "damaged", "refund": "full", "window": "30 days"},
    }
    (approval,) = [e for e in events if e.type == "approval-required"]
    assert approval.name == "orders.refund"
    assert approval.args == {"order_id": "A1042", "amount": 84.0, "reason": "damaged on arrival"}
    assert approval.amendable == ["amount"]
    assert approval.prompt == "Refund this order?"
    assert events[-1].pending == [approval.tool_call_id] == result.pending
    assert result.outcome == "suspended"
    assert scenario.desk.refunds == []


@pytest.mark.parametrize(
    ("decision", "refunds", "reply"),
    [
        (
            Approve(amended_args={"amount": 40}),
            ["€40.00"],
            "Good news, Dana: your refund R0001 of €40.00 has been approved",
        ),
        (Approve(), ["€84.00"], "your refund R0001 of €84.00"),
        (
            Reject(reason="we need photos first"),
            [],
            "did not approve the refund this time (we need photos first)",
        ),
    ],
)
async def test_the_refund_runs_as_decided_when_the_turn_resumes(
    decision: Any, refunds: list[str], reply: str
):
    scenario, _, _ = await play()
    calls_before = len(scenario.model.calls)
    resolution = await scenario.resolve(decision)
    assert resolution.ready
    run = scenario.resume()
    events = [e async for e in run]
    assert events[-1].type == "run-completed"
    assert reply in events[-1].output
    assert [r["amount"] for r in scenario.desk.refunds] == refunds
    # The decided call was not re-decided: the executor's note, then the responder's reply.
    assert len(scenario.model.calls) == calls_before + 2
    messages = [m for m in run.result.state.messages if not m.scratch]  # the conversation
    assert [m.role for m in messages] == ["user", "user", "assistant"]  # handoff, reply
    assert messages[1].parts[0].synthetic
    # The turn's scratch is kept in the history where it happened, once the turn is over.
    history = run.result.state.messages
    assert [(m.agent or m.role, m.scratch) for m in history] == [
        ("user", False),
        ("supervisor", True),
        ("user", True),  # the supervisor's note for the executor
        ("executor", True),  # its lookups
        ("executor", True),  # the refund it proposed
        ("executor", True),  # its note
        ("user", False),  # the handoff
        ("responder", False),
    ]


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


def run_demo(*args: str, db: Any) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS")
    }
    return subprocess.run(
        [sys.executable, "-m", "handrail.demo", "--db", str(db), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        encoding="utf-8",
        env={**env, "PYTHONIOENCODING": "utf-8", "COLUMNS": "200"},
        timeout=30,
    )


def test_python_m_handrail_demo_runs_offline_and_rejects_when_nobody_can_answer(tmp_path: Any):
    done = run_demo(db=tmp_path / "demo.db")
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
    assert "standard input is not a terminal, so the refund is rejected by default" in out
    assert "✗ orders.refund → rejected by the demo: nobody was there to approve it" in out
    assert "refunds made  0" in out
    assert "is saved in" in out and (tmp_path / "demo.db").exists()
    assert "\x1b[" not in out  # no colours or cursor moves in a pipe
    # Then policy questions, answered from the shop's documents (Markdown and PDF):
    assert "Ingested refunds.md and shipping.pdf" in out
    assert "costs 12.50 euros" in out and "(Source: shipping.pdf, page 1.)" in out
    assert "✓ documents.answer → confidence 0.69 · sources shipping.pdf p. 1" in out
    assert "documents.answer asks a person" in out  # one they cannot answer
    assert "Your colleague Ana answered (played by the demo)." in out
    assert "(My colleague Ana answered this.)" in out
    assert "(Source: a note from Ana.)" in out  # the next time, the note answers


def test_yes_approves_and_the_refund_is_made(tmp_path: Any):
    done = run_demo("--yes", db=tmp_path / "demo.db")
    assert done.returncode == 0, done.stderr
    assert "--yes: approved as proposed." in done.stdout
    assert "✓ orders.refund → refund R0001 · order A1042 · amount €84.00" in done.stdout
    assert "refunds made  1" in done.stdout


@pytest.mark.parametrize(
    ("answers", "said", "made"),
    [
        (["40"], "You approved the refund, amended to €40.00.", "amount €40.00"),
        (["what?", "y"], "You approved the refund as proposed.", "amount €84.00"),
        (["n", "need photos"], "You rejected the refund.", "(need photos)"),
    ],
)
def test_the_person_at_the_terminal_decides(
    tmp_path: Any, answers: list[str], said: str, made: str
):
    asked: list[str] = []
    replies = iter(answers)

    def ask(question: str) -> str:
        asked.append(question)
        return next(replies, "")  # then Enter at the policy question: Ana's answer

    buffer = io.StringIO()
    console = Console(file=buffer, width=100, color_system=None)
    assert main(["--db", str(tmp_path / "d.db")], console=console, ask=ask) == 0
    assert asked[0].startswith("Approve the refund of €84.00?")
    out = buffer.getvalue()
    assert said in out
    assert made in out


def test_a_model_that_cannot_be_used_is_a_usage_error_naming_the_fix(
    capsys: pytest.CaptureFixture[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
):
    done = run_demo("--model", "x", db=tmp_path / "demo.db")
    assert (done.returncode, done.stdout) == (2, "")
    assert "--model x: Model 'x': write it as provider:model" in done.stderr
    assert main(["--model", "acme:big"]) == 2  # the same, in process
    out, err = capsys.readouterr()
    assert out == ""
    assert "unknown provider 'acme'; known providers: openai, anthropic, openai-compatible" in err
    assert 'pip install "handrail[openai]"' in err

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main(["--model", "openai:gpt-4o-mini"]) == 2
    _, err = capsys.readouterr()
    assert "set the environment variable OPENAI_API_KEY" in err


@pytest.mark.parametrize("interactive", [False, True])
def test_the_demo_draws_the_same_story_live_or_line_by_line(interactive: bool, tmp_path: Any):
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=100,
        force_terminal=interactive,
        force_interactive=interactive,
        color_system=None,
    )
    assert main(["--db", str(tmp_path / "d.db"), "--yes"], console=console) == 0
    out = buffer.getvalue()
    assert "✓ policy.refunds → reason damaged · refund full · window 30 days" in out
    assert "↳ route simple: a policy question" in out
    assert "↳ route search: an order must be looked up" in out
    assert "↳ route action: a refund must be proposed" in out
    assert "executor (note for the team)" in out
    assert "⏸ orders.refund → waiting for approval" in out
    assert "✓ orders.refund → refund R0001 · order A1042 · amount €84.00" in out
    assert "tool calls    4 (1 asked for approval)" in out
    assert "session       8 messages" in out
