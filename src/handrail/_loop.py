"""The agent loop: model call, tool calls, repeat, until the agent has its answer.

`run_agent` is the inner loop of one agent (`agent-started` ... `agent-completed`);
`run_turn` wraps it into one user turn of a lone agent (`run-started` ... and exactly one of
`run-completed`, `run-suspended`, `run-failed`). Both return an `AgentRun`: iterate it for
events, then read `run.result`.

Interruption is cooperative and leaves a valid history: `AgentRun.interrupt()` (from any task)
cancels the model stream or the tool calls in flight, every unfinished call is paired with a
result marked `interrupted`, partial text is kept, and the turn ends with `run-failed`
(`reason="interrupted"`). Cancelling the consuming task from outside repairs the history the
same way and then propagates the cancellation, as it must.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from pydantic import ValidationError

from ._tool_result import ToolResult
from .agent import Agent
from .events import (
    AgentCompleted,
    AgentStarted,
    Event,
    ReasoningDelta,
    RunCompleted,
    RunFailed,
    RunStarted,
    RunSuspended,
    TextDelta,
    ToolCallDelta,
    UsageEvent,
)
from .exceptions import ConfigError, ModelError, UserError
from .messages import ApprovalCardPart, Message, TextPart, ToolCallPart
from .models import (
    Model,
    ModelRequest,
    ModelResponse,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
)
from .recovery import Journal
from .runtime import Runtime
from .state import Progress, RunState
from .tools._dispatch import Dispatcher

__all__ = ["AgentResult", "AgentRun", "Interrupt", "run_agent", "run_turn"]

OutputT = TypeVar("OutputT")
Outcome = Literal["completed", "suspended", "interrupted", "failed"]

_DEFAULT_RUNTIME: Runtime[Any] = Runtime()
_INTERRUPTED = (
    "interrupted before it finished: the run was cancelled, so this call may or may not have "
    "taken effect"
)


@dataclass(kw_only=True, slots=True)
class AgentResult(Generic[OutputT]):
    """How a run ended, and the state it left."""

    outcome: Outcome
    """`completed`, `suspended` (waiting for people or clients), `interrupted` or `failed`."""
    state: RunState
    """The session state, changed in place by the run."""
    output: OutputT | str | None = None
    """The final answer: text, or the validated `output_type`."""
    pending: list[str] = field(default_factory=list)
    """When suspended: the ids of the calls waiting for a decision."""
    stop_reason: Literal["answer", "ends-turn", "max-iterations"] | None = None
    """Why a completed run stopped."""
    error: str | None = None
    """What went wrong, when the run failed."""


class Interrupt:
    """A request to stop a run, shared by every agent of one turn.

    `request()` is safe to call from any task: if the run is inside a model call or a tool
    call, that work is cancelled at once; if the run is handing an event to its consumer, it
    stops at its next step.
    """

    __slots__ = ("_generator", "_task", "requested")

    def __init__(self) -> None:
        self.requested = False
        self._task: asyncio.Task[Any] | None = None
        self._generator: types.AsyncGeneratorType[Event, None] | None = None

    def request(self) -> None:
        """Ask the run to stop."""
        if self.requested:
            return
        self.requested = True
        generator, task = self._generator, self._task
        if generator is not None and task is not None and generator.ag_running:
            task.cancel()

    def _bind(self, generator: AsyncGenerator[Event, None]) -> None:
        # The latest generator is the one running: an outer run binds after its inner one.
        assert isinstance(generator, types.AsyncGeneratorType)
        self._generator = generator

    def _enter(self) -> None:
        if self._task is None:
            self._task = asyncio.current_task()

    def _absorb(self) -> bool:
        """Whether a CancelledError being handled is this interrupt's (and absorb it)."""
        task = self._task
        return self.requested and task is not None and task.uncancel() == 0


class _Interrupted(Exception):
    """Raised inside the loop when an interrupt is noticed between awaits."""


class AgentRun(Generic[OutputT]):
    """A run in progress: iterate it for events; then `result` holds how it ended.

    ```python
    run = agent.run_stream("Where is my order A1?")
    async for event in run:
        print(event.type)
    print(run.result.outcome, run.result.output)
    ```
    """

    def __init__(
        self,
        body: Callable[[AgentRun[OutputT]], AsyncGenerator[Event, None]],
        interrupt: Interrupt | None = None,
    ) -> None:
        self._interrupt = interrupt or Interrupt()
        self._result: AgentResult[OutputT] | None = None
        self._generator = body(self)
        self._interrupt._bind(self._generator)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._generator

    @property
    def result(self) -> AgentResult[OutputT]:
        """How the run ended; only available once the events are exhausted."""
        if self._result is None:
            raise RuntimeError("The run has not finished: iterate all its events first.")
        return self._result

    def interrupt(self) -> None:
        """Stop the run (see `Interrupt`); the events end with the interruption."""
        self._interrupt.request()

    async def finish(self) -> AgentResult[OutputT]:
        """Consume the remaining events and return the result."""
        async for _ in self._generator:
            pass
        return self.result


