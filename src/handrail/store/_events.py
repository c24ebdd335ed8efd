"""Event-log notices within one process: what `listen_events` gives for memory and SQLite.

A notice is `(session_id, number)`: the session's event log holds events up to `number`. A
store that cannot push notices between processes (memory, SQLite) hands out the notices of
the appends made through it, at once; PostgreSQL sends them over LISTEN/NOTIFY instead.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

__all__ = ["EventNotice", "LocalEventFeed"]

EventNotice = tuple[str, int]
"""`(session_id, number)`: the session's event log has events up to `number`."""


class LocalEventFeed:
    """The notices of the appends made through one store object, to its subscribers."""

    def __init__(self) -> None:
        self._subscriptions: set[_LocalSubscription] = set()
        self.closed = False

    def publish(self, session_id: str, last: int) -> None:
        """Tell every subscriber that `session_id`'s log now reaches `last`."""
        for subscription in self._subscriptions:
            subscription.queue.put_nowait((session_id, last))

    def subscribe(self) -> _LocalSubscription:
        """`async with feed.subscribe() as notices: async for session_id, last in notices`."""
        return _LocalSubscription(self)

    def close(self) -> None:
        """End every subscription (their iteration stops)."""
        self.closed = True
        for subscription in self._subscriptions:
            subscription.queue.put_nowait(None)
        self._subscriptions.clear()


class _LocalSubscription:
    def __init__(self, feed: LocalEventFeed) -> None:
        self._feed = feed
        self.queue: asyncio.Queue[EventNotice | None] = asyncio.Queue()

    async def __aenter__(self) -> _LocalSubscription:
        if self._feed.closed:
            self.queue.put_nowait(None)
        else:
            self._feed._subscriptions.add(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._feed._subscriptions.discard(self)

    def __aiter__(self) -> _LocalSubscription:
        return self

    async def __anext__(self) -> EventNotice:
        notice = await self.queue.get()
        if notice is None:  # the store was closed
            self.queue.put_nowait(None)
            raise StopAsyncIteration
        return notice
