"""The turns a server drives, each in a task the app owns, and the streams that follow them.

A turn (a new message, or the resumption once the last pending call is decided) runs in a
background task, so a client that disconnects does not stop it. Each event goes to the
session's event log, which numbers it, before it is handed to the streams listening in this
process: the turn's saves carry its events (`Engine.log_run`), and a group goes on its own
only when no save carries it within `coalesce` seconds. A stream first reads the log after
the client's last event, then follows the live events; a stream of a turn running here
starts instead from the events this server logged for it, when they reach back to the
client's last (the last `queue_size` are kept while the turn runs), so that a burst of turns
does not queue a read of the log each before its first event. Events another process logged
(a turn running there, or a worker's) reach it through the store's event notices
(`SessionStore.listen_events`: LISTEN/NOTIFY on PostgreSQL), which one task of this server
reads for all its streams: a notice of an event the stream has not had makes it read the
log. It also reads the log when it falls behind (a slow reader whose queue filled up), and
after `poll_interval` of quiet, as a safety net. So a client that reconnects with `Last-
Event-ID` gets exactly the events it missed, then the live ones, wherever the turn runs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from .._deadlines import CLIENT_GRACE
from .._loop import AgentRun
from .._redact import log_failure, new_reference
from ..engine import Engine, Resolution, RunLog
from ..events import EVENT, RunFailed
from ..exceptions import (
    SessionBusyError,
    SessionNotFoundError,
    StoreUnavailableError,
    UserError,
)
from ..suspension import Decision
from . import _gc
from ._auth import Caller

__all__ = ["TERMINAL", "Runs", "TurnInProgressError"]

TERMINAL = frozenset({"run-completed", "run-suspended", "run-failed"})
"""The events that end a turn (or its part up to a suspension)."""

_PAGE = 500
_SHARE = 8
"""How many waiting turns go on, for one event each, per pass of the event loop."""
_READERS = 2
"""How many streams may read a page of the event log at once."""
_log = logging.getLogger("handrail.server")

_CUT_OFF = (
    "The store stopped answering in the middle of this turn. The turn is left where it was, "
    "as a crash leaves it (nothing that happened is lost), and is finished by a worker once "
    "the store is back (its events are then logged to this session's event log)."
)

Logged = tuple[int, dict[str, Any]]
_WAKE: Logged = (0, {})
"""Put in a stream's queue to wake it when the server closes (as an event, it is one the
stream has had: number 0 comes before every event)."""
_NOTICE: dict[str, Any] = {}
"""The event of a queued `(number, _NOTICE)`: the log holds events up to that number (told
by the store), to be read from the log."""
_MAX_SEQ = 2**63 - 1
"""A number past every event's: a notice with it makes a stream read the log."""
_RESUBSCRIBE = 1.0
"""Seconds before subscribing again to the store's event notices after losing them."""


class TurnInProgressError(UserError):
    """A turn of the session is already running in this server."""


