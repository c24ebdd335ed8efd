"""Who may start a turn at all: the app's gate (a plan, a feature flag, a quota).

A gate is a function the app gives its engine (`Engine(gate=...)`). Every entry point that
starts a turn for a caller asks it first, with a `TurnRequest`, before anything is stored:
the HTTP API (`POST /sessions`, `POST /sessions/{id}/turns`), AG-UI (`POST /agui`), the AI
SDK's UI message stream (`POST /chat`), and `handrail chat`. It returns None to let the
caller in, or the reason it does not, which the caller is shown (HTTP 403 `turn_refused`):

```python
def gate(request: TurnRequest) -> str | None:
    if request.org_id not in paying:
        return "Your plan does not include the IT assistant: upgrade at example.com/plans."
    return None

engine = Engine(domain, store=store, gate=gate)
```

It may be a coroutine function (to ask a billing service). Deciding pending calls and
resuming a turn are not starting one, so the gate is not asked for them; nor is it asked by
`Engine.submit` itself (a library call is trusted, as a decision naming no decider is), so
an entry point of your own asks it with `Engine.admit`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeAlias

from .exceptions import TurnRefusedError, UserError

__all__ = ["Gate", "TurnRequest", "admit"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnRequest:
    """A caller asking to start a turn, as the gate is shown it."""

    org_id: str | None
    """The caller's organisation, as authenticated."""
    user_id: str | None
    """The caller."""
    roles: frozenset[str] = field(default_factory=frozenset)
    """The caller's roles, as authenticated."""
    session_id: str | None = None
    """The session the turn is for; None: a session about to be made for it."""
    text: str | None = None
    """The user's message (None when a session is made before its first turn)."""
    via: str = "http"
    """The entry point: `http` (the REST API), `agui`, `ui-stream`, `chat` (`handrail chat`),
    or an entry point's own name."""
    credential: str | None = None
    """What the caller authenticated with (an API key's id, a token's issuer and subject)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", frozenset(self.roles))


Gate: TypeAlias = Callable[[TurnRequest], "Awaitable[str | None] | str | None"]
"""Decides whether a caller may start a turn: None lets it in; a reason refuses it."""


async def admit(gate: Gate | None, request: TurnRequest) -> None:
    """Ask `gate` whether `request` may start a turn; raise the refusal with its reason.

    Raises:
        TurnRefusedError: the gate gave a reason (nothing was stored).
        UserError: the gate returned something else than None or a non-empty string.
    """
    if gate is None:
        return
    reason = gate(request)
    if inspect.isawaitable(reason):
        reason = await reason
    if reason is None:
        return
    if not isinstance(reason, str) or not reason.strip():
        raise UserError(
            f"The engine's gate returned {reason!r}: it returns None to let the caller start "
            f"a turn, or the reason it may not, as a non-empty string."
        )
    raise TurnRefusedError(reason)
