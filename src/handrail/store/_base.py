"""What every session store shares: the records it keeps and the `SessionStore` protocol.

A store is deliberately ignorant of what a session contains: it keeps one small opaque JSON
document a session (`SessionRecord.data`, what changes from step to step) and the session's
messages apart, one row a message by position (`SessionRecord.messages`), so that a save
writes what changed and a load reads what a turn needs, however long the history. Next to
them: the metadata it can index and query (scope, status, times), a log of tool calls for
crash recovery, leases so that one worker at a time drives a session, an event log that a
client reconnecting to a run reads from, and a wake-up channel between workers.
"""

from __future__ import annotations

import builtins
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args, runtime_checkable

from ..audit import AuditEntry, AuditKind
from ..exceptions import SessionBusyError

__all__ = [
    "Clock",
    "SessionRecord",
    "SessionStatus",
    "SessionStore",
    "SessionSummary",
    "ToolCallStatus",
    "ToolLogEntry",
    "WaitingCard",
    "WaitingRow",
]

SessionStatus = Literal["active", "suspended", "completed", "failed"]
"""Where a session stands: running or idle (`active`), waiting for a human or a client
(`suspended`), or finished (`completed`, `failed`)."""
SESSION_STATUSES: frozenset[str] = frozenset(get_args(SessionStatus))

ToolCallStatus = Literal["started", "finished"]
"""A logged tool call has `started` (it may have had its effect) or `finished` (with a result)."""

Clock = Callable[[], float]
"""Wall time in seconds since the epoch; injectable so that tests control expiry."""


def wall_clock() -> float:
    """The default clock: `time.time()`."""
    return time.time()


@dataclass(kw_only=True, slots=True)
class SessionSummary:
    """A stored session without its document: what `SessionStore.list` and `due` return."""

    id: str
    """The session's id, unique in the store."""
    org_id: str | None = None
    """The organisation the session belongs to (indexed, for tenant-scoped queries)."""
    user_id: str | None = None
    """The user the session belongs to (indexed)."""
    status: SessionStatus = "active"
    """Where the session stands."""
    version: int = 0
    """The compare-and-swap counter: 0 for a session never saved; each save adds one."""
    created_at: float = 0.0
    """When the session was first saved (epoch seconds, from the store's clock)."""
    updated_at: float = 0.0
    """When the session was last saved (epoch seconds, from the store's clock)."""
    expires_at: float | None = None
    """When the session next needs a worker, or `None` (nothing to do until someone acts).

    The engine sets it: a waiting card's deadline; the time of the save for a turn whose every
    call is decided (it is ready to resume); when a running turn's lease would lapse, were its
    worker to die. The store only indexes it, so that `SessionStore.due` and
    `SessionStore.claim` find exactly what a worker must handle.
    """


@dataclass(kw_only=True, slots=True)
class WaitingCard:
    """A call of a suspended session that waits for a decision: one row of the inbox index.

    The engine computes a session's (`SessionRecord.cards`) from its state at every save, and
    the store writes them in the save's transaction, so the index never disagrees with the
    session. The store reads none of it but the columns it filters on.
    """

    tool_call_id: str
    """The call (unique within its session)."""
    tool: str
    """The tool's name (a batch card's is the capture's)."""
    kind: str
    """What is asked: `approval`, `batch`, `elicitation`, `client_exec`, `recovery`."""
    agent: str | None = None
    """The suspended agent, whose tools' policies say who decides the call."""
    created_at: float | None = None
    """When the card was raised (epoch seconds)."""
    card: dict[str, Any] = field(default_factory=dict)
    """The card as stored in the session (JSON-compatible): what an inbox shows of it."""


@dataclass(kw_only=True, slots=True)
class WaitingRow:
    """A waiting card as `SessionStore.waiting` finds it: with its session and place."""

    session: SessionSummary
    """The session that waits (as of the save that wrote the card)."""
    position: int
    """The card's place among its session's cards, in the order they were raised (from 0)."""
    card: WaitingCard
    """The card."""

    @property
    def key(self) -> tuple[float, str, int]:
        """Where the row stands in the index's order: pass it as `after=` for the rows after."""
        return (self.session.updated_at, self.session.id, self.position)


