"""Cards at a terminal: an approval card drawn with rich, and the questions that decide it.

Shared by `handrail chat` and `python -m handrail.demo`, so the two ask the same way:
approve (`y`), reject with a reason (`n`), or amend (`a`: each `amendable` field in turn; with
one amendable field, typing its new value is enough). A human tool's card (elicitation) is
answered field by field from its output schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .events import ApprovalRequired, InputRequired, ToolCallCompleted
from .messages import ApprovalCardPart
from .suspension import Answer, Approve, Decision, Reject, card_state

__all__ = ["Ask", "approval_card", "ask_answer", "ask_decision", "card_name", "outcome_line"]

Ask = Callable[[str], str]
"""Asks the person at the terminal a question (rich markup allowed) and returns the answer;
raises `EOFError` when nobody can answer (`Console.input` does)."""

Card = ApprovalRequired | InputRequired | ApprovalCardPart
"""A card as streamed (an event) or as stored (a pending part of the session)."""

_YES = ("", "y", "yes")
_NO = ("n", "no")
_AMEND = ("a", "amend")


def card_name(card: Card) -> str:
    """The tool the card is about."""
    return card.tool_name if isinstance(card, ApprovalCardPart) else card.name


def _amendable(card: Card) -> list[str]:
    return [] if isinstance(card, InputRequired) else list(card.amendable)


def _now(card: Card) -> tuple[dict[str, Any], str | None]:
    """The arguments the call runs with if approved now, and their digest (None: unknown)."""
    if isinstance(card, ApprovalCardPart):
        stands = card_state(card)
        return stands.args, stands.digest
    if isinstance(card, ApprovalRequired):
        return card.args, card.digest
    return card.args, None


def approval_card(card: Card) -> Panel:
    """The card of a call that waits for a person: the tool, its arguments, what may change."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_column(style="yellow")
    amendable = _amendable(card)
    args, _ = _now(card)
    for name, value in args.items():
        shown = value if isinstance(value, str) else _json(value)
        table.add_row(name, shown, "✎ amendable" if name in amendable else "")
    standing: list[Text] = []
    if isinstance(card, ApprovalCardPart):
        stands = card_state(card)
        if stands.changes:
            changed = ", ".join(
                f"{k} {_json(c.proposed)} → {_json(c.now)}" for k, c in stands.changes.items()
            )
            standing.append(Text(f"changed from the agent's proposal: {changed}", "yellow"))
        if card.approvals:
            who = ", ".join(stands.approved_by) or "nobody yet"
            standing.append(Text(f"approved with these arguments by: {who}", "dim"))
    asking = isinstance(card, InputRequired) or (
        isinstance(card, ApprovalCardPart) and card.kind == "elicitation"
    )
    default = "Answer for this call?" if asking else "Approve this call?"
    footer = (
        f"call {card.tool_call_id}"
        if asking
        else f"amendable fields: {', '.join(amendable) or 'none'} · call {card.tool_call_id}"
    )
    body = Group(
        Text(card.prompt or default, style="bold"),
        Text(),
        table,
        *standing,
        Text(),
        Text(footer, style="dim"),
    )
    title = "Answer required" if asking else "Approval required"
    return Panel(
        body,
        title=f"{title} · {card_name(card)}",
        title_align="left",
        border_style="yellow",
        expand=False,
    )


def ask_decision(
    card: Card, ask: Ask, *, question: str | None = None, by: str | None = None
) -> Decision | None:
    """Ask for the decision on an approval card; None when nobody answers (end of input).

    Args:
        card: the card.
        ask: asks the person a question.
        question: the first question (default: approve / reject / amend, in general terms).
        by: who decides (recorded with the decision).
    """
    amendable = _amendable(card)
    args, digest = _now(card)  # every decision names the arguments it was made on
    if question is None:
        question = f"{card.prompt or f'Approve {card_name(card)}?'} [bold]y[/]es / [bold]n[/]o"
        if len(amendable) == 1:
            question += f" / [bold]a[/]mend, or type a new {amendable[0]}"
        elif amendable:
            question += " / [bold]a[/]mend"
        question += ": "
    while True:
        try:
            answer = ask(question).strip()
        except EOFError:
            return None
        if answer.lower() in _YES:
            return Approve(by=by, digest=digest)
        if answer.lower() in _NO:
            try:
                reason = ask("Why (the agent is told)? ").strip()
            except EOFError:
                reason = ""
            return Reject(reason=reason or None, by=by, digest=digest)
        if answer.lower() in _AMEND and amendable:
            amended = _amend(args, amendable, ask)
            if amended is None:
                return None
            return Approve(amended_args=amended or None, by=by, digest=digest)
        if len(amendable) == 1:
            field = amendable[0]
            try:
                return Approve(
                    amended_args={field: _coerce(answer, current=args.get(field))},
                    by=by,
                    digest=digest,
                )
            except ValueError:
                continue


