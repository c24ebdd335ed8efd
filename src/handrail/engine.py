"""`Engine`: agents as an application: sessions, routes, and the human in the loop.

`submit` runs one user turn of a stored session; `resolve` records a decision on a pending
call; `resume` continues a suspended turn once nothing is pending; `advance` finishes a
session whatever state it was left in; the fleet's chores (`advance_due`, `expire_due`,
`prune`) keep a fleet of workers moving. The facade over `handrail._engine`'s concerns: see
docs/engine.md, 'Making an engine', 'Running a turn' and 'The fleet's chores'. The inbox
lives in `handrail.inbox`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._agent_spec import AgentSpec
from ._captured import ApplyReport, HeadlessResult
from ._deadlines import CLIENT_GRACE
from ._engine._batches import Batches
from ._engine._chores import SKIPPED as SKIPPED  # what a worker passes over
from ._engine._chores import Chores
from ._engine._core import EngineCore, Shared
from ._engine._deciding import Deciding, Resolution
from ._engine._events import OnLogged, RunLog
from ._engine._headless import HeadlessRuns
from ._engine._leases import Leases
from ._engine._retry import StoreRetry, transient
from ._engine._saving import Saving
from ._engine._turns import Turns
from ._loop import AgentResult, AgentRun
from .domain import Domain
from .gate import Gate, TurnRequest, admit
from .inbox import Inbox, PendingCard, PendingPage
from .messages import CardKind
from .models import Model
from .policy import Decider
from .runtime import Assembly, Mode, Runtime, WrapTools
from .state import RunState
from .store import SessionStatus, SessionStore, SessionSummary
from .suspension import Decision

__all__ = [
    "Domain",
    "Engine",
    "OnLogged",
    "PendingCard",
    "PendingPage",
    "Resolution",
    "RunLog",
    "StoreRetry",
    "transient",
]


class Engine:
    """Runs the turns of stored sessions through a domain's agents.

    A session belongs to the org and user that created it: any other caller gets
    `SessionNotFoundError`, exactly as if it did not exist. See docs/engine.md, 'Making an
    engine', for each argument at length.

    Args:
        domain: the agents and routes (a lone `Agent` is a domain of one).
        store: where sessions live (default: a `MemoryStore`, which forgets on exit).
        runtime: dependencies, hooks, policy, clock and ids, shared by every run.
        worker_id: this worker's name in session leases; give each process a stable one
            (default: `HANDRAIL_WORKER_ID`, else a random one).
        lease_ttl: seconds a worker's lease on a session lasts unless renewed.
        mode: `live`, or `mock` for evals and tests (see `build_runtime`).
        model: the default model for agents that name none (over `runtime.model`).
        org_models: organisation id -> the model its turns use, for agents that name none.
        wrap_tools: replaces tools with mocks or wrappers (see `build_runtime`).
        store_retry: how a store call that failed for a moment is retried (`StoreRetry`).
        gate: who may start a turn at all (`handrail.gate`), asked by every entry point.

    Raises:
        UserError: `lease_ttl` is not positive.
    """

    store: Shared[SessionStore] = Shared()
    """Where sessions live."""
    worker_id: Shared[str] = Shared()
    """This worker's name in session leases (`handrail.worker.name_worker` sets it)."""
    lease_owner: Shared[str] = Shared()
    """This process's name on the leases it holds: its worker id and its incarnation."""

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
        core = self._core = EngineCore(
            domain,
            store=store,
            runtime=runtime,
            worker_id=worker_id,
            lease_ttl=lease_ttl,
            mode=mode,
            model=model,
            wrap_tools=wrap_tools,
            store_retry=store_retry,
            org_models=org_models,
        )
        self.gate: Gate | None = gate
        """Who may start a turn at all (`handrail.gate`), asked by the entry points."""
        self.assembly: Assembly = core.assembly
        self.domain: Domain = core.domain
        self.runtime: Runtime[Any] = core.runtime
        self.org_models: dict[str, Model] = core.org_models
        self.lease_ttl: float = core.lease_ttl
        self.store_retry: StoreRetry = core.store_retry
        self.tally: Counter[str] = core.tally
        """Counts since the engine was made: `resumed` and `recovered` turns, `applied`
        batches, `expired` cards (what a `Worker`'s health line reports)."""
        # The concerns, each holding what it needs; a session id goes down them, not back up.
        self._leases = Leases(core)
        self._saving = Saving(core, self._leases)
        batches = Batches(core, self._saving)
        self._turns = Turns(core, self._leases, self._saving, batches)
        self._headless = HeadlessRuns(core, self._saving, self._turns)
        self._deciding = Deciding(core, self._leases, self._saving)
        self._chores = Chores(core, self._leases, self._saving, self._turns)

    # -- turns -----------------------------------------------------------------------------

    async def admit(self, request: TurnRequest) -> None:
        """Ask the gate whether `request`'s caller may start a turn (`submit` does not ask).

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
        handed out once the session is saved and its lease released. See docs/engine.md,
        'Running a turn'.

        Args:
            session_id: the session.
            text: the user's message.
            org_id: the caller's organisation (scope comes from here, never from the model).
            user_id: the caller.
            model: a model for this turn, over the agents' and the runtime's.
            route: the route to take (default: the supervisor's choice, or the default).
            client: whether the caller can run `client` tools (without, they fail fast).
            create: False: a `SessionNotFoundError` when there is no such session.
            roles: the caller's roles, which `tools_for` chooses the turn's tools from.
            context: the per-turn context (docs/engine.md, 'Per-turn context').

        Raises:
            InvalidContextError: `context` does not fit the domain's context model, or an
                agent's instructions read a field it lacks (before anything is stored).
        """
        return self._turns.submit(
            session_id,
            text,
            org_id=org_id,
            user_id=user_id,
            model=model,
            route=route,
            client=client,
            create=create,
            roles=roles,
            context=context,
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

        Approved calls run now, then the turn goes on in the same assistant message; a
        resumption cut off earlier is recovered first. See docs/engine.md, 'Running a turn'.

        Raises (when iterated):
            UserError: the session has no suspended turn, or a decision is still missing.
            SessionBusyError: another worker drives the session right now (before any event).
        """
        return self._turns.drive(session_id, None, None, org_id, user_id, model, client)

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

        Its calls are settled from the tool-call log, never run twice unless idempotent;
        see docs/durability.md, 'After a crash'.

        Raises (when iterated):
            UserError: the session has no turn cut off while running.
            SessionBusyError: a live worker still drives it (its lease has not expired):
                raised before anything is written, logged or read of the tool-call log.
        """
        return self._turns.drive(
            session_id, None, None, org_id, user_id, model, client, mode="recover"
        )

    async def advance(
        self, session_id: str, *, org_id: str | None = None, user_id: str | None = None
    ) -> AgentResult[Any] | None:
        """Take a session as far as it can go from whatever state it was left in.

        Recovers a cut-off turn, resumes a decided one, applies a decided batch; its events
        go to the session's event log. See docs/engine.md, 'Running a turn'.

        Returns:
            How the turn ended, or None when there was nothing to do.

        Raises:
            SessionNotFoundError: no such session for this caller.
            SessionBusyError: a live worker drives the session right now (a turn marked
                running that is another's is left to it at once, not recovered).
        """
        return await self._turns.advance(session_id, org_id=org_id, user_id=user_id)

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
        """Run one user turn with nobody present (a cron job, a webhook), in capture mode.

        Gated calls are captured, not run; `propose=True` raises one batch card for them,
        which `resolve` decides and `resume` (or `apply`) applies. See docs/headless.md.
        The other arguments are `submit`'s.

        Returns:
            The final text, the captured actions, the events, and the batch card's id.
        """
        return await self._headless.run(
            session_id,
            text,
            org_id=org_id,
            user_id=user_id,
            model=model,
            route=route,
            propose=propose,
            roles=roles,
            context=context,
        )

    async def apply(
        self, session_id: str, *, org_id: str | None = None, user_id: str | None = None
    ) -> ApplyReport:
        """Apply the decided batch card of a session (as `resume` does) and report.

        Raises:
            UserError: the session has no decided batch card to apply.
            InvalidDecisionError: the recorded plan does not match what was approved.
        """
        return await self._headless.apply(session_id, org_id=org_id, user_id=user_id)

    async def drain(self, session_id: str, run: AgentRun[Any]) -> AgentResult[Any]:
        """Run `run` (a turn of `session_id`) to its end with nobody watching; its result.

        Its events are kept in the session's event log, where a client can still read them.
        """
        return await self._turns.drain(session_id, run)

    def log_run(
        self,
        session_id: str,
        run: AgentRun[Any],
        *,
        every: float = 0.05,
        on_logged: OnLogged | None = None,
    ) -> RunLog:
        """Keep `run`'s events (a turn of `session_id`, not yet iterated) in its event log.

        The turn's saves carry them (no commit of their own); a group goes on its own when no
        save carries it within `every` seconds. `on_logged(last, events)` is told of each
        group once committed. Returns the log (`begun`, `last`). See docs/durability.md,
        "A served turn's events". Raises `UserError` for a run already started.
        """
        return self._turns.log_run(session_id, run, every=every, on_logged=on_logged)

    async def log_events(
        self, session_id: str, events: list[dict[str, Any]]
    ) -> tuple[int, list[dict[str, Any]]]:
        """Append events (as `EVENT.dump_python(e, mode="json")` gives them) to the event log.

        The one way events enter an event log: a failure's detail is replaced by a reference.

        Returns:
            The number of the last event in the log, and the events as logged.
        """
        return await self._turns.log_events(session_id, events)

    # -- the fleet's chores (docs/engine.md, 'The fleet's chores') -------------------------

    async def advance_due(self, *, limit: int = 100) -> list[str]:
        """Claim (`SessionStore.claim`) and `advance` the sessions that need a worker now.

        Returns the ids of the sessions that moved.
        """
        return await self._chores.advance_due(limit=limit)

    async def claim(self, now: float, *, limit: int = 100) -> list[SessionSummary]:
        """Claim the sessions that need a worker at `now` for this engine (`SessionStore.claim`).

        Their leases are this engine's for `lease_ttl`, so a drive that starts soon holds them.
        """
        return await self._chores.claim(now, limit=limit)

    async def reclaim(self) -> list[str]:
        """Take back, at once, the turns a previous process with this worker id was driving.

        Call it when a process starts (`Worker.run` does); each session is advanced. Returns
        the ids of the sessions that moved.
        """
        return await self._chores.reclaim()

    async def advance_owned(self, session_id: str) -> AgentResult[Any] | None:
        """`advance`, in the session's own scope (read from its metadata: a worker's view).

        Raises:
            SessionNotFoundError: there is no such session.
            SessionBusyError: a live worker drives the session right now.
        """
        return await self._chores.advance_owned(session_id)

    async def recover_stale(self) -> list[str]:
        """Recover every session whose turn was cut off and whose worker's lease has expired.

        The same sweep as `advance_due`; returns the ids of the sessions that moved.
        """
        return await self.advance_due(limit=1_000)

    async def expire_due(self) -> list[str]:
        """Expire every pending call past its deadline; return the sessions that changed.

        An expired call resolves to a tool error ("nobody decided in time") when its turn
        resumes.
        """
        return await self._chores.expire_due()

    async def client_left(self, session_id: str, *, grace: float = CLIENT_GRACE) -> list[str]:
        """The client of the session's turn went away: its `client` calls expire after `grace`.

        Returns the ids of the calls whose deadline was brought forward.
        """
        return await self._chores.client_left(session_id, grace=grace)

    async def prune(
        self,
        *,
        idle_for: float,
        statuses: Sequence[SessionStatus] = ("completed", "failed"),
    ) -> list[str]:
        """Delete the sessions in `statuses` that nobody touched for `idle_for` seconds.

        Suspended sessions are kept unless `statuses` names them (with their pending calls).
        Returns the ids of the deleted sessions.
        """
        return await self._chores.prune(idle_for=idle_for, statuses=statuses)

    def interrupt(self, session_id: str) -> bool:
        """Stop the session's running turn, if one runs in this process; True if one did."""
        return self._core.interrupt(session_id)

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
            decider: who decides, as authenticated: the call's policy decides whether they
                may (docs/suspension.md, 'Who may decide'). Without one, the caller names
                the session's scope and is trusted where no policy applies.

        Raises:
            SessionNotFoundError: no such session for this caller.
            StaleResolutionError: the call is unknown, already decided or expired.
            InvalidDecisionError: the decision does not fit the call.
            DecisionNotAllowedError: the call's policy does not let the decider make it.
            (Nothing changed on any of these.)
        """
        return await self._deciding.resolve_many(
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

        Concurrent decisions on one session are decided again on the state that won the
        store's compare-and-swap: each approval counts once, and none is lost.

        Raises:
            as `resolve`, for the first decision that cannot be recorded (then none is).
        """
        return await self._deciding.resolve_many(
            session_id, decisions, org_id=org_id, user_id=user_id, decider=decider
        )

    @property
    def inbox(self) -> Inbox:
        """The inbox over this engine's store: the calls waiting for a decider (`Inbox`)."""
        return Inbox(self.store, self.domain, load=self.session, clock=self.runtime.clock)

    def decidable(self, state: RunState, decider: Decider) -> list[str]:
        """The pending calls of `state` that `decider` may decide (`Inbox.decidable`)."""
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
        """An inbox: the cards of `org_id`'s sessions (and the decider's own) `decider` may decide.

        The arguments, paging and errors are `Inbox.pending`'s (`handrail.inbox`).
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

    # -- sessions --------------------------------------------------------------------------

    async def session(
        self, session_id: str, *, org_id: str | None = None, user_id: str | None = None
    ) -> RunState:
        """The session's stored state (messages, pending cards, usage), as a turn loads it.

        With compaction, its messages start after the summary (`state.base`);
        `store.messages` reads the whole history in pages.

        Raises:
            SessionNotFoundError: no such session for this caller.
        """
        _, state = await self._saving.load(session_id, org_id, user_id)
        return state

    def _lock(self, session_id: str) -> asyncio.Lock:
        """The lock this process drives and decides `session_id` under."""
        return self._leases.lock(session_id)
