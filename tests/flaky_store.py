"""A session store that fails on demand: the n-th call of a method, once or for a while.

`FlakyStore(inner, fail={"log_finished": [3]}, down_for=1)` passes every call through to
`inner`, except that the 3rd call of `log_finished` fails, and so do the calls after it (of
any method) until `down_for` calls have failed in all: an outage that starts at that call.
`down_for=1` is a blip (a dropped connection the next call does not see); a `down_for`
longer than the engine's retries is a store that stays away.

With `only_method=True` the outage fails the calls of that method alone (the others go
through), for a fault of one kind of call.

With `lost_reply=True` the first failing call reaches the store first (its write is made)
and only its answer is lost: the error comes after the effect, as when a connection drops
between the commit and the reply.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from handrail.exceptions import StoreUnavailableError
from handrail.store import SessionStore

__all__ = ["METHODS", "FlakyStore"]

METHODS = frozenset(
    {
        "load",
        "summary",
        "save",
        "messages",
        "list",
        "due",
        "claim",
        "delete",
        "export",
        "import_",
        "log_started",
        "log_finished",
        "tool_log",
        "append_events",
        "events",
        "acquire_lease",
        "release_lease",
        "adopt_leases",
        "append_audit",
        "audit",
        "waiting",
        "notify",
    }
)
"""The store's async methods, the ones a fault can hit."""


def unavailable(method: str) -> Exception:
    """The default fault: what a store raises for a connection that dropped."""
    return StoreUnavailableError(f"injected fault: the store dropped the connection ({method})")


class FlakyStore:
    """Wraps a store; fails the n-th call of the methods named in `fail` (see the module).

    Attributes:
        calls: how many times each method was called (failed calls included).
        failed: the methods of the calls that failed, in order.
    """

    def __init__(
        self,
        inner: SessionStore,
        *,
        fail: Mapping[str, Iterable[int]] | None = None,
        down_for: int = 1,
        error: Callable[[str], Exception] = unavailable,
        lost_reply: bool = False,
        only_method: bool = False,
    ) -> None:
        unknown = set(fail or {}) - METHODS
        if unknown:
            raise ValueError(f"FlakyStore: no such store method(s) {sorted(unknown)}")
        self.inner = inner
        self.fail = {method: set(calls) for method, calls in (fail or {}).items()}
        self.down_for = down_for
        self.error = error
        self.lost_reply = lost_reply
        self.only_method = only_method
        self._failing: str | None = None  # the method whose call started the outage
        self.calls: collections.Counter[str] = collections.Counter()
        self.failed: list[str] = []
        self._down = 0  # calls still to fail in the outage under way

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name not in METHODS:
            return attribute

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            first = False
            if not self._down and self.calls[name] in self.fail.get(name, ()):
                self._down, first, self._failing = self.down_for, True, name
            if not self._down or (self.only_method and name != self._failing):
                return await attribute(*args, **kwargs)
            self._down -= 1
            self.failed.append(name)
            if first and self.lost_reply:
                await attribute(*args, **kwargs)  # done, and its answer lost on the way
            raise self.error(name)

        return call

    def heal(self) -> None:
        """End the outage under way and fail nothing more."""
        self._down = 0
        self.fail = {}
