"""`PostgresStore`: sessions in PostgreSQL, for many workers on many machines.

psycopg 3's async API over a connection pool: nothing blocks the event loop. One row a
session (its document in a `json` column) plus a tool-call log table and a lease table, in a
schema of your choice; the store creates and migrates its tables itself, under an advisory
lock, so many workers may start at once. Wake-ups travel over LISTEN/NOTIFY.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any, Generic, TypeVar

from ..audit import (
    FROM_ENVIRONMENT,
    AuditKeyOption,
    signing_key,
)
from ..exceptions import (
    MissingExtraError,
    SessionNotFoundError,
    StoreError,
    StoreUnavailableError,
)
from ._base import (
    Clock,
    SessionRecord,
    SessionSummary,
    ToolLogEntry,
    WaitingCard,
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
from ._sql import (
    SESSION_TABLES,
    Dialect,
    Plan,
    Result,
    Statement,
    build_index_plan,
    cards_change_statement,
    claimable_statement,
    lease_statement,
    read_log_statement,
)
from ._sqlstore import SqlStore
from ._waiting import (
    COLUMNS,
)

# Without the extra the module still imports (so `from handrail import *` and `isinstance`
# work), and making a store says what to install.
_missing: ImportError | None = None
try:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    from psycopg_pool import AsyncConnectionPool
except ImportError as error:
    _missing = error

__all__ = ["PostgresStore"]

_log = logging.getLogger("handrail.store")

T = TypeVar("T")

SCHEMA_VERSION = 6
"""The version of the database schema this code reads and writes. One line a bump:

1: sessions, tool-call log, leases.
2: the event log, `handrail_events`.
3: messages apart, one row a message (`handrail_messages`), and the sessions' `window_start`.
4: the audit trail, `handrail_audit` (per organisation, hash-chained; never pruned).
5: the inbox index, `handrail_cards` (one row a waiting card), built from the suspended
   sessions (`PostgresStore._build_index`).
6: the audit trail's `who`, a column of its own with an index (org_id, who, kind, seq),
   filled from the stored entries.
"""

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,53}")  # 54: "handrail_" + it fits in 63

# `{s}` is the quoted schema. A session's document is `json`, not `jsonb`: the store never
# looks inside it, `json` keeps the text exactly as given (jsonb would turn 1e23 into an int
# and refuses "\u0000" in strings), and it is cheaper to write and to read back whole.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE {s}.handrail_sessions (
            id text PRIMARY KEY,
            org_id text,
            user_id text,
            status text NOT NULL
                CHECK (status IN ('active', 'suspended', 'completed', 'failed')),
            version bigint NOT NULL CHECK (version > 0),
            created_at double precision NOT NULL,
            updated_at double precision NOT NULL,
            expires_at double precision,
            data json NOT NULL
        )""",
        # Every save moves updated_at in each index below, so there are only those that let
        # list() read its page in order: by org, org and user, status, or nothing (and time).
        # By user alone (rare: scope starts at the org) it walks the updated_at index. The
        # tool-call log is read through its unique (session_id, tool_call_id) index, a
        # session's few entries sorted by seq.
        "CREATE INDEX handrail_sessions_updated ON {s}.handrail_sessions (updated_at, id)",
        """CREATE INDEX handrail_sessions_org_user
            ON {s}.handrail_sessions (org_id, user_id, updated_at, id)""",
        "CREATE INDEX handrail_sessions_org ON {s}.handrail_sessions (org_id, updated_at, id)",
        "CREATE INDEX handrail_sessions_status ON {s}.handrail_sessions (status, updated_at, id)",
        """CREATE INDEX handrail_sessions_expires ON {s}.handrail_sessions (expires_at, id)
            WHERE expires_at IS NOT NULL""",
        """CREATE TABLE {s}.handrail_tool_log (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            session_id text NOT NULL,
            tool_call_id text NOT NULL,
            key text NOT NULL,
            tool text NOT NULL,
            args json NOT NULL,
            status text NOT NULL CHECK (status IN ('started', 'finished')),
            result json,
            started_at double precision NOT NULL,
            finished_at double precision,
            UNIQUE (session_id, tool_call_id)
        )""",
        """CREATE TABLE {s}.handrail_leases (
            session_id text PRIMARY KEY,
            owner text NOT NULL,
            expires_at double precision NOT NULL
        )""",
    ),
    2: (
        """CREATE TABLE {s}.handrail_events (
            session_id text NOT NULL,
            seq bigint NOT NULL CHECK (seq > 0),
            event json NOT NULL,
            PRIMARY KEY (session_id, seq)
        )""",
    ),
    3: (
        """CREATE TABLE {s}.handrail_messages (
            session_id text NOT NULL,
            position bigint NOT NULL CHECK (position >= 0),
            message json NOT NULL,
            PRIMARY KEY (session_id, position)
        )""",
        "ALTER TABLE {s}.handrail_sessions ADD COLUMN window_start bigint NOT NULL DEFAULT 0",
    ),
    # org_id '' stands for "no organisation". The entry's text is what is hashed and read
    # back (text, not jsonb: kept exactly); the other columns only index it.
    4: (
        """CREATE TABLE {s}.handrail_audit (
            org_id text NOT NULL,
            seq bigint NOT NULL CHECK (seq > 0),
            kind text NOT NULL,
            session_id text NOT NULL,
            tool text NOT NULL,
            hash text NOT NULL,
            entry text NOT NULL,
            PRIMARY KEY (org_id, seq)
        )""",
        "CREATE INDEX handrail_audit_session ON {s}.handrail_audit (org_id, session_id, seq)",
    ),
    # The inbox index: a suspended session's waiting cards, written with each save. A row
    # carries its session's summary too, so a page is read off one index without a join.
    5: (
        """CREATE TABLE {s}.handrail_cards (
            session_id text NOT NULL,
            org_id text,
            user_id text,
            version bigint NOT NULL,
            session_created_at double precision NOT NULL,
            updated_at double precision NOT NULL,
            expires_at double precision,
            position integer NOT NULL CHECK (position >= 0),
            tool_call_id text NOT NULL,
            tool text NOT NULL,
            kind text NOT NULL,
            agent text,
            created_at double precision,
            card text NOT NULL,
            PRIMARY KEY (session_id, position)
        )""",
        """CREATE INDEX handrail_cards_org
            ON {s}.handrail_cards (org_id, updated_at DESC, session_id DESC, position)""",
        """CREATE INDEX handrail_cards_tool
            ON {s}.handrail_cards (org_id, tool, updated_at DESC, session_id DESC, position)""",
    ),
    # Who decided (or whose session ran the call): one person's decisions are read off the
    # index, newest first, without reading the organisation's trail. The column is filled
    # from the stored entries; one that is not JSON (edited outside handrail: `handrail
    # audit verify` names it) gets none rather than failing the migration.
    6: (
        "ALTER TABLE {s}.handrail_audit ADD COLUMN who text",
        """CREATE FUNCTION pg_temp.handrail_entry_who(entry text) RETURNS text
            LANGUAGE plpgsql IMMUTABLE AS $$
            BEGIN
                RETURN CASE WHEN json_typeof(entry::json -> 'who') = 'string'
                    THEN entry::json ->> 'who' END;
            EXCEPTION WHEN others THEN
                RETURN NULL;
            END $$""",
        "UPDATE {s}.handrail_audit SET who = pg_temp.handrail_entry_who(entry)",
        "DROP FUNCTION pg_temp.handrail_entry_who(text)",
        "CREATE INDEX handrail_audit_who ON {s}.handrail_audit (org_id, who, kind, seq)",
    ),
}

