"""The options and arguments several `handrail` commands take, each written once.

Three kinds of store option, because the commands use a store three ways:

- `Db`, `Dsn`, `Schema`: the store a command reads and writes itself (`sessions`, `audit`):
  a SQLite file that must exist (default `handrail.db`), or PostgreSQL with `--dsn`.
- `OverDb` with `Dsn` and `Schema`: a store put over the app's own (`worker`, `run`).
- `DbFlag`, `DsnFlag`, ... : the settings of `handrail.config.Settings` (`serve`, `config`,
  `chat`), whose default is None (not given) so that `Settings.resolve` tells the flag from
  the variable and the default; their help names the variable and the default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from ..config import Settings, flag_help

__all__ = [
    "ApiKeysFileFlag",
    "App",
    "AppInProcess",
    "AsJson",
    "AuditRolesFlag",
    "BurstFlag",
    "Db",
    "DbFlag",
    "Dsn",
    "DsnFlag",
    "LogFormatFlag",
    "LogLevelFlag",
    "MaxBodySizeFlag",
    "OverDb",
    "PollIntervalFlag",
    "RateFlag",
    "RetentionDaysFlag",
    "Schema",
    "SchemaFlag",
    "ShutdownGraceFlag",
    "StreamBytesFlag",
    "StreamsFlag",
    "SweepIntervalFlag",
    "TurnsFlag",
    "WorkerIdFlag",
    "setting",
    "settings_of",
]

# -- the application ------------------------------------------------------------------------

App = Annotated[
    str,
    typer.Argument(
        metavar="APP",
        help="The application, as MODULE:NAME: an Engine, a function or coroutine function "
        "returning one, or an async context-manager function yielding one (docs/server.md, "
        "handrail.apps).",
    ),
]
"""The app of `serve` and `chat`."""
AppInProcess = Annotated[
    str,
    typer.Argument(
        help="The app, as MODULE:NAME: an Engine, a function or coroutine function returning "
        "one, or an async context-manager function yielding one (opened in this process's "
        "event loop, closed at exit)."
    ),
]
"""The app of `worker` and `run`, opened in the command's process."""

# -- a store the command reads itself, or one over the app's ----------------------------------

STORE_FILE = Path("handrail.db")
"""The default `--db` of the commands that read a store themselves."""
Db = Annotated[
    Path,
    typer.Option(help="The SQLite store's file.", envvar="HANDRAIL_DB", show_default=True),
]
Dsn = Annotated[
    str | None,
    typer.Option(
        help="A PostgreSQL store's connection string (instead of --db).", envvar="HANDRAIL_DSN"
    ),
]
Schema = Annotated[
    str, typer.Option(help="The PostgreSQL store's schema.", envvar="HANDRAIL_SCHEMA")
]
OverDb = Annotated[
    Path | None,
    typer.Option("--db", help="Keep the sessions in this SQLite file (over the app's store)."),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON, for scripts.")]

# -- the settings (handrail.config) -----------------------------------------------------------


def setting(name: str, **extra: Any) -> Any:
    """A `typer.Option` for the setting `name`: its help names its variable and default.

    Its default is None (not given), so `Settings.resolve` tells the flag from the rest.
    """
    flag, help_ = flag_help(name)
    return typer.Option(flag, help=help_, **extra)


_SETTINGS = frozenset(f.name for f in dataclasses.fields(Settings)) - {"sources"}


def settings_of(parameters: Mapping[str, Any]) -> Settings:
    """The settings a command was given, from its parameters (`locals()` as it starts).

    A parameter named as a setting is its flag (None: not given); then come the HANDRAIL_*
    variables, then the defaults (`Settings.resolve`).
    """
    return Settings.resolve({k: v for k, v in parameters.items() if k in _SETTINGS})


DbFlag = Annotated[Path | None, setting("db")]
DsnFlag = Annotated[str | None, setting("dsn")]
SchemaFlag = Annotated[str | None, setting("schema")]
ApiKeysFileFlag = Annotated[Path | None, setting("api_keys_file")]
WorkerIdFlag = Annotated[str | None, setting("worker_id")]
SweepIntervalFlag = Annotated[float | None, setting("sweep_interval", min=0)]
RetentionDaysFlag = Annotated[float | None, setting("retention_days", min=0)]
RateFlag = Annotated[float | None, setting("rate", min=0)]
BurstFlag = Annotated[int | None, setting("burst", min=1)]
StreamsFlag = Annotated[int | None, setting("streams", min=0)]
TurnsFlag = Annotated[int | None, setting("turns", min=0)]
StreamBytesFlag = Annotated[float | None, setting("stream_bytes", min=0)]
MaxBodySizeFlag = Annotated[int | None, setting("max_body_size", min=1)]
ShutdownGraceFlag = Annotated[float | None, setting("shutdown_grace", min=0)]
PollIntervalFlag = Annotated[float | None, setting("poll_interval", min=0.01)]
AuditRolesFlag = Annotated[str | None, setting("audit_roles")]
LogFormatFlag = Annotated[str | None, setting("log_format")]
LogLevelFlag = Annotated[str | None, setting("log_level")]
