"""The inbox: the calls of an organisation's sessions that wait for a decider.

One reading of the store serves both inboxes: `Inbox.pending`, the cards (`Engine.pending`,
`GET /pending`), and `Inbox.sessions`, the sessions that hold them (`GET
/sessions?to_decide=true`). Both walk the organisation's suspended sessions, most recently
updated first, load each one, and keep the calls the decider may decide (`Inbox.decidable`,
the rule `Engine.resolve` checks). `Engine.inbox` is the inbox over an engine's store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .domain import Domain
from .exceptions import SessionCorruptError, SessionNotFoundError, UserError
from .messages import CardApproval, CardKind
from .policy import Decider
from .state import RunState
from .store import SessionStore, SessionSummary
from .suspension import ArgChange, card_state, decidable
from .tools import Tool

__all__ = ["Inbox", "PendingCard", "PendingPage", "Waiting"]


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


@dataclass(kw_only=True, slots=True)
class Waiting:
    """A session as the inbox reads it: its summary, its state, the calls a decider may decide."""

    summary: SessionSummary
    """The session's metadata, as the store lists it."""
    state: RunState | None
    """Its state; None when it went meanwhile, or cannot be read (for a person to look at)."""
    calls: list[str]
    """The pending calls the decider may decide, in the order they were raised (maybe none)."""


class SessionLoader(Protocol):
    """How the inbox reads a session's state: `Engine.session`, the one way to load one."""

    def __call__(
        self, session_id: str, *, org_id: str | None, user_id: str | None
    ) -> Awaitable[RunState]:
        """The session's state, in its own scope."""
        ...


_SCAN = 1_000
"""Sessions `Inbox.pending` reads at most for one page (a page may then be short, with a
`next` cursor to go on from)."""

_BATCH = 100
"""Session summaries read from the store at a time."""


def deciding_tools(domain: Domain, state: RunState) -> Mapping[str, Tool[Any]]:
    """The tools a decision on `state` is checked against: the suspended agent's.

    A batch card's actions may be any agent's tools, so for one it is every tool. `decide`
    (`Engine.resolve`) and `Inbox.decidable` check against the same ones.
    """
    if any(c.kind == "batch" for c in state.pending.values()):
        return domain.tools()
    progress = state.progress
    agent = domain.by_name.get(progress.agent) if progress else None
    return agent.tools if agent is not None else {}