@dataclass(kw_only=True, slots=True)
class SessionRecord(SessionSummary):
    """A session as stored: its metadata and its document.

    Load one, change it, and save it back: the save succeeds only if nobody saved the session
    in between (see `SessionStore.save`).
    """

    data: dict[str, Any] = field(default_factory=dict)
    """The session document: JSON-compatible values only (dicts with string keys, lists,
    strings, finite numbers, booleans and `None`). The store never looks inside."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """Messages of the session from position `messages_from` on, one JSON-compatible dict a
    message (the store never looks inside them either).

    Loaded: those from `window` to the last one. Saved: they replace the stored messages from
    `messages_from` on (those before are kept as stored, any stored after them are deleted),
    so a save writes only what changed."""
    messages_from: int = 0
    """The position of `messages[0]` in the session's history (0: its first message)."""
    window: int = 0
    """Where `load` starts reading messages: the messages before it are not needed to drive
    the session (a summary in `data` stands for them). Saved with the record; the history
    before it is still stored, and read with `SessionStore.messages`."""
    audit: list[AuditEntry] = field(default_factory=list)
    """Audit entries to append with this save, in its transaction (`handrail.audit`): each
    chained at the end of its organisation's trail, so a save that fails appends none, and
    one that succeeds appends them all. Not loaded (the trail is read with `audit`)."""
    cards: list[WaitingCard] | None = None
    """The calls that wait for a decision, for the inbox index (`SessionStore.waiting`): a
    save with a list replaces the session's rows with them (in its transaction), one with
    `None` keeps the rows as they are, and a save with a status other than `suspended`
    leaves none. The engine gives them at every save. Not loaded (`None`)."""
    last_event: int = 0
    """On the copy `save` returns: the number of the last event the save appended to the
    session's event log (`events=`), or 0 (it appended none). Neither stored nor loaded."""

    def summary(self) -> SessionSummary:
        """The record without its document."""
        return SessionSummary(
            id=self.id,
            org_id=self.org_id,
            user_id=self.user_id,
            status=self.status,
            version=self.version,
            created_at=self.created_at,
            updated_at=self.updated_at,
            expires_at=self.expires_at,
        )


@dataclass(kw_only=True, slots=True)
class ToolLogEntry:
    """One tool call in a session's tool-call log.

    Before a side-effecting tool runs, the engine records it as `started`; after, it records
    the result. After a crash, an entry still `started` is a call that may or may not have had
    its effect; a `finished` one must never run again.
    """

    tool_call_id: str
    """The call's id, unique within the session."""
    key: str
    """The idempotency key the tool was (or will be) called with."""
    tool: str
    """The tool's name."""
    args: dict[str, Any]
    """The arguments the tool was called with (JSON-compatible)."""
    status: ToolCallStatus = "started"
    """`started`, or `finished` once the result is recorded."""
    result: dict[str, Any] | None = None
    """The recorded result (JSON-compatible), once `finished`."""
    started_at: float = 0.0
    """When `started` was recorded (epoch seconds, from the store's clock)."""
    finished_at: float | None = None
    """When the result was recorded."""


