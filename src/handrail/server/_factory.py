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
import socket
import warnings
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

from starlette.applications import Starlette

from ..apps import AppTarget, import_app, open_app
from ..engine import Engine
from ..exceptions import UserError
from ..store import MemoryStore
from ._app import create_app
from ._auth import ApiKeyAuthenticator, ApiKeyFileAuthenticator

__all__ = ["app_from_env", "authenticator_from", "load_engine", "name_worker", "served"]

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
    target: str | AppTarget, *, worker_id: str | None = None, processes: int | None = 1
) -> Callable[[], contextlib.AbstractAsyncContextManager[Engine]]:
    """`target` as a server process opens it: named `worker_id`, its store checked.

    For `create_app(lifespan=...)`: the application is opened (`open_app`) in the server's
    loop; its engine is given the worker id (`name_worker`); with several `processes`, a
    `MemoryStore` (which they cannot share) is refused, and SQLite's limits are logged once;
    with an unknown number (None: another supervisor's), a `MemoryStore` is warned about.
    """

    @contextlib.asynccontextmanager
    async def opened() -> AsyncIterator[Engine]:
        async with open_app(target) as engine:
            if worker_id is not None:
                name_worker(engine, worker_id)
            if processes is None and isinstance(engine.store, MemoryStore):
                _log.warning(
                    "handrail: the engine's store is a MemoryStore, which this process keeps "
                    "alone: run one process, or give the engine a PostgresStore."
                )
            elif processes is not None and processes > 1:
                first = worker_id is None or worker_id.endswith("-0")
                _check_shared(engine, processes, note=first)
            yield engine

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


def name_worker(engine: Engine, worker_id: str) -> None:
    """Give `engine` the worker id `worker_id` (and a lease owner of it), before it runs.

    Each process of a server needs its own: processes sharing one would take each other's
    leases at start-up (`Engine.reclaim`).
    """
    incarnation = engine.lease_owner.rpartition("#")[2]
    engine.worker_id = worker_id
    engine.lease_owner = f"{worker_id}#{incarnation}"


def app_from_env() -> Starlette:
    """The server's app, configured from the environment: a factory for ASGI servers.

    `uvicorn --factory --workers 4 handrail.server:app_from_env` (or gunicorn with
    `-k uvicorn.workers.UvicornWorker 'handrail.server:app_from_env()'`) runs it in several
    processes. Each process opens the application itself, in its event loop when the server
    starts (before the first request), and closes it when it shuts down, so its store must
    be one they share (PostgreSQL; SQLite on one machine).

    Environment:
        HANDRAIL_ENGINE: the application, `MODULE:NAME`, as `handrail serve` takes it: an
            `Engine`, a function or coroutine function returning one, or an async
            context-manager function yielding one (`handrail.apps`).
        HANDRAIL_API_KEYS: API key specs (`ORG:USER:KEY`, or `id=...,org=...,user=...,
            roles=...,expires=...,key=...`: `ApiKeySpec`), space-separated; and/or
        HANDRAIL_API_KEYS_FILE: a file of them, one a line.
        HANDRAIL_WORKER_ID: a name for this deployment's workers; each process is named
            `<it>-<pid>` (default: the host name), since processes must not share one.
        HANDRAIL_SWEEP_INTERVAL: seconds between sweeps (default 1; 0: none).
        HANDRAIL_AUDIT_ROLES: the roles that may read the audit trail, comma-separated
            (default `auditor`; `*`: every member of the organisation).

    Raises:
        UserError: HANDRAIL_ENGINE or every API key is missing, or one is malformed, or the
            application's module cannot be imported.
    """
    target = os.environ.get("HANDRAIL_ENGINE")
    if not target:
        raise UserError(
            "Set HANDRAIL_ENGINE to the application to serve, as MODULE:NAME (handrail.apps)."
        )
    keys_file = os.environ.get("HANDRAIL_API_KEYS_FILE")
    file = Path(keys_file) if keys_file else None
    authenticator = authenticator_from(os.environ.get("HANDRAIL_API_KEYS", "").split(), file)
    if not len(authenticator):
        raise UserError(
            "Set HANDRAIL_API_KEYS (space-separated key specs, ORG:USER:KEY) or "
            "HANDRAIL_API_KEYS_FILE: "
            "every process must accept the same keys."
        )
    import_app(target)  # a name that does not import fails here, before the server starts
    base = os.environ.get("HANDRAIL_WORKER_ID") or socket.gethostname()
    app = served(target, worker_id=f"{base}-{os.getpid()}", processes=None)
    sweep = float(os.environ.get("HANDRAIL_SWEEP_INTERVAL", "1") or 0)
    readers = os.environ.get("HANDRAIL_AUDIT_ROLES", "auditor").strip() or "auditor"
    roles = None if readers == "*" else {r.strip() for r in readers.split(",") if r.strip()}
    return create_app(
        lifespan=app, authenticator=authenticator, sweep_interval=sweep or None, audit_roles=roles
    )
