"""Per-tenant limits: one organisation cannot take the server from the others.

- `rate`: requests a second per caller (a token bucket of `burst`); past it, 429.
- `streams`: event streams open at once per organisation; past it, 429.
- `turns`: turns running at once per organisation on this server; past it, 429.

Every refusal is a 429 with `Retry-After` (seconds) and a JSON body naming the limit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ._auth import Caller
from ._errors import ApiError

__all__ = ["Limits"]


@dataclass(kw_only=True)
class Limits:
    """What one caller, or one organisation, may use of the server (None: no limit)."""

    rate: float | None = 50.0
    """Requests a second one caller may make, on average."""
    burst: int = 100
    """Requests one caller may make at once, above the average."""
    streams: int | None = 100
    """Event streams one organisation may have open at once."""
    turns: int | None = 100
    """Turns one organisation may have running at once on this server."""
    clock: Callable[[], float] = time.monotonic
    """Seconds, for the rate (injectable for tests)."""
    _buckets: dict[Caller, tuple[float, float]] = field(default_factory=dict, repr=False)
    _streams: dict[str | None, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.rate is not None and not self.rate > 0:
            raise ValueError("Limits: rate must be positive, or None")
        if self.burst < 1:
            raise ValueError("Limits: burst must be at least 1")

    def request(self, caller: Caller) -> None:
        """Count one request of `caller`.

        Raises:
            ApiError: 429, the caller is past its rate; `Retry-After` says when to come back.
        """
        if self.rate is None:
            return
        now = self.clock()
        tokens, last = self._buckets.get(caller, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - last) * self.rate)
        if tokens < 1:
            wait = (1 - tokens) / self.rate
            self._buckets[caller] = (tokens, now)
            raise _too_many(f"more than {self.rate:g} requests a second", wait)
        self._buckets[caller] = (tokens - 1, now)
        if len(self._buckets) > 10_000:  # forget callers that are full again
            self._buckets = {
                c: (t, at)
                for c, (t, at) in self._buckets.items()
                if t + (now - at) * self.rate < self.burst
            }

    def check_stream(self, caller: Caller) -> None:
        """Check that `caller`'s organisation may open one more stream (before its 200).

        Raises:
            ApiError: 429, the organisation has `streams` open already.
        """
        if self.streams is not None and self._streams.get(caller.org_id, 0) >= self.streams:
            raise _too_many(f"more than {self.streams} event streams open at once", 1.0)

    def open_stream(self, caller: Caller) -> None:
        """Count a stream as open once it runs (`close_stream` when it ends, whatever ends it)."""
        self._streams[caller.org_id] = self._streams.get(caller.org_id, 0) + 1

    def close_stream(self, caller: Caller) -> None:
        """A stream counted by `open_stream` has ended."""
        count = self._streams.get(caller.org_id, 0) - 1
        if count > 0:
            self._streams[caller.org_id] = count
        else:
            self._streams.pop(caller.org_id, None)

    def turn(self, caller: Caller, running: int) -> None:
        """Check that `caller`'s organisation, with `running` turns, may start one more.

        Raises:
            ApiError: 429, it has `turns` running already.
        """
        if self.turns is not None and running >= self.turns:
            raise _too_many(f"more than {self.turns} turns running at once", 1.0)


def _too_many(what: str, wait: float) -> ApiError:
    seconds = max(1, math.ceil(wait))
    return ApiError(
        429,
        "too_many_requests",
        f"Your organisation (or key) is past its limit: {what}. Try again in {seconds} s.",
        headers={"Retry-After": str(seconds)},
    )
