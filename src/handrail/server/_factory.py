"""An engine and its app from a name and the environment: for `handrail serve` and ASGI servers.

`app_from_env` is the app factory for running the server in several processes under another
supervisor (`uvicorn --factory --workers 4 handrail.server:app_from_env`, or gunicorn with
uvicorn workers); `handrail serve --workers N` uses the same pieces (docs/deploying.md).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from starlette.applications import Starlette

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
    "settings_authenticator",
]

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


def settings_authenticator(settings: Settings) -> ApiKeyAuthenticator:
    """The API keys of `settings` (`api_keys` and `api_keys_file`): `authenticator_from`.

    Raises:
        ConfigError: a spec is malformed, the file cannot be read, or one key is given twice.
    """
    return authenticator_from(settings.api_keys, settings.api_keys_file)


def configured_app(
    engine: Engine, settings: Settings, *, authenticator: Authenticator | None = None
) -> Starlette:
    """`create_app(engine)` as the settings say: limits, sweeps, retention, audit roles.

    The one way `handrail serve` (each of its processes) and `app_from_env` make their app.

    Args:
        engine: the engine (given the settings' store and worker id: `Settings.apply`).
        settings: the settings (`Settings.resolve`).
        authenticator: who may call (default: the settings' API keys).
    """
    return create_app(
        engine,
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
    processes. Each process loads the engine itself, so its store must be one they share
    (PostgreSQL; SQLite on one machine).

    The settings are `handrail serve`'s, read the same way (`handrail.config.Settings`, with
    no flags): `handrail config` shows them.

    Environment:
        HANDRAIL_ENGINE: the engine, `module:attribute` (or a factory), as `handrail serve`.
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
        ConfigError: HANDRAIL_ENGINE or every API key source is missing (no key is ever
            made up here: every process must accept the same keys), or a value is malformed
            (the variable named).
    """
    target = os.environ.get("HANDRAIL_ENGINE")
    if not target:
        raise ConfigError("Set HANDRAIL_ENGINE to the engine to serve, as module:attribute.")
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
    engine = load_engine(target)
    settings.apply(engine, suffix=os.getpid())
    if isinstance(engine.store, MemoryStore):
        _log.warning(
            "handrail: the engine's store is a MemoryStore, which this process keeps alone: "
            "run one process, or give the engine a PostgresStore."
        )
    return configured_app(engine, settings, authenticator=authenticator)
