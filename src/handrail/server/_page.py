"""What the web page reads besides the session API: titles, outcomes, the trail's check.

`create_app`'s endpoints (`_app.py`) call these: `GET /sessions` names each session by its
first user message (`Titles`), `GET /sessions/{id}/calls/{call_id}` tells whoever decided a
call what came of it (`call_outcome`), `GET /audit/verify` checks the organisation's trail as
`handrail audit verify` does (`verify_trail`).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

from ..audit import AuditKey, AuditVerifier, keyring_from_env
from ..messages import ApprovalCardPart, Message, ToolCallPart
from ..state import RunState
from ..store import SessionStatus, SessionStore
from ..suspension import card_state
from ._bodies import AuditVerifyBody, CallOutcomeBody

__all__ = ["Titles", "call_outcome", "deciders", "verify_trail"]

TITLE_LENGTH = 80
"""Characters of a title at most (a longer first message is cut, with an ellipsis)."""
_TITLE_SCAN = 4
"""The first messages of a session looked at for its title (a system message, a synthetic
note may come before the person's first)."""
_PAGE = 1000
"""Audit entries read at once while verifying."""
_FINAL = frozenset({"completed", "failed", "rejected", "interrupted"})


def title_of(messages: Iterable[dict[str, Any]]) -> str | None:
    """The first user message's text (not the engine's own notes), on one line, trimmed."""
    for message in messages:
        if message.get("role") != "user":
            continue
        texts = [p for p in message.get("parts", ()) if p.get("type") == "text"]
        if not texts or all(p.get("synthetic") for p in texts):
            continue
        text = " ".join("".join(str(p.get("text", "")) for p in texts).split())
        if text:
            return text if len(text) <= TITLE_LENGTH else text[: TITLE_LENGTH - 1].rstrip() + "…"
    return None


class Titles:
    """Sessions' titles, each read once from its first messages and kept (they never change).

    One read of at most four messages a session the first time it is listed, none after:
    a list of 50 costs 50 small reads once, then nothing.
    """

    def __init__(self, size: int = 10_000) -> None:
        self._known: OrderedDict[str, str] = OrderedDict()
        self._size = size

    async def of(self, store: SessionStore, session_ids: Iterable[str]) -> dict[str, str | None]:
        """The title of each session (None: no user message yet)."""
        ids = list(session_ids)
        missing = [i for i in ids if i not in self._known]
        found = await asyncio.gather(
            *(store.messages(i, before=_TITLE_SCAN, limit=_TITLE_SCAN) for i in missing)
        )
        for session_id, rows in zip(missing, found, strict=True):
            title = title_of(message for _, message in rows)
            if title is not None:  # kept once it has one: the first message stays the first
                self._known[session_id] = title
                if len(self._known) > self._size:
                    self._known.popitem(last=False)
        for session_id in ids:
            if session_id in self._known:
                self._known.move_to_end(session_id)
        return {i: self._known.get(i) for i in ids}

    def forget(self, session_id: str) -> None:
        """A deleted session's title."""
        self._known.pop(session_id, None)


def _messages(state: RunState) -> Iterator[Message]:
    yield from state.messages
    for scratch in state.scratch.values():
        yield from scratch


def _find(state: RunState, call_id: str) -> tuple[ApprovalCardPart | None, ToolCallPart | None]:
    """The card of a call and the call itself, where the session holds them now."""
    card: ApprovalCardPart | None = state.pending.get(call_id)
    call: ToolCallPart | None = None
    for message in _messages(state):
        for part in message.parts:
            if isinstance(part, ApprovalCardPart) and part.tool_call_id == call_id:
                card = part if card is None or part.decision is not None else card
            elif isinstance(part, ToolCallPart) and part.id == call_id:
                call = part
    return card, call


def deciders(card: ApprovalCardPart) -> list[str]:
    """Who decided `card`: every approver of the arguments that ran, else who decided it."""
    approvals = card.approvals or []
    if card.decision == "approve" and approvals:
        names = [
            a.by
            for a in approvals
            if a.by is not None
            and (card.args_digest is None or a.args_digest in (None, card.args_digest))
        ]
        if names:
            return list(dict.fromkeys(names))
    return [card.decided_by] if card.decided_by is not None else []


def involved(card: ApprovalCardPart) -> set[str]:
    """Everyone who decided the card or approved it, whatever arguments they approved."""
    names = {a.by for a in card.approvals or [] if a.by is not None}
    return names | ({card.decided_by} if card.decided_by is not None else set())


def call_outcome(
    state: RunState,
    call_id: str,
    *,
    approved_by: list[str],
    session_status: SessionStatus,
    running: bool,
) -> tuple[CallOutcomeBody, set[str]] | None:
    """What came of the call `call_id` of the session, and who decided it (None: no card)."""
    card, call = _find(state, call_id)
    if card is None:
        return None
    status = call.status if call is not None else None
    stands = card_state(card) if card.kind != "batch" else None
    result = call.result if call is not None else None
    # A batch card's call is its actions: it ran once it has their report.
    ran = card.output is not None if card.kind == "batch" else status in _FINAL
    done = card.decision is not None and not running and (ran or session_status == "failed")
    body = CallOutcomeBody(
        tool_call_id=call_id,
        tool_name=card.tool_name,
        kind=card.kind,
        decision=card.decision,
        decided_by=deciders(card),
        approved_by=approved_by if card.decision is None else [],
        status=status,
        args=stands.args if stands is not None else None,
        changes=stands.changes if stands is not None else {},
        summary=result.summary if result is not None else None,
        error=result.error if result is not None and status == "failed" else None,
        digest=call.digest if call is not None and status == "completed" else None,
        output=card.output,
        session_status=session_status,
        running=running,
        done=done,
    )
    return body, involved(card)


async def verify_trail(store: SessionStore, org_id: str | None) -> AuditVerifyBody:
    """The organisation's trail checked a page at a time, with the keys the server has.

    The keyring is `HANDRAIL_AUDIT_KEY` and `HANDRAIL_AUDIT_OLD_KEYS`, as for `handrail audit
    verify`, and the store's own key (an app may give it in code).
    """
    keys = keyring_from_env()
    own = getattr(store, "audit_key", None)
    if isinstance(own, AuditKey):
        keys.setdefault(own.id, own.secret)
    verifier = AuditVerifier(keys=keys)
    after = 0
    while True:
        page = await store.audit(org_id, after=after, limit=_PAGE)
        verifier.feed(page)
        if len(page) < _PAGE:
            break
        after = page[-1].seq
    problems = verifier.problems()
    return AuditVerifyBody(
        holds=not any(p.severity == "error" for p in problems),
        count=verifier.count,
        keyed=verifier.keyed,
        last=str(verifier.last),
        problems=problems,
    )
