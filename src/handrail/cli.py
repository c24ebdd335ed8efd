"""The `handrail` command: serve an engine over HTTP, and look after stored sessions.

```
handrail serve myapp:engine --port 8000 --api-key acme:ana:$KEY
handrail sessions list --db handrail.db --json
handrail sessions show SESSION_ID
handrail sessions export SESSION_ID > session.json
handrail sessions import session.json --overwrite
handrail sessions delete SESSION_ID --yes
```

It needs the `server` extra (`pip install "handrail[server]"`). An error prints one line and
exits with status 1.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

from pydantic_core import to_jsonable_python

try:
    import typer
    from rich.console import Console
    from rich.table import Table
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        'The handrail command needs typer and rich: pip install "handrail[server]"'
    ) from error

from .engine import Engine
from .exceptions import HandrailError
from .messages import TextPart, ToolCallPart
from .state import RunState
from .store import SessionStatus, SessionStore

__all__ = ["app"]

P = ParamSpec("P")
T = TypeVar("T")

app = typer.Typer(
    name="handrail",
    help="Serve a handrail engine over HTTP, and look after its stored sessions.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
sessions = typer.Typer(
    help="List, show, export, import and delete stored sessions.", no_args_is_help=True
)
app.add_typer(sessions, name="sessions")

_out = Console()

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
Schema = Annotated[str, typer.Option(help="The PostgreSQL store's schema.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON, for scripts.")]


class CliError(Exception):
    """An error the command reports in one line."""


def _one_line_errors(command: Callable[P, T]) -> Callable[P, T]:
    """Report what went wrong in one line on stderr and exit 1, without a traceback."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return command(*args, **kwargs)
        except (CliError, HandrailError, ImportError, OSError, ValueError) as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(1) from None

    return run


# -- serve ----------------------------------------------------------------------------------


