"""`send_timeout`: a client that stops taking writes is dropped; one that reads is never."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from handrail import Agent, Engine, MemoryStore, Runtime
from handrail.models import ModelRequest
from handrail.server import create_app
from handrail.testing import FunctionModel, Step

from .conftest import ANA, authenticator, http_receive, http_scope

WORDS = 40


class _Paced:
    """A model that streams a chunk every `pace` seconds."""

    def __init__(self, pace: float) -> None:
        self.model = FunctionModel(self.answer)
        self.name, self.pace = "paced", pace

    @staticmethod
    def answer(request: ModelRequest) -> Step:
        return " ".join(f"w{i}" for i in range(WORDS))

    async def stream(self, request: ModelRequest) -> Any:
        async for chunk in self.model.stream(request):
            await asyncio.sleep(self.pace)
            yield chunk


async def _call(app: Any, method: str, path: str, body: bytes, send: Any) -> None:
    headers = [(b"authorization", ANA["Authorization"].encode()), (b"host", b"test")]
    headers += [(b"accept", b"text/event-stream"), (b"content-type", b"application/json")]
    # The client never leaves by itself.
    await app(http_scope(method, path, headers), http_receive(body, asyncio.Event()), send)


async def _session(app: Any) -> str:
    answer: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            answer.append(message.get("body", b""))

    await _call(app, "POST", "/sessions", b"", send)
    return str(json.loads(b"".join(answer))["id"])


async def test_a_client_that_stops_taking_writes_is_dropped_and_the_turn_goes_on() -> None:
    engine = Engine(Agent("a"), store=MemoryStore(), runtime=Runtime(model=_Paced(0.01)))
    app = create_app(engine, authenticator=authenticator(), send_timeout=0.3, static_dir=None)
    async with app.router.lifespan_context(app):
        session_id = await _session(app)
        taken: list[bytes] = []
        stuck = asyncio.Event()

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                if taken:  # the second write never goes through
                    stuck.set()
                    await asyncio.Event().wait()
                taken.append(message["body"])

        body = b'{"text": "hello"}'
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.wait_for(_call(app, "POST", f"/sessions/{session_id}/turns", body, send), 5)
        assert stuck.is_set() and 0.3 <= loop.time() - began < 3
        assert b"run-started" in taken[0]
        await app.state.runs.join(session_id)  # the turn ran to its end regardless
        logged = await engine.store.events(session_id, after=0, limit=1000)
        assert logged[-1][1]["type"] == "run-completed"


async def test_a_client_that_reads_is_never_dropped_however_long_the_stream() -> None:
    # Each write is taken at once, but the stream lasts many times send_timeout.
    engine = Engine(Agent("a"), store=MemoryStore(), runtime=Runtime(model=_Paced(0.02)))
    app = create_app(engine, authenticator=authenticator(), send_timeout=0.1, static_dir=None)
    async with app.router.lifespan_context(app):
        session_id = await _session(app)
        received = bytearray()
        ended = False

        async def send(message: dict[str, Any]) -> None:
            nonlocal ended
            if message["type"] == "http.response.body":
                received.extend(message.get("body", b""))
                await asyncio.sleep(0.04)  # a reader that takes a while (not send_timeout) a write
                ended = not message.get("more_body", False)

        body = b'{"text": "hello"}'
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.wait_for(_call(app, "POST", f"/sessions/{session_id}/turns", body, send), 10)
        assert loop.time() - began > 0.5  # well past send_timeout
        assert ended and b'"type":"run-completed"' in received
        assert received.count(b'"type":"text-delta"') == WORDS
