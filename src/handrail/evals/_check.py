"""Checking what a scenario did against what it expects.

The runner records a scenario's run as a `Transcript` (each turn's route, outcome and answer,
every tool call, approval and captured action); `check` compares it with the `Expect` and
returns the failures, always in the same order, each with a reason a person can act on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ._match import mismatch
from ._result import Failure
from ._suite import Expect, ProposalExpectation, ToolCallExpectation, ToolErrorExpectation

__all__ = ["Call", "Proposal", "ToolFailure", "Transcript", "TurnRecord", "check"]


@dataclass(kw_only=True, slots=True)
class TurnRecord:
    """One turn as it ran."""

    text: str
    """The user's message."""
    route: str | None = None
    """The route it took."""
    outcome: str = "failed"
    """How it ended."""
    answer: str = ""
    """The final text ('' when the turn did not finish)."""
    output: Any = None
    """The structured output, as JSON-compatible data (None for a text answer)."""
    error: str | None = None
    """Why the run failed, when it did."""


@dataclass(kw_only=True, slots=True)
class Call:
    """A tool call the model made (or an action it had captured)."""

    tool: str
    """The tool's name."""
    args: dict[str, Any] | None
    """The arguments (None when they did not parse)."""


@dataclass(kw_only=True, slots=True)
class Proposal:
    """A call that waited for a decision (an approval, a person's answer, a client)."""

    tool: str
    """The tool's name."""
    args: dict[str, Any] | None
    """The arguments as the model proposed them (None when they did not parse)."""
    decision: str = "undecided"
    """`approved`, `amended` (approved with amendments), `rejected`, `answered` or
    `undecided` (the scenario ended while it waited)."""
    tool_call_id: str = ""
    """The call's id."""


@dataclass(kw_only=True, slots=True)
class ToolFailure:
    """A tool call that failed (its result has `ok=False`)."""

    tool: str
    """The tool's name, as the model called it."""
    code: str | None
    """The result's code."""
    error: str | None
    """The error the model read."""


@dataclass(kw_only=True, slots=True)
class Transcript:
    """Everything a scenario's run did that an assertion can look at."""

    turns: list[TurnRecord] = field(default_factory=list)
    """The turns that ran."""
    calls: list[Call] = field(default_factory=list)
    """Every tool call that was made, in order: the ones that ran, and the waiting ones a
    person answered or a client ran (not the ones rejected, still waiting, or captured)."""
    proposals: list[Proposal] = field(default_factory=list)
    """Every call that waited for a decision, in the order they asked."""
    approvals: list[str] = field(default_factory=list)
    """The tools whose calls asked for approval, in order."""
    actions: list[Call] = field(default_factory=list)
    """The actions capture mode recorded, in order."""
    failures: list[ToolFailure] = field(default_factory=list)
    """The calls that failed, in order."""
    error: str | None = None
    """What stopped the scenario outside a run (a bad model, a turn after a suspension)."""


def check(
    expect: Expect, seen: Transcript, *, model_calls: int, tokens: int | None
) -> list[Failure]:
    """The assertions of `expect` that `seen` breaks, in a fixed order."""
    failures: list[Failure] = []

    def fail(assertion: str, reason: str) -> None:
        failures.append(Failure(assertion=assertion, reason=reason))

    if seen.error is not None:
        fail("run", seen.error)
    last = seen.turns[-1] if seen.turns else None
    if expect.outcome is not None:
        if last is None or last.outcome != expect.outcome:
            found = last.outcome if last else "no turn ran"
            why = f" ({last.error})" if last is not None and last.error else ""
            fail("outcome", f"expected {expect.outcome}, got {found}{why}")
    else:
        for number, turn in enumerate(seen.turns, 1):
            if turn.outcome in ("failed", "interrupted"):
                fail("outcome", f"turn {number} {turn.outcome}: {turn.error or 'no reason given'}")
    _routes(expect, seen, fail)
    for wanted in expect.called:
        if not any(_fits(wanted, c) is None for c in seen.calls):
            fail("called", _missing(wanted, seen.calls, "no call") + _unmade(wanted, seen))
    for unwanted in expect.not_called:
        hit = next((c for c in seen.calls if _fits(unwanted, c) is None), None)
        if hit is not None:
            fail("not_called", f"{hit.tool} was called with {_json(hit.args)}")
    for proposal in expect.proposed:
        _proposed(proposal, seen, fail)
    for failing in expect.tool_errors:
        _tool_error(failing, seen, fail)
    if expect.captured is not None:
        _captured(expect, seen, fail)
    if expect.approvals is not None and seen.approvals != expect.approvals:
        fail("approvals", f"expected {expect.approvals}, got {seen.approvals}")
    answer = last.answer if last is not None else ""
    for text in expect.text_contains:
        if text not in answer:
            fail("text_contains", f"{text!r} not in the final text {_quote(answer)}")
    if expect.text_matches is not None and not re.search(expect.text_matches, answer):
        fail("text_matches", f"/{expect.text_matches}/ does not match {_quote(answer)}")
    if "output" in expect.model_fields_set:
        output = last.output if last is not None else None
        if output != expect.output:
            fail("output", f"expected {_json(expect.output)}, got {_json(output)}")
    if expect.max_model_calls is not None and model_calls > expect.max_model_calls:
        fail("max_model_calls", f"{model_calls} model calls, more than {expect.max_model_calls}")
    if expect.max_tokens is not None:
        if tokens is None:
            fail("max_tokens", "the model reported no token usage, so it cannot be checked")
        elif tokens > expect.max_tokens:
            fail("max_tokens", f"{tokens} tokens, more than {expect.max_tokens}")
    return failures


