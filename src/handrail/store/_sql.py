"""What the SQL stores share: the rules of a save, written once, over a small dialect.

A save is a *plan*: a generator that yields `Statement`s and is sent each one's `Result`
(its rows and row count). It holds the rules: the checks before anything is written
(`prepare_save`, shared by the memory store too), the rows a record becomes, the order of the
writes in the save's one transaction, the compare-and-swap and the conflict it raises, the
message gap check, the inbox rows, the grouped writes (`lease=`, `started=`, `release=`,
`notify=`, the audit entries) and the audit chain step. A store only runs a plan on its own
connection (`SqliteStore`'s thread with a sync cursor, `PostgresStore`'s async psycopg one)
and gives the `Dialect`: its table names, placeholders, JSON columns, clock, the statements
that differ (how messages and cards are inserted, a wake-up, the audit trail's lock).

Adding a write to a save is one more step in `save_plan` (and, where it is not plain SQL, one
dialect method); see docs/stores.md, "Writing a store".
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

from ..audit import AuditEntry, AuditKey
from ..exceptions import ConflictError, StoreError
from ._base import SessionRecord, SessionSummary, ToolLogEntry, WaitingCard, lease_lost
from ._codec import (
    chain_audit,
    check_messages,
    check_save,
    check_ttl,
    decode,
    decode_message,
    encode,
    encode_events,
    encode_messages,
    exists_error,
    not_started_error,
    parse_export,
    summary_from_row,
)
from ._waiting import card_text, stored_cards

__all__ = [
    "SESSION_TABLES",
    "SUMMARY",
    "Dialect",
    "PreparedImport",
    "PreparedSave",
    "Result",
    "Statement",
    "append_audit_plan",
    "append_events_plan",
    "audit_query",
    "build_index_plan",
    "import_plan",
    "lease_statement",
    "list_query",
    "log_finished_plan",
    "log_started_plan",
    "prepare_import",
    "prepare_save",
    "read_log_statement",
    "save_plan",
]

T = TypeVar("T")

SUMMARY = "id, org_id, user_id, status, version, created_at, updated_at, expires_at"
"""A session's summary columns, in the order `summary_from_row` reads them."""