# The store's clock, or (clock=None) the server's: one clock for every worker. The statement's
# start time is the same everywhere in a statement.
_NOW = "COALESCE(%(now)s::float8, extract(epoch FROM statement_timestamp())::float8)"
_EVENTS_LOCK = 0x68726C65  # "hrle": the class of the advisory locks on sessions' event logs
_WAKE_LOCK = 0x6872776B  # "hrwk": the class of the wake-up claims' advisory locks
_SUMMARY = "id, org_id, user_id, status, version, created_at, updated_at, expires_at"
# A save's waiting cards, one statement: the fields as arrays, a card's at its position.
_PUT_CARDS = f"""INSERT INTO {{s}}.handrail_cards ({COLUMNS})
    SELECT %(id)s, %(org_id)s, %(user_id)s, %(version)s, %(created_at)s, %(updated_at)s,
        %(expires_at)s, c.n - 1, f.v[c.n][1], f.v[c.n][2], f.v[c.n][3], f.v[c.n][4],
        (%(card_times)s::float8[])[c.n], c.card
    FROM unnest(%(cards)b::text[]) WITH ORDINALITY AS c(card, n),
        (SELECT %(card_fields)b::text[][] AS v) AS f"""


class PostgresStore(SqlStore):
    """A `SessionStore` in PostgreSQL: for many workers, in many processes and machines.

    Open it with `await PostgresStore.connect(dsn)`, or construct it and let the first call
    open it (or `async with PostgresStore(dsn) as store`). Opening connects, creates or
    migrates the schema, and raises a `StoreError` naming the server (password masked) and the
    fix if the database cannot be reached.

    Args:
        dsn: a libpq connection string or URL (`postgresql://user@host:5432/db`).
        schema: the PostgreSQL schema holding the store's tables (created if missing); give
            each application (or test run) its own to keep them apart.
        pool_size: the most connections the pool opens.
        clock: wall time in epoch seconds for timestamps and lease expiry; `None` (the
            default) uses the database server's clock, so workers whose clocks disagree still
            agree on when a lease expires.
        connect_timeout: seconds to wait for the server when opening, and for a free
            connection from the pool.
        audit_key: the key the audit trail's hashes are made with (`handrail.audit`); by
            default the one in `HANDRAIL_AUDIT_KEY` (unset: unkeyed, and a warning at the first
            append); None: unkeyed, deliberately. Held by this process only, never sent to the
            database.

    Raises:
        ConfigError: `HANDRAIL_AUDIT_KEY` is malformed, or `audit_key` is not a key.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "public",
        pool_size: int = 10,
        clock: Clock | None = None,
        connect_timeout: float = 10.0,
        audit_key: AuditKeyOption = FROM_ENVIRONMENT,
    ) -> None:
        _require_psycopg()
        self.audit_key = signing_key(audit_key)
        """The key the audit trail's hashes are made with (None: unkeyed)."""
        # Unkeyed for want of HANDRAIL_AUDIT_KEY is said at the first append; None is a choice.
        self._warn_unkeyed = audit_key is FROM_ENVIRONMENT and self.audit_key is None
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError(
                f"schema must be a plain identifier (letters, digits, _; at most 54 "
                f"characters), not {schema!r}"
            )
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        self.dsn = dsn
        self.schema = schema
        self.pool_size = pool_size
        self.clock = clock
        self.connect_timeout = connect_timeout
        self.channel = f"handrail_{schema}"
        """The LISTEN/NOTIFY channel of the store's wake-ups."""
        events_channel = f"handrail_events_{schema}"
        if len(events_channel) > 63:  # PostgreSQL's longest name
            digest = hashlib.blake2b(schema.encode(), digest_size=16).hexdigest()
            events_channel = f"handrail_events_{digest}"
        self.events_channel = events_channel
        """The LISTEN/NOTIFY channel of the event-log notices (`listen_events`)."""
        self._s = f'"{schema}"'
        self._dialect = _Dialect(self._s, schema, self.channel)
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._opening = asyncio.Lock()
        self._closed = False
        self._subscriptions: set[_Subscription[Any]] = set()
        # The wake-up claims' connection (`take_wakeup`): outside the pool, opened when first
        # needed; its session-level advisory locks are the claims.
        self._claims: psycopg.AsyncConnection[Any] | None = None
        self._claims_opening = asyncio.Lock()
        self._unannounced: dict[str, int] = {}  # appends whose notice is not sent yet
        self._announcing: asyncio.Task[None] | None = None
        self._checking = False  # the pool's idle connections are being checked

    cross_process_events = True
    """Whether `listen_events` announces the appends of other processes: yes (NOTIFY)."""

    @classmethod
    async def connect(cls, dsn: str, **options: Any) -> PostgresStore:
        """Make a store and open it now (see the class for the options)."""
        store = cls(dsn, **options)
        await store.open()
        return store

    async def __aenter__(self) -> PostgresStore:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def masked_dsn(self) -> str:
        """The connection string with its password masked, for messages and logs."""
        return mask_dsn(self.dsn)

    def pool_stats(self) -> dict[str, int]:
        """The connection pool's counters (`psycopg_pool`'s `get_stats()`), for monitoring.

        Among them: `pool_size` and `pool_available` (connections open, and idle),
        `requests_waiting` (requests waiting for a connection now), `requests_queued` and
        `requests_wait_ms` (requests that had to wait, and their total wait), and
        `requests_errors` (requests that gave up after `connect_timeout`); a counter shows once
        it is not zero. Empty before the store is opened.
        """
        pool = self._pool
        return {} if pool is None else dict(pool.get_stats())

    # -- plumbing -------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect, create or migrate the schema, and open the pool. Opening twice is harmless.

        Raises:
            StoreError: the server cannot be reached, or its schema is newer than this code.
        """
        async with self._opening:
            if self._closed:
                raise StoreError(
                    f"This PostgresStore ({self.masked_dsn}) is closed: make a new one."
                )
            if self._pool is not None:
                return
            try:
                async with await self._connect() as connection:
                    await self._migrate(connection)
                pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
                    self.dsn,
                    min_size=1,
                    max_size=self.pool_size,
                    # Single statements commit at once (one round trip); multi-statement work
                    # runs in explicit `connection.transaction()` blocks.
                    kwargs={"autocommit": True},
                    timeout=self.connect_timeout,
                    open=False,
                    name=f"handrail-{self.schema}",
                )
                try:
                    await pool.open(wait=True, timeout=self.connect_timeout)
                except BaseException:
                    await pool.close()
                    raise
            except psycopg.Error as error:
                raise self._error(error, None) from error
            self._pool = pool

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, connect_timeout=max(2, round(self.connect_timeout))
        )

    async def _migrate(self, connection: psycopg.AsyncConnection[Any]) -> None:
        # The advisory lock serialises workers starting at once; it ends with the transaction.
        lock = int.from_bytes(
            hashlib.blake2b(f"handrail schema {self.schema}".encode(), digest_size=8).digest(),
            "big",
            signed=True,
        )
        async with connection.transaction():
            await connection.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
            await connection.execute(f"CREATE SCHEMA IF NOT EXISTS {self._s}")
            await connection.execute(
                f"""CREATE TABLE IF NOT EXISTS {self._s}.handrail_schema_version (
                    version integer PRIMARY KEY,
                    applied_at double precision NOT NULL
                )"""
            )
            cursor = await connection.execute(
                f"SELECT COALESCE(MAX(version), 0) FROM {self._s}.handrail_schema_version"
            )
            row = await cursor.fetchone()
            current: int = row[0] if row else 0
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"The PostgreSQL schema {self.schema!r} has version {current}, newer than "
                    f"this handrail knows (up to {SCHEMA_VERSION}): upgrade handrail."
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version]:
                    await connection.execute(statement.format(s=self._s))
                if version == 5:
                    await self._build_index(connection)
                await connection.execute(
                    f"INSERT INTO {self._s}.handrail_schema_version VALUES (%(version)s, {_NOW})",
                    {"version": version, "now": self._now()},
                )

    async def _build_index(self, connection: psycopg.AsyncConnection[Any]) -> None:
        """Migration 5: the inbox rows of every suspended session, read from its stored form."""
        await _run(connection, build_index_plan(self._dialect))

    def _now(self) -> float | None:
        return None if self.clock is None else self.clock()

    def _name(self) -> str:
        return f"PostgresStore({self.masked_dsn!r}, schema={self.schema!r})"

    async def _execute(
        self,
        make: Callable[[], Plan[T]],
        session_id: str | None,
        *,
        write: bool = False,
        transaction: bool | None = None,
    ) -> T:
        """Run a plan on a pooled connection; see `SqlStore._execute`."""
        in_transaction = write if transaction is None else transaction
        async with (
            self._connection(session_id) as connection,
            connection.transaction() if in_transaction else contextlib.nullcontext(),
        ):
            return await _run(connection, make())

    @contextlib.asynccontextmanager
    async def _connection(
        self, session_id: str | None
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection; psycopg's errors come out as `StoreError`s."""
        if self._closed:
            raise StoreError(f"This PostgresStore ({self.masked_dsn}) is closed: make a new one.")
        if self._pool is None:
            await self.open()
        pool = self._pool
        if pool is None:  # closed while opening
            raise StoreError(f"This PostgresStore ({self.masked_dsn}) is closed: make a new one.")
        try:
            async with pool.connection() as connection:
                yield connection
        except psycopg.Error as error:
            if isinstance(error, psycopg.OperationalError) and not self._checking:
                # A connection found dead (a restart, a terminated backend) says its idle
                # siblings may be dead too: the pool replaces those now, so that the caller's
                # retry gets a live one instead of the next dead one.
                self._checking = True
                try:
                    await pool.check()
                except Exception:  # the server is still away: the retry finds out
                    pass
                finally:
                    self._checking = False
            raise self._error(error, session_id) from error

    async def _fetch(
        self, query: str, params: dict[str, Any], session_id: str | None
    ) -> builtins.list[tuple[Any, ...]]:
        async with self._connection(session_id) as connection:
            cursor = await connection.execute(query, params)
            return await cursor.fetchall()

    def _error(self, error: psycopg.Error, session_id: str | None) -> StoreError:
        where = f"session {session_id!r} in " if session_id else ""
        message = f"PostgreSQL store failed on {where}{self.masked_dsn} (schema {self.schema!r})"
        if isinstance(error, psycopg.OperationalError):
            # The connection went (a restart, a network cut, a terminated backend), the pool
            # had none to give in time, or a transaction lost a serialization race: the same
            # call may go through on a fresh connection.
            return StoreUnavailableError(
                f"{message}: {error}. Check that the server is running and reachable, and the "
                f"connection string (dsn=...).",
                session_id=session_id,
            )
        return StoreError(f"{message}: {error}", session_id=session_id)

    # -- sessions -------------------------------------------------------------------------

    async def load(self, session_id: str) -> SessionRecord | None:
        """The session as last saved, or `None`; see `SessionStore.load`."""
        # One statement, so one snapshot: the document and the messages of the same save.
        rows = await self._fetch(self._load_sql, {"id": session_id}, session_id)
        return _record(session_id, rows[0]) if rows else None

    @property
    def _load_sql(self) -> str:
        return f"""SELECT {_SUMMARY}, data::text, window_start,
                (SELECT array_agg(m.message::text ORDER BY m.position)
                    FROM {self._s}.handrail_messages m
                    WHERE m.session_id = s.id AND m.position >= s.window_start)
            FROM {self._s}.handrail_sessions s WHERE id = %(id)s"""

    async def messages(
        self, session_id: str, *, before: int | None = None, limit: int = 100
    ) -> builtins.list[tuple[int, dict[str, Any]]]:
        """A page of the stored history, oldest first; see `SessionStore.messages`."""
        check_messages_page(before, limit)
        async with self._connection(session_id) as connection:
            return await self._read_messages(connection, session_id, before, limit)

    async def _read_messages(
        self,
        connection: psycopg.AsyncConnection[Any],
        session_id: str,
        before: int | None,
        limit: int | None,
    ) -> builtins.list[tuple[int, dict[str, Any]]]:
        cursor = await connection.execute(
            f"""SELECT position, message::text FROM {self._s}.handrail_messages
            WHERE session_id = %(id)s AND (%(before)s::bigint IS NULL OR position < %(before)s)
            ORDER BY position DESC LIMIT %(limit)s""",
            {"id": session_id, "before": before, "limit": limit},
        )
        rows = await cursor.fetchall()
        rows.reverse()
        return [(position, decode_message(session_id, position, text)) for position, text in rows]

    async def lease_and_load(
        self, session_id: str, owner: str, ttl: float
    ) -> tuple[bool, SessionRecord | None]:
        """`acquire_lease`, then (if taken) `load`, in one transaction: one trip, one commit.

        A turn's start (see `handrail.store._base.lease_and_load`).
        """
        check_ttl(ttl)
        lease = lease_statement(self._dialect, session_id, owner, ttl, self._now())
        async with self._connection(session_id) as connection, connection.transaction():
            if not (await connection.execute(lease.sql, lease.params)).rowcount:
                return False, None
            cursor = await connection.execute(self._load_sql, lease.params)
            row = await cursor.fetchone()
        return True, None if row is None else _record(session_id, row)

    @contextlib.asynccontextmanager
    async def take_wakeup(
        self, session_id: str, *, due: float, owner: str
    ) -> AsyncIterator[SessionSummary | None]:
        """Claim a woken session before reading it; see `handrail.store._base.take_wakeup`.

        One reading statement on a connection of the claims' own (outside the pool): the
        session's summary if it is due and its lease free, lapsed or `owner`'s, with, for that
        row only, a session-level advisory lock tried (`pg_try_advisory_lock`, never waited
        for; the key: the schema and the session id's hash, a collision only drops a wake-up
        that the sweeps then find). No commit writes: the lock is no row. It is given back on
        exit (and goes with the connection if that is lost: the claim was only a hint).
        """
        key = f"{self.schema} {session_id}"
        statement = claimable_statement(
            self._dialect,
            session_id,
            due,
            owner,
            self._now(),
            also=", pg_try_advisory_lock(%(lock_class)s, hashtext(%(key)s))",
        )
        params = {**dict(statement.params), "lock_class": _WAKE_LOCK, "key": key}
        connection = await self._claims_connection(session_id)
        try:
            row = await (await connection.execute(statement.sql, params)).fetchone()
        except psycopg.Error as error:
            await self._drop_claims(connection)
            raise self._error(error, session_id) from error
        if row is None or not row[-1]:
            yield None  # not due, another's lease, or another process's claim
            return
        try:
            yield summary_from_row(row[:-1])
        finally:
            if self._claims is connection:  # (else: lost, and its locks with it)
                try:
                    await connection.execute(
                        "SELECT pg_advisory_unlock(%(lock_class)s, hashtext(%(key)s))",
                        {"lock_class": _WAKE_LOCK, "key": key},
                    )
                except psycopg.Error:
                    await self._drop_claims(connection)

    async def _claims_connection(self, session_id: str) -> psycopg.AsyncConnection[Any]:
        async with self._claims_opening:
            if self._closed:
                raise StoreError(
                    f"This PostgresStore ({self.masked_dsn}) is closed: make a new one."
                )
            if self._claims is None or self._claims.closed:
                try:
                    self._claims = await self._connect()
                except psycopg.Error as error:
                    raise self._error(error, session_id) from error
            return self._claims

    async def _drop_claims(self, connection: psycopg.AsyncConnection[Any]) -> None:
        """Close a claims' connection that failed (its locks go with it); the next opens anew."""
        if self._claims is connection:
            self._claims = None
        with contextlib.suppress(Exception):
            await connection.close()

    async def claim(
        self, now: float, owner: str, ttl: float, *, limit: int = 100
    ) -> builtins.list[SessionSummary]:
        """Take the leases of sessions that need a worker; see `SessionStore.claim`.

        One statement: the due sessions whose lease is free are locked `FOR UPDATE SKIP
        LOCKED` (workers claiming at once pass over each other's rows instead of waiting),
        and their leases taken with the same upsert as `acquire_lease`.
        """
        check_page(limit, 0)
        check_ttl(ttl)
        s = self._s
        columns = ", ".join(f"s.{c}" for c in _SUMMARY.split(", "))
        rows = await self._fetch(
            f"""WITH picked AS (
                SELECT s.id, s.expires_at FROM {s}.handrail_sessions s
                LEFT JOIN {s}.handrail_leases l ON l.session_id = s.id
                WHERE s.expires_at IS NOT NULL AND s.expires_at <= %(due)s
                    AND (l.session_id IS NULL OR l.owner = %(owner)s OR l.expires_at <= {_NOW})
                ORDER BY s.expires_at, s.id
                LIMIT %(limit)s
                FOR UPDATE OF s SKIP LOCKED
            ), taken AS (
                INSERT INTO {s}.handrail_leases (session_id, owner, expires_at)
                SELECT id, %(owner)s, {_NOW} + %(ttl)s FROM picked
                ON CONFLICT (session_id) DO UPDATE
                    SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
                    WHERE {s}.handrail_leases.owner = EXCLUDED.owner
                        OR {s}.handrail_leases.expires_at <= {_NOW}
                RETURNING session_id
            )
            SELECT {columns} FROM {s}.handrail_sessions s JOIN taken t ON t.session_id = s.id
            ORDER BY s.expires_at, s.id""",
            {"due": now, "owner": owner, "ttl": ttl, "limit": limit, "now": self._now()},
            None,
        )
        return [summary_from_row(row) for row in rows]

    async def delete(self, session_id: str) -> bool:
        """Delete a session, its logs and its lease (one statement); see `SessionStore.delete`."""
        rows = await self._fetch(
            "WITH "
            + ", ".join(
                f"{table} AS (DELETE FROM {self._s}.handrail_{table} WHERE session_id = %(id)s)"
                for table in SESSION_TABLES
            )
            + f" DELETE FROM {self._s}.handrail_sessions WHERE id = %(id)s RETURNING 1",
            {"id": session_id},
            session_id,
        )
        return bool(rows)

    async def export(self, session_id: str) -> str:
        """The session and its logs as one JSON document; see `SessionStore.export`."""
        params = {"id": session_id}
        async with self._connection(session_id) as connection, connection.transaction():
            # One snapshot for the session and its logs.
            await connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor = await connection.execute(
                f"""SELECT {_SUMMARY}, data::text, window_start FROM {self._s}.handrail_sessions
                WHERE id = %(id)s""",
                params,
            )
            row = await cursor.fetchone()
            log = await self._read_log(connection, session_id) if row else []
            events = await self._read_events(connection, session_id, 0, None) if row else []
            history = await self._read_messages(connection, session_id, None, None) if row else []
        if row is None:
            raise SessionNotFoundError(
                f"Cannot export session {session_id!r}: there is none.", session_id=session_id
            )
        return export_document(record_from_row(row), log, events, [m for _, m in history])

    # -- tool-call log --------------------------------------------------------------------

    async def _read_log(
        self, connection: psycopg.AsyncConnection[Any], session_id: str
    ) -> builtins.list[ToolLogEntry]:
        query = read_log_statement(self._dialect, session_id)
        cursor = await connection.execute(query.sql, query.params)
        return [log_entry_from_row(session_id, row) for row in await cursor.fetchall()]

    # -- event log ------------------------------------------------------------------------

    async def append_events(self, session_id: str, events: builtins.list[dict[str, Any]]) -> int:
        """Number and append events in one transaction; see `SessionStore.append_events`.

        The transaction first takes the session log's advisory lock (`events_lock`), which a
        save that appends events takes too: two appends never read the same last number. (An
        append that still meets a number taken, by a process that appends without the lock,
        fails on the primary key and is made again.) Once it has committed, the append is
        announced on `events_channel` (see `_announce`).
        """
        texts = encode_events(session_id, events)
        params = {"id": session_id, "texts": texts}
        if not texts:
            rows = await self._fetch(
                f"SELECT COALESCE(MAX(seq), 0) FROM {self._s}.handrail_events "
                f"WHERE session_id = %(id)s",
                params,
                session_id,
            )
            last: int = rows[0][0]
            return last
        query = f"""WITH last AS (
                SELECT COALESCE(MAX(seq), 0) AS seq FROM {self._s}.handrail_events
                WHERE session_id = %(id)s
            ), appended AS (
                INSERT INTO {self._s}.handrail_events (session_id, seq, event)
                SELECT %(id)s, last.seq + e.n, e.event::json
                FROM last, unnest(%(texts)b::text[]) WITH ORDINALITY AS e(event, n)
                RETURNING seq
            )
            SELECT MAX(seq) FROM appended"""
        lock = self._dialect.events_lock(session_id)

        def append() -> Plan[int]:
            if lock is not None:
                yield lock
            appended = yield Statement(query, params)
            last: int = appended.rows[0][0]
            return last

        while True:
            try:
                appended = await self._execute(append, session_id, write=True)
            except StoreError as error:
                if isinstance(error.__cause__, psycopg.errors.UniqueViolation):
                    continue
                raise
            self._announce(session_id, appended)
            return appended

    def _appended(self, session_id: str, last: int) -> None:
        self._announce(session_id, last)

    def _announce(self, session_id: str, last: int) -> None:
        """Announce that `session_id`'s log reaches `last`, soon, with the appends around it.

        A commit that sends a NOTIFY takes a lock every such commit of the database waits
        for, so appends are not announced one statement each: one task sends the notices of
        every append made while its previous statement ran, in one statement (a session's
        appends as one notice, of its last number). An append is never held up or failed by
        its notice; a notice that cannot be sent is logged (streams re-read the log anyway,
        every `poll_interval`).
        """
        if self._unannounced.get(session_id, 0) < last:
            self._unannounced[session_id] = last
        if self._announcing is None or self._announcing.done():
            self._announcing = asyncio.create_task(self._send_notices(), name="handrail notices")

    async def _send_notices(self) -> None:
        while self._unannounced and not self._closed:
            notices, self._unannounced = self._unannounced, {}
            try:
                await self._fetch(
                    "SELECT pg_notify(%(channel)s, n) FROM unnest(%(notices)b::text[]) AS n",
                    {
                        "channel": self.events_channel,
                        "notices": [f"{last}:{session}" for session, last in notices.items()],
                    },
                    None,
                )
            except StoreError:
                _log.warning(
                    "Could not announce %d session(s)' new events on %s: their streams in other "
                    "processes get them when they next read the log",
                    len(notices),
                    self.masked_dsn,
                    exc_info=True,
                )

    async def events(self, session_id: str, *, after: int = 0, limit: int = 1000) -> LoggedEvents:
        """The events numbered above `after`, in order; see `SessionStore.events`."""
        check_events_page(after, limit)
        async with self._connection(session_id) as connection:
            return await self._read_events(connection, session_id, after, limit)

    async def _read_events(
        self,
        connection: psycopg.AsyncConnection[Any],
        session_id: str,
        after: int,
        limit: int | None,
    ) -> LoggedEvents:
        cursor = await connection.execute(
            f"SELECT seq, event::text FROM {self._s}.handrail_events "
            f"WHERE session_id = %(id)s AND seq > %(after)s ORDER BY seq LIMIT %(limit)s",
            {"id": session_id, "after": after, "limit": limit},
        )
        return [(seq, decode_event(session_id, seq, text)) for seq, text in await cursor.fetchall()]

    # -- leases and wake-ups --------------------------------------------------------------

    async def notify(self, session_id: str) -> None:
        """Wake every listener on this schema, in any process: `pg_notify`."""
        await self._fetch(
            "SELECT pg_notify(%(channel)s, %(id)s)",
            {"channel": self.channel, "id": session_id},
            session_id,
        )

    def listen(self) -> _Subscription[str]:
        """Subscribe to wake-ups over LISTEN/NOTIFY; see `SessionStore.listen`.

        Each subscription holds a connection of its own, outside the pool. If that connection
        is lost, iterating raises a `StoreError`: subscribe again (and poll meanwhile).
        """
        return _Subscription(self, self.channel, str)

    def listen_events(self) -> _Subscription[tuple[str, int]]:
        """Subscribe to every process's event-log appends; see `SessionStore.listen_events`.

        As `listen`: a connection of its own, and a `StoreError` when it is lost.
        """
        return _Subscription(self, self.events_channel, _event_notice)

    async def close(self) -> None:
        """Send the notices of the last appends, end every subscription and close the pool."""
        announcing = self._announcing
        if announcing is not None:
            await asyncio.wait([announcing])
        async with self._opening:
            self._closed = True
            pool, self._pool = self._pool, None
        for subscription in builtins.list(self._subscriptions):
            await subscription.end()
        async with self._claims_opening:
            claims, self._claims = self._claims, None
        if claims is not None:
            with contextlib.suppress(Exception):
                await claims.close()
        if pool is not None:
            await pool.close()


