"""Fixtures for the provider tests: one fake provider server for the session, fresh per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from fake_providers import FakeProviders
from handrail.models.retry import RetryPolicy


class Sleeper:
    """A fake `sleep` that records the waits and takes no time."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture(scope="session")
def fake_server() -> Iterator[FakeProviders]:
    server = FakeProviders()
    yield server
    server.close()


@pytest.fixture
def fake(fake_server: FakeProviders) -> Iterator[FakeProviders]:
    fake_server.reset()
    yield fake_server
    assert fake_server.unplayed == 0, "the test scripted replies that were never requested"
    fake_server.reset()


@pytest.fixture
def sleeper() -> Sleeper:
    return Sleeper()


@pytest.fixture
def retry(sleeper: Sleeper) -> RetryPolicy:
    """Retries that take no real time and no random jitter (waits are exactly the backoff)."""
    return RetryPolicy(sleep=sleeper, random=lambda: 0.0, clock=lambda: 1_000_000.0)


@pytest.fixture
async def openai_model(fake: FakeProviders, retry: RetryPolicy) -> AsyncIterator[object]:
    from handrail.models.openai import OpenAIModel

    model = OpenAIModel("gpt-4o-mini", api_key="sk-test", base_url=fake.openai_url, retry=retry)
    yield model
    await model.aclose()


@pytest.fixture
async def anthropic_model(fake: FakeProviders, retry: RetryPolicy) -> AsyncIterator[object]:
    from handrail.models.anthropic import AnthropicModel

    model = AnthropicModel(
        "claude-sonnet-4-6", api_key="sk-ant-test", base_url=fake.url, retry=retry
    )
    yield model
    await model.aclose()


@pytest.fixture
async def responses_model(fake: FakeProviders, retry: RetryPolicy) -> AsyncIterator[object]:
    from handrail.models.openai_responses import OpenAIResponsesModel

    model = OpenAIResponsesModel("gpt-5", api_key="sk-test", base_url=fake.openai_url, retry=retry)
    yield model
    await model.aclose()
