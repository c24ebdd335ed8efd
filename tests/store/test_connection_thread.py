"""`ConnectionThread`: one thread, one connection, jobs from the event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from handrail.store._thread import ConnectionThread


class _Counted:
    """A 'connection' that records which thread ran each job."""

    def __init__(self) -> None:
        self.threads: set[int] = set()


def _group(connection: _Counted, jobs: list[Any]) -> list[tuple[Any, BaseException | None]]:
    outcomes: list[tuple[Any, BaseException | None]] = []
    for job in jobs:
        try:
            outcomes.append((job(connection), None))
        except Exception as error:
            outcomes.append((None, error))
    return outcomes


async def test_a_group_of_writes_wakes_the_loop_once() -> None:
    loop = asyncio.get_running_loop()
    wakeups = 0
    original = loop.call_soon_threadsafe

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal wakeups
        wakeups += 1
        return original(*args, **kwargs)

    gate = threading.Event()
    thread = ConnectionThread(_Counted, lambda c: None, name="test", group=_group)
    try:
        await thread.run(lambda c: None)
        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        blocker = thread.submit(lambda c: gate.wait(5))  # the jobs below queue up meanwhile

        def boom(c: _Counted) -> None:
            raise ValueError("this job fails alone")

        futures = [thread.submit(lambda c, i=i: i, write=True) for i in range(50)]
        failing = thread.submit(boom, write=True)
        gate.set()
        assert await blocker is True
        assert await asyncio.gather(*futures) == list(range(50))
        with pytest.raises(ValueError, match="fails alone"):
            await failing
        assert wakeups <= 2  # (the blocker may have had a pass of its own), not one a job
    finally:
        loop.call_soon_threadsafe = original  # type: ignore[method-assign]
        await thread.stop()


async def test_a_read_is_answered_as_soon_as_it_has_run() -> None:
    gate, slow_started = threading.Event(), threading.Event()
    thread = ConnectionThread(_Counted, lambda c: None, name="test", group=_group)
    try:
        blocker = thread.submit(lambda c: gate.wait(5))
        writes = [thread.submit(lambda c, i=i: i, write=True) for i in range(2)]
        quick = thread.submit(lambda c: "quick")
        release = threading.Event()

        def slow(c: _Counted) -> str:
            slow_started.set()
            release.wait(5)
            return "slow"

        late = thread.submit(slow)
        gate.set()
        await blocker
        # The group's writes and the quick read are answered while the slow read still runs.
        assert await asyncio.wait_for(asyncio.gather(*writes), 2) == [0, 1]
        assert await asyncio.wait_for(quick, 2) == "quick"
        # The slow read starts on the store's thread (it may not have yet: a loaded machine),
        # and is still running: the quick answers did not wait for it.
        assert await asyncio.to_thread(slow_started.wait, 5) and not late.done()
        release.set()
        assert await late == "slow"
    finally:
        await thread.stop()


async def test_a_cancelled_caller_does_not_stop_the_others_outcomes() -> None:
    gate = threading.Event()
    thread = ConnectionThread(_Counted, lambda c: None, name="test", group=_group)
    try:
        blocker = thread.submit(lambda c: gate.wait(5))
        dropped = thread.submit(lambda c: "dropped", write=True)
        kept = thread.submit(lambda c: "kept", write=True)
        dropped.cancel()
        gate.set()
        await blocker
        assert await kept == "kept"
    finally:
        await thread.stop()
