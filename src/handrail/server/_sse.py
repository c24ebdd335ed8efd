"""`EventStream`: a `text/event-stream` response that writes batches of events at once.

A stream sends every event that is waiting in one write, a comment line as a keep-alive when
it has been quiet for `ping` seconds, and stops when the client disconnects or does not read
for `send_timeout` seconds (its turn goes on: the events stay in the session's log, and a
client that reconnects with `Last-Event-ID` gets them). A client dropped so gets no last
write, which would wait as long again: its connection is closed at once (`ABORT`). It costs
one task besides the request's: sse-starlette's response spent about a third of the server's
CPU per event (a cancel scope and a task group per send, a write per event), which kept 200
concurrent streams far from the time-to-first-event target.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = ["ABORT", "EventStream", "error_frame", "frame"]

_PING = b": ping\n\n"
_log = logging.getLogger("handrail.server")

ABORT = "handrail.abort"
"""The scope extension (`scope["extensions"][ABORT]`, a callable) that closes the connection
at once, unsent bytes and all: `serve`'s protocol gives it (`_connections`). A stream whose
client stopped reading calls it: the server's own close would wait for those bytes to go."""


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
        # The write under way (since when, in which task) and the timer watching it.
        self._since: float | None = None
        self._writer: asyncio.Task[Any] | None = None
        self._watch: asyncio.TimerHandle | None = None
        self._late = False  # the watch cancelled the write
        self._stalled = False  # ... and the stream gave up on its client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the response; return when `chunks` ends or the client goes away."""
        try:
            await self._respond(receive, send)
        finally:
            if self._watch is not None:
                self._watch.cancel()
        if self._stalled:
            # No last write (it would wait as long again): the connection is closed instead,
            # at once where the server lets the app (`ABORT`), else by the server as the
            # response ends unfinished.
            abort = scope.get("extensions", {}).get(ABORT)
            _log.warning(
                "Dropped an event stream whose client took no write for %g s%s",
                self.send_timeout,
                " (connection closed)" if abort is not None else "",
            )
            if abort is not None:
                abort()

    async def _respond(self, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        # What is there already goes out from this task, at once: a task started now would
        # only run once every turn in progress has had its next slice.
        try:
            first = await anext(self.chunks, b"")
            if first and not await self._send(send, first):
                self._stalled = True
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
        if self._stalled:
            return
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
                    self._stalled = True
                    return  # a client that does not read: drop it; it can reconnect

    async def _send(self, send: Send, chunk: bytes) -> bool:
        """Send `chunk`; False if the client did not take it within `send_timeout`.

        A write hardly ever waits (the transport takes it at once), so it gets no timer of its
        own (`asyncio.timeout` costs a timer and a cancelled one a write): one timer a stream
        looks at the write under way when it fires, and cancels it if it is late.
        """
        message = {"type": "http.response.body", "body": chunk, "more_body": True}
        if self.send_timeout is None:
            await send(message)
            return True
        loop = asyncio.get_running_loop()
        self._since, self._writer = loop.time(), asyncio.current_task()
        if self._watch is None:
            self._watch = loop.call_at(self._since + self.send_timeout, self._check)
        try:
            await send(message)
        except asyncio.CancelledError:
            if self._late and self._writer is not None and not self._writer.uncancel():
                return False  # cancelled by the watch alone
            raise
        finally:
            self._since = None
        return True

    def _check(self) -> None:
        """The watch: cancel a write that has waited `send_timeout`; else look again later."""
        self._watch = None
        if self._since is None or self._writer is None or self.send_timeout is None:
            return  # no write under way: the next one sets the watch again
        due = self._since + self.send_timeout
        loop = asyncio.get_running_loop()
        if loop.time() >= due:
            self._late = True
            self._writer.cancel()
        else:
            self._watch = loop.call_at(due, self._check)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
