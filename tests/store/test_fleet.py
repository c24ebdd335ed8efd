"""Many workers on one PostgreSQL store, one of them killed midway: nothing lost, nothing twice.

The test process submits 200 turns (each ships an order, then waits for a person to approve
the charge); four worker processes (`fleet_worker.py`) decide cards of random sessions and
resume whatever is ready, woken by LISTEN/NOTIFY; one is killed with SIGKILL while they work.
Every session must end completed, with its order shipped once and charged once.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterable, Callable
from pathlib import Path

import pytest

from handrail.store import SessionStore

from .conftest import PG_DSN, empty_pg_schema

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crash_worker import build

WORKER = Path(__file__).with_name("fleet_worker.py")
SESSIONS = 200

pytestmark = pytest.mark.postgres


def spawn(schema: str, effects: Path) -> subprocess.Popen[str]:
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), PG_DSN, schema, str(effects)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    assert worker.stdout.readline().strip() == "ready", worker.stderr
    return worker


async def test_four_workers_one_killed_finish_every_session_exactly_once(
    pg_schema: str, tmp_path: Path
):
    from handrail.store import PostgresStore

    effects = tmp_path / "effects.txt"
    async with PostgresStore(PG_DSN, schema=pg_schema, pool_size=8) as store:
        await empty_pg_schema(pg_schema)
        api = build(store, effects, lease_ttl=1.0)
        sessions = [f"F{i}" for i in range(SESSIONS)]
        for start in range(0, SESSIONS, 20):
            await asyncio.gather(
                *(
                    _drain(api.submit(s, f"Please process order {s}"))
                    for s in sessions[start : start + 20]
                )
            )
        assert len(await store.list(status="suspended", limit=SESSIONS + 1)) == SESSIONS

        workers = [spawn(pg_schema, effects) for _ in range(4)]
        try:
            async with asyncio.timeout(60):
                await _until(store, lambda done: done >= SESSIONS // 4)
            workers[0].send_signal(signal.SIGKILL)  # one dies midway, maybe mid-turn
            async with asyncio.timeout(120):
                await _until(store, lambda done: done == SESSIONS)
        finally:
            for worker in workers[1:]:
                worker.send_signal(signal.SIGTERM)
            for worker in workers:
                _, err = worker.communicate(timeout=30)
                assert worker.returncode in (0, -signal.SIGKILL), err
        assert workers[0].returncode == -signal.SIGKILL

    lines = effects.read_text().splitlines()
    counts = Counter(" ".join(line.split()[:2]) for line in lines)
    assert counts == Counter({f"{kind} {s}": 1 for s in sessions for kind in ("ship", "charge")})


async def _drain(run: AsyncIterable[object]) -> None:
    async for _ in run:
        pass


async def _until(store: SessionStore, condition: Callable[[int], bool]) -> None:
    """Poll until `condition(number of completed sessions)` (the caller bounds the wait)."""
    while not condition(len(await store.list(status="completed", limit=SESSIONS + 1))):  # noqa: ASYNC110
        await asyncio.sleep(0.1)
