"""The `handrail` command: serve an engine over HTTP, and look after stored sessions.

```
HANDRAIL_API_KEYS="acme:ana:$KEY" handrail serve myapp:engine --port 8000
handrail sessions list --db handrail.db --json
handrail sessions show SESSION_ID
handrail sessions export SESSION_ID > session.json
handrail sessions import session.json --overwrite
handrail sessions delete SESSION_ID --yes
handrail audit verify --org acme --anchor 41:9f2c...
```

It needs the `server` extra (`pip install "handrail[server]"`). An error prints one line and
exits with status 1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

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

from ._logs import LogFormat, configure_logging
from ._loop import AgentRun
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
    HandrailError,
    SessionNotFoundError,
    TurnCutOffError,
    TurnSuspendedError,
)
from .messages import MESSAGES, ApprovalCardPart, Message, TextPart, ToolCallPart
from .state import RunState
from .store import SessionStatus, SessionStore
from .suspension import Decision

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


@app.command()
@_one_line_errors
def serve(
    target: Annotated[str, typer.Argument(help="The engine, as module:attribute (or a factory).")],
    host: Annotated[str, typer.Option(help="The interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="The port to listen on.")] = 8000,
    api_keys_file: Annotated[
        Path | None,
        typer.Option(
            help="A file of API keys, one a line (ORG:USER:KEY, or id=ID,org=ORG,user=USER,"
            "roles=R1+R2,expires=2027-01-31,key=KEY; blank lines and # comments skipped), read "
            "again when it changes and on SIGHUP (an invalid one keeps the keys in use). "
            "Or set HANDRAIL_API_KEYS (space-separated). Keys are never taken from the "
            "command line, where every user of the machine reads them (ps, /proc). Without "
            "any key, one is made for this run and printed."
        ),
    ] = None,
    max_body_size: Annotated[int, typer.Option(help="Bytes a request body may have.")] = 1_000_000,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "info",
    log_format: Annotated[
        LogFormat,
        typer.Option(
            help="text: uvicorn's lines; json: one JSON object a line on stderr, for log "
            "shippers (time, level, logger, message, and the fields a record carries: "
            "reference, session_id, call_id, tool, request_id; error_type and traceback "
            "for a failure)."
        ),
    ] = "text",
    shutdown_grace: Annotated[
        float,
        typer.Option(
            help="At shutdown, seconds running turns get to stop (they are interrupted and "
            "saved), then streams to send what is left (clients reconnect with Last-Event-ID)."
        ),
    ] = 5.0,
    sweep_interval: Annotated[
        float,
        typer.Option(
            help="Seconds between sweeps: expired cards, turns whose worker died, decided "
            "turns nobody resumed (0: no sweeps; run a handrail Worker elsewhere).",
            min=0,
        ),
    ] = 1.0,
    retention_days: Annotated[
        float | None,
        typer.Option(
            help="Delete finished sessions nobody touched for this many days (default: keep).",
            min=0,
        ),
    ] = None,
    rate: Annotated[
        float, typer.Option(help="Requests a second per key, on average (0: no limit).", min=0)
    ] = 50.0,
    burst: Annotated[int, typer.Option(help="Requests per key at once.", min=1)] = 100,
    streams: Annotated[
        int, typer.Option(help="Open event streams per organisation (0: no limit).", min=0)
    ] = 100,
    turns: Annotated[
        int, typer.Option(help="Running turns per organisation (0: no limit).", min=0)
    ] = 100,
    stream_bytes: Annotated[
        float,
        typer.Option(
            help="Bytes a second an organisation's event streams may send (0: no limit).", min=0
        ),
    ] = 4_000_000.0,
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
    poll_interval: Annotated[
        float | None,
        typer.Option(
            help="Seconds of quiet after which an event stream reads the log again, a safety "
            "net: events reach streams as notices (default: 60 on PostgreSQL, whose notices "
            "cross processes; 1 otherwise).",
            min=0.01,
        ),
    ] = None,
    audit_roles: Annotated[
        str,
        typer.Option(
            help="The roles that may read the audit trail over HTTP (GET /audit), "
            "comma-separated: a caller needs one; '*': every member of the organisation."
        ),
    ] = "auditor",
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
    """Serve an engine's HTTP API (and its web page) with uvicorn."""
    from .server import authenticator_from, serve_workers
    from .server import serve as serve_app

    if log_format == "json":  # what loading the app logs is one object a line too
        configure_logging(log_format)
    engine = load_engine(target)
    if workers > 1:
        _check_shared(engine, workers)
    specs = os.environ.get("HANDRAIL_API_KEYS", "").split()
    readers = None if audit_roles.strip() == "*" else _roles(audit_roles)
    # Read once here: a malformed spec, or a key given twice, stops the server before it starts.
    if not len(authenticator_from(specs, api_keys_file)):
        from .server import ApiKeyAuthenticator

        key = ApiKeyAuthenticator.generate_key()
        # The run's own key is its operator's: it may read the audit trail too.
        roles = "+".join(sorted(readers or ()))
        specs.append(f"id=local,org=local,user=local,roles={roles},key={key}")
        typer.echo(
            f"No API key configured (HANDRAIL_API_KEYS, --api-keys-file): this run accepts "
            f"`Authorization: Bearer {key}` "
            f"(org 'local', user 'local'{f', roles {roles}' if roles else ''}).",
            err=True,
        )
        where = f"[{host}]" if ":" in host else "127.0.0.1" if host == "0.0.0.0" else host
        typer.echo(f"Open the web page: http://{where}:{port}/#key={key}", err=True)
    options = _AppOptions(
        target=target,
        specs=specs,
        keys_file=api_keys_file,
        max_body_size=max_body_size,
        shutdown_grace=shutdown_grace,
        sweep_interval=sweep_interval,
        retention=retention_days * 86_400 if retention_days else None,
        poll_interval=poll_interval,
        limits=(rate or None, burst, streams or None, turns or None, stream_bytes or None),
        audit_roles=readers,
    )
    settings: dict[str, Any] = {
        "host": host,
        "port": port,
        "shutdown_grace": shutdown_grace,
        "log_level": log_level,
        "log_format": log_format,
        "header_timeout": header_timeout,
        "body_timeout": body_timeout,
        "idle_timeout": idle_timeout,
        "max_connections": max_connections or None,
        "max_client_connections": max_client_connections or None,
    }
    if workers > 1:
        serve_workers(functools.partial(_worker_app, options), workers, **settings)
        return
    serve_app(_make_app(engine, options, authenticator_from(specs, api_keys_file)), **settings)


