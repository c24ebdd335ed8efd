"""The inbox index's rows: a session's waiting cards, from its state or from its stored form.

The engine gives a save the cards of the state it saves (`waiting_cards`, as
`SessionRecord.cards`); a store derives them from a stored session where no engine saved it
(`stored_cards`: an import, and the migration that builds the index for an existing store).
Both read `RunState.pending`, so they are the same cards by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter

from ..messages import ApprovalCardPart
from ..state import RunState
from ._base import SessionSummary, WaitingCard, WaitingRow
from ._codec import check_page, decode, encode

__all__ = [
    "CARD",
    "COLUMNS",
    "card_rows",
    "card_text",
    "check_waiting",
    "read_card",
    "row_of",
    "stored_cards",
    "waiting_cards",
    "waiting_query",
]

CARD: TypeAdapter[ApprovalCardPart] = TypeAdapter(ApprovalCardPart)
"""A card to and from its JSON form (`WaitingCard.card`)."""


def waiting_cards(state: RunState) -> list[WaitingCard]:
    """The calls of `state` that wait for a decision, in the order they were raised."""
    agent = state.progress.agent if state.progress is not None else None
    return [
        WaitingCard(
            tool_call_id=call_id,
            tool=card.tool_name,
            kind=card.kind,
            agent=agent,
            created_at=card.created_at,
            card=CARD.dump_python(card, mode="json"),
        )
        for call_id, card in state.pending.items()
    ]


def stored_cards(
    data: dict[str, Any], messages: list[dict[str, Any]], base: int
) -> list[WaitingCard]:
    """The waiting cards of a stored session: its document, and its messages from `base` on.

    A session that cannot be read as a state has none (the inbox could not show it either).
    """
    try:
        state = RunState.load(data, messages=messages, base=base)
    except Exception:
        return []
    return waiting_cards(state)


def card_text(session_id: str, card: WaitingCard) -> str:
    """The card's JSON text, as a store keeps it (a `StoreError` if JSON cannot carry it)."""
    return encode(session_id, card.card, what="waiting card")


def read_card(
    session_id: str,
    tool_call_id: str,
    tool: str,
    kind: str,
    agent: str | None,
    created_at: float | None,
    text: str | bytes,
) -> WaitingCard:
    """A `WaitingCard` from its stored columns."""
    return WaitingCard(
        tool_call_id=tool_call_id,
        tool=tool,
        kind=kind,
        agent=agent,
        created_at=created_at,
        card=decode(session_id, text),
    )


def check_waiting(limit: int) -> None:
    """`SessionStore.waiting`'s arguments, checked alike by every store."""
    check_page(limit, 0)


COLUMNS = (
    "session_id, org_id, user_id, version, session_created_at, updated_at, expires_at, "
    "position, tool_call_id, tool, kind, agent, created_at, card"
)
"""The inbox index's columns (`handrail_cards`), in the order a row is written and read."""


def card_rows(
    summary: SessionSummary, cards: Sequence[WaitingCard], texts: Sequence[str]
) -> list[tuple[Any, ...]]:
    """The index rows of a session's cards (`COLUMNS`), `texts` their `card_text`s."""
    return [
        (
            summary.id,
            summary.org_id,
            summary.user_id,
            summary.version,
            summary.created_at,
            summary.updated_at,
            summary.expires_at,
            position,
            card.tool_call_id,
            card.tool,
            card.kind,
            card.agent,
            card.created_at,
            text,
        )
        for position, (card, text) in enumerate(zip(cards, texts, strict=True))
    ]


def row_of(row: Sequence[Any]) -> WaitingRow:
    """A `WaitingRow` from an index row read as `COLUMNS`."""
    session_id = row[0]
    return WaitingRow(
        session=SessionSummary(
            id=session_id,
            org_id=row[1],
            user_id=row[2],
            status="suspended",
            version=row[3],
            created_at=row[4],
            updated_at=row[5],
            expires_at=row[6],
        ),
        position=row[7],
        card=read_card(session_id, row[8], row[9], row[10], row[11], row[12], row[13]),
    )


def waiting_query(
    table: str,
    mark: str,
    *,
    org_id: str | None,
    after: tuple[float, str, int] | None,
    limit: int,
    tool: str | None,
    kind: str | None,
    session_id: str | None,
    raised_before: float | None,
    raised_after: float | None,
    reach: tuple[str | None, frozenset[str]] | None,
    exclude_user: str | None,
) -> tuple[str, list[Any]]:
    """`SessionStore.waiting` as one SQL query over `table`, `mark` the placeholder (? or %s).

    The order (updated_at, session_id descending; position ascending) is that of the index
    `(org_id, updated_at DESC, session_id DESC, position)`: the page is read off it, and the
    keyset bound starts with `updated_at <= ?` so that it is a range of the index too.
    """
    where: list[str] = []
    params: list[Any] = []

    def add(sql: str, *values: Any) -> None:
        where.append(sql.replace("?", mark))
        params.extend(values)

    if org_id is not None:
        add("org_id = ?", org_id)
    if session_id is not None:
        add("session_id = ?", session_id)
    if tool is not None:
        add("tool = ?", tool)
    if kind is not None:
        add("kind = ?", kind)
    if raised_before is not None:
        add("created_at <= ?", raised_before)
    if raised_after is not None:
        add("created_at > ?", raised_after)
    if exclude_user is not None:
        add("(user_id IS NULL OR user_id <> ?)", exclude_user)
    if reach is not None:
        user, tools = reach
        alternatives = ["kind = 'batch'", "user_id IS NULL"]
        values: list[Any] = []
        if user is not None:
            alternatives.append("user_id = ?")
            values.append(user)
        if tools:
            alternatives.append(f"tool IN ({', '.join('?' * len(tools))})")
            values.extend(sorted(tools))
        add(f"({' OR '.join(alternatives)})", *values)
    if after is not None:
        at, sid, position = after
        add(
            "updated_at <= ? AND (updated_at < ? OR session_id < ? "
            "OR (session_id = ? AND position > ?))",
            at,
            at,
            sid,
            sid,
            position,
        )
    sql = (
        f"SELECT {COLUMNS} FROM {table}"
        f"{' WHERE ' + ' AND '.join(where) if where else ''}"
        f" ORDER BY updated_at DESC, session_id DESC, position LIMIT {mark}"
    )
    return sql, [*params, limit]
