"""The agent loop: model call, tool calls, repeat, until the agent has its answer.

`run_agent` is the inner loop of one agent (`agent-started` ... `agent-completed`);
`run_turn` (in `_turn.py`) wraps agents into one user turn. Both return an `AgentRun`:
iterate it for events, then read `run.result`.

Interruption is cooperative and leaves a valid history: `AgentRun.interrupt()` (from any task)
cancels the model stream or the tool calls in flight, every unfinished call is paired with a
result marked `interrupted`, partial text is kept, and the turn ends with `run-failed`
(`reason="interrupted"`). Cancelling the consuming task from outside repairs the history the
same way and then propagates the cancellation, as it must.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import ValidationError

from ._agent_spec import CONTINUE_PROMPT, AgentSpec
from ._tool_result import ToolResult
from .compaction import Compaction, compact
from .events import (
    AgentCompleted,
    AgentStarted,
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UsageEvent,
)
from .exceptions import ConfigError, ModelError
from .messages import ApprovalCardPart, Message, TextPart, ToolCallPart
from .models import (
    FinishReason,
    Model,
    ModelRequest,
    ModelResponse,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
)
from .models._infer import as_model
from .recovery import Journal
from .runtime import Runtime
from .state import Progress, RunState
from .tools._dispatch import Dispatcher, completed_event

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["AgentResult", "AgentRun", "Interrupt", "StopReason", "run_agent"]

OutputT = TypeVar("OutputT")
Outcome = Literal["completed", "suspended", "interrupted", "failed"]
StopReason = Literal["answer", "ends-turn", "cut", "max-iterations"]

_DEFAULT_RUNTIME: Runtime[Any] = Runtime()
_INTERRUPTED = (
    "interrupted before it finished: the run was cancelled, so this call may or may not have "
    "taken effect"
)
_UNFINISHED: dict[str, str] = {
    "length": "your response was cut off by the output token limit before it was complete",
    "content_filter": "the provider's content filter stopped your response before it was complete",
}
_FINISHED = frozenset({"stop", "tool_call", None})
"""The finish reasons of a response that may be acted on (None: a model that does not say)."""
_NO_TOOLS = (
    "Not run: this request asked for an answer without tool calls, because {count} of your "
    "responses in a row only repeated calls already made this turn (their results are above, "
    "marked as reused). Answer with what you have."
)
"""The result of each call made when asked for none (`Runtime.max_reused_responses`)."""


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
    stop_reason: StopReason | None = None
    """Why the run stopped: `answer`, `ends-turn` (a tool that ends the turn), `cut` (the
    answer is incomplete: the provider cut it, `finish_reason` says why) or `max-iterations`
    (an iteration cap; the run then ends `failed`)."""
    finish_reason: FinishReason | None = None
    """Why the model stopped its last response, in handrail's words for every provider."""
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
        self._log: object | None = None  # where a drive's events are logged (`Engine.log_run`)
        self._iterated = False
        self._generator = body(self)
        self._interrupt._bind(self._generator)

    def __aiter__(self) -> AsyncIterator[Event]:
        self._iterated = True
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
        self._iterated = True
        async for _ in self._generator:
            pass
        return self.result


