"""Crash tests with real processes: a worker is killed with SIGKILL, a fresh one finishes.

The worker (`tests/crash_worker.py`) ships and charges an order on a SQLite file; the charge is
gated and not idempotent. Whatever the kill point, the fresh worker finishes the turn and
every order is shipped once and charged once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("crash_worker.py")


def start(db: Path, effects: Path, session: str, crash_at: str = "") -> subprocess.Popen[str]:
    env = {**os.environ, "CRASH_AT": crash_at}
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(db), str(effects), session, "0.3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish(db: Path, effects: Path, session: str) -> str:
    """A fresh worker takes the session to the end of its turn."""
    worker = start(db, effects, session)
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    return out.splitlines()[-1]


def counts(effects: Path) -> Counter[str]:
    lines = effects.read_text().splitlines() if effects.exists() else []
    return Counter(" ".join(line.split()[:2]) for line in lines)


@pytest.mark.parametrize(
    "point",
    [
        "charge-started",
        "charge-done",
        "suspended",
        "after-result",
        # Right after each write that groups several (docs/durability.md):
        "leased",
        "checkpoint-started",
        "suspend-released",
        "decided",
        "resume-started",
        "completed-released",
    ],
)
def test_a_worker_killed_at_each_point_is_finished_by_a_fresh_one(tmp_path: Path, point: str):
    db, effects = tmp_path / "h.db", tmp_path / "effects.txt"
    killed = start(db, effects, "A1", crash_at=point)
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    assert finish(db, effects, "A1") == "done completed"
    assert counts(effects) == {"ship A1": 1, "charge A1": 1}


def test_random_kills_never_lose_a_turn_or_repeat_an_effect(tmp_path: Path):
    db, effects = tmp_path / "h.db", tmp_path / "effects.txt"
    rng = random.Random(7)
    sessions = [f"S{i}" for i in range(12)]
    for session in sessions:
        worker = start(db, effects, session)
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "started"  # imports done: the turn begins
        time.sleep(rng.uniform(0, 0.25))
        worker.send_signal(signal.SIGKILL)
        worker.communicate(timeout=60)
        assert finish(db, effects, session) == "done completed"
    expected = Counter({f"{kind} {s}": 1 for s in sessions for kind in ("ship", "charge")})
    assert counts(effects) == expected
