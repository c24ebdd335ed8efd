"""What the chat protocols (AG-UI, the AI SDK's UI message stream) share.

A chat protocol's client names its conversation itself and sends its whole history each time;
handrail keeps the conversation as a session of the caller's. This module holds what every
such endpoint does the same way, so that each protocol module only translates:

- the session of a caller's chat (`chat_session_id`), made on first use;
- the new user message, picked out of the client's whole history (`new_user_text`);
- an approval with an amendment, diffed from the edited arguments in full against the
  arguments the client was shown (`approval`, `amendment`);
- starting the turn a request asks for: a new message, or decisions (`start_turn`);
- the turn's logged events, read back and counted against the caller's bandwidth (`pump`).

A request that cannot be acted on raises `ChatRefusal`, which each protocol reports its own
way (nothing is recorded).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ..events import EVENT, Event
from ..exceptions import SessionNotFoundError
from ..messages import ApprovalCardPart
from ..state import RunState
from ..store import SessionStore, session_id_for
from ..suspension import Approve, Decision, current_args
from ._auth import Caller

if TYPE_CHECKING:
    from ._api import Api

__all__ = [
    "ChatRefusal",
    "Cursor",
    "amendment",
    "chat_approval",
    "chat_session_id",
    "chat_state",
    "new_user_text",
    "pump",
    "scratch_agents",
    "start_turn",
]

_log = logging.getLogger("handrail.server")


class ChatRefusal(Exception):
    """A request a chat endpoint refuses: reported in the protocol's stream, nothing done."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def chat_session_id(
    caller: Caller, chat_id: str, *, prefix: str, store: SessionStore | None = None
) -> str:
    """The handrail session of `caller`'s chat `chat_id` (`prefix`: the protocol's).

    Derived from the caller as well as the chat, so that two tenants who pick the same chat
    id get two sessions, and nobody can reach (or squat) another tenant's chat. In a `store`
    that places sessions by their id (`PartitionedStore`), it begins with the caller's
    organisation's partition.
    """
    digest = hashlib.sha256(
        json.dumps([caller.org_id, caller.user_id, chat_id]).encode()
    ).hexdigest()
    local = f"{prefix}-{digest[:32]}"
    return local if store is None else session_id_for(store, caller.org_id, local)


def scratch_agents(api: Api) -> set[str]:
    """The agents whose text is working, not the reply (a client shows it as reasoning)."""
    domain = api.engine.domain
    scratch = {a.name for a in domain.agents if a.scratch}
    if domain.supervisor is not None:
        scratch.add(domain.supervisor.name)
    return scratch


async def chat_state(api: Api, caller: Caller, session_id: str) -> RunState | None:
    """The session of the caller's chat, or None before its first turn (one read)."""
    try:
        return await api.engine.session(session_id, org_id=caller.org_id, user_id=caller.user_id)
    except SessionNotFoundError:  # the id is the caller's own: no one else's session is hit
        return None


def new_user_text(texts: Sequence[str], state: RunState | None) -> str:
    """The last of the client's user messages (`texts`) that the session has not seen."""
    seen = 0 if state is None else state.turn  # one a user message, however long the history
    if len(texts) <= seen:
        raise ChatRefusal(
            "no_new_message",
            "The request carries no user message that this chat has not seen yet.",
        )
    text = texts[-1]
    if not text.strip():
        raise ChatRefusal("empty_message", "The last user message has no text.")
    return text


def chat_approval(
    card: ApprovalCardPart, edited: Any, digest: Any, *, field: str, by: str
) -> Approve:
    """The approval a chat client sends: the arguments in full (`edited`), and the digest.

    `digest` is the one the client was shown with the card (`digest`): the decision is
    made on those arguments. Without it, the decision is made on the model's proposal,
    unless `edited` names exactly the arguments that run now. Either way, an approval made
    on arguments that are no longer the card's current ones is refused by `decide`
    (`ArgumentsChangedError`), never read as "no change" to whatever they are now.
    """
    if digest is not None and not isinstance(digest, str):
        raise ChatRefusal("invalid_payload", f"{field}: the digest must be a string.")
    if edited is None:
        return Approve(by=by, digest=digest)
    base = card.args if digest is None else current_args(card)
    changes = amendment(card, edited, field=field, base=base)
    return Approve(amended_args=changes or None, by=by, digest=digest)


