"""`RetryPolicy` on its own: which failures it retries, how long it waits, when it gives up."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from email.utils import formatdate

import pytest
from hypothesis import given
from hypothesis import strategies as st

from handrail import ConfigError, IncompleteResponseError, ModelHTTPError
from handrail.models.retry import Failure, RetryPolicy, is_retryable_status, parse_retry_after


class Boom(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


def describe(exc: Exception) -> Failure | None:
    return exc.failure if isinstance(exc, Boom) else None


class Attempts:
    """Each attempt plays the next script: items to yield, then an optional failure.

    A failure is a `Failure` (raised as `Boom`, which `describe` reads) or an exception.
    """

    def __init__(self, *scripts: tuple[list[str], Failure | Exception | None]) -> None:
        self.scripts = list(scripts)
        self.made = 0
        self.closed = 0

    async def __call__(self) -> AsyncGenerator[str, None]:
        items, failure = self.scripts[self.made]
        self.made += 1
        try:
            for item in items:
                yield item
            if isinstance(failure, Exception):
                raise failure
            if failure is not None:
                raise Boom(failure)
        finally:
            self.closed += 1


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def policy(waits: list[float], clock: Clock | None = None, **kwargs: object) -> RetryPolicy:
    clock = clock or Clock()

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.now += seconds

    return RetryPolicy(sleep=sleep, clock=clock, random=lambda: 0.0, **kwargs)  # type: ignore[arg-type]


async def run(retry: RetryPolicy, attempts: Attempts) -> list[str]:
    return [item async for item in retry.stream("acme", attempts, describe)]


BUSY = Failure(status=503, message="busy", retryable=True, request_id="r1")
BAD = Failure(status=400, message="bad request", retryable=False, request_id="r2")


async def test_retries_until_success_with_exponential_backoff():
    waits: list[float] = []
    attempts = Attempts(([], BUSY), ([], BUSY), ([], BUSY), (["ok"], None))

    assert await run(policy(waits), attempts) == ["ok"]
    assert waits == [0.5, 1.0, 2.0]
    assert attempts.closed == 4  # every attempt's stream is closed


async def test_gives_up_after_max_attempts_with_the_last_failure():
    waits: list[float] = []
    attempts = Attempts(([], BUSY), ([], BUSY))

    with pytest.raises(ModelHTTPError) as caught:
        await run(policy(waits, max_attempts=2), attempts)

    error = caught.value
    assert (error.status, error.provider, error.request_id, error.attempts) == (
        503,
        "acme",
        "r1",
        2,
    )
    assert str(error) == "acme: HTTP 503 after 2 attempts: busy (request id r1)"
    assert isinstance(error.__cause__, Boom)
    assert waits == [0.5]


async def test_a_request_the_provider_refuses_is_never_retried():
    waits: list[float] = []
    with pytest.raises(ModelHTTPError, match=r"acme: HTTP 400: bad request \(request id r2\)"):
        await run(policy(waits), Attempts(([], BAD), (["never"], None)))
    assert waits == []


async def test_a_failure_after_output_is_not_retried():
    waits: list[float] = []
    attempts = Attempts((["par"], BUSY), (["whole"], None))
    seen: list[str] = []

    with pytest.raises(ModelHTTPError, match="broke after output had started"):
        async for item in policy(waits).stream("acme", attempts, describe):
            seen.append(item)

    assert seen == ["par"]
    assert attempts.made == 1


def cut() -> IncompleteResponseError:
    return IncompleteResponseError(
        "acme: the response ended without its end marker: connection closed",
        provider="acme",
        missing="end marker",
    )


async def test_an_incomplete_response_is_retried_while_nothing_was_yielded():
    waits: list[float] = []
    attempts = Attempts(([], cut()), ([], cut()), (["whole"], None))

    assert await run(policy(waits), attempts) == ["whole"]
    assert waits == [0.5, 1.0]
    assert attempts.closed == 3


async def test_an_incomplete_response_after_output_is_raised_not_retried():
    waits: list[float] = []
    attempts = Attempts((["par"], cut()), (["whole"], None))
    seen: list[str] = []

    with pytest.raises(IncompleteResponseError) as caught:
        async for item in policy(waits).stream("acme", attempts, describe):
            seen.append(item)

    assert seen == ["par"]
    assert attempts.made == 1
    assert waits == []
    error = caught.value
    assert (error.provider, error.missing, error.attempts) == ("acme", "end marker", 1)
    assert str(error) == (
        "acme: the response ended without its end marker: connection closed (the stream broke "
        "after output had started, so it was not retried)"
    )


async def test_incomplete_responses_until_max_attempts_raise_incomplete_response_error():
    waits: list[float] = []
    attempts = Attempts(([], cut()), ([], cut()), (["never"], None))

    with pytest.raises(IncompleteResponseError) as caught:
        await run(policy(waits, max_attempts=2), attempts)

    assert caught.value.attempts == 2
    assert str(caught.value).endswith("connection closed (after 2 attempts)")
    assert isinstance(caught.value.__cause__, IncompleteResponseError)
    assert waits == [0.5]


async def test_other_exceptions_propagate_untouched():
    async def attempt() -> AsyncGenerator[str, None]:
        raise KeyError("a bug")
        yield ""

    with pytest.raises(KeyError):
        await run(policy([]), attempt)  # type: ignore[arg-type]


async def test_retry_after_replaces_the_backoff():
    waits: list[float] = []
    slow = Failure(status=429, message="slow down", retryable=True, retry_after=12.0)
    assert await run(policy(waits), Attempts(([], slow), (["ok"], None))) == ["ok"]
    assert waits == [12.0]


async def test_a_retry_after_longer_than_max_delay_gives_up_at_once():
    waits: list[float] = []
    slow = Failure(status=429, message="slow down", retryable=True, retry_after=3600.0)
    with pytest.raises(ModelHTTPError, match="asked to wait 3600 s, more than max_delay=20 s"):
        await run(policy(waits), Attempts(([], slow)))
    assert waits == []


async def test_the_deadline_stops_retries_that_would_pass_it():
    waits: list[float] = []
    attempts = Attempts(*[([], BUSY)] * 10)
    with pytest.raises(ModelHTTPError, match="would pass the 3 s deadline") as caught:
        await run(policy(waits, deadline=3.0, max_attempts=10), attempts)
    assert waits == [0.5, 1.0]  # 0.5 + 1 + 2 > 3
    assert caught.value.attempts == 3


def test_jitter_shortens_the_wait_by_up_to_its_fraction():
    full = RetryPolicy(jitter=1.0, random=lambda: 0.999)
    none = RetryPolicy(jitter=0.0, random=lambda: 0.999)
    half = RetryPolicy(jitter=0.5, random=lambda: 0.5)
    assert none.backoff(3) == 2.0
    assert full.backoff(3) == pytest.approx(0.002)
    assert half.backoff(3) == 1.5
    assert RetryPolicy(max_delay=5.0, jitter=0.0).backoff(30) == 5.0


@given(st.integers(min_value=1, max_value=50), st.floats(min_value=0, max_value=0.999))
def test_a_wait_is_never_negative_nor_above_max_delay(attempt: int, draw: float):
    retry = RetryPolicy(random=lambda: draw)
    assert 0 <= retry.backoff(attempt) <= retry.max_delay


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after": "-3"}, 0.0),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after-ms": "soon", "retry-after": "9"}, 9.0),
        ({"retry-after": formatdate(1_000_030.0, usegmt=True)}, 30.0),
        ({"retry-after": formatdate(999_000.0, usegmt=True)}, 0.0),
        ({"retry-after": "whenever"}, None),
        ({"retry-after": "inf"}, None),
        ({}, None),
    ],
)
def test_retry_after_reads_seconds_milliseconds_and_http_dates(
    headers: dict[str, str], expected: float | None
):
    assert parse_retry_after(headers, now=1_000_000.0) == expected


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(status, False) for status in (400, 401, 403, 404, 422)]
    + [(status, True) for status in (408, 409, 429, 500, 502, 503, 529)],
)
def test_which_statuses_are_retried(status: int, retryable: bool):
    assert is_retryable_status(status) is retryable


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"base_delay": -1.0},
        {"base_delay": 30.0, "max_delay": 1.0},
        {"jitter": 1.5},
        {"deadline": 0.0},
    ],
)
def test_a_bad_policy_is_a_config_error(kwargs: dict[str, float]):
    with pytest.raises(ConfigError, match="RetryPolicy"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
