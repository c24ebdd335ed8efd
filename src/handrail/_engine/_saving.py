"""Loading a session, in its caller's scope, and saving it: one compare-and-swap a write."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from ..exceptions import (
    ConflictError,
    SessionBusyError,
    SessionCorruptError,
    SessionNotFoundError,
    StoreError,
    UserError,
)
from ..state import RunState
from ..store import SessionRecord, SessionStatus, ToolLogEntry
from ..store._waiting import waiting_cards
from ._core import EngineCore
from ._leases import Leases, Stale, Taken


class Saving:
    """Reads a session for a caller, and writes it back with what goes in the same write."""

    __slots__ = ("core", "leases")

    def __init__(self, core: EngineCore, leases: Leases) -> None:
        self.core = core
        self.leases = leases

    async def load(
        self,
        session_id: str,
        org_id: str | None,
        user_id: str | None = None,
        *,
        create: bool = False,
        any_user: bool = False,
        loaded: tuple[SessionRecord | None] | None = None,
    ) -> tuple[SessionRecord, RunState]:
        # `loaded`: the session as read already (with its lease), else read now.
        record = loaded[0] if loaded is not None else await self.core.store.load(session_id)
        scope = (record.org_id, None if any_user else record.user_id) if record else None
        if scope is not None and scope != (org_id, user_id):
            # Another tenant's session is, to this caller, no session; nor can it be made.
            raise not_found(session_id, org_id, user_id, any_user=any_user)
        if record is None:
            if not create:
                raise not_found(session_id, org_id, user_id, any_user=any_user)
            record = SessionRecord(id=session_id, org_id=org_id, user_id=user_id)
            state = RunState(session_id=session_id, org_id=org_id, user_id=user_id)
            state.domain_state = self.core.domain.new_state()
            return record, state
        if record.window and self.core.runtime.compaction is None:
            # Saved with a compaction summary, loaded without one: the model needs it all.
            # (Messages before the window belong to finished turns: they never change.)
            earlier = await self.core.store.messages(
                session_id, before=record.window, limit=record.window
            )
            record.messages[:0] = [message for _, message in earlier]
            record.messages_from = 0
        state = decode(record)
        record.messages = []  # the state holds them now
        # `sys:` values are not stored: a decision, an amendment or a batch apply made on
        # this state sees the session's scope, as its turn did.
        state.context.update_sys(state.sys_values(self.core.runtime.clock()))
        try:
            state.turn_context = self.core.domain.load_context(state.turn_context)
            state.domain_state = self.core.domain.load_state(state.domain_state)
        except ValidationError as exc:
            state_type = self.core.domain.state_type
            raise StoreError(
                f"Session {session_id!r}: its domain state does not fit "
                f"{state_type.__name__ if state_type else 'the domain'}"
                f" any more ({exc.error_count()} error(s)); migrate it, or delete the session.",
                session_id=session_id,
            ) from None
        return record, state

    def needs_worker(self, state: RunState) -> float | None:
        """When the session next needs a worker (`SessionRecord.expires_at`), if ever.

        A turn in progress needs one now: driven, its lease keeps other workers off; cut off,
        its lease lapses and the first worker to claim it recovers it. A suspended turn needs
        one once every call is decided (now) or at its first card's deadline.
        """
        progress = state.progress
        if progress is None:
            return None
        if progress.status == "running" or not state.pending:
            return self.core.runtime.clock()
        deadlines = [c.expires_at for c in state.pending.values() if c.expires_at is not None]
        return min(deadlines) if deadlines else None

    async def save(
        self,
        record: SessionRecord,
        state: RunState,
        status: SessionStatus,
        *,
        hold: bool = False,
        release: bool = False,
        started: Sequence[ToolLogEntry] = (),
        notify: bool = False,
    ) -> SessionRecord:
        """Compare-and-swap `state` into `record`'s session; `record` follows the new version.

        With the save, in its transaction (docs/durability.md, "What is written, and when"):
        `hold`, the lease checked and renewed (lost: `SessionBusyError`, nothing written);
        `started`, calls logged `started`; `release`, the drive's lease given back (its last
        save: no renewal may follow); `notify`, the store's listeners woken; and the events
        the drive yielded since its last write, where they are logged (`Engine.log_run`).
        """
        if record.id in self.core.lost:
            raise self.leases.lost_lease(record.id)
        drive = self.core.holds.get(record.id)
        first = drive is not None and not drive.held  # the drive's first write takes the lease
        if first:
            hold = True
        if not self.core.grouping and (hold or started or notify):
            return await self.save_apart(record, state, status, hold, started, notify, first)
        extra: dict[str, Any] = {}
        if hold:
            extra["lease"] = (self.core.lease_owner, self.core.lease_ttl)
        if started:
            extra["started"] = started
        if notify:
            extra["notify"] = True
        lease = self.core.holds.get(record.id) if release and self.core.grouping else None
        if lease is not None:
            await lease.stop()  # no renewal from now on: it would take the lease back
            extra["release"] = self.core.lease_owner
        # What changed: the small document, and the messages from the first that may have
        # changed (the turn in progress's first, or the first never saved) on.
        start = state.changed_from()
        record.data = state.dump(messages=False)
        record.messages = state.dump_messages(start)
        record.messages_from = start
        record.window = state.window if self.core.runtime.compaction is not None else 0
        record.status = status
        record.expires_at = self.needs_worker(state)
        # The inbox index's rows for this session, written in the save's transaction.
        record.cards = waiting_cards(state) if status == "suspended" else []
        log = drive.log if drive is not None else None
        if log is not None and log.carried:
            async with log.lock:  # (a group of events going on its own waits, or is waited for)
                events = log.take(last=release)
                if events:
                    extra["events"] = events
                try:
                    saved = await self.write(record, extra, hold=hold, first=first)
                except BaseException:
                    log.put_back(events)
                    raise
                if events:
                    # (A save made though its answer was lost is the stored record: the log's
                    # last number is asked for; nobody else appends under this drive's lease.)
                    last = saved.last_event or await self.core.store.append_events(record.id, [])
                    log.logged(last, events)
        else:
            saved = await self.write(record, extra, hold=hold, first=first)
        if drive is not None:
            if first:
                drive.take()
            drive.written()
        if lease is not None:
            lease.released = True
        record.version = saved.version
        state.mark_saved()
        return saved

    async def write(
        self, record: SessionRecord, extra: dict[str, Any], *, hold: bool, first: bool
    ) -> SessionRecord:
        """`store.save(record, **extra)`, again while it fails for a moment; see `refused`."""
        try:
            try:
                return await self.core.store.save(record, **extra)
            except (SessionBusyError, ConflictError) as error:
                raise self.refused(record.id, error, hold=hold, first=first) from None
            except Exception as error:
                again = lambda: self.save_again(record, extra)  # noqa: E731
                try:
                    return await self.core.retry(error, again, record.id, "save the session")
                except (SessionBusyError, ConflictError) as refused:
                    raise self.refused(record.id, refused, hold=hold, first=first) from None
        finally:
            record.messages = []

    def refused(self, session_id: str, error: Exception, *, hold: bool, first: bool) -> Exception:
        """What a save the store refused raises: nothing was written.

        The drive's first write (`first`): another worker drives the session
        (`SessionBusyError`), or wrote it since this drive read it (`_Stale`: the drive reads
        it again). Later, under the lease (`hold`): this process lost it to another.
        """
        if first:
            if isinstance(error, ConflictError):
                return Stale(str(error), session_id=session_id)
            return Taken(str(error), session_id=session_id)
        if isinstance(error, SessionBusyError) and hold:
            self.core.lost.add(session_id)
            return self.leases.lost_lease(session_id)
        return error

    async def save_apart(
        self,
        record: SessionRecord,
        state: RunState,
        status: SessionStatus,
        hold: bool,
        started: Sequence[ToolLogEntry],
        notify: bool,
        first: bool = False,
    ) -> SessionRecord:
        """`save` for a store that does not group: the same writes, one store call each."""
        session_id = record.id
        drive = self.core.holds.get(session_id)
        if first and drive is not None:
            # The lease taken apart, then the save's compare-and-swap on the version read.
            core = self.core
            store, owner, ttl = core.store, core.lease_owner, core.lease_ttl
            taken = await self.core.retrying(
                lambda: store.acquire_lease(session_id, owner, ttl), session_id, "take the lease"
            )
            if not taken:
                raise Taken("the lease is another's", session_id=session_id)
            drive.take()
        elif hold:
            await self.leases.check_lease(session_id)
        try:
            saved = await self.save(record, state, status)
        except ConflictError as error:
            if first:
                raise Stale(str(error), session_id=session_id) from None
            raise
        for entry in started:
            await self.core.retrying(
                lambda e=entry: self.core.store.log_started(  # type: ignore[misc]
                    session_id, e.tool_call_id, key=e.key, tool=e.tool, args=e.args
                ),
                session_id,
                f"log the start of call {entry.tool_call_id!r}",
            )
        if notify:
            await self.core.store.notify(session_id)
        return saved

    async def save_again(self, record: SessionRecord, extra: dict[str, Any]) -> SessionRecord:
        """`store.save(record)` once more, after a try that failed for a moment.

        That try may have been written all the same, its answer lost on the way (a connection
        that dropped after the commit): a conflict with a write that is exactly this one (the
        version one past, the same status and document) is this save, made (with all it
        carried: its transaction was one).
        """
        try:
            return await self.core.store.save(record, **extra)
        except ConflictError:
            stored = await self.core.store.load(record.id)
            if stored is not None and same_save(stored, record):
                return stored
            raise


def not_found(
    session_id: str, org_id: str | None, user_id: str | None, *, any_user: bool
) -> SessionNotFoundError:
    """No such session in the caller's scope, and how a session is found.

    The same words whether the session is someone else's or nobody's. (The server answers
    its clients with its own, shorter ones: `server/_errors.py`.)
    """
    if any_user:
        return SessionNotFoundError(
            f"No session {session_id!r} in organisation {org_id!r} (the decider's). A "
            f"decider= reaches the sessions of its own organisation: check the session id "
            f"and the decider's org_id.",
            session_id=session_id,
        )
    return SessionNotFoundError(
        f"No session {session_id!r} for this caller (org_id={org_id!r}, user_id={user_id!r}). "
        f"A session is found with the org_id= and user_id= it was created with: pass the "
        f"same ones to submit, resolve, resume and session.",
        session_id=session_id,
    )


def same_save(stored: SessionRecord, record: SessionRecord) -> bool:
    """Whether `stored` is `record`'s save (made, though its answer was lost)."""
    same = stored.version == record.version + 1 and stored.status == record.status
    return same and stored.data == record.data


def decode(record: SessionRecord) -> RunState:
    """The session's state, or a `StoreError` naming the session (the row is left as it is)."""
    try:
        return RunState.load(record.data, messages=record.messages, base=record.messages_from)
    except UserError as exc:
        raise SessionCorruptError(
            f"Session {record.id!r} cannot be read: {exc}. The stored row is left untouched; "
            f"restore it from an export, or delete the session.",
            session_id=record.id,
        ) from None