@dataclasses.dataclass(kw_only=True, slots=True)
class _AppOptions:
    """What `serve` makes its app with, sent to each worker process (so picklable)."""

    target: str
    specs: list[str]
    keys_file: Path | None
    max_body_size: int
    shutdown_grace: float
    sweep_interval: float
    retention: float | None
    poll_interval: float | None
    limits: tuple[float | None, int, int | None, int | None, float | None]
    audit_roles: frozenset[str] | None


def _roles(text: str) -> frozenset[str]:
    """`--audit-roles`: comma-separated role names."""
    roles = frozenset(r.strip() for r in text.split(",") if r.strip())
    if not roles:
        raise CliError("--audit-roles needs a role (auditor,compliance), or '*' for everyone.")
    return roles


def _make_app(engine: Engine, options: _AppOptions, authenticator: Any) -> Any:
    from .server import Limits, create_app

    rate, burst, streams, turns, stream_bytes = options.limits
    return create_app(
        engine,
        authenticator=authenticator,
        max_body_size=options.max_body_size,
        shutdown_grace=options.shutdown_grace,
        sweep_interval=options.sweep_interval or None,
        retention=options.retention,
        poll_interval=options.poll_interval,
        limits=Limits(
            rate=rate, burst=burst, streams=streams, turns=turns, stream_bytes=stream_bytes
        ),
        audit_roles=options.audit_roles,
    )


