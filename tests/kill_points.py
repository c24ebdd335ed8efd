"""What the real-kill workers share: dying at a named point, and an external ledger of effects.

A worker process kills itself with SIGKILL (no cleanup, as a crash) when it reaches the point
that the environment variable `CRASH_AT` names. Effects are lines appended to a file, flushed
and fsynced, so they survive the kill: the ledger the tests check every effect against.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

__all__ = ["CRASH_AT", "append", "crash", "lines"]

CRASH_AT = os.environ.get("CRASH_AT", "")


def crash(point: str) -> None:
    """Die here, at once, if `CRASH_AT` names this point."""
    if point == CRASH_AT:
        os.kill(os.getpid(), signal.SIGKILL)


def append(path: Path, line: str) -> None:
    """Record an effect in the ledger, durably."""
    with path.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def lines(path: Path) -> list[str]:
    """The ledger's lines (none before the first effect)."""
    return path.read_text().splitlines() if path.exists() else []
