"""Crash recovery: a side effect never runs twice, and a call that may have run is not guessed.

While a turn runs under an `Engine`, the dispatcher writes a *journal*: before the first
side-effecting call of a model response it checkpoints the session (so the calls are on
record), then logs each call `started` with its idempotency key, runs it, and logs its result.
A tool is side-effecting unless its permission is `read`.

After a crash (a `kill -9`, a lost machine), the session holds a turn that is still marked
running, and `reconcile` settles it from the tool-call log:

- a call whose result was logged gets that result, and never runs again;
- a call logged `started` without a result may or may not have had its effect: an
  `idempotent` tool runs again with the same idempotency key; any other becomes a `recovery`
  card ("this call may have run: retry or skip?") for a person to decide;
- a call never logged never started, and runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import TypeAdapter

from ._tool_result import ToolResult
from .messages import ApprovalCardPart, Message, ToolCallPart
from .suspension import placeholder

if TYPE_CHECKING:
    from .state import RunState
    from .store import ToolLogEntry
    from .tools import Tool

__all__ = ["RECOVERY_PROMPT", "Journal", "attempt_id", "idempotency_key", "reconcile"]

RECOVERY_PROMPT = (
    "This call may have run before the worker running it stopped (a crash or a restart), so "
    "its effect is unknown. Retry it (approve), skip it (reject), or, if you checked that it "
    "ran, say so with what it returned (answer)?"
)
RESULT: TypeAdapter[ToolResult] = TypeAdapter(ToolResult)
"""Validates a result as the tool-call log stores it."""


class Journal(Protocol):
    """Where a run records what it is about to do, so that a crash loses nothing.

    The engine provides one per run; a run without one (a bare `Agent.run`) keeps no journal.
    A journal that cannot record (its store stayed away, past its retries) raises a
    `StoreError`: the run then stops right there, as a crash there would stop it, and is
    recovered from what was recorded. The calls of a parallel batch finish first, each
    logging its own result: one call's failed record never cuts another call short.
    """

    async def checkpoint(self, starting: Sequence[tuple[str, ToolCallPart, str]] = ()) -> None:
        """Persist the session as it is now (before its first side effect, at a turn's start).

        `starting`: the calls that start right after it, as `(log_id, part, key)`, recorded as
        `started` in the same write; `started` then has nothing left to record for them. Only
        calls that start at once belong here: one logged `started` and then held up (behind
        another call) would be asked about after a crash, though it never ran.
        """
        ...

    async def acting(self) -> None:
        """Before the run acts (a model call, a tool call): a drive yet to write writes now.

        A run's drive takes its session's lease with its first write; nothing a second
        driver would repeat (a model's answer, a call) starts before it is done.
        """
        ...

    async def started(self, log_id: str, part: ToolCallPart, key: str) -> None:
        """Record that `part` is about to run (attempt `log_id`), with its idempotency key."""
        ...

    async def finished(self, log_id: str, part: ToolCallPart, result: ToolResult) -> None:
        """Record the result of attempt `log_id` of `part`."""
        ...


def idempotency_key(state: RunState, part: ToolCallPart) -> str:
    """The idempotency key of a call: the same for every attempt to run it.

    Derived from the session, the turn and the tool call id, so an idempotent tool that is
    run again after a crash can pass it on (to a payment API, say) and have one effect.
    """
    scope = f"{state.session_id or state.run_id}\x00{state.turn}\x00{part.id}"
    return "hr_" + hashlib.sha256(scope.encode()).hexdigest()[:32]


def attempt_id(message: Message, part: ToolCallPart) -> str:
    """The tool-call log's id for the current attempt at `part`.

    The first attempt is logged under the call's id; each retry a person approved after a
    crash gets its own entry (`call_1~1`, ...), so a crash during a retry is noticed too.
    """
    retries = sum(
        1
        for p in message.parts
        if isinstance(p, ApprovalCardPart)
        and p.tool_call_id == part.id
        and p.kind == "recovery"
        and p.decision == "approve"
    )
    return part.id if not retries else f"{part.id}~{retries}"


def result_record(result: ToolResult) -> dict[str, Any]:
    """A result as the tool-call log stores it."""
    return RESULT.dump_python(result, mode="json")  # type: ignore[no-any-return]


def reconcile(
    state: RunState,
    message: Message,
    log: Sequence[ToolLogEntry],
    tools: Mapping[str, Tool[Any]],
    *,
    now: float,
) -> list[ApprovalCardPart]:
    """Settle the calls a crash may have cut off in `message`, from the tool-call log.

    The calls concerned are those left `running` by a turn cut off mid-batch, and approved
    calls of a suspended turn whose resumption was cut off (they are in the log, though the
    stored turn still shows them waiting). Results found in the log are stamped on their
    calls; calls that may have run and are not idempotent get a `recovery` card, placed on
    `message` and in the pending map. The other calls are safe to run (again) when the turn
    resumes.

    `log` needs only the entries of the current attempts of `message`'s calls (`attempt_id`
    of each): the engine reads those alone (`SessionStore.tool_log(calls=)`).

    Returns:
        The new recovery cards (none: the turn can resume at once).
    """
    entries = {entry.tool_call_id: entry for entry in log}
    decided: dict[str, ApprovalCardPart] = {}
    for p in message.parts:
        if isinstance(p, ApprovalCardPart) and p.decision is not None:
            decided[p.tool_call_id] = p
    cards: list[ApprovalCardPart] = []
    for part in message.tool_calls:
        entry = entries.get(attempt_id(message, part))
        if entry is None:
            continue  # this attempt never started: it runs when the turn resumes
        approval = decided.get(part.id)
        approved = approval is not None and approval.decision == "approve"
        if part.status != "running" and not (part.status == "waiting" and approved):
            continue
        if approved and approval is not None and approval.amended_args is not None:
            part.args = approval.amended_args  # what it was started with
        if entry.status == "finished" and entry.result is not None:
            part.result = RESULT.validate_python(entry.result)
            part.status = "completed" if part.result.ok else "failed"
            if part.result.ok:
                state.context.record(part.name, part.id, part.result.data)
            continue
        tool = tools.get(part.name)
        if tool is not None and tool.idempotent:
            continue  # it runs again, with the same idempotency key
        card = ApprovalCardPart(
            tool_call_id=part.id,
            tool_name=part.name,
            args=part.args,
            prompt=RECOVERY_PROMPT,
            kind="recovery",
            executor=part.executor,
            agent=message.agent,
            created_at=now,
        )
        part.status = "waiting"
        part.result = placeholder(card)
        state.pending[part.id] = card
        message.parts.append(card)
        cards.append(card)
    return cards
