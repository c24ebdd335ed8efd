"""`Engine`: agents as an application: sessions, routes, and the human in the loop.

An engine drives turns of stored sessions. `submit` runs one user turn (one read of the session
at the start, one write at the end, before the terminal event is handed out); `resolve`
records a decision on a pending call (persisted before it returns); `resume` continues a
suspended turn once nothing is pending, in the same assistant message, without a new model
call to decide the decided calls again; `expire_due` sweeps deadlines; `interrupt` stops a
running turn from another task.

A session belongs to the org and user that created it: any other caller gets
`SessionNotFoundError`, exactly as if it did not exist. The inbox (`pending`, `decidable`:
the calls waiting for a decider, across sessions) lives in `handrail.inbox`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import logging
import os
import time
import weakref
from collections import Counter
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, TypeVar

from pydantic import ValidationError

from ._agent_spec import AgentSpec
from ._captured import (
    ApplyReport,
    CapturedAction,
    HeadlessResult,
    batch_card,
    captured_actions,
    run_actions,
)
from ._deadlines import CLIENT_GRACE, ttl_for
from ._loop import AgentResult, AgentRun
from ._random import token_hex
from ._redact import public_event
from ._tool_result import ToolResult
from ._turn import check_resumable, run_turn
from .audit import AuditEntry, call_entry, decision_entry
from .domain import Domain, Router
from .events import EVENT, Event, RunCompleted, RunStarted, RunSuspended
from .exceptions import (
    ConflictError,
    SessionBusyError,
    SessionCorruptError,
    SessionNotFoundError,
    StoreError,
    StoreUnavailableError,
    UserError,
)
from .gate import Gate, TurnRequest, admit
from .inbox import Inbox, PendingCard, PendingPage, deciding_tools
from .messages import ApprovalCardPart, CardKind, Message, TextPart, ToolCallPart
from .models import Model
from .models._infer import as_model
from .policy import Decider
from .recovery import RESULT as _RESULT
from .recovery import reconcile, result_record
from .runtime import Assembly, Mode, Runtime, WrapTools, build_runtime
from .state import Progress, RunState
from .store import (
    MemoryStore,
    SessionRecord,
    SessionStatus,
    SessionStore,
    SessionSummary,
    ToolLogEntry,
)
from .store._codec import INCARNATION
from .store._waiting import waiting_cards
from .suspension import (
    Decision,
    approved_plan,
    args_digest,
    card_event,
    current_digest,
    decide,
    expire,
)
from .tools._dispatch import Dispatcher, completed_event

__all__ = [
    "Domain",
    "Engine",
    "PendingCard",
    "PendingPage",
    "Resolution",
    "StoreRetry",
    "transient",
]

_log = logging.getLogger("handrail.engine")

_TERMINAL = frozenset({"run-completed", "run-suspended", "run-failed"})
SKIPPED = (SessionBusyError, SessionNotFoundError, ConflictError)
"""What a worker passes over: another worker got to the session first, or it went."""
_T = TypeVar("_T")

_LEFT = (
    "The turn is left as a crash at this point leaves it: nothing stored is lost, and "
    "engine.advance(session_id) (or a Worker, by itself) finishes it once the store answers "
    "again."
)
"""What a `StoreUnavailableError` from a turn says was left."""


def transient(error: BaseException) -> bool:
    """Whether a store call that raised `error` may go through if made again.

    A `StoreUnavailableError` (what the stores raise for a lost or refused connection, a
    pool with no connection to give, a SQLite database locked past `busy_timeout`), and a
    `ConnectionError` or `TimeoutError` from a store of one's own. Never a `ConflictError`, a
    refused save or an unreadable row: the same call would fail the same way.
    """
    if isinstance(error, StoreUnavailableError):
        return True
    return isinstance(error, ConnectionError | TimeoutError) and not isinstance(error, StoreError)


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreRetry:
    """How an engine retries a store call that failed for a moment (see `transient`).

    A call is made up to `attempts` times in all, waiting `delay` seconds after the first
    failure and twice as long after each next one, at most `max_delay`: by default 6 attempts
    over about 3 s, enough for a dropped connection, a busy database, or a PostgreSQL
    restart. When the store stays away, the turn is left as a crash at that point leaves it,
    for `Engine.advance` or a `Worker` to finish (durability.md, "What a store fault does").

    Args:
        attempts: tries in all, the first one included (1: never retry).
        delay: seconds to wait after the first failure.
        max_delay: the longest wait between two tries.
        sleep: how to wait (`asyncio.sleep`; a test passes one that returns at once).
    """

    attempts: int = 6
    delay: float = 0.1
    max_delay: float = 2.0
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def __post_init__(self) -> None:
        if self.attempts < 1 or not self.delay >= 0 or not self.max_delay >= self.delay:
            raise UserError(
                f"StoreRetry(attempts={self.attempts!r}, delay={self.delay!r}, "
                f"max_delay={self.max_delay!r}): attempts must be at least 1, and "
                f"0 <= delay <= max_delay."
            )

    def delays(self) -> list[float]:
        """The waits between the tries, in order (one fewer than `attempts`)."""
        waits, delay = [], self.delay
        for _ in range(self.attempts - 1):
            waits.append(delay)
            delay = min(delay * 2, self.max_delay)
        return waits


@dataclass(kw_only=True, slots=True)
class Resolution:
    """What `Engine.resolve` recorded, and what is still pending."""

    decided: list[str]
    """The calls this resolution decided (an approval of a call that needs more approvals is
    recorded on its card, and the call stays pending)."""
    pending: list[str]
    """The calls still waiting for a decision."""
    org_id: str | None = None
    """The session's organisation, as stored."""
    user_id: str | None = None
    """The session's user, as stored: whoever decided, the turn goes on as theirs."""

    @property
    def ready(self) -> bool:
        """Whether nothing is pending any more: the turn can `resume`."""
        return not self.pending


