"""Deciding pending calls: `resolve` and `resolve_many`, each decision audited in its save."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..audit import AuditEntry, decision_entry
from ..exceptions import ConflictError, UserError
from ..inbox import deciding_tools
from ..messages import ApprovalCardPart
from ..policy import Decider
from ..store import SessionRecord
from ..suspension import Decision, current_digest, decide
from ._core import EngineCore
from ._leases import Leases
from ._saving import Saving


@dataclass(kw_only=True, slots=True)
class Resolution:
    """What `Engine.resolve` recorded, and what is still pending."""

    decided: list[str]
    """The calls this resolution decided (an approval of a call that needs more approvals is
    recorded on its card, and the call stays pending)."""
    pending: list[str]
    """The calls still waiting for a decision."""
    org_id: str | None = None
    """The session's organisation, as stored."""
    user_id: str | None = None
    """The session's user, as stored: whoever decided, the turn goes on as theirs."""

    @property
    def ready(self) -> bool:
        """Whether nothing is pending any more: the turn can `resume`."""
        return not self.pending


class Deciding:
    """Records decisions on pending calls, with their audit entries, in one save."""

    __slots__ = ("core", "leases", "saving")

    def __init__(self, core: EngineCore, leases: Leases, saving: Saving) -> None:
        self.core = core
        self.leases = leases
        self.saving = saving

    async def resolve_many(
        self,
        session_id: str,
        decisions: Mapping[str, Decision],
        *,
        org_id: str | None = None,
        user_id: str | None = None,
        decider: Decider | None = None,
    ) -> Resolution:
        """`Engine.resolve_many`: all the decisions recorded, or none."""
        if not decisions:
            raise UserError("resolve_many needs at least one decision.")
        if decider is not None and (org_id is not None or user_id is not None):
            raise UserError(
                "resolve: give a decider= (whose organisation scopes the session), or "
                "org_id=/user_id=, not both."
            )
        while True:
            async with self.leases.lock(session_id):
                if decider is None:
                    record, state = await self.saving.load(session_id, org_id, user_id)
                else:
                    record, state = await self.saving.load(
                        session_id, decider.org_id, any_user=True
                    )
                now = self.core.runtime.clock()
                tools = deciding_tools(self.core.domain, state)
                cards = [
                    (
                        decide(
                            state,
                            tools,
                            tool_call_id,
                            decision,
                            now=now,
                            decider=decider,
                            policies=self.core.domain.policies,
                        ),
                        decision.via,
                    )
                    for tool_call_id, decision in decisions.items()
                ]
                # The decisions' audit entries are written by the same save: one transaction,
                # so the trail never misses a stored decision nor records one that was not.
                record.audit = self.decision_entries(record, cards)
                ready = not state.pending
                try:
                    # Decided in full: a worker waiting on the store may resume, woken by the
                    # save itself (one commit).
                    await self.saving.save(record, state, record.status, notify=ready)
                except ConflictError:
                    continue  # another worker saved in between: decide again on its state
                finally:
                    record.audit = []
                return Resolution(
                    decided=[i for i in decisions if i not in state.pending],
                    pending=list(state.pending),
                    org_id=record.org_id,
                    user_id=record.user_id,
                )

    @staticmethod
    def decision_entries(
        record: SessionRecord, cards: list[tuple[ApprovalCardPart, str | None]]
    ) -> list[AuditEntry]:
        """The audit entries of the decisions just recorded on `cards` (`handrail.audit`)."""
        return [
            decision_entry(
                card,
                org_id=record.org_id,
                session_id=record.id,
                via=via,
                args_digest=decided_digest(card),
            )
            for card, via in cards
        ]


def decided_digest(card: ApprovalCardPart) -> str:
    """The digest of what the card's latest decision was made on, for its audit entry.

    An approval that is not yet the last of those a call needs is the digest it approved.
    """
    if card.decision is None and card.approvals:
        return card.approvals[-1].args_digest or current_digest(card)
    return card.args_digest or current_digest(card)