@runtime_checkable
class SessionStore(Protocol):
    """Where sessions live between turns, between restarts and between workers.

    Implementations: `MemoryStore` (tests), `SqliteStore` (the embedded default) and
    `PostgresStore` (many workers). The same contract test suite runs against all three.
    """

    async def load(self, session_id: str) -> SessionRecord | None:
        """The session as last saved, or `None` if there is none.

        Its `messages` are those from its `window` on (`messages_from` is the window).

        Raises:
            StoreError: the stored document cannot be read (the message names the session).
        """
        ...

    async def summary(self, session_id: str) -> SessionSummary | None:
        """The session's metadata (scope, status, times), never reading its document.

        What a caller needs to know whose a session is: it works for a session whose document
        cannot be read, too (to delete it, say).
        """
        ...

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
        """Save `record` if the store still holds the version it was loaded at.

        Compare-and-swap: the save succeeds only if the stored version equals
        `record.version` (0: the session must not exist yet). Nothing else is compared, so a
        lost update is impossible. The document, the messages from `record.messages_from` on,
        the metadata and the audit entries of `record.audit` (each appended as `append_audit`
        does) are written in one transaction: all of them, or nothing. So is what the
        keyword arguments add, which let one commit do what several calls would (a turn's
        writes grouped: docs/durability.md, "What is written, and when").

        Args:
            record: the session.
            lease: `(owner, ttl)`: save only while `owner` holds the session's lease, taken
                or renewed for `ttl` seconds in the same transaction (as `acquire_lease`);
                held by another, nothing is written and `SessionBusyError` is raised.
            release: give this owner's lease back with the save (as `release_lease`).
            started: tool calls to log `started` with the save (as `log_started`: an entry
                already logged is kept as it is).
            notify: wake the store's listeners once the save is committed (as `notify`).
            events: events to append to the session's event log with the save, numbered
                after its last (as `append_events`, announced to `listen_events` once
                committed).

        Returns:
            A copy of `record` with `version` one higher and `updated_at` (and, on the first
            save, `created_at`) stamped by the store, and `last_event` the number of the last
            of `events` (0: none). `record` itself is never changed.

        Raises:
            ConflictError: someone else saved (or deleted) the session first; nothing was
                written.
            SessionBusyError: with `lease`, another owner holds the lease; nothing was written.
            StoreError: `record.data`, a message, an audit entry, a started call's arguments
                or an event are not JSON-compatible, or the store failed.
            ValueError: `record.messages_from` is past the stored messages (it would leave a
                gap), or `record.window` past the saved ones.
        """
        ...

    async def messages(
        self, session_id: str, *, before: int | None = None, limit: int = 100
    ) -> builtins.list[tuple[int, dict[str, Any]]]:
        """A page of the session's stored history: `(position, message)` pairs, oldest first.

        The page holds the last `limit` messages before position `before` (the newest ones
        when `before` is None): read the page before it with `before=` its first position. A
        range `[a, b)` is `before=b, limit=b - a`. Every stored message is there, those before
        the record's `window` too. An unknown session has none.

        Raises:
            ValueError: `before` or `limit` is negative.
            StoreError: a stored message cannot be read (the message names the session).
        """
        ...

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
        """Sessions matching every given filter, most recently updated first.

        Args:
            org_id: only this organisation's sessions.
            user_id: only this user's sessions.
            status: only sessions in this status.
            updated_after: only sessions updated strictly after this time (epoch seconds).
            updated_before: only sessions updated strictly before this time.
            limit: at most this many.
            offset: skip this many first (ties in `updated_at` are ordered by id, so pages
                neither repeat nor skip a session while nothing changes).
        """
        ...

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
        """A page of the inbox index: the waiting cards of suspended sessions, in one query.

        In order: the most recently updated session first (ties by id, descending), a
        session's cards in the order they were raised; `after` is the `WaitingRow.key` of the
        last row of the page before.

        Args:
            org_id: only this organisation's cards (None: every organisation's).
            after: only the rows after this key.
            limit: at most this many.
            tool: only this tool's cards.
            kind: only cards of this kind.
            session_id: only this session's cards.
            raised_before: only cards raised at or before this time (epoch seconds).
            raised_after: only cards raised strictly after this time.
            reach: `(user_id, tools)`: only cards that user requested, cards of one of those
                tools, cards of sessions without a user, and batch cards (whose actions may be
                of any tool): what a decider may decide is among them (`handrail.inbox`).
            exclude_user: leave out the cards this user requested.
        """
        ...

    async def due(self, now: float, *, limit: int = 100) -> builtins.list[SessionSummary]:
        """Sessions whose `expires_at` is at or before `now`, the earliest first."""
        ...

    async def claim(
        self, now: float, owner: str, ttl: float, *, limit: int = 100
    ) -> builtins.list[SessionSummary]:
        """Take the lease of sessions that need a worker, for `owner`, in one step.

        The sessions are those `due` at `now` whose lease is free, expired or already
        `owner`'s, the earliest first; each one's lease is then `owner`'s for `ttl` seconds.
        Sessions a live worker drives are passed over, so they never hold the window against
        the others, and of workers claiming at once each session goes to one (PostgreSQL
        claims with `FOR UPDATE SKIP LOCKED`: they do not wait on each other either).

        Args:
            now: the time the deadlines are compared with (the engine's clock).
            owner: who takes the leases.
            ttl: how long they are held (the store's clock).
            limit: at most this many.
        """
        ...

    async def delete(self, session_id: str) -> bool:
        """Delete a session with its tool-call log, event log and lease; `False` if none."""
        ...

    async def export(self, session_id: str) -> str:
        """One JSON document with the session, its tool-call log and event log, for `import_`.

        The document carries a `schema_version` so that a newer handrail can read it and an
        older one refuses it.

        Raises:
            SessionNotFoundError: there is no such session.
        """
        ...

    async def import_(self, document: str, *, overwrite: bool = False) -> SessionRecord:
        """Store a session exported by `export` (from this store or another), with its logs.

        The session keeps the version it was exported at; replacing a session
        (`overwrite=True`) moves the version past both, so that copies loaded before the
        import are stale.

        Raises:
            StoreError: the document is not an export, its `schema_version` is unknown or
                newer than this handrail, or the session exists and `overwrite` is false.
        """
        ...

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
        """Record that a tool call is about to run, before it runs.

        Args:
            session_id: the session.
            tool_call_id: the call's id in the log (an attempt's: unique in the session).
            key: its idempotency key.
            tool: the tool's name.
            args: the arguments it is called with (JSON-compatible).
            lease: `(owner, ttl)`: record only while `owner` holds the session's lease, renewed
                in the same transaction (as `save`'s `lease`): the check before a side effect
                and its record in one commit.

        Returns:
            `True` if recorded; `False` if the log already has this call (the entry is kept as
            it is, never overwritten: the call may already have had its effect).

        Raises:
            SessionBusyError: with `lease`, another owner holds the lease; nothing recorded.
        """
        ...

    async def log_finished(
        self,
        session_id: str,
        tool_call_id: str,
        result: dict[str, Any],
        *,
        audit: AuditEntry | None = None,
    ) -> bool:
        """Record a started call's result.

        With `audit`, the entry is appended to its organisation's audit trail (as
        `append_audit` does) in the same transaction, if and only if the result is recorded:
        a call's result is never logged without its entry, nor audited twice.

        Returns:
            `True` if recorded; `False` if the call had a result already (the first one is
            kept).

        Raises:
            StoreError: the log has no such call (record `log_started` first), or the audit
                entry holds a value JSON cannot carry (then nothing is recorded).
        """
        ...

    async def tool_log(
        self, session_id: str, *, calls: Collection[str] | None = None
    ) -> builtins.list[ToolLogEntry]:
        """The session's logged tool calls, in the order they started.

        Args:
            session_id: the session.
            calls: only the entries of these tool-call ids (an id the log does not have is
                left out), read through the log's `(session_id, tool_call_id)` index: what
                recovery and a batch's apply read, so their cost does not grow with the
                session's age. None (the default): the whole log.

        Raises:
            TypeError: `calls` is a string (a collection of its characters): pass a list.
        """
        ...

    async def append_events(self, session_id: str, events: builtins.list[dict[str, Any]]) -> int:
        """Append events to the session's event log, numbering them.

        Events are numbered per session, consecutively from 1, in the order given; appends
        from several tasks or processes never share or skip a number. A store never looks
        inside an event.

        Args:
            session_id: the session (the log does not need the session to be saved yet).
            events: JSON-compatible dicts, as `EVENT.dump_python(event, mode="json")` gives.

        Returns:
            The number of the last event in the log after the append (0 for an empty log, so
            appending nothing tells the log's length).

        Raises:
            StoreError: an event is not JSON-compatible (then nothing is appended).
        """
        ...

    async def events(
        self, session_id: str, *, after: int = 0, limit: int = 1000
    ) -> builtins.list[tuple[int, dict[str, Any]]]:
        """The session's logged events numbered above `after`, as `(number, event)`, in order.

        Args:
            session_id: the session.
            after: skip the events numbered up to this one (a client's `Last-Event-ID`).
            limit: at most this many; read again after the last one for the next page.
        """
        ...

    async def acquire_lease(self, session_id: str, owner: str, ttl: float) -> bool:
        """Take (or renew) the right to drive a session for `ttl` seconds.

        Returns:
            `True` if the lease was free, had expired, or was already `owner`'s (then it is
            renewed); `False` if another owner holds it.
        """
        ...

    async def release_lease(self, session_id: str, owner: str) -> bool:
        """Give a lease back; `False` if `owner` did not hold it (nothing changes then)."""
        ...

    async def adopt_leases(self, previous: str, owner: str) -> builtins.list[str]:
        """Make `owner` the holder of every lease held by an owner named `previous` + 12 chars.

        A process restarted under its worker id takes back, at once, the leases its previous
        incarnation held (an engine's lease owner is its worker id, `#`, and 11 hex digits of
        its own): it need not wait for them to lapse. Whoever held them loses them at that
        moment, so two live processes never hold one lease; one that lives on finds out when
        it next renews.

        Returns:
            The ids of the sessions whose lease was adopted.
        """
        ...

    async def append_audit(self, entry: AuditEntry) -> AuditEntry:
        """Append `entry` to its organisation's audit trail, numbered and chained.

        The entry's `seq` is one past the organisation's last and its `prev_hash` that
        entry's hash (`GENESIS` for the first); both are assigned with the append, in one
        transaction, so appends from several tasks or processes never fork the chain. Its
        `hash` is an HMAC under the store's `audit_key` (its id in `key_id`), a key the
        process holds and never writes to the database; a store without one chains unkeyed
        (plain SHA-256) and says so in a warning (`handrail.audit`). The trail is kept apart
        from sessions: `delete` never touches it.

        Returns:
            `entry`, with `seq`, `prev_hash`, `key_id` and `hash` set.

        Raises:
            StoreError: the entry holds a value JSON cannot carry, or the store failed.
        """
        ...

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
        """The organisation's audit entries numbered above `after`, in order.

        Args:
            org_id: the organisation (`None` or `""`: the trail of sessions without one).
            after: skip the entries numbered up to this one (read the next page after the
                last entry of this one).
            limit: at most this many.
            session_id: only this session's entries.
            tool: only this tool's entries.
            kind: only `decision` or only `call` entries.
            who: only the entries whose `who` is this: with `kind="decision"`, the
                decisions (and approvals) this person made; a call's `who` is its
                session's user. Read off an index of (organisation, who, kind, number):
                one person's decisions cost their own number, not the trail's length.
            before: only the entries numbered below this one.
            newest_first: the entries newest first (the highest numbers, below `before`,
                first); read the next page before the last entry of this one.

        Raises:
            ValueError: `after`, `before` or `limit` is negative, or `kind` is not a kind.
            StoreError: a stored entry cannot be read.
        """
        ...

    async def notify(self, session_id: str) -> None:
        """Wake every listener (in any process sharing the store) about a session."""
        ...

    def listen(self) -> AbstractAsyncContextManager[AsyncIterator[str]]:
        """Subscribe to wake-ups: `async with store.listen() as wakeups: async for id in ...`.

        The subscription is live once the `async with` is entered, so check for work after
        entering and then wait, and nothing is missed. A wake-up is a hint: one session may
        be announced more than once. Iteration ends when the store is closed.
        """
        ...

    def listen_events(self) -> AbstractAsyncContextManager[AsyncIterator[tuple[str, int]]]:
        """Subscribe to event-log appends: `async for session_id, last in notices`.

        Each append (`append_events`) is announced as `(session_id, last)`: the session's log
        now holds events up to number `last`; read them with `events`. A notice is a hint
        (read the log for the events themselves), sent once the events can be read; one
        notice may stand for several appends of its session (PostgreSQL sends those made
        while it was sending the previous notices as one, of the last number). The
        subscription is live once the `async with` is entered. PostgreSQL announces every
        process's appends (LISTEN/NOTIFY), and says so with a class attribute
        `cross_process_events = True`; memory and SQLite announce only the appends made
        through the store object itself. Iteration ends when the store is closed.
        """
        ...

    async def close(self) -> None:
        """Release the store's connections and threads. Closing twice is harmless."""
        ...


