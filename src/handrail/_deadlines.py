"""How long a waiting card accepts a decision: the defaults per kind, and who may change them.

Every card has a deadline unless someone asked for none. A card's deadline is the first of
these that is set: its tool's `expires_after=`, its agent's, its domain's, the runtime's
`pending_ttl` (`Deadlines()` unless given). Each is a number of seconds (for every kind of
card), a `Deadlines` (seconds by kind), or None: no deadline at all, only when asked for.
Past its deadline, a sweep (`Engine.expire_due`, the served process's, `handrail worker`'s)
decides the card `expire`, and its turn goes on with a tool error the model reads.

Recovery cards ("did this call run before the crash?") have none: only a person can say
whether a side effect happened, and an expiry could not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, TypeAlias

from .exceptions import UserError
from .messages import CardKind

__all__ = ["CLIENT_GRACE", "INHERIT", "Deadlines", "Expiry", "Inherit", "check_expiry", "ttl_for"]


class Inherit:
    """Not set here: the next level decides (the sentinel of `expires_after=`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "INHERIT"


INHERIT: Final = Inherit()


@dataclass(frozen=True, kw_only=True, slots=True)
class Deadlines:
    """Seconds a waiting card accepts a decision, by kind (None: no deadline for that kind).

    The defaults: a day for a person's decision (an approval, a batch of captured actions, a
    question or a `human` tool's answer), fifteen minutes for a client to run a `client` tool
    (a client that went away never will).
    """

    approval: float | None = 24 * 3600.0
    """An approval card, and a batch card (`headless`)."""
    question: float | None = 24 * 3600.0
    """A `human` tool's card (`elicitation`) and a tool's question (`AskPerson`)."""
    client: float | None = 15 * 60.0
    """A `client` tool's card, waiting for the client's result."""

    def __post_init__(self) -> None:
        for kind in ("approval", "question", "client"):
            check_expiry(getattr(self, kind), f"Deadlines({kind}=...)")

    def for_kind(self, kind: CardKind) -> float | None:
        """The seconds a card of `kind` waits (None: for ever)."""
        if kind in ("approval", "batch"):
            return self.approval
        if kind in ("elicitation", "question"):
            return self.question
        if kind == "client_exec":
            return self.client
        return None  # recovery: only a person can say whether it ran


Expiry: TypeAlias = float | Deadlines | None
"""Seconds for every kind, seconds by kind, or None (no deadline: only when asked for)."""

CLIENT_GRACE: Final = 30.0
"""Seconds a `client` call waits for a client whose stream closed before the turn ended (it
may reconnect); then it expires with "the app was closed"."""


def check_expiry(value: object, where: str) -> None:
    """Refuse what is not an `Expiry` (or `INHERIT`).

    Raises:
        UserError: not a positive number of seconds, a `Deadlines`, None or `INHERIT`.
    """
    if value is None or isinstance(value, Deadlines | Inherit):
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not value > 0
        or math.isinf(value)
    ):
        raise UserError(
            f"{where}: give a positive number of seconds, a Deadlines(...), or None for no "
            f"deadline; not {value!r}."
        )


def ttl_for(kind: CardKind, *levels: Expiry | Inherit) -> float | None:
    """The seconds a card of `kind` waits: the first level that is set decides.

    Levels that are all `INHERIT` give the defaults (`Deadlines()`).
    """
    if kind == "recovery":
        return None
    for level in levels:
        if isinstance(level, Inherit):
            continue
        if isinstance(level, Deadlines):
            return level.for_kind(kind)
        return None if level is None else float(level)
    return Deadlines().for_kind(kind)
