"""`SqliteStore`: the embedded default session store, one SQLite file.

Every blocking call runs in one thread that the store owns, on the one connection that
thread opened (see `_thread.py`): the event loop only hands it jobs. The file is in WAL mode,
so readers in other processes never wait for a writer, and several processes may share it
(compare-and-swap and leases hold across processes).
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import functools
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, ClassVar, Literal, TypeVar

try:
    import fcntl
except ImportError:  # (not on Windows: the claims are then this process's only)
    fcntl = None  # type: ignore[assignment]

from ..audit import (
    FROM_ENVIRONMENT,
    AuditKeyOption,
    signing_key,
)
from ..exceptions import SessionNotFoundError, StoreError, StoreUnavailableError
from ._base import (
    Clock,
    SessionRecord,
    SessionSummary,
    ToolLogEntry,
    WaitingCard,
    wall_clock,
)
from ._codec import (
    LoggedEvents,
    check_events_page,
    check_messages_page,
    check_page,
    check_ttl,
    decode_event,
    decode_message,
    encode_events,
    export_document,
    log_entry_from_row,
    record_from_row,
    summary_from_row,
)
from ._events import EventNotice, LocalFeed
from ._sql import (
    SESSION_TABLES,
    Dialect,
    Plan,
    Result,
    Statement,
    build_index_plan,
    claimable_statement,
    lease_statement,
    read_log_statement,
)
from ._sqlstore import SqlStore
from ._thread import ConnectionThread, Outcome
from ._waiting import (
    COLUMNS,
    card_rows,
)

__all__ = ["SqliteStore"]

_log = logging.getLogger("handrail.store")

T = TypeVar("T")

SCHEMA_VERSION = 6
"""The version of the database schema this code reads and writes. One line a bump:

1: sessions, tool-call log, leases, wake-ups.
2: the event log, `handrail_events`.
3: messages apart, one row a message (`handrail_messages`), and the sessions' `window_start`.
4: the audit trail, `handrail_audit` (per organisation, hash-chained; never pruned).
5: the inbox index, `handrail_cards` (one row a waiting card), built from the suspended
   sessions (`BACKFILLS`).
6: the audit trail's `who`, a column of its own with an index (org_id, who, kind, seq),
   filled from the stored entries (`BACKFILLS`).
"""

MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE handrail_sessions (
            id TEXT PRIMARY KEY,
            org_id TEXT,
            user_id TEXT,
            status TEXT NOT NULL
                CHECK (status IN ('active', 'suspended', 'completed', 'failed')),
            version INTEGER NOT NULL CHECK (version > 0),
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            expires_at REAL,
            data TEXT NOT NULL
        )""",
        # Every save moves updated_at in each index below, so there are only those that let
        # list() read its page in order: by org, org and user, status, or nothing (and time).
        # By user alone (rare: scope starts at the org) it walks the updated_at index. The
        # tool-call log is read through its unique (session_id, tool_call_id) index, a
        # session's few entries sorted by seq.
        "CREATE INDEX handrail_sessions_updated ON handrail_sessions (updated_at, id)",
        """CREATE INDEX handrail_sessions_org_user
            ON handrail_sessions (org_id, user_id, updated_at, id)""",
        "CREATE INDEX handrail_sessions_org ON handrail_sessions (org_id, updated_at, id)",
        "CREATE INDEX handrail_sessions_status ON handrail_sessions (status, updated_at, id)",
        """CREATE INDEX handrail_sessions_expires ON handrail_sessions (expires_at, id)
            WHERE expires_at IS NOT NULL""",
        """CREATE TABLE handrail_tool_log (
            seq INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL,
            tool_call_id TEXT NOT NULL,
            key TEXT NOT NULL,
            tool TEXT NOT NULL,
            args TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('started', 'finished')),
            result TEXT,
            started_at REAL NOT NULL,
            finished_at REAL,
            UNIQUE (session_id, tool_call_id)
        )""",
        """CREATE TABLE handrail_leases (
            session_id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            expires_at REAL NOT NULL
        )""",
        # AUTOINCREMENT: a listener remembers the last seq it saw, so seqs are never reused,
        # even after pruning has emptied the table.
        """CREATE TABLE handrail_wakeups (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id TEXT NOT NULL,
            created_at REAL NOT NULL
        )""",
    ),
    2: (
        """CREATE TABLE handrail_events (
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL CHECK (seq > 0),
            event TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        ) WITHOUT ROWID""",
    ),
    3: (
        """CREATE TABLE handrail_messages (
            session_id TEXT NOT NULL,
            position INTEGER NOT NULL CHECK (position >= 0),
            message TEXT NOT NULL,
            PRIMARY KEY (session_id, position)
        ) WITHOUT ROWID""",
        "ALTER TABLE handrail_sessions ADD COLUMN window_start INTEGER NOT NULL DEFAULT 0",
    ),
    # org_id '' stands for "no organisation" (NULL cannot be in a primary key). The entry's
    # JSON text is what is hashed and read back; the other columns only index it.
    4: (
        """CREATE TABLE handrail_audit (
            org_id TEXT NOT NULL,
            seq INTEGER NOT NULL CHECK (seq > 0),
            kind TEXT NOT NULL,
            session_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            hash TEXT NOT NULL,
            entry TEXT NOT NULL,
            PRIMARY KEY (org_id, seq)
        ) WITHOUT ROWID""",
        "CREATE INDEX handrail_audit_session ON handrail_audit (org_id, session_id, seq)",
    ),
    # The inbox index: a suspended session's waiting cards, written with each save. A row
    # carries its session's summary too, so a page is read off one index without a join.
    5: (
        """CREATE TABLE handrail_cards (
            session_id TEXT NOT NULL,
            org_id TEXT,
            user_id TEXT,
            version INTEGER NOT NULL,
            session_created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            expires_at REAL,
            position INTEGER NOT NULL CHECK (position >= 0),
            tool_call_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            kind TEXT NOT NULL,
            agent TEXT,
            created_at REAL,
            card TEXT NOT NULL,
            PRIMARY KEY (session_id, position)
        ) WITHOUT ROWID""",
        """CREATE INDEX handrail_cards_org
            ON handrail_cards (org_id, updated_at DESC, session_id DESC, position)""",
        """CREATE INDEX handrail_cards_tool
            ON handrail_cards (org_id, tool, updated_at DESC, session_id DESC, position)""",
    ),
    # Who decided (or whose session ran the call): one person's decisions are read off the
    # index, newest first, without reading the organisation's trail.
    6: (
        "ALTER TABLE handrail_audit ADD COLUMN who TEXT",
        "CREATE INDEX handrail_audit_who ON handrail_audit (org_id, who, kind, seq)",
    ),
}

