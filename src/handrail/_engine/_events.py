"""A drive's events on their way to the session's event log: carried by its saves.

A server, or a worker, keeps each turn's events in the session's event log, which a client
that reconnects reads. Appending them on their own would cost the turn a commit per group of
events besides its saves (docs/durability.md, "What is written, and when"); instead, the
drive's saves carry them: every event the drive yielded since its last write goes in the next
one, in its transaction. So an instant turn's events cost nothing more than its saves: the
turn's first write (the user's message) carries `run-started`, and its last (the answer) the
rest, the event that ends the turn included. Only when the turn waits (a model that streams,
a slow tool) does a group go on its own, at most every `every` seconds, so that whoever
follows the log sees the turn as it goes.

An event is logged only once the drive has written (before that, a drive that finds the
session busy must have shown nothing), and handed on (`on_logged`) only once it is committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .._redact import public_event
from ..events import EVENT, Event

__all__ = ["OnLogged", "RunLog"]

OnLogged = Callable[[int, list[dict[str, Any]]], None]
"""Told of each group once it is committed: the number of its last event, and the events
as logged (numbered consecutively up to it)."""


class RunLog:
    """The events of one drive of a session, on their way to its event log.

    Made by `Engine.log_run`, before the run is iterated; the drive fills it and its saves
    empty it. Events keep their order; each is logged once.

    Args:
        append: appends a group on its own (`SessionStore.append_events` for the session, made
            again while the store fails for a moment): the number of its last event.
        session_id: the session the run drives.
        every: seconds a group may wait for a save to carry it before it goes on its own.
        on_logged: told of each group once committed (a server hands them to its streams).
        carried: whether the store's saves carry events (`save(..., events=)`).
    """

    __slots__ = (
        "_carrying",
        "_end",
        "_error",
        "_flushing",
        "_queued",
        "_timer",
        "append",
        "carried",
        "every",
        "last",
        "lock",
        "on_logged",
        "open",
        "session_id",
    )

    def __init__(
        self,
        append: Callable[[list[dict[str, Any]]], Awaitable[int]],
        session_id: str,
        *,
        every: float = 0.05,
        on_logged: OnLogged | None = None,
        carried: bool = True,
    ) -> None:
        self.append = append
        self.session_id = session_id
        self.every = every
        self.on_logged = on_logged
        self.carried = carried
        self.lock = asyncio.Lock()  # a save carrying events, or a group on its own: one at once
        self.open = False
        """The drive has written: its events may be logged (before, they are held back)."""
        self.last = 0
        """The number of the last event logged (0: none yet)."""
        self._queued: list[dict[str, Any]] = []
        self._end: list[dict[str, Any]] = []  # the events that end the drive: logged last
        self._carrying: list[dict[str, Any]] = []  # the ending events a write is carrying
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    @property
    def begun(self) -> bool:
        """Whether an event of the drive is logged."""
        return self.last > 0

    def add(self, event: Event) -> None:
        """Queue `event` (the drive yielded it): the next write logs it."""
        self._check()
        self._queued.append(_logged(self.session_id, event))
        self._schedule()

    def ending(self, events: Sequence[Event]) -> None:
        """The events that end the drive (they replace any given before).

        They are logged last, with the drive's last save, after every event queued.
        """
        self._end = [_logged(self.session_id, event) for event in events]

    def opened(self) -> None:
        """The drive has written: from now on its events may be logged on their own."""
        if not self.open:
            self.open = True
            self._schedule()

    def take(self, *, last: bool) -> list[dict[str, Any]]:
        """What a save of the drive carries (under `lock`).

        The events queued, and with its `last` save, those that end it.
        """
        self._check()
        self._cancel_timer()
        taken, self._queued = self._queued, []
        self._carrying = []
        if last:
            self._carrying, self._end = self._end, []
            taken += self._carrying
        return taken

    def put_back(self, events: list[dict[str, Any]]) -> None:
        """A write that carried `events` (what `take` gave) failed: they wait for the next."""
        queued = events[: len(events) - len(self._carrying)]
        if self._carrying:
            self._end, self._carrying = self._carrying, []
        self._queued[:0] = queued

    def logged(self, last: int, events: list[dict[str, Any]]) -> None:
        """`events` are committed, numbered up to `last`: hand them on."""
        if not events:
            return
        self.last = last
        if self.on_logged is not None:
            self.on_logged(last, events)

    def discard(self) -> None:
        """Forget what is queued (the drive stopped before writing: it showed nothing)."""
        self._cancel_timer()
        self._queued.clear()
        self._end.clear()

    async def flush(self, *, end: bool = False) -> None:
        """Append what is queued now, in one commit (with `end`, the ending events too).

        Waits for any group already on its way first; raises what its append raised.
        """
        flushing = self._flushing
        if flushing is not None and not flushing.done():
            await asyncio.wait([flushing])
        self._check()
        async with self.lock:
            events = self.take(last=end)
            if events:
                await self._append(events)

    async def close(self, *, failed: bool = False) -> None:
        """The drive is over: append what no save carried.

        With `failed`, not the events that would have ended it: it did not end that way.
        """
        if failed:
            self._end.clear()
        try:
            await self.flush(end=True)
        finally:
            self._cancel_timer()

    # -- a group on its own ---------------------------------------------------------------

    def _schedule(self) -> None:
        if self.open and self._queued and self._timer is None and self._error is None:
            loop = asyncio.get_running_loop()
            # Before any event is logged: at once (who started the turn waits for it).
            delay = self.every if self.begun or self.carried else 0.0
            self._timer = loop.call_later(delay, self._due)

    def _due(self) -> None:
        self._timer = None
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.get_running_loop().create_task(self._flush_due())

    async def _flush_due(self) -> None:
        try:
            async with self.lock:
                events = self.take(last=False)
                if events:
                    await self._append(events)
        except Exception as error:  # raised by the drive's next `add`, `take` or `flush`
            self._error = error

    async def _append(self, events: list[dict[str, Any]]) -> None:
        try:
            last = await self.append(events)
        except BaseException:
            self.put_back(events)
            raise
        self.logged(last, events)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error


def _logged(session_id: str, event: Event) -> dict[str, Any]:
    """`event` as the session's event log keeps it."""
    return public_event(session_id, EVENT.dump_python(event, mode="json"))
