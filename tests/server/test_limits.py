"""Per-tenant limits: past them, 429 with Retry-After, and the other tenants go on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from handrail.demo.support_desk import CUSTOMER_MESSAGE, build_scenario
from handrail.server import Limits, create_app

from .conftest import ANA, BOB, StreamingTransport, authenticator


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def client_for(limits: Limits, latency: float = 0.0) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        build_scenario(latency=latency).engine, authenticator=authenticator(), limits=limits
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