def run_agent(
    agent: Agent[OutputT],
    state: RunState,
    runtime: Runtime[Any] | None = None,
    *,
    model: Model | None = None,
    interrupt: Interrupt | None = None,
) -> AgentRun[OutputT]:
    """Run `agent`'s loop on `state` (changed in place) and stream its events.

    The model is resolved as: the per-turn `model` override, then the agent's, then the
    runtime's default.

    Args:
        agent: the agent to run.
        state: the session state; the agent reads the conversation and appends to it.
        runtime: dependencies, hooks, clock and ids.
        model: a per-turn model override.
        interrupt: shared by every agent of a turn so one `request()` stops them all.
    """
    runtime = runtime or _DEFAULT_RUNTIME
    resolved = _model_for(agent, runtime, model)
    return AgentRun(lambda run: _agent_loop(run, agent, state, runtime, resolved), interrupt)


def check_resumable(state: RunState, prompt: str | None, agents: Sequence[str]) -> None:
    """Refuse a turn that would talk past a suspended one.

    Raises:
        UserError: a new prompt while the turn waits for decisions, a resumption while a
            decision is still missing, or a resumption by an agent that did not suspend.
    """
    progress = state.progress
    if progress is None:
        return
    if prompt is not None and progress.status == "running":
        raise UserError(
            "The session's previous turn was cut off while it ran (a crash, or a worker that "
            "stopped): recover it (Engine.recover) before sending a new message."
        )
    if prompt is not None:
        raise UserError(
            f"The session's turn is suspended, waiting on {_ids(state)}: resolve those "
            f"calls and resume the turn (prompt=None) before sending a new message."
        )
    if state.pending:
        raise UserError(
            f"Cannot resume yet: still waiting for a decision on {_ids(state)}. Resolve "
            f"every pending call first."
        )
    if progress.agent not in agents:
        raise UserError(
            f"The turn suspended in agent {progress.agent!r}; resume it with that agent."
        )


def _ids(state: RunState) -> str:
    return ", ".join(state.pending) or "decided calls not yet resumed"


def run_turn(
    route: Agent[Any] | Sequence[Agent[Any]],
    prompt: str | None,
    *,
    state: RunState | None = None,
    runtime: Runtime[Any] | None = None,
    model: Model | None = None,
    journal: Journal | None = None,
) -> AgentRun[Any]:
    """One user turn: `run-started`, each agent's events in order, one terminal event.

    `route` is one agent or a pipeline of agents that run one after the other on the same
    conversation; the turn's output is the last agent's. When an agent suspends, the turn
    suspends with it; with `prompt=None` on a suspended state whose calls are all decided,
    the turn resumes in that agent, where it stopped, then runs the rest of the route.

    With a `journal` (the engine's), the turn checkpoints the session when it starts and
    before each batch of side effects, and logs each side-effecting call, so a crash loses
    nothing and never runs a side effect twice (see `handrail.recovery`).
    """
    agents = [route] if isinstance(route, Agent) else list(route)
    if not agents:
        raise UserError("A turn needs at least one agent.")
    state = state if state is not None else RunState()
    runtime = runtime or _DEFAULT_RUNTIME
    check_resumable(state, prompt, [a.name for a in agents])
    models = [_model_for(a, runtime, model) for a in agents]
    interrupt = Interrupt()
    return AgentRun(
        lambda run: _turn(run, agents, models, prompt, state, runtime, interrupt, journal),
        interrupt,
    )


def _model_for(agent: Agent[Any], runtime: Runtime[Any], override: Model | None) -> Model:
    resolved = override or agent.model or runtime.model
    if resolved is None:
        raise ConfigError(
            f"Agent {agent.name!r} has no model: pass model= to the Agent, set "
            f"Runtime(model=...), or give one for the turn."
        )
    return resolved