@app.command()
@_one_line_errors
def serve(
    target: Annotated[str, typer.Argument(help="The engine, as module:attribute (or a factory).")],
    host: Annotated[str, typer.Option(help="The interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="The port to listen on.")] = 8000,
    api_key: Annotated[
        list[str] | None,
        typer.Option(
            help="ORG:USER:KEY, once a key (or HANDRAIL_API_KEYS, space-separated). "
            "Without any, a key is made for this run and printed.",
            envvar="HANDRAIL_API_KEYS",
        ),
    ] = None,
    max_body_size: Annotated[int, typer.Option(help="Bytes a request body may have.")] = 1_000_000,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "info",
) -> None:
    """Serve an engine's HTTP API (and its web page) with uvicorn."""
    import uvicorn

    from .server import ApiKeyAuthenticator, Caller, create_app

    engine = load_engine(target)
    authenticator = ApiKeyAuthenticator()
    for spec in api_key or ():
        org_id, user_id, key = _key_spec(spec)
        authenticator.add(key, Caller(org_id, user_id))
    if not api_key:
        key = ApiKeyAuthenticator.generate_key()
        authenticator.add(key, Caller("local", "local"))
        typer.echo(
            f"No --api-key given: this run accepts `Authorization: Bearer {key}` "
            f"(org 'local', user 'local').",
            err=True,
        )
        where = f"[{host}]" if ":" in host else "127.0.0.1" if host == "0.0.0.0" else host
        typer.echo(f"Open the web page: http://{where}:{port}/#key={key}", err=True)
    application = create_app(engine, authenticator=authenticator, max_body_size=max_body_size)
    uvicorn.run(application, host=host, port=port, log_level=log_level)


def load_engine(target: str) -> Engine:
    """The engine named by `module:attribute` (called first if it is a factory)."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise CliError(f"{target!r} is not module:attribute (e.g. myapp:engine).")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the app is in the cwd
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise CliError(f"Cannot import {module_name!r}: {error}.") from None
    found = getattr(module, attribute, None)
    if found is None:
        raise CliError(f"Module {module_name!r} has no attribute {attribute!r}.")
    if callable(found) and not isinstance(found, Engine):
        found = found()
    if not isinstance(found, Engine):
        raise CliError(f"{target} is a {type(found).__name__}, not a handrail Engine.")
    return found


def _key_spec(spec: str) -> tuple[str, str, str]:
    org_id, user_id, key = [*spec.split(":", 2), "", ""][:3]
    if not (org_id and user_id and key):
        raise CliError("--api-key takes ORG:USER:KEY (the key itself may contain colons).")
    return org_id, user_id, key


# -- sessions -------------------------------------------------------------------------------


def _store(db: Path, dsn: str | None, schema: str) -> SessionStore:
    if dsn:
        from .store import PostgresStore

        return PostgresStore(dsn, schema=schema)
    from .store import SqliteStore

    if not db.exists():
        raise CliError(f"No store at {db}: pass --db PATH (or --dsn for PostgreSQL).")
    return SqliteStore(db)


def _with_store(
    db: Path, dsn: str | None, schema: str, work: Callable[[SessionStore], Awaitable[T]]
) -> T:
    async def run() -> T:
        store = _store(db, dsn, schema)
        try:
            return await work(store)
        finally:
            await store.close()

    return _run(run())


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


async def _load(store: SessionStore, session_id: str) -> tuple[Any, RunState]:
    record = await store.load(session_id)
    if record is None:
        raise CliError(f"No session {session_id!r} in this store.")
    try:
        return record, RunState.load(record.data)
    except HandrailError as error:
        raise CliError(f"Session {session_id!r} cannot be read: {error}") from None


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


@sessions.command("list")
@_one_line_errors
def list_sessions(
    db: Db = Path("handrail.db"),
    dsn: Dsn = None,
    schema: Schema = "public",
    org: Annotated[str | None, typer.Option(help="Only this organisation's.")] = None,
    user: Annotated[str | None, typer.Option(help="Only this user's.")] = None,
    status: Annotated[SessionStatus | None, typer.Option(help="Only in this status.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 50,
    as_json: AsJson = False,
) -> None:
    """The stored sessions, most recently updated first."""
    found = _with_store(
        db,
        dsn,
        schema,
        lambda store: store.list(org_id=org, user_id=user, status=status, limit=limit),
    )
    if as_json:
        rows = [
            {k: getattr(s, k) for k in ("id", "org_id", "user_id", "status", "updated_at")}
            for s in found
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("session", "org", "user", "status", "updated (UTC)")
    for s in found:
        table.add_row(s.id, s.org_id or "", s.user_id or "", s.status, _when(s.updated_at))
    _out.print(table if found else "No sessions.")


@sessions.command()
@_one_line_errors
def show(
    session_id: str,
    db: Db = Path("handrail.db"),
    dsn: Dsn = None,
    schema: Schema = "public",
    as_json: AsJson = False,
) -> None:
    """A session's conversation and the calls waiting for a decision."""
    record, state = _with_store(db, dsn, schema, lambda store: _load(store, session_id))
    if as_json:
        document = {
            "id": record.id,
            "org_id": record.org_id,
            "user_id": record.user_id,
            "status": record.status,
            "messages": to_jsonable_python(state.messages),
            "pending": to_jsonable_python(list(state.pending.values())),
        }
        typer.echo(json.dumps(document, indent=2, ensure_ascii=False))
        return
    _out.print(
        f"[bold]{record.id}[/] · {record.org_id or '-'}/{record.user_id or '-'} · "
        f"{record.status} · updated {_when(record.updated_at)} UTC"
    )
    for message in state.messages:
        for part in message.parts:
            if isinstance(part, TextPart) and not part.synthetic:
                _out.print(f"[bold]{message.role}:[/] {part.text}", highlight=False)
            elif isinstance(part, ToolCallPart):
                _out.print(f"  [dim]tool[/] {part.name} · {part.status}", highlight=False)
    for card in state.pending.values():
        _out.print(
            f"[yellow]waiting ({card.kind}):[/] {card.tool_name} {json.dumps(card.args)} "
            f"· call {card.tool_call_id}",
            highlight=False,
        )


@sessions.command()
@_one_line_errors
def export(
    session_id: str,
    db: Db = Path("handrail.db"),
    dsn: Dsn = None,
    schema: Schema = "public",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here (default: stdout).")
    ] = None,
) -> None:
    """Export a session with its logs as one JSON document."""
    document = _with_store(db, dsn, schema, lambda store: store.export(session_id))
    if output is None:
        typer.echo(document)
    else:
        output.write_text(document + "\n", encoding="utf-8")


@sessions.command("import")
@_one_line_errors
def import_(
    source: Annotated[str, typer.Argument(help="An exported session's file, or - for stdin.")],
    db: Db = Path("handrail.db"),
    dsn: Dsn = None,
    schema: Schema = "public",
    overwrite: Annotated[bool, typer.Option(help="Replace a session that exists.")] = False,
) -> None:
    """Import an exported session (with its logs) into the store."""
    document = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    if not dsn and not db.exists():
        db.touch()  # importing may create the store
    record = _with_store(
        db, dsn, schema, lambda store: store.import_(document, overwrite=overwrite)
    )
    typer.echo(f"Imported session {record.id} (version {record.version}).", err=True)


@sessions.command()
@_one_line_errors
def delete(
    session_id: str,
    db: Db = Path("handrail.db"),
    dsn: Dsn = None,
    schema: Schema = "public",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Delete a session with its logs."""
    if not yes:
        typer.confirm(f"Delete session {session_id} and its logs?", abort=True)
    if not _with_store(db, dsn, schema, lambda store: store.delete(session_id)):
        raise CliError(f"No session {session_id!r} in this store.")
    typer.echo(f"Deleted session {session_id}.", err=True)
