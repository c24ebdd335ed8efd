"""`Worker`: many processes drive the sessions of one shared store.

A suspended turn may be resolved on any worker (an HTTP request lands anywhere); the worker
that records the last decision wakes the others through the store (`notify`: LISTEN/NOTIFY
on PostgreSQL), and one of them, the first to take the session's lease, resumes the turn. A
worker that dies mid-turn leaves its lease to expire; then `sweep` finds the cut-off turn and
recovers it (`Engine.recover`). Polling (`poll_interval`) is the fallback when a wake-up is
missed, so no session is left stuck.

```python
worker = Worker(engine)
await worker.run(stop)  # until `stop` is set
```
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from .engine import Engine
from .exceptions import ConflictError, SessionBusyError, StaleResolutionError, UserError

__all__ = ["Worker"]

_SKIPPED = (SessionBusyError, UserError, ConflictError, StaleResolutionError)
"""Another worker got there first, or the session moved on: nothing to do here."""


class Worker:
    """Resumes and recovers the sessions of `engine.store` that are ready to go on.

    Args:
        engine: the engine whose domain, store and runtime drive the turns.
        poll_interval: seconds between sweeps when no wake-up comes (the fallback for a
            missed wake-up, and how often deadlines and dead workers are checked).
        batch: at most this many sessions of each kind handled per sweep.
    """

    def __init__(self, engine: Engine, *, poll_interval: float = 1.0, batch: int = 100) -> None:
        if not poll_interval > 0:
            raise UserError(f"Worker(poll_interval={poll_interval!r}) must be positive.")
        self.engine = engine
        self.poll_interval = poll_interval
        self.batch = batch

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Drive ready sessions until `stop` is set or the store is closed.

        `stop` is checked between wake-ups, at least every `poll_interval`; cancel the task
        running this to stop at once (a turn in flight is then cut off, and recovered later).
        """
        async with self.engine.store.listen() as wakeups:
            # Subscribed first, then swept: a wake-up sent in between is not missed.
            await self.sweep()
            iterator = aiter(wakeups)
            while stop is None or not stop.is_set():
                try:
                    session_id = await asyncio.wait_for(anext(iterator), self.poll_interval)
                except TimeoutError:
                    await self.sweep()
                    continue
                except StopAsyncIteration:
                    return  # the store was closed
                await self.advance(session_id)

    async def sweep(self) -> list[str]:
        """One round of the fallback: expire deadlines, recover cut-off turns, resume ready ones.

        Returns:
            The sessions this worker moved on.
        """
        engine = self.engine
        moved = await engine.expire_due()
        moved += await engine.recover_stale()
        ready = await engine.store.list(status="suspended", limit=self.batch)
        # Workers sweeping together would otherwise all race for the same first session.
        random.shuffle(ready)
        for summary in ready:
            if await self.advance(summary.id):
                moved.append(summary.id)
        return moved

    async def advance(self, session_id: str) -> bool:
        """Resume (or recover) `session_id` if it is ready and free; True if this worker did."""
        engine = self.engine
        record = await engine.store.load(session_id)
        if record is None:
            return False
        progress = record.data.get("progress") or {}  # a cheap look before the lease
        if not progress or _has_pending(record.data):
            return False  # nothing to drive, or still waiting for people
        drive = engine.recover if progress.get("status") == "running" else engine.resume
        try:
            await engine.drain(
                session_id, drive(session_id, org_id=record.org_id, user_id=record.user_id)
            )
        except _SKIPPED:
            return False
        return True


def _has_pending(data: dict[str, Any]) -> bool:
    """Whether a stored session has an undecided card, read from its raw document.

    The pending map is rebuilt the same way `RunState.load` does it (the latest card of a
    call counts), without validating the whole state just to decide whether to try.
    """
    undecided: dict[str, bool] = {}
    lists = [data.get("messages") or [], *(data.get("scratch") or {}).values()]
    for messages in lists:
        for message in messages:
            for part in message.get("parts", ()):
                if part.get("type") == "approval":
                    undecided[part.get("tool_call_id")] = part.get("decision") is None
    return any(undecided.values())
