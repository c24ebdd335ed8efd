"""The `handrail` command: serve an engine over HTTP, and look after stored sessions.

```
HANDRAIL_API_KEYS="acme:ana:$KEY" handrail serve myapp:engine --port 8000
handrail config myapp:engine --json      # the settings in effect, with their sources
handrail worker myapp:app --dsn postgresql://... --worker-id "$HOSTNAME"
handrail run myapp:app "Reorder what runs low" --org acme --user cron --headless --propose
handrail sessions list --db handrail.db --json
handrail sessions show SESSION_ID
handrail sessions export SESSION_ID > session.json
handrail sessions import session.json --overwrite
handrail sessions delete SESSION_ID --yes
handrail audit verify --org acme --anchor 41:9f2c...
```

It needs the `server` extra (`pip install "handrail[server]"`). An error prints one line and
exits with status 1 (`handrail run` has more exit codes: docs/scheduling.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn, ParamSpec, TypeVar

from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from ._random import token_hex
from .exceptions import MissingExtraError

try:
    import typer
    from rich.console import Console
    from rich.table import Table
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError(
        "The handrail command", needs="typer and rich", extra="server"
    ) from error

from ._logs import configure_logging
from ._loop import AgentRun
from .apps import _ACCEPTED as ACCEPTED_APPS
from .apps import import_app, open_app
from .audit import (
    AUDIT_KEY_ENV,
    AUDIT_OLD_KEYS_ENV,
    AuditAnchor,
    AuditEntry,
    AuditKey,
    AuditKind,
    AuditVerifier,
    entry_hash,
    keyring_from_env,
)
from .config import DEFAULT, Settings, flag_help
from .documents._cli import docs_app
from .engine import Engine
from .evals._cli import eval_command
from .events import (
    EVENT,
    AgentCompleted,
    AgentStarted,
    ApprovalRequired,
    Event,
    InputRequired,
    RunCompleted,
    RunFailed,
    RunSuspended,
    TextDelta,
    ToolCallCompleted,
    ToolCallStarted,
)
from .exceptions import (
    DecisionNotAllowedError,
    HandrailError,
    SessionNotFoundError,
    TurnCutOffError,
    TurnSuspendedError,
)
from .gate import TurnRequest
from .messages import MESSAGES, ApprovalCardPart, Message, TextPart, ToolCallPart
from .policy import Decider
from .state import RunState
from .store import SessionStatus, SessionStore
from .suspension import Decision

__all__ = ["app"]

P = ParamSpec("P")
T = TypeVar("T")


def _untagged(command: Any) -> None:
    """Help for `command` (and its subcommands) without typer's `<str>`/`<bool>` type tags.

    A flag shows none, an option its metavar if it has one (`--compare DRAFT PINNED`), a
    choice its values (`decision|call`); what an option takes is said by its help.
    """
    get_params = command.get_params

    def params(ctx: Any) -> Any:
        found = get_params(ctx)  # (the --help option is made here, so it is tidied here)
        for param in found:
            _untag(param)
        return found

    command.get_params = params
    for sub in getattr(command, "commands", {}).values():
        _untagged(sub)


def _untag(param: Any) -> None:
    described = getattr(param, "type_descriptor", None)
    if described is None:
        return

    def display(ctx: Any) -> str:
        if isinstance(param, typer.core.TyperOption) and param.metavar is not None:
            return str(param.metavar)
        if described.is_choice:
            return str(param.display_type(ctx)).strip("<>")
        return ""

    param.display_type_rich = display


class _Group(typer.core.TyperGroup):
    """The `handrail` command, whose help shows no type tags (`_untagged`)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        _untagged(self)


app = typer.Typer(
    name="handrail",
    help="Serve a handrail engine over HTTP, and look after its stored sessions.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_Group,
)
sessions = typer.Typer(
    help="List, show, export, import and delete stored sessions.", no_args_is_help=True
)
audit = typer.Typer(
    help="List, export (JSON lines), anchor and verify an organisation's audit trail.",
    no_args_is_help=True,
)
app.add_typer(sessions, name="sessions")
app.add_typer(audit, name="audit")
app.add_typer(docs_app, name="docs")
app.command("eval")(eval_command)

_out = Console()
_err = Console(stderr=True)

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
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON, for scripts.")]


class CliError(Exception):
    """An error the command reports in one line."""


class ChatRefused(Exception):
    """`handrail chat`: the policy refused the terminal's decisions; the turn waits for others."""

    def __init__(self, session_id: str, calls: list[str]) -> None:
        super().__init__(
            f"Session {session_id!r} waits for decisions on {', '.join(calls)} that the "
            f"tools' policies do not let you make (nothing was recorded for them): someone "
            f"they allow decides them (on `handrail serve`: GET /pending, then POST "
            f"/sessions/{session_id}/resolve); the turn resumes once none is left."
        )


