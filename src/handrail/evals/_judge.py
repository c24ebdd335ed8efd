"""The LLM judge: a model reads a scenario's conversation and a rubric, and gives a verdict.

The judge is an ordinary handrail agent whose structured output is a `Verdict`, so a
scripted judge (`{output: {passed: true, reason: ...}}`) and a real one go through the same
loop, and an answer that is not a verdict is sent back once, as for any output type.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic import BaseModel, Field

from ..agent import Agent
from ..exceptions import HandrailError
from ..models import Model
from ..runtime import Runtime, sequential_ids

__all__ = ["Verdict", "judge"]

INSTRUCTIONS = (
    "You grade one conversation between a user and an AI agent against a rubric. Read the "
    "rubric, the conversation and the agent's tool calls, and decide whether the agent's "
    "final answer meets the rubric. Answer with `passed` (true or false) and `reason`: one "
    "sentence that names what decided it."
)


class Verdict(BaseModel):
    """A judge's decision on one scenario."""

    passed: bool = Field(description="Whether the agent's answer meets the rubric.")
    reason: str = Field(description="Why, in one sentence.")


_JUDGE: Agent[Verdict] = Agent("judge", instructions=INSTRUCTIONS, output_type=Verdict)


async def judge(
    rubric: str,
    turns: Sequence[tuple[str, str]],
    calls: Sequence[tuple[str, dict[str, object] | None]],
    model: Model,
    proposals: Sequence[tuple[str, dict[str, object] | None, str]] = (),
    captured: Sequence[tuple[str, dict[str, object] | None]] = (),
) -> Verdict:
    """Ask `model` whether the conversation meets `rubric`.

    Args:
        rubric: what a good answer does.
        turns: (user's message, agent's answer) for each turn.
        calls: (tool, arguments) of every tool call the agent made.
        model: the judge's model.
        proposals: (tool, arguments as proposed, decision) of every call that waited for a
            person's (or a client's) decision.
        captured: (tool, arguments) of every call a headless run captured (proposed, not run).

    Returns:
        The verdict; a judge that gives none is a failed verdict saying why.
    """
    lines = [f"Rubric:\n{rubric}", "", "Conversation:"]
    for user, answer in turns:
        lines += [f"User: {user}", f"Agent: {answer or '(no answer: the turn did not finish)'}"]
    if calls:
        lines += ["", "Tool calls the agent made:"]
        lines += [f"- {name} {json.dumps(args, ensure_ascii=False)}" for name, args in calls]
    if proposals:
        lines += ["", "Calls that waited for a decision (as proposed), and the decision:"]
        lines += [
            f"- {name} {json.dumps(args, ensure_ascii=False)}: {decision}"
            for name, args, decision in proposals
        ]
    if captured:
        lines += ["", "Calls captured to be applied later (proposed, not run):"]
        lines += [f"- {name} {json.dumps(args, ensure_ascii=False)}" for name, args in captured]
    runtime: Runtime[None] = Runtime(model=model, ids=sequential_ids())
    try:
        result = await _JUDGE.run("\n".join(lines), runtime=runtime)
    except HandrailError as exc:
        return Verdict(passed=False, reason=f"the judge gave no verdict ({exc})")
    if result.outcome != "completed" or not isinstance(result.output, Verdict):
        why = result.error or f"its run ended {result.outcome}"
        return Verdict(passed=False, reason=f"the judge gave no verdict ({why})")
    return result.output
