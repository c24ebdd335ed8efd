"""Notices within one process: event-log appends (`listen_events`) and wake-ups (`listen`).

An event notice is `(session_id, number)`: the session's event log holds events up to
`number`. A store that cannot push notices between processes (memory, SQLite) hands out the
notices of the appends made through it, at once; PostgreSQL sends them over LISTEN/NOTIFY
instead. The memory store's wake-ups (`notify`/`listen`: session ids) go the same way.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Generic, TypeVar

__all__ = ["EventNotice", "LocalFeed"]

EventNotice = tuple[str, int]
"""`(session_id, number)`: the session's event log has events up to `number`."""

T = TypeVar("T")


class LocalFeed(Generic[T]):
    """Notices published through one store object, to every subscriber in this process."""

    def __init__(self) -> None:
        self._subscriptions: set[_LocalSubscription[T]] = set()
        self.closed = False

    def publish(self, notice: T) -> None:
        """Hand `notice` to every subscriber."""
        for subscription in self._subscriptions:
            subscription.queue.put_nowait(notice)

    def subscribe(self) -> _LocalSubscription[T]:
        """`async with feed.subscribe() as notices: async for notice in notices`."""
        return _LocalSubscription(self)

    def close(self) -> None:
        """End every subscription (their iteration stops)."""
        self.closed = True
        for subscription in self._subscriptions:
            subscription.queue.put_nowait(None)
        self._subscriptions.clear()


class _LocalSubscription(Generic[T]):
    def __init__(self, feed: LocalFeed[T]) -> None:
        self._feed = feed
        self.queue: asyncio.Queue[T | None] = asyncio.Queue()

    async def __aenter__(self) -> _LocalSubscription[T]:
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

    def __aiter__(self) -> _LocalSubscription[T]:
        return self

    async def __anext__(self) -> T:
        notice = await self.queue.get()
        if notice is None:  # the store was closed
            self.queue.put_nowait(None)
            raise StopAsyncIteration
        return notice