def _one_line_errors(command: Callable[P, T]) -> Callable[P, T]:
    """Report what went wrong in one line on stderr and exit 1, without a traceback."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return command(*args, **kwargs)
        except (CliError, HandrailError, ImportError, OSError, ValueError) as error:
            typer.echo(f"error: {_cli_message(error)}", err=True)
            raise typer.Exit(1) from None

    return run


def _cli_message(error: Exception) -> str:
    """What a person at the terminal reads for `error`: what to do, in the CLI's terms.

    An exception's own message speaks to a Python caller (`engine.resume(...)`).
    """
    if isinstance(error, TurnCutOffError):
        return (
            f"Session {error.session_id!r}: the previous turn was cut off while it ran (a "
            f"crash, or a worker that stopped). `handrail serve` recovers it by itself (as "
            f"does any Worker on the same store); then chat again."
        )
    if isinstance(error, TurnSuspendedError) and not error.pending:
        return (
            f"Session {error.session_id!r} has a suspended turn whose calls are all decided: "
            f"`handrail serve` resumes it by itself (as does any Worker on the same store); "
            f"then chat again."
        )
    if isinstance(error, TurnSuspendedError):
        return (
            f"Session {error.session_id!r} has a suspended turn, waiting on decisions for "
            f"{', '.join(error.pending)} (`handrail chat --session {error.session_id}` asks "
            f"you for yours; a call its policy gives to others waits for them); the turn "
            f"resumes once none is left, then chat again."
        )
    return str(error)


# -- serve ----------------------------------------------------------------------------------

_APP_HELP = (
    "The application, as MODULE:NAME: an Engine, a function or coroutine function returning "
    "one, or an async context-manager function yielding one (docs/server.md, handrail.apps)."
)


def _setting(name: str, **extra: Any) -> Any:
    """A `typer.Option` for the setting `name`: its help names its variable and default.

    Its default is None (not given), so `Settings.resolve` tells the flag from the rest.
    """
    flag, help_ = flag_help(name)
    return typer.Option(flag, help=help_, **extra)


@app.command()
@_one_line_errors
def serve(
    target: Annotated[str, typer.Argument(metavar="APP", help=_APP_HELP)],
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
    db: Annotated[Path | None, _setting("db")] = None,
    dsn: Annotated[str | None, _setting("dsn")] = None,
    schema: Annotated[str | None, _setting("schema")] = None,
    worker_id: Annotated[str | None, _setting("worker_id")] = None,
    max_body_size: Annotated[int | None, _setting("max_body_size", min=1)] = None,
    log_level: Annotated[str | None, _setting("log_level")] = None,
    log_format: Annotated[str | None, _setting("log_format")] = None,
    shutdown_grace: Annotated[float | None, _setting("shutdown_grace", min=0)] = None,
    sweep_interval: Annotated[float | None, _setting("sweep_interval", min=0)] = None,
    retention_days: Annotated[float | None, _setting("retention_days", min=0)] = None,
    rate: Annotated[float | None, _setting("rate", min=0)] = None,
    burst: Annotated[int | None, _setting("burst", min=1)] = None,
    streams: Annotated[int | None, _setting("streams", min=0)] = None,
    turns: Annotated[int | None, _setting("turns", min=0)] = None,
    stream_bytes: Annotated[float | None, _setting("stream_bytes", min=0)] = None,
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
    poll_interval: Annotated[float | None, _setting("poll_interval", min=0.01)] = None,
    audit_roles: Annotated[str | None, _setting("audit_roles")] = None,
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
    from .server import configured_app, serve_workers, settings_authenticator
    from .server import serve as serve_app

    settings = Settings.resolve(
        {
            "api_keys_file": api_keys_file,
            "db": db,
            "dsn": dsn,
            "schema": schema,
            "worker_id": worker_id,
            "max_body_size": max_body_size,
            "log_level": log_level,
            "log_format": log_format,
            "shutdown_grace": shutdown_grace,
            "sweep_interval": sweep_interval,
            "retention_days": retention_days,
            "rate": rate,
            "burst": burst,
            "streams": streams,
            "turns": turns,
            "stream_bytes": stream_bytes,
            "poll_interval": poll_interval,
            "audit_roles": audit_roles,
        }
    )
    if settings.log_format == "json":  # what loading the app logs is one object a line too
        configure_logging("json")
    found = import_app(target)  # a name that does not import fails here, in one line
    if not isinstance(found, Engine) and not callable(found):
        raise CliError(f"{target} is a {type(found).__name__}; it must be {ACCEPTED_APPS}.")
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
    from .server import ApiKeyAuthenticator

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
    from .server import configured_app

    return configured_app(target, settings, suffix=index, processes=workers)


def _check_memory(engine: Engine, workers: int) -> None:
    """Refuse at once an Engine (not a factory) whose MemoryStore the processes cannot share.

    An application that makes its engine is checked by each process once it is open.
    """
    from .store import MemoryStore

    if isinstance(engine.store, MemoryStore):
        raise CliError(
            f"--workers {workers} needs a store the processes share, and the engine's is a "
            f"MemoryStore: each process would keep sessions of its own, and a request landing "
            f"on another process would not find them. Give the engine a PostgresStore (or a "
            f"SqliteStore, on one machine), or run one worker."
        )


# -- config ---------------------------------------------------------------------------------


@app.command("config")
@_one_line_errors
def config_command(
    target: Annotated[
        str | None,
        typer.Argument(help="The app, as MODULE:NAME: its store and worker id are shown too."),
    ] = None,
    api_keys_file: Annotated[Path | None, _setting("api_keys_file")] = None,
    db: Annotated[Path | None, _setting("db")] = None,
    dsn: Annotated[str | None, _setting("dsn")] = None,
    schema: Annotated[str | None, _setting("schema")] = None,
    worker_id: Annotated[str | None, _setting("worker_id")] = None,
    sweep_interval: Annotated[float | None, _setting("sweep_interval", min=0)] = None,
    retention_days: Annotated[float | None, _setting("retention_days", min=0)] = None,
    rate: Annotated[float | None, _setting("rate", min=0)] = None,
    burst: Annotated[int | None, _setting("burst", min=1)] = None,
    streams: Annotated[int | None, _setting("streams", min=0)] = None,
    turns: Annotated[int | None, _setting("turns", min=0)] = None,
    stream_bytes: Annotated[float | None, _setting("stream_bytes", min=0)] = None,
    max_body_size: Annotated[int | None, _setting("max_body_size", min=1)] = None,
    shutdown_grace: Annotated[float | None, _setting("shutdown_grace", min=0)] = None,
    poll_interval: Annotated[float | None, _setting("poll_interval", min=0.01)] = None,
    audit_roles: Annotated[str | None, _setting("audit_roles")] = None,
    log_format: Annotated[str | None, _setting("log_format")] = None,
    log_level: Annotated[str | None, _setting("log_level")] = None,
    as_json: AsJson = False,
) -> None:
    """Print the configuration in effect, and where each value came from, secrets masked.

    The same flags as `handrail serve` (and the same HANDRAIL_* variables): pass the ones
    you run it with. A source is the flag, the variable's name, or `default`. API keys show
    their ids and users, a DSN its host with the password masked, the audit key its id.
    """
    settings = Settings.resolve(
        {
            "api_keys_file": api_keys_file,
            "db": db,
            "dsn": dsn,
            "schema": schema,
            "worker_id": worker_id,
            "sweep_interval": sweep_interval,
            "retention_days": retention_days,
            "rate": rate,
            "burst": burst,
            "streams": streams,
            "turns": turns,
            "stream_bytes": stream_bytes,
            "max_body_size": max_body_size,
            "shutdown_grace": shutdown_grace,
            "poll_interval": poll_interval,
            "audit_roles": audit_roles,
            "log_format": log_format,
            "log_level": log_level,
        }
    )
    from .server import settings_authenticator

    keys = len(settings_authenticator(settings))  # a malformed key fails as it would in serve
    extra = [
        ("keys in use", str(keys), "api_keys, api_keys_file")
        if settings.has_key_source
        else ("keys in use", "none: `handrail serve` would make a one-off key", DEFAULT)
    ]
    if target is not None:
        extra += _run(_app_rows(target, settings))
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
    _out.print(table)


async def _app_rows(target: str, settings: Settings) -> list[tuple[str, str, str]]:
    """What the app makes of the settings: its store, its worker id, its gate."""
    from .apps import open_app

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


# -- chat -----------------------------------------------------------------------------------


@app.command()
@_one_line_errors
def chat(
    target: Annotated[str, typer.Argument(metavar="APP", help=_APP_HELP)],
    session: Annotated[
        str | None, typer.Option(help="The session to continue (default: a new one).")
    ] = None,
    org: Annotated[str | None, typer.Option(help="The caller's organisation.")] = None,
    user: Annotated[str | None, typer.Option(help="The caller (recorded on decisions).")] = None,
    route: Annotated[str | None, typer.Option(help="The domain's route for every turn.")] = None,
    message: Annotated[
        list[str] | None,
        typer.Option(
            "--message", "-m", help="Send this message (once a message), then exit, asking nothing."
        ),
    ] = None,
    roles: Annotated[
        str | None,
        typer.Option(
            help="Your roles, comma-separated (sre,it-admin): you decide the cards as --user "
            "(default: cli) with these roles, under the tools' decision policies, as any "
            "decider does over HTTP."
        ),
    ] = None,
    db: Annotated[Path | None, _setting("db")] = None,
    dsn: Annotated[str | None, _setting("dsn")] = None,
    schema: Annotated[str | None, _setting("schema")] = None,
    approve_all: Annotated[
        bool, typer.Option("--approve-all", help="Approve every call as proposed, asking nobody.")
    ] = False,
    reject_all: Annotated[
        bool, typer.Option("--reject-all", help="Reject every call, asking nobody.")
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Write the events as JSON lines, for scripts (needs --approve-all or "
            "--reject-all if a turn waits for a decision).",
        ),
    ] = False,
) -> None:
    """Chat with an application in the terminal: stream the replies, decide the calls it proposes.

    The application (APP, as `handrail serve` takes it) is opened in the chat's event loop,
    and closed when the chat ends.

    Each line you type is a turn. When a turn waits for a decision, each card is shown and you
    approve (y), reject with a reason (n) or amend (a) it; the turn then resumes. End with an
    empty line, Ctrl-D or /quit.
    """
    if approve_all and reject_all:
        raise CliError("Pass --approve-all or --reject-all, not both.")
    settings = Settings.resolve({"db": db, "dsn": dsn, "schema": schema})
    held = frozenset(r.strip() for r in (roles or "").split(",") if r.strip())
    import_app(target)  # a name that does not import fails here, in one line

    async def talk() -> None:
        status = _err.status(f"Opening {target}…")
        status.start()
        async with contextlib.AsyncExitStack() as opened:
            try:
                engine = await opened.enter_async_context(open_app(target))
            finally:
                status.stop()
            own_store = settings.apply(engine) is not None
            preset = "approve" if approve_all else "reject" if reject_all else None
            supervisor = engine.domain.supervisor
            view = (
                _JsonView()
                if as_json
                else _ChatView(_out, supervisor=None if supervisor is None else supervisor.name)
            )
            chat_ = _Chat(
                engine,
                session or f"chat-{token_hex(4)}",
                org_id=org,
                user_id=user,
                route=route,
                view=view,
                preset=preset,
                ask=None if (as_json or message) else _out.input,
                own_store=own_store,
                roles=held,
            )
            await chat_.run(message)

    try:
        _run(talk())
    except ChatRefused as waiting:
        typer.echo(str(waiting), err=True)  # the refusals were shown: this is not an error
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        _err.print("[dim]Stopped.[/]")
        raise typer.Exit(130) from None


class _ChatView:
    """Draws a turn's events: the reply as it streams, a line a tool call, spinners.

    A spinner runs while the model or a tool works (`Console.status`).
    """

    def __init__(self, console: Console, *, supervisor: str | None = None) -> None:
        self.console = console
        self.supervisor = supervisor
        self._status: Any = None
        self._streaming = False

    def working(self, what: str) -> None:
        """Show a spinner saying `what` is going on (until the next output)."""
        if self._status is None:
            self._status = self.console.status(what)
            self._status.start()
        else:
            self._status.update(what)

    def idle(self) -> None:
        """Stop the spinner."""
        if self._status is not None:
            self._status.stop()
            self._status = None

    def end_text(self) -> None:
        if self._streaming:
            self.console.print()
            self._streaming = False

    def event(self, event: Event) -> None:
        """Draw one event."""
        from rich.text import Text

        from ._cards import outcome_line

        out = self.console
        match event:
            case AgentStarted(agent=agent):
                self.end_text()
                self.working(f"{agent} is thinking…")
            case TextDelta(agent=agent) if agent == self.supervisor:
                pass  # its decision is drawn when it completes
            case AgentCompleted(agent=agent, output={"route": route, **more}) if (
                agent == self.supervisor
            ):
                why = more.get("reason")
                out.print(f"[magenta]  ↳ route {route}[/]{f': {why}' if why else ''}")
            case TextDelta(agent=agent, delta=delta):
                self.idle()
                if not self._streaming:
                    out.print(Text(f"{agent}: ", style="bold green"), end="")
                    self._streaming = True
                out.print(delta, end="", markup=False, highlight=False, soft_wrap=True)
            case ToolCallStarted(name=name, args=args):
                self.end_text()
                shown = ", ".join(
                    f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in (args or {}).items()
                )
                self.working(f"running {name}({shown})…")
            case ToolCallCompleted() as done:
                self.idle()
                mark, style = ("✓", "green") if done.ok else ("✗", "red")
                out.print(
                    Text.assemble(
                        ("  " + mark + " " + done.name, style), (" → ", "dim"), outcome_line(done)
                    )
                )
                self.working("thinking…")
            case ApprovalRequired() | InputRequired():
                self.idle()
                self.end_text()
            case RunSuspended(pending=pending):
                self.idle()
                self.end_text()
                out.print(Text(f"⏸ waiting for {len(pending)} decision(s)", style="yellow"))
            case RunCompleted(stop_reason=stop, finish_reason=finish):
                self.idle()
                self.end_text()
                if stop == "cut":
                    out.print(Text(f"✂ the answer was cut off ({finish})", style="yellow"))
            case RunFailed(reason=reason, error=error, reference=reference):
                self.idle()
                self.end_text()
                where = f" (reference {reference})" if reference else ""
                out.print(
                    Text(f"✗ the turn failed ({reason}): {error or ''}{where}", style="bold red")
                )
            case _:
                pass

    def card(self, card: ApprovalCardPart) -> None:
        from ._cards import approval_card

        self.idle()
        self.console.print(approval_card(card))

    def refused(self, card: ApprovalCardPart, decision: Decision, reason: str) -> None:
        verb = {"approve": "approve", "reject": "reject", "answer": "answer"}
        self.console.print(
            f"[bold red]✗ refused:[/] you may not {verb.get(decision.decision, 'decide')} "
            f"{card.tool_name}: {reason} Nothing was recorded.",
            highlight=False,
        )

    def decided(self, card: ApprovalCardPart, decision: Decision) -> None:
        verb = {"approve": "approved", "reject": "rejected", "answer": "answered"}
        amended = getattr(decision, "amended_args", None)
        note = f", amended: {json.dumps(amended, ensure_ascii=False)}" if amended else ""
        self.console.print(
            f"[dim]{verb.get(decision.decision, decision.decision)} {card.tool_name}{note}[/]",
            highlight=False,
        )


class _JsonView:
    """Writes each event as a JSON line on standard output, and nothing else."""

    def event(self, event: Event) -> None:
        typer.echo(EVENT.dump_json(event).decode())

    def card(self, card: ApprovalCardPart) -> None:
        pass

    def decided(self, card: ApprovalCardPart, decision: Decision) -> None:
        pass

    def refused(self, card: ApprovalCardPart, decision: Decision, reason: str) -> None:
        typer.echo(f"refused: {card.tool_name} (call {card.tool_call_id}): {reason}", err=True)

    def idle(self) -> None:
        pass


class _Chat:
    """A conversation at the terminal: turns submitted, events drawn, cards decided."""

    def __init__(
        self,
        engine: Engine,
        session_id: str,
        *,
        org_id: str | None,
        user_id: str | None,
        route: str | None,
        view: _ChatView | _JsonView,
        preset: str | None,
        ask: Callable[[str], str] | None,
        own_store: bool = False,
        roles: frozenset[str] = frozenset(),
    ) -> None:
        self.engine = engine
        self.roles = roles
        self.decider = Decider(user_id=user_id or "cli", roles=roles, org_id=org_id)
        """The person at the terminal, as the decision policies see them."""
        self.own_store = own_store
        self.session_id = session_id
        self.org_id, self.user_id = org_id, user_id
        self.route = route
        self.view = view
        self.preset = preset
        self.ask = ask
        self._schemas: dict[str, dict[str, Any] | None] = {}

    async def run(self, messages: list[str] | None) -> None:
        try:
            await self._run(messages)
        finally:
            self.view.idle()
            if self.own_store:  # the engine's own store is its owner's to close
                await self.engine.store.close()

    async def _run(self, messages: list[str] | None) -> None:
        if isinstance(self.view, _ChatView):
            self.view.console.print(
                f"[dim]session {self.session_id} · empty line, Ctrl-D or /quit to end[/]",
                highlight=False,
            )
        await self._settle()  # a session that already waits for decisions
        lines = iter(messages) if messages else None
        while True:
            if lines is not None:
                text = next(lines, None)
            elif self.ask is not None:
                try:
                    text = self.ask("[bold cyan]you:[/] ")
                except EOFError:
                    text = None
            else:
                raw = sys.stdin.readline()
                text = raw.rstrip("\n") if raw else None
            if text is None or text.strip() in ("", "/quit", "/exit"):
                return
            await self.engine.admit(  # the app's gate: may this person start a turn at all?
                TurnRequest(
                    org_id=self.org_id,
                    user_id=self.user_id,
                    roles=self.roles,
                    session_id=self.session_id,
                    text=text,
                    via="chat",
                )
            )
            run = self.engine.submit(
                self.session_id,
                text,
                org_id=self.org_id,
                user_id=self.user_id,
                route=self.route,
                roles=self.roles,
            )
            await self._play(run)
            await self._settle()

    async def _play(self, run: AgentRun[Any]) -> None:
        async for event in run:
            if isinstance(event, InputRequired):
                self._schemas[event.tool_call_id] = event.output_schema
            self.view.event(event)

    async def _settle(self) -> None:
        """While the session waits for decisions: ask for them, record them, resume."""
        while True:
            try:
                state = await self.engine.session(
                    self.session_id, org_id=self.org_id, user_id=self.user_id
                )
            except SessionNotFoundError:
                return  # a new session
            cards = [c for c in state.pending.values() if c.decision is None]
            if not state.pending:
                return
            refused: list[str] = []
            ready = False
            for card in cards:
                self.view.card(card)
                decision = self._decide(card)
                try:  # recorded under the call's policy, as any decider's: or refused
                    resolution = await self.engine.resolve(
                        self.session_id, card.tool_call_id, decision, decider=self.decider
                    )
                except DecisionNotAllowedError as refusal:
                    self.view.refused(card, decision, str(refusal))
                    refused.append(card.tool_call_id)
                    continue
                self.view.decided(card, decision)
                ready = resolution.ready
            if refused:
                raise ChatRefused(self.session_id, refused)
            if not ready:
                return
            await self._play(
                self.engine.resume(self.session_id, org_id=self.org_id, user_id=self.user_id)
            )

    def _decide(self, card: ApprovalCardPart) -> Decision:
        from ._cards import ask_answer, ask_decision
        from .suspension import Approve, Reject

        by = self.user_id or "cli"
        if self.preset == "approve" and card.kind != "elicitation":
            return Approve(by=by)
        if self.preset == "reject":
            return Reject(reason="rejected with --reject-all", by=by)
        if self.ask is None:
            raise CliError(
                f"The turn waits for a decision on {card.tool_name} (call {card.tool_call_id}) "
                "and nobody is asked: pass --approve-all or --reject-all"
                + (
                    " (an answer for a human tool cannot be approved)"
                    if card.kind == "elicitation"
                    else ""
                )
                + "."
            )
        if card.kind == "elicitation":
            decision = ask_answer(
                card, self.ask, output_schema=self._schemas.get(card.tool_call_id), by=by
            )
        else:
            decision = ask_decision(card, self.ask, by=by)
        if decision is None:
            raise CliError(f"No decision on {card.tool_name}: the input ended.")
        return decision


# -- worker and run -------------------------------------------------------------------------

App = Annotated[
    str,
    typer.Argument(
        help="The app, as MODULE:NAME: an Engine, a function or coroutine function returning "
        "one, or an async context-manager function yielding one (opened in this process's "
        "event loop, closed at exit)."
    ),
]
OverDb = Annotated[
    Path | None,
    typer.Option("--db", help="Keep the sessions in this SQLite file (over the app's store)."),
]
EXIT_WAITING = 3
"""`handrail run`'s exit status when the turn waits for people (a card to decide)."""


