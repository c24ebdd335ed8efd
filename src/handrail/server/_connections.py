"""Connections that cannot hold the server: header, body and idle timeouts, and a cap.

uvicorn closes a keep-alive connection that stays idle between requests, and nothing else: a
socket that never sends a byte, headers trickled a byte at a time, or a body sent one byte
every few seconds each hold a connection (and a file descriptor) for as long as the client
likes, and a few hundred of them fill the server. `guarded_protocol` makes uvicorn's HTTP
protocol (httptools) close them:

- a connection that has not sent a request's whole headers `header_timeout` seconds after it
  opened (or after its previous answer) is closed; if it sent part of a request, it is
  answered 408 first;
- a request whose body has not fully arrived `body_timeout` seconds after its headers is cut
  off (the app sees the client disconnect);
- past `max_connections` open connections, a new one is answered 503 with `Retry-After` and
  closed at once, before it can take a slot.

A stream whose client stopped reading is the app's to end (`EventStream`'s send timeout);
each request's scope carries the means to close its connection at once (`_sse.ABORT`), which
a close by uvicorn would not: it waits for the unsent bytes to go.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ._sse import ABORT

__all__ = ["guarded_protocol"]

_log = logging.getLogger("handrail.server")

_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%b"
)
_FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%b"
)


def _answer(template: bytes, kind: str, message: str) -> bytes:
    body = b'{"error":{"type":"%b","message":"%b"}}' % (kind.encode(), message.encode())
    return template % (len(body), body)


_TIMED_OUT = _answer(_TIMEOUT, "request_timeout", "The request's headers took too long to arrive.")
_TOO_MANY = _answer(
    _FULL, "too_many_connections", "The server has too many open connections: retry shortly."
)


def guarded_protocol(
    *, header_timeout: float, body_timeout: float, max_connections: int | None
) -> type[asyncio.Protocol]:
    """The httptools protocol of uvicorn, with the timeouts and the cap above.

    Args:
        header_timeout: seconds a connection has to send a request's headers, from when it
            opens or its previous answer ends.
        body_timeout: seconds a request's body has to arrive, from the end of its headers.
        max_connections: open connections past which new ones are refused (None: no cap).
    """
    if header_timeout <= 0 or body_timeout <= 0:
        raise ValueError("header_timeout and body_timeout must be positive")
    if max_connections is not None and max_connections < 1:
        raise ValueError("max_connections must be at least 1, or None")

    class GuardedProtocol(HttpToolsProtocol):
        """See `guarded_protocol`."""

        _timer: asyncio.TimerHandle | None = None
        _heading = False  # waiting for a request's headers
        _partial = False  # ... of which some bytes arrived

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if max_connections is not None and len(self.connections) > max_connections:
                _log.warning("Refused a connection: %d are open", len(self.connections) - 1)
                transport.write(_TOO_MANY)
                transport.close()
                return
            self._heading = True
            self._arm(header_timeout, self._headers_late)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._timer is None and self.cycle is not None and self.cycle.response_complete:
                # The next request on a kept-alive connection: its headers are timed too.
                self._heading = True
                self._arm(header_timeout, self._headers_late)
            self._partial = self._heading
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._heading = self._partial = False
            self._arm(body_timeout, self._body_late)
            # Before the request's task first runs (uvicorn starts it below, to run later).
            extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
            extensions[ABORT] = self.transport.abort
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def _arm(self, delay: float, callback: Any) -> None:
            self._disarm()
            self._timer = self.loop.call_later(delay, callback)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _headers_late(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if self._partial:  # a request began: say why it ends
                self.transport.write(_TIMED_OUT)
            self.transport.close()

        def _body_late(self) -> None:
            self._timer = None
            if not self.transport.is_closing():
                _log.warning("Closed a connection whose request body took over %g s", body_timeout)
                self.transport.close()  # the app reads a disconnect

    return GuardedProtocol
