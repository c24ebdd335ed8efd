"""One user turn: route it, run the route's agents one after the other, end it once.

`run_turn` streams `run-started`, then (when a `Router` is given) the supervisor's decision,
then each agent's events, and exactly one of `run-completed`, `run-suspended`, `run-failed`.

What each agent of a route sees is explicit: the shared conversation; a *handoff* when it
starts (the previous agent's answer, if that agent kept its messages in scratch, and the
supervisor's hint for it), as a synthetic message; and its own scratch messages when it is a
`scratch` agent. The last agent's answer is the turn's output and is always in the
conversation.

A suspended turn resumes in the agent that suspended (its route, its step, its handoff are
stored with the turn's `Progress`); a turn cut off by a crash resumes from its last
checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._agent_spec import AgentSpec
from ._loop import (
    _DEFAULT_RUNTIME,
    AgentResult,
    AgentRun,
    Interrupt,
    _agent_loop,
    _jsonable_output,
    _model_for,
)
from ._redact import log_failure, new_reference
from .domain import RouteDecision, Router
from .events import AgentCompleted, Event, RunCompleted, RunFailed, RunStarted, RunSuspended
from .exceptions import ModelError, StoreError, TurnCutOffError, TurnSuspendedError, UserError
from .messages import ApprovalCardPart, Message, TextPart, ToolCallPart
from .models import Model
from .recovery import Journal
from .runtime import Runtime
from .state import Failure, Progress, RouteChoice, RunState

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["RouteDecision", "Router", "check_resumable", "run_turn"]

_log = logging.getLogger("handrail.runs")


def check_resumable(
    state: RunState, prompt: str | None, agents: Sequence[str], *, waiting: bool = False
) -> None:
    """Refuse a turn that would talk past a suspended or cut-off one.

    Args:
        state: the session state.
        prompt: the new message, or None to go on with the turn in progress.
        agents: the agents that may go on with it.
        waiting: calls may still wait for a decision (a turn being recovered: it suspends on
            them again rather than going on).

    Raises:
        TurnSuspendedError: a new prompt while a turn waits for decisions.
        TurnCutOffError: a new prompt while a turn that was cut off waits to be recovered.
        UserError: a resumption while a decision is still missing, or by an agent that did
            not suspend.
    """
    progress = state.progress
    if progress is None:
        return
    if prompt is not None and progress.status == "running":
        raise TurnCutOffError(state.session_id)
    if prompt is not None:
        raise TurnSuspendedError(state.session_id, tuple(state.pending))
    if state.pending and not waiting:
        raise UserError(
            f"Cannot resume yet: still waiting for a decision on {', '.join(state.pending)}. "
            f"Decide each pending call first (engine.resolve)."
        )
    if progress.agent not in agents:
        raise UserError(
            f"The turn suspended in agent {progress.agent!r}; resume it with that agent."
        )


def run_turn(
    route: AgentSpec[Any] | Sequence[AgentSpec[Any]] | Router,
    prompt: str | None,
    *,
    state: RunState | None = None,
    runtime: Runtime[Any] | None = None,
    model: Model | str | None = None,
    journal: Journal | None = None,
    models: Callable[[AgentSpec[Any]], Model] | None = None,
) -> AgentRun[Any]:
    """One user turn: `run-started`, the agents' events in order, one terminal event.

    Args:
        route: one agent, a pipeline of agents that run one after the other, or a `Router`
            whose supervisor picks the pipeline.
        prompt: the user's message (None: resume a suspended turn, or continue as is).
        state: the session state (a new one when None), changed in place.
        runtime: dependencies, hooks, policy, clock and ids.
        model: a model for this turn, over the agents' and the runtime's.
        journal: the engine's journal: the turn checkpoints the session when it starts and
            before each batch of side effects, and logs each side-effecting call, so a crash
            loses nothing (see `handrail.recovery`).
        models: resolves each agent's model (default: `model`, then the agent's, then the
            runtime's); the engine's runtime builder passes its own.
    """
    state = state if state is not None else RunState()
    runtime = runtime or _DEFAULT_RUNTIME
    resolve: Callable[[AgentSpec[Any]], Model] = models or (
        lambda agent: _model_for(agent, runtime, model)
    )
    if isinstance(route, Router):
        candidates = [route.supervisor, *(a for r in route.routes.values() for a in r)]
    else:
        route = [route] if isinstance(route, AgentSpec) else list(route)
        if not route:
            raise UserError("A turn needs at least one agent.")
        candidates = route
    check_resumable(state, prompt, [a.name for a in candidates])
    for agent in candidates:
        resolve(agent)  # a missing model is a ConfigError now, not mid-turn
    interrupt = Interrupt()
    plan = route
    return AgentRun(
        lambda run: _turn(run, plan, resolve, prompt, state, runtime, interrupt, journal),
        interrupt,
    )


async def _turn(
    run: AgentRun[Any],
    route: list[AgentSpec[Any]] | Router,
    resolve: Callable[[AgentSpec[Any]], Model],
    prompt: str | None,
    state: RunState,
    runtime: Runtime[Any],
    interrupt: Interrupt,
    journal: Journal | None,
) -> AsyncGenerator[Event, None]:
    tracing = runtime.tracing
    if tracing is None:
        async for event in _steps(run, route, resolve, prompt, state, runtime, interrupt, journal):
            yield event
        return
    attributes: dict[str, Any] = {"handrail.session.id": state.session_id or ""}
    if state.session_id:
        attributes["gen_ai.conversation.id"] = state.session_id
    progress = state.progress
    attributes["handrail.resumed"] = progress is not None
    links = tracing.resumed_from(progress.trace) if progress is not None else []
    span = tracing.start("handrail.turn", None, attributes, links=links)
    if progress is not None:
        tracing.decisions(span, _decided(state, progress))
    try:
        async for event in _steps(
            run, route, resolve, prompt, state, runtime, interrupt, journal, span
        ):
            if isinstance(event, RunSuspended):
                tracing.start(
                    "handrail.suspension", span, {"handrail.pending": event.pending}
                ).end()
                if state.progress is not None:  # its resumption links to this turn
                    state.progress.trace = tracing.traceparent(span)
            yield event
    finally:
        result = run._result
        span.set_attributes(
            {
                "handrail.run.id": state.run_id,
                "handrail.outcome": result.outcome if result is not None else "cancelled",
            }
        )
        if result is not None and result.outcome in ("failed", "interrupted"):
            error = result.error or result.outcome
            if result.stop_reason == "max-iterations":
                error_type = "max_iterations"
            elif result.outcome == "interrupted":
                error_type = "interrupted"
            else:  # `_steps` wrote it as "{class name}: {message}"
                error_type = error.partition(":")[0]
            tracing.fail(span, error, error_type)
        span.end()


def _decided(state: RunState, progress: Progress) -> list[ApprovalCardPart]:
    """The decisions a resumed turn acts on: those of the calls its message still awaits."""
    for message in state.all_messages():
        if message.id == progress.message_id:
            waiting = {
                p.id
                for p in message.parts
                if isinstance(p, ToolCallPart) and p.status in ("waiting", "running")
            }
            return [
                p
                for p in message.parts
                if isinstance(p, ApprovalCardPart)
                and p.decision is not None
                and p.tool_call_id in waiting
            ]
    return []


async def _steps(
    run: AgentRun[Any],
    route: list[AgentSpec[Any]] | Router,
    resolve: Callable[[AgentSpec[Any]], Model],
    prompt: str | None,
    state: RunState,
    runtime: Runtime[Any],
    interrupt: Interrupt,
    journal: Journal | None,
    trace: Span | None = None,
) -> AsyncGenerator[Event, None]:
    state.run_id = runtime.ids("run")
    state.context.update_sys(state.sys_values(runtime.clock()))
    resumed = state.progress is not None
    if resumed:
        assert state.progress is not None
        state.progress.status = "running"
    elif prompt is not None:  # None: continue the conversation as it is
        state.new_turn()
        state.messages.append(
            Message(id=runtime.ids("msg"), role="user", parts=[TextPart(text=prompt)])
        )
    if not resumed:
        first = route.supervisor.name if isinstance(route, Router) else route[0].name
        state.progress = Progress(agent=first)
        if journal is not None:
            # The user's message is saved before the run acknowledges it: the engine holds
            # its events back until this write, which logs this one with the message.
            yield RunStarted(run_id=state.run_id, session_id=state.session_id)
            await journal.checkpoint()
    if resumed or journal is None:
        yield RunStarted(run_id=state.run_id, session_id=state.session_id)
    result: AgentResult[Any] = AgentResult(outcome="completed", state=state)
    try:
        agents = route if isinstance(route, list) else None
        if agents is None:
            assert isinstance(route, Router)
            if resumed and state.route is not None:
                agents = list(route.routes[state.route.route])
            else:
                async for event in _choose(route, resolve, state, runtime, interrupt, trace):
                    yield event
                assert state.route is not None
                agents = list(route.routes[state.route.route])
        names = [a.name for a in agents]
        first_step = 0
        progress = state.progress
        if resumed and progress is not None and progress.agent in names:
            # The step it stopped at: an agent may stand twice in a route.
            at = progress.step
            fits = progress.route == names and 0 <= at < len(names) and names[at] == progress.agent
            first_step = at if fits else names.index(progress.agent)
        else:
            _start(state, agents, 0, None, runtime)
        for step in range(first_step, len(agents)):
            agent = agents[step]
            if step != first_step:
                _start(state, agents, step, result.output, runtime)
            inner = _agent_run(
                agent, state, runtime, resolve, journal, interrupt, trace, step == len(agents) - 1
            )
            async for event in inner:
                yield event
            result = inner.result
            if result.outcome != "completed":
                break
    except Exception as exc:
        error = _leaf(exc)
        if journal is not None and isinstance(error, StoreError):
            # The journal could not record a step (after its retries): the turn stops here as
            # a crash here would stop it. Nothing more is written (a `failed` save would
            # strand the calls in flight and the cards that wait); the stored turn is
            # recovered later, and the caller is told why.
            if error is exc:
                raise
            raise error from exc
        state.end_turn()  # it failed
        reference = new_reference()
        log_failure(
            _log,
            "The turn failed",
            error,
            reference=reference,
            session_id=state.session_id,
            run_id=state.run_id or None,
        )
        detail = f"{type(error).__name__}: {error}"
        state.failure = Failure(
            error_type=type(error).__name__, reference=reference, at=runtime.clock()
        )
        run._result = AgentResult(outcome="failed", state=state, error=detail)
        yield RunFailed(reason="error", error=detail, reference=reference)
        return
    except BaseException:
        if journal is None:  # nothing can recover a bare run: end the turn as it stands
            state.end_turn()
        raise
    run._result = result
    if result.outcome != "suspended":
        state.end_turn()
    if result.outcome == "completed":
        yield RunCompleted(
            output=_jsonable_output(result.output),
            stop_reason=result.stop_reason,
            finish_reason=result.finish_reason,
        )
    elif result.outcome == "suspended":
        yield RunSuspended(pending=result.pending)
    elif result.stop_reason == "max-iterations":
        yield RunFailed(reason="max-iterations", error=result.error)
    else:  # the loop itself only ends completed, suspended or interrupted; errors raise
        yield RunFailed(reason="interrupted", error="the run was interrupted")


def _leaf(error: BaseException) -> BaseException:
    """The error that happened, not a group wrapping it (a task group's): its first."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _start(
    state: RunState,
    agents: list[AgentSpec[Any]],
    step: int,
    previous_output: Any,
    runtime: Runtime[Any],
) -> None:
    """Make agent `step` of the route the current one, with its handoff message."""
    agent = agents[step]
    state.progress = Progress(agent=agent.name, route=[a.name for a in agents], step=step)
    notes: list[str] = []
    if step and agents[step - 1].scratch and previous_output is not None:
        output = previous_output if isinstance(previous_output, str) else _json(previous_output)
        notes.append(f"{agents[step - 1].name} handed over: {output}")
    if state.route is not None and (hint := state.route.hints.get(agent.name)):
        notes.append(f"Note from the supervisor: {hint}")
    if agent.scratch:  # its scratch goes here in the history when the turn ends
        state.start_scratch(agent.name)
    if notes:
        history = state.scratch.setdefault(agent.name, []) if agent.scratch else state.messages
        text = "\n\n".join(notes)
        history.append(
            Message(id=runtime.ids("msg"), role="user", parts=[TextPart(text=text, synthetic=True)])
        )


