"""`serve`: run an app of `create_app` under uvicorn, tuned for it, and stop it in order.

`serve_workers` runs it in several processes on one socket (`handrail serve --workers N`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing
import multiprocessing.process
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette

from .._logs import ControlEscaper, LogFormat, configure_logging
from .._logs import escape as _escape
from ..exceptions import HandrailError, UserError
from ._auth import reload_key_files
from ._connections import guarded_protocol
from ._gc import tune_gc

__all__ = [
    "AccessLogScrubber",
    "AppFactory",
    "ControlEscaper",
    "escape_logs",
    "serve",
    "serve_workers",
    "server_config",
    "tune_gc",
]

_SECRET = re.compile(
    r"([?&](?:key|api_key|apikey|token|access_token|password|secret)=)[^&#\s]*", re.IGNORECASE
)
_log = logging.getLogger("handrail.server")


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
            path = _escape(path)
            record.args = (*args[:2], path, *args[3:])
        return True


def escape_logs(log_format: LogFormat = "text") -> None:
    """Set up the server's logs (`serve` calls it): `handrail._logs.configure_logging`.

    `text`: control characters escaped in every line (`ControlEscaper` on uvicorn's loggers'
    handlers and the root logger's), and a handler for `handrail`'s own lines when nothing
    would show them. `json`: one JSON object a line, for every logger.
    """
    configure_logging(log_format)


class _Server(uvicorn.Server):
    """uvicorn's server, which at shutdown first ends the app's turns, then its streams.

    uvicorn waits for every response to end before it tells the app to shut down, and a
    followed event stream never ends by itself: so the turns are stopped (interrupted, then
    saved) and the streams closed first, and clients reconnect with `Last-Event-ID`.
    """

    def __init__(self, config: uvicorn.Config, app: Starlette, grace: float) -> None:
        super().__init__(config)
        self.app, self.grace = app, grace

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        # SIGHUP reads the API keys files again (its default action would end the process).
        hangup = getattr(signal, "SIGHUP", None)
        loop = asyncio.get_running_loop()
        if hangup is not None:
            loop.add_signal_handler(hangup, _reload_keys)
        try:
            await super().serve(sockets)
        finally:
            if hangup is not None:
                loop.remove_signal_handler(hangup)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn would log a failed start-up's traceback as the message of one line (its
        # newlines escaped): an application that could not be opened is told here instead.
        lifespan = getattr(self, "lifespan", None)
        send = getattr(lifespan, "send", None)
        if lifespan is not None and send is not None:

            async def told(message: Any) -> None:
                error = getattr(self.app.state, "open_error", None)
                if message.get("type") == "lifespan.startup.failed" and error is not None:
                    _told(error)
                    message = {**message, "message": ""}
                await send(message)

            lifespan.send = told
        await super().startup(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # no new connections meanwhile
        runs = getattr(self.app.state, "runs", None)  # (none yet: the app never opened)
        if runs is not None:
            await runs.aclose(grace=self.grace)
        await super().shutdown(sockets)


def _told(error: BaseException) -> None:
    """Log why the application could not be opened: its message, and what raised it.

    A handrail error of its own (a store the processes cannot share) needs no traceback; a
    factory's failure is logged with the traceback of what it raised (the `__cause__`).
    """
    cause = error.__cause__ if isinstance(error, HandrailError) else error
    if cause is None:
        _log.error("The application could not be opened: %s", error)
    else:
        _log.error("The application could not be opened: %s", error, exc_info=cause)


def server_config(
    app: Starlette,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    shutdown_grace: float = 5.0,
    header_timeout: float = 10.0,
    body_timeout: float = 30.0,
    idle_timeout: float = 5.0,
    max_connections: int | None = 1_000,
    max_client_connections: int | None = 250,
    reserved_connections: int | None = None,
    **uvicorn_options: Any,
) -> uvicorn.Config:
    """The `uvicorn.Config` of `app` as `serve` runs it (its arguments are `serve`'s)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(
            header_timeout=header_timeout,
            body_timeout=body_timeout,
            max_connections=max_connections,
            max_client_connections=max_client_connections,
            reserved_connections=reserved_connections,
        ),
        timeout_keep_alive=idle_timeout,  # type: ignore[arg-type]  # uvicorn takes a float
        timeout_graceful_shutdown=math.ceil(shutdown_grace),  # uvicorn takes whole seconds
        **uvicorn_options,
    )


def serve(
    app: Starlette,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    shutdown_grace: float = 5.0,
    header_timeout: float = 10.0,
    body_timeout: float = 30.0,
    idle_timeout: float = 5.0,
    max_connections: int | None = 1_000,
    max_client_connections: int | None = 250,
    reserved_connections: int | None = None,
    log_format: LogFormat = "text",
    **uvicorn_options: Any,
) -> None:
    """Serve `app` (from `create_app`) with uvicorn until Ctrl-C or SIGTERM.

    It uses uvloop and httptools when they are installed (the `server` extra installs them),
    and tunes the garbage collector (`tune_gc`). At shutdown, running turns get
    `shutdown_grace` seconds to stop, and streams as long again to send what is left.
    Connections that hold the server without using it are closed (`_connections`).

    Args:
        app: the app to serve.
        host: the interface to listen on.
        port: the port to listen on.
        shutdown_grace: seconds, as above.
        header_timeout: seconds a connection has to send a request's headers (from when it
            opens, or its previous answer ends); then it is closed (408 if a request began).
        body_timeout: seconds a request's body has to arrive after its headers.
        idle_timeout: seconds a kept-alive connection may stay idle between requests.
        max_connections: open connections past which a new one is answered 503 and closed
            (None: no cap; the process's file-descriptor limit still applies).
        max_client_connections: connections of one client address that have not shown a
            valid credential yet, past which its new ones are answered 503 (None: no cap).
            Behind a proxy every connection is the proxy's: raise it, or None.
        reserved_connections: of `max_connections`, how many only connections that showed a
            valid credential may hold (None: a fifth): past the rest, a new connection
            closes the oldest idle one that never did.
        log_format: `text` (uvicorn's lines) or `json` (one JSON object a line, for log
            shippers): `handrail._logs.configure_logging`.
        uvicorn_options: more of `uvicorn.Config`'s options (`log_level`, ...).
    """
    config = server_config(
        app,
        host=host,
        port=port,
        shutdown_grace=shutdown_grace,
        header_timeout=header_timeout,
        body_timeout=body_timeout,
        idle_timeout=idle_timeout,
        max_connections=max_connections,
        max_client_connections=max_client_connections,
        reserved_connections=reserved_connections,
        **uvicorn_options,
    )
    tune_gc()
    logging.getLogger("uvicorn.access").addFilter(AccessLogScrubber())
    escape_logs(log_format)
    server = _Server(config, app, shutdown_grace)
    try:
        server.run()
    except SystemExit:  # uvicorn's, when the app's start-up failed: say why
        if server.started or getattr(app.state, "open_error", None) is None:
            raise
    _started(server, app)