@app.command()
@_one_line_errors
def worker(
    target: App,
    db: OverDb = None,
    dsn: Dsn = None,
    schema: Schema = "public",
    worker_id: Annotated[
        str | None,
        typer.Option(
            help="This worker's stable name in session leases (a pod or host name, one per "
            "process): restarted under it, the worker takes its turns back at once. Default: "
            "the app's (HANDRAIL_WORKER_ID, else a random one).",
            envvar="HANDRAIL_WORKER_ID",
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option(help="Sessions driven (turns resumed or recovered) at once.", min=1)
    ] = 4,
    sweep_interval: Annotated[
        float,
        typer.Option(
            help="Seconds between sweeps: decided turns nobody resumed, turns whose worker "
            "died, cards past their deadline.",
            min=0.01,
        ),
    ] = 1.0,
    shutdown_grace: Annotated[
        float,
        typer.Option(
            help="On SIGTERM or SIGINT, seconds the turns being driven get to finish; then "
            "they are cut off (their leases given back) and another worker recovers them.",
            min=0,
        ),
    ] = 30.0,
    health_interval: Annotated[
        float,
        typer.Option(help="Seconds between health lines in the log (0: none).", min=0),
    ] = 60.0,
    retention_days: Annotated[
        float | None,
        typer.Option(
            help="Delete finished sessions nobody touched for this many days (default: keep).",
            min=0,
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="The log level (info, warning, ...).")] = "info",
) -> None:
    """Drive an app's sessions with no web server: what `handrail serve` runs besides HTTP.

    Resumes turns decided anywhere (woken by the store, or found by a sweep), recovers turns
    whose worker died, expires cards past their deadline, under the sessions' leases: run as
    many workers as you like on one store (PostgreSQL; SQLite on one machine). SIGTERM or
    SIGINT drains: no new work, the turns being driven finish (for --shutdown-grace
    seconds), the app is closed, exit 0; a second signal stops at once.
    """
    _log_to(log_level)
    settings = _WorkerSettings(
        db=db,
        dsn=dsn,
        schema=schema,
        worker_id=worker_id,
        concurrency=concurrency,
        sweep_interval=sweep_interval,
        grace=shutdown_grace,
        health=health_interval or None,
        retention=retention_days * 86_400 if retention_days else None,
    )
    try:
        _run(_work(target, settings))
    except asyncio.CancelledError:  # a second signal: stopped at once
        raise typer.Exit(130) from None


@dataclasses.dataclass(kw_only=True, slots=True)
class _WorkerSettings:
    db: Path | None
    dsn: str | None
    schema: str
    worker_id: str | None
    concurrency: int
    sweep_interval: float
    grace: float
    health: float | None
    retention: float | None


async def _work(target: str, settings: _WorkerSettings) -> None:
    """`handrail worker`: open the app, run a `Worker` on its store until a signal, drain."""
    import logging
    import signal

    from .apps import open_app
    from .store import MemoryStore
    from .worker import Worker, name_worker

    log = logging.getLogger("handrail.worker")
    stop = asyncio.Event()
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def signalled(name: str) -> None:
        if stop.is_set():
            log.warning(
                "handrail worker: %s, a second signal: stopping now (turns in flight cut off)", name
            )
            if main is not None:
                main.cancel()
            return
        log.info("handrail worker: %s: draining (a second signal stops at once)", name)
        stop.set()

    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, signalled, sig.name)
    try:
        async with (
            open_app(target) as engine,
            _over_store(engine, _store_of(settings.db, settings.dsn, settings.schema)),
        ):
            if isinstance(engine.store, MemoryStore):
                raise CliError(
                    f"{target}'s store is a MemoryStore, which only this process would see: "
                    f"a worker drives the sessions of a store others share. Pass --db FILE or "
                    f"--dsn (PostgreSQL), or give the app such a store."
                )
            if settings.worker_id:
                name_worker(engine, settings.worker_id)
            worker_ = Worker(
                engine,
                poll_interval=settings.sweep_interval,
                concurrency=settings.concurrency,
                max_backoff=max(300.0, settings.sweep_interval),
                retention=settings.retention,
                health_interval=settings.health,
            )
            log.info(
                "handrail worker %s: started on %s (concurrency %d, sweeps every %g s)",
                engine.lease_owner,
                _where(engine.store),
                settings.concurrency,
                settings.sweep_interval,
            )
            await worker_.run(stop, grace=settings.grace)
            log.info("handrail worker %s: stopped: %s", engine.lease_owner, worker_.stats.line())
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def _store_of(db: Path | None, dsn: str | None, schema: str) -> SessionStore | None:
    """The store `--db`/`--dsn` name, made as every command makes it (`Settings.store`)."""
    return Settings.resolve({"db": db, "dsn": dsn, "schema": schema}).store()


