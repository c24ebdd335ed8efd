"""`PartitionedStore`: organisations partitioned across several stores behind one store.

One PostgreSQL primary bounds what one fleet can commit. Past it, organisations are spread
over several clusters: a routing function names each organisation's partition (`route(org_id)
-> key`), and `PartitionedStore` is the one `SessionStore` an engine, a worker and a server
use over them all. It edits none of them: every call goes to the store of one partition, or
to all of them.

How a call finds its partition:

- **By the session id.** Most calls carry a session id and nothing else (a lease, a load, a
  log entry). A session's id begins with its partition's key: `eu:4f1c...`, minted with
  `id_for(org_id)` when the session is made (the server's `POST /sessions` and its chat
  endpoints do it through `session_id_for`). The id names the partition for life: no
  directory to read or keep, no round trip, no fan-out. An id that names no partition goes
  to the `default` partition, if there is one (the sessions of a store that was the only one
  before keep their ids).
- **By the organisation.** The calls that name an organisation (`list(org_id=...)`, the
  inbox, `audit`, `append_audit`) go to `route(org_id)`'s partition alone.
- **To every partition.** The calls of the fleet (`due`, `claim`, `adopt_leases`, `listen`,
  `listen_events`, `list` without an organisation) ask each partition and merge.

Why not look a session up in every partition (and cache where it was)? A lookup would cost
every call a round trip to each cluster, so each cluster would serve the whole fleet's reads
and adding one would add load to all; a session's first write (its lease, before its first
save) would have nowhere to go; and a cache of millions of ids in each process goes stale
the moment another process deletes or imports a session.

What holds across partitions:

- A session lives in one partition, with everything of its own: its messages, tool-call log,
  event log, lease and audit entries, written in that partition's transactions, so every
  promise of `SessionStore` holds as it does in one store. Every save checks that the
  session's organisation routes to the partition its id names; one that does not is refused
  with a `RoutingError` and nothing is written. So an organisation's sessions are all in its
  partition, and its audit trail is one chain there (verified per partition).
- A session never moves between partitions. `import_` writes a session into the partition
  its id names. To move load between clusters, move a partition (its key, with its schema)
  to another cluster and change the mapping: ids stay as they are. So make more partitions
  than clusters (say 16 keys over 2 clusters), and `route` must keep an organisation in its
  partition while it has sessions.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import heapq
import re
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from types import MappingProxyType, TracebackType
from typing import Any, TypeVar

from .._random import token_hex
from ..audit import AuditEntry, AuditKey, AuditKind
from ..exceptions import ConfigError, RoutingError, SessionNotFoundError
from ._base import (
    SessionRecord,
    SessionStatus,
    SessionStore,
    SessionSummary,
    ToolLogEntry,
    WaitingRow,
    lease_and_load,
    take_wakeup,
)
from ._codec import (
    check_calls,
    check_events_page,
    check_messages_page,
    check_page,
    check_status,
    check_ttl,
    parse_export,
)

__all__ = ["SEPARATOR", "PartitionRoute", "PartitionedStore", "session_id_for"]

SEPARATOR = ":"
"""What separates a session id's partition key from the rest: `eu:4f1c...`."""

PartitionRoute = Callable[[str | None], str]
"""An organisation's partition: its id (None: sessions without one) -> a partition's key."""

_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")
T = TypeVar("T")