def amendment(
    card: ApprovalCardPart, edited: Any, *, field: str, base: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The fields of `edited` (the arguments in full) that differ from `base`.

    `base` is the arguments the decider was shown (default: the model's proposal). A change
    to a field that is not amendable is refused, never dropped. `field` names where the
    client sent `edited`, for the messages.
    """
    base = card.args if base is None else base
    label = f"Tool call {card.tool_call_id} ({card.tool_name})"
    if not isinstance(edited, dict):
        raise ChatRefusal("invalid_payload", f"{label}: {field} must be an object.")
    missing = sorted(set(base) - set(edited))
    if missing:
        raise ChatRefusal(
            "invalid_payload",
            f"{label}: {field} replaces the arguments in full, and lacks "
            f"{', '.join(missing)}; send every argument, changed or not.",
        )
    changes = {k: v for k, v in edited.items() if k not in base or base[k] != v}
    forbidden = sorted(set(changes) - set(card.amendable))
    if forbidden:
        allowed = ", ".join(card.amendable) or "none"
        raise ChatRefusal(
            "not_amendable",
            f"{label}: {', '.join(forbidden)} cannot be amended (amendable: {allowed}); "
            f"nothing was decided.",
        )
    return changes


async def start_turn(
    api: Api,
    caller: Caller,
    session_id: str,
    *,
    text: str | None = None,
    decisions: Mapping[str, Decision] | None = None,
    client: bool = False,
    context: Any = None,
) -> int | None:
    """Start what a chat request asks for: a turn for `text`, or record `decisions`.

    Returns:
        The number of the event before the turn's (or the resumption's) first; None when
        decisions were recorded but calls are still pending (nothing ran).
    """
    if decisions is not None:
        _, after = await api.runs.resolve(session_id, decisions, caller, client=client)
        return after
    assert text is not None
    run = api.engine.submit(
        session_id,
        text,
        org_id=caller.org_id,
        user_id=caller.user_id,
        client=client,
        create=True,
        roles=caller.roles,
        context=context,
    )
    api.limits.turn(caller, api.runs.running_for(caller.org_id))
    return await api.runs.start(session_id, run, caller)


@dataclass(slots=True)
class Cursor:
    """Where a pump is in the session's event log."""

    after: int
    """The number of the last event read."""
    last: str | None = None
    """The type of the last event read (`run-suspended`, ...)."""


async def pump(
    api: Api,
    caller: Caller,
    session_id: str,
    cursor: Cursor,
    translate: Callable[[Event], Awaitable[bytes]],
) -> AsyncGenerator[bytes, None]:
    """The frames `translate` makes of the session's events after `cursor`, to a turn's end.

    The end is the first event that ends a turn or suspends it. Each batch of events is one
    write, counted against the caller's organisation's stream bandwidth like every event
    stream; a row that cannot be read (or an event newer than this server) is passed over.
    `cursor` follows the events read.
    """
    events = api.runs.follow(session_id, cursor.after, forever=False)
    async with contextlib.aclosing(events):
        async for batch in events:
            chunk = bytearray()
            for seq, raw in batch:
                cursor.after = seq
                try:
                    event = EVENT.validate_python(raw)
                except ValidationError:
                    _log.warning("chat stream: skipped event %d of %r", seq, session_id)
                    continue
                cursor.last = event.type
                chunk += await translate(event)
            if api.limits.stream_wait(caller):
                async for keep_alive in api._within_bandwidth(caller):
                    yield keep_alive
            yield bytes(chunk)
            api.limits.sent(caller, len(chunk))
