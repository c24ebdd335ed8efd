"""`MemoryStore`: the session store for tests, in a dict.

It keeps what the other stores keep, in the form they keep it: every document is stored as
the same JSON text, so a value the SQLite or PostgreSQL store would refuse is refused here
too, and a caller changing a dict it saved or loaded cannot change what is stored.
"""

from __future__ import annotations

import bisect
import builtins
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any

from ..audit import (
    FROM_ENVIRONMENT,
    AuditEntry,
    AuditKeyOption,
    AuditKind,
    signing_key,
    warn_unkeyed,
)
from ..exceptions import ConflictError, SessionNotFoundError, StoreError
from ._base import (
    Clock,
    SessionRecord,
    SessionStatus,
    SessionSummary,
    ToolLogEntry,
    WaitingCard,
    WaitingRow,
    lease_lost,
    wall_clock,
)
from ._codec import (
    LoggedEvents,
    chain_audit,
    check_audit_page,
    check_calls,
    check_events_page,
    check_messages,
    check_messages_page,
    check_page,
    check_status,
    check_ttl,
    decode,
    decode_audit,
    decode_event,
    decode_message,
    encode,
    encode_events,
    exists_error,
    export_document,
    not_started_error,
    stamped,
)
from ._codec import (
    incarnation_of as _incarnation_of,
)
from ._events import EventNotice, LocalFeed
from ._sql import PreparedSave, prepare_import, prepare_save
from ._waiting import check_waiting, read_card

__all__ = ["MemoryStore"]


@dataclass(kw_only=True, slots=True)
class _Session:
    summary: SessionSummary
    data: str
    window: int = 0
    messages: builtins.list[str] = field(default_factory=builtins.list)  # JSON text, in order
    # The inbox index's rows (its waiting cards, each card as JSON text), while suspended.
    cards: builtins.list[tuple[WaitingCard, str]] = field(default_factory=builtins.list)


@dataclass(kw_only=True, slots=True)
class _Logged:
    entry: ToolLogEntry  # args and result are kept as JSON text below
    args: str
    result: str | None = None