class _Dialect(Dialect):
    """PostgreSQL's statements for the shared plans (`_sql`).

    `%(named)s` parameters, `json` columns, the server's clock (`now` None), arrays in one
    statement, NOTIFY, advisory locks.
    """

    now = _NOW
    positional = "%s"
    lock_row = " FOR UPDATE"
    lease_after_row = True  # claim locks a session's row, then its lease's

    def __init__(self, s: str, schema: str, channel: str) -> None:
        self.s, self.schema, self.channel = s, schema, channel

    def table(self, name: str) -> str:
        return f"{self.s}.handrail_{name}"

    def param(self, name: str) -> str:
        return f"%({name})s"

    def text(self, column: str) -> str:
        return f"{column}::text"

    def json(self, name: str) -> str:
        return f"%({name})s::json"

    def put_messages(self, session_id: str, start: int, texts: builtins.list[str]) -> Statement:
        return Statement(
            f"""INSERT INTO {self.s}.handrail_messages (session_id, position, message)
            SELECT %(id)s, %(start)s + m.ordinality - 1, m.message::json
            FROM unnest(%(messages)b::text[]) WITH ORDINALITY AS m(message, ordinality)""",
            {"id": session_id, "start": start, "messages": texts},
        )

    def put_events(self, session_id: str, first: int, texts: builtins.list[str]) -> Statement:
        return Statement(
            f"""INSERT INTO {self.s}.handrail_events (session_id, seq, event)
            SELECT %(id)s, %(first)s + e.n - 1, e.event::json
            FROM unnest(%(texts)b::text[]) WITH ORDINALITY AS e(event, n)""",
            {"id": session_id, "first": first, "texts": texts},
        )

    def put_cards(
        self,
        summary: SessionSummary,
        cards: builtins.list[WaitingCard],
        texts: builtins.list[str],
    ) -> Statement:
        return Statement(
            _PUT_CARDS.format(s=self.s),
            {
                "id": summary.id,
                "org_id": summary.org_id,
                "user_id": summary.user_id,
                "version": summary.version,
                "created_at": summary.created_at,
                "updated_at": summary.updated_at,
                "expires_at": summary.expires_at,
                "cards": texts,
                "card_fields": [[c.tool_call_id, c.tool, c.kind, c.agent] for c in cards],
                "card_times": [c.created_at for c in cards],
            },
        )

    def cards_with_update(self, change: str) -> str | None:
        # The inbox rows go with the session's row, in the same statement: deleted (the
        # save's own are inserted after), or, kept, moved along with their session.
        name = "moved" if change == "move" else "gone"
        return f"WITH {name} AS ({cards_change_statement(self, change, {}).sql}) "

    def wake(self, session_id: str, now: float | None) -> builtins.list[Statement]:
        # Sent with the commit.
        return [
            Statement(
                "SELECT pg_notify(%(channel)s, %(id)s)", {"channel": self.channel, "id": session_id}
            )
        ]

    def audit_lock(self, org: str) -> Statement:
        # A transaction-scoped advisory lock on the organisation's trail.
        lock = int.from_bytes(
            hashlib.blake2b(f"handrail audit {self.schema} {org}".encode(), digest_size=8).digest(),
            "big",
            signed=True,
        )
        return Statement("SELECT pg_advisory_xact_lock(%(lock)s)", {"lock": lock})

    def events_lock(self, session_id: str) -> Statement:
        # A transaction-scoped advisory lock on the session's event log (two int4 keys: a
        # class of handrail's own, and the session id's hash; a collision only serialises).
        return Statement(
            "SELECT pg_advisory_xact_lock(%(lock_class)s, hashtext(%(id)s))",
            {"lock_class": _EVENTS_LOCK, "id": session_id},
        )


