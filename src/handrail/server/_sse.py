"""`EventStream`: a `text/event-stream` response that writes batches of events at once.

A stream sends every event that is waiting in one write, a comment line as a keep-alive when
it has been quiet for `ping` seconds, and stops when the client disconnects or does not read
for `send_timeout` seconds (its turn goes on: the events stay in the session's log, and a
client that reconnects with `Last-Event-ID` gets them). It costs one task besides the
request's: sse-starlette's response spent about a third of the server's CPU per event (a
cancel scope and a task group per send, a write per event), which kept 200 concurrent streams
far from the time-to-first-event target.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = ["EventStream", "error_frame", "frame"]

_PING = b": ping\n\n"


def frame(seq: int, data: bytes) -> bytes:
    r"""One Server-Sent Event: its id (the event's number in the session's log) and its JSON.

    Lines end with `\n` alone: the SSE grammar allows `\r\n` too, but some clients
    (`@ag-ui/client`) split events on `\n\n` only.
    """
    return b"id: %d\ndata: %b\n\n" % (seq, data)


def error_frame(data: bytes) -> bytes:
    """An `error` event, with no id.

    It is not one of the session's events: a client that reconnects with `Last-Event-ID`
    picks up where the session's events stopped.
    """
    return b"event: error\ndata: %b\n\n" % data


class EventStream(Response):
    """Stream `chunks` (bytes of whole frames; `b""` means "nothing new yet") as SSE.

    Args:
        chunks: the frames, batch by batch; the stream ends when it does. It is closed when
            the client goes away.
        ping: seconds of quiet after which a keep-alive comment is sent (checked whenever
            `chunks` yields, so `chunks` should yield `b""` now and then while idle).
        send_timeout: seconds a write may wait for a client that does not read; None: forever.
        headers: more response headers.
    """

    def __init__(
        self,
        chunks: AsyncGenerator[bytes, None],
        *,
        ping: float,
        send_timeout: float | None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        # A `Response` for the routes' sake (set up without `Response.__init__`, which would
        # add a `content-length: 0`, as Starlette's `StreamingResponse` is); `__call__` sends.
        self.status_code = 200
        self.chunks = chunks
        self.ping = ping
        self.send_timeout = send_timeout
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-store"),
            (b"x-accel-buffering", b"no"),  # nginx and the like: do not buffer the stream
            *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the response; return when `chunks` ends or the client goes away."""
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        # What is there already goes out from this task, at once: a task started now would
        # only run once every turn in progress has had its next slice.
        try:
            first = await anext(self.chunks, b"")
            if first and not await self._send(send, first):
                await self.chunks.aclose()
                return
        except BaseException:
            await self.chunks.aclose()
            raise
        pump = asyncio.create_task(self._pump(send))
        watch = asyncio.create_task(_disconnected(receive))
        try:
            await asyncio.wait((pump, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, watch):
                task.cancel()
            await asyncio.wait((pump, watch))
        if watch.done() and not watch.cancelled():
            return  # the client left: nothing more to send
        error = None if pump.cancelled() else pump.exception()
        if error is not None:
            raise error
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, send: Send) -> None:
        async with contextlib.aclosing(self.chunks):
            quiet_since = time.monotonic()
            async for chunk in self.chunks:
                now = time.monotonic()
                if not chunk:
                    if now - quiet_since < self.ping:
                        continue
                    chunk = _PING
                quiet_since = now
                if not await self._send(send, chunk):
                    return  # a client that does not read: drop it; it can reconnect

    async def _send(self, send: Send, chunk: bytes) -> bool:
        """Send `chunk`; False if the client did not take it within `send_timeout`."""
        message = {"type": "http.response.body", "body": chunk, "more_body": True}
        try:
            async with asyncio.timeout(self.send_timeout):
                await send(message)
        except TimeoutError:
            return False
        return True


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