def _worker_app(options: _AppOptions, index: int) -> Any:
    """The app of worker process `index` of `serve --workers`: its own engine and worker id.

    The id is `HANDRAIL_WORKER_ID` (default: the host name) and the index, the same for the
    worker started again after it died, so that it takes its turns back at once.
    """
    from .server import authenticator_from, name_worker

    engine = load_engine(options.target)
    base = os.environ.get("HANDRAIL_WORKER_ID") or socket.gethostname()
    name_worker(engine, f"{base}-{index}")
    return _make_app(engine, options, authenticator_from(options.specs, options.keys_file))


def _check_shared(engine: Engine, workers: int) -> None:
    """Refuse a store the worker processes cannot share; say what holds with SQLite."""
    from .store import MemoryStore, SqliteStore

    store = engine.store
    if isinstance(store, MemoryStore):
        raise CliError(
            f"--workers {workers} needs a store the processes share, and the engine's is a "
            f"MemoryStore: each process would keep sessions of its own, and a request landing "
            f"on another process would not find them. Give the engine a PostgresStore (or a "
            f"SqliteStore, on one machine), or run one worker."
        )
    if isinstance(store, SqliteStore):
        typer.echo(
            f"Note: {workers} processes share the SQLite file {store.path} (this machine "
            f"only): writes take turns on its lock, and each process finds the others' events "
            f"and wake-ups by polling (streams every second, workers every "
            f"{store.poll_interval:g} s). For pushed events and many machines, use PostgreSQL.",
            err=True,
        )


def load_engine(target: str) -> Engine:
    """The engine named by `module:attribute` (called first if it is a factory)."""
    from .server import load_engine as load

    return load(target)


# -- chat -----------------------------------------------------------------------------------


@app.command()
@_one_line_errors
def chat(
    target: Annotated[str, typer.Argument(help="The engine, as module:attribute (or a factory).")],
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
    db: Annotated[
        Path | None, typer.Option(help="Keep the sessions in this SQLite file (over the engine's).")
    ] = None,
    dsn: Dsn = None,
    schema: Schema = "public",
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
    """Chat with an engine in the terminal: stream the replies, decide the calls it proposes.

    Each line you type is a turn. When a turn waits for a decision, each card is shown and you
    approve (y), reject with a reason (n) or amend (a) it; the turn then resumes. End with an
    empty line, Ctrl-D or /quit.
    """
    if approve_all and reject_all:
        raise CliError("Pass --approve-all or --reject-all, not both.")
    with _err.status(f"Loading {target}…"):
        engine = load_engine(target)
    if dsn:
        engine.store = _store(Path(), dsn, schema)
    elif db is not None:
        from .store import SqliteStore

        engine.store = SqliteStore(db)
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
        own_store=bool(dsn) or db is not None,
    )
    try:
        _run(chat_.run(message))
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
    ) -> None:
        self.engine = engine
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
            run = self.engine.submit(
                self.session_id, text, org_id=self.org_id, user_id=self.user_id, route=self.route
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
            decisions: dict[str, Decision] = {}
            for card in cards:
                self.view.card(card)
                decision = self._decide(card)
                self.view.decided(card, decision)
                decisions[card.tool_call_id] = decision
            resolution = await self.engine.resolve_many(
                self.session_id, decisions, org_id=self.org_id, user_id=self.user_id
            )
            if not resolution.ready:
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
        }
        typer.echo(json.dumps(document, indent=2, ensure_ascii=False))
        return
    _out.print(
        f"[bold]{record.id}[/] · {record.org_id or '-'}/{record.user_id or '-'} · "
        f"{record.status} · updated {_when(record.updated_at)} UTC"
    )
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