async def _run(connection: psycopg.AsyncConnection[Any], plan: Plan[T]) -> T:
    """Run a plan of `_sql` on `connection`, one statement after the other: its value."""
    result: Result | None = None
    while True:
        try:
            statement = plan.send(result)  # type: ignore[arg-type]  # None starts it
        except StopIteration as stop:
            value: T = stop.value
            return value
        if statement.rows is not None:
            async with connection.cursor() as cursor:
                await cursor.executemany(statement.sql, statement.rows)
                result = Result([], cursor.rowcount)
        else:
            cursor = await connection.execute(statement.sql, statement.params)
            rows = await cursor.fetchall() if cursor.description is not None else []
            result = Result(rows, cursor.rowcount)


def _event_notice(payload: str) -> tuple[str, int]:
    """`(session_id, last)` from an event notice's payload, `last:session_id`."""
    last, _, session_id = payload.partition(":")
    return session_id, int(last)


class _Subscription(Generic[T]):
    """`async with store.listen() as wakeups`: a LISTEN connection, read by a pump task.

    Each notification's payload is read with `parse` (`str` for wake-ups).
    """

    def __init__(self, store: PostgresStore, channel: str, parse: Callable[[str], T]) -> None:
        self._store = store
        self._channel = channel
        self._parse = parse
        self._queue: asyncio.Queue[T | StoreError | None] = asyncio.Queue()
        self._connection: psycopg.AsyncConnection[Any] | None = None
        self._pump: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Subscription[T]:
        store = self._store
        if store._closed:
            raise StoreError(f"This PostgresStore ({store.masked_dsn}) is closed: make a new one.")
        try:
            self._connection = await store._connect()
            await self._connection.execute(f'LISTEN "{self._channel}"')
        except psycopg.Error as error:
            await self.end()
            raise store._error(error, None) from error
        # The pump reads notifications into a queue, so that a waiter may time out or be
        # cancelled without disturbing the connection.
        self._pump = asyncio.create_task(self._read(self._connection))
        store._subscriptions.add(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.end()

    async def _read(self, connection: psycopg.AsyncConnection[Any]) -> None:
        try:
            async for notification in connection.notifies():
                self._queue.put_nowait(self._parse(notification.payload))
        except psycopg.Error as error:
            self._queue.put_nowait(
                StoreUnavailableError(
                    f"Lost the PostgreSQL connection listening for wake-ups "
                    f"({self._store.masked_dsn}): {error}. Subscribe again."
                )
            )

    async def end(self) -> None:
        """Stop listening and close the connection; iteration then ends."""
        self._store._subscriptions.discard(self)
        pump, self._pump = self._pump, None
        connection, self._connection = self._connection, None
        try:
            if pump is not None:
                pump.cancel()
                await asyncio.wait([pump])
        finally:
            if connection is not None:
                await connection.close()
            self._queue.put_nowait(None)

    def __aiter__(self) -> _Subscription[T]:
        return self

    async def __anext__(self) -> T:
        item = await self._queue.get()
        if item is None or isinstance(item, StoreError):
            self._queue.put_nowait(item)  # every later call ends (or fails) the same way
            if item is None:
                raise StopAsyncIteration
            raise item
        return item


def _record(session_id: str, row: tuple[Any, ...]) -> SessionRecord:
    """A session as `_load_sql` reads it: the row, then its messages from the window on."""
    record = record_from_row(row)
    record.messages = [
        decode_message(session_id, position, text)
        for position, text in enumerate(row[10] or (), record.window)
    ]
    return record


def _require_psycopg() -> None:
    """Raise `MissingExtraError` when psycopg or psycopg-pool is not installed."""
    if _missing is not None:
        raise MissingExtraError(
            "PostgresStore", needs="psycopg and psycopg-pool", extra="postgres"
        ) from _missing


def mask_dsn(dsn: str) -> str:
    """`dsn` with any password replaced by `***`."""
    _require_psycopg()
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:  # unparseable: mask what looks like a password anyway
        return re.sub(r"(password\s*=\s*)\S+|(://[^:/@]*:)[^@]*(@)", r"\1\2***\3", dsn)
    if "password" in params:
        params["password"] = "***"
    return make_conninfo("", **params)