async def _turn(
    run: AgentRun[Any],
    agents: list[Agent[Any]],
    models: list[Model],
    prompt: str | None,
    state: RunState,
    runtime: Runtime[Any],
    interrupt: Interrupt,
    journal: Journal | None,
) -> AsyncGenerator[Event, None]:
    state.run_id = runtime.ids("run")
    state.context.update_sys(state.sys_values(runtime.clock()))
    names = [a.name for a in agents]
    first = 0
    if state.progress is not None:  # resuming (a suspension, a crash): where it stopped
        first = names.index(state.progress.agent)
        state.progress.status = "running"
    else:
        if prompt is not None:  # None: continue the conversation as it is
            state.new_turn()
            state.messages.append(
                Message(id=runtime.ids("msg"), role="user", parts=[TextPart(text=prompt)])
            )
        state.progress = Progress(agent=names[0], route=names)
        if journal is not None:  # the user's message is saved before the run acknowledges it
            await journal.checkpoint()
    yield RunStarted(run_id=state.run_id, session_id=state.session_id)
    result: AgentResult[Any] = AgentResult(outcome="completed", state=state)
    try:
        for step in range(first, len(agents)):
            agent = agents[step]
            if step != first:
                state.progress = Progress(agent=agent.name, route=names, step=step)
            inner: AgentRun[Any] = AgentRun(
                lambda r, a=agent, m=models[step]: _agent_loop(r, a, state, runtime, m, journal),  # type: ignore[misc]
                interrupt,
            )
            async for event in inner:
                yield event
            result = inner.result
            if result.outcome != "completed":
                break
    except Exception as exc:
        state.end_turn()  # it failed
        run._result = AgentResult(
            outcome="failed", state=state, error=f"{type(exc).__name__}: {exc}"
        )
        yield RunFailed(reason="error", error=run._result.error)
        return
    except BaseException:
        if journal is None:  # nothing can recover a bare run: end the turn as it stands
            state.end_turn()
        raise
    run._result = result
    if result.outcome != "suspended":
        state.end_turn()
    if result.outcome == "completed":
        yield RunCompleted(output=_jsonable_output(result.output))
    elif result.outcome == "suspended":
        yield RunSuspended(pending=result.pending)
    else:  # the loop itself only ends completed, suspended or interrupted; errors raise
        yield RunFailed(reason="interrupted", error="the run was interrupted")