def _agent_run(
    agent: AgentSpec[Any],
    state: RunState,
    runtime: Runtime[Any],
    resolve: Callable[[AgentSpec[Any]], Model],
    journal: Journal | None,
    interrupt: Interrupt,
    trace: Span | None,
    last: bool,
) -> AgentRun[Any]:
    """One agent's loop as a run of the turn (in its own `invoke_agent` span when tracing)."""
    model = resolve(agent)
    tracing = runtime.tracing
    if trace is None or tracing is None:
        return AgentRun(
            lambda r: _agent_loop(r, agent, state, runtime, model, journal, last=last), interrupt
        )
    span = tracing.start(
        f"invoke_agent {agent.name}",
        trace,
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent.name,
            **tracing.model_attributes(model, state.session_id),
        },
    )

    async def traced(r: AgentRun[Any]) -> AsyncGenerator[Event, None]:
        try:
            async for event in _agent_loop(
                r, agent, state, runtime, model, journal, last=last, trace=span
            ):
                yield event
        except BaseException as exc:
            tracing.fail(span, f"{type(exc).__name__}: {exc}", type(exc).__name__)
            raise
        finally:
            span.end()

    return AgentRun(traced, interrupt)


def _with_routes(router: Router, state: RunState) -> AgentSpec[Any]:
    """The supervisor, told after its own instructions each route's agents and their tools.

    The tools are those this turn's caller may see (after `tools_for`).
    """
    lines = ["The routes, with the tools each agent can use for this caller:"]
    for route, agents in router.routes.items():
        steps = []
        for agent in agents:
            names = ", ".join(agent.for_turn(state).tools) or "no tools"
            steps.append(f"{agent.name} ({names})")
        lines.append(f"- {route}: {' -> '.join(steps)}")
    listing = "\n".join(lines)
    supervisor = router.supervisor

    def instructions(state: RunState) -> str:
        text = supervisor.instructions_for(state) or ""
        return f"{text}\n\n{listing}" if text else listing

    return supervisor.replace(instructions=instructions)


