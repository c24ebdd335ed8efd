"""Per-tenant limits: past them, 429 with Retry-After, and the other tenants go on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from handrail.demo.support_desk import CUSTOMER_MESSAGE, build_scenario
from handrail.server import Limits, create_app

from .conftest import ANA, BOB, StreamingTransport, authenticator


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.step = 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now


async def client_for(
    limits: Limits, latency: float = 0.0, **options: Any
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        build_scenario(latency=latency).engine,
        authenticator=authenticator(),
        limits=limits,
        **options,
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=StreamingTransport(app), base_url="http://test") as client,
    ):
        yield client


async def test_a_caller_past_its_rate_gets_429_with_retry_after_and_others_go_on():
    clock = Clock()
    async for client in client_for(Limits(rate=1.0, burst=2, clock=clock)):
        answers = [(await client.get("/sessions", headers=ANA)).status_code for _ in range(3)]
        assert answers == [200, 200, 429]
        refused = await client.get("/sessions", headers=ANA)
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "too_many_requests"
        assert (await client.get("/sessions", headers=BOB)).status_code == 200  # another key
        clock.now += 1.0
        assert (await client.get("/sessions", headers=ANA)).status_code == 200


async def test_an_organisation_past_its_open_streams_gets_429():
    async for client in client_for(Limits(streams=1)):
        session = (await client.post("/sessions", headers=ANA)).json()["id"]
        path = f"/sessions/{session}/events?follow=true"
        async with client.stream("GET", path, headers=ANA) as first:
            assert first.status_code == 200
            await asyncio.sleep(0.05)  # it runs
            second = await client.get(path, headers=ANA)
            assert second.status_code == 429
            other = (await client.post("/sessions", headers=BOB)).json()["id"]
            async with client.stream(
                "GET", f"/sessions/{other}/events?follow=true", headers=BOB
            ) as theirs:
                assert theirs.status_code == 200  # another organisation's
        await asyncio.sleep(0.05)  # the first one ended: its place is free
        async with client.stream("GET", path, headers=ANA) as again:
            assert again.status_code == 200


@pytest.mark.parametrize("latency", [0.2])
async def test_an_organisation_past_its_running_turns_gets_429(latency: float):
    async for client in client_for(Limits(turns=1), latency=latency):
        one, two = [(await client.post("/sessions", headers=ANA)).json()["id"] for _ in range(2)]
        body = {"text": CUSTOMER_MESSAGE}
        assert (
            await client.post(f"/sessions/{one}/turns", json=body, headers=ANA)
        ).status_code == 202
        refused = await client.post(f"/sessions/{two}/turns", json=body, headers=ANA)
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "too_many_requests"


async def idle(client: httpx.AsyncClient, session: str) -> None:
    """Wait until no turn of the session runs."""
    for _ in range(500):
        if not (await client.get(f"/sessions/{session}", headers=ANA)).json()["running"]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"session {session} still runs")


async def test_an_organisation_past_its_stream_bandwidth_waits_and_opens_no_new_stream():
    clock = Clock()  # stands still until the test lets time pass: the debt stays until then
    limits = Limits(stream_bytes=1_000, stream_burst=1_000, clock=clock)
    async for client in client_for(limits, ping_interval=0.02):
        session = (await client.post("/sessions", headers=ANA)).json()["id"]
        turn = await client.post(
            f"/sessions/{session}/turns", json={"text": CUSTOMER_MESSAGE}, headers=ANA
        )
        assert turn.status_code == 202
        await idle(client, session)  # until it waits for the refund's approval
        other = (await client.post("/sessions", headers=BOB)).json()["id"]
        path = f"/sessions/{session}/events?follow=true"
        async with client.stream("GET", path, headers=ANA) as follow:
            assert follow.status_code == 200
            lines = follow.aiter_lines()
            async for line in lines:  # the first write: the turn up to its card
                if '"type":"run-suspended"' in line:
                    break
            # That first write (the turn so far, ~6 kB) took the organisation past 1,000 bytes:
            # no new stream of it opens, and its open stream waits before its next write.
            refused = await client.get(path, headers=ANA)
            assert refused.status_code == 429
            assert int(refused.headers["retry-after"]) >= 2
            assert "bytes a second" in refused.json()["error"]["message"]
            async with client.stream("GET", f"/sessions/{other}/events", headers=BOB) as theirs:
                assert theirs.status_code == 200  # another organisation's bandwidth is its own
            card = (await client.get(f"/sessions/{session}", headers=ANA)).json()["pending"][0]
            decision = {"tool_call_id": card["tool_call_id"], "decision": {"decision": "approve"}}
            resolved = await client.post(f"/sessions/{session}/resolve", json=decision, headers=ANA)
            assert resolved.json()["resumed"] is True
            await idle(client, session)  # the resumed turn runs to its end meanwhile
            seen: list[str] = []
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):
                    async for line in lines:
                        seen.append(line)
            assert seen and all(line in ("", ": ping") for line in seen)  # only keep-alives
            clock.step = 3_600.0  # from now on an hour passes at each look: the debt is paid
            async for line in lines:
                if line.startswith("data: ") and '"type":"run-completed"' in line:
                    break  # the resumed turn's events came, to its end


def _agui_input(thread: str) -> dict[str, Any]:
    message = {"id": "m-1", "role": "user", "content": CUSTOMER_MESSAGE}
    return {
        "threadId": thread,
        "runId": "r-1",
        "state": None,
        "messages": [message],
        "tools": [],
        "context": [],
        "forwardedProps": None,
    }


def _chat_input(chat: str) -> dict[str, Any]:
    message = {"id": "m-1", "role": "user", "parts": [{"type": "text", "text": CUSTOMER_MESSAGE}]}
    return {"id": chat, "messages": [message]}


@pytest.mark.parametrize(
    ("path", "body"), [("/agui", _agui_input), ("/chat", _chat_input)], ids=["agui", "chat"]
)
@pytest.mark.parametrize("latency", [0.2])
async def test_a_chat_protocol_past_the_running_turns_is_429_before_its_stream(
    path: str, body: Any, latency: float
):
    async for client in client_for(Limits(turns=1), latency=latency):
        session = (await client.post("/sessions", headers=ANA)).json()["id"]
        turn = {"text": CUSTOMER_MESSAGE}
        running = await client.post(f"/sessions/{session}/turns", json=turn, headers=ANA)
        assert running.status_code == 202
        refused = await client.post(path, json=body("t-1"), headers=ANA)
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "too_many_requests"
        async with client.stream("POST", path, json=body("t-2"), headers=BOB) as theirs:
            assert theirs.status_code == 200  # another organisation's turn starts
            assert b"failed" not in await theirs.aread()