_SUMMARY = "id, org_id, user_id, status, version, created_at, updated_at, expires_at"
_WAKEUPS_KEPT_FOR = 60.0  # seconds; a listener that polls less often than this may miss some
CHECKPOINT_AFTER = 1024
"""Rows written since the last wake-up after which the checkpointer copies the write-ahead
log back into the database (see `_Checkpoints`)."""
CHECKPOINT_ROUNDS = 4
"""Checkpoints the checkpointer makes at most per wake-up, each copying what was written
during the one before."""
WAL_FRAMES_MAX = 2048
"""Pages in the write-ahead log (8 MB at SQLite's 4 KB pages) at which the store's thread
copies it back itself, between jobs: under writes that never pause, the log is still bounded."""


class SqliteStore(SqlStore):
    """A `SessionStore` in one SQLite file: the embedded default.

    The file and its schema are created on first use. All blocking work happens in one
    thread the store owns; `close()` (or `async with`) ends it.

    Args:
        path: the database file; `handrail.db` in the working directory unless given.
        clock: wall time in epoch seconds, for timestamps and lease expiry.
        synchronous: `"NORMAL"` (the default, SQLite's advice for WAL mode) is safe against
            a process crash (`kill -9`, a deploy) and never corrupt; only a power cut or an
            OS crash may lose the last commits. `"FULL"` also syncs the write-ahead log to
            disk at every commit, so a commit survives a power cut too, for about 0.2-0.3 ms
            more per write (a turn makes several).
        busy_timeout: how long (seconds) a write waits for another process's lock before it
            fails with a `StoreError`.
        poll_interval: how often (seconds) `listen()` looks for other processes' wake-ups
            (wake-ups from this store arrive at once).
        audit_key: the key the audit trail's hashes are made with (`handrail.audit`); by
            default the one in `HANDRAIL_AUDIT_KEY` (unset: unkeyed, and a warning at the first
            append); None: unkeyed, deliberately. Held by this process only, never written to
            the file.

    Raises:
        ConfigError: `HANDRAIL_AUDIT_KEY` is malformed, or `audit_key` is not a key.
    """

    cross_process_events = False
    """Whether `listen_events` announces the appends of other processes: no."""

    def __init__(
        self,
        path: str | os.PathLike[str] = "handrail.db",
        *,
        clock: Clock = wall_clock,
        synchronous: Literal["FULL", "NORMAL"] = "NORMAL",
        busy_timeout: float = 5.0,
        poll_interval: float = 0.1,
        audit_key: AuditKeyOption = FROM_ENVIRONMENT,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be 'FULL' or 'NORMAL', not {synchronous!r}")
        self.audit_key = signing_key(audit_key)
        """The key the audit trail's hashes are made with (None: unkeyed)."""
        # Unkeyed for want of HANDRAIL_AUDIT_KEY is said at the first append; None is a choice.
        self._warn_unkeyed = audit_key is FROM_ENVIRONMENT and self.audit_key is None
        self.path = os.fspath(path)
        self.clock = clock
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        self.poll_interval = poll_interval
        self._thread: ConnectionThread[sqlite3.Connection] | None = None
        self._starting = asyncio.Lock()
        self._closed = False
        self._subscriptions: set[_Subscription] = set()
        self._appends: _Appends | None = None  # appends waiting to commit together
        self._event_feed: LocalFeed[EventNotice] = LocalFeed()
        self._dialect = _DIALECT

    async def __aenter__(self) -> SqliteStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def thread_ident(self) -> int | None:
        """The `threading.get_ident()` of the thread doing the store's SQLite work, if any."""
        return None if self._thread is None else self._thread.ident

    # -- plumbing -------------------------------------------------------------------------

    async def _call(
        self,
        job: Callable[[sqlite3.Connection], T],
        session_id: str | None,
        *,
        write: bool = False,
    ) -> T:
        """Run `job` in the store's thread (`write`: a write, grouped by `_commit_together`)."""
        thread = self._thread or await self._start()
        try:
            return await thread.run(job, write=write)
        except sqlite3.Error as error:
            raise self._error(error, session_id) from error

    async def _start(self) -> ConnectionThread[sqlite3.Connection]:
        async with self._starting:
            if self._closed:
                raise StoreError(f"This SqliteStore ({self.path}) is closed: make a new one.")
            if self._thread is None:
                # (A database in memory has no write-ahead log to copy back.)
                checkpoints = None
                if self.path != ":memory:":
                    checkpoints = _Checkpoints(self.path, self.synchronous)

                def close(db: sqlite3.Connection) -> None:
                    if checkpoints is not None:  # first: the last connection removes the log
                        checkpoints.stop()
                    db.close()

                thread = ConnectionThread(
                    self._connect,
                    close,
                    name=f"handrail-sqlite {self.path}",
                    group=_commit_together,
                    between=checkpoints,
                )
                try:
                    await thread.run(_nothing)  # raises what opening the database raised
                except BaseException:
                    thread.stop_soon()
                    raise
                self._thread = thread
            return self._thread

    def _connect(self) -> sqlite3.Connection:  # in the store's thread
        try:
            # isolation_level=None: no implicit BEGIN; transactions below are explicit.
            connection = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
        except sqlite3.Error as error:
            raise self._error(error, None) from error
        try:
            # Switching a new file to WAL while another connection does the same fails at once
            # with "database is locked" (SQLite's busy handler does not cover it), so retry.
            mode = self._retry_busy(
                lambda: connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            )
            if mode != "wal" and self.path != ":memory:":
                raise StoreError(
                    f"SQLite database {self.path!r} cannot use WAL mode (journal_mode is "
                    f"{mode!r}): put it on a local file system."
                )
            connection.execute(f"PRAGMA synchronous={self.synchronous}")
            # No checkpoint inside a commit (SQLite's default, at 1000 pages of log): a
            # thread of the store's own checkpoints instead (`_Checkpoints`).
            connection.execute("PRAGMA wal_autocheckpoint=0")
            # Statement journals (and temporary tables) in memory, not in a temporary file: a
            # save's journal in a file cost it about as much again as the save itself.
            connection.execute("PRAGMA temp_store=MEMORY")
            self._retry_busy(lambda: migrate(connection, self.clock()))
        except BaseException as error:
            connection.close()
            if isinstance(error, sqlite3.Error):
                raise self._error(error, None) from error
            raise
        return connection

    def _retry_busy(self, step: Callable[[], T]) -> T:  # in the store's thread
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                return step()
            except sqlite3.OperationalError as error:
                if not _busy(error) or time.monotonic() >= deadline:
                    raise
            time.sleep(0.005)

    def _error(self, error: sqlite3.Error, session_id: str | None) -> StoreError:
        where = f"session {session_id!r} in " if session_id else ""
        hint = ""
        if "unable to open" in str(error):
            hint = " Check that the file's directory exists and is writable, or pass another path=."
        elif isinstance(error, sqlite3.OperationalError) and "locked" in str(error):
            hint = (
                f" Another process held the database longer than busy_timeout "
                f"({self.busy_timeout} s): raise busy_timeout= or shorten that process's "
                f"transactions."
            )
        elif "not a database" in str(error):
            hint = " The file is not a SQLite database: pass another path=."
        message = f"SQLite store failed on {where}{self.path!r}: {error}.{hint}"
        if _busy(error):  # another process holds the lock: the same write may go through later
            return StoreUnavailableError(message, session_id=session_id)
        return StoreError(message, session_id=session_id)

    async def _execute(
        self,
        make: Callable[[], Plan[T]],
        session_id: str | None,
        *,
        write: bool = False,
        transaction: bool | None = None,
    ) -> T:
        """Run a plan in the store's thread; see `SqlStore._execute`.

        A write is a job of a group commit (`_commit_together`), which may run it again: the
        plan is made anew each time.
        """
        alone = not (write if transaction is None else transaction)
        return await self._call(lambda db: _write(db, make(), alone=alone), session_id, write=write)

    def _now(self) -> float:
        return self.clock()

    def _name(self) -> str:
        return f"SqliteStore({self.path!r})"

    def _appended(self, session_id: str, last: int) -> None:
        self._event_feed.publish((session_id, last))

    def _notified(self, session_id: str) -> None:
        self._nudge()

    # -- sessions -------------------------------------------------------------------------

    async def load(self, session_id: str) -> SessionRecord | None:
        """The session as last saved, or `None`; see `SessionStore.load`."""

        def load(db: sqlite3.Connection) -> SessionRecord | None:
            with _transaction(db, "BEGIN"):  # one snapshot for the document and the messages
                return _load(db, session_id)

        return await self._call(load, session_id)

    async def messages(
        self, session_id: str, *, before: int | None = None, limit: int = 100
    ) -> builtins.list[tuple[int, dict[str, Any]]]:
        """A page of the stored history, oldest first; see `SessionStore.messages`."""
        check_messages_page(before, limit)
        return await self._call(
            lambda db: _read_messages(db, session_id, 0, before, limit), session_id
        )

    async def claim(
        self, now: float, owner: str, ttl: float, *, limit: int = 100
    ) -> builtins.list[SessionSummary]:
        """Take the leases of sessions that need a worker; see `SessionStore.claim`.

        One write transaction: SQLite lets one writer in at a time, so two processes never
        claim one session.
        """
        check_page(limit, 0)
        check_ttl(ttl)
        at = self.clock()
        columns = ", ".join(f"s.{c}" for c in _SUMMARY.split(", "))
        sql = f"""SELECT {columns} FROM handrail_sessions s
            LEFT JOIN handrail_leases l ON l.session_id = s.id
            WHERE s.expires_at IS NOT NULL AND s.expires_at <= ?
                AND (l.session_id IS NULL OR l.owner = ? OR l.expires_at <= ?)
            ORDER BY s.expires_at, s.id LIMIT ?"""

        def claim(db: sqlite3.Connection) -> list[Any]:
            with _transaction(db):
                rows = db.execute(sql, (now, owner, at, limit)).fetchall()
                leases = [lease_statement(_DIALECT, row[0], owner, ttl, at) for row in rows]
                if leases:
                    db.executemany(leases[0].sql, [lease.params for lease in leases])
            return rows

        return [summary_from_row(row) for row in await self._call(claim, None, write=True)]

    async def delete(self, session_id: str) -> bool:
        """Delete a session, its logs and its lease; see `SessionStore.delete`."""

        def delete(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                for table in SESSION_TABLES:
                    db.execute(f"DELETE FROM handrail_{table} WHERE session_id = ?", (session_id,))
                return bool(
                    db.execute("DELETE FROM handrail_sessions WHERE id = ?", (session_id,)).rowcount
                )

        return await self._call(delete, session_id, write=True)

    async def export(self, session_id: str) -> str:
        """The session and its logs as one JSON document; see `SessionStore.export`."""

        def export(db: sqlite3.Connection) -> str | None:
            with _transaction(db, "BEGIN"):  # one snapshot for the session and its logs
                row = _session_row(db, session_id)
                if row is None:
                    return None
                return export_document(
                    record_from_row(row),
                    _read_log(db, session_id),
                    _read_events(db, session_id, after=0, limit=-1),
                    [m for _, m in _read_messages(db, session_id, 0, None, -1)],
                )

        document = await self._call(export, session_id)
        if document is None:
            raise SessionNotFoundError(
                f"Cannot export session {session_id!r}: there is none.", session_id=session_id
            )
        return document

    # -- event log ------------------------------------------------------------------------

    async def append_events(self, session_id: str, events: builtins.list[dict[str, Any]]) -> int:
        """Number and append events, in one transaction; see `SessionStore.append_events`.

        Appends made while the store's thread is busy commit together, in one transaction
        (one that fails is then retried alone, so it fails alone): a server streaming many
        turns at once makes a commit per batch of events, not per event.
        """
        texts = encode_events(session_id, events)
        thread = self._thread or await self._start()
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        batch = self._appends
        if batch is None or not batch.add(session_id, texts, future):
            batch = self._appends = _Appends()
            batch.add(session_id, texts, future)
            # The thread takes the batch when it gets to this job: what joined it by then.
            done = thread.submit(lambda db: _append_all(db, batch.take()), write=True)
            done.add_done_callback(functools.partial(self._settle, batch))
        return await future

    def _settle(
        self, batch: _Appends, done: asyncio.Future[builtins.list[int | sqlite3.Error]]
    ) -> None:
        """Hand each append of `batch` its outcome, once the thread has committed it."""
        error = done.exception()
        outcomes = [error] * len(batch.items) if error is not None else done.result()
        for (session_id, texts, future), outcome in zip(batch.items, outcomes, strict=True):
            if isinstance(outcome, int) and texts:
                self._event_feed.publish((session_id, outcome))
            if future.done():  # its caller was cancelled: the events are logged anyway
                continue
            if isinstance(outcome, sqlite3.Error):
                future.set_exception(self._error(outcome, session_id))
            elif isinstance(outcome, BaseException):  # the thread could not run the job
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    async def events(self, session_id: str, *, after: int = 0, limit: int = 1000) -> LoggedEvents:
        """The events numbered above `after`, in order; see `SessionStore.events`."""
        check_events_page(after, limit)
        return await self._call(
            lambda db: _read_events(db, session_id, after=after, limit=limit), session_id
        )

    # -- leases and wake-ups --------------------------------------------------------------

    async def lease_and_load(
        self, session_id: str, owner: str, ttl: float
    ) -> tuple[bool, SessionRecord | None]:
        """`acquire_lease`, then (if taken) `load`, in one job of the store's thread.

        A turn's start (see `handrail.store._base.lease_and_load`): one trip to the thread
        instead of two, a write that joins the others waiting (`_commit_together`), so the
        session is read in the transaction that takes its lease.
        """
        check_ttl(ttl)
        lease = lease_statement(_DIALECT, session_id, owner, ttl, self.clock())

        def lease_and_load(db: sqlite3.Connection) -> tuple[bool, SessionRecord | None]:
            with _transaction(db):
                if not db.execute(lease.sql, lease.params).rowcount:
                    return False, None
                return True, _load(db, session_id)

        return await self._call(lease_and_load, session_id, write=True)

    @contextlib.asynccontextmanager
    async def take_wakeup(
        self, session_id: str, *, due: float, owner: str
    ) -> AsyncIterator[SessionSummary | None]:
        """Claim a woken session before reading it; see `handrail.store._base.take_wakeup`.

        The claim is this process's (a set of the database's claimed ids, whichever store of
        it holds them) and, for the other processes, a lock on one byte of a file beside the
        database (`-wakeups`, the byte at the session id's hash; a collision only drops a
        wake-up that the sweeps then find). Then one read: the summary, if the session is due
        and its lease free, lapsed or `owner`'s. Nothing is written.
        """
        if not _WakeClaims.take(self.path, session_id):
            yield None
            return
        try:
            statement = claimable_statement(_DIALECT, session_id, due, owner, self._now())
            rows = await self._rows(statement, session_id)
            yield summary_from_row(rows[0]) if rows else None
        finally:
            _WakeClaims.give_back(self.path, session_id)

    async def notify(self, session_id: str) -> None:
        """Wake every listener, in this process at once and in others at their next poll.

        Wake-ups are rows of a small table, pruned after a minute.
        """
        now = self.clock()

        def notify(db: sqlite3.Connection) -> None:
            with _transaction(db):
                _wake(db, session_id, now)

        await self._call(notify, session_id, write=True)
        self._nudge()

    def _nudge(self) -> None:
        """Wake this store's own listeners at once (others' find the wake-up row)."""
        for subscription in self._subscriptions:
            subscription.nudge.set()

    def listen(self) -> _Subscription:
        """Subscribe to wake-ups; see `SessionStore.listen`.

        SQLite has no push between processes, so the subscription polls the wake-up table
        every `poll_interval` seconds; `notify` on this same store wakes it at once.
        """
        return _Subscription(self)

    def listen_events(self) -> AbstractAsyncContextManager[AsyncIterator[EventNotice]]:
        """Subscribe to event-log appends; see `SessionStore.listen_events`.

        Only the appends made through this store object are announced: SQLite has no push
        between processes, so a server in another process sharing the file finds its
        events by reading the log again (`create_app(poll_interval=...)`).
        """
        return self._event_feed.subscribe()

    async def close(self) -> None:
        """Close the connection and end the store's thread; subscriptions end too."""
        async with self._starting:
            self._closed = True
            thread, self._thread = self._thread, None
        self._event_feed.close()
        for subscription in self._subscriptions:
            subscription.nudge.set()
        if thread is not None:
            await thread.stop()


class _WakeClaims:
    """The wake-up claims on one database of this process's stores (`take_wakeup`).

    Held ids in a set, for this process; a lock on one byte of the `-wakeups` file per id,
    for the others. POSIX locks are a process's (its stores share them, hence the set), and
    closing any descriptor of the file drops them all: the file is opened by this class
    only, while this process holds a claim on the database, and closed when it holds none.
    """

    _all: ClassVar[dict[str, _WakeClaims]] = {}
    _guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, key: str) -> None:
        self.key = key
        self.held: set[str] = set()
        self.fd: int | None = None
        if fcntl is not None and key != ":memory:" and not key.startswith("file:"):
            with contextlib.suppress(OSError):  # (a read-only folder: this process's only)
                self.fd = os.open(f"{key}-wakeups", os.O_RDWR | os.O_CREAT, 0o644)

    @classmethod
    def take(cls, path: str, session_id: str) -> bool:
        """Claim `session_id` of the database at `path`; False: another store or process has."""
        key = path if path == ":memory:" or path.startswith("file:") else os.path.realpath(path)
        with cls._guard:
            claims = cls._all.get(key) or cls(key)
            if session_id in claims.held:
                return False
            if claims.fd is not None:
                try:
                    fcntl.lockf(claims.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _byte(session_id))
                except BlockingIOError:  # another process's
                    claims._close_if_idle()
                    return False
                except OSError:
                    pass  # no lock to be had: this process's claim only
            claims.held.add(session_id)
            cls._all[key] = claims
            return True

    @classmethod
    def give_back(cls, path: str, session_id: str) -> None:
        key = path if path == ":memory:" or path.startswith("file:") else os.path.realpath(path)
        with cls._guard:
            claims = cls._all.get(key)
            if claims is None or session_id not in claims.held:
                return
            claims.held.discard(session_id)
            if claims.fd is not None:
                with contextlib.suppress(OSError):
                    fcntl.lockf(claims.fd, fcntl.LOCK_UN, 1, _byte(session_id))
            claims._close_if_idle()

    def _close_if_idle(self) -> None:
        if self.held:
            return
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self._all.pop(self.key, None)


def _byte(session_id: str) -> int:
    """The byte of the `-wakeups` file a session's claim locks (a collision drops a wake-up)."""
    return int.from_bytes(hashlib.blake2b(session_id.encode(), digest_size=5).digest(), "big")


class _Subscription:
    """`async with store.listen() as wakeups`: polls the wake-up table for new rows."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._last = 0
        self._pending: collections.deque[str] = collections.deque()
        self.nudge = asyncio.Event()

    async def __aenter__(self) -> _Subscription:
        def last(db: sqlite3.Connection) -> int:
            seq: int = db.execute("SELECT COALESCE(MAX(seq), 0) FROM handrail_wakeups").fetchone()[
                0
            ]
            return seq

        self._last = await self._store._call(last, None)
        self._store._subscriptions.add(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._store._subscriptions.discard(self)

    def __aiter__(self) -> _Subscription:
        return self

    async def __anext__(self) -> str:
        def poll(db: sqlite3.Connection, last: int) -> list[tuple[int, str]]:
            sql = "SELECT seq, session_id FROM handrail_wakeups WHERE seq > ? ORDER BY seq"
            return db.execute(sql, (last,)).fetchall()

        while not self._pending:
            if self._store._closed:
                raise StopAsyncIteration
            self.nudge.clear()
            # If this await is cancelled, `_last` has not moved: the next call reads them again.
            rows = await self._store._call(functools.partial(poll, last=self._last), None)
            if rows:
                self._last = rows[-1][0]
                self._pending.extend(session_id for _, session_id in rows)
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._store.poll_interval):
                        await self.nudge.wait()
        return self._pending.popleft()


class _Dialect(Dialect):
    """SQLite's statements for the shared plans (`_sql`): named `:parameters`, JSON as text."""

    def table(self, name: str) -> str:
        return f"handrail_{name}"

    def param(self, name: str) -> str:
        return f":{name}"

    def text(self, column: str) -> str:
        # JSON columns are read as bytes and decoded by `_codec`: text that is not UTF-8
        # (written around handrail) is then a `SessionCorruptError` naming the session, not
        # sqlite3's "Could not decode to UTF-8" store failure.
        return f"CAST({column} AS BLOB)"

    def put_messages(self, session_id: str, start: int, texts: list[str]) -> Statement:
        return Statement(
            "INSERT INTO handrail_messages (session_id, position, message) "
            "VALUES (:id, :position, :message)",
            rows=[
                {"id": session_id, "position": position, "message": text}
                for position, text in enumerate(texts, start)
            ],
        )

    def put_cards(
        self, summary: SessionSummary, cards: list[WaitingCard], texts: list[str]
    ) -> Statement:
        names = [f"c{i}" for i in range(14)]
        rows = card_rows(summary, cards, texts)
        return Statement(
            f"INSERT INTO handrail_cards ({COLUMNS}) VALUES ({self.p(*names)})",
            rows=[dict(zip(names, row, strict=True)) for row in rows],
        )

    def wake(self, session_id: str, now: float | None) -> list[Statement]:
        assert now is not None  # SQLite's clock is the store's
        return [
            Statement(
                "INSERT INTO handrail_wakeups (session_id, created_at) VALUES (:id, :now)",
                {"id": session_id, "now": now},
            ),
            Statement(
                "DELETE FROM handrail_wakeups WHERE created_at < :before",
                {"before": now - _WAKEUPS_KEPT_FOR},
            ),
        ]


_DIALECT = _Dialect()


def _write(db: sqlite3.Connection, plan: Plan[T], *, alone: bool = False) -> T:
    """Run a plan of `_sql` in the caller's transaction (or one of its own): its value.

    `alone`: a plan of one write needs no transaction of its own.
    """
    with contextlib.nullcontext() if alone else _transaction(db):
        return _run(db, plan)


def _run(db: sqlite3.Connection, plan: Plan[T]) -> T:
    """Run a plan's statements on `db`, one after the other: its value."""
    result: Result | None = None
    while True:
        try:
            statement = plan.send(result)  # type: ignore[arg-type]  # None starts it
        except StopIteration as stop:
            value: T = stop.value
            return value
        if statement.rows is not None:
            cursor = db.executemany(statement.sql, statement.rows)
            result = Result([], cursor.rowcount)
        else:
            cursor = db.execute(statement.sql, statement.params)
            # Fetch all: a RETURNING statement is done only once drained.
            result = Result(cursor.fetchall(), cursor.rowcount)


def _wake(db: sqlite3.Connection, session_id: str, now: float) -> None:
    """Write a wake-up row for `session_id` (inside a write transaction); prune old ones."""
    for statement in _DIALECT.wake(session_id, now):
        db.execute(statement.sql, statement.params)


def migrate(db: sqlite3.Connection, now: float) -> int:
    """Create or upgrade the schema to `SCHEMA_VERSION`, in one transaction; the version.

    Raises:
        StoreError: the database was made by a newer handrail.
    """
    with _transaction(db):
        db.execute(
            """CREATE TABLE IF NOT EXISTS handrail_schema_version (
                version INTEGER PRIMARY KEY,
                applied_at REAL NOT NULL
            )"""
        )
        current: int = db.execute(
            "SELECT COALESCE(MAX(version), 0) FROM handrail_schema_version"
        ).fetchone()[0]
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"This SQLite database has schema version {current}, newer than this handrail "
                f"knows (up to {SCHEMA_VERSION}): upgrade handrail to open it."
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version]:
                db.execute(statement)
            if version in BACKFILLS:
                BACKFILLS[version](db)
            db.execute("INSERT INTO handrail_schema_version VALUES (?, ?)", (version, now))
    return max(current, SCHEMA_VERSION)


