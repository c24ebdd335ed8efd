"""The fleet's chores: sweeps for due sessions, reclaimed leases, deadlines and pruning."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._deadlines import CLIENT_GRACE
from .._loop import AgentResult
from ..exceptions import ConflictError, SessionBusyError, SessionNotFoundError, StoreError
from ..store import SessionStatus, SessionSummary
from ..suspension import expire
from ._core import EngineCore
from ._leases import Leases
from ._saving import Saving, decode
from ._turns import Turns

SKIPPED = (SessionBusyError, SessionNotFoundError, ConflictError)
"""What a worker passes over: another worker got to the session first, or it went."""


class Chores:
    """The fleet's sweeps over the store: due sessions, reclaimed leases, deadlines, pruning."""

    __slots__ = ("core", "leases", "saving", "turns")

    def __init__(self, core: EngineCore, leases: Leases, saving: Saving, turns: Turns) -> None:
        self.core = core
        self.leases = leases
        self.saving = saving
        self.turns = turns

    async def advance_due(self, *, limit: int = 100) -> list[str]:
        """`Engine.advance_due`: claim the sessions that need a worker now, and advance each."""
        claimed = await self.claim(self.core.runtime.clock(), limit=limit)
        return await self.advance_each([summary.id for summary in claimed])

    async def claim(self, now: float, *, limit: int = 100) -> list[SessionSummary]:
        """`Engine.claim`: the sessions due at `now`, their leases this engine's."""
        claimed = await self.core.store.claim(
            now, self.core.lease_owner, self.core.lease_ttl, limit=limit
        )
        self.leases.note_claimed(summary.id for summary in claimed)
        return claimed

    async def reclaim(self) -> list[str]:
        """`Engine.reclaim`: the leases of a previous process of this worker id, advanced."""
        adopted = await self.core.store.adopt_leases(self.core.worker_id, self.core.lease_owner)
        self.leases.note_claimed(adopted)
        return await self.advance_each(adopted)

    async def advance_each(self, session_ids: list[str]) -> list[str]:
        """`advance` each session, one after the other, in its own scope; the ids that moved.

        A session another worker got to first, or that went, is passed over.
        """
        moved: list[str] = []
        for session_id in session_ids:
            try:
                if await self.advance_owned(session_id) is not None:
                    moved.append(session_id)
            except SKIPPED:
                continue
        return moved

    async def advance_owned(self, session_id: str) -> AgentResult[Any] | None:
        """`Engine.advance_owned`: `advance`, in the session's own scope."""
        found = await self.core.store.summary(session_id)
        if found is None:
            raise SessionNotFoundError(f"No session {session_id!r}.", session_id=session_id)
        return await self.turns.advance(session_id, org_id=found.org_id, user_id=found.user_id)

    async def expire_due(self) -> list[str]:
        """`Engine.expire_due`: every pending call past its deadline, expired."""
        now = self.core.runtime.clock()
        changed: list[str] = []
        for summary in await self.core.store.due(now):
            async with self.leases.lock(summary.id):
                record = await self.core.store.load(summary.id)
                if record is None:
                    continue
                try:
                    state = decode(record)
                except StoreError:
                    continue  # a corrupt session stays as it is, for a person to look at
                if expired := expire(state, now):
                    try:
                        await self.saving.save(record, state, record.status)
                    except ConflictError:
                        continue  # it changed meanwhile: the next sweep sees it again
                    self.core.tally["expired"] += len(expired)
                    changed.append(summary.id)
        return changed

    async def client_left(self, session_id: str, *, grace: float = CLIENT_GRACE) -> list[str]:
        """`Engine.client_left`: the session's `client` calls expire after `grace`."""
        async with self.leases.lock(session_id):
            record = await self.core.store.load(session_id)
            if record is None:
                return []
            state = decode(record)
            due = self.core.runtime.clock() + grace
            cut = [
                card
                for card in state.pending.values()
                if card.kind == "client_exec" and (card.expires_at is None or card.expires_at > due)
            ]
            if not cut:
                return []
            for card in cut:
                card.expires_at = due
            try:
                await self.saving.save(record, state, record.status)
            except ConflictError:  # it changed meanwhile (decided, resumed): nothing to do
                return []
        return [card.tool_call_id for card in cut]

    async def prune(
        self,
        *,
        idle_for: float,
        statuses: Sequence[SessionStatus] = ("completed", "failed"),
    ) -> list[str]:
        """`Engine.prune`: the idle sessions in `statuses`, deleted."""
        cutoff = self.core.runtime.clock() - idle_for
        deleted: list[str] = []
        for status in statuses:
            while page := await self.core.store.list(status=status, updated_before=cutoff):
                for summary in page:
                    if await self.core.store.delete(summary.id):
                        deleted.append(summary.id)
        return deleted