class Engine:
    """Runs the turns of stored sessions through a domain's agents.

    Args:
        domain: the agents and routes (a lone `Agent` is a domain of one).
        store: where sessions live (default: a `MemoryStore`, which forgets on exit).
        runtime: dependencies, hooks, policy, clock and ids, shared by every run.
        worker_id: this worker's name in session leases: give each process a stable one (its
            host or pod name), so that, restarted, it takes its own turns back at once
            (`reclaim`). Default: `HANDRAIL_WORKER_ID`, else a random one (a restarted
            process then waits for its old leases to lapse).
        lease_ttl: seconds a worker's lease on a session lasts unless renewed (it is renewed
            while a turn runs); a dead worker's sessions are taken over after it.
        mode: `live`, or `mock` for evals and tests (see `build_runtime`).
        model: the default model for agents that name none (over `runtime.model`).
        org_models: organisation id -> the model its turns use, for agents that name none
            (over `model`). The order, highest first: the turn's `model=`, the agent's, the
            organisation's, the engine's `model=`, `runtime.model` (docs/engine.md).
        wrap_tools: replaces tools with mocks or wrappers (see `build_runtime`).
        store_retry: how a store call that failed for a moment is retried (`StoreRetry`);
            when the store stays away, the turn is left for recovery, as a crash leaves it.
        gate: who may start a turn at all (a plan, a feature flag): asked by every entry
            point before it starts a caller's turn, with a `TurnRequest`; None lets the
            caller in, a reason refuses it (`handrail.gate`; the server answers 403).
    """

    def __init__(
        self,
        domain: Domain | AgentSpec[Any],
        *,
        store: SessionStore | None = None,
        runtime: Runtime[Any] | None = None,
        worker_id: str | None = None,
        lease_ttl: float = 30.0,
        mode: Mode = "live",
        model: Model | str | None = None,
        wrap_tools: WrapTools | None = None,
        store_retry: StoreRetry | None = None,
        gate: Gate | None = None,
        org_models: Mapping[str, Model | str] | None = None,
    ) -> None:
        if not lease_ttl > 0:
            raise UserError(f"Engine(lease_ttl={lease_ttl!r}): the lease must last a while.")
        self.assembly = build_runtime(
            domain, runtime=runtime, mode=mode, model=model, wrap_tools=wrap_tools
        )
        self._config = (domain, self.assembly.default_model, wrap_tools)
        self.org_models: dict[str, Model] = {
            org: as_model(m, where=f"Engine(org_models={{{org!r}: ...}})")
            for org, m in (org_models or {}).items()
        }
        self._headless: tuple[Assembly, Router | None] | None = None
        self.domain = self.assembly.domain
        self.runtime: Runtime[Any] = self.assembly.runtime
        self._router = self.domain.router()
        self.store: SessionStore = store if store is not None else MemoryStore()
        self.worker_id = (
            worker_id or os.environ.get("HANDRAIL_WORKER_ID") or f"worker-{token_hex(6)}"
        )
        self.lease_owner = f"{self.worker_id}#{token_hex(6)[: INCARNATION - 1]}"
        """This process's name on the leases it holds: its worker id and its incarnation."""
        self.lease_ttl = lease_ttl
        self.store_retry = store_retry if store_retry is not None else StoreRetry()
        self.gate: Gate | None = gate
        """Who may start a turn at all (`handrail.gate`), asked by the entry points."""
        self._lost: set[str] = set()  # sessions whose lease another process took over
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._running: dict[str, AgentRun[Any]] = {}
        self._holds: dict[str, _Hold] = {}  # the leases this engine's drives hold, by session
        # Sessions whose lease this engine took by claiming them (`claim`, `reclaim`), and
        # when: the drive that follows holds it already (it takes it with no write).
        self._claimed: dict[str, float] = {}
        # A store of this handrail groups a turn's writes (`save(..., lease=, release=,
        # started=, notify=)`, `log_started(..., lease=)`); one written before (a store of
        # your own) gets the same writes one call each.
        self._grouping = _takes(self.store.save, "release") and _takes(
            self.store.log_started, "lease"
        )
        self.tally: Counter[str] = Counter()
        """What this engine's drives of suspended or cut-off turns did, counted since it was
        made: `resumed` and `recovered` turns, `applied` batches, `expired` cards (what a
        `Worker`'s health line reports)."""

    # -- turns -----------------------------------------------------------------------------

    async def admit(self, request: TurnRequest) -> None:
        """Ask the engine's gate whether `request`'s caller may start a turn.

        Every entry point that starts a caller's turn asks first, before it stores anything
        (`submit` itself does not: a library call is trusted).

        Raises:
            TurnRefusedError: the gate refused, with its reason.
        """
        await admit(self.gate, request)

    def submit(
        self,
        session_id: str,
        text: str,
        *,
        org_id: str | None = None,
        user_id: str | None = None,
        model: Model | str | None = None,
        route: str | None = None,
        client: bool = False,
        create: bool = True,
        roles: Iterable[str] | None = None,
        context: Any = None,
    ) -> AgentRun[Any]:
        """Run one user turn of a session (created on first use) as a stream of events.

        The events end with exactly one of `run-completed`, `run-suspended`, `run-failed`,
        handed out only once the session is saved and free again (its lease released).

        Args:
            session_id: the session.
            text: the user's message.
            org_id: the caller's organisation (scope comes from here, never from the model).
            user_id: the caller.
            model: a model for this turn, over the agents' and the runtime's.
            route: the route to take (default: the domain's default route).
            client: whether the caller can run `client` tools (without, they fail fast).
            create: make the session if there is none; False: a `SessionNotFoundError`
                instead (the server makes sessions only with `POST /sessions`).
            roles: the caller's roles, which `tools_for` chooses the turn's tools from (kept
                with the session for the turn's resumption; None: those it has).
            context: the per-turn context (the page, the record the user is on, the locale):
                validated against `Domain(context_model=...)` now, stored with the turn,
                read by tools (`ctx.turn_context`) and bindings (`sys:context.<field>`),
                never shown to the model unless the instructions say so.

        Raises:
            InvalidContextError: `context` does not fit the domain's context model, or an
                agent's instructions read a `{context.<field>}` it lacks (raised here, before
                anything is stored).
        """
        turn_context = self.domain.check_context(context, route=route)
        plan: list[AgentSpec[Any]] | Router
        if route is None and self._router is not None:
            plan = self._router  # the supervisor picks
        else:
            plan = self.domain.route(route)
        return self._drive(
            session_id,
            text,
            plan,
            org_id,
            user_id,
            model,
            client,
            create=create,
            turn_context=turn_context,
            roles=roles,
        )

    def resume(
        self,
        session_id: str,
        *,
        org_id: str | None = None,
        user_id: str | None = None,
        model: Model | str | None = None,
        client: bool = False,
    ) -> AgentRun[Any]:
        """Continue a suspended turn once every pending call is decided.

        Decided calls are settled (approved ones run now), then the suspended agent's loop goes
        on with its remaining iterations, then the rest of its route. A turn cut off while it
        ran (a resumption whose worker died) is recovered first, as `recover` does.

        Raises (when iterated):
            UserError: the session has no suspended turn, or a decision is still missing.
            SessionBusyError: another worker drives the session right now (raised at the
                resumption's first write, before any event, side effect or model call).
        """
        return self._drive(session_id, None, None, org_id, user_id, model, client)

    def recover(
        self,
        session_id: str,
        *,
        org_id: str | None = None,
        user_id: str | None = None,
        model: Model | str | None = None,
        client: bool = False,
    ) -> AgentRun[Any]:
        """Finish a turn that was cut off while it ran (the worker crashed or was killed).

        The calls it left are settled from the tool-call log (`handrail.recovery`): a logged
        result is used, never run again; a call that may have run is run again only when its
        tool is idempotent, and otherwise becomes a `recovery` card, and the turn suspends for
        a person to decide (retry or skip). Then the turn goes on where it stopped.

        Raises (when iterated):
            UserError: the session has no turn cut off while running.
            SessionBusyError: a live worker still drives it (its lease has not expired).
        """
        return self._drive(session_id, None, None, org_id, user_id, model, client, mode="recover")

    async def advance(
        self, session_id: str, *, org_id: str | None = None, user_id: str | None = None
    ) -> AgentResult[Any] | None:
        """Take a session as far as it can go from whatever state it was left in.

        - A turn cut off while it ran, or while it resumed: recovered from the tool-call log
          (`recover`); the cards of its last response, and a recovery card for each call that
          may have run, suspend it again.
        - A suspended turn whose every call is decided: resumed (`resume`); a decided batch
          card: applied.
        - A turn that still waits for a decision, or no turn in progress: nothing to do.

        Its events go to the session's event log (as `drain`), where a client reads them. A
        restarted process calls this for the sessions it finds; `Worker` calls it for each
        session its sweeps and wake-ups name.

        Returns:
            How the turn ended, or None when there was nothing to do.

        Raises:
            SessionNotFoundError: no such session for this caller.
            SessionBusyError: a live worker drives the session right now.
        """
        run = self._drive(
            session_id, None, None, org_id, user_id, None, False, mode="advance", create=False
        )
        events = [EVENT.dump_python(event, mode="json") async for event in run]
        if events:
            await self._log_turn(session_id, events)
        return run._result

    async def run_headless(
        self,
        session_id: str,
        text: str,
        *,
        org_id: str | None = None,
        user_id: str | None = None,
        model: Model | str | None = None,
        route: str | None = None,
        propose: bool = False,
        roles: Iterable[str] | None = None,
        context: Any = None,
    ) -> HeadlessResult:
        """Run one user turn with nobody present (a cron job, a webhook): in capture mode.

        Gated calls are not run: each is recorded as a `CapturedAction` with its tool's
        `mint` prediction, which the model sees (see `handrail.capture`); read-only tools
        run for real. Apply the actions later with `handrail.capture.apply`, or, with
        `propose=True`, let a person approve them as ONE batch card: the session then waits
        (`run-suspended`) for `resolve(card, Approve(...) | Reject(...))`, and `resume` (or
        `apply`) applies what was approved.

        Args:
            session_id: the session (created on first use).
            text: the message (the cron job's instruction, the webhook's payload).
            org_id: the organisation the run acts for.
            user_id: the user it acts for.
            model: a model for this turn, over the agents' and the runtime's.
            route: the route to take (default: the supervisor's choice, or the default route).
            propose: raise a batch card for the captured actions (when there are any).
            roles: the roles it acts with, which `tools_for` chooses the turn's tools from.
            context: the per-turn context, as for `submit`.

        Returns:
            The final text, the captured actions, the events, and the batch card's id.
        """
        turn_context = self.domain.check_context(context, route=route)
        assembly, router = self._capture_assembly()
        plan = router if route is None and router is not None else assembly.domain.route(route)
        headless = _Headless(propose=propose)
        run = self._drive(
            session_id,
            text,
            plan,
            org_id,
            user_id,
            model,
            False,
            assembly,
            headless,
            turn_context=turn_context,
            roles=roles,
        )
        events = [event async for event in run]
        result = run.result
        output = result.output
        last = result.state.messages[-1] if result.state.messages else None
        return HeadlessResult(
            text=last.text if last is not None and last.role == "assistant" else "",
            actions=headless.actions,
            output=None if isinstance(output, str) else output,
            outcome=result.outcome,
            events=events,
            card=headless.card,
        )

    async def apply(
        self, session_id: str, *, org_id: str | None = None, user_id: str | None = None
    ) -> ApplyReport:
        """Apply the decided batch card of a session (as `resume` does) and report.

        Raises:
            UserError: the session has no decided batch card to apply.
            InvalidDecisionError: the recorded plan does not match what was approved.
        """
        _, state = await self._load(session_id, org_id, user_id)
        card = _batch_to_apply(state)
        if card is None:
            raise UserError(
                f"Session {session_id!r} has no decided batch card to apply"
                + (f" (still waiting on {', '.join(state.pending)})." if state.pending else ".")
            )
        async for _ in self.resume(session_id, org_id=org_id, user_id=user_id):
            pass
        _, state = await self._load(session_id, org_id, user_id)
        card = next(
            p
            for m in reversed(state.messages)
            for p in m.parts
            if isinstance(p, ApprovalCardPart) and p.tool_call_id == card.tool_call_id
        )
        return ApplyReport.of(card.output["actions"])

    def _capture_assembly(self) -> tuple[Assembly, Router | None]:
        if self.assembly.mode == "capture":
            return self.assembly, self._router
        if self._headless is None:
            domain, model, wrap_tools = self._config
            assembly = build_runtime(
                domain, runtime=self.runtime, mode="capture", model=model, wrap_tools=wrap_tools
            )
            self._headless = assembly, assembly.domain.router()
        return self._headless

    def _drive(
        self,
        session_id: str,
        text: str | None,
        plan: list[AgentSpec[Any]] | Router | None,
        org_id: str | None,
        user_id: str | None,
        model: Model | str | None,
        client: bool,
        assembly: Assembly | None = None,
        headless: _Headless | None = None,
        *,
        mode: _Mode = "resume",
        create: bool = True,
        roles: Iterable[str] | None = None,
        turn_context: Any = None,
    ) -> AgentRun[Any]:
        parts = assembly or self.assembly
        if model is not None:  # a model string that does not name one is refused now
            model = as_model(model, where="model=")

        async def turn(
            run: AgentRun[Any], loaded: SessionRecord | None
        ) -> AsyncGenerator[Event, None]:
            record, state = await self._load(
                session_id, org_id, user_id, create=create, loaded=(loaded,)
            )
            if roles is not None and text is not None:  # a new turn: its caller's roles
                state.roles = frozenset(roles)
            route = plan
            batch = _batch_to_apply(state) if text is None else None
            if batch is not None:
                self.tally["applied"] += 1
                async for event in self._apply_batch(run, record, state, batch):
                    yield event
                return
            if text is None:
                progress = state.progress
                if mode == "advance":
                    expired = expire(state, self.runtime.clock())  # deadlines passed: decided
                    self.tally["expired"] += len(expired)
                    if progress is None or (progress.status == "suspended" and state.pending):
                        # Nothing to drive; the store learns when there next will be.
                        if expired or record.expires_at != self._needs_worker(state):
                            with contextlib.suppress(ConflictError):
                                await self._save(record, state, record.status, release=True)
                        return
                    recovering = progress.status == "running"
                else:
                    recovering = mode == "recover"
                    expected = "running" if recovering else "suspended"
                    if progress is not None and progress.status == "running":
                        # A resumption's first write marks its turn running: cut off after it
                        # (its worker died), it is recovered, as `recover` would.
                        recovering = True
                    elif progress is None or progress.status != expected:
                        raise UserError(_NOTHING[expected].format(session=session_id))
                if recovering:  # what an operator watches: a worker died, or lost its lease
                    _log.warning(
                        "handrail engine %s: recovering session %r, whose turn was cut off",
                        self.lease_owner,
                        session_id,
                    )
                # A turn cut off while it ran may hold cards of its last response: they wait.
                check_resumable(state, None, [progress.agent], waiting=recovering)
                router = self._router
                if router is not None and progress.agent == router.supervisor.name:
                    route, cards = router, []  # cut off while choosing: choose again
                else:
                    agents = self._agents(progress.route or [progress.agent])
                    route = agents
                    # A resumption cut off by a crash leaves the turn looking suspended:
                    # the log says which of its calls already started, or finished.
                    agent = agents[progress.step]
                    cards = await self._reconcile(session_id, state, agent)
                # Recovered: cut off while it ran, or while it resumed (its calls' log says so).
                self.tally["recovered" if recovering or cards else "resumed"] += 1
                if cards or state.pending:  # new recovery cards, or the response's own ones
                    progress.status = "suspended"
                    await self._save(record, state, "suspended", release=True)
                    run._result = AgentResult(
                        outcome="suspended", state=state, pending=list(state.pending)
                    )
                    for event in self._pending_events(state):
                        yield event
                    return
            assert route is not None
            if text is not None:  # a new turn carries its own context (a resumed one, its own)
                state.turn_context = turn_context
                if state.turn == 0 and state.progress is None and self.domain.state_from_context:
                    state.domain_state = self.domain.first_state(turn_context)
            state.client_connected = client
            journal = _SessionJournal(self, record, state)
            first_capture = state.captures
            inner = run_turn(
                route,
                text,
                state=state,
                runtime=self.runtime,
                journal=journal,
                models=lambda agent: parts.model_for(
                    agent, model, org=self.org_models.get(state.org_id or "")
                ),
            )
            self._running[session_id] = inner
            try:
                async for event in inner:
                    yield event  # `body` holds its last one back until the session is saved
            finally:
                self._running.pop(session_id, None)
                state.client_connected = False
            result = run._result = inner.result
            if headless is not None:
                headless.actions = captured_actions(state, first_capture)
                if headless.propose and headless.actions and result.outcome == "completed":
                    card = self._propose(state, headless.actions)
                    headless.card = card.tool_call_id
                    run._result = dataclasses.replace(
                        result, outcome="suspended", pending=[card.tool_call_id]
                    )
                    await self._save(record, state, "suspended", release=True)
                    yield card_event(card, None)
                    yield RunSuspended(pending=[card.tool_call_id])
                    return
            # The drive's last write: its lease goes back with it.
            await self._save(record, state, _STATUS[result.outcome], release=True)

        async def body(run: AgentRun[Any]) -> AsyncGenerator[Event, None]:
            terminal: Event | None = None
            async with self._lock(session_id):
                for attempt in range(_STALE_TRIES):
                    # Until the drive's first write has taken the lease, its events are held
                    # back: a drive that finds the session busy there has shown nothing.
                    held: list[Event] = []
                    try:
                        async with self._leased(session_id) as (hold, loaded):
                            async for event in turn(run, loaded):
                                if event.type in _TERMINAL:
                                    terminal = event
                                elif not hold.held:
                                    held.append(event)
                                else:
                                    for early in held:
                                        yield early
                                    held.clear()
                                    yield event
                    except _Taken:
                        raise _busy(session_id) from None
                    except _Stale:
                        # Saved by another since it was read: read again and start over.
                        if attempt + 1 == _STALE_TRIES:
                            raise _busy(session_id) from None
                        terminal = None
                        run._result = None
                        continue
                    for early in held:  # a drive that wrote nothing
                        yield early
                    break
            # The last event comes once the session is free (saved, unlocked, its lease
            # released), so whoever reads it may start the session's next turn at once. (A
            # later one replaces it: a headless turn that completed suspends on its batch.)
            if terminal is not None:
                yield terminal

        return AgentRun(body)

    def _pending_events(self, state: RunState) -> list[Event]:
        """A suspension announced again: `run-started`, each pending card's event, `run-suspended`.

        A turn recovered from a crash suspends this way: a client may never have seen its cards.
        """
        tools = self.domain.tools()
        events: list[Event] = [RunStarted(run_id=state.run_id, session_id=state.session_id)]
        events += [card_event(card, tools.get(card.tool_name)) for card in state.pending.values()]
        events.append(RunSuspended(pending=list(state.pending)))
        return events

    def _propose(self, state: RunState, actions: list[CapturedAction]) -> ApprovalCardPart:
        """Put a captured turn's actions on ONE batch card and suspend the session on it."""
        message = state.messages[-1]  # the turn's answer
        card = batch_card(
            actions,
            self.domain.tools(),
            card_id=self.runtime.ids("batch"),
            now=self.runtime.clock(),
            ttl=ttl_for("batch", self.domain.expires_after, self.runtime.pending_ttl),
        )
        message.parts.append(card)
        state.pending[card.tool_call_id] = card
        state.progress = Progress(
            agent=message.agent or "", message_id=message.id, status="suspended"
        )
        return card

    async def _apply_batch(
        self, run: AgentRun[Any], record: SessionRecord, state: RunState, card: ApprovalCardPart
    ) -> AsyncGenerator[Event, None]:
        """Apply a decided batch card's actions (going on from a crash, from the log)."""
        assert state.progress is not None
        report = ApplyReport(actions=approved_plan(card))
        state.progress.status = "running"  # a crash from here on is recovered from the log
        await self._save(record, state, "active")  # the drive's first write: its lease
        yield RunStarted(run_id=state.run_id, session_id=state.session_id)
        entries = await self._retrying(
            lambda: self.store.tool_log(record.id), record.id, "read the tool-call log"
        )
        logged = {e.tool_call_id: e for e in entries}
        tools = self.domain.tools()
        dispatcher = Dispatcher(
            tools, state, self.runtime, "apply", journal=_SessionJournal(self, record, state)
        )

        async def execute(
            action: CapturedAction, args: dict[str, Any], bound: dict[str, Any] | None
        ) -> ToolCallPart:
            entry = logged.get(action.call_id)
            tool = tools.get(action.tool)
            if entry is None or (entry.result is None and tool is not None and tool.idempotent):
                return await dispatcher.apply(action, args, bound)
            part = ToolCallPart(id=action.call_id, name=action.tool, args=entry.args)
            if entry.result is not None:  # it ran before a crash: its result stands
                part.result = _RESULT.validate_python(entry.result)
            else:
                part.result = ToolResult.failure(
                    f"Action {action.local_index} ({action.tool}) may have run before the "
                    f"worker applying it stopped; its effect is unknown, so it is not run "
                    f"again. Check whether it happened.",
                    code="interrupted",
                )
            part.status = "completed" if part.result.ok else "failed"
            return part

        async for part in run_actions(report, execute):
            yield completed_event(part)
        card.output = {"actions": [a.model_dump(mode="json") for a in report.actions]}
        summary = _report_text(report)
        # What really happened goes into the history, where people and the next turn's
        # model read it beside the proposals (whose predicted results were never results).
        state.messages.append(
            Message(
                id=self.runtime.ids("msg"),
                role="system",
                parts=[TextPart(text=_outcome_text(card.tool_call_id, report), synthetic=True)],
            )
        )
        state.progress = None
        await self._save(record, state, "completed" if report.ok else "failed", release=True)
        run._result = AgentResult(outcome="completed", state=state, output=summary)
        yield RunCompleted(output=summary)

    async def _reconcile(
        self, session_id: str, state: RunState, agent: AgentSpec[Any]
    ) -> list[ApprovalCardPart]:
        progress = state.progress
        assert progress is not None
        if not progress.message_id:
            return []  # cut off before any call was dispatched: nothing ran
        message = state.find_message(progress.message_id)  # a scratch agent's, maybe
        log = await self._retrying(
            lambda: self.store.tool_log(session_id), session_id, "read the tool-call log"
        )
        return reconcile(state, message, log, agent.tools, now=self.runtime.clock())

    async def drain(self, session_id: str, run: AgentRun[Any]) -> AgentResult[Any]:
        """Run `run` (a turn of `session_id`) to its end with nobody watching; its result.

        Its events are kept in the session's event log, as a served turn's are, so a client
        can still read or stream them (`GET /sessions/{id}/events`). `Worker` and
        `recover_stale` drive turns this way.
        """
        await self._log_turn(
            session_id, [EVENT.dump_python(event, mode="json") async for event in run]
        )
        return run.result

    async def _log_turn(self, session_id: str, events: list[dict[str, Any]]) -> None:
        """Log a turn's events once it has run, again while the store fails for a moment."""
        await self._retrying(
            lambda: self.log_events(session_id, events),
            session_id,
            "log the turn's events",
            left="The turn went as far as it could; its events are not in the event log.",
        )

    async def log_events(
        self, session_id: str, events: list[dict[str, Any]]
    ) -> tuple[int, list[dict[str, Any]]]:
        """Append events to the session's event log, as its clients may read them.

        The one way events enter an event log: a failure's detail is replaced by a reference
        on the way (see `handrail._redact`).

        Args:
            session_id: the session.
            events: as `EVENT.dump_python(event, mode="json")` gives them.

        Returns:
            The number of the last event in the log, and the events as logged.
        """
        logged = [public_event(session_id, event) for event in events]
        return await self.store.append_events(session_id, logged), logged

    async def advance_due(self, *, limit: int = 100) -> list[str]:
        """Advance, one after the other, the sessions that need a worker now.

        They are claimed from the store first (`SessionStore.claim`: due, and no live worker
        holds their lease), so workers sweeping together share them out: cut-off turns whose
        worker died, decided turns whose wake-up was lost, cards past their deadline.

        Returns:
            The ids of the sessions that moved (see `advance`).
        """
        claimed = await self.claim(self.runtime.clock(), limit=limit)
        return await self._advance_each([summary.id for summary in claimed])

    async def claim(self, now: float, *, limit: int = 100) -> list[SessionSummary]:
        """Claim the sessions that need a worker at `now` for this engine (`SessionStore.claim`).

        Their leases are this engine's (`lease_owner`) for `lease_ttl`: a drive of one of
        them that starts soon (`advance`) holds its lease from the start, with no write to
        take it.
        """
        claimed = await self.store.claim(now, self.lease_owner, self.lease_ttl, limit=limit)
        self._note_claimed(summary.id for summary in claimed)
        return claimed

    def _note_claimed(self, session_ids: Iterable[str]) -> None:
        at = time.monotonic()
        for session_id in session_ids:
            self._claimed[session_id] = at
        if len(self._claimed) > 10_000:  # claimed and never driven: forget the stale ones
            stale = [s for s, t in self._claimed.items() if at - t >= self.lease_ttl / 3]
            for session_id in stale:
                del self._claimed[session_id]

    async def reclaim(self) -> list[str]:
        """Take back, at once, the turns a previous process with this worker id was driving.

        Their leases become this process's (`SessionStore.adopt_leases`) instead of lapsing
        after `lease_ttl`, and each session is advanced (`advance`). Call it when a process
        starts (`Worker.run` does). A process that still lives under the same worker id (two
        processes given one id) loses those leases: it stops their turns and acts no more for
        them, so one process at a time acts for a session.

        Returns:
            The ids of the sessions that moved.
        """
        adopted = await self.store.adopt_leases(self.worker_id, self.lease_owner)
        self._note_claimed(adopted)
        return await self._advance_each(adopted)

    async def _advance_each(self, session_ids: list[str]) -> list[str]:
        """`advance` each session, one after the other, in its own scope; the ids that moved.

        A session another worker got to first, or that went, is passed over.
        """
        moved: list[str] = []
        for session_id in session_ids:
            try:
                if await self.advance_owned(session_id) is not None:
                    moved.append(session_id)
            except SKIPPED:
                continue
        return moved

    async def advance_owned(self, session_id: str) -> AgentResult[Any] | None:
        """`advance`, in the session's own scope (read from its metadata: a worker's view).

        Raises:
            SessionNotFoundError: there is no such session.
            SessionBusyError: a live worker drives the session right now.
        """
        found = await self.store.summary(session_id)
        if found is None:
            raise SessionNotFoundError(f"No session {session_id!r}.", session_id=session_id)
        return await self.advance(session_id, org_id=found.org_id, user_id=found.user_id)

    async def recover_stale(self) -> list[str]:
        """Recover every session whose turn was cut off and whose worker's lease has expired.

        The same sweep as `advance_due` (which also resumes decided turns and expires
        deadlines): the sessions come from the store's index of what needs a worker.

        Returns:
            The ids of the sessions that moved (finished, or suspended on recovery cards).
        """
        return await self.advance_due(limit=1_000)

    # -- decisions -------------------------------------------------------------------------

    async def resolve(
        self,
        session_id: str,
        tool_call_id: str,
        decision: Decision,
        *,
        org_id: str | None = None,
        user_id: str | None = None,
        decider: Decider | None = None,
    ) -> Resolution:
        """Record a decision on one pending call; return once it is stored.

        Args:
            session_id: the session.
            tool_call_id: the pending call.
            decision: what was decided.
            org_id: the session's organisation (its scope), without a `decider`.
            user_id: the session's user, without a `decider`.
            decider: who decides, as authenticated (`handrail.policy.Decider`): the session
                may be any of the decider's organisation, and the call's policy decides
                whether they may decide it. Without one, the caller names the session's
                scope and is trusted where no policy applies.

        Raises:
            SessionNotFoundError: no such session for this caller.
            StaleResolutionError: the call is unknown, already decided or expired; nothing
                changed.
            InvalidDecisionError: the decision does not fit the call; nothing changed.
            DecisionNotAllowedError: the call's policy does not let the decider make it;
                nothing changed.
        """
        return await self.resolve_many(
            session_id,
            {tool_call_id: decision},
            org_id=org_id,
            user_id=user_id,
            decider=decider,
        )

    async def resolve_many(
        self,
        session_id: str,
        decisions: Mapping[str, Decision],
        *,
        org_id: str | None = None,
        user_id: str | None = None,
        decider: Decider | None = None,
    ) -> Resolution:
        """Record decisions on several pending calls at once: all of them, or none.

        Concurrent decisions on one session (another approver's, from another process) are
        decided again on the state that won the store's compare-and-swap: each approval
        counts once, and none is lost.

        Raises:
            as `resolve`, for the first decision that cannot be recorded (then none is).
        """
        if not decisions:
            raise UserError("resolve_many needs at least one decision.")
        if decider is not None and (org_id is not None or user_id is not None):
            raise UserError(
                "resolve: give a decider= (whose organisation scopes the session), or "
                "org_id=/user_id=, not both."
            )
        while True:
            async with self._lock(session_id):
                if decider is None:
                    record, state = await self._load(session_id, org_id, user_id)
                else:
                    record, state = await self._load(session_id, decider.org_id, any_user=True)
                now = self.runtime.clock()
                tools = deciding_tools(self.domain, state)
                cards = [
                    (
                        decide(
                            state,
                            tools,
                            tool_call_id,
                            decision,
                            now=now,
                            decider=decider,
                            policies=self.domain.policies,
                        ),
                        decision.via,
                    )
                    for tool_call_id, decision in decisions.items()
                ]
                # The decisions' audit entries are written by the same save: one transaction,
                # so the trail never misses a stored decision nor records one that was not.
                record.audit = self._decision_entries(record, cards)
                ready = not state.pending
                try:
                    # Decided in full: a worker waiting on the store may resume, woken by the
                    # save itself (one commit).
                    await self._save(record, state, record.status, notify=ready)
                except ConflictError:
                    continue  # another worker saved in between: decide again on its state
                finally:
                    record.audit = []
                return Resolution(
                    decided=[i for i in decisions if i not in state.pending],
                    pending=list(state.pending),
                    org_id=record.org_id,
                    user_id=record.user_id,
                )

    @property
    def inbox(self) -> Inbox:
        """The inbox over this engine's store: the calls waiting for a decider (`Inbox`).

        `pending` and `decidable` are its own; `inbox.sessions` lists the sessions that
        hold such calls. Both read the store's inbox index (`SessionStore.waiting`).
        """
        return Inbox(self.store, self.domain, load=self.session, clock=self.runtime.clock)

    def decidable(self, state: RunState, decider: Decider) -> list[str]:
        """The pending calls of `state` that `decider` may decide (`handrail.policy`).

        What a server shows an approver: a session of their organisation is theirs to read
        while it waits for a decision they may make. The rule `resolve` checks; see
        `Inbox.decidable`.
        """
        return self.inbox.decidable(state, decider)

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
        """An inbox: the cards of `org_id`'s sessions that `decider` may decide.

        The decider's own sessions count too. The arguments, paging and errors are
        `Inbox.pending`'s (`handrail.inbox`), which this calls.
        """
        return await self.inbox.pending(
            org_id,
            decider,
            tool=tool,
            kind=kind,
            older_than=older_than,
            newer_than=newer_than,
            session_id=session_id,
            limit=limit,
            cursor=cursor,
        )

    @staticmethod
    def _decision_entries(
        record: SessionRecord, cards: list[tuple[ApprovalCardPart, str | None]]
    ) -> list[AuditEntry]:
        """The audit entries of the decisions just recorded on `cards` (`handrail.audit`)."""
        return [
            decision_entry(
                card,
                org_id=record.org_id,
                session_id=record.id,
                via=via,
                args_digest=_decided_digest(card),
            )
            for card, via in cards
        ]

    async def expire_due(self) -> list[str]:
        """Expire every pending call past its deadline; return the sessions that changed.

        An expired call resolves to a tool error ("nobody decided in time") when its turn
        resumes; a session left with nothing pending is ready to `resume`.
        """
        now = self.runtime.clock()
        changed: list[str] = []
        for summary in await self.store.due(now):
            async with self._lock(summary.id):
                record = await self.store.load(summary.id)
                if record is None:
                    continue
                try:
                    state = _decode(record)
                except StoreError:
                    continue  # a corrupt session stays as it is, for a person to look at
                if expired := expire(state, now):
                    try:
                        await self._save(record, state, record.status)
                    except ConflictError:
                        continue  # it changed meanwhile: the next sweep sees it again
                    self.tally["expired"] += len(expired)
                    changed.append(summary.id)
        return changed

    async def client_left(self, session_id: str, *, grace: float = CLIENT_GRACE) -> list[str]:
        """The client of the session's turn went away: its `client` calls expire after `grace`.

        A server calls it when the stream of a turn started with client tools closes before
        the turn ended (and no other stream of it is open). Each waiting `client_exec` card
        whose deadline is later gets `now + grace` instead (time to reconnect and answer);
        past it, a sweep expires the call, and the model reads that the app was closed before
        it could run it.

        Returns:
            The ids of the calls whose deadline was brought forward.
        """
        async with self._lock(session_id):
            record = await self.store.load(session_id)
            if record is None:
                return []
            state = _decode(record)
            due = self.runtime.clock() + grace
            cut = [
                card
                for card in state.pending.values()
                if card.kind == "client_exec" and (card.expires_at is None or card.expires_at > due)
            ]
            if not cut:
                return []
            for card in cut:
                card.expires_at = due
            try:
                await self._save(record, state, record.status)
            except ConflictError:  # it changed meanwhile (decided, resumed): nothing to do
                return []
        return [card.tool_call_id for card in cut]

    async def prune(
        self,
        *,
        idle_for: float,
        statuses: Sequence[SessionStatus] = ("completed", "failed"),
    ) -> list[str]:
        """Delete the sessions in `statuses` that nobody touched for `idle_for` seconds.

        Run it on a schedule to keep the store small. Suspended sessions are kept unless
        `statuses` names them (their pending calls then go with them).

        Returns:
            The ids of the deleted sessions.
        """
        cutoff = self.runtime.clock() - idle_for
        deleted: list[str] = []
        for status in statuses:
            while page := await self.store.list(status=status, updated_before=cutoff):
                for summary in page:
                    if await self.store.delete(summary.id):
                        deleted.append(summary.id)
        return deleted

    def interrupt(self, session_id: str) -> bool:
        """Stop the session's running turn, if one runs in this process; True if one did."""
        run = self._running.get(session_id)
        if run is None:
            return False
        run.interrupt()
        return True

    # -- sessions --------------------------------------------------------------------------

    async def session(
        self, session_id: str, *, org_id: str | None = None, user_id: str | None = None
    ) -> RunState:
        """The session's stored state (messages, pending cards, usage), as a turn loads it.

        With compaction, its messages are those after the compaction summary (`state.base`
        is the position of the first); `store.messages` reads the whole history in pages.

        Raises:
            SessionNotFoundError: no such session for this caller.
        """
        _, state = await self._load(session_id, org_id, user_id)
        return state

    def _agents(self, names: list[str]) -> list[AgentSpec[Any]]:
        missing = [n for n in names if n not in self.domain.by_name]
        if missing:
            raise UserError(
                f"The suspended turn runs through agent(s) {', '.join(map(repr, missing))}, "
                f"which this engine's domain does not have (a deploy removed or renamed them?). "
                f"Deploy them again, or start a new session."
            )
        return [self.domain.by_name[n] for n in names]

    @contextlib.asynccontextmanager
    async def _leased(self, session_id: str) -> AsyncIterator[tuple[_Hold, SessionRecord | None]]:
        """Hold the session's lease (one worker drives a session), renewed while held.

        Yields the drive's hold and the session as read (`None`: there is none). The read
        writes nothing: the lease is taken by the drive's first write, in its transaction,
        with the compare-and-swap on the version it read (`_save`), before anything a second
        driver must not repeat (a side effect, a model call). A session this engine has just
        claimed (`claim`, `reclaim`) is held already. Renewed every `lease_ttl / 3` once held.
        """
        store, owner, ttl = self.store, self.lease_owner, self.lease_ttl
        self._lost.discard(session_id)  # (this process's drives of a session take turns)
        claimed = self._claimed.pop(session_id, None)
        # A claim still fresh holds the lease for long enough: renewed from now on, in time.
        held = claimed is not None and time.monotonic() - claimed < ttl / 3
        try:
            loaded = await store.load(session_id)
        except Exception as error:
            loaded = await self._retry(
                error,
                lambda: store.load(session_id),
                session_id,
                "load the session",
                left="Nothing was done: try again once the store answers.",
            )
        # A timer until the lease is due for renewal, and a task only then: most turns end
        # before, and a task each (with its cancellation) was a cost of every turn's start.
        loop = asyncio.get_running_loop()
        renewal: asyncio.Task[None] | None = None
        timer: asyncio.TimerHandle | None = None
        holding = True  # False once the drive is over: no renewal may start or go on after

        async def stop() -> None:
            nonlocal holding
            holding = False
            if timer is not None:
                timer.cancel()
            if renewal is not None:
                renewal.cancel()
                await asyncio.wait([renewal])

        def start() -> None:  # the lease is held at the store from now on
            nonlocal timer
            if holding:
                timer = loop.call_later(ttl / 3, due)

        def due() -> None:
            nonlocal renewal
            if holding:
                renewal = loop.create_task(renew())

        async def renew() -> None:
            nonlocal timer
            try:
                renewed = await store.acquire_lease(session_id, owner, ttl)
            except Exception as error:  # the store is away: try again soon, the lease holds
                _log.warning(
                    "handrail engine %s: renewing the lease on session %r failed (%s: %s); "
                    "trying again",
                    owner,
                    session_id,
                    type(error).__name__,
                    error,
                )
                if holding:
                    timer = loop.call_later(ttl / 10, due)
                return
            if renewed:
                if holding:
                    timer = loop.call_later(ttl / 3, due)
            else:
                self._lose(session_id)

        hold = self._holds[session_id] = _Hold(stop, start)
        if held:
            hold.take()
        try:
            yield hold, loaded
        finally:
            if self._holds.get(session_id) is hold:
                del self._holds[session_id]
            await stop()
            # Not taken (the drive wrote nothing), or given back by its last save: done.
            if hold.held and not hold.released:
                try:
                    try:
                        await store.release_lease(session_id, owner)
                    except Exception as error:
                        release = lambda: store.release_lease(session_id, owner)  # noqa: E731
                        await self._retry(error, release, session_id, "release the lease")
                except Exception as error:  # it lapses after `lease_ttl`, as a dead worker's does
                    _log.warning(
                        "handrail engine %s: could not release the lease on session %r (%s); it "
                        "lapses in %g s",
                        owner,
                        session_id,
                        error,
                        ttl,
                    )

    def _lose(self, session_id: str) -> None:
        """Another process took this session's lease (`reclaim`): stop, and write nothing more.

        The turn is interrupted; its saves and side effects are refused from now on, so the
        process that holds the lease is the only one that acts.
        """
        _log.warning(
            "handrail engine %s: the lease on session %r was taken over; stopping its turn",
            self.lease_owner,
            session_id,
        )
        self._lost.add(session_id)
        self.interrupt(session_id)

    def _lost_lease(self, session_id: str) -> SessionBusyError:
        return SessionBusyError(
            f"Session {session_id!r}: this process ({self.lease_owner}) lost its lease to "
            f"another one, so it acts no more for it; the other process goes on."
        )

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    async def _load(
        self,
        session_id: str,
        org_id: str | None,
        user_id: str | None = None,
        *,
        create: bool = False,
        any_user: bool = False,
        loaded: tuple[SessionRecord | None] | None = None,
    ) -> tuple[SessionRecord, RunState]:
        # `loaded`: the session as read already (with its lease), else read now.
        record = loaded[0] if loaded is not None else await self.store.load(session_id)
        scope = (record.org_id, None if any_user else record.user_id) if record else None
        if scope is not None and scope != (org_id, user_id):
            # Another tenant's session is, to this caller, no session; nor can it be made.
            raise _not_found(session_id, org_id, user_id, any_user=any_user)
        if record is None:
            if not create:
                raise _not_found(session_id, org_id, user_id, any_user=any_user)
            record = SessionRecord(id=session_id, org_id=org_id, user_id=user_id)
            state = RunState(session_id=session_id, org_id=org_id, user_id=user_id)
            state.domain_state = self.domain.new_state()
            return record, state
        if record.window and self.runtime.compaction is None:
            # Saved with a compaction summary, loaded without one: the model needs it all.
            # (Messages before the window belong to finished turns: they never change.)
            earlier = await self.store.messages(
                session_id, before=record.window, limit=record.window
            )
            record.messages[:0] = [message for _, message in earlier]
            record.messages_from = 0
        state = _decode(record)
        record.messages = []  # the state holds them now
        # `sys:` values are not stored: a decision, an amendment or a batch apply made on
        # this state sees the session's scope, as its turn did.
        state.context.update_sys(state.sys_values(self.runtime.clock()))
        try:
            state.turn_context = self.domain.load_context(state.turn_context)
            state.domain_state = self.domain.load_state(state.domain_state)
        except ValidationError as exc:
            raise StoreError(
                f"Session {session_id!r}: its domain state does not fit "
                f"{self.domain.state_type.__name__ if self.domain.state_type else 'the domain'}"
                f" any more ({exc.error_count()} error(s)); migrate it, or delete the session.",
                session_id=session_id,
            ) from None
        return record, state

    def _needs_worker(self, state: RunState) -> float | None:
        """When the session next needs a worker (`SessionRecord.expires_at`), if ever.

        A turn in progress needs one now: driven, its lease keeps other workers off; cut off,
        its lease lapses and the first worker to claim it recovers it. A suspended turn needs
        one once every call is decided (now) or at its first card's deadline.
        """
        progress = state.progress
        if progress is None:
            return None
        if progress.status == "running" or not state.pending:
            return self.runtime.clock()
        deadlines = [c.expires_at for c in state.pending.values() if c.expires_at is not None]
        return min(deadlines) if deadlines else None

    async def _save(
        self,
        record: SessionRecord,
        state: RunState,
        status: SessionStatus,
        *,
        hold: bool = False,
        release: bool = False,
        started: Sequence[ToolLogEntry] = (),
        notify: bool = False,
    ) -> SessionRecord:
        """Compare-and-swap `state` into `record`'s session; `record` follows the new version.

        With the save, in its transaction (docs/durability.md, "What is written, and when"):
        `hold`, the lease checked and renewed (lost: `SessionBusyError`, nothing written);
        `started`, calls logged `started`; `release`, the drive's lease given back (its last
        save: no renewal may follow); `notify`, the store's listeners woken.
        """
        if record.id in self._lost:
            raise self._lost_lease(record.id)
        drive = self._holds.get(record.id)
        first = drive is not None and not drive.held  # the drive's first write takes the lease
        if first:
            hold = True
        if not self._grouping and (hold or started or notify):
            return await self._save_apart(record, state, status, hold, started, notify, first)
        extra: dict[str, Any] = {}
        if hold:
            extra["lease"] = (self.lease_owner, self.lease_ttl)
        if started:
            extra["started"] = started
        if notify:
            extra["notify"] = True
        lease = self._holds.get(record.id) if release and self._grouping else None
        if lease is not None:
            await lease.stop()  # no renewal from now on: it would take the lease back
            extra["release"] = self.lease_owner
        # What changed: the small document, and the messages from the first that may have
        # changed (the turn in progress's first, or the first never saved) on.
        start = state.changed_from()
        record.data = state.dump(messages=False)
        record.messages = state.dump_messages(start)
        record.messages_from = start
        record.window = state.window if self.runtime.compaction is not None else 0
        record.status = status
        record.expires_at = self._needs_worker(state)
        # The inbox index's rows for this session, written in the save's transaction.
        record.cards = waiting_cards(state) if status == "suspended" else []
        try:
            try:
                saved = await self.store.save(record, **extra)
            except (SessionBusyError, ConflictError) as error:
                raise self._refused(record.id, error, hold=hold, first=first) from None
            except Exception as error:
                again = lambda: self._save_again(record, extra)  # noqa: E731
                try:
                    saved = await self._retry(error, again, record.id, "save the session")
                except (SessionBusyError, ConflictError) as refused:
                    raise self._refused(record.id, refused, hold=hold, first=first) from None
        finally:
            record.messages = []
        if first:
            assert drive is not None
            drive.take()
        if lease is not None:
            lease.released = True
        record.version = saved.version
        state.mark_saved()
        return saved

    def _refused(self, session_id: str, error: Exception, *, hold: bool, first: bool) -> Exception:
        """What a save the store refused raises: nothing was written.

        The drive's first write (`first`): another worker drives the session
        (`SessionBusyError`), or wrote it since this drive read it (`_Stale`: the drive reads
        it again). Later, under the lease (`hold`): this process lost it to another.
        """
        if first:
            if isinstance(error, ConflictError):
                return _Stale(str(error), session_id=session_id)
            return _Taken(str(error), session_id=session_id)
        if isinstance(error, SessionBusyError) and hold:
            self._lost.add(session_id)
            return self._lost_lease(session_id)
        return error

    async def _save_apart(
        self,
        record: SessionRecord,
        state: RunState,
        status: SessionStatus,
        hold: bool,
        started: Sequence[ToolLogEntry],
        notify: bool,
        first: bool = False,
    ) -> SessionRecord:
        """`_save` for a store that does not group: the same writes, one store call each."""
        session_id = record.id
        drive = self._holds.get(session_id)
        if first and drive is not None:
            # The lease taken apart, then the save's compare-and-swap on the version read.
            store, owner, ttl = self.store, self.lease_owner, self.lease_ttl
            taken = await self._retrying(
                lambda: store.acquire_lease(session_id, owner, ttl), session_id, "take the lease"
            )
            if not taken:
                raise _Taken("the lease is another's", session_id=session_id)
            drive.take()
        elif hold:
            await self._check_lease(session_id)
        try:
            saved = await self._save(record, state, status)
        except ConflictError as error:
            if first:
                raise _Stale(str(error), session_id=session_id) from None
            raise
        for entry in started:
            await self._retrying(
                lambda e=entry: self.store.log_started(  # type: ignore[misc]
                    session_id, e.tool_call_id, key=e.key, tool=e.tool, args=e.args
                ),
                session_id,
                f"log the start of call {entry.tool_call_id!r}",
            )
        if notify:
            await self.store.notify(session_id)
        return saved

    async def _check_lease(self, session_id: str) -> None:
        """Refuse to act for a session whose lease this process no longer holds."""
        if session_id in self._lost:
            raise self._lost_lease(session_id)
        store, owner, ttl = self.store, self.lease_owner, self.lease_ttl
        held = await self._retrying(
            lambda: store.acquire_lease(session_id, owner, ttl),
            session_id,
            "check the lease before a side effect",
        )
        if not held:
            self._lost.add(session_id)
            raise self._lost_lease(session_id)

    async def _save_again(self, record: SessionRecord, extra: dict[str, Any]) -> SessionRecord:
        """`store.save(record)` once more, after a try that failed for a moment.

        That try may have been written all the same, its answer lost on the way (a connection
        that dropped after the commit): a conflict with a write that is exactly this one (the
        version one past, the same status and document) is this save, made (with all it
        carried: its transaction was one).
        """
        try:
            return await self.store.save(record, **extra)
        except ConflictError:
            stored = await self.store.load(record.id)
            if stored is not None and _same_save(stored, record):
                return stored
            raise

    async def _retrying(
        self,
        call: Callable[[], Awaitable[_T]],
        session_id: str,
        what: str,
        *,
        left: str = _LEFT,
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
            return await self._retry(error, call, session_id, what, left=left)

    async def _retry(
        self,
        failed: Exception,
        call: Callable[[], Awaitable[_T]],
        session_id: str,
        what: str,
        *,
        left: str = _LEFT,
    ) -> _T:
        """`_retrying` once `call` failed with `failed`: raise it, or try again after a wait.

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


class _Stale(StoreError):
    """A drive's first write found the session saved since the drive read it; nothing written.

    Nothing the drive did mattered yet (its first write comes before any side effect or
    model call, and its events were held back), so it reads the session again and starts
    over.
    """


class _Taken(StoreError):
    """A drive's first write found the session's lease another worker's; nothing written.

    Raised through the turn as a store's failure is (so the turn stops right there), and
    handed to the caller as `SessionBusyError`.
    """


def _busy(session_id: str) -> SessionBusyError:
    return SessionBusyError(
        f"Session {session_id!r} is being driven by another worker right now; wait for its "
        f"run to end (or for its lease to expire if that worker died)."
    )


def _not_found(
    session_id: str, org_id: str | None, user_id: str | None, *, any_user: bool
) -> SessionNotFoundError:
    """No such session in the caller's scope, and how a session is found.

    The same words whether the session is someone else's or nobody's. (The server answers
    its clients with its own, shorter ones: `server/_errors.py`.)
    """
    if any_user:
        return SessionNotFoundError(
            f"No session {session_id!r} in organisation {org_id!r} (the decider's). A "
            f"decider= reaches the sessions of its own organisation: check the session id "
            f"and the decider's org_id.",
            session_id=session_id,
        )
    return SessionNotFoundError(
        f"No session {session_id!r} for this caller (org_id={org_id!r}, user_id={user_id!r}). "
        f"A session is found with the org_id= and user_id= it was created with: pass the "
        f"same ones to submit, resolve, resume and session.",
        session_id=session_id,
    )


def _same_save(stored: SessionRecord, record: SessionRecord) -> bool:
    """Whether `stored` is `record`'s save (made, though its answer was lost)."""
    same = stored.version == record.version + 1 and stored.status == record.status
    return same and stored.data == record.data


def _decode(record: SessionRecord) -> RunState:
    """The session's state, or a `StoreError` naming the session (the row is left as it is)."""
    try:
        return RunState.load(record.data, messages=record.messages, base=record.messages_from)
    except UserError as exc:
        raise SessionCorruptError(
            f"Session {record.id!r} cannot be read: {exc}. The stored row is left untouched; "
            f"restore it from an export, or delete the session.",
            session_id=record.id,
        ) from None


_STALE_TRIES = 3
"""How many times a drive reads the session again when its first write finds it saved since
(another worker's turn ended in between); then `SessionBusyError`."""

_Mode: TypeAlias = Literal["resume", "recover", "advance"]
"""How `_drive` goes on with a turn in progress: resume a suspended one, recover one cut off,
or whichever it needs (`advance`)."""

_NOTHING = {
    "suspended": "Session {session!r} has no suspended turn to resume.",
    "running": "Session {session!r} has no turn cut off while running, so nothing to recover.",
}


class _SessionJournal:
    """The journal of a run under an engine: checkpoints and the store's tool-call log."""

    __slots__ = ("engine", "logged", "record", "started_at", "state")

    def __init__(self, engine: Engine, record: SessionRecord, state: RunState) -> None:
        self.engine = engine
        self.record = record
        self.state = state
        self.started_at: dict[str, float] = {}  # log id -> when this process started it
        self.logged: set[str] = set()  # log ids logged `started` with a checkpoint

    async def checkpoint(self, starting: Sequence[tuple[str, ToolCallPart, str]] = ()) -> None:
        if not starting:
            await self.engine._save(self.record, self.state, "active")
            return
        # One write: the session with the calls, the lease checked (and renewed) at the store
        # right before the side effects (a process that lost it to another starts none), and
        # the `started` of those that start now.
        entries = [
            ToolLogEntry(tool_call_id=log_id, key=key, tool=part.name, args=part.args)
            for log_id, part, key in starting
        ]
        await self.engine._save(self.record, self.state, "active", hold=True, started=entries)
        self.logged.update(entry.tool_call_id for entry in entries)

    async def acting(self) -> None:
        drive = self.engine._holds.get(self.record.id)
        if drive is not None and not drive.held:
            # Nothing written yet this drive (a resumption whose decided calls run nothing):
            # the lease is taken now, with the session, before a model is called.
            await self.engine._save(self.record, self.state, "active")

    async def started(self, log_id: str, part: ToolCallPart, key: str) -> None:
        engine, session_id = self.engine, self.record.id
        if log_id in self.logged:  # logged with the checkpoint just before
            self.logged.discard(log_id)
            self.started_at[log_id] = engine.runtime.clock()
            return
        drive = engine._holds.get(session_id)
        if drive is not None and not drive.held:  # the drive's first write: a save with it
            entry = ToolLogEntry(tool_call_id=log_id, key=key, tool=part.name, args=part.args)
            await engine._save(self.record, self.state, "active", hold=True, started=[entry])
            self.started_at[log_id] = engine.runtime.clock()
            return
        # The lease is checked (and renewed) at the store in the write that logs the call,
        # right before its side effect: a process that lost it to another never starts one.
        if session_id in engine._lost:
            raise engine._lost_lease(session_id)
        store, name, args = engine.store, part.name, part.args
        lease: tuple[str, float] | None = (engine.lease_owner, engine.lease_ttl)
        if not engine._grouping:  # checked apart, then logged
            await engine._check_lease(session_id)
            lease = None
        try:
            await _log_started(store, session_id, log_id, key, name, args, lease)
        except SessionBusyError:
            engine._lost.add(session_id)
            raise engine._lost_lease(session_id) from None
        except Exception as error:
            # Made again after a lost reply, it finds its entry and keeps it (returns False).
            try:
                await engine._retry(
                    error,
                    lambda: _log_started(store, session_id, log_id, key, name, args, lease),
                    session_id,
                    f"log the start of call {log_id!r}",
                )
            except SessionBusyError:
                engine._lost.add(session_id)
                raise engine._lost_lease(session_id) from None
        self.started_at[log_id] = engine.runtime.clock()

    async def finished(self, log_id: str, part: ToolCallPart, result: ToolResult) -> None:
        record, now = self.record, self.engine.runtime.clock()
        started = self.started_at.pop(log_id, None)
        entry = call_entry(
            result, org_id=record.org_id, session_id=record.id, tool=part.name,
            tool_call_id=log_id, who=record.user_id, at=now,
            args_digest=args_digest(part.name, part.args),
            latency_ms=None if started is None else round((now - started) * 1000, 3),
        )  # fmt: skip
        # The audit entry goes with the result, in its transaction (a repeated result: neither),
        # so made again after a lost reply, it writes nothing twice.
        store, logged = self.engine.store, result_record(result)
        try:
            await store.log_finished(record.id, log_id, logged, audit=entry)
        except Exception as error:
            await self.engine._retry(
                error,
                lambda: store.log_finished(record.id, log_id, logged, audit=entry),
                record.id,
                f"log the result of call {log_id!r}",
            )


_STATUS: dict[str, SessionStatus] = {
    "completed": "completed",
    "suspended": "suspended",
    "interrupted": "active",
    "failed": "failed",
}


def _takes(method: Callable[..., Any], name: str) -> bool:
    """Whether `method` takes a keyword argument `name` (or any: `**kwargs`)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in parameters)


async def _log_started(
    store: SessionStore,
    session_id: str,
    log_id: str,
    key: str,
    tool: str,
    args: dict[str, Any],
    lease: tuple[str, float] | None,
) -> bool:
    if lease is None:
        return await store.log_started(session_id, log_id, key=key, tool=tool, args=args)
    return await store.log_started(session_id, log_id, key=key, tool=tool, args=args, lease=lease)


class _Hold:
    """A drive's hold on its session's lease: `held`, then `released` by a save.

    Held once taken (by the drive's first write, or a claim); `stop` ends its renewals.
    """

    __slots__ = ("_start", "held", "released", "stop")

    def __init__(self, stop: Callable[[], Awaitable[None]], start: Callable[[], None]) -> None:
        self.stop = stop
        self._start = start
        self.held = False
        self.released = False

    def take(self) -> None:
        """The lease is held at the store now: renew it from here on."""
        if not self.held:
            self.held = True
            self._start()


@dataclass(kw_only=True, slots=True)
class _Headless:
    """What a headless turn collects besides its events."""

    propose: bool = False
    actions: list[CapturedAction] = field(default_factory=list)
    card: str | None = None


def _batch_to_apply(state: RunState) -> ApprovalCardPart | None:
    """The decided batch card the session waits to apply, if that is what it waits for."""
    progress = state.progress
    if progress is None or state.pending:
        return None
    try:
        message = state.find_message(progress.message_id)
    except KeyError:
        return None
    for part in message.parts:
        if isinstance(part, ApprovalCardPart) and part.kind == "batch":
            return part if part.decision is not None else None
    return None


def _report_text(report: ApplyReport) -> str:
    """One line: how many actions were applied, and which were skipped, failed, or not run."""
    text = f"Applied {len(report.applied)} of {len(report.actions)} action(s)"
    if report.skipped:
        text += "; skipped: " + ", ".join(_named(a) for a in report.skipped)
    failed = report.failed
    if failed is not None:
        text += f"; action {failed.local_index} ({failed.tool}) failed: {failed.error}"
        if report.not_run:
            text += "; did not run: " + ", ".join(_named(a) for a in report.not_run)
    return text + "."


def _named(action: CapturedAction) -> str:
    return f"action {action.local_index} ({action.tool})"


def _outcome_text(card_id: str, report: ApplyReport) -> str:
    """What applying a batch really did, for the history the next turn's model reads."""
    applied = len(report.applied)
    lines = [
        f"Batch {card_id} was decided: {applied} of {len(report.actions)} action(s) applied. "
        f"What really happened (the calls proposed earlier did not run then; their predicted "
        f"results were not results):"
    ]
    for action in report.actions:
        head = f"- action {action.local_index} ({action.tool})"
        if action.status == "applied":
            output = json.dumps(action.output, ensure_ascii=False, sort_keys=True, default=str)
            lines.append(f"{head}: applied; real output: {output}")
        elif action.status == "skipped":
            lines.append(f"{head}: skipped, not done ({action.error or 'a person skipped it'})")
        elif action.status == "failed":
            lines.append(f"{head}: failed, not done: {action.error}")
        else:
            lines.append(f"{head}: not run (an earlier action failed)")
    if report.ids:
        real = ", ".join(f"{temp} = {value}" for temp, value in report.ids.items())
        lines.append(f"Temporary ids now stand for: {real}.")
    return "\n".join(lines)


def _decided_digest(card: ApprovalCardPart) -> str:
    """The digest of what the card's latest decision was made on, for its audit entry.

    An approval that is not yet the last of those a call needs is the digest it approved.
    """
    if card.decision is None and card.approvals:
        return card.approvals[-1].args_digest or current_digest(card)
    return card.args_digest or current_digest(card)
