"""What a failed turn tells the tenant: the error's class and a reference, never the detail."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest

from fake_providers import FakeProviders, openai_error
from handrail import Agent, Engine, Runtime
from handrail.models.openai import OpenAIModel
from handrail.models.retry import RetryPolicy
from handrail.server import create_app
from handrail.store import MemoryStore

from .conftest import ANA, authenticator

KEY = "sk-live-0123456789abcdef"


@pytest.fixture
def provider() -> Iterator[FakeProviders]:
    fake = FakeProviders()
    yield fake
    fake.close()


async def test_a_providers_error_never_reaches_the_tenant(
    provider: FakeProviders, caplog: pytest.LogCaptureFixture
) -> None:
    # A proxy that echoes the request's headers, an internal host, and the system prompt.
    echo = (
        f"bad request from gateway.internal.corp: Authorization: Bearer {KEY}; "
        f"prompt was 'You are the refund desk of ACME'"
    )
    provider.script(openai_error(400, echo, "invalid_request_error"))
    model = OpenAIModel(
        "gpt-4o-mini", api_key=KEY, base_url=provider.openai_url, retry=RetryPolicy(max_attempts=1)
    )
    engine = Engine(
        Agent("desk", instructions="You are the refund desk of ACME"),
        store=MemoryStore(),
        runtime=Runtime(model=model),
    )
    app = create_app(engine, authenticator=authenticator())
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
    ):
        session = (await client.post("/sessions", headers=ANA)).json()["id"]
        with caplog.at_level(logging.ERROR, logger="handrail.runs"):
            turn = await client.post(
                f"/sessions/{session}/turns", json={"text": "refund A1"}, headers=ANA
            )
            assert turn.status_code == 202
            await app.state.runs.join(session)
        stream = await client.get(f"/sessions/{session}/events", headers=ANA)
        exported = await engine.store.export(session)
    await model.aclose()

    for seen in (stream.text, exported):
        assert KEY not in seen and "gateway.internal" not in seen and "ACME" not in seen
    failed = [e for _, e in await engine.store.events(session) if e["type"] == "run-failed"]
    (event,) = failed
    assert event["error"].startswith("ModelHTTPError: the turn failed (reference ")
    reference = event["error"].split("reference ")[1].split(";")[0]
    (record,) = [r for r in caplog.records if reference in r.getMessage()]
    assert "gateway.internal.corp" in record.getMessage()  # the operator gets the detail...
    assert KEY not in record.getMessage() and "Authorization: Bearer ***" in record.getMessage()
    # ... once (the event log names the reference it was logged under), with its traceback,
    # the session and the reference as fields, and no secret in the traceback either.
    assert event["reference"] == reference
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [getattr(r, "reference", r.getMessage()) for r in failures] == [reference]
    assert record.session_id == session  # type: ignore[attr-defined]
    assert record.exc_info is not None and record.exc_text is not None
    assert "Traceback (most recent call last)" in record.exc_text
    assert "handrail.exceptions.ModelHTTPError: openai: HTTP 400" in record.exc_text
    assert KEY not in caplog.text
