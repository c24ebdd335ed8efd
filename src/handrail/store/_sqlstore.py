"""`SqlStore`: the `SessionStore` methods the SQL stores share, over the plans of `_sql`.

A SQL store subclasses it and gives what is its own: its `Dialect` (`_dialect`), its way of
running a plan on its connection (`_execute`), its clock (`_now`), a name for messages
(`_name`) and what it does once a save with `notify=True` has committed (`_notified`). The
rest of what differs between two databases (claims, deletes, loads, the event log's appends,
wake-up subscriptions, migrations) stays in the store, in its dialect's statements.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

from ..audit import AuditEntry, AuditKey, AuditKind, warn_unkeyed
from ._base import SessionRecord, SessionStatus, SessionSummary, ToolLogEntry, WaitingRow
from ._codec import (
    INCARNATION,
    check_audit_page,
    check_calls,
    check_page,
    check_status,
    check_ttl,
    decode_audit,
    encode,
    log_entry_from_row,
    stamped,
    summary_from_row,
)
from ._sql import (
    ARGS,
    SUMMARY,
    Dialect,
    Plan,
    Statement,
    append_audit_plan,
    audit_query,
    import_plan,
    lease_statement,
    list_query,
    log_finished_plan,
    log_started_plan,
    prepare_import,
    prepare_save,
    read_log_statement,
    release_statement,
    save_plan,
    started_row,
)
from ._waiting import check_waiting, row_of, waiting_query

__all__ = ["SqlStore"]

T = TypeVar("T")

LOG_IDS = 500
"""The most ids `tool_log(calls=)` asks for in one statement (one parameter each)."""


class SqlStore:
    """The shared half of `SqliteStore` and `PostgresStore` (see the module)."""

    _dialect: Dialect
    audit_key: AuditKey | None
    _warn_unkeyed: bool

    # -- what a SQL store gives -----------------------------------------------------------

    async def _execute(
        self,
        make: Callable[[], Plan[T]],
        session_id: str | None,
        *,
        write: bool = False,
        transaction: bool | None = None,
    ) -> T:
        """Run the plan `make()` makes: its value, the database's errors as `StoreError`s.

        Args:
            make: makes the plan (again, should the store run it again: a plan runs once).
            session_id: the session named in an error, if any.
            write: whether the plan writes.
            transaction: whether its statements need a transaction of their own (by default,
                a write's do; a single statement needs none).
        """
        raise NotImplementedError

    def _now(self) -> float | None:
        """The time the statements are given (None: the database's own clock)."""
        raise NotImplementedError

    def _name(self) -> str:
        """The store as messages name it."""
        raise NotImplementedError

    def _notified(self, session_id: str) -> None:
        """A save with `notify=True` has committed (`wake`'s statements with it)."""

    def _appended(self, session_id: str, last: int) -> None:
        """A save that appended events has committed: the session's log reaches `last`."""

    # -- helpers --------------------------------------------------------------------------

    async def _rows(self, statement: Statement, session_id: str | None) -> builtins.list[Any]:
        """The rows of one reading statement."""
        return await self._execute(lambda: _rows(statement), session_id)

    def _warn_if_unkeyed(self) -> None:
        """At the first append of a store unkeyed for want of a key, say so."""
        if self._warn_unkeyed:
            self._warn_unkeyed = False
            warn_unkeyed(self._name())

    # -- sessions -------------------------------------------------------------------------

    async def summary(self, session_id: str) -> SessionSummary | None:
        """The session's metadata, never its document; see `SessionStore.summary`."""
        d = self._dialect
        rows = await self._rows(
            Statement(
                f"SELECT {SUMMARY} FROM {d.table('sessions')} WHERE id = {d.param('id')}",
                {"id": session_id},
            ),
            session_id,
        )
        return summary_from_row(rows[0]) if rows else None

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
        """Compare-and-swap on the version; see `SessionStore.save` (the rules: `_sql`).

        `UPDATE ... WHERE id = ? AND version = ?`: of two concurrent saves of one version, the
        second waits for the first's lock, then finds the version moved and changes nothing.
        """
        # Checked and encoded before the await: the caller may change `record` meanwhile.
        prepared = prepare_save(
            record,
            lease=lease,
            release=release,
            started=started,
            notify=notify,
            events=events,
            now=self._now(),
        )
        saved = stamped(record, version=record.version + 1, created_at=0.0, updated_at=0.0)
        if prepared.audit:
            self._warn_if_unkeyed()
        saved.created_at, saved.updated_at, saved.last_event = await self._execute(
            lambda: save_plan(self._dialect, prepared, self.audit_key), record.id, write=True
        )
        if notify:
            self._notified(record.id)
        if saved.last_event:
            self._appended(record.id, saved.last_event)
        return saved

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
        check_page(limit, offset)
        check_status(status)
        query = list_query(
            self._dialect,
            org_id=org_id,
            user_id=user_id,
            status=status,
            updated_after=updated_after,
            updated_before=updated_before,
            limit=limit,
            offset=offset,
        )
        return [summary_from_row(row) for row in await self._rows(query, None)]

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
        """A page of the inbox index, in one query; see `SessionStore.waiting`."""
        check_waiting(limit)
        d = self._dialect
        sql, params = waiting_query(
            d.table("cards"),
            d.positional,
            org_id=org_id,
            after=after,
            limit=limit,
            tool=tool,
            kind=kind,
            session_id=session_id,
            raised_before=raised_before,
            raised_after=raised_after,
            reach=reach,
            exclude_user=exclude_user,
        )
        # The card as the codec decodes it (SQLite's as bytes: text not UTF-8 names the session).
        sql = sql.replace(", card FROM", f", {d.text('card')} FROM", 1)
        return [row_of(row) for row in await self._rows(Statement(sql, params), None)]

    async def due(self, now: float, *, limit: int = 100) -> builtins.list[SessionSummary]:
        """Sessions whose deadline has come, earliest first; see `SessionStore.due`."""
        check_page(limit, 0)
        d = self._dialect
        query = Statement(
            f"""SELECT {SUMMARY} FROM {d.table("sessions")}
            WHERE expires_at IS NOT NULL AND expires_at <= {d.param("now")}
            ORDER BY expires_at, id LIMIT {d.param("limit")}""",
            {"now": now, "limit": limit},
        )
        return [summary_from_row(row) for row in await self._rows(query, None)]

    async def import_(self, document: str, *, overwrite: bool = False) -> SessionRecord:
        """Store an exported session with its logs, in one transaction; see `import_`."""
        prepared = prepare_import(document)
        record = prepared.record
        record.version = await self._execute(
            lambda: import_plan(self._dialect, prepared, overwrite=overwrite), record.id, write=True
        )
        return record

    # -- tool-call log --------------------------------------------------------------------

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
        now = self._now()
        row = started_row(
            session_id, tool_call_id, key, tool, encode(session_id, args, what=ARGS), now
        )
        if lease is not None:
            check_ttl(lease[1])
        return await self._execute(
            lambda: log_started_plan(self._dialect, row, lease, now),
            session_id,
            write=True,
            transaction=lease is not None,
        )

    async def log_finished(
        self,
        session_id: str,
        tool_call_id: str,
        result: dict[str, Any],
        *,
        audit: AuditEntry | None = None,
    ) -> bool:
        """Record a started call's result; see `SessionStore.log_finished`."""
        text = encode(session_id, result, what="tool-call result")
        now = self._now()
        if audit is not None:
            self._warn_if_unkeyed()
        return await self._execute(
            lambda: log_finished_plan(
                self._dialect, session_id, tool_call_id, text, now, audit, self.audit_key
            ),
            session_id,
            write=True,
            transaction=audit is not None,
        )

    async def tool_log(
        self, session_id: str, *, calls: Collection[str] | None = None
    ) -> builtins.list[ToolLogEntry]:
        """The session's logged calls in start order; see `SessionStore.tool_log`.

        With `calls`, one statement through the log's index; past `LOG_IDS` ids (a statement's
        parameters are bounded: 999 on an old SQLite), the whole log is read and kept from.
        """
        wanted = check_calls(calls)
        if wanted == []:
            return []
        keep = None if wanted is None else set(wanted)
        if keep is not None and len(keep) > LOG_IDS:
            wanted = None
        rows = await self._rows(read_log_statement(self._dialect, session_id, wanted), session_id)
        entries = [log_entry_from_row(session_id, row) for row in rows]
        if wanted is None and keep is not None:
            return [entry for entry in entries if entry.tool_call_id in keep]
        return entries

    # -- audit trail ----------------------------------------------------------------------

    async def append_audit(self, entry: AuditEntry) -> AuditEntry:
        """Append to the organisation's trail, chained; see `SessionStore.append_audit`.

        The tail is read and the entry written in one write transaction, the trail locked
        (the dialect's `audit_lock`, or SQLite's one writer) so the chain never forks.
        """
        self._warn_if_unkeyed()
        return await self._execute(
            lambda: append_audit_plan(self._dialect, entry, self.audit_key),
            entry.session_id,
            write=True,
        )

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
        check_audit_page(after, limit, kind, before)
        query = audit_query(
            self._dialect,
            org_id,
            after=after,
            limit=limit,
            session_id=session_id,
            tool=tool,
            kind=kind,
            who=who,
            before=before,
            newest_first=newest_first,
        )
        return [decode_audit(org_id, seq, text) for seq, text in await self._rows(query, None)]

    # -- leases ---------------------------------------------------------------------------

    async def acquire_lease(self, session_id: str, owner: str, ttl: float) -> bool:
        """Take or renew a session's lease; see `SessionStore.acquire_lease`.

        One upsert: of two workers racing for a free or expired lease, the second waits for
        the first's lock and then finds the lease taken.
        """
        check_ttl(ttl)
        lease = lease_statement(self._dialect, session_id, owner, ttl, self._now())
        return await self._execute(
            lambda: _rowcount(lease), session_id, write=True, transaction=False
        )

    async def release_lease(self, session_id: str, owner: str) -> bool:
        """Give a lease back; see `SessionStore.release_lease`."""
        release = release_statement(self._dialect, session_id, owner)
        return await self._execute(
            lambda: _rowcount(release), session_id, write=True, transaction=False
        )

    async def adopt_leases(self, previous: str, owner: str) -> builtins.list[str]:
        """Take over a previous incarnation's leases; see `SessionStore.adopt_leases`."""
        d = self._dialect
        adopt = Statement(
            f"""UPDATE {d.table("leases")} SET owner = {d.param("owner")}
            WHERE length(owner) = {d.param("length")}
                AND substr(owner, 1, {d.param("prefix")}) = {d.param("previous")}
                AND owner <> {d.param("owner")}
            RETURNING session_id""",
            {
                "owner": owner,
                "length": len(previous) + INCARNATION,
                "prefix": len(previous) + 1,
                "previous": previous + "#",
            },
        )
        rows = await self._execute(lambda: _rows(adopt), None, write=True, transaction=False)
        return sorted(row[0] for row in rows)


def _rows(statement: Statement) -> Plan[builtins.list[Any]]:
    """A plan of one statement: its rows."""
    result = yield statement
    return result.rows


def _rowcount(statement: Statement) -> Plan[bool]:
    """A plan of one statement: whether it changed a row."""
    result = yield statement
    return bool(result.rowcount)
