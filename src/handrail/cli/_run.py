"""`handrail run`: one turn of an app, then exit, for a cron job or a timer.

Exit status: 0 the turn completed (or, with --propose, its actions wait on a batch card); 3
it waits for people; 1 it failed; 2 bad usage (docs/scheduling.md).
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Annotated, Any, NoReturn

import typer
from pydantic_core import to_jsonable_python

from .._random import token_hex
from ..config import Settings
from ..events import RunFailed
from ..exceptions import HandrailError, TurnSuspendedError
from ..store import MemoryStore
from ._common import CliError, cli_message, one_line_errors, run
from ._open import opened_app
from ._options import AppInProcess, Dsn, OverDb, Schema

__all__ = ["EXIT_WAITING", "run_turn"]

EXIT_WAITING = 3
"""`handrail run`'s exit status when the turn waits for people (a card to decide)."""


@one_line_errors
def run_turn(
    target: AppInProcess,
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
        settings = Settings.resolve({"db": db, "dsn": dsn, "schema": schema})
        outcome = run(
            _one_turn(target, session_id, text, org, user, route, headless, propose, settings)
        )
    except (CliError, HandrailError, ImportError, OSError, ValueError) as error:
        if as_json:  # a script reads what went wrong on stdout too; the error line follows
            failed = {"session": session_id, "status": "failed", "cards": [], "text": ""}
            typer.echo(json.dumps({**failed, "error": cli_message(error)}, ensure_ascii=False))
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
    settings: Settings,
) -> dict[str, Any]:
    """`handrail run`: one turn of the app, as the JSON object `--json` prints."""
    loop = asyncio.get_running_loop()
    async with opened_app(target, settings, named=False) as engine:
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
