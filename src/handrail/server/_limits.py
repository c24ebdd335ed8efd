"""Per-tenant limits: one organisation cannot take the server from the others.

- `rate`: requests a second per caller (a token bucket of `burst`); past it, 429.
- `streams`: event streams open at once per organisation; past it, 429.
- `turns`: turns running at once per organisation on this server; past it, 429.
- `stream_bytes`: bytes a second one organisation's event streams may send (a token bucket of
  `stream_burst`): past it, its streams slow down (they wait, keep-alives still go out) and
  it opens no new stream (429) until it is back within. Replaying long event logs is what
  reaches it: 300 replays of a 40,000-event log would otherwise hold the server's CPU.

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
    stream_bytes: float | None = 4_000_000.0
    """Bytes a second one organisation's event streams may send, on average."""
    stream_burst: int = 16_000_000
    """Bytes one organisation's event streams may send at once, above the average."""
    clock: Callable[[], float] = time.monotonic
    """Seconds, for the rate (injectable for tests)."""
    _buckets: dict[Caller, tuple[float, float]] = field(default_factory=dict, repr=False)
    _streams: dict[str | None, int] = field(default_factory=dict, repr=False)
    _sent: dict[str | None, tuple[float, float]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.rate is not None and not self.rate > 0:
            raise ValueError("Limits: rate must be positive, or None")
        if self.burst < 1:
            raise ValueError("Limits: burst must be at least 1")
        if self.stream_bytes is not None and not self.stream_bytes > 0:
            raise ValueError("Limits: stream_bytes must be positive, or None")
        if self.stream_burst < 1:
            raise ValueError("Limits: stream_burst must be at least 1")
        for name in ("streams", "turns"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"Limits: {name} must be at least 1, or None")

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
        wait = self.stream_wait(caller)
        if wait > 0:
            rate = f"{self.stream_bytes:,.0f}"
            raise _too_many(f"its event streams sent more than {rate} bytes a second", wait)

    def sent(self, caller: Caller, size: int) -> None:
        """Count `size` bytes sent on a stream of `caller`'s organisation.

        The bucket may go below empty: then every stream of the organisation waits
        (`stream_wait`) until it is back.
        """
        if self.stream_bytes is not None:
            tokens = self._tokens(caller.org_id) - size
            self._sent[caller.org_id] = (tokens, self.clock())

    def stream_wait(self, caller: Caller) -> float:
        """Seconds `caller`'s organisation's streams should wait before they send more."""
        if self.stream_bytes is None or caller.org_id not in self._sent:
            return 0.0
        return max(0.0, -self._tokens(caller.org_id) / self.stream_bytes)

    def _tokens(self, org_id: str | None) -> float:
        assert self.stream_bytes is not None
        now = self.clock()
        tokens, last = self._sent.get(org_id, (float(self.stream_burst), now))
        if len(self._sent) > 10_000:  # forget organisations that are full again
            rate, burst = self.stream_bytes, self.stream_burst
            self._sent = {
                o: (t, at) for o, (t, at) in self._sent.items() if t + (now - at) * rate < burst
            }
        return min(float(self.stream_burst), tokens + (now - last) * self.stream_bytes)

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
