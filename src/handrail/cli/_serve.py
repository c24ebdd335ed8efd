"""`handrail serve`: an application's HTTP API (and its web page) with uvicorn."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any

import typer

from .._logs import configure_logging
from ..config import Settings
from ..engine import Engine
from ._common import CliError, one_line_errors
from ._open import imported_app
from ._options import (
    App,
    AuditRolesFlag,
    BurstFlag,
    DbFlag,
    DsnFlag,
    LogFormatFlag,
    LogLevelFlag,
    MaxBodySizeFlag,
    PollIntervalFlag,
    RateFlag,
    RetentionDaysFlag,
    SchemaFlag,
    ShutdownGraceFlag,
    StreamBytesFlag,
    StreamsFlag,
    SweepIntervalFlag,
    TurnsFlag,
    WorkerIdFlag,
    settings_of,
)

__all__ = ["serve"]


@one_line_errors
def serve(
    target: App,
    host: Annotated[str, typer.Option(help="The interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="The port to listen on.")] = 8000,
    api_keys_file: Annotated[
        Path | None,
        typer.Option(
            help="A file of API keys, one a line (ORG:USER:KEY, or id=ID,org=ORG,user=USER,"
            "roles=R1+R2,expires=2027-01-31,key=KEY; blank lines and # comments skipped), read "
            "again when it changes and on SIGHUP (an invalid one keeps the keys in use). "
            "Or set HANDRAIL_API_KEYS_FILE, and/or HANDRAIL_API_KEYS (space-separated). Keys "
            "are never taken from the command line, where every user of the machine reads "
            "them (ps, /proc). With no key source at all, one is made for this run and "
            "printed on stderr."
        ),
    ] = None,
    db: DbFlag = None,
    dsn: DsnFlag = None,
    schema: SchemaFlag = None,
    worker_id: WorkerIdFlag = None,
    max_body_size: MaxBodySizeFlag = None,
    log_level: LogLevelFlag = None,
    log_format: LogFormatFlag = None,
    shutdown_grace: ShutdownGraceFlag = None,
    sweep_interval: SweepIntervalFlag = None,
    retention_days: RetentionDaysFlag = None,
    rate: RateFlag = None,
    burst: BurstFlag = None,
    streams: StreamsFlag = None,
    turns: TurnsFlag = None,
    stream_bytes: StreamBytesFlag = None,
    header_timeout: Annotated[
        float, typer.Option(help="Seconds a connection has to send a request's headers.", min=0.1)
    ] = 10.0,
    body_timeout: Annotated[
        float, typer.Option(help="Seconds a request's body has to arrive.", min=0.1)
    ] = 30.0,
    idle_timeout: Annotated[
        float, typer.Option(help="Seconds a kept-alive connection may idle.", min=0.1)
    ] = 5.0,
    max_connections: Annotated[
        int, typer.Option(help="Open connections past which new ones get 503 (0: no cap).", min=0)
    ] = 1_000,
    max_client_connections: Annotated[
        int,
        typer.Option(
            help="Connections of one client address that have not sent a valid key yet, past "
            "which its new ones get 503 (0: no cap; behind a proxy, every connection is the "
            "proxy's). A fifth of --max-connections is kept for connections that did.",
            min=0,
        ),
    ] = 250,
    poll_interval: PollIntervalFlag = None,
    audit_roles: AuditRolesFlag = None,
    workers: Annotated[
        int,
        typer.Option(
            help="Server processes on the one port, each with its own engine and worker id "
            "(HANDRAIL_WORKER_ID-N, default the host name): a store they share is needed "
            "(PostgreSQL; SQLite on one machine). See docs/deploying.md.",
            min=1,
        ),
    ] = 1,
) -> None:
    """Serve an application's HTTP API (and its web page) with uvicorn.

    The application (APP, `MODULE:NAME`: an Engine, a function or coroutine function
    returning one, or an async context-manager function yielding one) is opened in the
    server's event loop before the first request, and closed on shutdown (SIGTERM, Ctrl-C);
    with --workers, in each process. Its settings are read as every command reads them: a
    flag, else its HANDRAIL_* variable, else the default (`handrail config` shows them, and
    where each came from).
    """
    settings = settings_of(locals())  # the parameters named as settings (first: no other local)
    from ..server import configured_app, serve_workers, settings_authenticator
    from ..server import serve as serve_app

    if settings.log_format == "json":  # what loading the app logs is one object a line too
        configure_logging("json")
    found = imported_app(target)  # a name that is no app fails here, in one line
    if workers > 1 and isinstance(found, Engine) and settings.store() is None:
        _check_memory(found, workers)
    # Read once here: a malformed spec, or a key given twice, stops the server before it starts.
    authenticator = settings_authenticator(settings)
    if not settings.has_key_source:
        settings = _one_off_key(settings, host, port)
        authenticator = settings_authenticator(settings)
    elif not len(authenticator):
        typer.echo(
            f"Warning: {settings.api_keys_file} ({settings.source('api_keys_file')}) holds no "
            f"API key yet: every request gets 401 until it has one (it is read again when it "
            f"changes).",
            err=True,
        )
    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "shutdown_grace": settings.shutdown_grace,
        "log_level": settings.log_level,
        "log_format": settings.log_format,
        "header_timeout": header_timeout,
        "body_timeout": body_timeout,
        "idle_timeout": idle_timeout,
        "max_connections": max_connections or None,
        "max_client_connections": max_client_connections or None,
    }
    if workers > 1:
        serve_workers(functools.partial(_worker_app, target, settings, workers), workers, **options)
        return
    serve_app(configured_app(target, settings, authenticator=authenticator), **options)


def _one_off_key(settings: Settings, host: str, port: int) -> Settings:
    """Settings with a key made for this run, said loudly: no key source is configured."""
    from ..server import ApiKeyAuthenticator

    key = ApiKeyAuthenticator.generate_key()
    readers = settings.audit_roles
    # The run's own key is its operator's: it may read the audit trail too.
    roles = "+".join(sorted(readers or ()))
    spec = f"id=local,org=local,user=local,roles={roles},key={key}"
    where = f"[{host}]" if ":" in host else "127.0.0.1" if host == "0.0.0.0" else host
    typer.echo(
        f"WARNING: no API key is configured (HANDRAIL_API_KEYS, HANDRAIL_API_KEYS_FILE or "
        f"--api-keys-file), so this run made a one-off key, which stops working when it "
        f"stops:\n"
        f"    Authorization: Bearer {key}\n"
        f"  (org 'local', user 'local'{f', roles {roles}' if roles else ''})\n"
        f"  Open the web page: http://{where}:{port}/#key={key}\n"
        f"  For real keys: HANDRAIL_API_KEYS='ORG:USER:KEY ...' or HANDRAIL_API_KEYS_FILE="
        f"keys.txt (one spec a line), and `handrail config` to check (docs/deploying.md).",
        err=True,
    )
    return settings.replace(api_keys=(spec,))


def _worker_app(target: str, settings: Settings, workers: int, index: int) -> Any:
    """The app of worker process `index` of `serve --workers`: its own engine and worker id.

    The application is opened in the process's event loop when its server starts. The id is
    the worker id setting (default: the host name) and the index, the same for the worker
    started again after it died, so that it takes its turns back at once.
    """
    from ..server import configured_app

    return configured_app(target, settings, suffix=index, processes=workers)


def _check_memory(engine: Engine, workers: int) -> None:
    """Refuse at once an Engine (not a factory) whose MemoryStore the processes cannot share.

    An application that makes its engine is checked by each process once it is open.
    """
    from ..store import MemoryStore

    if isinstance(engine.store, MemoryStore):
        raise CliError(
            f"--workers {workers} needs a store the processes share, and the engine's is a "
            f"MemoryStore: each process would keep sessions of its own, and a request landing "
            f"on another process would not find them. Give the engine a PostgresStore (or a "
            f"SqliteStore, on one machine), or run one worker."
        )
