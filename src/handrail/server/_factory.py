"""A served application from a name and the environment: for `handrail serve` and ASGI servers.

`app_from_env` is the app factory for running the server in several processes under another
supervisor (`uvicorn --factory --workers 4 handrail.server:app_from_env`, or gunicorn with
uvicorn workers); `handrail serve --workers N` uses the same pieces (docs/deploying.md).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import warnings
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

from starlette.applications import Starlette

from ..apps import AppTarget, import_app, open_app
from ..config import Settings
from ..engine import Engine
from ..exceptions import ConfigError, UserError
from ..store import MemoryStore
from ..worker import name_worker
from ._app import create_app
from ._auth import ApiKeyAuthenticator, ApiKeyFileAuthenticator, Authenticator
from ._limits import Limits

__all__ = [
    "app_from_env",
    "authenticator_from",
    "configured_app",
    "load_engine",
    "name_worker",
    "served",
    "settings_authenticator",
]

_log = logging.getLogger("handrail.server")


def load_engine(target: str) -> Engine:
    """Deprecated: the engine `MODULE:NAME` names, made synchronously (outside any loop).

    An application that owns async resources cannot be made this way: every entry point
    opens it with `handrail.apps.open_app` inside its event loop instead (`async with
    open_app("myapp:app") as engine:`). This takes an `Engine` or a function returning one.

    Raises:
        UserError: the name is not `MODULE:NAME`, or names something else (a coroutine
            function, an async context manager: use `open_app`).
    """
    warnings.warn(
        "handrail.server.load_engine is deprecated: use `async with "
        "handrail.apps.open_app(target) as engine:` (it opens async factories and async "
        "context managers in the running event loop).",
        DeprecationWarning,
        stacklevel=2,
    )
    found = import_app(target)
    if callable(found) and not isinstance(found, Engine):
        if inspect.iscoroutinefunction(found) or inspect.isasyncgenfunction(found):
            raise UserError(f"{target} is async: open it with handrail.apps.open_app.")
        found = found()
    if not isinstance(found, Engine):
        raise UserError(
            f"{target} is (or returned) a {type(found).__name__}, not a handrail Engine: open "
            f"it with handrail.apps.open_app."
        )
    return found


def served(
    target: str | AppTarget,
    *,
    settings: Settings | None = None,
    worker_id: str | None = None,
    suffix: str | int | None = None,
    processes: int | None = 1,
) -> Callable[[], contextlib.AbstractAsyncContextManager[Engine]]:
    """`target` as a server process opens it: configured, named, its store checked.

    For `create_app(lifespan=...)`: the application is opened (`open_app`) in the server's
    loop; with `settings`, it is given their store and worker id (`Settings.apply`, the
    worker id suffixed with `suffix`; a store made from them is closed with the app), else
    the worker id `worker_id` (`name_worker`); with several `processes`, a `MemoryStore`
    (which they cannot share) is refused, and SQLite's limits are logged once; with an
    unknown number (None: another supervisor's), a `MemoryStore` is warned about.
    """

    @contextlib.asynccontextmanager
    async def opened() -> AsyncIterator[Engine]:
        async with open_app(target) as engine:
            made = None
            if settings is not None:
                made = settings.apply(engine, suffix=suffix)
            elif worker_id is not None:
                name_worker(engine, worker_id)
            try:
                if processes is None and isinstance(engine.store, MemoryStore):
                    _log.warning(
                        "handrail: the engine's store is a MemoryStore, which this process "
                        "keeps alone: run one process, or give the engine a PostgresStore."
                    )
                elif processes is not None and processes > 1:
                    if settings is not None:
                        first = suffix in (None, 0, "0")
                    else:
                        first = worker_id is None or worker_id.endswith("-0")
                    _check_shared(engine, processes, note=first)
                yield engine
            finally:
                if made is not None:
                    await made.close()

    return opened


def _check_shared(engine: Engine, processes: int, *, note: bool) -> None:
    """Refuse a store the processes cannot share; say (once) what holds with SQLite."""
    from ..store import SqliteStore

    store = engine.store
    if isinstance(store, MemoryStore):
        raise UserError(
            f"{processes} server processes need a store they share, and the engine's is a "
            f"MemoryStore: each process would keep sessions of its own, and a request landing "
            f"on another process would not find them. Give the engine a PostgresStore (or a "
            f"SqliteStore, on one machine), or run one process."
        )
    if isinstance(store, SqliteStore) and note:
        _log.warning(
            "%d processes share the SQLite file %s (this machine only): writes take turns on "
            "its lock, and each process finds the others' events and wake-ups by polling "
            "(streams every second, workers every %g s). For pushed events and many "
            "machines, use PostgreSQL.",
            processes,
            store.path,
            store.poll_interval,
        )


def authenticator_from(specs: Iterable[str], file: Path | None = None) -> ApiKeyAuthenticator:
    """An `ApiKeyAuthenticator` of key specs, and of a file of them (one a line).

    A spec is `ORG:USER:KEY`, or `id=ID,org=ORG,user=USER,roles=R1+R2,expires=DATE,key=KEY`
    (`ApiKeySpec`). With a file, it is an `ApiKeyFileAuthenticator`: the file is read again
    whenever it changes (and on SIGHUP under `serve`).

    Raises:
        ConfigError: a spec is malformed, the file cannot be read, or one key is given twice
            (both places named).
    """
    named = [(f"HANDRAIL_API_KEYS item {n}", spec) for n, spec in enumerate(specs, 1)]
    if file is not None:
        return ApiKeyFileAuthenticator(file, named)
    authenticator = ApiKeyAuthenticator()
    authenticator.add_specs(named)
    return authenticator


def settings_authenticator(settings: Settings) -> ApiKeyAuthenticator:
    """The API keys of `settings` (`api_keys` and `api_keys_file`): `authenticator_from`.

    Raises:
        ConfigError: a spec is malformed, the file cannot be read, or one key is given twice.
    """
    return authenticator_from(settings.api_keys, settings.api_keys_file)


def configured_app(
    target: str | AppTarget,
    settings: Settings,
    *,
    authenticator: Authenticator | None = None,
    suffix: str | int | None = None,
    processes: int | None = 1,
) -> Starlette:
    """`create_app` as the settings say: limits, sweeps, retention, audit roles.

    The one way `handrail serve` (each of its processes) and `app_from_env` make their app.
    The application is opened when the server starts, in its loop (`served`).

    Args:
        target: the application, as `handrail.apps.open_app` takes it.
        settings: the settings (`Settings.resolve`): the store and worker id they name are
            given to the engine once it is open.
        authenticator: who may call (default: the settings' API keys).
        suffix: added to the worker id (a process's number or pid).
        processes: how many processes serve it (None: unknown, another supervisor's).
    """
    return create_app(
        lifespan=served(target, settings=settings, suffix=suffix, processes=processes),
        authenticator=authenticator or settings_authenticator(settings),
        max_body_size=settings.max_body_size,
        shutdown_grace=settings.shutdown_grace,
        sweep_interval=settings.sweep_interval or None,
        retention=settings.retention,
        poll_interval=settings.poll_interval,
        limits=Limits(
            rate=settings.rate or None,
            burst=settings.burst,
            streams=settings.streams or None,
            turns=settings.turns or None,
            stream_bytes=settings.stream_bytes or None,
        ),
        audit_roles=settings.audit_roles,
    )


def app_from_env() -> Starlette:
    """The server's app, configured from the environment: a factory for ASGI servers.

    `uvicorn --factory --workers 4 handrail.server:app_from_env` (or gunicorn with
    `-k uvicorn.workers.UvicornWorker 'handrail.server:app_from_env()'`) runs it in several
    processes. Each process opens the application itself, in its event loop when the server
    starts (before the first request), and closes it when it shuts down, so its store must
    be one they share (PostgreSQL; SQLite on one machine).

    The settings are `handrail serve`'s, read the same way (`handrail.config.Settings`, with
    no flags): `handrail config` shows them.

    Environment:
        HANDRAIL_ENGINE: the application, `MODULE:NAME`, as `handrail serve` takes it: an
            `Engine`, a function or coroutine function returning one, or an async
            context-manager function yielding one (`handrail.apps`).
        HANDRAIL_API_KEYS: API key specs (`ORG:USER:KEY`, or `id=...,org=...,user=...,
            roles=...,expires=...,key=...`: `ApiKeySpec`), space-separated; and/or
        HANDRAIL_API_KEYS_FILE: a file of them, one a line.
        HANDRAIL_WORKER_ID: a name for this deployment's workers; each process is named
            `<it>-<pid>` (default: the host name), since processes must not share one.
        HANDRAIL_DSN, HANDRAIL_DB (and HANDRAIL_SCHEMA): a store over the engine's own.
        HANDRAIL_SWEEP_INTERVAL, HANDRAIL_RETENTION_DAYS, HANDRAIL_RATE, HANDRAIL_BURST,
            HANDRAIL_STREAMS, HANDRAIL_TURNS, HANDRAIL_STREAM_BYTES, HANDRAIL_MAX_BODY_SIZE,
            HANDRAIL_SHUTDOWN_GRACE, HANDRAIL_POLL_INTERVAL, HANDRAIL_AUDIT_ROLES: as the
            flags of `handrail serve` of the same names.

    Raises:
        UserError: HANDRAIL_ENGINE names nothing that imports.
        ConfigError: HANDRAIL_ENGINE or every API key source is missing (no key is ever
            made up here: every process must accept the same keys), or a value is malformed
            (the variable named).
    """
    target = os.environ.get("HANDRAIL_ENGINE")
    if not target:
        raise ConfigError(
            "Set HANDRAIL_ENGINE to the application to serve, as MODULE:NAME (handrail.apps)."
        )
    settings = Settings.resolve()
    if not settings.has_key_source:
        raise ConfigError(
            "Set HANDRAIL_API_KEYS (space-separated key specs, ORG:USER:KEY) or "
            "HANDRAIL_API_KEYS_FILE: "
            "every process must accept the same keys."
        )
    authenticator = settings_authenticator(settings)
    if not len(authenticator):
        _log.warning(
            "handrail: %s holds no API key yet: every request gets 401 until it has one.",
            settings.api_keys_file,
        )
    import_app(target)  # a name that does not import fails here, before the server starts
    return configured_app(
        target, settings, authenticator=authenticator, suffix=os.getpid(), processes=None
    )
