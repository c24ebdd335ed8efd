"""What the engine's concerns share: its configuration, its store, and this process's drives."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Generic, TypeVar, overload

from .._agent_spec import AgentSpec
from .._loop import AgentRun
from .._random import token_hex
from ..domain import Domain, Router
from ..exceptions import StoreUnavailableError, UserError
from ..models import Model
from ..models._infer import as_model
from ..runtime import Assembly, Mode, Runtime, WrapTools, build_runtime
from ..store import MemoryStore, SessionStore, ToolLogEntry
from ..store._codec import INCARNATION
from ._events import RunLog
from ._retry import LEFT, StoreRetry, transient

_log = logging.getLogger("handrail.engine")
_T = TypeVar("_T")


class EngineCore:
    """The state every concern of an engine reads: one, made by `Engine`, shared by them all.

    `store`, `worker_id` and `lease_owner` may be set after it is made (through the `Engine`,
    whose attributes they are); the rest is fixed. Its store calls that fail for a moment are
    made again (`retrying`, `retry`), as `store_retry` says.
    """

    __slots__ = (
        "assembly",
        "claimed",
        "config",
        "domain",
        "grouping",
        "headless",
        "holds",
        "lease_owner",
        "lease_ttl",
        "locks",
        "lost",
        "org_models",
        "router",
        "running",
        "runtime",
        "store",
        "store_retry",
        "tally",
        "worker_id",
    )

    def __init__(
        self,
        domain: Domain | AgentSpec[Any],
        *,
        store: SessionStore | None,
        runtime: Runtime[Any] | None,
        worker_id: str | None,
        lease_ttl: float,
        mode: Mode,
        model: Model | str | None,
        wrap_tools: WrapTools | None,
        store_retry: StoreRetry | None,
        org_models: Mapping[str, Model | str] | None,
    ) -> None:
        if not lease_ttl > 0:
            raise UserError(f"Engine(lease_ttl={lease_ttl!r}): the lease must last a while.")
        self.assembly = build_runtime(
            domain, runtime=runtime, mode=mode, model=model, wrap_tools=wrap_tools
        )
        self.config = (domain, self.assembly.default_model, wrap_tools)
        self.org_models: dict[str, Model] = {
            org: as_model(m, where=f"Engine(org_models={{{org!r}: ...}})")
            for org, m in (org_models or {}).items()
        }
        self.headless: tuple[Assembly, Router | None] | None = None
        self.domain = self.assembly.domain
        self.runtime: Runtime[Any] = self.assembly.runtime
        self.router = self.domain.router()
        self.store: SessionStore = store if store is not None else MemoryStore()
        self.worker_id = (
            worker_id or os.environ.get("HANDRAIL_WORKER_ID") or f"worker-{token_hex(6)}"
        )
        self.lease_owner = f"{self.worker_id}#{token_hex(6)[: INCARNATION - 1]}"
        self.lease_ttl = lease_ttl
        self.store_retry = store_retry if store_retry is not None else StoreRetry()
        self.lost: set[str] = set()  # sessions whose lease another process took over
        self.locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self.running: dict[str, AgentRun[Any]] = {}
        self.holds: dict[str, Hold] = {}  # the leases this engine's drives hold, by session
        # Sessions whose lease this engine took by claiming them (`claim`, `reclaim`), and
        # when: the drive that follows holds it already (it takes it with no write).
        self.claimed: dict[str, float] = {}
        # A store of this handrail groups a turn's writes (`save(..., lease=, release=,
        # started=, notify=)`, `log_started(..., lease=)`); one written before (a store of
        # your own) gets the same writes one call each.
        self.grouping = takes(self.store.save, "release") and takes(self.store.log_started, "lease")
        self.tally: Counter[str] = Counter()

    def interrupt(self, session_id: str) -> bool:
        """Stop the session's running turn, if one runs in this process; True if one did."""
        run = self.running.get(session_id)
        if run is None:
            return False
        run.interrupt()
        return True

    async def tool_log(self, session_id: str, calls: Collection[str]) -> list[ToolLogEntry]:
        """The entries of `calls` in the session's tool-call log, again while the store fails.

        Only those are read (`tool_log(calls=)`): a session's log grows with its age, a turn's
        calls do not. A store written before the keyword reads its whole log, kept from here.
        """
        store = self.store
        if takes(store.tool_log, "calls"):
            read = lambda: store.tool_log(session_id, calls=calls)  # noqa: E731
            return await self.retrying(read, session_id, "read the tool-call log")
        keep = set(calls)
        log = await self.retrying(
            lambda: store.tool_log(session_id), session_id, "read the tool-call log"
        )
        return [entry for entry in log if entry.tool_call_id in keep]

    async def retrying(
        self,
        call: Callable[[], Awaitable[_T]],
        session_id: str,
        what: str,
        *,
        left: str = LEFT,
    ) -> _T:
        """Make a store call, again after a back-off while it fails for a moment (`transient`).

        Raises:
            StoreUnavailableError: it failed every time (`store_retry.attempts`): the message
                names the session, what was being done and what was left.
            StoreError: it failed in a way that trying again cannot mend (not retried).
        """
        try:  # the way nearly every call goes: once, at once
            return await call()
        except Exception as error:
            return await self.retry(error, call, session_id, what, left=left)

    async def retry(
        self,
        failed: Exception,
        call: Callable[[], Awaitable[_T]],
        session_id: str,
        what: str,
        *,
        left: str = LEFT,
    ) -> _T:
        """`retrying` once `call` failed with `failed`: raise it, or try again after a wait.

        The hot paths make their store call themselves and come here only when it failed,
        so a call that goes through costs nothing more.
        """
        if not transient(failed):
            raise failed
        retry = self.store_retry
        for attempt, wait in enumerate(retry.delays(), 1):
            _log.warning(
                "handrail engine %s: session %r: the store failed to %s (%s: %s); "
                "trying again in %g s (%d/%d)",
                self.lease_owner,
                session_id,
                what,
                type(failed).__name__,
                failed,
                wait,
                attempt,
                retry.attempts,
            )
            await retry.sleep(wait)
            try:
                return await call()
            except Exception as error:
                if not transient(error):
                    raise
                failed = error
        raise StoreUnavailableError(
            f"Session {session_id!r}: the session store did not answer (to {what}) after "
            f"{retry.attempts} attempt(s); last: {type(failed).__name__}: {failed}. {left}",
            session_id=session_id,
            attempts=retry.attempts,
        ) from failed


