"""Capture and apply: an agent acts with nobody present, and its actions run later, in one batch.

In capture mode (`Engine(..., mode="capture")`, `Engine.run_headless`) a gated tool does not
run. Its pure `mint(args, local_index)` predicts the output, with temporary ids (`temp_0`,
`temp_1`, ...: `temp_id(local_index)`; without `mint`, just `temp_id(local_index)`), the model
reads it as a proposal ("Proposed, not done yet: ..."), and the call is
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

from collections.abc import Iterable, Mapping
from typing import Any

from ._captured import BATCH_TOOL as BATCH_TOOL
from ._captured import (
    ActionStatus,
    ApplyReport,
    CapturedAction,
    HeadlessResult,
    run_actions,
    temp_id,
)
from ._captured import batch_card as batch_card
from ._captured import captured_actions as captured_actions
from ._captured import learn_ids as learn_ids
from ._captured import substitute as substitute
from ._captured import unresolved as unresolved
from .runtime import Runtime
from .state import RunState
from .suspension import approved_plan as approved_plan
from .suspension import decide_batch as decide_batch
from .tools import Tool
from .tools._dispatch import Dispatcher

__all__ = [
    "ActionStatus",
    "ApplyReport",
    "CapturedAction",
    "HeadlessResult",
    "apply",
    "temp_id",
]


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
    by_name = dict(tools) if isinstance(tools, Mapping) else {t.name: t for t in tools}
    run_state = state if state is not None else RunState()
    dispatcher = Dispatcher(by_name, run_state, runtime or Runtime(), agent="apply")
    report = ApplyReport(actions=list(actions))
    async for _ in run_actions(report, dispatcher.apply):
        pass
    return report
