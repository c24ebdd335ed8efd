"""The app under uvicorn on a real socket: the events stream as they happen."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import uvicorn

from handrail.demo.support_desk import CUSTOMER_MESSAGE, build_scenario
from handrail.server import create_app

from .conftest import ANA, authenticator, frames


@contextlib.asynccontextmanager
async def serving(app: object, config: uvicorn.Config | None = None) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 at a free port (or as `config` says); its base URL."""
    if config is None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:  # noqa: ASYNC110 - uvicorn offers no event to wait on
            await asyncio.sleep(0.01)
        (port,) = {s.getsockname()[1] for srv in server.servers for s in srv.sockets}
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def test_a_turn_streams_over_a_real_connection() -> None:
    scenario = build_scenario(latency=0.05)
    app = create_app(scenario.engine, authenticator=authenticator())
    async with serving(app) as url, httpx.AsyncClient(base_url=url, headers=ANA) as client:
        session_id = (await client.post("/sessions")).json()["id"]
        after = (
            await client.post(f"/sessions/{session_id}/turns", json={"text": CUSTOMER_MESSAGE})
        ).json()["after"]
        received: list[tuple[str, bool]] = []
        async with client.stream("GET", f"/sessions/{session_id}/events?after={after}") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            async for frame in frames(response):
                # Whether the turn was still running when the event arrived: it streams live.
                received.append((frame.type, app.state.runs.running(session_id)))
        assert received[0] == ("run-started", True)
        assert received[-1][0] == "run-suspended"
        assert len(received) == len(await scenario.engine.store.events(session_id))


async def test_a_turn_posted_with_accept_event_stream_streams_in_the_answer() -> None:
    scenario = build_scenario()
    app = create_app(scenario.engine, authenticator=authenticator())
    async with serving(app) as url, httpx.AsyncClient(base_url=url, headers=ANA) as client:
        session_id = (await client.post("/sessions")).json()["id"]
        async with client.stream(
            "POST",
            f"/sessions/{session_id}/turns",
            json={"text": CUSTOMER_MESSAGE},
            headers={"Accept": "text/event-stream"},
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            received = [frame async for frame in frames(response)]
        assert received[0].type == "run-started" and received[-1].type == "run-suspended"
        assert [f.id for f in received] == list(range(1, len(received) + 1))
        logged = await scenario.engine.store.events(session_id)
        assert [e for _, e in logged] == [f.data for f in received]


async def test_a_quiet_stream_sends_keep_alives_and_ends_when_the_client_goes() -> None:
    scenario = build_scenario()
    app = create_app(
        scenario.engine, authenticator=authenticator(), poll_interval=0.02, ping_interval=0.01
    )
    async with serving(app) as url, httpx.AsyncClient(base_url=url, headers=ANA) as client:
        session_id = (await client.post("/sessions")).json()["id"]
        async with client.stream("GET", f"/sessions/{session_id}/events?follow=true") as response:
            lines = response.aiter_lines()
            assert await anext(lines) == ": ping"
        runs = app.state.runs
        while runs._listeners.get(session_id):  # noqa: ASYNC110 - the server notices the close
            await asyncio.sleep(0.01)