class Runs:
    """The turns this server runs, by session, and the live streams of their events.

    Args:
        engine: runs the turns; its store keeps the event logs.
        poll_interval: seconds of quiet after which a stream reads the log again, in case a
            notice was lost. None: 60 when the store announces other processes' appends
            (`cross_process_events`: PostgreSQL), else 1 (a server sharing a SQLite file
            with another process finds that one's events this way).
        queue_size: live events a stream may fall behind before it reads the log instead.
        coalesce: seconds a stream waits after a write for more events to send with the
            next one (the first events of a stream go at once); and the most a turn's events
            wait for a save to carry them to the log before they go on their own.
        tick: seconds of quiet after which a stream yields an empty batch (the server sends
            keep-alives then); None: `poll_interval`.
        client_grace: seconds a `client` call waits once the last stream of its turn closed
            before the turn's end (the client went away): `Engine.client_left`.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        poll_interval: float | None = None,
        queue_size: int = 256,
        coalesce: float = 0.05,
        tick: float | None = None,
        client_grace: float = CLIENT_GRACE,
    ):
        self.engine = engine
        self.client_grace = client_grace
        self._left: set[str] = set()  # turns running here whose last stream closed early
        self._chores: set[asyncio.Task[None]] = set()
        if poll_interval is None:
            shared = getattr(engine.store, "cross_process_events", False)
            poll_interval = 60.0 if shared else 1.0
        self.poll_interval = poll_interval
        self.tick = min(poll_interval, tick) if tick is not None else poll_interval
        self._notices: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()  # the notices' subscription is live (or gave up)
        self.coalesce = coalesce
        self.queue_size = queue_size
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._callers: dict[str, Caller] = {}  # whose turn each is
        self._per_org: collections.Counter[str | None] = collections.Counter()
        self._listeners: dict[str, set[asyncio.Queue[Logged]]] = {}
        self._handed: dict[str, int] = {}  # the last event this server logged, by session
        # The events of each turn running here, as logged, from its first (the last
        # `queue_size` of them): a stream that starts within them needs no read of the log.
        self._recent: dict[str, collections.deque[Logged]] = {}
        self._starting = 0  # turns started here whose first event is not logged yet
        self._closed = False  # the server is shutting down: streams end once caught up
        self._pacer = _Pacer()
        self._readers = asyncio.Semaphore(_READERS)  # streams take turns to read the log

    def _started(self, _: asyncio.Future[int]) -> None:
        self._starting -= 1
        if not self._starting:
            # In the next pass: the requests woken with this one write their first events first.
            asyncio.get_running_loop().call_soon(self._collect)

    def _collect(self) -> None:
        if not self._starting:  # (else a turn started meanwhile: it holds the collector still)
            _gc.release()

    def running_for(self, org_id: str | None) -> int:
        """How many turns of `org_id`'s sessions run in this server now."""
        return self._per_org[org_id]

    def running(self, session_id: str) -> bool:
        """Whether a turn of the session runs in this server now."""
        return session_id in self._tasks

    async def start(self, session_id: str, run: AgentRun[Any], caller: Caller) -> int:
        """Run `caller`'s `run` in the background; the number of the event before its first.

        Returns once the run's first event is logged, so that what the engine refuses before
        it starts (no such session for the caller, a session that waits for decisions,
        another worker driving it) is raised here, to the request, and then nothing runs.

        Raises:
            SessionNotFoundError: a turn of another caller's session runs here.
            TurnInProgressError: a turn of this session already runs here.
            HandrailError: what the run raised before its first event.
        """
        if session_id in self._tasks:
            if self._callers[session_id].who != caller.who:  # another's is no session at all
                raise SessionNotFoundError.for_caller(session_id)
            raise TurnInProgressError(
                f"A turn of session {session_id!r} is running: wait for it to end, or interrupt it."
            )
        started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        # Retrieve the outcome even if the request that waits for it has gone away.
        started.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._starting += 1
        if self._starting == 1:  # the collector waits for the first events of a burst
            _gc.hold()
        started.add_done_callback(self._started)
        self._tasks[session_id] = asyncio.create_task(
            self._drive(session_id, run, started), name=f"handrail turn {session_id}"
        )
        self._recent[session_id] = collections.deque(maxlen=self.queue_size)
        self._callers[session_id] = caller
        self._per_org[caller.org_id] += 1
        # Awaited as it is (a shield would cost the request a pass of the loop): if the request
        # goes away, `started` is cancelled, and the turn goes on regardless.
        return await started

    async def _drive(
        self, session_id: str, run: AgentRun[Any], started: asyncio.Future[int]
    ) -> None:
        task = asyncio.current_task()

        def logged(last: int, events: list[dict[str, Any]]) -> None:
            first = last - len(events) + 1
            if not started.done():  # (cancelled: the request went away)
                started.set_result(first - 1)
            self._hand_out(session_id, first, events, task)

        # The engine logs the turn's events with its saves (its first write carries the
        # first event, its last the one that ends the turn), and a group on its own at most
        # every `coalesce` seconds in between; each reaches the streams once committed.
        log: RunLog | None = None
        try:
            log = self.engine.log_run(session_id, run, every=self.coalesce, on_logged=logged)
            async for event in run:
                if event.type not in TERMINAL and (self._starting or len(self._tasks) > 1):
                    await self._pacer.wait(1 if self._starting else _SHARE)
            if session_id in self._left and session_id not in self._listeners:
                self._left.discard(session_id)
                await self._client_left(session_id)
        except Exception as error:
            # (What the turn showed before it failed, the engine has logged.)
            if log is None or not log.begun:  # its first event is not logged: tell the request
                if not started.done():
                    started.set_exception(error)
                return
            # The engine ends a turn with an event; an exception means a store or a bug
            # failed it midway. Say so in the log, so that its streams end.
            if isinstance(error, StoreUnavailableError):  # left for recovery, not failed
                _log.warning("The turn of session %r was cut off: %s", session_id, error)
                failed = RunFailed(reason="cut-off", error=_CUT_OFF)
            else:
                reference = new_reference()
                log_failure(
                    _log, "The turn failed on the server", error,
                    reference=reference, session_id=session_id,
                )  # fmt: skip
                failed = RunFailed(
                    reason="error",
                    error="The server failed while running this turn.",
                    reference=reference,
                )
            try:
                await self._append(session_id, [EVENT.dump_python(failed, mode="json")])
            except Exception:
                _log.exception("Could not log the failure of session %r", session_id)
        finally:
            self._end(session_id)
            if not started.done():
                started.cancel()

    def _end(self, session_id: str, task: asyncio.Task[Any] | None = None) -> None:
        """Forget the session's turn, if it is the one of `task` (None: the running task)."""
        if self._tasks.get(session_id) is (task or asyncio.current_task()):
            org_id = self._callers.pop(session_id).org_id
            del self._tasks[session_id]
            self._recent.pop(session_id, None)
            self._per_org[org_id] -= 1
            if not self._per_org[org_id]:
                del self._per_org[org_id]

    async def _append(
        self,
        session_id: str,
        events: list[dict[str, Any]],
        task: asyncio.Task[Any] | None = None,
    ) -> int:
        """Log `events` (one append: one commit) and hand them to this server's streams.

        Returns the number of the last; `task`: the turn's (None: the running task).
        """
        last, logged = await self.engine.log_events(session_id, events)
        self._hand_out(session_id, last - len(logged) + 1, logged, task)
        return last

    def _hand_out(
        self,
        session_id: str,
        first: int,
        logged: list[dict[str, Any]],
        task: asyncio.Task[Any] | None = None,
    ) -> None:
        """Hand events just logged (numbered from `first`) to this server's streams.

        `task`: the turn's that logged them (None: the running task). An event that ends the
        turn frees the session here: a client that read it may start the next turn now.
        """
        last = first + len(logged) - 1
        recent = self._recent.get(session_id)
        if recent is not None and self._tasks.get(session_id) is (task or asyncio.current_task()):
            if recent and recent[-1][0] + 1 != first:  # another process logged in between:
                del self._recent[session_id]  # the log has it, this tail does not
            else:
                recent.extend(enumerate(logged, first))
        if session_id in self._listeners:  # its notice, when it comes, is no news to them
            self._handed[session_id] = max(last, self._handed.get(session_id, 0))
        for queue in self._listeners.get(session_id, ()):
            for seq, event in enumerate(logged, first):
                # A slow reader's queue is full: it sees the gap and reads the log instead.
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait((seq, event))
        if any(event.get("type") in TERMINAL for event in logged):
            self._end(session_id, task)

    async def resolve(
        self,
        session_id: str,
        decisions: Mapping[str, Decision],
        caller: Caller,
        *,
        client: bool = False,
    ) -> tuple[Resolution, int | None]:
        """Record decisions; once nothing is pending, resume the turn in the background.

        Returns:
            The resolution, and the number of the event before the resumption's first (None
            when the turn did not resume here: calls are still pending, or another worker
            resumed it first).
        """
        # Through which key or token: set here for every protocol (REST, AG-UI, the UI
        # stream), never taken from a body.
        decisions = {k: dataclasses.replace(d, via=caller.credential) for k, d in decisions.items()}
        resolution = await self.engine.resolve_many(session_id, decisions, decider=caller.decider())
        if not resolution.ready:
            return resolution, None
        # The turn goes on as its session's user's, whoever made the last decision.
        if resolution.org_id is None or resolution.user_id is None:
            return resolution, None  # not a session of a caller's: not this server's to resume
        owner = Caller(resolution.org_id, resolution.user_id)
        resume = self.engine.resume(
            session_id, org_id=owner.org_id, user_id=owner.user_id, client=client
        )
        try:
            return resolution, await self.start(session_id, resume, owner)
        except (SessionBusyError, UserError):
            return resolution, None  # another worker got there first

    async def follow(
        self, session_id: str, after: int, *, forever: bool
    ) -> AsyncGenerator[list[Logged], None]:
        """The session's events numbered above `after`: logged ones, then live ones.

        They come in batches: every event there is at the moment, in order (a stream sends a
        batch in one write); an empty batch after `poll_interval` of quiet.

        Ends after the first event that ends a turn, unless `forever`.
        Close it (`aclosing`) to stop listening.
        """
        queue: asyncio.Queue[Logged] = asyncio.Queue(self.queue_size)
        listeners = self._listeners.setdefault(session_id, set())
        listeners.add(queue)  # before reading the log, so that nothing falls in between
        self._left.discard(session_id)  # a client came back in time
        mid_turn = False  # the last batch its reader took did not end the turn
        try:
            await self._listen()  # and notices of other processes' events, too
            last = after
            quiet = 0.0
            # The events of a turn running here from the stream's start on are at hand: the
            # stream starts from them (they are the log's), then follows the live ones.
            recent = self._recent.get(session_id)
            tail = list(recent) if recent and recent[0][0] <= after + 1 else None
            while True:
                if tail is not None:
                    page, tail = tail, None
                else:
                    # Reading the log is the costly part of a stream. When many streams replay
                    # long logs at once, they take turns, a page at a time: the store's
                    # connections (and SQLite's one thread) are never queued up with hundreds
                    # of reads that every other request would wait behind.
                    async with self._readers:
                        page = await self.engine.store.events(session_id, after=last, limit=_PAGE)
                batch, ended = _upto_end(page, last, forever)
                if batch:
                    last = batch[-1][0]
                    yield batch
                    mid_turn = batch[-1][1].get("type") not in TERMINAL
                if ended or self._closed:
                    return
                if len(page) == _PAGE:
                    continue
                while True:  # caught up with the log: follow live events while none is missed
                    try:
                        async with asyncio.timeout(self.tick):
                            waiting = [await queue.get()]
                    except TimeoutError:
                        yield []  # quiet: the stream may send a keep-alive
                        quiet += self.tick
                        if quiet >= self.poll_interval:
                            break  # the safety net: read the log
                        continue
                    quiet = 0.0
                    while not queue.empty():
                        waiting.append(queue.get_nowait())
                    live = [(seq, e) for seq, e in waiting if e is not _NOTICE]
                    batch, ended = _upto_end(live, last, forever)
                    if batch:
                        last = batch[-1][0]
                        yield batch
                        mid_turn = batch[-1][1].get("type") not in TERMINAL
                    if ended or self._closed:
                        return
                    # Let the next events gather: a write per event (a model streams a token
                    # at a time) costs the server more than the events themselves.
                    await asyncio.sleep(self.coalesce)
                    # A gap (the queue overflowed) or a notice of events logged elsewhere:
                    # read the log.
                    if max(seq for seq, _ in waiting) > last:
                        break
        finally:
            listeners.discard(queue)
            if not listeners:
                self._listeners.pop(session_id, None)
                self._handed.pop(session_id, None)
                if mid_turn and not self._closed:  # its reader left in the middle of a turn
                    self._gone(session_id)

    def _gone(self, session_id: str) -> None:
        """The last stream of the session closed in the middle of a turn.

        Its reader had events of the turn, not its end: its client went away. Once the turn
        stops (now, if it has), the calls it waits for that client to run get
        `client_grace` seconds (`Engine.client_left`).
        """
        if session_id in self._tasks:
            self._left.add(session_id)  # `_drive` sees to it as the turn stops
            return
        task = asyncio.create_task(self._client_left(session_id), name="handrail client left")
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    async def _client_left(self, session_id: str) -> None:
        try:
            cut = await self.engine.client_left(session_id, grace=self.client_grace)
        except Exception:
            _log.exception("Could not bring forward the client calls of session %r", session_id)
            return
        if cut:
            _log.info(
                "The client of session %r went away: %s expire in %g s unless it comes back",
                session_id,
                ", ".join(cut),
                self.client_grace,
            )

    async def _listen(self) -> None:
        """Make sure the store's event notices are read (once subscribed, or failed to)."""
        if self._notices is None and not self._closed:
            self._notices = asyncio.create_task(self._read_notices(), name="handrail notices")
        await self._listening.wait()

    async def _read_notices(self) -> None:
        """Hand the store's event notices to this server's streams, for as long as it runs.

        A lost subscription is taken again (every stream reads the log then: notices may
        have been missed meanwhile); until then the streams rely on `poll_interval`.
        """
        store = self.engine.store
        if getattr(store, "listen_events", None) is None:  # a store of an older protocol
            _log.warning(
                "The store %s has no listen_events: streams find new events by reading the "
                "log every %g s",
                type(store).__name__,
                self.poll_interval,
            )
            self._listening.set()
            return
        lost = False
        while not self._closed:
            try:
                async with store.listen_events() as notices:
                    self._listening.set()
                    if lost:  # notices may have been missed meanwhile
                        self._wake_all()
                    async for session_id, last in notices:
                        if last <= self._handed.get(session_id, 0):
                            continue  # this server's own events, handed to its streams
                        for queue in self._listeners.get(session_id, ()):
                            with contextlib.suppress(asyncio.QueueFull):  # it reads the log
                                queue.put_nowait((last, _NOTICE))
                return  # the store was closed
            except Exception:
                lost = True
                _log.exception(
                    "Lost the store's event notices; streams read the log every %g s until "
                    "they are back",
                    self.poll_interval,
                )
            finally:
                self._listening.set()  # no stream waits for a subscription that failed
            await asyncio.sleep(_RESUBSCRIBE)

    def _wake_all(self) -> None:
        """Make every stream of this server read the log."""
        for queues in self._listeners.values():
            for queue in queues:
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait((_MAX_SEQ, _NOTICE))

    async def current_turn(self, session_id: str) -> int | None:
        """The number of the event before the session's current turn's first, or None.

        The current turn is the one running (here or in another process) or suspended: what
        the log holds after the last turn that ended. None when the last turn ended and none
        runs here. The log is read through, a page at a time, taking turns with the streams.
        """
        ended = last = 0
        while True:
            async with self._readers:
                page = await self.engine.store.events(session_id, after=last, limit=_PAGE)
            for seq, event in page:
                last = seq
                if event.get("type") in ("run-completed", "run-failed"):
                    ended = seq
            if len(page) < _PAGE:
                break
        if last == ended and not self.running(session_id):
            return None
        return ended

    def interrupt(self, session_id: str) -> bool:
        """Stop the session's running turn, if it runs here; True if one did."""
        return session_id in self._tasks and self.engine.interrupt(session_id)

    async def join(self, session_id: str) -> None:
        """Wait until no turn of the session runs here."""
        while (task := self._tasks.get(session_id)) is not None:
            await asyncio.wait([task])

    async def aclose(self, *, grace: float = 5.0) -> None:
        """Stop the turns, then end the streams (at shutdown).

        Interrupts every running turn, waits `grace` seconds for them to end, cancels the rest,
        then ends every stream once it has sent what is logged. An interrupted turn is saved
        and ends with `run-failed` (reason `interrupted`); a cancelled one is cut off and
        recovered later (`Engine.recover`). A client whose stream ends reconnects with
        `Last-Event-ID` (to another server, or to this one restarted).
        """
        tasks = list(self._tasks.values())
        for session_id in list(self._tasks):
            self.engine.interrupt(session_id)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        self._closed = True
        for chore in list(self._chores):
            chore.cancel()
        if self._chores:
            await asyncio.wait(self._chores)
        notices, self._notices = self._notices, None
        if notices is not None:
            notices.cancel()
            await asyncio.wait([notices])
        for queues in self._listeners.values():
            for queue in queues:
                with contextlib.suppress(asyncio.QueueFull):  # it reads the log anyway
                    queue.put_nowait(_WAKE)


