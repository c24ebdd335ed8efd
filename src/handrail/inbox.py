"""The inbox: the calls of an organisation's sessions that wait for a decider.

One reading of the store serves both inboxes: `Inbox.pending`, the cards (`Engine.pending`,
`GET /pending`), and `Inbox.sessions`, the sessions that hold them (`GET
/sessions?to_decide=true`). Both read the store's inbox index (`SessionStore.waiting`: one row
a waiting card, written with the save that raised or settled it), most recently updated
session first, a page at a time in one indexed query, never a session's document. The query
narrows the rows to those the decider may reach (their own requests, and the tools whose
policies their roles meet); the rule `Engine.resolve` checks (`Inbox.decidable`: four eyes,
withdrawal) is then applied to the page's rows, reading further pages while it leaves the
page short. `Engine.inbox` is the inbox over an engine's store.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .domain import Domain
from .exceptions import UserError
from .messages import ApprovalCardPart, CardApproval, CardKind
from .policy import Decider, DecisionPolicy, policy_for
from .state import RunState
from .store import SessionStore, SessionSummary
from .store._base import WaitingRow
from .store._waiting import CARD
from .suspension import ArgChange, card_state, decidable, may_decide
from .tools import Tool

__all__ = ["Inbox", "PendingCard", "PendingPage"]


@dataclass(kw_only=True, slots=True)
class PendingCard:
    """A call waiting for a decision, as an inbox lists it (`Engine.pending`)."""

    session_id: str
    """The session that waits."""
    tool_call_id: str
    """The call (decide it with `Engine.resolve(session_id, tool_call_id, ...)`)."""
    tool: str
    """The tool's name (a batch card's is the capture's)."""
    kind: CardKind
    """What is asked: approval, batch, elicitation, client_exec, recovery."""
    prompt: str | None
    """What to ask the decider."""
    args: dict[str, Any]
    """The arguments the call runs with if it is approved now: the model's proposal, as
    approvers amended it so far (a batch card's: its actions)."""
    digest: str
    """The digest of `args`: a decision names it (`Approve(digest=...)`) to decide on exactly
    these arguments; one made on others is refused (`ArgumentsChangedError`)."""
    proposed_args: dict[str, Any]
    """The arguments as the model proposed them."""
    changes: dict[str, ArgChange]
    """What `args` change from the proposal, by argument name (empty: nothing)."""
    approved_by: list[str]
    """Who approved exactly `args` so far (a call whose policy needs several approvals)."""
    amendable: list[str]
    """The arguments the decider may change."""
    created_at: float | None
    """When the card was raised (seconds since the epoch)."""
    expires_at: float | None
    """When it stops accepting a decision, if ever."""
    requester: str | None
    """The user whose session waits (who asked for the call)."""
    agent: str | None
    """The agent that proposed the call (a batch card's: the agent that proposed its
    actions, or the agents, comma-separated in order, when several did); None on a card
    stored before cards named it."""
    approvals: list[CardApproval]
    """Every approval given so far, of these arguments or of earlier proposals (only
    `approved_by` count), for a call whose policy needs several."""


@dataclass(kw_only=True, slots=True)
class PendingPage:
    """A page of an inbox: the cards, and where the next page starts."""

    cards: list[PendingCard]
    """Oldest-updated sessions last; a session's cards in the order they were raised."""
    next: str | None
    """The cursor of the next page (pass it as `cursor=`), or None: there is nothing more."""


class SessionLoader(Protocol):
    """How the inbox reads a session's state: `Engine.session`, the one way to load one."""

    def __call__(
        self, session_id: str, *, org_id: str | None, user_id: str | None
    ) -> Awaitable[RunState]:
        """The session's state, in its own scope."""
        ...


_SCAN = 1_000
"""Rows within a decider's reach but refused by the rule that `Inbox.pending` reads at most
for one page (a page may then be short, with a `next` to go on from); also the most rows one
index query asks for."""


def deciding_tools(domain: Domain, state: RunState) -> Mapping[str, Tool[Any]]:
    """The tools a decision on `state` is checked against: the suspended agent's.

    A batch card's actions may be any agent's tools, so for one it is every tool. `decide`
    (`Engine.resolve`) and `Inbox.decidable` check against the same ones.
    """
    if any(c.kind == "batch" for c in state.pending.values()):
        return domain.tools()
    progress = state.progress
    return _agent_tools(domain, progress.agent if progress else None)


def _agent_tools(domain: Domain, agent: str | None) -> Mapping[str, Tool[Any]]:
    spec = domain.by_name.get(agent) if agent is not None else None
    return spec.tools if spec is not None else {}


