"""`Worker`: many processes drive the sessions of one shared store.

A suspended turn may be resolved on any worker (an HTTP request lands anywhere); the worker
that records the last decision wakes the others through the store (`notify`: LISTEN/NOTIFY
on PostgreSQL), and one of them, the first to take the session's lease, resumes the turn.

Wake-ups are hints, and a worker may die at any moment, so a worker also *sweeps*, every
`poll_interval` seconds whatever wake-ups arrive: it claims from the store exactly the sessions
that need a worker (`SessionStore.claim`: a decided turn not resumed, a turn whose worker's
lease lapsed, a card past its deadline), which live workers pass over, and advances each
(`Engine.advance`). Up to `concurrency` sessions are driven at once; a session that fails is
logged with its id and left for a while (its lease, taken for the back-off, keeps every worker
off it), then tried again; it never stops the worker.

```python
worker = Worker(engine, concurrency=8)
await worker.run(stop)  # until `stop` is set
```
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import time
from typing import Any

from .engine import SKIPPED, Engine, transient
from .exceptions import StoreUnavailableError, UserError

__all__ = ["Worker"]

_log = logging.getLogger("handrail.worker")


class Worker:
    """Resumes and recovers the sessions of `engine.store` that are ready to go on.

    Args:
        engine: the engine whose domain, store and runtime drive the turns; its `worker_id`
            names this worker's leases (give each process a stable one, e.g. its host or pod
            name, so that a restarted process takes its own turns back at once).
        poll_interval: seconds between sweeps (how soon a missed wake-up, a dead worker's
            turn or a deadline is handled).
        batch: at most this many sessions claimed by one sweep.
        concurrency: at most this many sessions driven at once by this worker.
        max_backoff: the longest wait, in seconds, before a session that failed is tried
            again (the wait doubles from `poll_interval` with each failure in a row).
        listen: drive the sessions that wake-ups name (a decision recorded in another
            process); False: sweeps alone, for a process that drives what it decides itself
            (`handrail serve`).
        grace: seconds a session may need a worker before a sweep claims it: whoever just
            made it ready (a server resuming the turn it has just decided) takes it first.
        retention: when set, finished sessions (`completed`, `failed`) that nobody touched
            for this many seconds are deleted (`Engine.prune`), once a minute at most.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        poll_interval: float = 1.0,
        batch: int = 100,
        concurrency: int = 1,
        max_backoff: float = 300.0,
        listen: bool = True,
        grace: float = 0.0,
        retention: float | None = None,
    ) -> None:
        if not poll_interval > 0:
            raise UserError(f"Worker(poll_interval={poll_interval!r}) must be positive.")
        if concurrency < 1 or batch < 1:
            raise UserError("Worker: concurrency and batch must be at least 1.")
        if not max_backoff >= poll_interval:
            raise UserError("Worker: max_backoff must be at least poll_interval.")
        if not grace >= 0 or (retention is not None and not retention > 0):
            raise UserError("Worker: grace cannot be negative, and retention must be positive.")
        self.listen = listen
        self.grace = grace
        self.retention = retention
        self._pruned = -math.inf
        self.engine = engine
        self.poll_interval = poll_interval
        self.batch = batch
        self.concurrency = concurrency
        self.max_backoff = max_backoff
        self._slots = asyncio.Semaphore(concurrency)
        self._driving: dict[str, asyncio.Task[bool]] = {}
        self._again: set[str] = set()
        self._failures: dict[str, int] = {}

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Drive ready sessions until `stop` is set or the store is closed.

        Sweeps run on schedule, wake-ups as they come, each session in a task of its own. On
        `stop`, the sessions being driven finish their turn first; cancel the task running
        this to stop at once (a turn in flight is then cut off, and recovered later).
        """
        store = self.engine.store
        wakeups = store.listen() if self.listen else contextlib.nullcontext(None)
        async with wakeups as subscription, asyncio.TaskGroup() as group:
            # Subscribed first, then swept: a wake-up sent in between is not missed. What this
            # worker id drove before a restart comes first, without waiting for a lease to lapse.
            try:
                await self.engine.reclaim()
            except Exception:  # the sweeps find those sessions once their leases lapse
                _log.exception("handrail worker %s: reclaiming failed", self.engine.worker_id)
            sweeps = group.create_task(self._sweep_forever(group))
            waiting: set[asyncio.Future[Any]] = set()
            if subscription is not None:
                waiting.add(group.create_task(self._listen(subscription, group)))
            if stop is not None:
                waiting.add(group.create_task(stop.wait()))
            await asyncio.wait(waiting or {sweeps}, return_when=asyncio.FIRST_COMPLETED)
            for task in (sweeps, *waiting):
                task.cancel()
        # The group has waited for the sessions being driven.

    async def sweep(self) -> list[str]:
        """Claim and drive, to the end, every session that needs a worker now.

        Returns:
            The sessions this worker moved on.
        """
        async with asyncio.TaskGroup() as group:
            tasks = [self._start(s.id, group) for s in await self._claim(self.batch)]
        return [s for s, task in tasks if task is not None and task.result()]

    async def advance(self, session_id: str) -> bool:
        """Take `session_id` as far as it goes now (`Engine.advance`); True if it moved.

        Never raises for the session's sake: another worker driving it is skipped, and any
        other failure is logged with the session's id and the session left for a back-off.
        """
        try:
            result = await self.engine.advance_owned(session_id)
        except SKIPPED:
            return False
        except Exception:
            await self._back_off(session_id)
            return False
        self._failures.pop(session_id, None)
        return result is not None

    # -- inside ---------------------------------------------------------------------------

    async def _sweep_forever(self, group: asyncio.TaskGroup) -> None:
        while True:
            try:
                free = self.concurrency - len(self._driving)
                for summary in await self._claim(min(free, self.batch)) if free > 0 else ():
                    self._start(summary.id, group)
                await self._prune()
            except StoreUnavailableError as error:  # away for a moment: the next sweep tries
                _log.warning("handrail worker %s: a sweep failed: %s", self.engine.worker_id, error)
            except Exception:
                _log.exception("handrail worker %s: a sweep failed", self.engine.worker_id)
            await asyncio.sleep(self.poll_interval)

    async def _prune(self) -> None:
        """Delete the finished sessions past `retention`, once a minute at most."""
        now = time.monotonic()
        if self.retention is None or now - self._pruned < 60:
            return
        self._pruned = now
        deleted = await self.engine.prune(idle_for=self.retention)
        if deleted:
            _log.info(
                "handrail worker %s: pruned %d session(s)", self.engine.worker_id, len(deleted)
            )

    async def _listen(self, wakeups: Any, group: asyncio.TaskGroup) -> None:
        """Drive the sessions wake-ups name; subscribe again when the store drops them.

        A lost subscription (a PostgreSQL restart) must not stop the worker, nor the turns it
        drives: the sweeps go on meanwhile, and a new subscription is tried after a back-off.
        Iteration that ends (the store was closed) ends the worker.
        """
        async with contextlib.AsyncExitStack() as stack:
            while True:
                try:
                    async for session_id in wakeups:
                        self._start(session_id, group)
                    return
                except Exception as error:
                    if not transient(error):
                        raise
                    _log.warning(
                        "handrail worker %s: lost the store's wake-ups (%s); sweeping meanwhile",
                        self.engine.worker_id,
                        error,
                    )
                wakeups = await self._subscribe_again(stack)

    async def _subscribe_again(self, stack: contextlib.AsyncExitStack) -> Any:
        """A new subscription to the store's wake-ups, tried with a back-off until it works."""
        wait = self.poll_interval
        while True:
            await asyncio.sleep(wait)
            try:
                return await stack.enter_async_context(self.engine.store.listen())
            except Exception as error:
                if not transient(error):
                    raise
                wait = min(self.max_backoff, wait * 2)
                _log.warning(
                    "handrail worker %s: cannot subscribe to wake-ups yet (%s); again in %g s",
                    self.engine.worker_id,
                    error,
                    wait,
                )

    async def _claim(self, limit: int) -> list[Any]:
        """Claim up to `limit` due sessions (their leases are then this worker's)."""
        engine = self.engine
        return await engine.store.claim(
            engine.runtime.clock() - self.grace, engine.lease_owner, engine.lease_ttl, limit=limit
        )

    def _start(
        self, session_id: str, group: asyncio.TaskGroup
    ) -> tuple[str, asyncio.Task[bool] | None]:
        """Drive `session_id` in a task of `group`.

        Unless this worker drives it already: then once more after, since a wake-up may say
        that something changed.
        """
        if session_id in self._driving:
            self._again.add(session_id)
            return session_id, None
        task = group.create_task(self._drive(session_id), name=f"handrail advance {session_id}")
        self._driving[session_id] = task
        return session_id, task

    async def _drive(self, session_id: str) -> bool:
        moved = False
        try:
            while True:
                async with self._slots:
                    moved = await self.advance(session_id) or moved
                if session_id not in self._again:
                    return moved
                self._again.discard(session_id)
        finally:
            del self._driving[session_id]

    async def _back_off(self, session_id: str) -> None:
        """Log a session that failed, and keep every worker off it for a while."""
        failures = self._failures[session_id] = self._failures.get(session_id, 0) + 1
        wait = min(self.max_backoff, self.poll_interval * 2 ** (failures - 1))
        unavailable = isinstance(sys.exception(), StoreUnavailableError)
        # The store away is no bug of the session's: the turn was left for recovery, and is
        # taken up again after the wait (no traceback for what the message says in full).
        (_log.warning if unavailable else _log.exception)(
            "handrail worker %s: session %r failed (%d time(s) in a row)%s; trying again in %g s",
            self.engine.worker_id,
            session_id,
            failures,
            f": {sys.exception()}" if unavailable else "",
            wait,
        )
        engine = self.engine
        try:  # the lease is free again (the failed run gave it back): hold it for the wait
            await engine.store.acquire_lease(session_id, f"{engine.worker_id}:backoff", wait)
        except Exception:
            _log.exception(
                "handrail worker %s: could not park session %r", engine.worker_id, session_id
            )