async def _choose(
    router: Router,
    resolve: Callable[[AgentSpec[Any]], Model],
    state: RunState,
    runtime: Runtime[Any],
    interrupt: Interrupt,
    trace: Span | None,
) -> AsyncGenerator[Event, None]:
    """Run the supervisor (in scratch) and record the route it chose, or the fallback."""
    supervisor = _with_routes(router, state)
    state.progress = Progress(agent=supervisor.name)
    decision: Any = None
    problem = ""
    inner = _agent_run(supervisor, state, runtime, resolve, None, interrupt, trace, False)
    state.scratch.pop(supervisor.name, None)  # a decision cut off by a crash starts over
    state.scratch_at.pop(supervisor.name, None)
    try:
        async for event in inner:
            if isinstance(event, AgentCompleted):
                continue  # reported below, with the route actually taken
            yield event
        decision = inner.result.output
    except ModelError as exc:  # its output did not parse, even after one retry
        problem = f"the supervisor's answer was not a decision ({exc})"
    route = getattr(decision, "route", None)
    if isinstance(route, str) and route in router.routes:
        choice = RouteChoice(
            route=route,
            reason=str(getattr(decision, "reason", "")),
            hints=dict(getattr(decision, "hints", {}) or {}),
        )
    else:
        problem = problem or f"the supervisor chose {route!r}, which is not a route"
        choice = RouteChoice(
            route=router.default, reason=f"fell back to the default route: {problem}", fallback=True
        )
    state.route = choice
    if trace is not None and runtime.tracing is not None:
        runtime.tracing.start(
            "handrail.route",
            trace,
            {"handrail.route": choice.route, "handrail.route.fallback": choice.fallback},
        ).end()
    yield AgentCompleted(
        agent=supervisor.name,
        output={"route": choice.route, "reason": choice.reason, "fallback": choice.fallback},
    )


def _json(value: Any) -> str:
    import pydantic_core

    return pydantic_core.to_json(value).decode()