class Inbox:
    """The calls of a store's sessions that wait for a decider, read as cards or as sessions.

    `Engine.inbox` gives the one over an engine's store; `Engine.pending` and
    `Engine.decidable` are its `pending` and `decidable`.

    Args:
        store: where the sessions live.
        domain: whose tools and policies say who may decide a call.
        load: how a session's state is read (`Engine.session`).
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

    async def waiting(
        self,
        org_id: str | None,
        decider: Decider,
        *,
        offset: int = 0,
        limit: int | None = None,
        session_id: str | None = None,
        skip_user: str | None = None,
    ) -> AsyncIterator[Waiting]:
        """Each suspended session of `org_id`, most recently updated first, as it is read.

        Every session read is yielded, with the calls `decider` may decide (maybe none), so a
        caller counts its place in the order (`offset`) whatever it keeps.

        Args:
            org_id: the organisation (None: every session of the store).
            decider: who decides.
            offset: skip this many sessions first.
            limit: read at most this many sessions (None: to the end).
            session_id: only this session (of `org_id`, in any status), at offset 0.
            skip_user: yield this user's sessions without reading them (and no calls).
        """
        if session_id is not None:
            found = await self.store.summary(session_id)
            if found is not None and found.org_id == org_id and offset == 0 and limit != 0:
                yield await self._read(found, decider, skip_user)
            return
        read = 0
        while limit is None or read < limit:
            batch = _BATCH if limit is None else min(_BATCH, limit - read)
            page = await self.store.list(
                org_id=org_id, status="suspended", limit=batch, offset=offset + read
            )
            if not page:
                return
            for summary in page:
                read += 1
                yield await self._read(summary, decider, skip_user)

    async def _read(
        self, summary: SessionSummary, decider: Decider, skip_user: str | None
    ) -> Waiting:
        if skip_user is not None and summary.user_id == skip_user:
            return Waiting(summary=summary, state=None, calls=[])
        try:
            state = await self._load(summary.id, org_id=summary.org_id, user_id=summary.user_id)
        except (SessionNotFoundError, SessionCorruptError):
            return Waiting(summary=summary, state=None, calls=[])  # gone, or unreadable
        return Waiting(summary=summary, state=state, calls=self.decidable(state, decider))

    async def sessions(
        self,
        org_id: str | None,
        decider: Decider,
        *,
        offset: int = 0,
        limit: int = 50,
        own: bool = True,
    ) -> list[SessionSummary]:
        """The sessions of a page of `org_id`'s suspended ones that wait for `decider`.

        `limit` and `offset` page the organisation's suspended sessions (most recently updated
        first), and those with no call the decider may decide are left out, so a page may hold
        fewer than `limit`; the page after starts at `offset + limit`.

        Args:
            org_id: the organisation (the decider's, when it has one).
            decider: who decides.
            offset: skip this many suspended sessions first.
            limit: read at most this many.
            own: whether the decider's own sessions count (False: only others'; the server's
                `GET /sessions?to_decide=true`, since a caller's own are in its own list).

        Raises:
            UserError: `limit` is below 1, or the decider belongs to another organisation.
        """
        self._check(org_id, decider, limit, "sessions")
        skip_user = None if own else decider.user_id
        return [
            entry.summary
            async for entry in self.waiting(
                org_id, decider, offset=offset, limit=limit, skip_user=skip_user
            )
            if entry.calls
        ]

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
        decide). Sessions are read most recently updated first, and a page is filled from as
        many as it takes (at most 1,000 a page: past that, a short page with a `next`).

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
        offset, skip = _cursor(cursor)
        now = self._clock()
        cards: list[PendingCard] = []
        read = 0
        async for entry in self.waiting(
            org_id, decider, offset=offset, limit=_SCAN, session_id=session_id
        ):
            read += 1
            matching = _cards(entry, now, tool, kind, older_than, newer_than)
            room = limit - len(cards)
            taken = matching[skip : skip + room]
            cards.extend(taken)
            if skip + len(taken) < len(matching):  # the page is full within this session
                return PendingPage(cards=cards, next=f"{offset}.{skip + len(taken)}")
            offset, skip = offset + 1, 0
            if len(cards) >= limit:
                break
        else:
            if read < _SCAN:  # read to the end
                return PendingPage(cards=cards, next=None)
        if session_id is not None:
            return PendingPage(cards=cards, next=None)
        return PendingPage(cards=cards, next=f"{offset}.0")

    @staticmethod
    def _check(org_id: str | None, decider: Decider, limit: int, where: str) -> None:
        if limit < 1:
            raise UserError(f"{where}: limit must be 1 or more, not {limit}.")
        if decider.org_id is not None and decider.org_id != org_id:
            raise UserError(
                f"{where}: the decider belongs to organisation {decider.org_id!r}, not "
                f"{org_id!r}; list the decider's own organisation."
            )


def _cards(
    entry: Waiting,
    now: float,
    tool: str | None,
    kind: CardKind | None,
    older_than: float | None,
    newer_than: float | None,
) -> list[PendingCard]:
    """The cards of `entry`'s decidable calls that pass the filters."""
    state = entry.state
    if state is None:
        return []
    cards: list[PendingCard] = []
    for call_id in entry.calls:
        card = state.pending[call_id]
        if (tool is not None and card.tool_name != tool) or (
            kind is not None and card.kind != kind
        ):
            continue
        raised = card.created_at
        if older_than is not None and (raised is None or raised > now - older_than):
            continue
        if newer_than is not None and (raised is None or raised <= now - newer_than):
            continue
        stands = card_state(card)
        cards.append(
            PendingCard(
                session_id=entry.summary.id,
                tool_call_id=call_id,
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
                requester=state.user_id,
                approvals=list(card.approvals or ()),
            )
        )
    return cards


def _cursor(cursor: str | None) -> tuple[int, int]:
    """(sessions to skip, cards of the next session to skip) from a `PendingPage.next`."""
    if cursor is None:
        return 0, 0
    offset, _, skip = cursor.partition(".")
    if not (offset.isdigit() and skip.isdigit()) or len(cursor) > 40:
        raise UserError(
            f"pending: {cursor[:60]!r} is not a cursor; pass the `next` of a page, or none."
        )
    return int(offset), int(skip)
