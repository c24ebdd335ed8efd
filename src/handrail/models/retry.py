"""One retry policy for every model provider.

The providers turn their SDK's own retries off (`max_retries=0`) so that exactly one policy
decides, the same way for OpenAI and Anthropic:

- retried: 408, 409, 429, every 5xx, connection errors and timeouts, with exponential backoff
  and jitter, honouring the provider's `Retry-After` (seconds or an HTTP date) and
  `retry-after-ms`;
- never retried: every other status, notably 400, 401, 403, 404 and 422: the request itself
  is wrong and sending it again cannot help;
- an incomplete response (`IncompleteResponseError`: the provider adapter saw the body end,
  cleanly or cut, before the protocol's end marker) is retried like a connection error;
- a stream that breaks (cut, ended early, or an error event) is retried only while it has
  produced nothing: once a chunk went out to the caller, a retry would repeat it, so the
  failure propagates instead (the agent loop keeps the partial text in the history and ends
  the run with `run-failed`).

Giving up raises `ModelHTTPError` with the status, the provider, its request id and its
message, or, for an incomplete response, `IncompleteResponseError` with the attempts made.
`sleep`, `clock` and `random` are injectable, so a test takes no real time:

```python
slept = []

async def sleep(seconds: float) -> None:
    slept.append(seconds)

policy = RetryPolicy(max_attempts=3, sleep=sleep, random=lambda: 1.0)
```
"""

from __future__ import annotations

import asyncio
import math
import random as _random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TypeVar

from ..exceptions import ConfigError, IncompleteResponseError, ModelHTTPError

__all__ = ["Failure", "RetryPolicy", "is_retryable_status", "parse_retry_after"]

T = TypeVar("T")


def is_retryable_status(status: int) -> bool:
    """Whether an HTTP status is worth retrying: 408, 409, 429 and every 5xx."""
    return status in (408, 409, 429) or status >= 500


def parse_retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """The wait, in seconds, that the provider asked for; None when it asked for none.

    Reads `retry-after-ms` (OpenAI), then `Retry-After` as seconds or as an HTTP date.

    Args:
        headers: the response headers (looked up in lower case, as httpx does).
        now: the current wall time in seconds since the epoch, for an HTTP date.
    """
    milliseconds = headers.get("retry-after-ms")
    if milliseconds is not None:
        try:
            value = float(milliseconds) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return max(value, 0.0)
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            value = parsedate_to_datetime(raw).timestamp() - now
        except (TypeError, ValueError, IndexError):
            return None
    return max(value, 0.0) if math.isfinite(value) else None


@dataclass(kw_only=True, slots=True, frozen=True)
class Failure:
    """One failed request, as a provider describes it to the retry policy."""

    status: int | None
    """The HTTP status, or None when no response came (connection error, timeout)."""
    message: str
    """What the provider said, verbatim (or what the transport said)."""
    retryable: bool
    """Whether sending the same request again may succeed."""
    request_id: str | None = None
    """The provider's request id, when it sent one."""
    retry_after: float | None = None
    """Seconds the provider asked to wait before the next attempt."""


