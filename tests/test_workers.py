"""WorkerThreads: the pool sync tools run in."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from handrail.tools._workers import WorkerThreads

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


async def test_runs_off_the_event_loop_with_the_callers_context():
    pool = WorkerThreads(name="t")
    request_id.set("r-1")

    def where() -> tuple[str, str]:
        return threading.current_thread().name, request_id.get()

    name, seen = await pool.run(where)
    assert name == "t-1"
    assert seen == "r-1"


async def test_an_exception_is_raised_in_the_awaiting_task():
    def boom() -> None:
        raise ValueError("nope")

    with pytest.raises(ValueError, match="nope"):
        await WorkerThreads().run(boom)


async def test_an_idle_worker_is_reused_and_busy_ones_make_the_pool_grow():
    pool = WorkerThreads(max_threads=4)
    for _ in range(5):
        await pool.run(lambda: None)
    assert pool.threads == 1
    release = threading.Event()
    busy = [asyncio.ensure_future(pool.run(release.wait)) for _ in range(3)]
    await asyncio.sleep(0.05)
    assert pool.threads == 3
    release.set()
    assert await asyncio.gather(*busy) == [True, True, True]


async def test_calls_beyond_max_threads_queue_and_still_finish():
    pool = WorkerThreads(max_threads=2)
    gate = threading.Barrier(2, timeout=5)
    results = await asyncio.gather(*(pool.run(lambda: gate.wait() >= 0) for _ in range(4)))
    assert results == [True] * 4
    assert pool.threads == 2


async def test_cancelling_the_caller_abandons_the_result():
    pool = WorkerThreads()
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(5)
        return "late"

    task = asyncio.ensure_future(pool.run(slow))
    await asyncio.to_thread(started.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    assert await pool.run(lambda: "next") == "next"  # the worker is free again


def test_max_threads_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        WorkerThreads(max_threads=0)