def _routes(expect: Expect, seen: Transcript, fail: Any) -> None:
    wanted = expect.route
    if wanted is None:
        return
    taken = [t.route for t in seen.turns]
    if isinstance(wanted, str):
        if not taken or taken[-1] != wanted:
            fail("route", f"expected {wanted}, got {taken[-1] if taken else 'no turn'}")
    elif taken != wanted:
        fail("route", f"expected {wanted} (turn by turn), got {taken}")


def _captured(expect: Expect, seen: Transcript, fail: Any) -> None:
    assert expect.captured is not None
    actions = seen.actions
    count = expect.captured.count
    if count is not None and len(actions) != count:
        names = ", ".join(a.tool for a in actions) or "none"
        fail("captured", f"expected {count} action(s), captured {len(actions)} ({names})")
    position = 0
    for wanted in expect.captured.actions:
        found = next(
            (i for i in range(position, len(actions)) if _fits(wanted, actions[i]) is None), None
        )
        if found is None:
            fail("captured", _missing(wanted, actions[position:], "no captured action"))
            return
        position = found + 1


def _proposed(wanted: ProposalExpectation, seen: Transcript, fail: Any) -> None:
    asked = [Call(tool=p.tool, args=p.args) for p in seen.proposals]
    fitting = [p for p, c in zip(seen.proposals, asked, strict=True) if _fits(wanted, c) is None]
    if not fitting:
        fail("proposed", _missing(wanted, asked, "no waiting call"))
    elif wanted.decision is not None and all(p.decision != wanted.decision for p in fitting):
        fates = list(dict.fromkeys(p.decision for p in fitting))
        found = f"was {fates[0]}" if len(fates) == 1 else f"calls were {', '.join(fates)}"
        fail("proposed", f"{_label(wanted)} {found}, not {wanted.decision}")


def _tool_error(wanted: ToolErrorExpectation, seen: Transcript, fail: Any) -> None:
    same = [f for f in seen.failures if f.tool == wanted.tool]
    if not same:
        failed = ", ".join(dict.fromkeys(f.tool for f in seen.failures)) or "none"
        fail("tool_errors", f"no failed call of {wanted.tool} (failed: {failed})")
    elif wanted.code is not None and all(f.code != wanted.code for f in same):
        codes = ", ".join(dict.fromkeys(str(f.code) for f in same))
        fail("tool_errors", f"{wanted.tool} failed with {codes}, not {wanted.code}")


def _unmade(wanted: ToolCallExpectation, seen: Transcript) -> str:
    """Why a call the model proposed is not among the calls made, when it is not."""
    if any(a.tool == wanted.tool for a in seen.actions):
        return (
            f"; a call of {wanted.tool} was captured (proposed, not run): assert it with captured"
        )
    fates = [p.decision for p in seen.proposals if p.tool == wanted.tool]
    fates = [f for f in fates if f in ("rejected", "undecided")]
    if not fates:
        return ""
    how = " and ".join(dict.fromkeys("still waits" if f == "undecided" else f for f in fates))
    return f"; a call of {wanted.tool} was proposed, and {how}: assert it with proposed"


def _label(wanted: ToolCallExpectation) -> str:
    return f"{wanted.tool} {_json(wanted.args)}" if wanted.args else wanted.tool


def _fits(wanted: ToolCallExpectation, call: Call) -> str | None:
    if call.tool != wanted.tool:
        return f"{call.tool} is another tool"
    if call.args is None:
        return "its arguments did not parse"
    return mismatch(wanted.args, call.args)


def _missing(wanted: ToolCallExpectation, calls: list[Call], nothing: str) -> str:
    label = _label(wanted)
    same = [c for c in calls if c.tool == wanted.tool]
    if not same:
        made = ", ".join(dict.fromkeys(c.tool for c in calls)) or "none"
        return f"{nothing} of {label} (calls: {made})"
    return f"{nothing} of {label} ({len(same)} of that tool; the first: {_fits(wanted, same[0])})"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _quote(text: str) -> str:
    shown = text if len(text) <= 80 else text[:77] + "..."
    return json.dumps(shown, ensure_ascii=False)
