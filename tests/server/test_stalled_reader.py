"""A client that stops reading is dropped at `send_timeout`: its task ends, its socket closes."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import pytest

from handrail import Agent, Engine, MemoryStore, Runtime
from handrail.server import create_app, server_config
from handrail.server._sse import ABORT
from handrail.testing import FunctionModel

from .conftest import ANA, authenticator, http_receive, http_scope
from .test_send_timeout import _Paced, _session
from .test_slow_reader import RawStream, answer
from .test_uvicorn import serving as uvicorn_serving


async def test_a_stalled_stream_ends_its_task_and_closes_its_connection_without_a_last_write(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = Engine(Agent("a"), store=MemoryStore(), runtime=Runtime(model=_Paced(0.01)))
    app = create_app(engine, authenticator=authenticator(), send_timeout=0.3, static_dir=None)
    async with app.router.lifespan_context(app):
        session_id = await _session(app)
        attempted: list[dict[str, Any]] = []
        aborted: list[bool] = []

        async def send(message: dict[str, Any]) -> None:
            attempted.append(message)
            if message["type"] == "http.response.body" and len(attempted) > 2:
                await asyncio.Event().wait()  # the client takes no write after the first

        headers = [(b"authorization", ANA["Authorization"].encode()), (b"host", b"test")]
        headers += [(b"accept", b"text/event-stream"), (b"content-type", b"application/json")]
        scope = http_scope("POST", f"/sessions/{session_id}/turns", headers)
        scope["extensions"] = {ABORT: lambda: aborted.append(True)}
        receive = http_receive(b'{"text": "hello"}', asyncio.Event())  # it never leaves
        async with asyncio.timeout(10):  # a guard: the task ends (it used to wait forever)
            await app(scope, receive, send)
        assert aborted == [True]  # the connection is closed ...
        bodies = [m for m in attempted if m["type"] == "http.response.body"]
        assert all(m.get("more_body") for m in bodies)  # ... with no last write attempted
        assert "Dropped an event stream whose client took no write for 0.3 s" in caplog.text
        await app.state.runs.join(session_id)  # the turn ran to its end regardless
        logged = await engine.store.events(session_id, after=0, limit=1000)
        assert logged[-1][1]["type"] == "run-completed"


def serving(app: Any) -> contextlib.AbstractAsyncContextManager[str]:
    """`app` under uvicorn as `serve` configures it (its connections' protocol); its URL."""
    config = server_config(app, port=0, log_level="warning", lifespan="on")
    return uvicorn_serving(app, config)


async def test_a_reader_stalled_on_a_real_socket_is_cut_off_and_reconnects_for_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = Engine(
        Agent("writer"), store=MemoryStore(), runtime=Runtime(model=FunctionModel(answer))
    )
    app = create_app(engine, authenticator=authenticator(), send_timeout=0.3)
    async with serving(app) as url, httpx.AsyncClient(base_url=url, headers=ANA) as client:
        session = (await client.post("/sessions")).json()["id"]
        turn = await client.post(f"/sessions/{session}/turns", json={"text": "a long one, please"})
        stalled = await RawStream.open(url, turn.json()["events"])  # then it stops reading
        try:
            await app.state.runs.join(session)
            async with asyncio.timeout(20):  # a guard: the stream gives up on its reader
                while "Dropped an event stream" not in caplog.text:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            received = bytearray()
            async with asyncio.timeout(20):  # a guard: the connection ends
                with contextlib.suppress(ConnectionError):
                    while chunk := await stalled.reader.read(1 << 16):
                        received += chunk  # what was on its way, then the end
        finally:
            stalled.writer.close()
        # Cut off: the chunked body never ends (it used to, once the reader read again).
        assert not received.endswith(b"0\r\n\r\n")
        ids = [int(line[4:]) for line in received.split(b"\n") if line.startswith(b"id: ")]
        logged = await engine.store.events(session, after=0, limit=10_000)
        assert len(ids) < len(logged)
        # The client reconnects after the last event it had, and gets the rest.
        rest = await client.get(
            f"/sessions/{session}/events", headers={"Last-Event-ID": str(max(ids, default=0))}
        )
        assert rest.status_code == 200
        assert b'"type":"run-completed"' in rest.content