class _Pacer:
    """Lets turns that wait here go on a few at a time: a few events per pass of the loop.

    A turn on a fast model hardly ever waits for I/O, so without this it would hold the event
    loop from its first event to its last, and with many turns running, every pass of the loop
    would run an event of each before reading the next request. Turns wait here between
    events instead (a turn running alone does not), and each pass lets `share` of them go
    on: the requests, the turns starting and the streams get the loop at least every
    `share` events, however many turns run.
    """

    def __init__(self) -> None:
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._share = 0
        self._scheduled = False

    async def wait(self, share: int) -> None:
        """Wait for this turn's go; `share`: how many turns go per pass meanwhile."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiting.append(future)
        self._share = share
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._release)
        await future

    def _release(self) -> None:
        # A callback runs once a pass, after the loop has polled for I/O (the ones it
        # schedules, the turns it wakes included, run in the next pass).
        waiting = self._waiting
        for _ in range(min(self._share, len(waiting))):
            future = waiting.popleft()
            if not future.done():  # a turn cancelled meanwhile
                future.set_result(None)
        if waiting:
            asyncio.get_running_loop().call_soon(self._release)
        else:
            self._scheduled = False


def _upto_end(events: list[Logged], last: int, forever: bool) -> tuple[list[Logged], bool]:
    """The events that follow `last` without a gap, up to the first that ends a turn.

    Returns them, and whether the stream ends there.
    """
    batch: list[Logged] = []
    for seq, event in events:
        if seq <= last:
            continue
        if seq > last + 1:
            break
        batch.append((seq, event))
        last = seq
        if not forever and event.get("type") in TERMINAL:
            return batch, True
    return batch, False