def _build_index(db: sqlite3.Connection) -> None:
    """Migration 5: the inbox rows of every suspended session, read from its stored form."""
    _run(db, build_index_plan(_DIALECT))


def _entry_who(text: str | bytes) -> str | None:
    """The `who` of a stored audit entry's JSON text (None if it has none, or is not JSON)."""
    try:
        who = json.loads(text).get("who")
    except (TypeError, ValueError, AttributeError):
        return None  # an edited entry: `handrail audit verify` names it
    return who if isinstance(who, str) else None


def _fill_who(db: sqlite3.Connection) -> None:
    """Migration 6: each audit entry's `who`, read from its stored JSON."""
    db.create_function("handrail_entry_who", 1, _entry_who, deterministic=True)
    db.execute("UPDATE handrail_audit SET who = handrail_entry_who(entry)")


BACKFILLS: dict[int, Callable[[sqlite3.Connection], None]] = {
    5: _build_index,
    6: _fill_who,
}
"""What a migration computes beyond its statements, in its transaction."""


class _Appends:
    """Appends made on the event loop, to be taken by the store's thread and committed at once.

    Appends join until the thread takes the batch (`take`); later ones start the next batch.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the loop adds, the thread takes
        self._taken = False
        self.items: list[tuple[str, list[str], asyncio.Future[int]]] = []

    def add(self, session_id: str, texts: list[str], future: asyncio.Future[int]) -> bool:
        """Join the batch; False if the thread has taken it already."""
        with self._lock:
            if self._taken:
                return False
            self.items.append((session_id, texts, future))
            return True

    def take(self) -> list[tuple[str, list[str]]]:
        """Close the batch: its appends, in order."""
        with self._lock:
            self._taken = True
            return [(session_id, texts) for session_id, texts, _ in self.items]


def _append_all(
    db: sqlite3.Connection, appends: list[tuple[str, list[str]]]
) -> list[int | sqlite3.Error]:
    """Commit `appends` in one transaction: the number of each one's last event.

    If that fails, each is committed in a transaction of its own, so only a failing one fails.
    """
    try:
        with _transaction(db, nested=len(appends) > 1):
            return _append(db, appends)
    except sqlite3.Error:
        if len(appends) == 1:
            raise
    outcomes: list[int | sqlite3.Error] = []
    for one in appends:
        try:
            with _transaction(db, nested=True):
                outcomes += _append(db, [one])
        except sqlite3.Error as error:
            outcomes.append(error)
    return outcomes


def _append(
    db: sqlite3.Connection, appends: list[tuple[str, list[str]]]
) -> list[int | sqlite3.Error]:
    # Inside BEGIN IMMEDIATE, which holds the write lock from the read of the last number on,
    # so two appends (from any process) cannot both take the same one.
    lasts: dict[str, int] = {}
    outcomes: list[int | sqlite3.Error] = []
    for session_id, texts in appends:
        last = lasts.get(session_id)
        if last is None:
            last = db.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM handrail_events WHERE session_id = ?",
                (session_id,),
            ).fetchone()[0]
        db.executemany(
            "INSERT INTO handrail_events (session_id, seq, event) VALUES (?, ?, ?)",
            [(session_id, seq, text) for seq, text in enumerate(texts, last + 1)],
        )
        lasts[session_id] = last = last + len(texts)
        outcomes.append(last)
    return outcomes


class _Checkpoints:
    """Checkpoints the write-ahead log from a thread of its own, once enough was written.

    SQLite checkpoints by default inside the commit that takes the log past 1000 pages, so
    that commit's writers (a batch of a burst's events) wait for it. Here the store's thread
    only counts what it wrote, between its jobs, and wakes a checkpointer: a thread with a
    connection of its own that copies the log back (PASSIVE: it never waits for readers or
    the writer). WAL lets it run while the store's thread goes on writing, so a checkpoint
    (tens of milliseconds on a slow disk: it syncs the database file) never holds up a job.
    Durability is the same: the log holds every commit until it is copied.

    The log starts over (from its beginning) at the first write after a checkpoint that
    copied all of it; what was written during a checkpoint is copied by the next one, which
    follows at once while there is such a rest (`CHECKPOINT_ROUNDS` at most). Under writes
    that never pause, the checkpointer may not catch up: once the log holds `WAL_FRAMES_MAX`
    pages, the store's thread copies it itself, between two jobs, while no write runs (so it
    catches up, and the log stays bounded).
    """

    def __init__(self, path: str, synchronous: str) -> None:
        self.path, self.synchronous = path, synchronous
        self.requested = 0  # the connection's `total_changes` at the last wake-up
        self.frames = 0  # pages in the log at the last checkpoint's end
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._due = False  # a wake-up the checkpointer has not taken yet
        self._stopping = False
        self._thread: threading.Thread | None = None

    def __call__(self, db: sqlite3.Connection) -> None:  # in the store's thread
        if self.frames >= WAL_FRAMES_MAX:
            # The checkpointer does not catch up: copy the log here, with no write meanwhile.
            blocked, log, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.frames = 0 if not blocked and copied == log else max(log, 0)
            return
        written = db.total_changes
        if written - self.requested < CHECKPOINT_AFTER:
            return
        self.requested = written
        with self._lock:
            self._due = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._main, name=f"handrail-sqlite-checkpoints {self.path}", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def _main(self) -> None:
        connection: sqlite3.Connection | None = None
        try:
            while True:
                with self._lock:
                    while not self._due and not self._stopping:
                        self._wake.wait()
                    if self._stopping:
                        return
                    self._due = False
                try:
                    if connection is None:
                        connection = sqlite3.connect(self.path, isolation_level=None)
                        connection.execute(f"PRAGMA synchronous={self.synchronous}")
                    self._copy(connection)
                except sqlite3.Error:  # upkeep: tried again at the next wake-up
                    _log.debug("WAL checkpoint of %r failed", self.path, exc_info=True)
        finally:
            if connection is not None:
                connection.close()

    def _copy(self, connection: sqlite3.Connection) -> None:
        """Checkpoint until the log is all copied, or a round copies nothing new.

        At most `CHECKPOINT_ROUNDS` rounds: under writes that never pause, the next wake-up
        goes on.
        """
        before = -1
        for _ in range(CHECKPOINT_ROUNDS):
            if self._stopping:
                return
            blocked, log, copied = connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.frames = max(log, 0)
            if blocked or copied == log or copied <= before:
                return  # done, or held back by a reader (the next wake-up tries again)
            before = copied

    def stop(self) -> None:
        """End the checkpointer.

        Before the store's connection closes: the last one to close checkpoints and removes
        the log.
        """
        with self._lock:
            self._stopping = True
            self._wake.notify()
            thread = self._thread
        if thread is not None:
            thread.join()


def _commit_together(
    db: sqlite3.Connection,
    jobs: list[Callable[[sqlite3.Connection], Any]],
    *,
    savepoints: bool = False,
) -> list[Outcome]:
    """Group commit: write jobs in one transaction; each one's outcome, once committed.

    The jobs run one after the other in the transaction. If one fails, nothing of the pass is
    kept: they all run again (`savepoints`), each in a savepoint of its own, so that the one
    that fails is rolled back to it and fails alone, and the others commit. (A savepoint is
    not free: SQLite first copies each page a job changes into its statement journal, and jobs
    hardly ever fail.) If SQLite rolls the whole transaction back (a full disk, an I/O error),
    the failing job fails and the others run again without it. If the commit fails, each job
    runs again alone, in a transaction of its own (as it would have without the group). If the
    transaction cannot begin (another process held the lock past `busy_timeout`), every job
    fails with that.
    """
    db.execute("BEGIN IMMEDIATE")  # what it raises, every job of the group gets
    try:
        return _run_together(db, jobs, savepoints=savepoints)
    except BaseException:  # the group's own statements failed: nothing of it is kept
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _run_together(
    db: sqlite3.Connection, jobs: list[Callable[[sqlite3.Connection], Any]], *, savepoints: bool
) -> list[Outcome]:
    """`_commit_together`, once its transaction has begun."""
    outcomes: list[Outcome | None] = [None] * len(jobs)
    for index, job in enumerate(jobs):
        try:
            if savepoints:
                db.execute("SAVEPOINT handrail_job")
            outcome: Outcome = (job(db), None)
        except BaseException as error:
            outcome = (None, error)
        outcomes[index] = outcome
        if not db.in_transaction:
            # SQLite rolled the whole transaction back (as this job failed, or inside it, if
            # it went on alone): the jobs before lost their writes, so they run again, with
            # the rest. (This job's outcome stands: whatever it did after stands too.)
            again = [i for i, o in enumerate(outcomes[:index]) if o is not None and o[1] is None]
            again += range(index + 1, len(jobs))
            retried = _commit_together(db, [jobs[i] for i in again]) if again else []
            for i, outcome in zip(again, retried, strict=True):
                outcomes[i] = outcome
            return [o for o in outcomes if o is not None]
        if outcome[1] is not None:
            if not savepoints:  # what it wrote cannot be told apart: all again, with them
                db.execute("ROLLBACK")
                return _commit_together(db, jobs, savepoints=True)
            db.execute("ROLLBACK TO handrail_job")
        if savepoints:
            db.execute("RELEASE handrail_job")
    try:
        db.execute("COMMIT")
    except sqlite3.Error:
        if db.in_transaction:
            db.execute("ROLLBACK")
        return [_alone(db, job) for job in jobs]
    return [o for o in outcomes if o is not None]


def _alone(db: sqlite3.Connection, job: Callable[[sqlite3.Connection], Any]) -> Outcome:
    try:
        return job(db), None
    except BaseException as error:
        return None, error


@contextlib.contextmanager
def _transaction(
    db: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE", *, nested: bool = False
) -> Iterator[None]:
    """One explicit transaction, rolled back if the block raises.

    Within the transaction of a group (`_commit_together`), the block runs in it as it is
    (if it fails, the group undoes the job), or (`nested`: a block whose failure the job
    itself handles) in a savepoint of its own, rolled back alone.
    `BEGIN IMMEDIATE` takes the write lock up front, so a read-then-write transaction never
    fails halfway to upgrade its lock (which WAL mode does not wait for).
    """
    if db.in_transaction and not nested:
        yield
        return
    if db.in_transaction:
        db.execute("SAVEPOINT handrail_step")
        try:
            yield
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK TO handrail_step")
                db.execute("RELEASE handrail_step")
            raise
        db.execute("RELEASE handrail_step")
        return
    db.execute(begin)
    try:
        yield
    except BaseException:
        if db.in_transaction:  # SQLite may have rolled back already (e.g. on SQLITE_FULL)
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _session_row(db: sqlite3.Connection, session_id: str) -> Any:
    """The session's row as `record_from_row` reads it, or None."""
    return db.execute(
        f"SELECT {_SUMMARY}, CAST(data AS BLOB), window_start FROM handrail_sessions WHERE id = ?",
        (session_id,),
    ).fetchone()


