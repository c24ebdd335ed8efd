"""The turns a server drives, each in a task the app owns, and the streams that follow them.

A turn (a new message, or the resumption once the last pending call is decided) runs in a
background task, so a client that disconnects does not stop it. Each event is appended to
the session's event log, which numbers it, before it is handed to the streams listening in
this process. A stream first reads the log after the client's last event, then follows the
live events; when it falls behind (a slow reader whose queue filled up) or hears nothing for
`poll_interval`, it reads the log again. So a client that reconnects with `Last-Event-ID`
gets exactly the events it missed, then the live ones, and events written by another
process reach it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from .._loop import AgentRun
from ..engine import Engine, Resolution
from ..events import EVENT, RunFailed
from ..exceptions import SessionBusyError, UserError
from ..suspension import Decision
from ._auth import Caller

__all__ = ["TERMINAL", "Runs", "TurnInProgressError"]

TERMINAL = frozenset({"run-completed", "run-suspended", "run-failed"})
"""The events that end a turn (or its part up to a suspension)."""

_PAGE = 500
_YIELD = 1e-5
"""How long a turn sleeps between its events (see `Runs._drive`): any timer would do."""
_BACKOFF = 0.002
"""How long it sleeps instead while another turn is starting: first events go first."""
_log = logging.getLogger("handrail.server")

Logged = tuple[int, dict[str, Any]]


class TurnInProgressError(UserError):
    """A turn of the session is already running in this server."""


class Runs:
    """The turns this server runs, by session, and the live streams of their events.

    Args:
        engine: runs the turns; its store keeps the event logs.
        poll_interval: seconds a stream waits for a live event before reading the log again.
        queue_size: live events a stream may fall behind before it reads the log instead.
        coalesce: seconds a stream waits after a write for more events to send with the
            next one (the first events of a stream go at once).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        poll_interval: float = 1.0,
        queue_size: int = 256,
        coalesce: float = 0.05,
    ):
        self.engine = engine
        self.poll_interval = poll_interval
        self.coalesce = coalesce
        self.queue_size = queue_size
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._listeners: dict[str, set[asyncio.Queue[Logged]]] = {}
        self._starting = 0  # turns started here whose first event is not logged yet

    def _started(self, _: asyncio.Future[int]) -> None:
        self._starting -= 1

    def running(self, session_id: str) -> bool:
        """Whether a turn of the session runs in this server now."""
        return session_id in self._tasks

    async def start(self, session_id: str, run: AgentRun[Any]) -> int:
        """Run `run` in the background once it has started; the number of the event before it.

        Returns once the run's first event is logged, so that what the engine refuses before
        it starts (a session that waits for decisions, another worker driving it) is raised
        here, to the request, and then nothing runs.

        Raises:
            TurnInProgressError: a turn of this session already runs here.
            HandrailError: what the run raised before its first event.
        """
        if session_id in self._tasks:
            raise TurnInProgressError(
                f"A turn of session {session_id!r} is running: wait for it to end, or interrupt it."
            )
        started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        # Retrieve the outcome even if the request that waits for it has gone away.
        started.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._starting += 1
        started.add_done_callback(self._started)
        self._tasks[session_id] = asyncio.create_task(
            self._drive(session_id, run, started), name=f"handrail turn {session_id}"
        )
        return await asyncio.shield(started)

    async def _drive(
        self, session_id: str, run: AgentRun[Any], started: asyncio.Future[int]
    ) -> None:
        try:
            async for event in run:
                seq = await self._append(session_id, EVENT.dump_python(event, mode="json"))
                if not started.done():
                    started.set_result(seq - 1)
                if event.type not in TERMINAL and (self._starting or len(self._tasks) > 1):
                    # Yield to I/O between events while other turns run: a timer runs after
                    # the callbacks that I/O made ready (`sleep(0)` would run before them).
                    # With an instant model a turn would otherwise hold the loop while new
                    # turns wait for their first event; while one is starting, the others
                    # step back for a moment. A turn running alone goes straight on (a timer
                    # costs a millisecond of wall time when the loop is idle).
                    await asyncio.sleep(_BACKOFF if self._starting else _YIELD)
        except Exception as error:
            if not started.done():
                started.set_exception(error)
                return
            # The engine ends a turn with an event; an exception means a store or a bug
            # failed it midway. Say so in the log, so that its streams end.
            _log.exception("The turn of session %r failed", session_id)
            failed = RunFailed(reason="error", error="The server failed while running this turn.")
            try:
                await self._append(session_id, EVENT.dump_python(failed, mode="json"))
            except Exception:
                _log.exception("Could not log the failure of session %r", session_id)
        finally:
            # Synchronously with the run's end (which freed the session), so that a decision
            # made the moment after can start the resumption.
            del self._tasks[session_id]
            if not started.done():
                started.cancel()

    async def _append(self, session_id: str, event: dict[str, Any]) -> int:
        seq = await self.engine.store.append_events(session_id, [event])
        for queue in self._listeners.get(session_id, ()):
            # A slow reader's queue is full: it sees the gap and reads the log instead.
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait((seq, event))
        return seq

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
        org_id, user_id = caller
        resolution = await self.engine.resolve_many(
            session_id, decisions, org_id=org_id, user_id=user_id
        )
        if not resolution.ready:
            return resolution, None
        resume = self.engine.resume(session_id, org_id=org_id, user_id=user_id, client=client)
        try:
            return resolution, await self.start(session_id, resume)
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
        try:
            last = after
            while True:
                page = await self.engine.store.events(session_id, after=last, limit=_PAGE)
                batch, ended = _upto_end(page, last, forever)
                if batch:
                    last = batch[-1][0]
                    yield batch
                if ended:
                    return
                if len(page) == _PAGE:
                    continue
                while True:  # caught up with the log: follow live events while none is missed
                    try:
                        async with asyncio.timeout(self.poll_interval):
                            waiting = [await queue.get()]
                    except TimeoutError:
                        yield []  # quiet: the stream may send a keep-alive
                        break
                    while not queue.empty():
                        waiting.append(queue.get_nowait())
                    batch, ended = _upto_end(waiting, last, forever)
                    if batch:
                        last = batch[-1][0]
                        yield batch
                    if ended:
                        return
                    # Let the next events gather: a write per event (a model streams a token
                    # at a time) costs the server more than the events themselves.
                    await asyncio.sleep(self.coalesce)
                    if waiting[-1][0] > last:  # a gap: the queue overflowed; read the log
                        break
        finally:
            listeners.discard(queue)
            if not listeners:
                self._listeners.pop(session_id, None)

    def interrupt(self, session_id: str) -> bool:
        """Stop the session's running turn, if it runs here; True if one did."""
        return session_id in self._tasks and self.engine.interrupt(session_id)

    async def join(self, session_id: str) -> None:
        """Wait until no turn of the session runs here."""
        while (task := self._tasks.get(session_id)) is not None:
            await asyncio.wait([task])

    async def aclose(self, *, grace: float = 5.0) -> None:
        """Interrupt every running turn, wait `grace` seconds for them to end, cancel the rest.

        An interrupted turn is saved and ends with `run-failed` (reason `interrupted`); a
        cancelled one is cut off and recovered later (`Engine.recover`).
        """
        tasks = list(self._tasks.values())
        for session_id in list(self._tasks):
            self.engine.interrupt(session_id)
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=grace)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)


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