class MemoryStore:
    """A `SessionStore` in memory, for tests: nothing survives the process.

    Every method completes without yielding to the event loop, so each is atomic.

    Args:
        clock: wall time in epoch seconds, for `created_at`/`updated_at`, the tool-call log
            and lease expiry; inject one to test expiry without waiting.
        audit_key: the key the audit trail's hashes are made with (`handrail.audit`); by
            default the one in `HANDRAIL_AUDIT_KEY` (unset: unkeyed, and a warning at the first
            append); None: unkeyed, deliberately.

    Raises:
        ConfigError: `HANDRAIL_AUDIT_KEY` is malformed, or `audit_key` is not a key.
    """

    cross_process_events = False
    """Whether `listen_events` announces the appends of other processes: no."""

    def __init__(
        self, *, clock: Clock = wall_clock, audit_key: AuditKeyOption = FROM_ENVIRONMENT
    ) -> None:
        self.clock = clock
        self.audit_key = signing_key(audit_key)
        """The key the audit trail's hashes are made with (None: unkeyed)."""
        # Unkeyed for want of HANDRAIL_AUDIT_KEY is said at the first append; None is a choice.
        self._warn_unkeyed = audit_key is FROM_ENVIRONMENT and self.audit_key is None
        self._sessions: dict[str, _Session] = {}
        self._logs: dict[str, dict[str, _Logged]] = {}
        self._events: dict[str, builtins.list[tuple[int, str]]] = {}  # events as JSON text
        self._leases: dict[str, tuple[str, float]] = {}
        # org -> its trail: (seq, session, tool, kind, hash, the entry as JSON text)
        self._audit: dict[str, builtins.list[_Audited]] = {}  # '' for no organisation
        self._wakeups: LocalFeed[str] = LocalFeed()
        self._event_feed: LocalFeed[EventNotice] = LocalFeed()
        self._closed = False

    async def __aenter__(self) -> MemoryStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("This MemoryStore is closed: make a new one.")

    async def summary(self, session_id: str) -> SessionSummary | None:
        """The session's metadata; see `SessionStore.summary`."""
        self._check_open()
        stored = self._sessions.get(session_id)
        return None if stored is None else replace(stored.summary)

    async def load(self, session_id: str) -> SessionRecord | None:
        """The session as last saved, or `None`; see `SessionStore.load`."""
        self._check_open()
        stored = self._sessions.get(session_id)
        if stored is None:
            return None
        s = stored.summary
        return SessionRecord(
            id=s.id,
            org_id=s.org_id,
            user_id=s.user_id,
            status=s.status,
            version=s.version,
            created_at=s.created_at,
            updated_at=s.updated_at,
            expires_at=s.expires_at,
            data=decode(session_id, stored.data),
            messages=[
                decode_message(session_id, position, stored.messages[position])
                for position in range(stored.window, len(stored.messages))
            ],
            messages_from=stored.window,
            window=stored.window,
        )

    async def save(
        self,
        record: SessionRecord,
        *,
        lease: tuple[str, float] | None = None,
        release: str | None = None,
        started: Sequence[ToolLogEntry] = (),
        notify: bool = False,
        events: Sequence[dict[str, Any]] = (),
    ) -> SessionRecord:
        """Compare-and-swap on the version; see `SessionStore.save`."""
        self._check_open()
        # The checks and the rows every store writes (`_sql`), then this store's own writes.
        prepared = prepare_save(
            record, lease=lease, release=release, started=started, notify=notify, events=events
        )
        if lease is not None and not self._may_hold(record.id, lease[0]):
            raise lease_lost(record.id, lease[0])
        stored = self._sessions.get(record.id)
        actual = None if stored is None else stored.summary.version
        if actual != record.version and not (actual is None and record.version == 0):
            raise ConflictError(record.id, expected=record.version, actual=actual)
        history = [] if stored is None else stored.messages
        check_messages(prepared.record, len(history))
        audited = self._chained(prepared.audit)  # a bad entry fails the save before any change
        cards = _indexed(prepared, stored)
        del history[record.messages_from :]  # what the save replaces; the rest is kept
        history.extend(prepared.messages)
        now = self.clock()
        saved = stamped(
            record,
            version=record.version + 1,
            created_at=now if stored is None else stored.summary.created_at,
            updated_at=now,
        )
        self._sessions[record.id] = _Session(
            summary=saved.summary(),
            data=prepared.data,
            window=record.window,
            messages=history,
            cards=cards,
        )
        for org, row, _ in audited:  # no await since the checks: the save and these are one
            self._audit.setdefault(org, []).append(row)
        for entry, args in prepared.started:
            self._log_started(record.id, entry.tool_call_id, entry.key, entry.tool, args)
        if lease is not None:
            self._leases[record.id] = (lease[0], now + lease[1])
        if release is not None and self._leases.get(record.id, ("",))[0] == release:
            del self._leases[record.id]
        if notify:
            self._wakeups.publish(record.id)
        if prepared.events:
            log = self._events.setdefault(record.id, [])
            last = log[-1][0] if log else 0
            log.extend(enumerate(prepared.events, last + 1))
            saved.last_event = last + len(prepared.events)
            self._event_feed.publish((record.id, saved.last_event))
        return saved

    async def messages(
        self, session_id: str, *, before: int | None = None, limit: int = 100
    ) -> builtins.list[tuple[int, dict[str, Any]]]:
        """A page of the stored history, oldest first; see `SessionStore.messages`."""
        self._check_open()
        check_messages_page(before, limit)
        stored = self._sessions.get(session_id)
        history = [] if stored is None else stored.messages
        stop = len(history) if before is None else min(before, len(history))
        start = max(stop - limit, 0)
        return [
            (position, decode_message(session_id, position, history[position]))
            for position in range(start, stop)
        ]

    async def list(
        self,
        *,
        org_id: str | None = None,
        user_id: str | None = None,
        status: SessionStatus | None = None,
        updated_after: float | None = None,
        updated_before: float | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> builtins.list[SessionSummary]:
        """Sessions matching every filter, newest first; see `SessionStore.list`."""
        self._check_open()
        check_page(limit, offset)
        check_status(status)
        found = [
            s
            for s in (stored.summary for stored in self._sessions.values())
            if (org_id is None or s.org_id == org_id)
            and (user_id is None or s.user_id == user_id)
            and (status is None or s.status == status)
            and (updated_after is None or s.updated_at > updated_after)
            and (updated_before is None or s.updated_at < updated_before)
        ]
        found.sort(key=lambda s: (s.updated_at, s.id), reverse=True)
        return [replace(s) for s in found[offset : offset + limit]]

    async def waiting(
        self,
        *,
        org_id: str | None,
        after: tuple[float, str, int] | None = None,
        limit: int = 100,
        tool: str | None = None,
        kind: str | None = None,
        session_id: str | None = None,
        raised_before: float | None = None,
        raised_after: float | None = None,
        reach: tuple[str | None, frozenset[str]] | None = None,
        exclude_user: str | None = None,
    ) -> builtins.list[WaitingRow]:
        """A page of the inbox index; see `SessionStore.waiting`."""
        self._check_open()
        check_waiting(limit)
        keyed: builtins.list[tuple[tuple[float, str, int], SessionSummary, int, WaitingCard, str]]
        keyed = []
        for stored in self._sessions.values():
            s = stored.summary
            if not stored.cards or (org_id is not None and s.org_id != org_id):
                continue
            if (session_id is not None and s.id != session_id) or (
                exclude_user is not None and s.user_id == exclude_user
            ):
                continue
            for position, (card, text) in enumerate(stored.cards):
                raised = card.created_at
                if (
                    (tool is not None and card.tool != tool)
                    or (kind is not None and card.kind != kind)
                    or (raised_before is not None and (raised is None or raised > raised_before))
                    or (raised_after is not None and (raised is None or raised <= raised_after))
                ):
                    continue
                if reach is not None and not (
                    s.user_id is None
                    or (reach[0] is not None and s.user_id == reach[0])
                    or card.tool in reach[1]
                    or card.kind == "batch"
                ):
                    continue
                keyed.append(((s.updated_at, s.id, -position), s, position, card, text))
        keyed.sort(key=lambda row: row[0], reverse=True)
        if after is not None:
            bound = (after[0], after[1], -after[2])
            keyed = [row for row in keyed if row[0] < bound]
        return [
            WaitingRow(
                session=replace(s),
                position=position,
                card=read_card(s.id, c.tool_call_id, c.tool, c.kind, c.agent, c.created_at, text),
            )
            for _, s, position, c, text in keyed[:limit]
        ]

    async def due(self, now: float, *, limit: int = 100) -> builtins.list[SessionSummary]:
        """Sessions whose deadline has come, earliest first; see `SessionStore.due`."""
        self._check_open()
        check_page(limit, 0)
        found = [
            s
            for s in (stored.summary for stored in self._sessions.values())
            if s.expires_at is not None and s.expires_at <= now
        ]
        found.sort(key=lambda s: (s.expires_at, s.id))
        return [replace(s) for s in found[:limit]]

    async def claim(
        self, now: float, owner: str, ttl: float, *, limit: int = 100
    ) -> builtins.list[SessionSummary]:
        """Take the leases of sessions that need a worker; see `SessionStore.claim`."""
        self._check_open()
        check_page(limit, 0)
        check_ttl(ttl)
        at = self.clock()
        claimed: builtins.list[SessionSummary] = []
        for summary in await self.due(now, limit=len(self._sessions) or 1):
            if len(claimed) == limit:
                break
            held = self._leases.get(summary.id)
            if held is not None and held[0] != owner and held[1] > at:
                continue  # a live worker drives it
            self._leases[summary.id] = (owner, at + ttl)
            claimed.append(summary)
        return claimed

    async def delete(self, session_id: str) -> bool:
        """Delete a session, its logs and its lease; see `SessionStore.delete`."""
        self._check_open()
        self._logs.pop(session_id, None)
        self._events.pop(session_id, None)
        self._leases.pop(session_id, None)
        return self._sessions.pop(session_id, None) is not None

    async def export(self, session_id: str) -> str:
        """The session and its logs as one JSON document; see `SessionStore.export`."""
        record = await self.load(session_id)
        if record is None:
            raise SessionNotFoundError(
                f"Cannot export session {session_id!r}: there is none.", session_id=session_id
            )
        events = await self.events(session_id, limit=len(self._events.get(session_id, ())))
        history = await self.messages(session_id, limit=len(self._sessions[session_id].messages))
        return export_document(
            record, await self.tool_log(session_id), events, [m for _, m in history]
        )

    async def import_(self, document: str, *, overwrite: bool = False) -> SessionRecord:
        """Store an exported session with its logs; see `SessionStore.import_`."""
        self._check_open()
        prepared = prepare_import(document)
        record = prepared.record
        stored = self._sessions.get(record.id)
        if stored is not None:
            if not overwrite:
                raise exists_error(record.id, stored.summary.version)
            record.version = max(record.version, stored.summary.version) + 1
        self._sessions[record.id] = _Session(
            summary=record.summary(),
            data=prepared.data,
            window=record.window,
            messages=prepared.messages,
            cards=[
                (card, text) for card, text in zip(prepared.cards, prepared.card_texts, strict=True)
            ],
        )
        self._logs[record.id] = {
            row["tool_call_id"]: _Logged(entry=e, args=row["args"], result=row["result"])
            for e, row in zip(prepared.entries, prepared.log, strict=True)
        }
        self._events[record.id] = prepared.events
        return record

    async def log_started(
        self,
        session_id: str,
        tool_call_id: str,
        *,
        key: str,
        tool: str,
        args: dict[str, Any],
        lease: tuple[str, float] | None = None,
    ) -> bool:
        """Record a call before it runs, never overwriting; see `SessionStore.log_started`."""
        self._check_open()
        text = encode(session_id, args, what="tool-call arguments")
        if lease is not None:
            check_ttl(lease[1])
            if not self._may_hold(session_id, lease[0]):
                raise lease_lost(session_id, lease[0])
            self._leases[session_id] = (lease[0], self.clock() + lease[1])
        return self._log_started(session_id, tool_call_id, key, tool, text)

    def _log_started(
        self, session_id: str, tool_call_id: str, key: str, tool: str, args: str
    ) -> bool:
        log = self._logs.setdefault(session_id, {})
        if tool_call_id in log:
            return False
        entry = ToolLogEntry(
            tool_call_id=tool_call_id, key=key, tool=tool, args={}, started_at=self.clock()
        )
        log[tool_call_id] = _Logged(entry=entry, args=args)
        return True

    def _may_hold(self, session_id: str, owner: str) -> bool:
        """Whether `owner` may take or renew the session's lease now."""
        held = self._leases.get(session_id)
        return held is None or held[0] == owner or held[1] <= self.clock()

    async def log_finished(
        self,
        session_id: str,
        tool_call_id: str,
        result: dict[str, Any],
        *,
        audit: AuditEntry | None = None,
    ) -> bool:
        """Record a started call's result; see `SessionStore.log_finished`."""
        self._check_open()
        text = encode(session_id, result, what="tool-call result")
        logged = self._logs.get(session_id, {}).get(tool_call_id)
        if logged is None:
            raise not_started_error(session_id, tool_call_id)
        if logged.entry.status == "finished":
            return False
        if audit is not None:
            await self.append_audit(audit)  # no await inside: the two happen together
        logged.entry.status = "finished"
        logged.entry.finished_at = self.clock()
        logged.result = text
        return True

    async def tool_log(
        self, session_id: str, *, calls: Collection[str] | None = None
    ) -> builtins.list[ToolLogEntry]:
        """The session's logged calls in start order; see `SessionStore.tool_log`."""
        self._check_open()
        wanted = check_calls(calls)
        log = self._logs.get(session_id, {})
        keep = None if wanted is None else set(wanted)
        # In start order (the dict's), and only the kept ones decoded.
        found = [logged for call, logged in log.items() if keep is None or call in keep]
        return [
            replace(
                logged.entry,
                args=decode(session_id, logged.args, what="tool-call arguments"),
                result=None
                if logged.result is None
                else decode(session_id, logged.result, what="tool-call result"),
            )
            for logged in found
        ]

    async def append_events(self, session_id: str, events: builtins.list[dict[str, Any]]) -> int:
        """Number and append events; see `SessionStore.append_events`."""
        self._check_open()
        texts = encode_events(session_id, events)
        log = self._events.setdefault(session_id, [])
        last = log[-1][0] if log else 0
        log.extend(enumerate(texts, last + 1))
        if texts:
            self._event_feed.publish((session_id, last + len(texts)))
        return last + len(texts)

    async def events(self, session_id: str, *, after: int = 0, limit: int = 1000) -> LoggedEvents:
        """The events numbered above `after`, in order; see `SessionStore.events`."""
        self._check_open()
        check_events_page(after, limit)
        log = self._events.get(session_id, [])
        start = bisect.bisect_right(log, after, key=lambda logged: logged[0])
        return [
            (seq, decode_event(session_id, seq, text)) for seq, text in log[start : start + limit]
        ]

    # -- audit trail ----------------------------------------------------------------------

    async def append_audit(self, entry: AuditEntry) -> AuditEntry:
        """Append to the organisation's trail, chained; see `SessionStore.append_audit`."""
        self._check_open()
        ((org, row, chained),) = self._chained([entry])
        self._audit.setdefault(org, []).append(row)
        return chained

    def _chained(
        self, entries: builtins.list[AuditEntry]
    ) -> builtins.list[tuple[str, _Audited, AuditEntry]]:
        """`entries` chained at the ends of their organisations' trails, not yet appended."""
        tails: dict[str, tuple[int, str] | None] = {}
        chained: builtins.list[tuple[str, _Audited, AuditEntry]] = []
        if entries and self._warn_unkeyed:
            self._warn_unkeyed = False
            warn_unkeyed("This MemoryStore")
        for entry in entries:
            org = entry.org_id or ""
            if org not in tails:
                trail = self._audit.get(org)
                tails[org] = (trail[-1].seq, trail[-1].hash) if trail else None
            done, text = chain_audit(entry, tails[org], self.audit_key)
            tails[org] = (done.seq, done.hash)
            row = _Audited(
                done.seq, done.session_id, done.tool, done.kind, done.hash, text, done.who
            )
            chained.append((org, row, done))
        return chained

    async def audit(
        self,
        org_id: str | None,
        *,
        after: int = 0,
        limit: int = 100,
        session_id: str | None = None,
        tool: str | None = None,
        kind: AuditKind | None = None,
        who: str | None = None,
        before: int | None = None,
        newest_first: bool = False,
    ) -> builtins.list[AuditEntry]:
        """The organisation's entries after `after`, in order; see `SessionStore.audit`."""
        self._check_open()
        check_audit_page(after, limit, kind, before)
        found: builtins.list[AuditEntry] = []
        trail = self._audit.get(org_id or "", [])
        for row in reversed(trail) if newest_first else trail:
            if len(found) >= limit:
                break
            if (
                row.seq > after
                and (before is None or row.seq < before)
                and (session_id is None or row.session_id == session_id)
                and (tool is None or row.tool == tool)
                and (kind is None or row.kind == kind)
                and (who is None or row.who == who)
            ):
                found.append(decode_audit(org_id, row.seq, row.text))
        return found

    async def acquire_lease(self, session_id: str, owner: str, ttl: float) -> bool:
        """Take or renew a session's lease; see `SessionStore.acquire_lease`."""
        self._check_open()
        check_ttl(ttl)
        now = self.clock()
        held = self._leases.get(session_id)
        if held is not None and held[0] != owner and held[1] > now:
            return False
        self._leases[session_id] = (owner, now + ttl)
        return True

    async def release_lease(self, session_id: str, owner: str) -> bool:
        """Give a lease back; see `SessionStore.release_lease`."""
        self._check_open()
        held = self._leases.get(session_id)
        if held is None or held[0] != owner:
            return False
        del self._leases[session_id]
        return True

    async def adopt_leases(self, previous: str, owner: str) -> builtins.list[str]:
        """Take over a previous incarnation's leases; see `SessionStore.adopt_leases`."""
        self._check_open()
        adopted = [
            session_id
            for session_id, (holder, _) in self._leases.items()
            if _incarnation_of(holder, previous) and holder != owner
        ]
        for session_id in adopted:
            self._leases[session_id] = (owner, self._leases[session_id][1])
        return sorted(adopted)

    async def notify(self, session_id: str) -> None:
        """Wake every listener of this store; see `SessionStore.notify`."""
        self._check_open()
        self._wakeups.publish(session_id)

    def listen(self) -> AbstractAsyncContextManager[AsyncIterator[str]]:
        """Subscribe to wake-ups; see `SessionStore.listen`."""
        self._check_open()
        return self._wakeups.subscribe()

    def listen_events(self) -> AbstractAsyncContextManager[AsyncIterator[EventNotice]]:
        """Subscribe to event-log appends; see `SessionStore.listen_events`."""
        return self._event_feed.subscribe()

    async def close(self) -> None:
        """Forget everything and end every subscription."""
        self._closed = True
        self._event_feed.close()
        self._wakeups.close()
        self._sessions.clear()
        self._logs.clear()
        self._events.clear()
        self._leases.clear()
        self._audit.clear()


@dataclass(slots=True)
class _Audited:
    """An audit entry as kept: its indexed fields and its JSON text (which tests may edit)."""

    seq: int
    session_id: str
    tool: str
    kind: str
    hash: str
    text: str
    who: str | None = None


def _indexed(save: PreparedSave, stored: _Session | None) -> builtins.list[tuple[WaitingCard, str]]:
    """The inbox rows a save leaves: its cards, the stored ones (moved along), or none."""
    if not save.indexed:
        return []
    if save.cards_change == "move":
        return [] if stored is None else stored.cards
    cards = save.cards or []
    return [(replace(c, card={}), t) for c, t in zip(cards, save.card_texts, strict=True)]
