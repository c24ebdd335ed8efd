"""`Agent`: a named model loop with instructions, tools and an optional output type."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import TypeAdapter

from .exceptions import UserError
from .models import Model, ToolDefinition
from .models._infer import as_model
from .tools import HostedTool, Tool

if TYPE_CHECKING:
    from ._loop import AgentResult, AgentRun
    from .runtime import Runtime
    from .state import RunState

__all__ = ["Agent"]

OutputT = TypeVar("OutputT")

CONTINUE_PROMPT = (
    "Your answer was cut off by the output token limit. Continue it exactly where it "
    "stopped, without repeating anything."
)
"""What the loop says to have a cut answer continued (`Agent(continue_on_length=...)`)."""

DEFAULT_NUDGE = (
    "You answered before using your tools. Call at least {n} tool(s) to ground your answer, "
    "then answer."
)


class Agent(Generic[OutputT]):
    """An agent: instructions, tools, and the limits of its loop.

    Args:
        name: identifies the agent in events, history and routes.
        instructions: the system prompt, or a function of the run state that returns it.
        tools: what the agent may call (its allow-list); names must be unique.
        model: the agent's model; when None the runtime's default is used.
        max_iterations: model calls this agent may make in one turn (default 10); reaching
            the cap ends the agent's turn with a message that says so.
        min_tool_calls: when the model answers before making this many tool calls, one
            synthetic nudge (visible in history, marked synthetic) asks it to use its tools.
        output_type: a type (usually a pydantic model) the final answer must validate
            against; invalid output is sent back once with the validation error.
        nudge: the text of the `min_tool_calls` nudge (`{n}` is replaced by the minimum).
        scratch: keep this agent's messages (its tool calls, its nudges, its answer) out of
            the conversation, in the turn's scratch: the next agent of the route gets its
            answer as a handoff; as the last agent of a route, its answer is published.
        continue_on_length: how many times, in one turn, the loop asks the model to go on
            with a text answer that its output token limit cut (the answer is then the
            pieces joined). 0 (the default): a cut answer ends the turn as it is, marked
            `stop_reason="cut"` (and `finish_reason="length"`) on the result and on
            `run-completed`. Tool calls of a cut response are never run, whatever this says.
    """

    def __init__(
        self,
        name: str,
        *,
        instructions: str | Callable[[RunState], str] = "",
        tools: Sequence[Tool[Any]] = (),
        model: Model | str | None = None,
        max_iterations: int = 10,
        min_tool_calls: int = 0,
        output_type: type[OutputT] | None = None,
        nudge: str = DEFAULT_NUDGE,
        scratch: bool = False,
        continue_on_length: int = 0,
    ) -> None:
        if max_iterations < 1:
            raise UserError(f"Agent {name!r}: max_iterations must be at least 1.")
        if min_tool_calls < 0:
            raise UserError(f"Agent {name!r}: min_tool_calls cannot be negative.")
        self.name = name
        self.instructions = instructions
        self.model: Model | None = (
            None if model is None else as_model(model, where=f"Agent({name!r}, model=...)")
        )
        self.max_iterations = max_iterations
        self.min_tool_calls = min_tool_calls
        self.scratch = scratch
        if continue_on_length < 0:
            raise UserError(f"Agent {name!r}: continue_on_length cannot be negative.")
        self.continue_on_length = continue_on_length
        self.nudge = nudge.replace("{n}", str(min_tool_calls))
        self.tools: dict[str, Tool[Any]] = {}
        for t in tools:
            if not isinstance(t, Tool):
                raise UserError(
                    f"Agent {name!r}: {t!r} is not a Tool; decorate the function with @tool."
                )
            if t.name in self.tools:
                raise UserError(f"Agent {name!r}: two tools are named {t.name!r}.")
            self.tools[t.name] = t
        self.tool_definitions: list[ToolDefinition] = _definitions(self.tools)
        self.hosted_tools: list[HostedTool] = _hosted(self.tools)
        self.output_type = output_type
        self.output_adapter: TypeAdapter[OutputT] | None = (
            TypeAdapter(output_type) if output_type is not None else None
        )
        self.output_schema = (
            self.output_adapter.json_schema() if self.output_adapter is not None else None
        )

    def replace(
        self,
        *,
        tools: Sequence[Tool[Any]] | None = None,
        output_schema: dict[str, Any] | None = None,
        scratch: bool | None = None,
    ) -> Agent[OutputT]:
        """A copy of this agent with other tools, output schema or scratch setting."""
        clone: Agent[OutputT] = copy.copy(self)
        if tools is not None:
            clone.tools = {}
            for t in tools:
                clone.tools[t.name] = t
            clone.tool_definitions = _definitions(clone.tools)
            clone.hosted_tools = _hosted(clone.tools)
        if output_schema is not None:
            clone.output_schema = output_schema
        if scratch is not None:
            clone.scratch = scratch
        return clone

    def instructions_for(self, state: RunState) -> str | None:
        """The system prompt for this state."""
        text = self.instructions(state) if callable(self.instructions) else self.instructions
        return text or None

    def run_stream(
        self,
        prompt: str | None,
        *,
        state: RunState | None = None,
        runtime: Runtime[Any] | None = None,
        model: Model | str | None = None,
    ) -> AgentRun[OutputT]:
        """Run one user turn of this agent alone, as a stream of events.

        Iterate the returned `AgentRun` for events; afterwards `run.result` holds the
        outcome and the new state. The events start with `run-started` and end with
        exactly one of `run-completed`, `run-suspended`, `run-failed`.

        Args:
            prompt: the user's message (None to continue the state's conversation as is).
            state: the session state to continue (a new one when None).
            runtime: dependencies, hooks, clock and ids (defaults when None).
            model: a per-turn model override (before the agent's and the runtime's).
        """
        from ._turn import run_turn

        run: AgentRun[OutputT] = run_turn(self, prompt, state=state, runtime=runtime, model=model)
        return run

    async def run(
        self,
        prompt: str | None,
        *,
        state: RunState | None = None,
        runtime: Runtime[Any] | None = None,
        model: Model | str | None = None,
    ) -> AgentResult[OutputT]:
        """Run one user turn to its end and return the result (see `run_stream`)."""
        return await self.run_stream(prompt, state=state, runtime=runtime, model=model).finish()

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, tools={list(self.tools)})"


def _definitions(tools: dict[str, Tool[Any]]) -> list[ToolDefinition]:
    """The function tools the model is told of (hosted ones are declared apart)."""
    return [t.definition for t in tools.values() if t.hosted is None]


def _hosted(tools: dict[str, Tool[Any]]) -> list[HostedTool]:
    """The tools the model provider runs itself."""
    return [t.hosted for t in tools.values() if t.hosted is not None]
