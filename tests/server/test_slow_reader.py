"""A reader that stops reading holds up nobody: not the other streams, not its own turn."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx

from handrail import Agent, Engine, MemoryStore, Runtime
from handrail.models import ModelRequest
from handrail.server import create_app
from handrail.testing import FunctionModel, Step

from .conftest import ANA, authenticator, frames
from .test_uvicorn import serving

WORD = "x" * 16_000  # one text delta a word: ~16 KB an event
WORDS = 500  # ~8 MB in all: far more than the socket buffers hold


def answer(request: ModelRequest) -> Step:
    if request.messages[-1].text == "a long one, please":
        return " ".join([WORD] * WORDS)
    return "A short reply."


class RawStream:
    """An SSE response on a bare socket whose receive buffer is small, read only when told."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str, path: str) -> RawStream:
        host, port = url.removeprefix("http://").split(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
        auth = ANA["Authorization"]
        writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\nAuthorization: {auth}\r\n\r\n".encode())
        status = await reader.readline()
        assert status.split()[1] == b"200", status
        while await reader.readline() != b"\r\n":
            pass
        return cls(reader, writer)

    async def events(self) -> list[tuple[int, dict[str, Any]]]:
        """Read the rest of the (chunked) body: each event's id and data."""
        body = bytearray()
        while size := int((await self.reader.readline()).strip(), 16):
            body += await self.reader.readexactly(size)
            await self.reader.readexactly(2)
        self.writer.close()
        events = []
        for block in body.decode().replace("\r\n", "\n").split("\n\n"):
            fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
            if "data" in fields:
                events.append((int(fields["id"]), json.loads(fields["data"])))
        return events


async def test_a_stalled_reader_slows_neither_the_other_streams_nor_its_own_turn() -> None:
    engine = Engine(
        Agent("writer"), store=MemoryStore(), runtime=Runtime(model=FunctionModel(answer))
    )
    app = create_app(engine, authenticator=authenticator(), send_timeout=None)
    runs = app.state.runs
    async with serving(app) as url, httpx.AsyncClient(base_url=url, headers=ANA) as client:
        slow_id = (await client.post("/sessions")).json()["id"]
        turn = await client.post(f"/sessions/{slow_id}/turns", json={"text": "a long one, please"})
        slow = await RawStream.open(url, turn.json()["events"])  # and then it stops reading
        try:
            # The turn runs to its end although nobody reads its stream ...
            await runs.join(slow_id)
            assert (await engine.store.load(slow_id)).status == "completed"  # type: ignore[union-attr]
            logged = await engine.store.events(slow_id, after=0, limit=10_000)
            assert logged[-1][1]["type"] == "run-completed"

            # ... and other clients' turns start, stream and finish meanwhile.
            async def other() -> list[str]:
                session_id = (await client.post("/sessions")).json()["id"]
                accepted = await client.post(f"/sessions/{session_id}/turns", json={"text": "hi"})
                async with client.stream("GET", accepted.json()["events"]) as response:
                    return [frame.type async for frame in frames(response)]

            for types in await asyncio.gather(*(other() for _ in range(3))):
                assert types[0] == "run-started" and types[-1] == "run-completed"

            # Read again: every event arrives, once, in order.
            received = await slow.events()
            assert [seq for seq, _ in received] == [seq for seq, _ in logged]
            assert [event for _, event in received] == [event for _, event in logged]
            assert sum(e["type"] == "text-delta" for _, e in received) == WORDS
        finally:
            slow.writer.close()  # a failed test leaves no stuck stream behind