class Inbox:
    """The calls of a store's sessions that wait for a decider, read as cards or as sessions.

    `Engine.inbox` gives the one over an engine's store; `Engine.pending` and
    `Engine.decidable` are its `pending` and `decidable`.

    Args:
        store: where the sessions live.
        domain: whose tools and policies say who may decide a call.
        load: how a session's state is read (`Engine.session`); the pages never need it
            (they are read off the index), it stays for callers that read a session too.
        clock: the time now, in seconds since the epoch (for the age filters).
    """

    def __init__(
        self,
        store: SessionStore,
        domain: Domain,
        *,
        load: SessionLoader,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.domain = domain
        self._load = load
        self._clock = clock

    def decidable(self, state: RunState, decider: Decider) -> list[str]:
        """The pending calls of `state` that `decider` may decide (`handrail.policy`).

        What a server shows an approver: a session of their organisation is theirs to read
        while it waits for a decision they may make.
        """
        if decider.org_id is not None and decider.org_id != state.org_id:
            return []
        tools = deciding_tools(self.domain, state)
        return decidable(state, tools, decider, self.domain.policies)

    def reach(self, decider: Decider) -> tuple[str | None, frozenset[str]]:
        """What the index query keeps for `decider` (`SessionStore.waiting`'s `reach`).

        Their own requests, and the calls of the tools whose policy lets someone with their
        roles decide others' calls (of any agent, and of a batch's actions): every call they
        may decide is among them, and nearly all of them are theirs to decide (not their own
        under a policy that lets nobody withdraw a call without its roles, say), so the rule
        applied after the query rarely drops one.
        """
        policies = self.domain.policies
        everything: dict[str, list[Tool[Any]]] = {}
        for spec in self.domain.by_name.values():
            for name, one in spec.tools.items():
                everything.setdefault(name, []).append(one)
        for name, one in self.domain.tools().items():
            everything.setdefault(name, []).append(one)
        tools = frozenset(
            name
            for name, found in everything.items()
            if any(
                _others_may(policy_for(t.decision_policy, t.permission, policies), decider)
                for t in found
            )
        )
        return decider.user_id, tools

    def _decides(self, row: WaitingRow, decider: Decider) -> ApprovalCardPart | None:
        """The row's card, if `decider` may decide it (the rule `Engine.resolve` checks)."""
        try:
            card = CARD.validate_python(row.card.card)
        except ValueError:
            return None  # a card this handrail cannot read: for a person to look at
        tools = (
            self.domain.tools()
            if card.kind == "batch"
            else _agent_tools(self.domain, row.card.agent)
        )
        if not may_decide(card, tools, decider, row.session.user_id, self.domain.policies):
            return None
        return card

    async def _rows(
        self,
        org_id: str | None,
        decider: Decider,
        after: tuple[float, str, int] | None,
        first: int,
        **filters: Any,
    ) -> AsyncIterator[tuple[WaitingRow, ApprovalCardPart | None]]:
        """The index rows after `after` within the decider's reach, with the card if theirs.

        Read `first` at a time, then twice as many (up to `_SCAN`), while the caller wants more.
        """
        reach = self.reach(decider)
        size = min(first, _SCAN)
        while True:
            rows = await self.store.waiting(
                org_id=org_id, after=after, limit=size, reach=reach, **filters
            )
            for row in rows:
                yield row, self._decides(row, decider)
            if len(rows) < size:
                return
            after = rows[-1].key
            size = min(size * 2, _SCAN)

    async def sessions(
        self,
        org_id: str | None,
        decider: Decider,
        *,
        offset: int = 0,
        limit: int = 50,
        own: bool = True,
    ) -> list[SessionSummary]:
        """The suspended sessions of `org_id` with a call `decider` may decide, a page at a time.

        Most recently updated first; `offset` skips that many such sessions, and the page
        after this one starts at `offset + limit`.

        Args:
            org_id: the organisation (the decider's, when it has one).
            decider: who decides.
            offset: skip this many sessions first.
            limit: at most this many.
            own: whether the decider's own sessions count (False: only others'; the server's
                `GET /sessions?to_decide=true`, since a caller's own are in its own list).

        Raises:
            UserError: `limit` is below 1, or the decider belongs to another organisation.
        """
        self._check(org_id, decider, limit, "sessions")
        if offset < 0:
            raise UserError(f"sessions: offset must be 0 or more, not {offset}.")
        found: list[SessionSummary] = []
        last: str | None = None
        skipped = 0
        exclude = None if own else decider.user_id
        async for row, card in self._rows(
            org_id, decider, None, min(offset + limit + 1, _SCAN), exclude_user=exclude
        ):
            if card is None or row.session.id == last:
                continue
            last = row.session.id
            if skipped < offset:
                skipped += 1
                continue
            found.append(row.session)
            if len(found) == limit:
                break
        return found

    async def pending(
        self,
        org_id: str | None,
        decider: Decider,
        *,
        tool: str | None = None,
        kind: CardKind | None = None,
        older_than: float | None = None,
        newer_than: float | None = None,
        session_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> PendingPage:
        """The cards of `org_id`'s sessions that `decider` may decide, a page at a time.

        The decider's own sessions count too (a card without a policy is its requester's to
        decide). The page is read off the store's inbox index, most recently updated session
        first; it is full unless nothing follows (or, rarely, once 1,000 rows within the
        decider's reach were not theirs to decide: then a short page with a `next`).

        Args:
            org_id: the organisation (the decider's, when it has one). None reads every
                session of the store: for a store without organisations only.
            decider: who decides (`handrail.policy.Decider`).
            tool: only cards of this tool.
            kind: only cards of this kind (`"approval"`, `"batch"`, ...).
            older_than: only cards raised at least this many seconds ago.
            newer_than: only cards raised less than this many seconds ago.
            session_id: only this session's cards.
            limit: at most this many cards.
            cursor: where to go on from: the `next` of the page before.

        Raises:
            UserError: `limit` is below 1, the cursor is not one `pending` gave, or the
                decider belongs to another organisation.
        """
        self._check(org_id, decider, limit, "pending")
        after = read_cursor(cursor)
        now = self._clock()
        cards: list[PendingCard] = []
        passed = 0  # rows within the decider's reach that the rule refused
        async for row, card in self._rows(
            org_id,
            decider,
            after,
            limit + 1,
            tool=tool,
            kind=kind,
            session_id=session_id,
            raised_before=None if older_than is None else now - older_than,
            raised_after=None if newer_than is None else now - newer_than,
        ):
            if card is not None:
                if len(cards) == limit:  # one more follows: the page is full
                    return PendingPage(cards=cards, next=_next(after))
                cards.append(_pending(row, card))
            else:
                passed += 1
            after = row.key
            if passed >= _SCAN:  # bounded: go on from here with the next page
                return PendingPage(cards=cards, next=_next(after))
        return PendingPage(cards=cards, next=None)

    @staticmethod
    def _check(org_id: str | None, decider: Decider, limit: int, where: str) -> None:
        if limit < 1:
            raise UserError(f"{where}: limit must be 1 or more, not {limit}.")
        if decider.org_id is not None and decider.org_id != org_id:
            raise UserError(
                f"{where}: the decider belongs to organisation {decider.org_id!r}, not "
                f"{org_id!r}; list the decider's own organisation."
            )


def _others_may(policy: DecisionPolicy | None, decider: Decider) -> bool:
    """Whether a tool's policy lets `decider` decide calls that others requested, by role."""
    return policy is not None and (not policy.roles or bool(decider.roles & policy.roles))


def _pending(row: WaitingRow, card: ApprovalCardPart) -> PendingCard:
    """The inbox's card for an index row."""
    stands = card_state(card)
    return PendingCard(
        session_id=row.session.id,
        tool_call_id=card.tool_call_id,
        tool=card.tool_name,
        kind=card.kind,
        prompt=card.prompt,
        args=stands.args,
        digest=stands.digest,
        proposed_args=card.args,
        changes=stands.changes,
        approved_by=stands.approved_by,
        amendable=list(card.amendable),
        created_at=card.created_at,
        expires_at=card.expires_at,
        requester=row.session.user_id,
        agent=card.agent,
        approvals=list(card.approvals or ()),
    )


def _next(key: tuple[float, str, int] | None) -> str | None:
    """A `PendingPage.next`: the index key of the last row read, as an opaque token."""
    if key is None:
        return None
    text = json.dumps(list(key), separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def read_cursor(cursor: str | None) -> tuple[float, str, int] | None:
    """The index key a `PendingPage.next` stands for (None: from the start).

    Raises:
        UserError: `cursor` is not a `next` that `Inbox.pending` gave.
    """
    if cursor is None:
        return None
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, session_id, position = json.loads(text)
        if not (
            isinstance(at, int | float)
            and isinstance(session_id, str)
            and isinstance(position, int)
        ):
            raise ValueError(cursor)
    except (ValueError, TypeError, binascii.Error):
        raise UserError(
            f"pending: {cursor[:60]!r} is not a cursor; pass the `next` of a page, or none."
        ) from None
    return float(at), session_id, position
