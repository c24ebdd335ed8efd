"""A headless turn's batch card: proposing it, and applying its actions once decided."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from .._captured import ApplyReport, CapturedAction, batch_card, run_actions
from .._deadlines import ttl_for
from .._loop import AgentResult, AgentRun
from .._tool_result import ToolResult
from ..events import Event, RunCompleted, RunStarted
from ..messages import ApprovalCardPart, Message, TextPart, ToolCallPart
from ..recovery import RESULT as _RESULT
from ..state import Progress, RunState
from ..store import SessionRecord
from ..suspension import approved_plan
from ..tools._dispatch import Dispatcher, completed_event
from ._core import EngineCore
from ._journal import SessionJournal
from ._saving import Saving


class Batches:
    """A headless turn's batch card: proposed on its captured actions, applied once decided."""

    __slots__ = ("core", "saving")

    def __init__(self, core: EngineCore, saving: Saving) -> None:
        self.core = core
        self.saving = saving

    def propose(self, state: RunState, actions: list[CapturedAction]) -> ApprovalCardPart:
        """Put a captured turn's actions on ONE batch card and suspend the session on it."""
        message = state.messages[-1]  # the turn's answer
        card = batch_card(
            actions,
            self.core.domain.tools(),
            card_id=self.core.runtime.ids("batch"),
            now=self.core.runtime.clock(),
            ttl=ttl_for("batch", self.core.domain.expires_after, self.core.runtime.pending_ttl),
        )
        message.parts.append(card)
        state.pending[card.tool_call_id] = card
        state.progress = Progress(
            agent=message.agent or "", message_id=message.id, status="suspended"
        )
        return card

    async def apply_batch(
        self, run: AgentRun[Any], record: SessionRecord, state: RunState, card: ApprovalCardPart
    ) -> AsyncGenerator[Event, None]:
        """Apply a decided batch card's actions (going on from a crash, from the log)."""
        assert state.progress is not None
        report = ApplyReport(actions=approved_plan(card))
        state.progress.status = "running"  # a crash from here on is recovered from the log
        # Shown once the drive's first write (which takes its lease) is made, and logged with it.
        yield RunStarted(run_id=state.run_id, session_id=state.session_id)
        await self.saving.save(record, state, "active")
        # Only what `execute` looks up: the entries of the batch's own actions.
        calls = [action.call_id for action in report.actions]
        entries = await self.core.tool_log(record.id, calls) if calls else []
        logged = {e.tool_call_id: e for e in entries}
        tools = self.core.domain.tools()
        dispatcher = Dispatcher(
            tools,
            state,
            self.core.runtime,
            "apply",
            journal=SessionJournal(self.saving, record, state),
        )

        async def execute(
            action: CapturedAction, args: dict[str, Any], bound: dict[str, Any] | None
        ) -> ToolCallPart:
            entry = logged.get(action.call_id)
            tool = tools.get(action.tool)
            if entry is None or (entry.result is None and tool is not None and tool.idempotent):
                return await dispatcher.apply(action, args, bound)
            part = ToolCallPart(id=action.call_id, name=action.tool, args=entry.args)
            if entry.result is not None:  # it ran before a crash: its result stands
                part.result = _RESULT.validate_python(entry.result)
            else:
                part.result = ToolResult.failure(
                    f"Action {action.local_index} ({action.tool}) may have run before the "
                    f"worker applying it stopped; its effect is unknown, so it is not run "
                    f"again. Check whether it happened.",
                    code="interrupted",
                )
            part.status = "completed" if part.result.ok else "failed"
            return part

        async for part in run_actions(report, execute):
            yield completed_event(part)
        card.output = {"actions": [a.model_dump(mode="json") for a in report.actions]}
        summary = report_text(report)
        # What really happened goes into the history, where people and the next turn's
        # model read it beside the proposals (whose predicted results were never results).
        state.messages.append(
            Message(
                id=self.core.runtime.ids("msg"),
                role="system",
                parts=[TextPart(text=outcome_text(card.tool_call_id, report), synthetic=True)],
            )
        )
        state.progress = None
        run._result = AgentResult(outcome="completed", state=state, output=summary)
        yield RunCompleted(output=summary)  # shown at the drive's end; logged with its last save
        await self.saving.save(record, state, "completed" if report.ok else "failed", release=True)


@dataclass(kw_only=True, slots=True)
class Headless:
    """What a headless turn collects besides its events."""

    propose: bool = False
    actions: list[CapturedAction] = field(default_factory=list)
    card: str | None = None


def batch_to_apply(state: RunState) -> ApprovalCardPart | None:
    """The decided batch card the session waits to apply, if that is what it waits for."""
    progress = state.progress
    if progress is None or state.pending:
        return None
    try:
        message = state.find_message(progress.message_id)
    except KeyError:
        return None
    for part in message.parts:
        if isinstance(part, ApprovalCardPart) and part.kind == "batch":
            return part if part.decision is not None else None
    return None


def report_text(report: ApplyReport) -> str:
    """One line: how many actions were applied, and which were skipped, failed, or not run."""
    text = f"Applied {len(report.applied)} of {len(report.actions)} action(s)"
    if report.skipped:
        text += "; skipped: " + ", ".join(named(a) for a in report.skipped)
    failed = report.failed
    if failed is not None:
        text += f"; action {failed.local_index} ({failed.tool}) failed: {failed.error}"
        if report.not_run:
            text += "; did not run: " + ", ".join(named(a) for a in report.not_run)
    return text + "."


def named(action: CapturedAction) -> str:
    return f"action {action.local_index} ({action.tool})"


def outcome_text(card_id: str, report: ApplyReport) -> str:
    """What applying a batch really did, for the history the next turn's model reads."""
    applied = len(report.applied)
    lines = [
        f"Batch {card_id} was decided: {applied} of {len(report.actions)} action(s) applied. "
        f"What really happened (the calls proposed earlier did not run then; their predicted "
        f"results were not results):"
    ]
    for action in report.actions:
        head = f"- action {action.local_index} ({action.tool})"
        if action.status == "applied":
            output = json.dumps(action.output, ensure_ascii=False, sort_keys=True, default=str)
            lines.append(f"{head}: applied; real output: {output}")
        elif action.status == "skipped":
            lines.append(f"{head}: skipped, not done ({action.error or 'a person skipped it'})")
        elif action.status == "failed":
            lines.append(f"{head}: failed, not done: {action.error}")
        else:
            lines.append(f"{head}: not run (an earlier action failed)")
    if report.ids:
        real = ", ".join(f"{temp} = {value}" for temp, value in report.ids.items())
        lines.append(f"Temporary ids now stand for: {real}.")
    return "\n".join(lines)
