"""`ConnectionThread`: one thread that owns one blocking connection, fed by the event loop.

SQLite's calls block (on the disk, and on other processes' locks for up to the busy
timeout), so none of them may run on the event loop. A connection is used only by the thread
that opened it, so its transactions are never interleaved by another thread and sqlite3's
same-thread check holds. Jobs run one at a time, in the order they were submitted, except
that the writes waiting when the thread comes to them may run together (`group`): with
SQLite, in one transaction and one commit instead of one each.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["ConnectionThread"]

C = TypeVar("C")
T = TypeVar("T")
_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[Any], Any], bool]
Outcome = tuple[Any, BaseException | None]
"""What a job returned, or what it raised."""
Group = Callable[[C, list[Callable[[C], Any]]], list[Outcome]]
"""Runs write jobs together on the connection; each one's outcome, in order, once they are
all durable (committed): no job's caller may hear of its result before."""
Between = Callable[[C], None]
"""Upkeep run on the connection after each pass over the waiting jobs, once their callers
have their outcomes. What it raises is dropped."""


class ConnectionThread(Generic[C]):
    """A thread holding the connection that `connect()` opens, running jobs on it.

    Args:
        connect: opens the connection (in the thread); if it fails, every job fails with its
            error until the thread is stopped.
        close: closes the connection (in the thread) when the thread stops.
        name: the thread's name (shows in tracebacks and profilers).
        group: runs the write jobs waiting together (see `Group`); None: each alone.
        between: upkeep between passes (see `Between`), e.g. a WAL checkpoint.
    """

    def __init__(
        self,
        connect: Callable[[], C],
        close: Callable[[C], None],
        *,
        name: str,
        group: Group[C] | None = None,
        between: Between[C] | None = None,
    ) -> None:
        self._connect = connect
        self._close = close
        self._group = group
        self._between = between
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.ident: int | None = None
        """The thread's `threading.get_ident()`, once it runs."""
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    async def run(self, job: Callable[[C], T], *, write: bool = False) -> T:
        """Run `job(connection)` in the thread and return what it returns (or raise).

        If the awaiting task is cancelled, the job still runs to its end (a thread cannot be
        stopped halfway), and its result is dropped.

        Args:
            job: the work.
            write: the job writes: it may run with the other writes waiting, in one group.
        """
        return await self.submit(job, write=write)

    def submit(self, job: Callable[[C], T], *, write: bool = False) -> asyncio.Future[T]:
        """Queue `job(connection)` for the thread now; the future of what it returns."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._jobs.put((future.get_loop(), future, job, write))
        return future

    async def stop(self) -> None:
        """Run the jobs already submitted, close the connection, and end the thread."""
        await self.run(_stop)

    def stop_soon(self) -> None:
        """Like `stop`, without waiting."""
        self._jobs.put(None)

    def _main(self) -> None:
        self.ident = threading.get_ident()
        connection: Any = None
        failure: BaseException | None = None
        stopper: _Job | None = None  # the `stop()` job, settled once all is closed
        try:
            connection = self._connect()
        except BaseException as error:  # handed to every job, so the caller sees it
            failure = error
        try:
            while (item := self._jobs.get()) is not None:
                # Everything waiting now: its writes run first, together, then its reads.
                items, stopping = [item], item[2] is _stop
                while not stopping:
                    try:
                        more = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        self._jobs.put(None)  # `stop_soon`: once these have run
                        break
                    items.append(more)
                    stopping = more[2] is _stop
                if stopping:
                    stopper = items.pop()
                if failure is not None:
                    _settle([(item, None, failure) for item in items])
                else:
                    self._run(connection, items)
                    if self._between is not None and not stopping:
                        with contextlib.suppress(Exception):  # upkeep: tried again next time
                            self._between(connection)
                if stopping:
                    break
        finally:
            closing_error: BaseException | None = None
            if connection is not None:
                try:
                    self._close(connection)
                except BaseException as error:
                    closing_error = error
            if stopper is not None:  # settled last: `stop()` returns once all is closed
                _settle([(stopper, None, closing_error)])

    def _run(self, connection: Any, items: list[_Job]) -> None:
        """Run `items` and settle each once its outcome is final.

        The writes run together (if there is a group and several writes), then the reads, one by
        one; without a group, every job runs alone, in order. A group's callers hear of their
        writes all at once, once committed: one wake-up of the event loop for them all, not
        one a job (waking a loop is a system call that gives the GIL away and waits to get it
        back, and a burst's group holds hundreds). A read is settled as soon as it has run.
        """
        writes = [item for item in items if item[3]]
        reads = [item for item in items if not item[3]]
        if self._group is not None and len(writes) > 1:
            try:
                outcomes = self._group(connection, [job for _, _, job, _ in writes])
            except BaseException as failed:  # the group could not run at all
                outcomes = [(None, failed)] * len(writes)
            _settle([(item, *outcome) for item, outcome in zip(writes, outcomes, strict=True)])
        else:
            reads = items  # one by one, in order
        for item in reads:
            try:
                result = item[2](connection)
            except BaseException as error:
                _settle([(item, None, error)])
            else:
                _settle([(item, result, None)])


def _stop(connection: Any) -> None:  # a marker: `_main` stops when it meets it
    raise AssertionError("never called")


def _settle(settled: list[tuple[_Job, Any, BaseException | None]]) -> None:
    """Hand each job's caller its outcome: one call into each event loop for them all."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, Any]]] = {}
    for (loop, future, _, _), result, error in settled:
        by_loop.setdefault(loop, []).append((future, result, error))
    for loop, outcomes in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(_set_outcomes, outcomes)


def _set_outcomes(outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, result, error in outcomes:
        if future.done():  # the caller was cancelled
            continue
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
