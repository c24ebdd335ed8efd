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
- connections that have not authenticated (their requests' `Api._caller` found no caller
  yet: every new connection, and idle sockets opened to hold the server) are capped twice:
  `max_client_connections` per client address (past it, the address's new connection is
  answered 503 and closed), and `max_connections - reserved_connections` in all (past it, a
  new connection closes the oldest of them that is waiting for a request and has sent no
  byte of it, so a pile of idle sockets cannot keep anyone out). The last
  `reserved_connections` are thus for connections that authenticated (kept-alive clients,
  streams);
- past `max_connections` open connections, a new one closes such an idle one as well, or is
  answered 503 with `Retry-After` and closed at once, before it can take a slot.

A stream whose client stopped reading is the app's to end (`EventStream`'s send timeout);
each request's scope carries the means to close its connection at once (`_sse.ABORT`), which
a close by uvicorn would not: it waits for the unsent bytes to go.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ._api import AUTHENTICATED
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
_TOO_MANY_FROM_YOU = _answer(
    _FULL,
    "too_many_connections",
    "Too many connections from your address have not sent a valid credential: send requests "
    "on the ones you have (keep-alive), or close some.",
)


def guarded_protocol(
    *,
    header_timeout: float,
    body_timeout: float,
    max_connections: int | None,
    max_client_connections: int | None = None,
    reserved_connections: int | None = None,
) -> type[asyncio.Protocol]:
    """The httptools protocol of uvicorn, with the timeouts and the caps above.

    Args:
        header_timeout: seconds a connection has to send a request's headers, from when it
            opens or its previous answer ends.
        body_timeout: seconds a request's body has to arrive, from the end of its headers.
        max_connections: open connections past which new ones are refused (None: no cap).
        max_client_connections: connections of one client address that have not
            authenticated, past which its new ones are refused (None: no cap).
        reserved_connections: of `max_connections`, how many only connections that
            authenticated may hold (None: a fifth; 0: none).
    """
    if header_timeout <= 0 or body_timeout <= 0:
        raise ValueError("header_timeout and body_timeout must be positive")
    if max_connections is not None and max_connections < 1:
        raise ValueError("max_connections must be at least 1, or None")
    if max_client_connections is not None and max_client_connections < 1:
        raise ValueError("max_client_connections must be at least 1, or None")
    if reserved_connections is not None and not (
        0 <= reserved_connections < (max_connections or 1)
    ):
        raise ValueError("reserved_connections must be 0 or more, and below max_connections")
    share: int | None = None  # connections that did not authenticate may hold this many
    if max_connections is not None:
        reserved = max_connections // 5 if reserved_connections is None else reserved_connections
        share = max_connections - reserved
    # Connections that have not authenticated, oldest first, and how many per address.
    strangers: dict[GuardedProtocol, None] = {}
    per_client: dict[str, int] = {}

    class GuardedProtocol(HttpToolsProtocol):
        """See `guarded_protocol`."""

        _timer: asyncio.TimerHandle | None = None
        _heading = False  # waiting for a request's headers
        _partial = False  # ... of which some bytes arrived
        _client: str | None = None  # its address, while it counts as a stranger

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            client = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
            if max_client_connections is not None and (
                per_client.get(client, 0) >= max_client_connections
            ):
                _log.warning(
                    "Refused a connection of %s: %d of its connections have not authenticated",
                    client,
                    per_client[client],
                )
                self._refuse(_TOO_MANY_FROM_YOU)
                return
            over = max_connections is not None and len(self.connections) > max_connections
            if (over or (share is not None and len(strangers) >= share)) and not _evict_idle():
                _log.warning("Refused a connection: %d are open", len(self.connections) - 1)
                self._refuse(_TOO_MANY)
                return
            self._client = client
            strangers[self] = None
            per_client[client] = per_client.get(client, 0) + 1
            self._heading = True
            self._arm(header_timeout, self._headers_late)

        def _refuse(self, answer: bytes) -> None:
            self.transport.write(answer)
            self.transport.close()

        def _trust(self) -> None:
            """The app found a valid credential on this connection: it is a stranger no more."""
            if self._client is None:
                return
            strangers.pop(self, None)
            count = per_client.pop(self._client, 0) - 1
            if count > 0:
                per_client[self._client] = count
            self._client = None

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._trust()  # (uncounted)
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
            if self._client is not None:
                extensions[AUTHENTICATED] = self._trust
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

    def _evict_idle() -> bool:
        """Close the oldest stranger that waits for a request and sent no byte of it."""
        for stranger in strangers:
            if stranger._heading and not stranger._partial:
                _log.warning(
                    "Closed an idle connection of %s that never authenticated, for a new one",
                    stranger._client,
                )
                stranger._trust()  # uncounted at once: its slot is the new connection's
                stranger.transport.close()
                return True
        return False

    return GuardedProtocol
