"""Driving a session's turns: new, resumed, recovered or advanced, under the session's lease."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Iterable
from typing import Any, Literal, TypeAlias

from .._agent_spec import AgentSpec
from .._captured import captured_actions
from .._loop import AgentResult, AgentRun
from .._redact import public_event
from .._turn import check_resumable, run_turn
from ..domain import Router
from ..events import Event, RunStarted, RunSuspended
from ..exceptions import ConflictError, UserError
from ..messages import ApprovalCardPart
from ..models import Model
from ..models._infer import as_model
from ..recovery import attempt_id, reconcile
from ..runtime import Assembly
from ..state import RunState
from ..store import SessionRecord, SessionStatus
from ..suspension import card_event, expire
from ._batches import Batches, Headless, batch_to_apply
from ._core import EngineCore, takes
from ._events import OnLogged, RunLog
from ._journal import SessionJournal
from ._leases import Leases, Stale, Taken, busy
from ._saving import Saving

_log = logging.getLogger("handrail.engine")
_TERMINAL = frozenset({"run-completed", "run-suspended", "run-failed"})


class Turns:
    """Drives a session's turns (new, resumed, recovered, advanced) and logs their events."""

    __slots__ = ("batches", "core", "leases", "saving")

    def __init__(self, core: EngineCore, leases: Leases, saving: Saving, batches: Batches) -> None:
        self.core = core
        self.leases = leases
        self.saving = saving
        self.batches = batches

    def submit(
        self,
        session_id: str,
        text: str,
        *,
        org_id: str | None,
        user_id: str | None,
        model: Model | str | None,
        route: str | None,
        client: bool,
        create: bool,
        roles: Iterable[str] | None,
        context: Any,
    ) -> AgentRun[Any]:
        """`Engine.submit`: one user turn, on the route asked for (or the supervisor's)."""
        turn_context = self.core.domain.check_context(context, route=route)
        plan: list[AgentSpec[Any]] | Router
        if route is None and self.core.router is not None:
            plan = self.core.router  # the supervisor picks
        else:
            plan = self.core.domain.route(route)
        return self.drive(
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

    async def advance(
        self, session_id: str, *, org_id: str | None = None, user_id: str | None = None
    ) -> AgentResult[Any] | None:
        """`Engine.advance`: as far as the session can go; its events go to the event log."""
        run = self.drive(
            session_id, None, None, org_id, user_id, None, False, mode="advance", create=False
        )
        self.log_run(session_id, run)
        async for _ in run:
            pass
        return run._result

    def drive(
        self,
        session_id: str,
        text: str | None,
        plan: list[AgentSpec[Any]] | Router | None,
        org_id: str | None,
        user_id: str | None,
        model: Model | str | None,
        client: bool,
        assembly: Assembly | None = None,
        headless: Headless | None = None,
        *,
        mode: _Mode = "resume",
        create: bool = True,
        roles: Iterable[str] | None = None,
        turn_context: Any = None,
    ) -> AgentRun[Any]:
        parts = assembly or self.core.assembly
        if model is not None:  # a model string that does not name one is refused now
            model = as_model(model, where="model=")

        async def turn(
            run: AgentRun[Any], loaded: SessionRecord | None
        ) -> AsyncGenerator[Event, None]:
            record, state = await self.saving.load(
                session_id, org_id, user_id, create=create, loaded=(loaded,)
            )
            if roles is not None and text is not None:  # a new turn: its caller's roles
                state.roles = frozenset(roles)
            route = plan
            batch = batch_to_apply(state) if text is None else None
            if batch is not None:
                self.core.tally["applied"] += 1
                async for event in self.batches.apply_batch(run, record, state, batch):
                    yield event
                return
            if text is None:
                progress = state.progress
                if mode == "advance":
                    expired = expire(state, self.core.runtime.clock())  # deadlines passed: decided
                    self.core.tally["expired"] += len(expired)
                    if progress is None or (progress.status == "suspended" and state.pending):
                        # Nothing to drive; the store learns when there next will be.
                        if expired or record.expires_at != self.saving.needs_worker(state):
                            with contextlib.suppress(ConflictError):
                                await self.saving.save(record, state, record.status, release=True)
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
                    # Or another process drives the turn right now: its lease says so, and
                    # this drive leaves it (`Taken`) before it warns or reads the log.
                    await self.leases.take_early(session_id, record.version)
                    _log.warning(
                        "handrail engine %s: recovering session %r, whose turn was cut off",
                        self.core.lease_owner,
                        session_id,
                    )
                # A turn cut off while it ran may hold cards of its last response: they wait.
                check_resumable(state, None, [progress.agent], waiting=recovering)
                router = self.core.router
                if router is not None and progress.agent == router.supervisor.name:
                    route, cards = router, []  # cut off while choosing: choose again
                else:
                    agents = self.agents(progress.route or [progress.agent])
                    route = agents
                    # A resumption cut off by a crash leaves the turn looking suspended:
                    # the log says which of its calls already started, or finished.
                    agent = agents[progress.step]
                    cards = await self.reconcile(session_id, state, agent)
                # Recovered: cut off while it ran, or while it resumed (its calls' log says so).
                self.core.tally["recovered" if recovering or cards else "resumed"] += 1
                if cards or state.pending:  # new recovery cards, or the response's own ones
                    progress.status = "suspended"
                    run._result = AgentResult(
                        outcome="suspended", state=state, pending=list(state.pending)
                    )
                    # Shown once saved (`body` holds them back till the drive's first write,
                    # and the last till its end), and logged with the save.
                    for event in self.pending_events(state):
                        yield event
                    await self.saving.save(record, state, "suspended", release=True)
                    return
            assert route is not None
            if text is not None:  # a new turn carries its own context (a resumed one, its own)
                state.turn_context = turn_context
                if (
                    state.turn == 0
                    and state.progress is None
                    and self.core.domain.state_from_context
                ):
                    state.domain_state = self.core.domain.first_state(turn_context)
            state.client_connected = client
            journal = SessionJournal(self.saving, record, state)
            first_capture = state.captures
            inner = run_turn(
                route,
                text,
                state=state,
                runtime=self.core.runtime,
                journal=journal,
                models=lambda agent: parts.model_for(
                    agent, model, org=self.core.org_models.get(state.org_id or "")
                ),
            )
            self.core.running[session_id] = inner
            try:
                async for event in inner:
                    yield event  # `body` holds its last one back until the session is saved
            finally:
                self.core.running.pop(session_id, None)
                state.client_connected = False
            result = run._result = inner.result
            if headless is not None:
                headless.actions = captured_actions(state, first_capture)
                if headless.propose and headless.actions and result.outcome == "completed":
                    card = self.batches.propose(state, headless.actions)
                    headless.card = card.tool_call_id
                    run._result = dataclasses.replace(
                        result, outcome="suspended", pending=[card.tool_call_id]
                    )
                    # They follow the turn's terminal event: `body` shows them (in its stead)
                    # at the drive's end, and they are logged with this save.
                    yield card_event(card, None)
                    yield RunSuspended(pending=[card.tool_call_id])
                    await self.saving.save(record, state, "suspended", release=True)
                    return
            # The drive's last write: its lease goes back with it.
            await self.saving.save(record, state, _STATUS[result.outcome], release=True)

        async def body(run: AgentRun[Any]) -> AsyncGenerator[Event, None]:
            log = run._log if isinstance(run._log, RunLog) else None
            end: list[Event] = []  # the events that end the drive: from its terminal event on
            try:
                async with self.leases.lock(session_id):
                    for attempt in range(_STALE_TRIES):
                        # Until the drive's first write, its events are held back: a drive
                        # that finds the session busy there has shown nothing.
                        held: list[Event] = []
                        try:
                            async with self.leases.leased(session_id, log) as (hold, loaded):
                                async for event in turn(run, loaded):
                                    if end or event.type in _TERMINAL:
                                        # A later terminal event replaces the first (a headless
                                        # turn that completed suspends on its batch).
                                        if event.type in _TERMINAL:
                                            end = [e for e in end if e.type not in _TERMINAL]
                                        end.append(event)
                                        if log is not None:
                                            log.ending(end)
                                        continue
                                    if log is not None:
                                        log.add(event)
                                    if not hold.wrote:
                                        held.append(event)
                                    else:
                                        for early in held:
                                            yield early
                                        held.clear()
                                        yield event
                        except (Taken, Stale) as refused:
                            if log is not None:
                                log.discard()  # nothing of this drive is shown
                            end = []
                            # Saved by another since it was read: read again and start over.
                            if isinstance(refused, Taken) or attempt + 1 == _STALE_TRIES:
                                raise busy(session_id) from None
                            run._result = None
                            continue
                        for early in held:  # a drive that wrote nothing
                            yield early
                        break
                if log is not None:  # what no save carried (a drive that wrote nothing)
                    await log.close()
            except BaseException:
                if log is not None:  # what it showed before it stopped is logged
                    with contextlib.suppress(Exception):
                        await log.close(failed=True)
                raise
            # The last events come once the session is free (saved, unlocked, its lease
            # released), so whoever reads them may start the session's next turn at once.
            for event in end:
                yield event

        return AgentRun(body)

    def pending_events(self, state: RunState) -> list[Event]:
        """A suspension announced again: `run-started`, each pending card's event, `run-suspended`.

        A turn recovered from a crash suspends this way: a client may never have seen its cards.
        """
        tools = self.core.domain.tools()
        events: list[Event] = [RunStarted(run_id=state.run_id, session_id=state.session_id)]
        events += [card_event(card, tools.get(card.tool_name)) for card in state.pending.values()]
        events.append(RunSuspended(pending=list(state.pending)))
        return events

    async def reconcile(
        self, session_id: str, state: RunState, agent: AgentSpec[Any]
    ) -> list[ApprovalCardPart]:
        progress = state.progress
        assert progress is not None
        if not progress.message_id:
            return []  # cut off before any call was dispatched: nothing ran
        message = state.find_message(progress.message_id)  # a scratch agent's, maybe
        # Only what `reconcile` looks up: the current attempt of each of the response's calls.
        calls = [attempt_id(message, part) for part in message.tool_calls]
        log = await self.core.tool_log(session_id, calls) if calls else []
        return reconcile(state, message, log, agent.tools, now=self.core.runtime.clock())

    async def drain(self, session_id: str, run: AgentRun[Any]) -> AgentResult[Any]:
        """Run `run` (a turn of `session_id`) to its end with nobody watching; its result.

        Its events are kept in the session's event log, as a served turn's are (its saves
        carry them: `log_run`), so a client can still read or stream them
        (`GET /sessions/{id}/events`). `Worker` and `recover_stale` drive turns this way.
        """
        self.log_run(session_id, run)
        async for _ in run:
            pass
        return run.result

    def log_run(
        self,
        session_id: str,
        run: AgentRun[Any],
        *,
        every: float = 0.05,
        on_logged: OnLogged | None = None,
    ) -> RunLog:
        """`Engine.log_run`: `run`'s events go to the session's event log, with its saves."""
        if run._iterated:
            raise UserError(
                f"log_run(session {session_id!r}): the run has started already; pass it to "
                f"log_run before iterating it, so that none of its events is missed."
            )
        if not every >= 0:
            raise UserError(f"log_run(every={every!r}): give the seconds as a number >= 0.")
        core, store = self.core, self.core.store

        async def append(events: list[dict[str, Any]]) -> int:
            return await core.retrying(
                lambda: store.append_events(session_id, events),
                session_id,
                "log the turn's events",
                left="The turn is left where it was; its events are not all in the event log.",
            )

        log = RunLog(
            append,
            session_id,
            every=every,
            on_logged=on_logged,
            carried=takes(store.save, "events"),
        )
        run._log = log
        return log

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
        return await self.core.store.append_events(session_id, logged), logged

    def agents(self, names: list[str]) -> list[AgentSpec[Any]]:
        missing = [n for n in names if n not in self.core.domain.by_name]
        if missing:
            raise UserError(
                f"The suspended turn runs through agent(s) {', '.join(map(repr, missing))}, "
                f"which this engine's domain does not have (a deploy removed or renamed them?). "
                f"Deploy them again, or start a new session."
            )
        return [self.core.domain.by_name[n] for n in names]


_STALE_TRIES = 3
"""How many times a drive reads the session again when its first write finds it saved since
(another worker's turn ended in between); then `SessionBusyError`."""

_Mode: TypeAlias = Literal["resume", "recover", "advance"]
"""How `Turns.drive` goes on with a turn in progress: resume a suspended one, recover one cut off,
or whichever it needs (`advance`)."""

_NOTHING = {
    "suspended": "Session {session!r} has no suspended turn to resume.",
    "running": "Session {session!r} has no turn cut off while running, so nothing to recover.",
}


_STATUS: dict[str, SessionStatus] = {
    "completed": "completed",
    "suspended": "suspended",
    "interrupted": "active",
    "failed": "failed",
}
