"""`serve`: run an app of `create_app` under uvicorn, tuned for it, and stop it in order."""

from __future__ import annotations

import gc
import logging
import math
import re
import socket
from typing import Any

import uvicorn
from starlette.applications import Starlette

__all__ = ["AccessLogScrubber", "serve", "tune_gc"]

_SECRET = re.compile(
    r"([?&](?:key|api_key|apikey|token|access_token|password|secret)=)[^&#\s]*", re.IGNORECASE
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class AccessLogScrubber(logging.Filter):
    r"""Keeps secrets and control characters out of uvicorn's access log.

    A key sent in a query string (`?key=...`: the API never reads one, but a mistyped page
    address sends it) is logged as `key=***`, and control characters in a path (a NUL, a
    newline that would forge a log line) are logged escaped (`\x00`).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record's path argument; never drops a record."""
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            path = _SECRET.sub(r"\1***", args[2])
            path = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", path)
            record.args = (*args[:2], path, *args[3:])
        return True


def tune_gc() -> None:
    """Make the garbage collector cheap for a long-running server (`serve` calls it).

    Freezes what exists now (the engine, the app, imported modules: they live as long as the
    process) out of the collector's sight, and collects the youngest objects every 5,000
    allocations instead of 700: fewer collections under load, each still short. (Not many
    more: the count is allocations minus deallocations, so while old objects are freed the
    young ones pile up past it; at 50,000, single collections paused the server for 25-45 ms
    under 200 concurrent turns, `bench/server.py`.)
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(5_000, 20, 100)


class _Server(uvicorn.Server):
    """uvicorn's server, which at shutdown first ends the app's turns, then its streams.

    uvicorn waits for every response to end before it tells the app to shut down, and a
    followed event stream never ends by itself: so the turns are stopped (interrupted, then
    saved) and the streams closed first, and clients reconnect with `Last-Event-ID`.
    """

    def __init__(self, config: uvicorn.Config, app: Starlette, grace: float) -> None:
        super().__init__(config)
        self.app, self.grace = app, grace

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # no new connections meanwhile
        await self.app.state.runs.aclose(grace=self.grace)
        await super().shutdown(sockets)


def serve(
    app: Starlette,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    shutdown_grace: float = 5.0,
    **uvicorn_options: Any,
) -> None:
    """Serve `app` (from `create_app`) with uvicorn until Ctrl-C or SIGTERM.

    It uses uvloop and httptools when they are installed (the `server` extra installs them),
    and tunes the garbage collector (`tune_gc`). At shutdown, running turns get
    `shutdown_grace` seconds to stop, and streams as long again to send what is left.

    Args:
        app: the app to serve.
        host: the interface to listen on.
        port: the port to listen on.
        shutdown_grace: seconds, as above.
        uvicorn_options: more of `uvicorn.Config`'s options (`log_level`, ...).
    """
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        timeout_graceful_shutdown=math.ceil(shutdown_grace),  # uvicorn takes whole seconds
        **uvicorn_options,
    )
    tune_gc()
    logging.getLogger("uvicorn.access").addFilter(AccessLogScrubber())
    _Server(config, app, shutdown_grace).run()