def _started(server: uvicorn.Server, app: Starlette) -> None:
    """Raise why the server did not start, if it did not (its app could not be opened)."""
    if server.started:
        return
    error = getattr(app.state, "open_error", None)
    if isinstance(error, HandrailError):
        raise error
    raise UserError(
        "The server did not start: its application could not be opened"
        + (f" ({type(error).__name__}: {error})" if error is not None else "")
        + "; see the log above."
    )


def _reload_keys() -> None:
    _log.info("SIGHUP: reading the API keys files again")
    reload_key_files()


AppFactory = Callable[[int], Starlette]
"""Makes the app of worker process number `index` (0, 1, ...), in that process."""

_STARTUP_FAILURE = 3  # uvicorn's exit code for a server that could not start


def serve_workers(
    factory: AppFactory,
    workers: int,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    shutdown_grace: float = 5.0,
    **options: Any,
) -> None:
    """Serve with `workers` processes sharing one listening socket, until Ctrl-C or SIGTERM.

    This process binds the socket and supervises: each worker process is started with
    `spawn` (a fresh interpreter), makes its app with `factory(index)` and serves it as
    `serve` does, with the same orderly shutdown. A worker that dies is started again
    under the same index (so, given a stable worker id per index, it takes its turns back
    at once: `Engine.reclaim`); one that cannot start stops them all. On Ctrl-C or SIGTERM
    every worker is sent SIGTERM and waited for.

    Args:
        factory: makes each worker's app; it must be picklable (a module-level function, or
            a `functools.partial` of one), since it is sent to the new process.
        workers: how many processes (at least 1).
        host: the interface to listen on.
        port: the port to listen on.
        shutdown_grace: as `serve`'s (each worker's).
        options: more of `serve`'s arguments, for each worker.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    config = uvicorn.Config("handrail:unused", host=host, port=port)  # to bind, as uvicorn does
    escape_logs(options.get("log_format", "text"))  # after uvicorn's own set-up
    sock = config.bind_socket()
    context = multiprocessing.get_context("spawn")
    settings = {"host": host, "port": port, "shutdown_grace": shutdown_grace, **options}

    def start(index: int) -> multiprocessing.process.BaseProcess:
        process = context.Process(
            target=_worker_main,
            args=(factory, index, sock, settings),
            name=f"handrail worker {index}",
        )
        process.start()
        return process

    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    processes: list[multiprocessing.process.BaseProcess] = []
    failed: int | None = None

    def hang_up(*_: Any) -> None:  # each worker reads its API keys files again
        for process in processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGHUP)

    if hasattr(signal, "SIGHUP"):
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, hang_up)
    try:
        processes += [start(index) for index in range(workers)]
        _log.info("%d worker processes on %s:%d", workers, host, port)
        while not stop.wait(0.5):
            for index, process in enumerate(processes):
                if process.is_alive():
                    continue
                if process.exitcode == _STARTUP_FAILURE:
                    _log.error("worker %d could not start; stopping them all", index)
                    failed = index
                    stop.set()
                    break
                _log.warning(
                    "worker %d (pid %s) died (exit code %s); starting it again",
                    index,
                    process.pid,
                    process.exitcode,
                )
                processes[index] = start(index)
        for process in processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        for process in processes:
            process.join(2 * shutdown_grace + 10)  # turns stop, then streams end
            if process.is_alive():
                process.kill()
                process.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    if failed is not None:
        raise UserError(
            f"Worker process {failed} could not start (its error is in the log above), so "
            f"the server stopped."
        )


def _worker_main(
    factory: AppFactory, index: int, sock: socket.socket, settings: dict[str, Any]
) -> None:
    """A worker process: make its app, and serve it on the socket the supervisor bound."""
    settings = dict(settings)
    log_format = settings.pop("log_format", "text")
    escape_logs(log_format)  # what the app's factory logs, too
    try:
        app = factory(index)
        config = server_config(app, **settings)
    except Exception:
        _log.exception("handrail worker %d could not start", index)
        sys.exit(_STARTUP_FAILURE)
    tune_gc()
    logging.getLogger("uvicorn.access").addFilter(AccessLogScrubber())
    escape_logs(log_format)
    server = _Server(config, app, settings.get("shutdown_grace", 5.0))
    try:
        server.run(sockets=[sock])
    finally:
        if not server.started:  # its app could not be opened (`_Server.startup` said why)
            sys.exit(_STARTUP_FAILURE)
