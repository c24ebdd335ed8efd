"""Capture and apply: an agent acts with nobody present, and its actions run later, in one batch.

In capture mode (`Engine(..., mode="capture")`, `Engine.run_headless`) a gated tool does not
run. Its pure `mint(args, local_index)` predicts the output, with temporary ids (`temp_0`,
`temp_1`, ...: `temp_id(local_index)`), the model sees that prediction, and the call is
recorded as a `CapturedAction`. Later calls can chain on the temporary ids
(`orders.add_note(order_id="temp_0")`). Read-only tools run for real.

`apply` then runs the captured actions for real, in order. Before each one it replaces every
temporary id in its arguments (nested ones too) with the real value that the earlier action
returned at the same place in its output. It stops at the first failure and reports what ran,
what failed and what did not run. An action that ran is marked `applied`, so applying the
same actions again runs only the rest.

A captured run can also wait for a person as ONE batch card (`Engine.run_headless(...,
propose=True)`): approve all, reject all, or decide per action with amendments
(`Approve(actions={0: ActionChoice(...)})`); resuming the session applies what was approved.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from .exceptions import InvalidDecisionError
from .messages import ApprovalCardPart, ToolCallPart

if TYPE_CHECKING:
    from .events import Event
    from .runtime import Runtime
    from .state import RunState
    from .suspension import Decision
    from .tools import Tool

__all__ = [
    "ActionStatus",
    "ApplyReport",
    "CapturedAction",
    "HeadlessResult",
    "apply",
    "temp_id",
]

BATCH_TOOL = "handrail.apply"
"""The tool name a batch card carries (it is no tool the model can call)."""
ActionStatus = Literal["captured", "applied", "failed", "skipped"]
_TEMP = re.compile(r"\btemp_\d+\b")
_WHOLE = re.compile(r"temp_\d+")


def temp_id(local_index: int) -> str:
    """The temporary id of the action with this local index: `temp_0`, `temp_1`, ..."""
    return f"temp_{local_index}"


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
    status: ActionStatus = "captured"
    """`captured` (not run yet), `applied`, `failed`, or `skipped` (a person rejected it)."""
    output: Any = None
    """The real output, once applied."""
    error: str | None = None
    """Why it failed, or why it was skipped."""

    @classmethod
    def from_part(cls, part: ToolCallPart) -> CapturedAction:
        """The action a captured call part records."""
        assert part.captured is not None and part.result is not None
        return cls(
            tool=part.name,
            args=part.args,
            bound=part.bound,
            predicted_output=part.result.data,
            local_index=part.captured,
            call_id=part.id,
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
        part
        for message in state.all_messages()
        for part in message.parts
        if isinstance(part, ToolCallPart) and part.captured is not None and part.captured >= since
    ]
    return [CapturedAction.from_part(p) for p in sorted(parts, key=lambda p: p.captured or 0)]


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


async def apply(
    actions: Iterable[CapturedAction],
    tools: Iterable[Tool[Any]] | Mapping[str, Tool[Any]],
    *,
    runtime: Runtime[Any] | None = None,
    state: RunState | None = None,
) -> ApplyReport:
    """Run captured actions for real, in order, with temporary ids replaced by real ones.

    Each action goes through the dispatch pipeline (validation, timeout, digest, hooks), with
    no approval gate: calling `apply` (or approving the batch card) is the approval. It
    stops at the first failure; the rest stay `captured`. Actions already `applied` are not
    run again (their outputs still supply real ids), nor are `skipped` ones, so applying a
    partly applied batch again runs only what has not run (a `failed` one is tried again).

    Args:
        actions: the captured actions (`HeadlessResult.actions`, or a report's `actions`).
        tools: the real tools, as a list or by name (an agent's `tools`).
        runtime: dependencies and hooks for the tools (default: a new `Runtime`).
        state: the session state the tools see (scope, context store, domain state).

    Returns:
        The report: the actions with their status, and the ids learnt. The actions passed in
        are updated in place too.
    """
    from .runtime import Runtime
    from .state import RunState
    from .tools._dispatch import Dispatcher

    by_name = dict(tools) if isinstance(tools, Mapping) else {t.name: t for t in tools}
    run_state = state if state is not None else RunState()
    dispatcher = Dispatcher(by_name, run_state, runtime or Runtime(), agent="apply")
    report = ApplyReport(actions=list(actions))
    async for _ in run_actions(report, dispatcher.apply):
        pass
    return report


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
        created_at=now,
        expires_at=None if ttl is None else now + ttl,
    )


def decide_batch(
    state: RunState,
    tools: Mapping[str, Tool[Any]],
    card: ApprovalCardPart,
    decision: Decision,
) -> dict[str, Any] | None:
    """Check a decision on a batch card; return the plan it approves (None: nothing runs).

    The plan is the card's actions with per-action amendments made and rejections marked
    `skipped`; its digest binds the approval, as for a single call.

    Raises:
        InvalidDecisionError: an unknown action index, a change to a field its tool does
            not let a person amend, or amended arguments that do not validate.
    """
    from .suspension import Approve, amend

    if not isinstance(decision, Approve):
        return None
    if decision.amended_args:
        raise InvalidDecisionError(
            f"Batch {card.tool_call_id} holds several actions: amend them one by one, in "
            f"actions (by each action's index), each with its own amended_args."
        )
    actions = [CapturedAction.model_validate(a) for a in card.args["actions"]]
    choices = decision.actions or {}
    known = {a.local_index for a in actions}
    unknown = sorted(set(choices) - known)
    if unknown:
        raise InvalidDecisionError(
            f"Batch {card.tool_call_id} has no action {', '.join(map(str, unknown))} "
            f"(actions: {', '.join(map(str, sorted(known)))})."
        )
    for action in actions:
        choice = choices.get(action.local_index)
        if choice is None:
            continue
        if not choice.approve:
            action.status = "skipped"
            action.error = choice.reason or "a person chose not to apply it"
        elif choice.amended_args:
            tool = tools.get(action.tool)
            if tool is None:
                raise InvalidDecisionError(
                    f"Action {action.local_index} is for tool {action.tool!r}, which no agent "
                    f"has any more: skip it, or deploy the tool again."
                )
            label = f"Action {action.local_index} ({action.tool})"
            action.args = amend(
                state, tool, action.args, choice.amended_args, tool.amendable, label, action.bound
            )
    return {"actions": [a.model_dump(mode="json") for a in actions]}


def approved_plan(card: ApprovalCardPart) -> list[CapturedAction]:
    """The actions a decided batch card says to apply (all skipped when it was rejected).

    Raises:
        InvalidDecisionError: the recorded plan does not match the digest that was approved.
    """
    from .suspension import args_digest

    if card.output is not None:  # applied before (partly, perhaps): go on from there
        return [CapturedAction.model_validate(a) for a in card.output["actions"]]
    if card.decision != "approve":
        reason = card.reason or (
            "nobody approved it in time" if card.decision == "expire" else "rejected"
        )
        actions = [CapturedAction.model_validate(a) for a in card.args["actions"]]
        for action in actions:
            action.status, action.error = "skipped", reason
        return actions
    plan = card.amended_args if card.amended_args is not None else card.args
    if card.args_digest != args_digest(card.tool_name, plan):
        raise InvalidDecisionError(
            f"Batch {card.tool_call_id}: the actions are not the ones that were approved "
            f"(the digest does not match); nothing was applied. Ask for approval again."
        )
    return [CapturedAction.model_validate(a) for a in plan["actions"]]
