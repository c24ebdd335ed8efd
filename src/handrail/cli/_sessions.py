"""`handrail sessions`: list, show, export, import and delete stored sessions."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from pydantic_core import to_jsonable_python
from rich.table import Table

from ..exceptions import HandrailError
from ..messages import MESSAGES, Message, TextPart, ToolCallPart
from ..state import RunState
from ..store import SessionStatus, SessionStore
from ._common import CliError, one_line_errors, out, when
from ._open import with_store
from ._options import STORE_FILE, AsJson, Db, Dsn, Schema

__all__ = ["delete", "export", "import_", "list_sessions", "sessions", "show"]

sessions = typer.Typer(
    help="List, show, export, import and delete stored sessions.", no_args_is_help=True
)


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


@sessions.command("list")
@one_line_errors
def list_sessions(
    db: Db = STORE_FILE,
    dsn: Dsn = None,
    schema: Schema = "public",
    org: Annotated[str | None, typer.Option(help="Only this organisation's.")] = None,
    user: Annotated[str | None, typer.Option(help="Only this user's.")] = None,
    status: Annotated[SessionStatus | None, typer.Option(help="Only in this status.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 50,
    as_json: AsJson = False,
) -> None:
    """The stored sessions, most recently updated first."""
    found = with_store(
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
        table.add_row(s.id, s.org_id or "", s.user_id or "", s.status, when(s.updated_at))
    out.print(table if found else "No sessions.")


@sessions.command()
@one_line_errors
def show(
    session_id: str,
    db: Db = STORE_FILE,
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
    record, state, page = with_store(
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
    out.print(
        f"[bold]{record.id}[/] · {record.org_id or '-'}/{record.user_id or '-'} · "
        f"{record.status} · updated {when(record.updated_at)} UTC"
    )
    if state.turn_context is not None:  # where the latest turn stood: the page, the record
        context = json.dumps(to_jsonable_python(state.turn_context), ensure_ascii=False)
        out.print(f"[dim]context:[/] {context}", highlight=False)
    if earlier is not None:
        out.print(
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
                out.print(f"{who} {part.text}", highlight=False)
            elif isinstance(part, ToolCallPart):
                out.print(f"  [dim]tool[/] {part.name} · {part.status}", highlight=False)
    for card in state.pending.values():
        out.print(
            f"[yellow]waiting ({card.kind}):[/] {card.tool_name} {json.dumps(card.args)} "
            f"· call {card.tool_call_id}",
            highlight=False,
        )
    failure = state.failure
    if failure is not None:
        out.print(
            f"[red]the last turn failed:[/] {failure.error_type} · reference "
            f"{failure.reference} · {when(failure.at)} UTC (the server's log has its "
            f"traceback under that reference)",
            highlight=False,
        )


@sessions.command()
@one_line_errors
def export(
    session_id: str,
    db: Db = STORE_FILE,
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
    document = with_store(db, dsn, schema, lambda store: store.export(session_id))
    if output is None:
        typer.echo(document)  # JSON already
    else:
        output.write_text(document + "\n", encoding="utf-8")
        if as_json:
            typer.echo(json.dumps({"exported": session_id, "path": str(output)}))


@sessions.command("import")
@one_line_errors
def import_(
    source: Annotated[str, typer.Argument(help="An exported session's file, or - for stdin.")],
    db: Db = STORE_FILE,
    dsn: Dsn = None,
    schema: Schema = "public",
    overwrite: Annotated[bool, typer.Option(help="Replace a session that exists.")] = False,
    as_json: AsJson = False,
) -> None:
    """Import an exported session (with its logs) into the store."""
    document = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    if not dsn and not db.exists():
        db.touch()  # importing may create the store
    record = with_store(db, dsn, schema, lambda store: store.import_(document, overwrite=overwrite))
    if as_json:
        typer.echo(json.dumps({"imported": record.id, "version": record.version}))
        return
    typer.echo(f"Imported session {record.id} (version {record.version}).", err=True)


@sessions.command()
@one_line_errors
def delete(
    session_id: str,
    db: Db = STORE_FILE,
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
    if not with_store(db, dsn, schema, lambda store: store.delete(session_id)):
        raise CliError(f"No session {session_id!r} in this store.")
    if as_json:
        typer.echo(json.dumps({"deleted": session_id}))
        return
    typer.echo(f"Deleted session {session_id}.", err=True)