ARGS = "tool-call arguments"


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement of a plan: its SQL and named parameters (`rows`: run once a row)."""

    sql: str
    params: dict[str, Any] | list[Any] = field(default_factory=dict)  # named, or positional
    rows: list[dict[str, Any]] | None = None  # executemany


@dataclass(frozen=True, slots=True)
class Result:
    """What a statement gave back: its rows (none for executemany) and its row count."""

    rows: list[Any]
    rowcount: int


Plan = Generator[Statement, Result, T]
"""A unit of store work: statements out, results in, its value at the end."""


class Dialect:
    """What differs between two SQL databases, for the plans. A store subclasses it.

    The defaults are SQL both SQLite and PostgreSQL take; a store overrides the rest.
    """

    now = ":now"
    """The expression of the current time (a statement's `now` parameter may be None)."""

    positional = "?"
    """The placeholder of a positional parameter (`waiting_query`'s)."""

    lock_row = ""
    """What locks a row read before it is written (`" FOR UPDATE"`), where a lock is needed."""

    lease_after_row = False
    """Whether a save takes its lease after the session's row (where rows are locked one by
    one, in the order `claim` locks them, or the two deadlock), rather than first (a database
    with one writer at a time: nothing is written before a lease held by another refuses)."""

    def table(self, name: str) -> str:
        """The table `handrail_<name>` as statements name it (a schema before it, say)."""
        raise NotImplementedError

    def param(self, name: str) -> str:
        """The placeholder of the named parameter `name`."""
        raise NotImplementedError

    def json(self, name: str) -> str:
        """The placeholder of a parameter written to a JSON column (its text)."""
        return self.param(name)

    def text(self, column: str) -> str:
        """A JSON or text column read back as the codec decodes it (text, or bytes)."""
        return column

    def put_messages(self, session_id: str, start: int, texts: list[str]) -> Statement:
        """Insert a save's messages (JSON texts) at positions `start` on."""
        raise NotImplementedError

    def put_events(self, session_id: str, first: int, texts: list[str]) -> Statement:
        """Insert events (JSON texts) into the session's event log, numbered from `first`."""
        return Statement(
            f"INSERT INTO {self.table('events')} (session_id, seq, event) "
            f"VALUES ({self.p('id', 'seq')}, {self.json('event')})",
            rows=[
                {"id": session_id, "seq": seq, "event": text}
                for seq, text in enumerate(texts, first)
            ],
        )

    def put_cards(
        self, summary: SessionSummary, cards: list[WaitingCard], texts: list[str]
    ) -> Statement:
        """Insert a session's inbox rows (`cards`, their JSON `texts`; `summary`: as saved)."""
        raise NotImplementedError

    def cards_with_update(self, change: str) -> str | None:
        """A prefix folding the inbox rows' `change` into the session's UPDATE, or None."""
        return None

    def wake(self, session_id: str, now: float | None) -> list[Statement]:
        """The statements of a wake-up sent with the save's commit (`notify=True`)."""
        raise NotImplementedError

    def audit_lock(self, org: str) -> Statement | None:
        """A statement serialising appends to the trail of `org` till the commit, if needed."""
        return None

    def events_lock(self, session_id: str) -> Statement | None:
        """A statement serialising appends to the session's event log till the commit.

        Where two writers may append at once (else they would take one number); else None.
        """
        return None

    # -- statements the same in every dialect, but for names and placeholders ------------

    def p(self, *names: str) -> str:
        return ", ".join(self.param(name) for name in names)


@dataclass(slots=True)
class PreparedSave:
    """A save checked and encoded, before any write: what every store writes from.

    Read off the record at once (the caller may change it while the save waits).
    """

    record: SessionRecord  # a copy: the messages checked against the stored count
    session_id: str
    expected: int  # the version the save replaces (0: a new session)
    data: str
    messages: list[str]
    audit: list[AuditEntry]
    started: list[tuple[ToolLogEntry, str]]  # an entry and its arguments' JSON text
    cards: list[WaitingCard] | None
    card_texts: list[str]
    lease: tuple[str, float] | None
    release: str | None
    notify: bool
    events: list[str]  # the events' JSON texts, to append to the event log
    now: float | None  # the store's clock, or None for the database's

    @property
    def indexed(self) -> bool:
        """Whether the session is left suspended, so in the inbox index."""
        return self.record.status == "suspended"

    @property
    def cards_change(self) -> Literal["move", "replace"]:
        """What the save does to its session's inbox rows: keep or replace them.

        A suspended session saved without `cards` keeps its rows (moved along with it).
        """
        return "move" if self.indexed and self.cards is None else "replace"

    def params(self) -> dict[str, Any]:
        """The named parameters of the save's statements."""
        r = self.record
        return {
            "id": self.session_id,
            "org_id": r.org_id,
            "user_id": r.user_id,
            "status": r.status,
            "expires_at": r.expires_at,
            "data": self.data,
            "window": r.window,
            "version": self.expected,
            "now": self.now,
            "start": r.messages_from,
        }


def prepare_save(
    record: SessionRecord,
    *,
    lease: tuple[str, float] | None = None,
    release: str | None = None,
    started: Sequence[ToolLogEntry] = (),
    notify: bool = False,
    events: Sequence[dict[str, Any]] = (),
    now: float | None = None,
) -> PreparedSave:
    """Every save's checks and encodings: a record no store keeps fails here, unwritten.

    Raises:
        StoreError, ValueError: what `check_save`, `check_ttl` and the encoders raise.
    """
    check_save(record)
    if lease is not None:
        check_ttl(lease[1])
    session_id = record.id
    cards = record.cards[:] if record.cards is not None else None
    return PreparedSave(
        record=replace(record, messages=record.messages[:]),
        session_id=session_id,
        expected=record.version,
        data=encode(session_id, record.data),
        messages=encode_messages(session_id, record.messages),
        audit=record.audit[:],
        started=[(e, encode(session_id, e.args, what=ARGS)) for e in started],
        cards=cards,
        card_texts=[card_text(session_id, card) for card in cards or ()],
        lease=lease,
        release=release,
        notify=notify,
        events=encode_events(session_id, list(events)) if events else [],
        now=now,
    )


def lease_statement(
    d: Dialect, session_id: str, owner: str, ttl: float, now: float | None
) -> Statement:
    """Take or renew `owner`'s lease (one upsert; row count 0: another holds it)."""
    leases = d.table("leases")
    return Statement(
        f"""INSERT INTO {leases} (session_id, owner, expires_at)
            VALUES ({d.p("id", "owner")}, {d.now} + {d.param("ttl")})
            ON CONFLICT (session_id) DO UPDATE
                SET owner = excluded.owner, expires_at = excluded.expires_at
                WHERE {leases}.owner = excluded.owner OR {leases}.expires_at <= {d.now}""",
        {"id": session_id, "owner": owner, "ttl": ttl, "now": now},
    )


def claimable_statement(
    d: Dialect, session_id: str, due: float, owner: str, now: float | None, also: str = ""
) -> Statement:
    """The session's summary if a woken worker should drive it (`take_wakeup`), else no row.

    Due (`expires_at` at or before `due`), its lease free, lapsed or `owner`'s. `also`: a
    column more, evaluated only for the row that qualifies (PostgreSQL's claim).
    """
    columns = ", ".join(f"s.{c}" for c in SUMMARY.split(", "))
    return Statement(
        f"""SELECT {columns}{also} FROM {d.table("sessions")} s
            LEFT JOIN {d.table("leases")} l ON l.session_id = s.id
            WHERE s.id = {d.param("id")} AND s.expires_at IS NOT NULL
                AND s.expires_at <= {d.param("due")}
                AND (l.session_id IS NULL OR l.owner = {d.param("owner")}
                    OR l.expires_at <= {d.now})""",
        {"id": session_id, "due": due, "owner": owner, "now": now},
    )


def release_statement(d: Dialect, session_id: str, owner: str) -> Statement:
    """Give `owner`'s lease back (row count 0: not held by it)."""
    return Statement(
        f"DELETE FROM {d.table('leases')} WHERE session_id = {d.param('id')} "
        f"AND owner = {d.param('owner')}",
        {"id": session_id, "owner": owner},
    )


def started_sql(d: Dialect) -> str:
    """Log a call as started, never overwriting (row count 0: logged already)."""
    return f"""INSERT INTO {d.table("tool_log")}
        (session_id, tool_call_id, key, tool, args, status, started_at)
        VALUES ({d.p("session_id", "tool_call_id", "key", "tool")}, {d.json("args")},
                'started', {d.now})
        ON CONFLICT (session_id, tool_call_id) DO NOTHING"""


def started_row(
    session_id: str, tool_call_id: str, key: str, tool: str, args: str, now: float | None
) -> dict[str, Any]:
    """The parameters of `started_sql` (`args`: the arguments' JSON text)."""
    return {
        "session_id": session_id,
        "tool_call_id": tool_call_id,
        "key": key,
        "tool": tool,
        "args": args,
        "now": now,
    }


def _take_lease(d: Dialect, save: PreparedSave) -> Plan[None]:
    """Take or renew the save's lease (`lease=`), or `lease_lost`: held by another."""
    assert save.lease is not None
    owner, ttl = save.lease
    taken = yield lease_statement(d, save.session_id, owner, ttl, save.now)
    if not taken.rowcount:
        raise lease_lost(save.session_id, owner)


def save_plan(
    d: Dialect, save: PreparedSave, audit_key: AuditKey | None
) -> Plan[tuple[Any, Any, int]]:
    """A save, in its one transaction: `(created_at, updated_at, last event)`.

    The session's times as stored, and the number of the last event it appended (0: none).

    The order: the lease (`lease=`; after the session's row where the dialect says so:
    `Dialect.lease_after_row`), the session's row (compare-and-swap on the version), its
    messages (checked against the stored count: no gap), its inbox rows, then the grouped
    writes (`started=`, `release=`, `notify=`, `events=`) and last the audit entries (whose
    trail lock, where the dialect takes one, is held the shortest).

    Raises:
        LeaseLostError: `lease=` is held by another owner.
        ConflictError: the stored version is not `save.expected`.
        ValueError: the messages leave a gap after the stored ones.
    """
    params = save.params()
    sessions = d.table("sessions")
    if save.lease is not None and not d.lease_after_row:
        yield from _take_lease(d, save)
    if save.expected == 0:
        sql = f"""INSERT INTO {sessions} ({SUMMARY}, data, window_start)
            VALUES ({d.p("id", "org_id", "user_id", "status")}, 1, {d.now}, {d.now},
                    {d.param("expires_at")}, {d.json("data")}, {d.param("window")})
            ON CONFLICT (id) DO NOTHING
            RETURNING created_at, updated_at"""
        folded = True  # a new session has no inbox rows yet
    else:
        prefix = d.cards_with_update(save.cards_change)
        folded = prefix is not None
        sql = f"""{prefix or ""}UPDATE {sessions}
            SET org_id = {d.param("org_id")}, user_id = {d.param("user_id")},
                status = {d.param("status")}, version = version + 1, updated_at = {d.now},
                expires_at = {d.param("expires_at")}, data = {d.json("data")},
                window_start = {d.param("window")}
            WHERE id = {d.param("id")} AND version = {d.param("version")}
            RETURNING created_at, updated_at"""
    written = yield Statement(sql, params)
    if not written.rows:
        found = yield Statement(
            f"SELECT version FROM {sessions} WHERE id = {d.param('id')}", params
        )
        actual = found.rows[0][0] if found.rows else None
        raise ConflictError(save.session_id, expected=save.expected, actual=actual)
    if save.lease is not None and d.lease_after_row:
        yield from _take_lease(d, save)
    created_at, updated_at = written.rows[0]
    messages = d.table("messages")
    counted = yield Statement(
        f"SELECT COALESCE(MAX(position) + 1, 0) FROM {messages} WHERE session_id = {d.param('id')}",
        params,
    )
    stored: int = counted.rows[0][0] if counted.rows else 0
    check_messages(save.record, stored)
    if stored > save.record.messages_from:  # what the save replaces
        yield Statement(
            f"DELETE FROM {messages} WHERE session_id = {d.param('id')} "
            f"AND position >= {d.param('start')}",
            params,
        )
    if save.messages:
        yield d.put_messages(save.session_id, save.record.messages_from, save.messages)
    # The inbox rows: kept and moved along, or replaced by the save's own.
    if not folded:
        yield cards_change_statement(d, save.cards_change, params)
    if save.indexed and save.cards:
        summary = replace(
            save.record.summary(),
            version=save.expected + 1,
            created_at=created_at,
            updated_at=updated_at,
        )
        yield d.put_cards(summary, save.cards, save.card_texts)
    # The grouped writes, in the save's transaction: one more is one more step here.
    if save.started:
        yield Statement(
            started_sql(d),
            rows=[
                started_row(save.session_id, e.tool_call_id, e.key, e.tool, args, save.now)
                for e, args in save.started
            ],
        )
    if save.release is not None:
        yield release_statement(d, save.session_id, save.release)
    if save.notify:
        for statement in d.wake(save.session_id, save.now):
            _ = yield statement  # (not `yield from` a list: it would refuse `send`)
    last_event = 0
    if save.events:
        last_event = yield from append_events_plan(d, save.session_id, save.events)
    for entry in save.audit:
        yield from append_audit_plan(d, entry, audit_key)
    return created_at, updated_at, last_event


def append_events_plan(d: Dialect, session_id: str, texts: list[str]) -> Plan[int]:
    """Number events (JSON texts) after the session's last and append them: the last number.

    Inside a transaction, after the dialect's lock on the session's log (`events_lock`), so
    that two appends never take one number (an append in a save cannot try again).
    """
    lock = d.events_lock(session_id)
    if lock is not None:
        yield lock
    events = d.table("events")
    counted = yield Statement(
        f"SELECT COALESCE(MAX(seq), 0) FROM {events} WHERE session_id = {d.param('id')}",
        {"id": session_id},
    )
    last: int = counted.rows[0][0] if counted.rows else 0
    yield d.put_events(session_id, last + 1, texts)
    return last + len(texts)


def cards_change_statement(d: Dialect, change: str, params: dict[str, Any]) -> Statement:
    """The inbox rows' `change` by a save of an existing session (`PreparedSave.params`)."""
    cards = d.table("cards")
    if change == "move":  # the rows stand; their session moved
        return Statement(
            f"""UPDATE {cards} SET org_id = {d.param("org_id")}, user_id = {d.param("user_id")},
                version = {d.param("version")} + 1, updated_at = {d.now},
                expires_at = {d.param("expires_at")} WHERE session_id = {d.param("id")}""",
            params,
        )
    return Statement(f"DELETE FROM {cards} WHERE session_id = {d.param('id')}", params)


def append_audit_plan(d: Dialect, entry: AuditEntry, key: AuditKey | None) -> Plan[AuditEntry]:
    """Chain `entry` after its organisation's last and insert it (inside a write transaction).

    The dialect's lock (if any) keeps two appends from reading the same tail; the primary key
    (org, seq) refuses a forked chain anyway.
    """
    org = entry.org_id or ""
    audit = d.table("audit")
    lock = d.audit_lock(org)
    if lock is not None:
        yield lock
    tail = yield Statement(
        f"SELECT seq, hash FROM {audit} WHERE org_id = {d.param('org')} ORDER BY seq DESC LIMIT 1",
        {"org": org},
    )
    last = (tail.rows[0][0], tail.rows[0][1]) if tail.rows else None
    chained, text = chain_audit(entry, last, key)
    yield Statement(
        f"INSERT INTO {audit} (org_id, seq, kind, session_id, tool, hash, entry, who) VALUES "
        f"({d.p('org', 'seq', 'kind', 'session_id', 'tool', 'hash', 'entry', 'who')})",
        {
            "org": org,
            "seq": chained.seq,
            "kind": chained.kind,
            "session_id": chained.session_id,
            "tool": chained.tool,
            "hash": chained.hash,
            "entry": text,
            "who": chained.who,
        },
    )
    return chained


@dataclass(slots=True)
class PreparedImport:
    """An export document read, checked and encoded, before any write (`prepare_import`)."""

    record: SessionRecord
    data: str
    messages: list[str]
    entries: list[ToolLogEntry]  # the tool-call log, as read
    log: list[dict[str, Any]]  # its rows: the entries' parameters, arguments and result as JSON
    events: list[tuple[int, str]]  # (seq, the event's JSON text)
    cards: list[WaitingCard]  # the inbox rows, if the session is suspended
    card_texts: list[str]


def prepare_import(document: str) -> PreparedImport:
    """Every import's reading and checks: a document no store keeps fails here, unwritten.

    Raises:
        StoreError: not an export handrail reads, or a value JSON cannot carry.
    """
    record, log, events = parse_export(document)
    session_id = record.id
    texts = encode_events(session_id, [event for _, event in events])
    cards = []
    if record.status == "suspended":
        cards = stored_cards(record.data, record.messages[record.window :], record.window)
    return PreparedImport(
        record=record,
        data=encode(session_id, record.data),
        messages=encode_messages(session_id, record.messages),
        entries=log,
        log=[
            {
                "session_id": session_id,
                "tool_call_id": e.tool_call_id,
                "key": e.key,
                "tool": e.tool,
                "args": encode(session_id, e.args, what=ARGS),
                "status": e.status,
                "result": None if e.result is None else encode(session_id, e.result, what="result"),
                "started_at": e.started_at,
                "finished_at": e.finished_at,
            }
            for e in log
        ],
        events=[(seq, text) for (seq, _), text in zip(events, texts, strict=True)],
        cards=cards,
        card_texts=[card_text(session_id, card) for card in cards],
    )


def import_plan(d: Dialect, prepared: PreparedImport, *, overwrite: bool) -> Plan[int]:
    """An import, in one transaction: the version the session is stored at.

    A session of the same id is replaced (`overwrite`), its logs with it, at a version above
    both; no message or inbox row of an earlier session of the id is left.

    Raises:
        SessionExistsError: the session exists and not `overwrite`.
    """
    record = prepared.record
    sessions = d.table("sessions")
    params: dict[str, Any] = {
        "id": record.id,
        "org_id": record.org_id,
        "user_id": record.user_id,
        "status": record.status,
        "version": record.version,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "expires_at": record.expires_at,
        "data": prepared.data,
        "window": record.window,
    }
    by_id = f"session_id = {d.param('id')}"
    while True:
        found = yield Statement(
            f"SELECT version FROM {sessions} WHERE id = {d.param('id')}{d.lock_row}", params
        )
        if found.rows:
            if not overwrite:
                raise exists_error(record.id, found.rows[0][0])
            params["version"] = max(record.version, found.rows[0][0]) + 1
            yield Statement(
                f"""UPDATE {sessions}
                SET org_id = {d.param("org_id")}, user_id = {d.param("user_id")},
                    status = {d.param("status")}, version = {d.param("version")},
                    created_at = {d.param("created_at")}, updated_at = {d.param("updated_at")},
                    expires_at = {d.param("expires_at")}, data = {d.json("data")},
                    window_start = {d.param("window")}
                WHERE id = {d.param("id")}""",
                params,
            )
            yield Statement(f"DELETE FROM {d.table('tool_log')} WHERE {by_id}", params)
            yield Statement(f"DELETE FROM {d.table('events')} WHERE {by_id}", params)
            break
        inserted = yield Statement(
            f"""INSERT INTO {sessions} ({SUMMARY}, data, window_start)
            VALUES ({d.p("id", "org_id", "user_id", "status", "version", "created_at")},
                    {d.p("updated_at", "expires_at")}, {d.json("data")}, {d.param("window")})
            ON CONFLICT (id) DO NOTHING""",
            params,
        )
        if inserted.rowcount:
            break
        # Created meanwhile by someone else: the next SELECT sees it.
    # (Always: no message or card of an earlier session of this id can be left.)
    yield Statement(f"DELETE FROM {d.table('cards')} WHERE {by_id}", params)
    yield Statement(f"DELETE FROM {d.table('messages')} WHERE {by_id}", params)
    if prepared.messages:
        yield d.put_messages(record.id, 0, prepared.messages)
    if prepared.cards:
        summary = replace(record.summary(), version=params["version"])
        yield d.put_cards(summary, prepared.cards, prepared.card_texts)
    if prepared.log:
        yield Statement(
            f"""INSERT INTO {d.table("tool_log")}
            (session_id, tool_call_id, key, tool, args, status, result, started_at, finished_at)
            VALUES ({d.p("session_id", "tool_call_id", "key", "tool")}, {d.json("args")},
                    {d.param("status")}, {d.json("result")}, {d.param("started_at")},
                    {d.param("finished_at")})""",
            rows=prepared.log,
        )
    if prepared.events:
        yield Statement(
            f"INSERT INTO {d.table('events')} (session_id, seq, event) "
            f"VALUES ({d.p('id', 'seq')}, {d.json('event')})",
            rows=[{"id": record.id, "seq": seq, "event": text} for seq, text in prepared.events],
        )
    return int(params["version"])


def log_started_plan(
    d: Dialect, row: dict[str, Any], lease: tuple[str, float] | None, now: float | None
) -> Plan[bool]:
    """Log a call as started (`started_row`), never overwriting: whether it was new.

    With `lease`, the lease is taken or renewed first, in the same transaction.

    Raises:
        LeaseLostError: `lease` is held by another owner.
    """
    if lease is not None:
        taken = yield lease_statement(d, row["session_id"], lease[0], lease[1], now)
        if not taken.rowcount:
            raise lease_lost(row["session_id"], lease[0])
    logged = yield Statement(started_sql(d), row)
    return bool(logged.rowcount)


def log_finished_plan(
    d: Dialect,
    session_id: str,
    tool_call_id: str,
    result: str,
    now: float | None,
    audit: AuditEntry | None,
    key: AuditKey | None,
) -> Plan[bool]:
    """Record a started call's result (JSON text): False if it was finished already.

    With `audit`, the entry is appended in the same statement group (the caller's transaction).

    Raises:
        ToolLogError: the call was never logged as started.
    """
    log = d.table("tool_log")
    params = {"session_id": session_id, "tool_call_id": tool_call_id, "result": result, "now": now}
    where = f"session_id = {d.param('session_id')} AND tool_call_id = {d.param('tool_call_id')}"
    updated = yield Statement(
        f"""UPDATE {log} SET status = 'finished', result = {d.json("result")},
            finished_at = {d.now} WHERE {where} AND status = 'started'""",
        params,
    )
    if updated.rowcount:
        if audit is not None:
            yield from append_audit_plan(d, audit, key)
        return True
    found = yield Statement(f"SELECT 1 FROM {log} WHERE {where}", params)
    if found.rows:
        return False  # finished already: the first result stands
    raise not_started_error(session_id, tool_call_id)


SESSION_TABLES = ("tool_log", "events", "leases", "messages", "cards")
"""The tables with a session's rows besides its own (`session_id`): what `delete` clears."""


def list_query(
    d: Dialect,
    *,
    org_id: str | None,
    user_id: str | None,
    status: str | None,
    updated_after: float | None,
    updated_before: float | None,
    limit: int,
    offset: int,
) -> Statement:
    """`SessionStore.list`: the summaries matching every filter, newest first."""
    filters = {
        "org_id": ("org_id =", org_id),
        "user_id": ("user_id =", user_id),
        "status": ("status =", status),
        "after": ("updated_at >", updated_after),
        "before": ("updated_at <", updated_before),
    }
    used = {name: test for name, test in filters.items() if test[1] is not None}
    where = " AND ".join(f"{test} {d.param(name)}" for name, (test, _) in used.items())
    return Statement(
        f"SELECT {SUMMARY} FROM {d.table('sessions')}"
        f"{' WHERE ' + where if where else ''}"
        f" ORDER BY updated_at DESC, id DESC LIMIT {d.param('limit')} OFFSET {d.param('offset')}",
        {**{name: value for name, (_, value) in used.items()}, "limit": limit, "offset": offset},
    )


def audit_query(
    d: Dialect,
    org_id: str | None,
    *,
    after: int,
    limit: int,
    session_id: str | None,
    tool: str | None,
    kind: str | None,
    who: str | None = None,
    before: int | None = None,
    newest_first: bool = False,
) -> Statement:
    """`SessionStore.audit`: an organisation's entries after `after`, rows of (seq, text).

    With `who`, read off the (org_id, who, kind, seq) index, backward for `newest_first`.
    """
    sql = f"SELECT seq, entry FROM {d.table('audit')} WHERE org_id = {d.param('org')}"
    sql += f" AND seq > {d.param('after')}"
    params: dict[str, Any] = {"org": org_id or "", "after": after, "limit": limit}
    if before is not None:
        sql += f" AND seq < {d.param('before')}"
        params["before"] = before
    filters = (("session_id", session_id), ("tool", tool), ("kind", kind), ("who", who))
    for column, value in filters:
        if value is not None:
            sql += f" AND {column} = {d.param(column)}"
            params[column] = value
    order = "seq DESC" if newest_first else "seq"
    return Statement(sql + f" ORDER BY {order} LIMIT {d.param('limit')}", params)


LOG = "tool_call_id, key, tool, args, status, result, started_at, finished_at"
"""A tool-call log row's columns, in the order `log_entry_from_row` reads them."""


def read_log_statement(
    d: Dialect, session_id: str, calls: Sequence[str] | None = None
) -> Statement:
    """A session's tool-call log, in start order (`log_entry_from_row` reads a row).

    With `calls` (ids, each once), only theirs: `tool_call_id IN (...)`, read through the
    table's unique `(session_id, tool_call_id)` index, so the read does not grow with the log.
    """
    columns = LOG.replace("args", d.text("args")).replace("result", d.text("result"))
    sql = f"SELECT {columns} FROM {d.table('tool_log')} WHERE session_id = {d.param('id')}"
    params: dict[str, Any] = {"id": session_id}
    if calls is not None:
        names = [f"call{n}" for n in range(len(calls))]
        sql += f" AND tool_call_id IN ({d.p(*names)})"
        params.update(zip(names, calls, strict=True))
    return Statement(sql + " ORDER BY seq", params)


def build_index_plan(d: Dialect) -> Plan[None]:
    """Migration 5: the inbox rows of every suspended session, read from its stored form."""
    found = yield Statement(
        f"SELECT {SUMMARY}, {d.text('data')}, window_start FROM {d.table('sessions')} "
        f"WHERE status = 'suspended'"
    )
    for row in found.rows:
        summary, window = summary_from_row(row[:8]), row[9]
        read = yield Statement(
            f"SELECT position, {d.text('message')} FROM {d.table('messages')} "
            f"WHERE session_id = {d.param('id')} AND position >= {d.param('window')} "
            f"ORDER BY position",
            {"id": summary.id, "window": window},
        )
        try:
            data = decode(summary.id, row[8])
            messages = [decode_message(summary.id, p, text) for p, text in read.rows]
        except StoreError:
            continue  # unreadable: the inbox could not show it either
        cards = stored_cards(data, messages, window)
        if cards:
            texts = [card_text(summary.id, card) for card in cards]
            yield d.put_cards(summary, cards, texts)