@contextlib.asynccontextmanager
async def _over_store(engine: Engine, store: SessionStore | None) -> AsyncIterator[None]:
    """`store` in place of the app's while this runs, closed after; None: the app's own."""
    if store is None:
        yield
        return
    own, engine.store = engine.store, store
    try:
        yield
    finally:
        engine.store = own  # the app's exit closes its own
        await store.close()


def _where(store: SessionStore) -> str:
    """The store, as a log line names it (a PostgreSQL password masked)."""
    path, dsn = getattr(store, "path", None), getattr(store, "masked_dsn", None)
    if dsn is not None:
        return f"{type(store).__name__}({dsn}, schema {getattr(store, 'schema', '?')})"
    return f"{type(store).__name__}({path})" if path is not None else type(store).__name__


def _log_to(level: str) -> None:
    """Write handrail's log lines to stderr at `level`, unless the app set up logging."""
    import logging

    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise CliError(f"--log-level {level!r}: not a level (debug, info, warning, error).")
    if not logging.getLogger().handlers:
        logging.basicConfig(level=number, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("handrail").setLevel(number)


@app.command("run")
@_one_line_errors
def run_turn(
    target: App,
    text: Annotated[str, typer.Argument(help="The message: the job's instruction.")],
    session: Annotated[
        str | None,
        typer.Option(help="The session to run in (default: a new one, run- and random hex)."),
    ] = None,
    org: Annotated[
        str | None,
        typer.Option(help="The organisation the turn acts for (whose inbox shows its cards)."),
    ] = None,
    user: Annotated[str | None, typer.Option(help="The user the turn acts for.")] = None,
    route: Annotated[str | None, typer.Option(help="The domain's route to take.")] = None,
    headless: Annotated[
        bool,
        typer.Option(
            "--headless",
            help="Capture mode: gated calls do not run; their tools' mint predicts what they "
            "would return (docs/headless.md).",
        ),
    ] = False,
    propose: Annotated[
        bool,
        typer.Option(
            "--propose",
            help="With --headless: put the captured actions on one batch card in the inbox, "
            "for a person to approve; print its id and exit 0.",
        ),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON object: session, status, cards, text (and actions, headless).",
        ),
    ] = False,
    db: OverDb = None,
    dsn: Dsn = None,
    schema: Schema = "public",
) -> None:
    """Run one turn of an app and exit: for a cron job, a systemd timer, a Kubernetes CronJob.

    Exit status: 0 the turn completed (with --propose: also when its actions wait on the
    batch card, whose id is printed); 3 it waits for people (its cards' ids are printed: a
    `handrail worker` or `handrail serve` on the same store resumes it once decided); 1 it
    failed; 2 bad usage. See docs/scheduling.md.
    """
    if propose and not headless:
        _usage("--propose needs --headless: only a headless turn's actions go on a batch card.")
    if not text.strip():
        _usage('TEXT is empty: give the turn its message, e.g. "Reorder what runs low."')
    session_id = session or f"run-{token_hex(6)}"
    try:
        outcome = _run(
            _one_turn(
                target, session_id, text, org, user, route, headless, propose, db, dsn, schema
            )
        )
    except (CliError, HandrailError, ImportError, OSError, ValueError) as error:
        if as_json:  # a script reads what went wrong on stdout too; the error line follows
            failed = {"session": session_id, "status": "failed", "cards": [], "text": ""}
            typer.echo(json.dumps({**failed, "error": _cli_message(error)}, ensure_ascii=False))
        raise
    status = outcome["status"]
    if as_json:
        typer.echo(json.dumps(outcome, ensure_ascii=False, default=str))
    elif status == "completed":
        typer.echo(outcome["text"])
    elif status == "proposed":
        typer.echo(outcome["cards"][0])
        typer.echo(
            f"Proposed {len(outcome['actions'])} action(s) on batch card {outcome['cards'][0]} "
            f"(session {session_id}): nothing ran; it waits in the inbox for a person.",
            err=True,
        )
    elif status == "waiting":
        for card in outcome["cards"]:
            typer.echo(card)
        if "error" in outcome:
            typer.echo(f"Session {session_id}: {outcome['error']}", err=True)
        typer.echo(
            f"Session {session_id} waits for people: card(s) "
            f"{', '.join(outcome['cards']) or '(all decided)'} to decide (the inbox, GET "
            f"/pending); a handrail worker or server on the same store resumes the turn "
            f"once decided.",
            err=True,
        )
    if status == "failed":
        if not as_json:
            typer.echo(f"error: {outcome['error']}", err=True)
        raise typer.Exit(1)
    if status == "waiting":
        raise typer.Exit(EXIT_WAITING)


