"""What an agent declares: its name, instructions, tools, model, limits and output type.

`AgentSpec` is what the loop and the turn run (`run_agent`, `run_turn`): the declaration
only, with its validation, `replace`, `instructions_for` and the tool definitions the model
is told of. `handrail.Agent` is the public class: an `AgentSpec` that can also run itself
(`Agent.run`, `Agent.run_stream`), above the turn (docs/design.md, "Floors").
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from pydantic import TypeAdapter

from ._deadlines import INHERIT, Expiry, Inherit, check_expiry
from .exceptions import UserError
from .models import Model, ToolDefinition
from .models._infer import as_model
from .tools import HostedTool, Tool

if TYPE_CHECKING:
    from .state import RunState

__all__ = ["CONTINUE_PROMPT", "DEFAULT_NUDGE", "AgentSpec"]

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


class AgentSpec(Generic[OutputT]):
    """What an agent declares (the arguments are `Agent`'s, documented there).

    The loop, the turn, the runtime and domains take an `AgentSpec`; every `Agent` is one.
    """

    def __init__(
        self,
        name: str,
        *,
        instructions: str | Callable[[RunState], str] | Callable[[RunState, Any], str] = "",
        tools: Sequence[Tool[Any]] = (),
        model: Model | str | None = None,
        max_iterations: int = 10,
        min_tool_calls: int = 0,
        output_type: type[OutputT] | None = None,
        nudge: str = DEFAULT_NUDGE,
        scratch: bool = False,
        continue_on_length: int = 0,
        expires_after: Expiry | Inherit = INHERIT,
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
        check_expiry(expires_after, f"Agent {name!r}: expires_after")
        self.expires_after = expires_after
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
        expires_after: Expiry | Inherit = INHERIT,
    ) -> Self:
        """A copy of this agent with other tools, output schema, scratch setting or deadline."""
        clone = copy.copy(self)
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
        if not isinstance(expires_after, Inherit):
            clone.expires_after = expires_after
        return clone

    def instructions_for(self, state: RunState) -> str | None:
        """The system prompt for this state."""
        instructions: Any = self.instructions
        if not callable(instructions):
            return str(instructions) or None
        if _positional(instructions) >= 2:  # instructions(state, context)
            return str(instructions(state, state.turn_context)) or None
        return str(instructions(state)) or None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, tools={list(self.tools)})"


def _definitions(tools: dict[str, Tool[Any]]) -> list[ToolDefinition]:
    """The function tools the model is told of (hosted ones are declared apart)."""
    return [t.definition for t in tools.values() if t.hosted is None]


def _hosted(tools: dict[str, Tool[Any]]) -> list[HostedTool]:
    """The tools the model provider runs itself."""
    return [t.hosted for t in tools.values() if t.hosted is not None]


def _positional(function: Callable[..., Any]) -> int:
    """How many positional arguments `function` takes (99 for `*args`)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return 99
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)
