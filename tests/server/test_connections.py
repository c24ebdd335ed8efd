"""Connections that would hold the server are closed: silent, trickling, slow bodies, too many."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn

from handrail.demo.support_desk import build_scenario
from handrail.server import create_app, server_config

from .conftest import ANA, authenticator, frames

REQUEST = b"GET /sessions HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer key-ana\r\n\r\n"


@contextlib.asynccontextmanager
async def serving(app: Any = None, **options: Any) -> AsyncIterator[int]:
    """`app` (the support desk by default) under uvicorn as `serve` configures it, on a free
    port; the port."""
    if app is None:
        app = create_app(build_scenario().engine, authenticator=authenticator(), poll_interval=0.05)
    options = {"header_timeout": 0.3, "body_timeout": 0.3, "idle_timeout": 0.3, **options}
    config = server_config(app, port=0, log_level="warning", lifespan="on", **options)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:  # noqa: ASYNC110 - uvicorn offers no event to wait on
            await asyncio.sleep(0.01)
        (port,) = {s.getsockname()[1] for srv in server.servers for s in srv.sockets}
        yield port
    finally:
        server.should_exit = True
        await task


async def closed(reader: asyncio.StreamReader, within: float = 5.0) -> bytes:
    """Everything the server sends until it closes the connection (fails if it does not)."""
    async with asyncio.timeout(within):
        return await reader.read()


async def test_a_silent_connection_is_closed_without_an_answer() -> None:
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await closed(reader) == b""
        writer.close()


async def test_headers_trickled_past_the_timeout_get_408_and_the_connection_closes() -> None:
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)

        async def trickle() -> None:
            for byte in REQUEST[:-2]:  # never the blank line that ends the headers
                writer.write(bytes([byte]))
                await asyncio.sleep(0.02)

        trickling = asyncio.create_task(trickle())
        answer = await closed(reader)
        trickling.cancel()
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert body["error"]["type"] == "request_timeout"
        writer.close()


async def test_a_body_sent_a_byte_at_a_time_is_cut_off() -> None:
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps({"text": "hello"}).encode()
        writer.write(
            b"POST /sessions/s-1/turns HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer key-ana"
            b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        )

        async def drip() -> None:
            for byte in body:
                writer.write(bytes([byte]))
                await asyncio.sleep(0.1)

        dripping = asyncio.create_task(drip())
        assert await closed(reader) == b""  # cut off, before the body could be read whole
        dripping.cancel()
        writer.close()


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One answer on a kept-alive connection: its status line and its body."""
    status = await reader.readline()
    length = 0
    while (line := await reader.readline()) != b"\r\n":
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def test_past_the_connection_cap_a_new_connection_gets_503_and_the_rest_go_on() -> None:
    async with serving(max_connections=2, header_timeout=30.0, idle_timeout=30.0) as port:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        for reader, writer in held:  # both authenticate: no idle stranger to close for a third
            writer.write(REQUEST)
            assert (await read_answer(reader))[0].startswith(b"HTTP/1.1 200")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answer = await closed(reader)
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        assert b"retry-after: 1\r\n" in answer
        writer.close()
        # The connections inside the cap are served.
        reader, writer = held[0]
        writer.write(REQUEST)
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        for _, w in held:
            w.close()
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # a slot is free
        writer.write(REQUEST)
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        writer.close()


async def test_a_kept_alive_connection_serves_request_after_request_then_idles_out() -> None:
    async with serving(header_timeout=0.5, idle_timeout=0.5) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(3):  # each request's headers get their own time: none is cut off
            writer.write(REQUEST)
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            length = 0
            while (line := await reader.readline()) != b"\r\n":
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            assert "sessions" in json.loads(await reader.readexactly(length))
            await asyncio.sleep(0.35)  # idle, within the idle timeout
        assert await closed(reader) == b""  # then idle past it: closed
        writer.close()


@pytest.mark.parametrize("seconds", [1.0])
async def test_a_stream_lasts_past_every_timeout(seconds: float) -> None:
    async with (
        serving() as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=ANA) as client,
    ):
        session = (await client.post("/sessions")).json()["id"]
        started = asyncio.get_running_loop().time()
        async with client.stream("GET", f"/sessions/{session}/events?follow=true") as response:
            assert response.status_code == 200
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    async for _ in frames(response):
                        pass
            # Still open after three times every timeout: only the client ends it.
            assert asyncio.get_running_loop().time() - started >= seconds
            assert not response.is_closed


async def idle_from(address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection from `address` (127.0.0.x: each is loopback, a client of its own)."""
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0))


async def test_one_address_holding_idle_connections_is_capped_and_another_is_served() -> None:
    options = {"max_connections": 100, "max_client_connections": 5}
    async with serving(**options, header_timeout=30.0, idle_timeout=30.0) as port:
        hog = [await idle_from("127.0.0.2", port) for _ in range(5)]
        reader, writer = await idle_from("127.0.0.2", port)  # its sixth
        answer = await closed(reader)
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        assert b"retry-after: 1\r\n" in answer
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert body["error"]["type"] == "too_many_connections"
        assert "from your address" in body["error"]["message"]
        writer.close()
        # Another client is served, on new connections as on kept-alive ones.
        for _ in range(10):
            reader, writer = await idle_from("127.0.0.3", port)
            writer.write(REQUEST)
            assert (await read_answer(reader))[0].startswith(b"HTTP/1.1 200")
            writer.close()
        # A connection of the hog that authenticates counts no more: it may open another.
        reader, writer = hog[0]
        writer.write(REQUEST)
        assert (await read_answer(reader))[0].startswith(b"HTTP/1.1 200")
        extra = await idle_from("127.0.0.2", port)
        extra[1].write(REQUEST)
        assert (await read_answer(extra[0]))[0].startswith(b"HTTP/1.1 200")
        for _, w in [*hog, extra]:
            w.close()


async def test_idle_connections_from_many_addresses_leave_room_for_callers() -> None:
    # 10 connections, 2 of them kept for connections that authenticated; 3 per address.
    options = {"max_connections": 10, "max_client_connections": 3}
    async with serving(**options, header_timeout=30.0, idle_timeout=30.0) as port:
        tenant = await idle_from("127.0.0.9", port)
        tenant[1].write(REQUEST)
        assert (await read_answer(tenant[0]))[0].startswith(b"HTTP/1.1 200")
        # Idle sockets from three addresses, more than the eight slots strangers may use.
        hogs = [await idle_from(f"127.0.0.{2 + i // 3}", port) for i in range(9)]
        assert await closed(hogs[0][0]) == b""  # the oldest idle one made room for the ninth
        # The caller's kept-alive connection goes on, and new connections get in (an idle
        # stranger's slot each), though the server holds 10 connections.
        tenant[1].write(REQUEST)
        assert (await read_answer(tenant[0]))[0].startswith(b"HTTP/1.1 200")
        for address in ("127.0.0.9", "127.0.0.10", "127.0.0.10"):
            reader, writer = await idle_from(address, port)
            writer.write(REQUEST)
            assert (await read_answer(reader))[0].startswith(b"HTTP/1.1 200")
            writer.close()
        assert await closed(hogs[1][0]) == b""
        for _, w in [tenant, *hogs]:
            w.close()
