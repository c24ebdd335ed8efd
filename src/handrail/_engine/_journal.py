"""The journal of a run under an engine: its checkpoints, and the store's tool-call log."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._tool_result import ToolResult
from ..audit import call_entry
from ..exceptions import SessionBusyError
from ..messages import ToolCallPart
from ..recovery import result_record
from ..state import RunState
from ..store import SessionRecord, SessionStore, ToolLogEntry
from ..suspension import args_digest
from ._saving import Saving


class SessionJournal:
    """The journal of a run under an engine: checkpoints and the store's tool-call log."""

    __slots__ = ("logged", "record", "saving", "started_at", "state")

    def __init__(self, saving: Saving, record: SessionRecord, state: RunState) -> None:
        self.saving = saving
        self.record = record
        self.state = state
        self.started_at: dict[str, float] = {}  # log id -> when this process started it
        self.logged: set[str] = set()  # log ids logged `started` with a checkpoint

    async def checkpoint(self, starting: Sequence[tuple[str, ToolCallPart, str]] = ()) -> None:
        if not starting:
            await self.saving.save(self.record, self.state, "active")
            return
        # One write: the session with the calls, the lease checked (and renewed) at the store
        # right before the side effects (a process that lost it to another starts none), and
        # the `started` of those that start now.
        entries = [
            ToolLogEntry(tool_call_id=log_id, key=key, tool=part.name, args=part.args)
            for log_id, part, key in starting
        ]
        await self.saving.save(self.record, self.state, "active", hold=True, started=entries)
        self.logged.update(entry.tool_call_id for entry in entries)

    async def acting(self) -> None:
        drive = self.saving.core.holds.get(self.record.id)
        if drive is not None and not drive.held:
            # Nothing written yet this drive (a resumption whose decided calls run nothing):
            # the lease is taken now, with the session, before a model is called.
            await self.saving.save(self.record, self.state, "active")

    async def started(self, log_id: str, part: ToolCallPart, key: str) -> None:
        saving, session_id = self.saving, self.record.id
        core = saving.core
        if log_id in self.logged:  # logged with the checkpoint just before
            self.logged.discard(log_id)
            self.started_at[log_id] = core.runtime.clock()
            return
        drive = core.holds.get(session_id)
        if drive is not None and not drive.held:  # the drive's first write: a save with it
            entry = ToolLogEntry(tool_call_id=log_id, key=key, tool=part.name, args=part.args)
            await saving.save(self.record, self.state, "active", hold=True, started=[entry])
            self.started_at[log_id] = core.runtime.clock()
            return
        # The lease is checked (and renewed) at the store in the write that logs the call,
        # right before its side effect: a process that lost it to another never starts one.
        if session_id in core.lost:
            raise saving.leases.lost_lease(session_id)
        store, name, args = core.store, part.name, part.args
        lease: tuple[str, float] | None = (core.lease_owner, core.lease_ttl)
        if not core.grouping:  # checked apart, then logged
            await saving.leases.check_lease(session_id)
            lease = None
        try:
            try:
                await _log_started(store, session_id, log_id, key, name, args, lease)
            except SessionBusyError:
                raise
            except Exception as error:
                # Made again after a lost reply, it finds its entry and keeps it (returns False).
                await core.retry(
                    error,
                    lambda: _log_started(store, session_id, log_id, key, name, args, lease),
                    session_id,
                    f"log the start of call {log_id!r}",
                )
        except SessionBusyError:  # the lease is another's: this process acts no more for it
            core.lost.add(session_id)
            raise saving.leases.lost_lease(session_id) from None
        if drive is not None:
            drive.written()
        self.started_at[log_id] = core.runtime.clock()

    async def finished(self, log_id: str, part: ToolCallPart, result: ToolResult) -> None:
        record, now = self.record, self.saving.core.runtime.clock()
        started = self.started_at.pop(log_id, None)
        entry = call_entry(
            result, org_id=record.org_id, session_id=record.id, tool=part.name,
            tool_call_id=log_id, who=record.user_id, at=now,
            args_digest=args_digest(part.name, part.args),
            latency_ms=None if started is None else round((now - started) * 1000, 3),
        )  # fmt: skip
        # The audit entry goes with the result, in its transaction (a repeated result: neither),
        # so made again after a lost reply, it writes nothing twice.
        store, logged = self.saving.core.store, result_record(result)
        try:
            await store.log_finished(record.id, log_id, logged, audit=entry)
        except Exception as error:
            await self.saving.core.retry(
                error,
                lambda: store.log_finished(record.id, log_id, logged, audit=entry),
                record.id,
                f"log the result of call {log_id!r}",
            )


async def _log_started(
    store: SessionStore,
    session_id: str,
    log_id: str,
    key: str,
    tool: str,
    args: dict[str, Any],
    lease: tuple[str, float] | None,
) -> bool:
    if lease is None:
        return await store.log_started(session_id, log_id, key=key, tool=tool, args=args)
    return await store.log_started(session_id, log_id, key=key, tool=tool, args=args, lease=lease)
