"""`handrail chat`: chat with an application in the terminal, deciding the calls it proposes."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from .._loop import AgentRun
from .._random import token_hex
from ..config import Settings
from ..engine import Engine
from ..events import InputRequired
from ..exceptions import DecisionNotAllowedError, SessionNotFoundError
from ..gate import TurnRequest
from ..messages import ApprovalCardPart
from ..policy import Decider
from ..suspension import Decision
from ._chat_view import ChatView, JsonView
from ._common import CliError, err, one_line_errors, out, run
from ._open import imported_app, opened_app
from ._options import App, DbFlag, DsnFlag, SchemaFlag

__all__ = ["ChatRefused", "chat"]


class ChatRefused(Exception):
    """`handrail chat`: the policy refused the terminal's decisions; the turn waits for others."""

    def __init__(self, session_id: str, calls: list[str]) -> None:
        super().__init__(
            f"Session {session_id!r} waits for decisions on {', '.join(calls)} that the "
            f"tools' policies do not let you make (nothing was recorded for them): someone "
            f"they allow decides them (on `handrail serve`: GET /pending, then POST "
            f"/sessions/{session_id}/resolve); the turn resumes once none is left."
        )


@one_line_errors
def chat(
    target: App,
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
    db: DbFlag = None,
    dsn: DsnFlag = None,
    schema: SchemaFlag = None,
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
    imported_app(target)  # a name that is no app fails here, in one line

    async def talk() -> None:
        status = err.status(f"Opening {target}…")
        status.start()
        async with contextlib.AsyncExitStack() as opened:
            try:  # with the --db/--dsn store and the worker id the settings name, if any
                engine = await opened.enter_async_context(opened_app(target, settings))
            finally:
                status.stop()
            preset = "approve" if approve_all else "reject" if reject_all else None
            supervisor = engine.domain.supervisor
            view = (
                JsonView()
                if as_json
                else ChatView(out, supervisor=None if supervisor is None else supervisor.name)
            )
            chat_ = _Chat(
                engine,
                session or f"chat-{token_hex(4)}",
                org_id=org,
                user_id=user,
                route=route,
                view=view,
                preset=preset,
                ask=None if (as_json or message) else out.input,
                roles=held,
            )
            await chat_.run(message)

    try:
        run(talk())
    except ChatRefused as waiting:
        typer.echo(str(waiting), err=True)  # the refusals were shown: this is not an error
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err.print("[dim]Stopped.[/]")
        raise typer.Exit(130) from None


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
        view: ChatView | JsonView,
        preset: str | None,
        ask: Callable[[str], str] | None,
        roles: frozenset[str] = frozenset(),
    ) -> None:
        self.engine = engine
        self.roles = roles
        self.decider = Decider(user_id=user_id or "cli", roles=roles, org_id=org_id)
        """The person at the terminal, as the decision policies see them."""
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

    async def _run(self, messages: list[str] | None) -> None:
        if isinstance(self.view, ChatView):
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
        from .._cards import ask_answer, ask_decision
        from ..suspension import Approve, Reject

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