class PartitionedStore:
    """A `SessionStore` over several stores, each organisation's sessions in one of them.

    ```python
    store = PartitionedStore(
        {"eu": PostgresStore(EU_DSN), "us": PostgresStore(US_DSN)},
        route=lambda org_id: REGIONS[org_id],
    )
    engine = Engine(domain, store=store)
    session_id = store.id_for("acme")  # "eu:9b1e..." when acme is in Europe
    ```

    Args:
        stores: partition key -> its store (each its own database, cluster or schema). A key
            is 1-64 letters, digits, `_`, `.` or `-`. The store closes them when it closes.
        route: the partition of an organisation (`None`: of sessions without one); it must
            name a key of `stores`, and keep naming the same one while the organisation has
            sessions. Called on every save and every call that names an organisation, so
            keep it cheap (a dict, a hash); it may raise for an organisation it does not
            know (a `RoutingError` then says so, and nothing is written).
        default: the partition of session ids that name none (no `key:` prefix of a key of
            `stores`): where the sessions of a store that was the only one before stay. None:
            such an id names no session, and a write of one is a `RoutingError`.

    Raises:
        ConfigError: no stores, a key that is not one, a `default` that is not a key, or a
            store that is not a `SessionStore`.
    """

    def __init__(
        self,
        stores: Mapping[str, SessionStore],
        route: PartitionRoute,
        *,
        default: str | None = None,
    ) -> None:
        if not stores:
            raise ConfigError("PartitionedStore(stores={}): give at least one partition.")
        for key, store in stores.items():
            if not isinstance(key, str) or not _KEY.fullmatch(key):
                raise ConfigError(
                    f"PartitionedStore: {key!r} is not a partition key: use 1-64 letters, "
                    f"digits, '_', '.' or '-' (it begins the ids of the partition's sessions)."
                )
            if not isinstance(store, SessionStore):
                raise ConfigError(
                    f"PartitionedStore: the store of partition {key!r} is a "
                    f"{type(store).__name__}, not a SessionStore."
                )
        if default is not None and default not in stores:
            raise ConfigError(
                f"PartitionedStore(default={default!r}): not a partition; the keys are "
                f"{sorted(stores)}."
            )
        self.stores: Mapping[str, SessionStore] = MappingProxyType(dict(stores))
        """Partition key -> its store (read it to reach one partition: its audit trail)."""
        self.route: PartitionRoute = route
        """The routing function it was given."""
        self.default = default
        """The partition of session ids that name none, or None."""
        self._next = 0  # the partition `claim` asks first, in turn

    # -- routing ---------------------------------------------------------------------------

    def partition(self, org_id: str | None) -> str:
        """The key of `org_id`'s partition, as `route` names it.

        Raises:
            RoutingError: `route` raised, or named no partition (the message names the
                organisation and the keys).
        """
        try:
            key = self.route(org_id)
        except Exception as error:
            raise RoutingError(
                f"The route of PartitionedStore raised {type(error).__name__}: {error} for "
                f"organisation {org_id!r}: make it name one of {sorted(self.stores)} for "
                f"every organisation (and for None, sessions without one). Nothing was "
                f"written.",
                org_id=org_id,
            ) from error
        if not isinstance(key, str) or key not in self.stores:
            raise RoutingError(
                f"The route of PartitionedStore named {key!r} for organisation {org_id!r}, "
                f"which is no partition: the keys are {sorted(self.stores)}. Add the "
                f"partition's store, or route the organisation to one of them. Nothing was "
                f"written.",
                org_id=org_id,
                key=key if isinstance(key, str) else None,
            )
        return key

    def id_for(self, org_id: str | None, local: str | None = None) -> str:
        """The id of a new session of `org_id`: its partition's key, `:`, and `local`.

        Args:
            org_id: the session's organisation.
            local: the rest of the id (a chat's id, your own); None: 32 random hex digits.

        Raises:
            RoutingError: as `partition`.
        """
        rest = local if local is not None else token_hex(16)
        return f"{self.partition(org_id)}{SEPARATOR}{rest}"

    def locate(self, session_id: str) -> str | None:
        """The key of the partition that holds `session_id`, or None: none could hold it.

        The key the id begins with (`key:`), or else `default`.
        """
        key, separator, _ = session_id.partition(SEPARATOR)
        if separator and key in self.stores:
            return key
        return self.default

    def _found(self, session_id: str) -> SessionStore | None:
        """The store of the session's partition (for a read), or None: no session there."""
        key = self.locate(session_id)
        return None if key is None else self.stores[key]

    def _home(self, session_id: str) -> SessionStore:
        """The store of the session's partition (for a write)."""
        key = self.locate(session_id)
        if key is None:
            raise RoutingError(
                f"Session id {session_id!r} names no partition ({', '.join(sorted(self.stores))}) "
                f"and the PartitionedStore has no default: make the session's id with "
                f"store.id_for(org_id) (it begins with the organisation's partition, "
                f"'<key>{SEPARATOR}'). Nothing was written.",
                session_id=session_id,
            )
        return self.stores[key]

    def _placed(self, session_id: str, org_id: str | None, *, what: str) -> SessionStore:
        """The session's store, checked to be its organisation's partition too."""
        store = self._home(session_id)
        key, home = self.locate(session_id), self.partition(org_id)
        if key != home:
            raise RoutingError(
                f"{what} of session {session_id!r} refused: its id places it in partition "
                f"{key!r}, but its organisation {org_id!r} routes to {home!r}. A session "
                f"never moves between partitions: make its id with store.id_for({org_id!r}), "
                f"and keep an organisation's route while it has sessions (move a partition "
                f"to another cluster instead; docs/deploying.md). Nothing was written.",
                session_id=session_id,
                org_id=org_id,
                key=key,
            )
        return store

    # -- one session: its partition --------------------------------------------------------

    async def load(self, session_id: str) -> SessionRecord | None:
        """The session as last saved (see `SessionStore.load`), from its partition."""
        store = self._found(session_id)
        return None if store is None else await store.load(session_id)

    async def summary(self, session_id: str) -> SessionSummary | None:
        """The session's metadata (see `SessionStore.summary`), from its partition."""
        store = self._found(session_id)
        return None if store is None else await store.summary(session_id)

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
        """Save in the session's partition (see `SessionStore.save`), with what it groups.

        Raises:
            RoutingError: the id names no partition, or another one than the organisation's
                route (or an audit entry's organisation routes elsewhere); nothing written.
        """
        store = self._placed(record.id, record.org_id, what="The save")
        for entry in record.audit:
            self._placed(record.id, entry.org_id, what="An audit entry")
        if events:  # (a store of its own may not take `events=`: none is asked to)
            return await store.save(
                record, lease=lease, release=release, started=started, notify=notify, events=events
            )
        return await store.save(
            record, lease=lease, release=release, started=started, notify=notify
        )

    async def lease_and_load(
        self, session_id: str, owner: str, ttl: float
    ) -> tuple[bool, SessionRecord | None]:
        """Take the lease, then load, in the session's partition.

        In one trip where its store does both in one (`handrail.store._base.lease_and_load`).
        """
        return await lease_and_load(self._home(session_id), session_id, owner, ttl)

    def take_wakeup(
        self, session_id: str, *, due: float, owner: str
    ) -> AbstractAsyncContextManager[SessionSummary | None]:
        """Claim a woken session in its partition (`handrail.store._base.take_wakeup`)."""
        return take_wakeup(self._home(session_id), session_id, due=due, owner=owner)

    async def messages(
        self, session_id: str, *, before: int | None = None, limit: int = 100
    ) -> builtins.list[tuple[int, dict[str, Any]]]:
        """A page of the session's history (see `SessionStore.messages`)."""
        check_messages_page(before, limit)
        store = self._found(session_id)
        if store is None:
            return []
        return await store.messages(session_id, before=before, limit=limit)

    async def delete(self, session_id: str) -> bool:
        """Delete the session from its partition (see `SessionStore.delete`)."""
        store = self._found(session_id)
        return False if store is None else await store.delete(session_id)

    async def export(self, session_id: str) -> str:
        """The session's export, from its partition (see `SessionStore.export`)."""
        store = self._found(session_id)
        if store is None:
            raise SessionNotFoundError(f"No session {session_id!r}.", session_id=session_id)
        return await store.export(session_id)

    async def import_(self, document: str, *, overwrite: bool = False) -> SessionRecord:
        """Import into the partition the session's id names (see `SessionStore.import_`).

        Raises:
            RoutingError: the id names no partition, or another one than its organisation's
                route; nothing written.
        """
        record, _, _ = parse_export(document)
        store = self._placed(record.id, record.org_id, what="The import")
        return await store.import_(document, overwrite=overwrite)

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
        """Record a call about to run, in the session's partition."""
        return await self._home(session_id).log_started(
            session_id, tool_call_id, key=key, tool=tool, args=args, lease=lease
        )

    async def log_finished(
        self,
        session_id: str,
        tool_call_id: str,
        result: dict[str, Any],
        *,
        audit: AuditEntry | None = None,
    ) -> bool:
        """Record a call's result (and its audit entry) in the session's partition."""
        if audit is None:
            store = self._home(session_id)
        else:
            store = self._placed(session_id, audit.org_id, what="An audit entry")
        return await store.log_finished(session_id, tool_call_id, result, audit=audit)

    async def tool_log(
        self, session_id: str, *, calls: Collection[str] | None = None
    ) -> builtins.list[ToolLogEntry]:
        """The session's logged calls (or those of `calls`), from its partition."""
        wanted = check_calls(calls)
        store = self._found(session_id)
        return [] if store is None else await store.tool_log(session_id, calls=wanted)

    async def append_events(self, session_id: str, events: builtins.list[dict[str, Any]]) -> int:
        """Append to the session's event log, in its partition."""
        return await self._home(session_id).append_events(session_id, events)

    async def events(
        self, session_id: str, *, after: int = 0, limit: int = 1000
    ) -> builtins.list[tuple[int, dict[str, Any]]]:
        """The session's logged events after `after`, from its partition."""
        check_events_page(after, limit)
        store = self._found(session_id)
        return [] if store is None else await store.events(session_id, after=after, limit=limit)

    async def acquire_lease(self, session_id: str, owner: str, ttl: float) -> bool:
        """Take or renew the session's lease, in its partition."""
        return await self._home(session_id).acquire_lease(session_id, owner, ttl)

    async def release_lease(self, session_id: str, owner: str) -> bool:
        """Give the session's lease back, in its partition."""
        store = self._found(session_id)
        return False if store is None else await store.release_lease(session_id, owner)

    async def notify(self, session_id: str) -> None:
        """Wake the listeners of the session's partition (a merged `listen` hears it)."""
        await self._home(session_id).notify(session_id)

    # -- one organisation: its partition ---------------------------------------------------

    async def append_audit(self, entry: AuditEntry) -> AuditEntry:
        """Append to the organisation's trail, in its partition (see `append_audit`)."""
        return await self.stores[self.partition(entry.org_id)].append_audit(entry)

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
        """The organisation's trail, from its partition (one chain: see `SessionStore.audit`)."""
        store = self.stores[self.partition(org_id)]
        return await store.audit(
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
        """Sessions matching every filter, most recently updated first (`SessionStore.list`).

        With `org_id`, from its partition alone; without, from every partition, merged (each
        is asked for `offset + limit`, so a deep page costs each partition its depth).
        """
        check_page(limit, offset)
        check_status(status)
        filters: dict[str, Any] = {
            "user_id": user_id,
            "status": status,
            "updated_after": updated_after,
            "updated_before": updated_before,
        }
        if org_id is not None:
            store = self.stores[self.partition(org_id)]
            return await store.list(org_id=org_id, limit=limit, offset=offset, **filters)
        pages = await self._each(lambda store: store.list(limit=offset + limit, **filters))
        merged = heapq.merge(*pages, key=lambda s: (s.updated_at, s.id), reverse=True)
        return builtins.list(merged)[offset : offset + limit]

    # -- the fleet: every partition --------------------------------------------------------

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
        """A page of the inbox index (`SessionStore.waiting`).

        With `org_id`, from its partition alone (an organisation's cards are all there); with
        `session_id`, from the session's partition; otherwise from every partition, merged in
        the index's order (each is asked for `limit` rows after `after`).
        """
        filters: dict[str, Any] = {
            "after": after,
            "limit": limit,
            "tool": tool,
            "kind": kind,
            "session_id": session_id,
            "raised_before": raised_before,
            "raised_after": raised_after,
            "reach": reach,
            "exclude_user": exclude_user,
        }
        if org_id is not None:
            return await self.stores[self.partition(org_id)].waiting(org_id=org_id, **filters)
        if session_id is not None:
            store = self._found(session_id)
            return [] if store is None else await store.waiting(org_id=None, **filters)
        pages = await self._each(lambda store: store.waiting(org_id=None, **filters))
        # The index's order: the most recently updated session first (ties by id, descending),
        # then a session's cards in the order they were raised.
        merged = heapq.merge(
            *pages, key=lambda r: (-r.session.updated_at, _Descending(r.session.id), r.position)
        )
        return builtins.list(merged)[:limit]

    async def due(self, now: float, *, limit: int = 100) -> builtins.list[SessionSummary]:
        """The sessions due at `now` in every partition, the earliest first."""
        check_page(limit, 0)
        pages = await self._each(lambda store: store.due(now, limit=limit))
        merged = heapq.merge(*pages, key=lambda s: (s.expires_at or 0.0, s.id))
        return builtins.list(merged)[:limit]

    async def claim(
        self, now: float, owner: str, ttl: float, *, limit: int = 100
    ) -> builtins.list[SessionSummary]:
        """Take the leases of sessions that need a worker, from each partition in turn.

        Each partition is asked for what is left of `limit`, one after the other, so no more
        leases are taken than are returned; the partition asked first changes from call to
        call, so that a busy one cannot keep the others waiting. The earliest first.
        """
        check_page(limit, 0)
        check_ttl(ttl)
        keys = builtins.list(self.stores)
        first = self._next % len(keys)
        self._next += 1
        claimed: builtins.list[SessionSummary] = []
        for key in keys[first:] + keys[:first]:
            if len(claimed) >= limit:
                break
            left = limit - len(claimed)
            claimed += await self.stores[key].claim(now, owner, ttl, limit=left)
        return sorted(claimed, key=lambda s: (s.expires_at or 0.0, s.id))

    async def adopt_leases(self, previous: str, owner: str) -> builtins.list[str]:
        """Adopt `previous`'s leases in every partition (see `SessionStore.adopt_leases`)."""
        pages = await self._each(lambda store: store.adopt_leases(previous, owner))
        return [session_id for page in pages for session_id in page]

    def listen(self) -> AbstractAsyncContextManager[AsyncIterator[str]]:
        """Every partition's wake-ups, as one subscription (see `SessionStore.listen`)."""
        return _merged([store.listen() for store in self.stores.values()])

    def listen_events(self) -> AbstractAsyncContextManager[AsyncIterator[tuple[str, int]]]:
        """Every partition's event notices, as one subscription (`listen_events`)."""
        return _merged([store.listen_events() for store in self.stores.values()])

    @property
    def cross_process_events(self) -> bool:
        """Whether every partition announces other processes' appends (PostgreSQL's do)."""
        return all(getattr(s, "cross_process_events", False) for s in self.stores.values())

    @property
    def audit_key(self) -> AuditKey | None:
        """The key of the first partition's trail; None if a partition chains unkeyed."""
        keys = [getattr(s, "audit_key", None) for s in self.stores.values()]
        return None if any(key is None for key in keys) else keys[0]

    async def open(self) -> None:
        """Open every partition's store that opens (PostgreSQL's: connect, migrate).

        So that a cluster out of reach fails at start-up, not at a session's first call.
        """
        opens = [getattr(s, "open", None) for s in self.stores.values()]
        await asyncio.gather(*(open_() for open_ in opens if callable(open_)))

    async def close(self) -> None:
        """Close every partition's store. Closing twice is harmless."""
        results = await asyncio.gather(
            *(store.close() for store in self.stores.values()), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def __aenter__(self) -> PartitionedStore:
        await self.open()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        inner = ", ".join(f"{key!r}: {type(s).__name__}" for key, s in self.stores.items())
        return f"PartitionedStore({{{inner}}}, default={self.default!r})"

    async def _each(self, call: Callable[[SessionStore], Any]) -> builtins.list[Any]:
        """`call` on every partition's store at once; their answers, in the keys' order."""
        return builtins.list(await asyncio.gather(*(call(s) for s in self.stores.values())))


def session_id_for(store: SessionStore, org_id: str | None, local: str) -> str:
    """The id a new session of `org_id` gets in `store`.

    `local`, unless the store places sessions by their id (a `PartitionedStore`: its
    `id_for(org_id, local)`, which begins with the organisation's partition).
    """
    if isinstance(store, PartitionedStore):
        return store.id_for(org_id, local)
    return local


_END = object()


@contextlib.asynccontextmanager
async def _merged(
    subscriptions: builtins.list[AbstractAsyncContextManager[AsyncIterator[T]]],
) -> AsyncIterator[AsyncIterator[T]]:
    """One subscription of several.

    Live once each one is; it ends once every one has ended, and a failure of one is raised
    to the reader.
    """
    async with contextlib.AsyncExitStack() as stack:
        sources = [await stack.enter_async_context(s) for s in subscriptions]
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump(source: AsyncIterator[T]) -> None:
            try:
                async for item in source:
                    queue.put_nowait(item)
            except Exception as error:
                queue.put_nowait(_Failed(error))
            finally:
                queue.put_nowait(_END)

        pumps = [asyncio.create_task(pump(source)) for source in sources]
        try:
            yield _Read(queue, len(pumps))
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class _Read:
    """The merged items, as they come.

    A class, not an async generator: a reader that stops waiting (a timeout cancels its
    `anext`) may read on, where the cancellation would have closed a generator.
    """

    def __init__(self, queue: asyncio.Queue[Any], sources: int) -> None:
        self.queue, self.sources = queue, sources

    def __aiter__(self) -> _Read:
        return self

    async def __anext__(self) -> Any:
        while self.sources:
            item = await self.queue.get()
            if item is _END:
                self.sources -= 1
            elif isinstance(item, _Failed):
                raise item.error
            else:
                return item
        raise StopAsyncIteration


class _Descending:
    """A string that sorts the other way round (for one field of a merge key)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __lt__(self, other: _Descending) -> bool:
        return self.text > other.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.text == other.text

    def __hash__(self) -> int:
        return hash(self.text)
