"""An engine and its app from a name and the environment: for `handrail serve` and ASGI servers.

`app_from_env` is the app factory for running the server in several processes under another
supervisor (`uvicorn --factory --workers 4 handrail.server:app_from_env`, or gunicorn with
uvicorn workers); `handrail serve --workers N` uses the same pieces (docs/deploying.md).
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import sys
from collections.abc import Iterable
from pathlib import Path

from starlette.applications import Starlette

from ..engine import Engine
from ..exceptions import UserError
from ..store import MemoryStore
from ..worker import name_worker
from ._app import create_app
from ._auth import ApiKeyAuthenticator, ApiKeyFileAuthenticator

__all__ = ["app_from_env", "authenticator_from", "load_engine", "name_worker"]

_log = logging.getLogger("handrail.server")


def load_engine(target: str) -> Engine:
    """The engine named by `module:attribute` (called first if it is a factory).

    Raises:
        UserError: the name is not `module:attribute`, or names no engine.
    """
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise UserError(f"{target!r} is not module:attribute (e.g. myapp:engine).")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the app is in the cwd
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise UserError(f"Cannot import {module_name!r}: {error}.") from None
    found = getattr(module, attribute, None)
    if found is None:
        raise UserError(f"Module {module_name!r} has no attribute {attribute!r}.")
    if callable(found) and not isinstance(found, Engine):
        found = found()
    if not isinstance(found, Engine):
        raise UserError(f"{target} is a {type(found).__name__}, not a handrail Engine.")
    return found


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


def app_from_env() -> Starlette:
    """The server's app, configured from the environment: a factory for ASGI servers.

    `uvicorn --factory --workers 4 handrail.server:app_from_env` (or gunicorn with
    `-k uvicorn.workers.UvicornWorker 'handrail.server:app_from_env()'`) runs it in several
    processes. Each process loads the engine itself, so its store must be one they share
    (PostgreSQL; SQLite on one machine).

    Environment:
        HANDRAIL_ENGINE: the engine, `module:attribute` (or a factory), as `handrail serve`.
        HANDRAIL_API_KEYS: API key specs (`ORG:USER:KEY`, or `id=...,org=...,user=...,
            roles=...,expires=...,key=...`: `ApiKeySpec`), space-separated; and/or
        HANDRAIL_API_KEYS_FILE: a file of them, one a line.
        HANDRAIL_WORKER_ID: a name for this deployment's workers; each process is named
            `<it>-<pid>` (default: the host name), since processes must not share one.
        HANDRAIL_SWEEP_INTERVAL: seconds between sweeps (default 1; 0: none).
        HANDRAIL_AUDIT_ROLES: the roles that may read the audit trail, comma-separated
            (default `auditor`; `*`: every member of the organisation).

    Raises:
        UserError: HANDRAIL_ENGINE or every API key is missing, or one is malformed.
    """
    target = os.environ.get("HANDRAIL_ENGINE")
    if not target:
        raise UserError("Set HANDRAIL_ENGINE to the engine to serve, as module:attribute.")
    keys_file = os.environ.get("HANDRAIL_API_KEYS_FILE")
    file = Path(keys_file) if keys_file else None
    authenticator = authenticator_from(os.environ.get("HANDRAIL_API_KEYS", "").split(), file)
    if not len(authenticator):
        raise UserError(
            "Set HANDRAIL_API_KEYS (space-separated key specs, ORG:USER:KEY) or "
            "HANDRAIL_API_KEYS_FILE: "
            "every process must accept the same keys."
        )
    engine = load_engine(target)
    base = os.environ.get("HANDRAIL_WORKER_ID") or socket.gethostname()
    name_worker(engine, f"{base}-{os.getpid()}")
    if isinstance(engine.store, MemoryStore):
        _log.warning(
            "handrail: the engine's store is a MemoryStore, which this process keeps alone: "
            "run one process, or give the engine a PostgresStore."
        )
    sweep = float(os.environ.get("HANDRAIL_SWEEP_INTERVAL", "1") or 0)
    readers = os.environ.get("HANDRAIL_AUDIT_ROLES", "auditor").strip() or "auditor"
    roles = None if readers == "*" else {r.strip() for r in readers.split(",") if r.strip()}
    return create_app(
        engine, authenticator=authenticator, sweep_interval=sweep or None, audit_roles=roles
    )