def run_agent(
    agent: AgentSpec[OutputT],
    state: RunState,
    runtime: Runtime[Any] | None = None,
    *,
    model: Model | str | None = None,
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


def _model_for(agent: AgentSpec[Any], runtime: Runtime[Any], override: Model | str | None) -> Model:
    resolved = override or agent.model or runtime.model
    if resolved is None:
        raise ConfigError(
            f"Agent {agent.name!r} has no model: pass model= to the Agent, set "
            f"Runtime(model=...), or give one for the turn."
        )
    return as_model(resolved, where="the turn's model=")


async def _agent_loop(
    run: AgentRun[OutputT],
    agent: AgentSpec[OutputT],
    state: RunState,
    runtime: Runtime[Any],
    model: Model,
    journal: Journal | None = None,
    *,
    last: bool = True,
    trace: Span | None = None,
) -> AsyncGenerator[Event, None]:
    """One agent's loop, on the shared conversation or its own scratch messages.

    A `scratch` agent writes to its scratch messages and sees the conversation before them;
    when it is the `last` agent of its route, its answer is published to the conversation.
    """
    interrupt = run._interrupt
    interrupt._enter()
    agent = agent.for_turn(state)  # only the tools this turn's caller may see and call
    name = agent.name
    ids = runtime.ids
    tracing = runtime.tracing if trace is not None else None
    if tracing is not None:
        chat_attributes = {
            "gen_ai.operation.name": "chat",
            **tracing.model_attributes(model, state.session_id),
        }
    dispatcher = Dispatcher(
        agent.tools, state, runtime, name, journal, trace, expires_after=agent.expires_after
    )
    progress = state.progress
    if progress is None or progress.agent != name:
        progress = state.progress = Progress(agent=name)
    shared = state.messages
    history = shared
    if agent.scratch:
        history = state.scratch.setdefault(name, [])
        state.start_scratch(name)  # where its scratch goes in the history when the turn ends
    turn_cap = runtime.max_turn_iterations
    tool_choice: Literal["auto", "none"] = "auto"
    insist = False  # the model called tools although asked not to: ask again without them
    reused = 0  # responses in a row whose every call was reused
    reuse_cap = runtime.max_reused_responses
    pieces: list[Message] = []  # an answer in pieces: cut (`continue_on_length`) or paused
    continued = 0  # how many times a cut answer was continued
    partial: list[str] = []
    message_id = ""
    yield AgentStarted(agent=name)
    try:
        message: Message | None = None
        calls: list[ToolCallPart] = []
        cards: list[ApprovalCardPart] = []
        if progress.message_id:  # the turn goes on: settle the calls it left first
            progress.status = "running"
            message = next(m for m in reversed(history) if m.id == progress.message_id)
            calls = [p for p in message.tool_calls if p.executor != "provider"]
            async for event in dispatcher.resume(message, cards):
                yield event
        while True:
            if message is not None and calls:  # the calls of the last response are settled
                if cards:  # each on the message already (`Dispatcher.run`)
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
                # A response that only repeated reads gets their results and may go on acting;
                # only a model that keeps repeating itself is asked for its answer instead.
                reused = reused + 1 if all(p.reused_from for p in calls) else 0
                repeated = reuse_cap is not None and reused >= reuse_cap
                tool_choice = "none" if insist or repeated else "auto"
                insist = False
            if progress.iterations >= agent.max_iterations:
                limit = (
                    f"agent {name!r} reached its limit of {agent.max_iterations} model calls "
                    f"for this turn"
                )
                break
            if turn_cap is not None and state.turn_iterations >= turn_cap:
                limit = f"this turn reached its limit of {turn_cap} model calls"
                break
            if interrupt.requested:
                raise _Interrupted
            if journal is not None:
                await journal.acting()
            progress.iterations += 1
            state.turn_iterations += 1
            request = ModelRequest(
                agent=name,
                instructions=agent.instructions_for(state),
                messages=[*shared, *history] if history is not shared else shared,
                tools=agent.tool_definitions,
                hosted_tools=agent.hosted_tools,
                tool_choice=tool_choice,
                output_schema=agent.output_schema,
                session_id=state.session_id,
            )
            if runtime.compaction is not None:
                await _compact(request, runtime.compaction, model, state)
            request.messages = _conversation(request.messages)
            message_id = ids("msg")
            response: ModelResponse | None = None
            chat = None
            stream = model.stream(request)
            if tracing is not None:
                chat = tracing.start(f"chat {model.name}", trace, chat_attributes, client=True)
                if tracing.capture_content:
                    tracing.request_content(chat, request)
                stream = tracing.within(chat, stream)
            try:
                async for chunk in stream:
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
            except BaseException as exc:
                if chat is not None:
                    assert tracing is not None
                    tracing.fail(chat, f"{type(exc).__name__}: {exc}", type(exc).__name__)
                    chat.end()
                raise
            if response is None:
                raise ModelError(f"Model {model.name!r} ended its stream without a response.")
            partial.clear()
            usage = response.usage
            state.usage.add(usage)
            if chat is not None:
                assert tracing is not None
                tracing.response(chat, response)
                chat.end()
            yield UsageEvent(
                agent=name,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cached_tokens=usage.cached_tokens,
                reasoning_tokens=usage.reasoning_tokens,
                finish_reason=response.finish_reason,
            )
            finish = response.finish_reason
            message = Message(
                id=message_id, role="assistant", parts=list(response.parts), agent=name
            )
            history.append(message)
            calls = [p for p in message.parts if isinstance(p, ToolCallPart)]
            taken = state.call_ids
            settled: set[str] = set()
            for part in calls:
                if part.executor == "provider" and part.id in taken:
                    earlier = _unsettled_hosted(history, message, part.id)
                    if earlier is not None:  # its result came in this response: same call
                        earlier.status, earlier.result = part.status, part.result
                        earlier.digest = part.digest
                        settled.add(part.id)
                        continue
                # Ids are unique within a session, so the tool-call log never mixes two calls:
                # a taken one is replaced, and so is every one when the calls before `base`
                # are not loaded (a server that numbers its calls may have used it then).
                # A call the provider ran never reaches the log: it keeps the provider's id.
                renumber = state.base and part.executor != "provider"
                if not part.id or part.id in taken or renumber:
                    part.id = _fresh_call_id(ids, state)
                taken.add(part.id)
            # The provider ran these already: they are shown, never run, and never a reason
            # to ask the model again.
            hosted = [p for p in calls if p.executor == "provider"]
            if hosted:
                calls = [p for p in calls if p.executor != "provider"]
                progress.calls_made += len(hosted) - len(settled)  # for `min_tool_calls`
                for event in dispatcher.hosted(hosted, settled):
                    yield event
            if finish == "pause" and not calls:
                # The provider paused a long turn of its hosted tools: send the conversation
                # back as it is (this message included) and the model goes on from there.
                pieces.append(message)
                continue

            if calls:
                refusal = _refusal(response, tool_choice, reuse_cap)
                if refusal is not None:  # never acted on: each call gets why, as its result
                    for part in calls:
                        part.status = "failed"
                        part.result = ToolResult.failure(
                            refusal,
                            code="incomplete_response"
                            if response.finish_reason not in _FINISHED
                            else "tools_not_allowed",
                        )
                        part.started_at = runtime.clock()
                        yield completed_event(part)
                    insist = tool_choice == "none"
                    continue
                if interrupt.requested:
                    raise _Interrupted
                progress.message_id = message.id
                async for event in dispatcher.run(message, calls, cards):
                    yield event
                progress.calls_made += len(calls)
                continue

            if progress.calls_made < agent.min_tool_calls and not progress.nudged:
                progress.nudged = True
                _say(history, ids, agent.nudge)
                continue
            output = message.text
            cut = finish not in _FINISHED
            if cut and finish == "length" and continued < agent.continue_on_length:
                continued += 1
                pieces.append(message)
                _say(history, ids, CONTINUE_PROMPT)
                continue
            if pieces:  # the answer came in pieces: it is all of them
                output = "".join(m.text for m in pieces) + output
            if agent.output_adapter is not None:
                try:
                    output = agent.output_adapter.validate_json(output)
                except ValidationError as exc:
                    problem = f"Your answer does not match the required output schema: {exc}"
                    if progress.retried_output:
                        raise ModelError(problem) from None
                    progress.retried_output = True
                    _say(history, ids, problem + "\nAnswer again with valid JSON only.")
                    continue
            if last and history is not shared:  # the route's answer is for the user
                shared.extend([*pieces, message])
            yield AgentCompleted(agent=name, output=_jsonable_output(output))
            run._result = AgentResult(
                outcome="completed",
                state=state,
                output=output,
                stop_reason="cut" if cut else "answer",
                finish_reason=finish,
            )
            return

        text = f"I stopped before finishing: {limit}."
        stopped = Message(
            id=ids("msg"), role="assistant", agent=name, parts=[TextPart(text=text, synthetic=True)]
        )
        shared.append(stopped)  # the user is told, whoever's loop it was
        yield TextDelta(agent=name, message_id=stopped.id, delta=text)
        yield AgentCompleted(agent=name, output=text)
        run._result = AgentResult(
            outcome="failed", state=state, output=text, stop_reason="max-iterations", error=limit
        )
    except _Interrupted:
        _repair(history, partial, message_id, name)
        run._result = AgentResult(outcome="interrupted", state=state)
    except asyncio.CancelledError:
        _repair(history, partial, message_id, name)
        if not interrupt._absorb():
            raise
        run._result = AgentResult(outcome="interrupted", state=state)
    except BaseException:
        _repair(history, partial, message_id, name)
        raise


async def _compact(
    request: ModelRequest, config: Compaction, model: Model, state: RunState
) -> None:
    """Fit the request into its token budget: history becomes `[summary, recent]`.

    The stored history is never changed; the summary is stored with the session and extended
    incrementally.
    """
    compacted = await compact(
        request, config=config, model=model, summary=state.summary, base=state.base
    )
    request.messages = compacted.messages
    state.summary = compacted.summary
    state.usage.add(compacted.usage)


def _conversation(messages: list[Message]) -> list[Message]:
    """What a model is shown of `messages`: not the scratch of earlier turns (kept for people)."""
    if not any(m.scratch for m in messages):
        return messages
    return [m for m in messages if not m.scratch]


def _fresh_call_id(ids: Callable[[str], str], state: RunState) -> str:
    """A call id no other call of the session has.

    The loaded calls are checked; when the calls before `state.base` are not loaded, the id
    also carries the turn (`call_…_t12`), which no call of an earlier turn can have had, so
    the guarantee does not rest on the id source alone (a counter restarts with its process).
    """
    while True:
        fresh = ids("call") if not state.base else f"{ids('call')}_t{state.turn}"
        if fresh not in state.call_ids:
            return fresh


def _refusal(response: ModelResponse, tool_choice: str, reused: int | None) -> str | None:
    """Why the tool calls of `response` must not run, or None when they may.

    A response the provider did not finish (cut by its token limit or its filter, or ended
    for a reason that does not say it is complete) may hold calls the model had not finished
    writing; and a model that calls tools when asked for none is not obeyed.
    """
    finish = response.finish_reason
    if finish not in _FINISHED:
        why = _UNFINISHED.get(finish or "") or (
            f"the provider ended your response with stop reason {response.stop_reason!r}, "
            f"which does not say it was complete"
        )
        return (
            f"Not run: {why}, so this call may not be what you meant (it is shown as you sent "
            f"it). Send it again, complete; if it was long, make it shorter."
        )
    if tool_choice == "none":
        return _NO_TOOLS.format(count=reused)
    return None


def _unsettled_hosted(
    history: list[Message], current: Message, call_id: str
) -> ToolCallPart | None:
    """The earlier part of hosted call `call_id` if its result had not come yet.

    Anthropic runs a server tool called beside a client tool only once the client tool's
    result is sent: the result then comes in the next response.
    """
    for message in reversed(history):
        if message is current:
            continue
        for part in message.tool_calls:
            if part.id == call_id:
                unsettled = part.executor == "provider" and part.result is None
                return part if unsettled else None
    return None


def _say(history: list[Message], ids: Callable[[str], str], text: str) -> None:
    """Append a synthetic user message (kept in history, marked synthetic)."""
    history.append(Message(id=ids("msg"), role="user", parts=[TextPart(text=text, synthetic=True)]))


def _repair(history: list[Message], partial: list[str], message_id: str, agent: str) -> None:
    """Leave a valid history after a run stopped midway: keep partial text, pair every call."""
    if partial:
        history.append(
            Message(
                id=message_id,
                role="assistant",
                agent=agent,
                parts=[TextPart(text="".join(partial))],
            )
        )
        partial.clear()
    if not history:
        return
    for part in history[-1].parts:
        if isinstance(part, ToolCallPart) and part.status in ("pending", "running"):
            part.status = "interrupted"
            part.result = ToolResult.failure(_INTERRUPTED, code="interrupted")


def _jsonable_output(output: Any) -> Any:
    if output is None or isinstance(output, str | int | float | bool):
        return output
    import pydantic_core

    return pydantic_core.to_jsonable_python(output)
