"""`handrail config`: the configuration in effect, where each value came from, secrets masked."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from ..config import DEFAULT, Settings
from ._common import one_line_errors, out, run
from ._options import (
    ApiKeysFileFlag,
    AsJson,
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

__all__ = ["config_command"]


@one_line_errors
def config_command(
    target: Annotated[
        str | None,
        typer.Argument(help="The app, as MODULE:NAME: its store and worker id are shown too."),
    ] = None,
    api_keys_file: ApiKeysFileFlag = None,
    db: DbFlag = None,
    dsn: DsnFlag = None,
    schema: SchemaFlag = None,
    worker_id: WorkerIdFlag = None,
    sweep_interval: SweepIntervalFlag = None,
    retention_days: RetentionDaysFlag = None,
    rate: RateFlag = None,
    burst: BurstFlag = None,
    streams: StreamsFlag = None,
    turns: TurnsFlag = None,
    stream_bytes: StreamBytesFlag = None,
    max_body_size: MaxBodySizeFlag = None,
    shutdown_grace: ShutdownGraceFlag = None,
    poll_interval: PollIntervalFlag = None,
    audit_roles: AuditRolesFlag = None,
    log_format: LogFormatFlag = None,
    log_level: LogLevelFlag = None,
    as_json: AsJson = False,
) -> None:
    """Print the configuration in effect, and where each value came from, secrets masked.

    The same flags as `handrail serve` (and the same HANDRAIL_* variables): pass the ones
    you run it with. A source is the flag, the variable's name, or `default`. API keys show
    their ids and users, a DSN its host with the password masked, the audit key its id.
    """
    settings = settings_of(locals())  # the parameters named as settings (first: no other local)
    from ..server import settings_authenticator

    keys = len(settings_authenticator(settings))  # a malformed key fails as it would in serve
    extra = [
        ("keys in use", str(keys), "api_keys, api_keys_file")
        if settings.has_key_source
        else ("keys in use", "none: `handrail serve` would make a one-off key", DEFAULT)
    ]
    if target is not None:
        extra += run(_app_rows(target, settings))
    if as_json:
        document: dict[str, Any] = settings.to_json()
        document.update({name: {"value": v, "source": source} for name, v, source in extra})
        typer.echo(json.dumps(document, indent=2))
        return
    table = Table("setting", "value", "source")
    for column in table.columns:
        column.overflow = "fold"
    for row in [(s.name, s.shown, s.source) for s in settings.describe()] + extra:
        table.add_row(*row)
    out.print(table)


async def _app_rows(target: str, settings: Settings) -> list[tuple[str, str, str]]:
    """What the app makes of the settings: its store, its worker id, its gate."""
    from ..apps import open_app

    async with open_app(target) as engine:
        store = settings.store()
        if store is not None:
            await store.close()
            where = "dsn" if settings.dsn else "db"
            kept = f"{type(store).__name__} (from {where})"
        else:
            kept = f"{type(engine.store).__name__} (the app's own)"
        worker = settings.worker_name() if settings.worker_id else engine.worker_id
        gate = getattr(engine, "gate", None)
        return [
            ("app", target, "argument"),
            ("app store", kept, settings.source("dsn" if settings.dsn else "db")),
            ("app worker id", worker, settings.source("worker_id")),
            ("app gate", "none" if gate is None else _name_of(gate), "the app"),
        ]


def _name_of(thing: Any) -> str:
    return getattr(thing, "__qualname__", None) or type(thing).__name__
