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
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._agent_spec import AgentSpec
from ._captured import ApplyReport, HeadlessResult
from ._deadlines import CLIENT_GRACE
from ._engine._batches import Batches
from ._engine._chores import SKIPPED as SKIPPED  # what a worker passes over
from ._engine._chores import Chores
from ._engine._core import EngineCore
from ._engine._deciding import Deciding, Resolution
from ._engine._headless import HeadlessRuns
from ._engine._leases import Leases
from ._engine._retry import StoreRetry, transient
from ._engine._saving import Saving
from ._engine._turns import Turns
from ._loop import AgentResult, AgentRun
from .domain import Domain
from .exceptions import UserError
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
    "PendingCard",
    "PendingPage",
    "Resolution",
    "StoreRetry",
    "transient",
]


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
        core = self._core = EngineCore(
            domain,
            store=store,
            runtime=runtime,
            worker_id=worker_id,
            lease_ttl=lease_ttl,
            mode=mode,
            model=model,
            wrap_tools=wrap_tools,
            store_retry=store_retry if store_retry is not None else StoreRetry(),
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
        """What this engine's drives of suspended or cut-off turns did, counted since it was
        made: `resumed` and `recovered` turns, `applied` batches, `expired` cards (what a
        `Worker`'s health line reports)."""
        # The concerns, each holding what it needs; a session id goes down them, not back up.
        self._leases = Leases(core)
        self._saving = Saving(core, self._leases)
        batches = Batches(core, self._saving)
        self._turns = Turns(core, self._leases, self._saving, batches)
        self._headless = HeadlessRuns(core, self._saving, self._turns)
        self._deciding = Deciding(core, self._leases, self._saving)
        self._chores = Chores(core, self._leases, self._saving, self._turns)

    # -- what the engine's concerns share (`EngineCore`), some of it set after it is made --

    @property
    def store(self) -> SessionStore:
        """Where sessions live."""
        return self._core.store

    @store.setter
    def store(self, store: SessionStore) -> None:
        self._core.store = store

    @property
    def worker_id(self) -> str:
        """This worker's name in session leases (`handrail.worker.name_worker` sets it)."""
        return self._core.worker_id

    @worker_id.setter
    def worker_id(self, worker_id: str) -> None:
        self._core.worker_id = worker_id

    @property
    def lease_owner(self) -> str:
        """This process's name on the leases it holds: its worker id and its incarnation."""
        return self._core.lease_owner

    @lease_owner.setter
    def lease_owner(self, owner: str) -> None:
        self._core.lease_owner = owner

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

        Decided calls are settled (approved ones run now), then the suspended agent's loop goes
        on with its remaining iterations, then the rest of its route. A turn cut off while it
        ran (a resumption whose worker died) is recovered first, as `recover` does.

        Raises (when iterated):
            UserError: the session has no suspended turn, or a decision is still missing.
            SessionBusyError: another worker drives the session right now (raised at the
                resumption's first write, before any event, side effect or model call).
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

        The calls it left are settled from the tool-call log (`handrail.recovery`): a logged
        result is used, never run again; a call that may have run is run again only when its
        tool is idempotent, and otherwise becomes a `recovery` card, and the turn suspends for
        a person to decide (retry or skip). Then the turn goes on where it stopped.

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

        Its events are kept in the session's event log, as a served turn's are, so a client
        can still read or stream them (`GET /sessions/{id}/events`). `Worker` and
        `recover_stale` drive turns this way.
        """
        return await self._turns.drain(session_id, run)

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
        return await self._turns.log_events(session_id, events)

    # -- the fleet's chores ----------------------------------------------------------------

    async def advance_due(self, *, limit: int = 100) -> list[str]:
        """Advance, one after the other, the sessions that need a worker now.

        They are claimed from the store first (`SessionStore.claim`: due, and no live worker
        holds their lease), so workers sweeping together share them out: cut-off turns whose
        worker died, decided turns whose wake-up was lost, cards past their deadline.

        Returns:
            The ids of the sessions that moved (see `advance`).
        """
        return await self._chores.advance_due(limit=limit)

    async def claim(self, now: float, *, limit: int = 100) -> list[SessionSummary]:
        """Claim the sessions that need a worker at `now` for this engine (`SessionStore.claim`).

        Their leases are this engine's (`lease_owner`) for `lease_ttl`: a drive of one of
        them that starts soon (`advance`) holds its lease from the start, with no write to
        take it.
        """
        return await self._chores.claim(now, limit=limit)

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

        Concurrent decisions on one session (another approver's, from another process) are
        decided again on the state that won the store's compare-and-swap: each approval
        counts once, and none is lost.

        Raises:
            as `resolve`, for the first decision that cannot be recorded (then none is).
        """
        return await self._deciding.resolve_many(
            session_id, decisions, org_id=org_id, user_id=user_id, decider=decider
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

    # -- the fleet's chores (continued) ----------------------------------------------------

    async def expire_due(self) -> list[str]:
        """Expire every pending call past its deadline; return the sessions that changed.

        An expired call resolves to a tool error ("nobody decided in time") when its turn
        resumes; a session left with nothing pending is ready to `resume`.
        """
        return await self._chores.expire_due()

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
        return await self._chores.client_left(session_id, grace=grace)

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
        return await self._chores.prune(idle_for=idle_for, statuses=statuses)

    def interrupt(self, session_id: str) -> bool:
        """Stop the session's running turn, if one runs in this process; True if one did."""
        return self._core.interrupt(session_id)

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
        _, state = await self._saving.load(session_id, org_id, user_id)
        return state

    def _lock(self, session_id: str) -> asyncio.Lock:
        """The lock this process drives and decides `session_id` under."""
        return self._leases.lock(session_id)