@dataclass(kw_only=True, slots=True)
class RetryPolicy:
    """How a provider retries a request that failed for a reason that may pass.

    The wait before attempt `n + 1` is `min(max_delay, base_delay * 2 ** (n - 1))`, shortened
    by up to `jitter` of itself at random; a `Retry-After` from the provider replaces it. The
    policy gives up (raising `ModelHTTPError`, or `IncompleteResponseError` when the last
    attempt's response was incomplete) after `max_attempts` requests, when the next wait would
    pass `deadline`, or when the provider asks for a wait longer than `max_delay` (waiting less
    would only be refused again).
    """

    max_attempts: int = 4
    """Requests at most, the first included (1: never retry)."""
    base_delay: float = 0.5
    """Seconds before the first retry (before jitter)."""
    max_delay: float = 20.0
    """The longest single wait, in seconds, computed or asked for by the provider."""
    deadline: float | None = 60.0
    """Seconds from the first request after which no retry starts (None: no deadline)."""
    jitter: float = 0.5
    """How much of each computed wait may be cut at random (0: none, 1: full jitter)."""
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    """Waits; inject a fake to test without real time."""
    clock: Callable[[], float] = time.time
    """Wall time in seconds since the epoch (the deadline, and `Retry-After` dates)."""
    random: Callable[[], float] = _random.random
    """A number in [0, 1) for the jitter."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError("RetryPolicy: max_attempts must be at least 1 (1: never retry).")
        if not (0 <= self.base_delay <= self.max_delay):
            raise ConfigError("RetryPolicy: need 0 <= base_delay <= max_delay (seconds).")
        if not 0 <= self.jitter <= 1:
            raise ConfigError("RetryPolicy: jitter must be between 0 and 1.")
        if self.deadline is not None and not self.deadline > 0:
            raise ConfigError("RetryPolicy: deadline must be positive seconds, or None.")

    def backoff(self, attempt: int) -> float:
        """The wait after the `attempt`-th failed request (1-based), jitter applied."""
        delay = min(self.max_delay, self.base_delay * 2.0 ** (attempt - 1))
        return delay * (1.0 - self.jitter * self.random())

    async def stream(
        self,
        provider: str,
        open_stream: Callable[[], AsyncGenerator[T, None]],
        describe: Callable[[Exception], Failure | None],
    ) -> AsyncIterator[T]:
        """Yield what `open_stream()` yields, retrying it under this policy.

        Args:
            provider: named in the error when the policy gives up.
            open_stream: makes one attempt: sends the request and yields its items. It raises
                `IncompleteResponseError` for a response that did not arrive whole.
            describe: turns an exception of an attempt into a `Failure`; None for an
                exception that is not about the request (it propagates untouched).

        Raises:
            ModelHTTPError: the request failed for good.
            IncompleteResponseError: the response did not arrive whole, after output had
                reached the caller (never retried) or on the last attempt.
        """
        started = self.clock()
        attempt = 0
        while True:
            attempt += 1
            emitted = False
            stream = open_stream()
            try:
                while True:
                    try:
                        item = await stream.__anext__()
                    except StopAsyncIteration:
                        return
                    except IncompleteResponseError as exc:
                        cut = Failure(status=None, message=str(exc), retryable=True)
                        decision = self._decide(cut, attempt, emitted, started)
                        if isinstance(decision, str):
                            raise _gave_up(exc, decision, attempt) from exc
                        wait = decision
                        break
                    except Exception as exc:
                        failure = describe(exc)
                        if failure is None:
                            raise
                        decision = self._decide(failure, attempt, emitted, started)
                        if isinstance(decision, str):
                            raise ModelHTTPError(
                                failure.message + decision,
                                status=failure.status,
                                provider=provider,
                                request_id=failure.request_id,
                                attempts=attempt,
                            ) from exc
                        wait = decision
                        break
                    emitted = True
                    yield item
            finally:
                await stream.aclose()
            await self.sleep(wait)

    def _decide(self, failure: Failure, attempt: int, emitted: bool, started: float) -> float | str:
        """The wait before retrying, or why not to retry (a suffix for the error message)."""
        if emitted:
            return " (the stream broke after output had started, so it was not retried)"
        if not failure.retryable:
            return ""
        if attempt >= self.max_attempts:
            return ""
        if failure.retry_after is not None:
            if failure.retry_after > self.max_delay:
                return (
                    f" (the provider asked to wait {failure.retry_after:g} s, more than "
                    f"max_delay={self.max_delay:g} s)"
                )
            wait = failure.retry_after
        else:
            wait = self.backoff(attempt)
        if self.deadline is not None and self.clock() - started + wait > self.deadline:
            return f" (gave up: the next retry would pass the {self.deadline:g} s deadline)"
        return wait


def _gave_up(exc: IncompleteResponseError, why: str, attempts: int) -> IncompleteResponseError:
    """`exc` once the policy gave up on it: `why` and the attempts made added to its message."""
    tries = f" (after {attempts} attempts)" if attempts > 1 else ""
    return IncompleteResponseError(
        f"{exc}{why}{tries}",
        provider=exc.provider,
        missing=exc.missing,
        attempts=attempts,
        state=exc.state,
    )