def _load(db: sqlite3.Connection, session_id: str) -> SessionRecord | None:
    """The session as last saved (inside a transaction: one snapshot), or None."""
    row = _session_row(db, session_id)
    if row is None:
        return None
    record = record_from_row(row)
    record.messages = [m for _, m in _read_messages(db, session_id, record.window, None, -1)]
    return record


def _read_log(db: sqlite3.Connection, session_id: str) -> list[ToolLogEntry]:
    query = read_log_statement(_DIALECT, session_id)
    rows = db.execute(query.sql, query.params).fetchall()
    return [log_entry_from_row(session_id, row) for row in rows]


def _read_events(
    db: sqlite3.Connection, session_id: str, *, after: int, limit: int
) -> LoggedEvents:
    """Events above `after`; `limit=-1` reads them all (SQLite's "no limit")."""
    rows = db.execute(
        "SELECT seq, CAST(event AS BLOB) FROM handrail_events WHERE session_id = ? AND seq > ? "
        "ORDER BY seq LIMIT ?",
        (session_id, after, limit),
    ).fetchall()
    return [(seq, decode_event(session_id, seq, text)) for seq, text in rows]


def _read_messages(
    db: sqlite3.Connection, session_id: str, start: int, before: int | None, limit: int
) -> list[tuple[int, dict[str, Any]]]:
    """Stored messages at `start` or after and before `before`: the last `limit` (-1: all)."""
    rows = db.execute(
        "SELECT position, CAST(message AS BLOB) FROM handrail_messages WHERE session_id = ? "
        "AND position >= ? AND position < ? ORDER BY position DESC LIMIT ?",
        (session_id, start, _END if before is None else before, limit),
    ).fetchall()
    rows.reverse()
    return [(position, decode_message(session_id, position, text)) for position, text in rows]


_END = 2**62  # past any position


def _nothing(db: sqlite3.Connection) -> None:
    return None


def _busy(error: sqlite3.Error) -> bool:
    """Whether SQLite refused for a lock another connection holds (`SQLITE_BUSY`, `_LOCKED`)."""
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(error, sqlite3.OperationalError) and code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return False
