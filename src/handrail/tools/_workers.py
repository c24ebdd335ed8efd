"""`WorkerThreads`: where sync tools run, off the event loop.

`loop.run_in_executor` with a `ThreadPoolExecutor` costs a `concurrent.futures.Future`, its
`Condition`, and a future chained onto an asyncio one, for every call: on these machines about
a third more than the hop itself. This pool hands the call to a worker through a C
`SimpleQueue` and the result back with one `call_soon_threadsafe`, and nothing else. It grows
on demand up to `max_threads` (a call never waits behind a busy worker while the pool can
grow) and its threads are daemons, like the default executor's at interpreter exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["WorkerThreads"]

T = TypeVar("T")
_Job = tuple[
    Callable[[Callable[[], Any]], Any],  # the caller's contextvars.Context.run
    asyncio.AbstractEventLoop,
    "asyncio.Future[Any]",
    Callable[[], Any],
]


class WorkerThreads:
    """A small, fast pool of worker threads for sync tools.

    Args:
        max_threads: how many sync tools may run at once; more calls queue.
        name: prefix of the threads' names (shows in tracebacks and profilers).
    """

    def __init__(self, max_threads: int = 32, *, name: str = "handrail-tool") -> None:
        if max_threads < 1:
            raise ValueError("max_threads must be at least 1")
        self.max_threads = max_threads
        self.name = name
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads = 0

    @property
    def threads(self) -> int:
        """How many worker threads exist now."""
        return self._threads

    async def run(self, function: Callable[[], T]) -> T:
        """Run `function()` in a worker thread, with the caller's context variables.

        Cancelling the awaiting task abandons the result; the function itself runs on (a
        thread cannot be stopped from outside).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((contextvars.copy_context().run, loop, future, function))
        if not self._idle.acquire(blocking=False):
            self._grow()
        return await future

    def _grow(self) -> None:
        with self._lock:
            if self._threads >= self.max_threads:
                return
            self._threads += 1
            number = self._threads
        threading.Thread(target=self._work, name=f"{self.name}-{number}", daemon=True).start()

    def _work(self) -> None:
        jobs, idle = self._jobs, self._idle
        while True:
            run, loop, future, function = jobs.get()
            try:
                value, error = run(function), None
            except BaseException as exc:  # handed to the awaiting task, raised there
                value, error = None, exc
            # Idle before the result is handed back: the caller's next call must find this
            # worker rather than start another one.
            idle.release()
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
                loop.call_soon_threadsafe(_settle, future, value, error)
            del run, loop, future, function, value, error


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)