class Shared(Generic[_T]):
    """An attribute of `Engine` that is its `EngineCore`'s: read and set there, by its name.

    What the concerns share and may be set after the engine is made (`store`, `worker_id`,
    `lease_owner`): setting it on the engine sets it for every concern at once.
    """

    __slots__ = ("name",)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, engine: None, owner: type) -> Shared[_T]: ...
    @overload
    def __get__(self, engine: object, owner: type) -> _T: ...
    def __get__(self, engine: object, owner: type) -> Shared[_T] | _T:
        if engine is None:
            return self
        value: _T = getattr(engine._core, self.name)  # type: ignore[attr-defined]
        return value

    def __set__(self, engine: object, value: _T) -> None:
        setattr(engine._core, self.name, value)  # type: ignore[attr-defined]


class Hold:
    """A drive's hold on its session's lease: `held`, then `released` by a save.

    Held once taken (by the drive's first write, or a claim); `stop` ends its renewals. A
    recovery takes it `early`, before its first write (`Leases.take_early`): that write still
    counts as the drive's first (it carries the lease again, and is what makes it `held`).
    `wrote` once the drive has written (its events are held back till then); `log`: where its
    events go, if they are logged (`Engine.log_run`).
    """

    __slots__ = ("_start", "early", "held", "log", "released", "stop", "wrote")

    def __init__(
        self,
        stop: Callable[[], Awaitable[None]],
        start: Callable[[], None],
        log: RunLog | None = None,
    ) -> None:
        self.stop = stop
        self._start = start
        self.held = False
        self.early = False
        self.released = False
        self.wrote = False
        self.log = log

    def written(self) -> None:
        """The drive has written to the store: what it yields may be shown from now on."""
        if not self.wrote:
            self.wrote = True
            if self.log is not None:
                self.log.opened()

    def take(self, *, early: bool = False) -> None:
        """The lease is held at the store now: renew it from here on (`early`: see above)."""
        if not (self.held or self.early):
            self._start()
        if early:
            self.early = True
        else:
            self.held = True


def takes(method: Callable[..., Any], name: str) -> bool:
    """Whether `method` takes a keyword argument `name` (or any: `**kwargs`)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in parameters)
