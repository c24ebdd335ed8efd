"""`handrail serve` runs the sweeps itself: an expired card leads to a run the model finishes."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from handrail import Agent, Engine, Runtime, tool
from handrail.models import ModelRequest
from handrail.server import create_app
from handrail.store import MemoryStore
from handrail.testing import FunctionModel, call

from .conftest import ANA, StreamingTransport, authenticator, frames


@tool(name="orders.refund", permission="write", expires_after=0.2)
def refund(order: str) -> str:
    """Refund an order (a person must approve within 0.2 s)."""
    raise AssertionError("never approved, so never run")


def answer(request: ModelRequest) -> Any:
    calls = [p for m in request.messages for p in m.tool_calls]
    if not calls:
        return call("orders.refund", order="A1")
    return f"I could not refund: {calls[0].result.error}"  # type: ignore[union-attr]


async def test_an_expired_card_leads_to_a_run_the_model_finishes():
    engine = Engine(
        Agent("desk", tools=[refund]),
        store=MemoryStore(),
        runtime=Runtime(model=FunctionModel(answer)),
    )
    app = create_app(engine, authenticator=authenticator(), sweep_interval=0.05)
    transport = httpx.ASGITransport(app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://test") as client,
    ):
        session = (await client.post("/sessions", headers=ANA)).json()["id"]
        turn = await client.post(
            f"/sessions/{session}/turns", json={"text": "refund A1"}, headers=ANA
        )
        assert turn.status_code == 202
        async with asyncio.timeout(10):
            while True:  # nobody decides: the deadline passes, and the sweeps go on with it
                view = (await client.get(f"/sessions/{session}", headers=ANA)).json()
                # The run the sweeps drove goes to the event log, for the page to show, once
                # it ends (after the session is saved: wait for both).
                events = [e["type"] for _, e in await engine.store.events(session)]
                if view["status"] == "completed" and events[-1] == "run-completed":
                    break
                await asyncio.sleep(0.05)
        assert view["pending"] == []
        answer_text = view["messages"][-1]["parts"][0]["text"]
        assert "Nobody decided on this call before its deadline" in answer_text


async def test_a_stream_gets_the_sweeps_run_as_it_is_logged_not_on_a_timer():
    engine = Engine(
        Agent("desk", tools=[refund]),
        store=MemoryStore(),
        runtime=Runtime(model=FunctionModel(answer)),
    )
    # The stream re-reads the log only after an hour of quiet: the sweeps' events reach it
    # through the store's notices.
    app = create_app(engine, authenticator=authenticator(), sweep_interval=0.05, poll_interval=3600)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=StreamingTransport(app), base_url="http://test") as client,
    ):
        session = (await client.post("/sessions", headers=ANA)).json()["id"]
        async with client.stream(
            "POST",
            f"/sessions/{session}/turns",
            json={"text": "refund A1"},
            headers={**ANA, "Accept": "text/event-stream"},
        ) as response:
            suspended = [f async for f in frames(response)]
        assert suspended[-1].type == "run-suspended"
        url = f"/sessions/{session}/events?after={suspended[-1].id}"
        async with client.stream("GET", url, headers=ANA) as response, asyncio.timeout(10):
            # Nobody decides: the card expires, and the sweeps run the turn on.
            resumed = [f async for f in frames(response)]
    assert resumed[0].id == suspended[-1].id + 1
    assert resumed[-1].type == "run-completed"


class _OlderStore(MemoryStore):
    """A store written before `listen_events` (a user's own, say)."""

    listen_events = None  # type: ignore[assignment]


async def test_a_store_without_event_notices_still_streams_by_reading_the_log(
    caplog: pytest.LogCaptureFixture,
):
    engine = Engine(
        Agent("desk", tools=[refund]),
        store=_OlderStore(),
        runtime=Runtime(model=FunctionModel(answer)),
    )
    app = create_app(engine, authenticator=authenticator(), sweep_interval=0.05, poll_interval=0.1)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=StreamingTransport(app), base_url="http://test") as client,
    ):
        session = (await client.post("/sessions", headers=ANA)).json()["id"]
        async with client.stream(
            "POST",
            f"/sessions/{session}/turns",
            json={"text": "refund A1"},
            headers={**ANA, "Accept": "text/event-stream"},
        ) as response:
            suspended = [f async for f in frames(response)]
        url = f"/sessions/{session}/events?after={suspended[-1].id}"
        async with client.stream("GET", url, headers=ANA) as response, asyncio.timeout(10):
            resumed = [f async for f in frames(response)]  # the sweeps' run, read from the log
    assert resumed[-1].type == "run-completed"
    assert "has no listen_events" in caplog.text