async def _agent_loop(
    run: AgentRun[OutputT],
    agent: Agent[OutputT],
    state: RunState,
    runtime: Runtime[Any],
    model: Model,
    journal: Journal | None = None,
) -> AsyncGenerator[Event, None]:
    interrupt = run._interrupt
    interrupt._enter()
    name = agent.name
    ids = runtime.ids
    dispatcher = Dispatcher(agent.tools, state, runtime, name, journal)
    progress = state.progress
    if progress is None or progress.agent != name:
        progress = state.progress = Progress(agent=name)
    tool_choice: Literal["auto", "none"] = "auto"
    partial: list[str] = []
    message_id = ""
    yield AgentStarted(agent=name)
    try:
        message: Message | None = None
        calls: list[ToolCallPart] = []
        cards: list[ApprovalCardPart] = []
        if progress.message_id:  # the turn goes on: settle the calls it left first
            progress.status = "running"
            message = next(m for m in reversed(state.messages) if m.id == progress.message_id)
            calls = message.tool_calls
            async for event in dispatcher.resume(message, cards):
                yield event
        while True:
            if message is not None and calls:  # the calls of the last response are settled
                if cards:
                    message.parts.extend(cards)
                    progress.status = "suspended"
                    run._result = AgentResult(
                        outcome="suspended", state=state, pending=list(state.pending)
                    )
                    return
                ended = [
                    p for p in calls if p.status == "completed" and agent.tools[p.name].ends_turn
                ]
                if ended:
                    output: Any = ended[-1].result.data if ended[-1].result else None
                    yield AgentCompleted(agent=name, output=output)
                    run._result = AgentResult(
                        outcome="completed", state=state, output=output, stop_reason="ends-turn"
                    )
                    return
                # Every call repeated one already made: ask for the answer instead of looping.
                tool_choice = "none" if all(p.reused_from for p in calls) else "auto"
            if progress.iterations >= agent.max_iterations:
                break
            if interrupt.requested:
                raise _Interrupted
            progress.iterations += 1
            state.turn_iterations += 1
            request = ModelRequest(
                agent=name,
                instructions=agent.instructions_for(state),
                messages=state.messages,
                tools=agent.tool_definitions,
                tool_choice=tool_choice,
                output_schema=agent.output_schema,
            )
            message_id = ids("msg")
            response: ModelResponse | None = None
            async for chunk in model.stream(request):
                kind = type(chunk)
                if kind is TextChunk:
                    partial.append(chunk.text)  # type: ignore[union-attr]
                    yield TextDelta(agent=name, message_id=message_id, delta=chunk.text)  # type: ignore[union-attr]
                elif kind is ReasoningChunk:
                    yield ReasoningDelta(agent=name, message_id=message_id, delta=chunk.text)  # type: ignore[union-attr]
                elif kind is ToolCallChunk:
                    yield ToolCallDelta(
                        agent=name,
                        message_id=message_id,
                        index=chunk.index,  # type: ignore[union-attr]
                        tool_call_id=chunk.id,  # type: ignore[union-attr]
                        name=chunk.name,  # type: ignore[union-attr]
                        args_delta=chunk.args_delta,  # type: ignore[union-attr]
                    )
                elif kind is ModelResponse:
                    response = chunk  # type: ignore[assignment]
                if interrupt.requested:
                    raise _Interrupted
            if response is None:
                raise ModelError(f"Model {model.name!r} ended its stream without a response.")
            partial.clear()
            usage = response.usage
            state.usage.add(usage)
            yield UsageEvent(
                agent=name,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cached_tokens=usage.cached_tokens,
            )
            message = Message(
                id=message_id, role="assistant", parts=list(response.parts), agent=name
            )
            state.messages.append(message)
            calls = [p for p in message.parts if isinstance(p, ToolCallPart)]
            taken = state.call_ids
            for part in calls:
                if not part.id or part.id in taken:
                    part.id = ids("call")
                taken.add(part.id)

            if calls:
                if interrupt.requested:
                    raise _Interrupted
                progress.message_id = message.id
                async for event in dispatcher.run(calls, cards):
                    yield event
                progress.calls_made += len(calls)
                continue

            if progress.calls_made < agent.min_tool_calls and not progress.nudged:
                progress.nudged = True
                _say(state, ids, agent.nudge)
                continue
            output = message.text
            if agent.output_adapter is not None:
                try:
                    output = agent.output_adapter.validate_json(output)
                except ValidationError as exc:
                    problem = f"Your answer does not match the required output schema: {exc}"
                    if progress.retried_output:
                        raise ModelError(problem) from None
                    progress.retried_output = True
                    _say(state, ids, problem + "\nAnswer again with valid JSON only.")
                    continue
            yield AgentCompleted(agent=name, output=_jsonable_output(output))
            run._result = AgentResult(
                outcome="completed", state=state, output=output, stop_reason="answer"
            )
            return

        text = (
            f"I stopped before finishing: agent {name!r} reached its limit of "
            f"{agent.max_iterations} model calls for this turn."
        )
        state.messages.append(
            Message(
                id=ids("msg"),
                role="assistant",
                agent=name,
                parts=[TextPart(text=text, synthetic=True)],
            )
        )
        yield TextDelta(agent=name, message_id=state.messages[-1].id, delta=text)
        yield AgentCompleted(agent=name, output=text)
        run._result = AgentResult(
            outcome="completed", state=state, output=text, stop_reason="max-iterations"
        )
    except _Interrupted:
        _repair(state, partial, message_id, name)
        run._result = AgentResult(outcome="interrupted", state=state)
    except asyncio.CancelledError:
        _repair(state, partial, message_id, name)
        if not interrupt._absorb():
            raise
        run._result = AgentResult(outcome="interrupted", state=state)
    except BaseException:
        _repair(state, partial, message_id, name)
        raise


def _say(state: RunState, ids: Callable[[str], str], text: str) -> None:
    """Append a synthetic user message (visible in history, marked synthetic)."""
    state.messages.append(
        Message(id=ids("msg"), role="user", parts=[TextPart(text=text, synthetic=True)])
    )


def _repair(state: RunState, partial: list[str], message_id: str, agent: str) -> None:
    """Leave a valid history after a run stopped midway: keep partial text, pair every call."""
    if partial:
        state.messages.append(
            Message(
                id=message_id,
                role="assistant",
                agent=agent,
                parts=[TextPart(text="".join(partial))],
            )
        )
        partial.clear()
    if not state.messages:
        return
    for part in state.messages[-1].parts:
        if isinstance(part, ToolCallPart) and part.status in ("pending", "running"):
            part.status = "interrupted"
            part.result = ToolResult.failure(_INTERRUPTED)


def _jsonable_output(output: Any) -> Any:
    if output is None or isinstance(output, str | int | float | bool):
        return output
    import pydantic_core

    return pydantic_core.to_jsonable_python(output)