def lease_lost(session_id: str, owner: str) -> SessionBusyError:
    """What a store raises for a write made under a lease (`lease=`) that another owner holds."""
    return SessionBusyError(
        f"Session {session_id!r}: the lease is held by another owner than {owner!r}; "
        f"nothing was written. That worker drives the session now."
    )


async def lease_and_load(
    store: SessionStore, session_id: str, owner: str, ttl: float
) -> tuple[bool, SessionRecord | None]:
    """Take (or renew) the session's lease, then, if it was taken, load the session.

    What a turn does first. A store may do both in one trip (its class defines a method
    `lease_and_load` of the same signature: `SqliteStore` does them in one job of its thread,
    in one transaction); otherwise they are `acquire_lease`, then `load`. The method is looked
    up on the class, so a wrapper that passes attributes through (`__getattr__`) to a store
    that has one still has its own `acquire_lease` and `load` called.

    Returns:
        Whether the lease is `owner`'s now (as `acquire_lease`), and the session as `load`
        reads it (`None`: there is none, or the lease was not taken, so nothing was read).
    """
    fused = getattr(type(store), "lease_and_load", None)
    if fused is not None:
        held, record = await fused(store, session_id, owner, ttl)
        return held, record
    if not await store.acquire_lease(session_id, owner, ttl):
        return False, None
    try:
        return True, await store.load(session_id)
    except BaseException:  # as if it had not been taken: nobody holds it until it lapses
        await store.release_lease(session_id, owner)
        raise