def _usage(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


async def _one_turn(
    target: str,
    session_id: str,
    text: str,
    org_id: str | None,
    user_id: str | None,
    route: str | None,
    headless: bool,
    propose: bool,
    db: Path | None,
    dsn: str | None,
    schema: str,
) -> dict[str, Any]:
    """`handrail run`: one turn of the app, as the JSON object `--json` prints."""
    import signal

    from .apps import open_app
    from .store import MemoryStore

    loop = asyncio.get_running_loop()
    async with open_app(target) as engine, _over_store(engine, _store_of(db, dsn, schema)):
        if route is not None and route not in engine.domain.routes:
            routes = ", ".join(engine.domain.routes) or "none"
            _usage(f"--route {route!r}: the app has no such route (routes: {routes}).")
        if isinstance(engine.store, MemoryStore):
            if propose:
                raise CliError(
                    f"--propose needs a store that outlives this process, and {target}'s is a "
                    f"MemoryStore: the card would vanish at exit. Pass --db FILE or --dsn."
                )
            typer.echo(
                "Note: the app's store is a MemoryStore: this session is lost at exit.", err=True
            )
        # SIGTERM (a job's deadline) stops the turn; it is saved, and reported failed.
        signals = (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            loop.add_signal_handler(sig, engine.interrupt, session_id)
        outcome: dict[str, Any] = {"session": session_id}
        card: str | None = None  # the batch card proposed
        try:
            if headless:
                result = await engine.run_headless(
                    session_id, text, org_id=org_id, user_id=user_id, route=route, propose=propose
                )
                ended, events, card = result.outcome, result.events, result.card
                answer: Any = result.text
                pending = [card] if card else []
                outcome["actions"] = [
                    {
                        "local_index": a.local_index,
                        "tool": a.tool,
                        "args": a.args,
                        "predicted_output": a.predicted_output,
                        "status": a.status,
                    }
                    for a in result.actions
                ]
            else:
                run = engine.submit(session_id, text, org_id=org_id, user_id=user_id, route=route)
                events = [event async for event in run]
                ended, answer, pending = run.result.outcome, run.result.output, run.result.pending
        except TurnSuspendedError as error:
            return {
                **outcome,
                "status": "waiting",
                "cards": list(error.pending),
                "text": "",
                "error": "the session's earlier turn still waits for people: this message was "
                "not run.",
            }
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
        failed = next((e for e in reversed(events) if isinstance(e, RunFailed)), None)
        if ended == "completed":
            status = "completed"
        elif ended == "suspended":
            status = "proposed" if card is not None else "waiting"
        else:
            status = "failed"
        actions = outcome.pop("actions", None)
        outcome.update(
            status=status,
            cards=pending if ended == "suspended" else [],
            text=answer
            if isinstance(answer, str)
            else ""
            if answer is None
            else json.dumps(to_jsonable_python(answer), ensure_ascii=False),
        )
        if status == "failed":
            reason = failed.reason if failed is not None else ended
            detail = failed.error if failed is not None and failed.error else ""
            outcome["error"] = f"the turn failed ({reason}){f': {detail}' if detail else ''}"
        if actions is not None:
            outcome["actions"] = actions
        return outcome


# -- audit ----------------------------------------------------------------------------------

Org = Annotated[
    str,
    typer.Option(help="The organisation whose trail it is ('': sessions without one)."),
]
_PAGE = 1000


async def _audit_pages(
    store: SessionStore, org_id: str | None, *, after: int = 0, **filters: Any
) -> AsyncIterator[list[AuditEntry]]:
    """The organisation's entries after `after`, a page at a time (one page in memory)."""
    while page := await store.audit(org_id, after=after, limit=_PAGE, **filters):
        yield page
        if len(page) < _PAGE:
            return
        after = page[-1].seq


async def _audit_all(
    store: SessionStore,
    org_id: str | None,
    *,
    after: int = 0,
    limit: int | None = None,
    **filters: Any,
) -> list[AuditEntry]:
    """The organisation's entries after `after` (at most `limit`), read in pages."""
    found: list[AuditEntry] = []
    while limit is None or len(found) < limit:
        size = _PAGE if limit is None else min(_PAGE, limit - len(found))
        page = await store.audit(org_id, after=after, limit=size, **filters)
        found += page
        if len(page) < size:
            break
        after = page[-1].seq
    return found


async def _last_entry(store: SessionStore, org_id: str | None) -> AuditEntry | None:
    """The trail's last entry, found in a few reads (doubling, then halving `after`)."""
    if not await store.audit(org_id, limit=1):
        return None
    low, high = 0, 1  # an entry lies after `low`; find a `high` with none after it
    while await store.audit(org_id, after=high, limit=1):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if await store.audit(org_id, after=middle, limit=1):
            low = middle
        else:
            high = middle
    (last,) = await store.audit(org_id, after=low, limit=1)
    return last


def _keyring() -> dict[str, bytes]:
    """The keyring of HANDRAIL_AUDIT_KEY and HANDRAIL_AUDIT_OLD_KEYS (never the command line)."""
    keys = keyring_from_env()
    if not keys:
        typer.echo(
            f"Note: {AUDIT_KEY_ENV} is not set: keyed entries cannot be checked, and an unkeyed "
            f"trail proves nothing against someone who can write the store (docs/audit.md).",
            err=True,
        )
    return keys


@audit.command("list")
@_one_line_errors
def list_audit(
    org: Org,
    db: Db = Path("handrail.db"),
    dsn: Dsn = None,
    schema: Schema = "public",
    session: Annotated[str | None, typer.Option(help="Only this session's entries.")] = None,
    tool: Annotated[str | None, typer.Option(help="Only this tool's entries.")] = None,
    kind: Annotated[AuditKind | None, typer.Option(help="Only decisions, or only calls.")] = None,
    after: Annotated[int, typer.Option(min=0, help="Only entries after this one.")] = 0,
    limit: Annotated[int, typer.Option(min=1, help="At most this many.")] = 50,
    as_json: AsJson = False,
) -> None:
    """An organisation's audit entries, oldest first."""
    found = _with_store(
        db,
        dsn,
        schema,
        lambda store: _audit_all(
            store, org or None, after=after, limit=limit, session_id=session, tool=tool,
            kind=kind,
        ),
    )  # fmt: skip
    if as_json:
        typer.echo(json.dumps([e.to_json() for e in found], indent=2))
        return
    table = Table("seq", "when (UTC)", "kind", "session", "tool", "who", "what")
    for e in found:
        what = e.decision if e.kind == "decision" else e.outcome
        if e.amended_after:
            what = f"{what} (amended {', '.join(e.amended_after)})"
        table.add_row(
            str(e.seq), _when(e.at), e.kind, e.session_id, e.tool, e.who or "", what or ""
        )
    _out.print(table if found else "No audit entries.")


@audit.command("export")
@_one_line_errors
def export_audit(
    org: Org,
    db: Db = Path("handrail.db"),
    dsn: Dsn = None,
    schema: Schema = "public",
    after: Annotated[int, typer.Option(min=0, help="Only entries after this one.")] = 0,
) -> None:
    """An organisation's whole audit trail as JSON lines (one entry a line), oldest first.

    Written a page at a time as it is read: a trail of any length in the memory of a page.
    """

    async def export(store: SessionStore) -> None:
        out = sys.stdout
        async for page in _audit_pages(store, org or None, after=after):
            out.write("".join(json.dumps(e.to_json(), ensure_ascii=False) + "\n" for e in page))
        out.flush()

    _run(_opened(db, dsn, schema, export))


@audit.command("anchor")
@_one_line_errors
def anchor_audit(
    org: Org,
    db: Db = Path("handrail.db"),
    dsn: Dsn = None,
    schema: Schema = "public",
) -> None:
    """Print the trail's last entry as SEQ:HASH: an anchor, to keep away from the store.

    `handrail audit verify --anchor SEQ:HASH` then finds the entries up to it deleted or
    rewritten. With the entry's key in HANDRAIL_AUDIT_KEY (or _OLD_KEYS), the entry is
    checked first: a forged last entry is never anchored.
    """
    last = _with_store(db, dsn, schema, lambda store: _last_entry(store, org or None))
    if last is not None:
        keys = keyring_from_env()
        secret = keys.get(last.key_id) if last.key_id is not None else None
        if last.key_id is None:
            typer.echo(
                f"Note: entry {last.seq} is unkeyed: its anchor finds deleted entries, but not "
                f"a trail rewritten by someone who can write the store ({AUDIT_KEY_ENV}).",
                err=True,
            )
        elif secret is None:
            typer.echo(
                f"Note: entry {last.seq} was made with key {last.key_id!r}, which is not in "
                f"{AUDIT_KEY_ENV} or {AUDIT_OLD_KEYS_ENV}: it was not checked.",
                err=True,
            )
        elif entry_hash(last, secret) != last.hash:
            raise CliError(
                f"The last entry of {org!r} ({last.seq}) does not authenticate under key "
                f"{last.key_id!r}: it is not anchored. Run `handrail audit verify --org {org}`."
            )
    typer.echo(str(AuditAnchor.of(last)))


@audit.command("verify")
@_one_line_errors
def verify_audit(
    org: Org,
    db: Db = Path("handrail.db"),
    dsn: Dsn = None,
    schema: Schema = "public",
    anchor: Annotated[
        str | None,
        typer.Option(
            help="SEQ:HASH from `handrail audit anchor`, kept away from the store: the entries "
            "up to it must be there, unchanged (finds a deleted tail)."
        ),
    ] = None,
    strict: Annotated[
        bool,
        typer.Option("--strict", help="Fail on unkeyed entries too (a trail keyed throughout)."),
    ] = False,
) -> None:
    """Check the organisation's trail: exit 1 naming the first broken entry, if any.

    The keys come from HANDRAIL_AUDIT_KEY and HANDRAIL_AUDIT_OLD_KEYS (never the command
    line). Unkeyed entries (written before the store had a key) are reported, and pass
    unless --strict.
    """
    pinned = AuditAnchor.parse(anchor) if anchor is not None else None
    verifier = AuditVerifier(keys=_keyring(), anchor=pinned)

    async def check(store: SessionStore) -> None:
        async for page in _audit_pages(store, org or None):
            verifier.feed(page)

    _with_store(db, dsn, schema, check)
    problems = verifier.problems()
    errors = [p for p in problems if strict or p.severity == "error"]
    for problem in problems:
        label = problem.kind if problem in errors else f"{problem.kind} (warning)"
        typer.echo(f"entry {problem.seq}: {label}: {problem.message}", err=True)
    if errors:
        raise CliError(
            f"The audit trail of {org!r} is broken at entry {errors[0].seq} "
            f"({errors[0].kind}); {len(errors)} problem(s)."
        )
    unkeyed = verifier.count - verifier.keyed
    typer.echo(
        f"{verifier.count} entries verified ({verifier.keyed} keyed, {unkeyed} unkeyed)"
        f"{f', up to the anchor {pinned.seq}' if pinned is not None and pinned.seq else ''}; "
        f"the last is {verifier.last} (an anchor: keep it away from the store)."
    )


@audit.command("keygen")
@_one_line_errors
def keygen_audit(
    key_id: Annotated[
        str, typer.Option("--id", help="The key's id, recorded in every entry (2026-11, say).")
    ],
) -> None:
    """Print a new audit key as ID:SECRET, for HANDRAIL_AUDIT_KEY (keep it secret)."""
    typer.echo(AuditKey.generate(key_id).spec())


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

    with _err.status("Working on the store…"):
        return _run(run())


async def _opened(
    db: Path, dsn: str | None, schema: str, work: Callable[[SessionStore], Awaitable[T]]
) -> T:
    """`work` on the store, closed after (no spinner: for a command that writes as it reads)."""
    store = _store(db, dsn, schema)
    try:
        return await work(store)
    finally:
        await store.close()


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


async def _load(store: SessionStore, session_id: str) -> tuple[Any, RunState]:
    record = await store.load(session_id)
    if record is None:
        raise CliError(f"No session {session_id!r} in this store.")
    try:
        state = RunState.load(record.data, messages=record.messages, base=record.messages_from)
    except HandrailError as error:
        raise CliError(f"Session {session_id!r} cannot be read: {error}") from None
    return record, state


async def _page(
    store: SessionStore, session_id: str, before: int | None, limit: int
) -> tuple[Any, RunState, list[tuple[int, Message]]]:
    """The session and a page of its whole history (all of it is stored, loaded or not)."""
    record, state = await _load(store, session_id)
    try:
        rows = await store.messages(session_id, before=before, limit=limit)
        messages = MESSAGES.validate_python([m for _, m in rows])
        page = list(zip([p for p, _ in rows], messages, strict=True))
    except (HandrailError, ValidationError) as error:
        raise CliError(f"Session {session_id!r} cannot be read: {error}") from None
    return record, state, page


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
    limit: Annotated[
        int, typer.Option(min=1, help="Show at most this many messages, the latest.")
    ] = 50,
    before: Annotated[
        int | None,
        typer.Option(min=0, help="Show the messages before this position (an earlier page)."),
    ] = None,
) -> None:
    """A session's conversation (its latest messages, or earlier ones) and waiting calls."""
    record, state, page = _with_store(
        db, dsn, schema, lambda store: _page(store, session_id, before, limit)
    )
    earlier = page[0][0] if page and page[0][0] > 0 else None
    if as_json:
        document = {
            "id": record.id,
            "org_id": record.org_id,
            "user_id": record.user_id,
            "status": record.status,
            "messages": [to_jsonable_python(m) for _, m in page],
            "first": page[0][0] if page else 0,
            "earlier": earlier,
            "pending": to_jsonable_python(list(state.pending.values())),
            "failure": to_jsonable_python(state.failure),
            "context": to_jsonable_python(state.turn_context),
        }
        typer.echo(json.dumps(document, indent=2, ensure_ascii=False))
        return
    _out.print(
        f"[bold]{record.id}[/] · {record.org_id or '-'}/{record.user_id or '-'} · "
        f"{record.status} · updated {_when(record.updated_at)} UTC"
    )
    if state.turn_context is not None:  # where the latest turn stood: the page, the record
        context = json.dumps(to_jsonable_python(state.turn_context), ensure_ascii=False)
        _out.print(f"[dim]context:[/] {context}", highlight=False)
    if earlier is not None:
        _out.print(
            f"[dim]… {earlier} earlier message(s): --before {earlier} shows them[/]",
            highlight=False,
        )
    for _, message in page:
        for part in message.parts:
            if isinstance(part, TextPart) and not part.synthetic:
                if message.scratch:  # an agent's work out of the conversation
                    who = f"[dim]{message.agent or message.role} (scratch):[/]"
                else:
                    who = f"[bold]{message.role}:[/]"
                _out.print(f"{who} {part.text}", highlight=False)
            elif isinstance(part, ToolCallPart):
                _out.print(f"  [dim]tool[/] {part.name} · {part.status}", highlight=False)
    for card in state.pending.values():
        _out.print(
            f"[yellow]waiting ({card.kind}):[/] {card.tool_name} {json.dumps(card.args)} "
            f"· call {card.tool_call_id}",
            highlight=False,
        )
    failure = state.failure
    if failure is not None:
        _out.print(
            f"[red]the last turn failed:[/] {failure.error_type} · reference "
            f"{failure.reference} · {_when(failure.at)} UTC (the server's log has its "
            f"traceback under that reference)",
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
    as_json: Annotated[
        bool, typer.Option("--json", help="With -o: print what was written, as JSON.")
    ] = False,
) -> None:
    """Export a session with its logs as one JSON document."""
    document = _with_store(db, dsn, schema, lambda store: store.export(session_id))
    if output is None:
        typer.echo(document)  # JSON already
    else:
        output.write_text(document + "\n", encoding="utf-8")
        if as_json:
            typer.echo(json.dumps({"exported": session_id, "path": str(output)}))


@sessions.command("import")
@_one_line_errors
def import_(
    source: Annotated[str, typer.Argument(help="An exported session's file, or - for stdin.")],
    db: Db = Path("handrail.db"),
    dsn: Dsn = None,
    schema: Schema = "public",
    overwrite: Annotated[bool, typer.Option(help="Replace a session that exists.")] = False,
    as_json: AsJson = False,
) -> None:
    """Import an exported session (with its logs) into the store."""
    document = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    if not dsn and not db.exists():
        db.touch()  # importing may create the store
    record = _with_store(
        db, dsn, schema, lambda store: store.import_(document, overwrite=overwrite)
    )
    if as_json:
        typer.echo(json.dumps({"imported": record.id, "version": record.version}))
        return
    typer.echo(f"Imported session {record.id} (version {record.version}).", err=True)


@sessions.command()
@_one_line_errors
def delete(
    session_id: str,
    db: Db = Path("handrail.db"),
    dsn: Dsn = None,
    schema: Schema = "public",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    as_json: AsJson = False,
) -> None:
    """Delete a session with its logs."""
    if not yes:
        if as_json:
            raise CliError("--json asks nobody: pass --yes to delete.")
        typer.confirm(f"Delete session {session_id} and its logs?", abort=True)
    if not _with_store(db, dsn, schema, lambda store: store.delete(session_id)):
        raise CliError(f"No session {session_id!r} in this store.")
    if as_json:
        typer.echo(json.dumps({"deleted": session_id}))
        return
    typer.echo(f"Deleted session {session_id}.", err=True)
