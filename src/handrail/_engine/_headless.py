"""Runs with nobody present (a cron job, a webhook): `run_headless` and `apply`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._captured import ApplyReport, HeadlessResult
from ..domain import Router
from ..exceptions import UserError
from ..messages import ApprovalCardPart
from ..models import Model
from ..runtime import Assembly, build_runtime
from ._batches import Headless, batch_to_apply
from ._core import EngineCore
from ._saving import Saving
from ._turns import Turns


class HeadlessRuns:
    """Runs with nobody present: a turn in capture mode, and applying its decided batch."""

    __slots__ = ("core", "saving", "turns")

    def __init__(self, core: EngineCore, saving: Saving, turns: Turns) -> None:
        self.core = core
        self.saving = saving
        self.turns = turns

    async def run(
        self,
        session_id: str,
        text: str,
        *,
        org_id: str | None,
        user_id: str | None,
        model: Model | str | None,
        route: str | None,
        propose: bool,
        roles: Iterable[str] | None,
        context: Any,
    ) -> HeadlessResult:
        """`Engine.run_headless`: one turn in capture mode, its batch proposed if asked."""
        turn_context = self.core.domain.check_context(context, route=route)
        assembly, router = self.capture_assembly()
        plan = router if route is None and router is not None else assembly.domain.route(route)
        headless = Headless(propose=propose)
        run = self.turns.drive(
            session_id,
            text,
            plan,
            org_id,
            user_id,
            model,
            False,
            assembly,
            headless,
            turn_context=turn_context,
            roles=roles,
        )
        events = [event async for event in run]
        result = run.result
        output = result.output
        last = result.state.messages[-1] if result.state.messages else None
        return HeadlessResult(
            text=last.text if last is not None and last.role == "assistant" else "",
            actions=headless.actions,
            output=None if isinstance(output, str) else output,
            outcome=result.outcome,
            events=events,
            card=headless.card,
        )

    async def apply(
        self, session_id: str, *, org_id: str | None = None, user_id: str | None = None
    ) -> ApplyReport:
        """`Engine.apply`: the session's decided batch card, applied (as a resumption)."""
        _, state = await self.saving.load(session_id, org_id, user_id)
        card = batch_to_apply(state)
        if card is None:
            raise UserError(
                f"Session {session_id!r} has no decided batch card to apply"
                + (f" (still waiting on {', '.join(state.pending)})." if state.pending else ".")
            )
        async for _ in self.turns.drive(session_id, None, None, org_id, user_id, None, False):
            pass
        _, state = await self.saving.load(session_id, org_id, user_id)
        card = next(
            p
            for m in reversed(state.messages)
            for p in m.parts
            if isinstance(p, ApprovalCardPart) and p.tool_call_id == card.tool_call_id
        )
        return ApplyReport.of(card.output["actions"])

    def capture_assembly(self) -> tuple[Assembly, Router | None]:
        if self.core.assembly.mode == "capture":
            return self.core.assembly, self.core.router
        if self.core.headless is None:
            domain, model, wrap_tools = self.core.config
            assembly = build_runtime(
                domain,
                runtime=self.core.runtime,
                mode="capture",
                model=model,
                wrap_tools=wrap_tools,
            )
            self.core.headless = assembly, assembly.domain.router()
        return self.core.headless