def take_wakeup(
    store: SessionStore, session_id: str, *, due: float, owner: str
) -> AbstractAsyncContextManager[SessionSummary | None]:
    """Claim a woken session for this process before reading it: what a worker does first.

    A wake-up reaches every worker listening; one of them should read and drive the session.
    Inside, this process holds the session's *wake-up claim*: the summary is yielded if the
    session is due (its `expires_at` at or before `due`), its lease free, lapsed or `owner`'s,
    and no other process holds the claim; else `None` (another process took it, or the
    session needs nobody now: drop the wake-up). Other processes' claims of it yield `None`
    until this one exits.

    The claim is a hint, never the lease: it writes nothing (no commit, on PostgreSQL a
    session-level advisory lock on a connection of the store's own; on SQLite a lock on a
    file beside the database) and goes with its holder's connection or process. The drive
    still takes the lease with its first write, with the compare-and-swap on the version it
    read, as every drive does. A store may claim so (its class defines a method
    `take_wakeup` of the same signature, looked up on the class as `lease_and_load` is);
    otherwise the summary is yielded whenever the session exists, and every worker woken
    reads it (the drive's first write then picks one).
    """
    own = getattr(type(store), "take_wakeup", None)
    if own is not None:
        claim: AbstractAsyncContextManager[SessionSummary | None]
        claim = own(store, session_id, due=due, owner=owner)
        return claim
    return _summary_only(store, session_id)


@contextlib.asynccontextmanager
async def _summary_only(
    store: SessionStore, session_id: str
) -> AsyncIterator[SessionSummary | None]:
    yield await store.summary(session_id)