def _amend(args: dict[str, Any], fields: list[str], ask: Ask) -> dict[str, Any] | None:
    """New values for `fields` of `args`, asked one by one (an empty answer keeps the value)."""
    amended: dict[str, Any] = {}
    for field in fields:
        current = args.get(field)
        while True:
            try:
                answer = ask(f"{field} [{_json(current)}]: ").strip()
            except EOFError:
                return None
            if not answer:
                break
            try:
                amended[field] = _coerce(answer, current=current)
            except ValueError:
                continue
            break
    return amended


def ask_answer(
    card: Card, ask: Ask, *, output_schema: dict[str, Any] | None = None, by: str | None = None
) -> Decision | None:
    """Ask for the answer to a human tool's card, field by field; None when nobody answers.

    Args:
        card: the card (`InputRequired` carries the tool's output schema).
        ask: asks the person a question.
        output_schema: the answer's JSON Schema, when the card does not carry it.
        by: who answers.
    """
    schema = output_schema
    if schema is None and isinstance(card, InputRequired):
        schema = card.output_schema
    properties: dict[str, Any] = (schema or {}).get("properties") or {}
    try:
        if not properties:
            while True:
                answer = ask(f"{card.prompt or 'Your answer'}: ").strip()
                try:
                    return Answer(output=_coerce(answer, schema=schema), by=by)
                except ValueError:
                    continue
        required = set((schema or {}).get("required", ()))
        output: dict[str, Any] = {}
        for field, spec in properties.items():
            label = spec.get("title") or field
            kind = spec.get("type", "")
            hint = f" ({kind})" if isinstance(kind, str) and kind else ""
            while True:
                answer = ask(f"{label}{hint}: ").strip()
                if not answer and field not in required:
                    break
                try:
                    output[field] = _coerce(answer, schema=spec)
                except ValueError:
                    continue
                break
        return Answer(output=output, by=by)
    except EOFError:
        return None


def _coerce(text: str, *, current: Any = None, schema: dict[str, Any] | None = None) -> Any:
    """`text` as the type the schema (or else the current value) has; ValueError if it cannot."""
    kind = (schema or {}).get("type")
    if kind is None and current is not None:
        kind = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(type(current))
    if kind == "string":
        return text
    if kind == "boolean":
        if text.lower() in ("y", "yes", "true", "1"):
            return True
        if text.lower() in ("n", "no", "false", "0"):
            return False
        raise ValueError(text)
    if kind in ("number", "integer"):
        value = float(text.lstrip("€$£").replace(",", ""))
        if kind == "integer":
            if not value.is_integer():
                raise ValueError(text)
            return int(value)
        return value
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        if kind is None:
            return text
        raise ValueError(text) from None


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _digest_item(key: str, value: Any) -> str:
    """One item of a digest; a documents answer's citations as their sources."""
    if key == "citations" and isinstance(value, list):
        where = [
            f"{c.get('source')}" + (f" p. {c['page']}" if c.get("page") else "")
            for c in value
            if isinstance(c, dict)
        ]
        return f"sources {', '.join(where)}" if where else "no sources"
    return f"{key} {value}"


def outcome_line(done: ToolCallCompleted) -> str:
    """A finished call in a few words: its digest, else its summary, or what went wrong.

    A reused read (`reused_from`) says it was not run again.
    """
    if done.status == "rejected":
        return done.summary or "rejected"
    if not done.ok:
        return done.error or "failed"
    if isinstance(done.digest, dict):
        line = " · ".join(_digest_item(k, v) for k, v in done.digest.items())
    elif done.digest is not None:
        line = _json(done.digest)
    else:
        line = done.summary or "done"
    return f"{line} (reused, not run again)" if done.reused_from else line
