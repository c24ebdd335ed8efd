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
worker = Worker(engine, concurrency=8, health_interval=60)
await worker.run(stop, grace=30)  # until `stop` is set; then a drain of at most 30 s
```

`handrail worker MODULE:NAME` runs this loop in a process of its own (docs/scheduling.md), and
`handrail serve` runs it beside its HTTP API (sweeps alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import sys
import time
from typing import Any

from .engine import SKIPPED, Engine, transient
from .exceptions import StoreUnavailableError, UserError
from .store import SessionSummary
from .store._base import take_wakeup

__all__ = ["Worker", "WorkerStats", "name_worker"]

_log = logging.getLogger("handrail.worker")


def name_worker(engine: Engine, worker_id: str) -> None:
    """Give `engine` the worker id `worker_id` (and a lease owner of it), before it runs.

    Each process needs its own: processes sharing one would take each other's leases at
    start-up (`Engine.reclaim`). `handrail serve --workers` and `handrail worker --worker-id`
    name their engines with it.
    """
    incarnation = engine.lease_owner.rpartition("#")[2]
    engine.worker_id = worker_id
    engine.lease_owner = f"{worker_id}#{incarnation}"


@dataclasses.dataclass(kw_only=True, slots=True)
class WorkerStats:
    """What a `Worker` did since it started (`Worker.stats`; its health line tells the change).

    `resumed`, `recovered`, `applied` and `expired` are its engine's `tally` (the engine's
    drives, whoever asked for them).
    """

    swept: int = 0
    """Sessions its sweeps claimed (and took back at start-up: `Engine.reclaim`)."""
    woken: int = 0
    """Sessions wake-ups named (a decision recorded in another process)."""
    moved: int = 0
    """Sessions it took further (resumed, recovered, applied, or expired and went on)."""
    resumed: int = 0
    """Decided turns resumed."""
    recovered: int = 0
    """Turns cut off while they ran (a dead worker's) recovered."""
    applied: int = 0
    """Decided batch cards applied."""
    expired: int = 0
    """Cards past their deadline expired."""
    failed: int = 0
    """Drives of a session that failed (logged, the session parked for a back-off)."""
    pruned: int = 0
    """Finished sessions deleted past `retention`."""
    driving: int = 0
    """Sessions being driven now."""

    def line(self, since: WorkerStats | None = None) -> str:
        """The counts, as the health line says them (less `since`'s, when given)."""
        base = since or WorkerStats()
        count = {f.name: getattr(self, f.name) - getattr(base, f.name) for f in _COUNTED}
        return (
            f"swept {count['swept']}, woken {count['woken']}, moved {count['moved']} "
            f"(resumed {count['resumed']}, recovered {count['recovered']}, applied "
            f"{count['applied']}), expired {count['expired']} card(s), failed "
            f"{count['failed']}, pruned {count['pruned']}"
        )


_TASK = "handrail advance "
"""The name of a task driving a session, before the session's id."""
_COUNTED = [f for f in dataclasses.fields(WorkerStats) if f.name != "driving"]
_SKEW = 5.0
"""Seconds a woken session's `expires_at` may be ahead of this worker's clock and still be due."""


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
        health_interval: when set, every this many seconds `run` logs a health line (INFO,
            logger `handrail.worker`): its lease owner, what it did since the last line
            (`WorkerStats`), how many sessions it drives now.
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
        health_interval: float | None = None,
    ) -> None:
        if not poll_interval > 0:
            raise UserError(f"Worker(poll_interval={poll_interval!r}) must be positive.")
        if concurrency < 1 or batch < 1:
            raise UserError("Worker: concurrency and batch must be at least 1.")
        if not max_backoff >= poll_interval:
            raise UserError("Worker: max_backoff must be at least poll_interval.")
        if not grace >= 0 or (retention is not None and not retention > 0):
            raise UserError("Worker: grace cannot be negative, and retention must be positive.")
        if health_interval is not None and not health_interval > 0:
            raise UserError(f"Worker(health_interval={health_interval!r}) must be positive.")
        self.health_interval = health_interval
        self._stats = WorkerStats()
        self._stopping = False
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

    @property
    def stats(self) -> WorkerStats:
        """What this worker did since it started, and how many sessions it drives now."""
        tally = self.engine.tally
        return dataclasses.replace(
            self._stats,
            resumed=tally["resumed"],
            recovered=tally["recovered"],
            applied=tally["applied"],
            expired=tally["expired"],
            driving=len(self._driving),
        )

    async def run(self, stop: asyncio.Event | None = None, *, grace: float | None = None) -> None:
        """Drive ready sessions until `stop` is set or the store is closed.

        Sweeps run on schedule, wake-ups as they come, each session in a task of its own.

        On `stop` (a drain) it takes no new work: the sweeps and wake-ups stop, and the
        sessions being driven finish their turn. With `grace`, those still running after
        `grace` seconds are cut off (their leases given back, so the next sweep of any
        worker recovers them from the tool-call log). Cancel the task running this to stop at
        once (a turn in flight is then cut off, and recovered later).
        """
        self._stopping = False
        began = self.stats  # the first health line tells what the start-up did, too
        store = self.engine.store
        wakeups = store.listen() if self.listen else contextlib.nullcontext(None)
        async with wakeups as subscription, asyncio.TaskGroup() as group:
            # Subscribed first, then swept: a wake-up sent in between is not missed. What this
            # worker id drove before a restart comes first, without waiting for a lease to lapse.
            try:
                taken = await self.engine.reclaim()
                self._stats.swept += len(taken)
                self._stats.moved += len(taken)
            except Exception:  # the sweeps find those sessions once their leases lapse
                _log.exception("handrail worker %s: reclaiming failed", self.engine.worker_id)
            sweeps = group.create_task(self._sweep_forever(group))
            health = group.create_task(self._health_forever(began))
            waiting: set[asyncio.Future[Any]] = set()
            if subscription is not None:
                waiting.add(group.create_task(self._listen(subscription, group)))
            if stop is not None:
                waiting.add(group.create_task(stop.wait()))
            await asyncio.wait(waiting or {sweeps}, return_when=asyncio.FIRST_COMPLETED)
            self._stopping = True  # no session is driven once more after its turn
            for task in (sweeps, health, *waiting):
                task.cancel()
            await self._drain(grace)
        # The group has waited for the sessions being driven.

    async def _drain(self, grace: float | None) -> None:
        """Let the sessions being driven finish; past `grace` seconds, cut them off."""
        driving = list(self._driving.values())
        owner = self.engine.lease_owner
        if not driving:
            return
        _log.info(
            "handrail worker %s: draining: %d session(s) being driven finish their turn%s",
            owner,
            len(driving),
            f" (for at most {grace:g} s)" if grace is not None else "",
        )
        if grace is None:
            await asyncio.wait(driving)
            return
        _, left = await asyncio.wait(driving, timeout=grace)
        if left:
            _log.warning(
                "handrail worker %s: %d session(s) still running after %g s: cut off, their "
                "leases given back; any worker's next sweep recovers them: %s",
                owner,
                len(left),
                grace,
                ", ".join(sorted(t.get_name().removeprefix(_TASK) for t in left)),
            )
            for task in left:
                task.cancel()
            await asyncio.wait(left)

    async def _health_forever(self, last: WorkerStats) -> None:
        """Log a health line every `health_interval` seconds (when set), from `last` on."""
        if self.health_interval is None:
            return
        while True:
            await asyncio.sleep(self.health_interval)
            now = self.stats
            _log.info(
                "handrail worker %s: health: in the last %g s %s; driving %d of %d",
                self.engine.lease_owner,
                self.health_interval,
                now.line(last),
                now.driving,
                self.concurrency,
            )
            last = now

    async def sweep(self) -> list[str]:
        """Claim and drive, to the end, every session that needs a worker now.

        Returns:
            The sessions this worker moved on.
        """
        claimed = await self._claim(self.batch)
        self._stats.swept += len(claimed)
        async with asyncio.TaskGroup() as group:
            tasks = [self._start(s.id, group) for s in claimed]
        return [s for s, task in tasks if task is not None and task.result()]

    async def advance(self, session_id: str, summary: SessionSummary | None = None) -> bool:
        """Take `session_id` as far as it goes now (`Engine.advance`); True if it moved.

        In the session's own scope: `summary`'s, when given (as read already), else read.
        Never raises for the session's sake: another worker driving it is skipped, and any
        other failure is logged with the session's id and the session left for a back-off.
        """
        try:
            if summary is None:
                result = await self.engine.advance_owned(session_id)
            else:
                result = await self.engine.advance(
                    session_id, org_id=summary.org_id, user_id=summary.user_id
                )
        except SKIPPED:
            return False
        except Exception:
            self._stats.failed += 1
            await self._back_off(session_id)
            return False
        self._failures.pop(session_id, None)
        if result is not None:
            self._stats.moved += 1
        return result is not None

    # -- inside ---------------------------------------------------------------------------

    async def _sweep_forever(self, group: asyncio.TaskGroup) -> None:
        while True:
            try:
                free = self.concurrency - len(self._driving)
                for summary in await self._claim(min(free, self.batch)) if free > 0 else ():
                    self._stats.swept += 1
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
        self._stats.pruned += len(deleted)
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
                        self._stats.woken += 1
                        self._start(session_id, group, woken=True)
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
        return await engine.claim(engine.runtime.clock() - self.grace, limit=limit)

    def _start(
        self, session_id: str, group: asyncio.TaskGroup, *, woken: bool = False
    ) -> tuple[str, asyncio.Task[bool] | None]:
        """Drive `session_id` in a task of `group` (`woken`: a wake-up named it).

        Unless this worker drives it already: then once more after, since a wake-up may say
        that something changed.
        """
        if session_id in self._driving:
            self._again.add(session_id)
            return session_id, None
        drive = self._drive(session_id, woken=woken)
        task = group.create_task(drive, name=f"{_TASK}{session_id}")
        self._driving[session_id] = task
        return session_id, task

    async def _drive(self, session_id: str, *, woken: bool) -> bool:
        moved = False
        try:
            while True:
                async with self._slots:
                    if woken:
                        moved = await self._advance_woken(session_id) or moved
                    else:
                        moved = await self.advance(session_id) or moved
                if session_id not in self._again or self._stopping:
                    return moved
                self._again.discard(session_id)
                woken = True  # once more, for a wake-up (or a claim) that came meanwhile
        finally:
            del self._driving[session_id]

    async def _advance_woken(self, session_id: str) -> bool:
        """`advance` a session a wake-up named, if this process claims the wake-up first.

        Every worker listening hears it; one should read the session. The store's wake-up
        claim (`take_wakeup`) picks it before anything is read, and writes nothing: a worker
        that does not get it (another process's claim, the session's lease another's, or the
        session needing nobody now) drops the wake-up without reading the session. The one
        that gets it drives as every drive does (its first write takes the lease, with the
        compare-and-swap on the version it read), holding the claim till the drive ends.
        """
        engine = self.engine
        # A decider's clock a little ahead of this one's must not make a decided turn look
        # not yet due: a turn that is not (it waits on a card) is read and left, as before.
        due = engine.runtime.clock() + _SKEW
        claimed = False
        try:
            claim = take_wakeup(engine.store, session_id, due=due, owner=engine.lease_owner)
            async with claim as summary:
                claimed = True
                if summary is None:
                    _log.debug(
                        "handrail worker %s: wake-up for session %r left: another process "
                        "takes it, or it needs nobody now",
                        engine.lease_owner,
                        session_id,
                    )
                    return False
                return await self.advance(session_id, summary)
        except Exception as error:  # the claim's (`advance` raises nothing for the session)
            if claimed:  # given back badly: it goes with its connection
                _log.warning(
                    "handrail worker %s: giving back the wake-up claim on session %r failed: %s",
                    engine.lease_owner,
                    session_id,
                    error,
                )
                return False
            # Not to be had (the store away for a moment): driven as if every worker were
            # woken, the drive's first write picking one.
            _log.debug(
                "handrail worker %s: no wake-up claim on session %r (%s); driving it",
                engine.lease_owner,
                session_id,
                error,
            )
            return await self.advance(session_id)

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
