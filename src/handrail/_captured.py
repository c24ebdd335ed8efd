"""Captured actions, their temporary ids, and the batch card that proposes them.

What capture mode records (`handrail.capture` explains the mode, and applies the actions):
a gated call that did not run is a `CapturedAction` read off its call part, its outputs
predicted with temporary ids (`temp_0`, ...) that later arguments refer to. Applying
replaces them with the real values in order (`run_actions`, given how to run one action). A
batch waits for a person as ONE card (`batch_card`); deciding it is `suspension.decide`'s.
Pure: no dispatch, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from .messages import ApprovalCardPart, ToolCallPart

if TYPE_CHECKING:
    from .events import Event
    from .state import RunState
    from .tools import Tool

__all__ = [
    "BATCH_TOOL",
    "ActionStatus",
    "ApplyReport",
    "CapturedAction",
    "Execute",
    "HeadlessResult",
    "batch_card",
    "captured_actions",
    "learn_ids",
    "proposed_text",
    "run_actions",
    "substitute",
    "temp_id",
    "unresolved",
]

BATCH_TOOL = "handrail.apply"
"""The tool name a batch card carries (it is no tool the model can call)."""
ActionStatus = Literal["captured", "applied", "failed", "skipped"]
_TEMP = re.compile(r"\btemp_\d+\b")
_WHOLE = re.compile(r"temp_\d+")


def temp_id(local_index: int) -> str:
    """The temporary id of the action with this local index: `temp_0`, `temp_1`, ..."""
    return f"temp_{local_index}"


def proposed_text(local_index: int, predicted: str) -> str:
    """What the model reads for a captured call: a proposal, not a result.

    Nothing ran: the call waits to be applied (or approved on the run's batch card), and a
    person may skip it, so the model must not report it as done.
    """
    return (
        f"Proposed, not done yet: queued for approval as action {local_index} of this run's "
        f"batch; nothing has run, and it runs only if the batch is applied (a person may skip "
        f"it), so do not say it is done: say it is proposed. Predicted result: {predicted}"
    )


class CapturedAction(BaseModel):
    """A gated call that capture mode recorded instead of running."""

    model_config = ConfigDict(extra="forbid")

    tool: str
    """The tool's name."""
    args: dict[str, Any]
    """The arguments, as validated (they may hold earlier actions' temporary ids)."""
    bound: dict[str, Any] | None = None
    """The bound arguments (`Tool(bindings=...)`) as they were read when the call was
    captured: applying binds these (temporary ids replaced), not whatever the context holds
    by then. None: the tool binds nothing (or the action predates this field)."""
    predicted_output: Any = None
    """What the tool's `mint` predicted (what the model saw)."""
    local_index: int
    """The action's place in its run: `temp_{local_index}` names what it creates."""
    call_id: str = ""
    """The tool call it came from."""
    agent: str | None = None
    """The agent that proposed it (None on an action stored before actions named it)."""
    status: ActionStatus = "captured"
    """`captured` (not run yet), `applied`, `failed`, or `skipped` (a person rejected it)."""
    output: Any = None
    """The real output, once applied."""
    error: str | None = None
    """Why it failed, or why it was skipped."""

    @classmethod
    def from_part(cls, part: ToolCallPart, agent: str | None = None) -> CapturedAction:
        """The action a captured call part (of `agent`'s message) records."""
        assert part.captured is not None and part.result is not None
        return cls(
            tool=part.name,
            args=part.args,
            bound=part.bound,
            predicted_output=part.result.data,
            local_index=part.captured,
            call_id=part.id,
            agent=agent,
        )


@dataclass(kw_only=True, slots=True)
class ApplyReport:
    """What `apply` did: the actions with their new status, and the ids it learnt."""

    actions: list[CapturedAction]
    """Every action, in order, with its status (pass them to `apply` again to go on)."""
    ids: dict[str, Any] = field(default_factory=dict)
    """Temporary id -> the real value it stood for."""

    @classmethod
    def of(cls, actions: Iterable[CapturedAction | dict[str, Any]]) -> ApplyReport:
        """The report of actions (or their JSON) as they stand, with the ids they yielded."""
        report = cls(actions=[CapturedAction.model_validate(a) for a in actions])
        for action in report.applied:
            learn_ids(action.predicted_output, action.output, report.ids)
        return report

    @property
    def applied(self) -> list[CapturedAction]:
        """The actions that ran (in an earlier `apply` too)."""
        return [a for a in self.actions if a.status == "applied"]

    @property
    def failed(self) -> CapturedAction | None:
        """The action that failed (and stopped the batch), if one did."""
        return next((a for a in self.actions if a.status == "failed"), None)

    @property
    def not_run(self) -> list[CapturedAction]:
        """The actions that did not run: after the failure, or never reached."""
        return [a for a in self.actions if a.status == "captured"]

    @property
    def skipped(self) -> list[CapturedAction]:
        """The actions a person rejected."""
        return [a for a in self.actions if a.status == "skipped"]

    @property
    def ok(self) -> bool:
        """Whether every action that was not skipped has run."""
        return all(a.status in ("applied", "skipped") for a in self.actions)


@dataclass(kw_only=True, slots=True)
class HeadlessResult:
    """What `Engine.run_headless` returns: the answer, and the actions waiting to be applied."""

    text: str
    """The agent's final answer."""
    actions: list[CapturedAction]
    """The gated calls captured this turn, in order."""
    output: Any = None
    """The structured output, when the last agent has an output type."""
    outcome: str = "completed"
    """How the turn ended (`completed`, `suspended`, `failed`, `interrupted`)."""
    events: list[Event] = field(default_factory=list)
    """Every event of the turn."""
    card: str | None = None
    """The batch card's id, when the actions wait for a person (`propose=True`)."""


def captured_actions(state: RunState, since: int = 0) -> list[CapturedAction]:
    """The actions captured in `state` whose local index is at least `since`, in order."""
    parts = [
        (part, message.agent)
        for message in state.all_messages()
        for part in message.parts
        if isinstance(part, ToolCallPart) and part.captured is not None and part.captured >= since
    ]
    parts.sort(key=lambda found: found[0].captured or 0)
    return [CapturedAction.from_part(part, agent) for part, agent in parts]


def learn_ids(predicted: Any, actual: Any, ids: dict[str, Any]) -> None:
    """Record the real value of every temporary id in `predicted` (same place in `actual`)."""
    if isinstance(predicted, str):
        if _WHOLE.fullmatch(predicted):
            ids.setdefault(predicted, actual)
    elif isinstance(predicted, dict) and isinstance(actual, dict):
        for key, value in predicted.items():
            if key in actual:
                learn_ids(value, actual[key], ids)
    elif isinstance(predicted, list) and isinstance(actual, list):
        for value, real in zip(predicted, actual, strict=False):
            learn_ids(value, real, ids)


def substitute(value: Any, ids: Mapping[str, Any]) -> Any:
    """`value` with every known temporary id replaced by its real value, however nested.

    A string that is exactly a temporary id becomes the real value (whatever its type); a
    temporary id inside a longer string is replaced by the real value's text.
    """
    if isinstance(value, str):
        if value in ids:
            return ids[value]
        if "temp_" not in value:
            return value
        return _TEMP.sub(lambda m: str(ids[m.group()]) if m.group() in ids else m.group(), value)
    if isinstance(value, dict):
        return {k: substitute(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, ids) for v in value]
    return value


def unresolved(value: Any) -> list[str]:
    """The temporary ids left in `value`."""
    if isinstance(value, str):
        return _TEMP.findall(value)
    if isinstance(value, dict):
        return [t for v in value.values() for t in unresolved(v)]
    if isinstance(value, list):
        return [t for v in value for t in unresolved(v)]
    return []


Execute = Callable[[CapturedAction, dict[str, Any], dict[str, Any] | None], Awaitable[ToolCallPart]]
"""Runs one action with its final arguments and bound arguments; returns the stamped call."""


async def run_actions(report: ApplyReport, execute: Execute) -> AsyncIterator[ToolCallPart]:
    """Apply `report.actions` in order with `execute` (see `apply`); yield each call run."""
    ids = report.ids
    for action in report.actions:
        if action.status == "applied":
            learn_ids(action.predicted_output, action.output, ids)
            continue
        if action.status == "skipped":
            continue
        action.status, action.error = "captured", None  # a failed action is tried again
        args = substitute(action.args, ids)
        bound = substitute(action.bound, ids) if action.bound is not None else None
        missing = unresolved(args) + unresolved(bound)
        if missing:
            action.status = "failed"
            action.error = (
                f"Action {action.local_index} ({action.tool}) refers to {', '.join(missing)}, "
                f"which no applied action produced (was it skipped, or did its tool's real "
                f"output lack the field its mint predicted?). It did not run."
            )
            return
        part = await execute(action, args, bound)
        yield part
        result = part.result
        assert result is not None
        if not result.ok:
            action.status, action.error = "failed", result.error
            return
        action.status, action.args, action.output = "applied", part.args, result.data
        learn_ids(action.predicted_output, action.output, ids)


# -- batch approval ------------------------------------------------------------------------


def batch_card(
    actions: list[CapturedAction],
    tools: Mapping[str, Tool[Any]],
    *,
    card_id: str,
    now: float,
    ttl: float | None,
) -> ApprovalCardPart:
    """ONE approval card for a captured run's actions (its `args` list them).

    `args["amendable"]` maps each action's local index to its tool's amendable fields.
    """
    amendable = {
        str(a.local_index): list(tools[a.tool].amendable) for a in actions if a.tool in tools
    }
    count = f"{len(actions)} action" + ("s" if len(actions) != 1 else "")
    return ApprovalCardPart(
        tool_call_id=card_id,
        tool_name=BATCH_TOOL,
        args={
            "actions": [a.model_dump(mode="json") for a in actions],
            "amendable": {k: v for k, v in amendable.items() if v},
        },
        prompt=f"Apply these {count}? Approve all, reject all, or decide per action.",
        kind="batch",
        # Who proposed them, as an approval card names its agent (several: each, in order).
        agent=", ".join(dict.fromkeys(a.agent for a in actions if a.agent)) or None,
        created_at=now,
        expires_at=None if ttl is None else now + ttl,
    )
