"""Which store failures pass, and how a store call is made again: `transient`, `StoreRetry`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..exceptions import StoreError, StoreUnavailableError, UserError

LEFT = (
    "The turn is left as a crash at this point leaves it: nothing stored is lost, and "
    "engine.advance(session_id) (or a Worker, by itself) finishes it once the store answers "
    "again."
)
"""What a `StoreUnavailableError` from a turn says was left."""


def transient(error: BaseException) -> bool:
    """Whether a store call that raised `error` may go through if made again.

    A `StoreUnavailableError` (what the stores raise for a lost or refused connection, a
    pool with no connection to give, a SQLite database locked past `busy_timeout`), and a
    `ConnectionError` or `TimeoutError` from a store of one's own. Never a `ConflictError`, a
    refused save or an unreadable row: the same call would fail the same way.
    """
    if isinstance(error, StoreUnavailableError):
        return True
    return isinstance(error, ConnectionError | TimeoutError) and not isinstance(error, StoreError)


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreRetry:
    """How an engine retries a store call that failed for a moment (see `transient`).

    A call is made up to `attempts` times in all, waiting `delay` seconds after the first
    failure and twice as long after each next one, at most `max_delay`: by default 6 attempts
    over about 3 s, enough for a dropped connection, a busy database, or a PostgreSQL
    restart. When the store stays away, the turn is left as a crash at that point leaves it,
    for `Engine.advance` or a `Worker` to finish (durability.md, "What a store fault does").

    Args:
        attempts: tries in all, the first one included (1: never retry).
        delay: seconds to wait after the first failure.
        max_delay: the longest wait between two tries.
        sleep: how to wait (`asyncio.sleep`; a test passes one that returns at once).
    """

    attempts: int = 6
    delay: float = 0.1
    max_delay: float = 2.0
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def __post_init__(self) -> None:
        if self.attempts < 1 or not self.delay >= 0 or not self.max_delay >= self.delay:
            raise UserError(
                f"StoreRetry(attempts={self.attempts!r}, delay={self.delay!r}, "
                f"max_delay={self.max_delay!r}): attempts must be at least 1, and "
                f"0 <= delay <= max_delay."
            )

    def delays(self) -> list[float]:
        """The waits between the tries, in order (one fewer than `attempts`)."""
        waits, delay = [], self.delay
        for _ in range(self.attempts - 1):
            waits.append(delay)
            delay = min(delay * 2, self.max_delay)
        return waits
