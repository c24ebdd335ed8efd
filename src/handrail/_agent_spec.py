"""What an agent declares: its name, instructions, tools, model, limits and output type.

`AgentSpec` is what the loop and the turn run (`run_agent`, `run_turn`): the declaration
only, with its validation, `replace`, `instructions_for` and the tool definitions the model
is told of. `handrail.Agent` is the public class: an `AgentSpec` that can also run itself
(`Agent.run`, `Agent.run_stream`), above the turn (docs/design.md, "Floors").
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Self, TypeAlias, TypeVar

from pydantic import BaseModel, TypeAdapter
from pydantic_core import to_jsonable_python

from ._deadlines import INHERIT, Expiry, Inherit, check_expiry
from .context._paths import Key, parse_path, walk
from .exceptions import InvalidContextError, PathError, UserError
from .models import Model, ToolDefinition
from .models._infer import as_model
from .tools import HostedTool, Tool
from .tools._tool import positional_count

if TYPE_CHECKING:
    from .state import RunState

__all__ = [
    "CONTINUE_PROMPT",
    "DEFAULT_NUDGE",
    "AgentSpec",
    "ToolsFor",
    "TurnInfo",
    "by_role",
    "render_tool_menu",
]

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


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnInfo:
    """Where a turn stands, as `tools_for` is shown it: the caller, and the agent about to run."""

    agent: str
    """The agent whose tools are being chosen."""
    org_id: str | None = None
    """The caller's organisation (from the session)."""
    user_id: str | None = None
    """The caller (from the session)."""
    roles: frozenset[str] = field(default_factory=frozenset)
    """The caller's roles, as the turn was given them (`Engine.submit(roles=...)`)."""
    session_id: str | None = None
    """The session."""
    context: Any = None
    """The turn's own context (the page, the record the user is on), when the app gives one."""


ToolsFor: TypeAlias = Callable[[TurnInfo], "Iterable[str] | None"]
"""Chooses the tools a turn may see and call: the names it allows (None: every tool)."""


def by_role(
    allowed: dict[str, Collection[str]], *, default: Collection[str] | None = None
) -> ToolsFor:
    """A `tools_for` from an allow-list per role: a caller sees the union of its roles' tools.

    ```python
    only = by_role({"sre": ["restart"]}, default=["lookup"])
    Agent("it", tools=[lookup, restart], tools_for=only)
    ```

    Args:
        allowed: role -> the tool names a caller with that role may see and call.
        default: the names every caller may see, whatever its roles (None: every tool when
            the caller has none of the roles in `allowed`, else only its roles' tools).
    """
    listed = {role: frozenset(names) for role, names in allowed.items()}
    base = None if default is None else frozenset(default)

    def tools_for(turn: TurnInfo) -> Iterable[str] | None:
        mine = [names for role, names in listed.items() if role in turn.roles]
        if base is None and not mine:
            return None
        return (base or frozenset()).union(*mine)

    return tools_for


CATEGORY_ORDER = ("control", "system", "capability")
"""The categories `render_tool_menu` lists first, in this order (an app's own come after)."""


_TAIL = r"(?:\.[\w-]+|\[[^\]\n]*\])+"
_PLACEHOLDER = re.compile(
    rf"\{{\{{context(?P<escaped>{_TAIL})\}}\}}|\{{context(?P<path>{_TAIL})\}}"
)
"""`{context.page}` (a placeholder), or `{{context.page}}` (the literal text `{context.page}`)."""


def context_placeholders(text: str) -> list[str]:
    """The paths the `{context.<path>}` placeholders of `text` read (`page`, `record.id`)."""
    return [
        m["path"][1:] if m["path"].startswith(".") else m["path"]
        for m in _PLACEHOLDER.finditer(text)
        if m["path"] is not None
    ]


def render_context(text: str, context: Any, *, agent: str) -> str:
    """`text` with each `{context.<path>}` replaced by what `path` reaches in `context`.

    A string is put in as it is, anything else as JSON (`7`, `true`, `null`, `{"a": 1}`).
    `{{context.<path>}}` becomes the literal `{context.<path>}`; every other brace is kept.

    Raises:
        InvalidContextError: the turn has no context, or its context has no such field;
            `field` names the path, the message the agent.
    """
    if "{context" not in text:
        return text

    def put(match: re.Match[str]) -> str:
        if match["escaped"] is not None:
            return "{context" + match["escaped"] + "}"
        tail = match["path"]
        where = tail[1:] if tail.startswith(".") else tail
        if context is None:
            raise InvalidContextError(
                f"Agent {agent!r}: its instructions read {{context.{where}}}, but this turn "
                f"has no context; pass one with the turn (context={{...}}).",
                field=where,
            )
        try:
            value = walk(context, tail)
        except PathError as exc:
            raise InvalidContextError(
                f"Agent {agent!r}: its instructions read {{context.{where}}}, which this "
                f"turn's context does not have ({exc}); pass it with the turn, or double the "
                f"braces ({{{{context.{where}}}}}) to keep the text as it is.",
                field=where,
            ) from None
        plain = to_jsonable_python(value)
        return plain if isinstance(plain, str) else json.dumps(plain, ensure_ascii=False)

    return _PLACEHOLDER.sub(put, text)


def check_placeholders(agent: AgentSpec[Any], model: type[BaseModel]) -> None:
    """Check that the fields `agent`'s string instructions read are fields of `model`.

    Raises:
        UserError: a placeholder names a field the context model does not declare.
    """
    if callable(agent.instructions):
        return
    for path in context_placeholders(str(agent.instructions)):
        first = parse_path(path)[0] if path else None
        if isinstance(first, Key) and first.name not in model.model_fields:
            raise UserError(
                f"Agent {agent.name!r}: its instructions read {{context.{path}}}, but the "
                f"domain's context model {model.__name__} has no field {first.name!r} "
                f"(fields: {', '.join(model.model_fields) or 'none'})."
            )


def render_tool_menu(tools: Iterable[Tool[Any]], *, title: str = "Your tools") -> str:
    """A menu of `tools` grouped by their `category` (for an agent's instructions).

    The categories `control`, `system` and `capability` come first, then the app's own in
    alphabetical order, then the tools with no category (under "other"); each line is a tool's
    name and the first line of its description.
    """
    groups: dict[str, list[Tool[Any]]] = {}
    for t in tools:
        groups.setdefault(t.category or "other", []).append(t)
    if not groups:
        return ""
    order = [c for c in CATEGORY_ORDER if c in groups]
    order += sorted(c for c in groups if c not in CATEGORY_ORDER and c != "other")
    order += ["other"] if "other" in groups else []
    lines = [f"{title}:"]
    for category in order:
        lines.append(f"{category}:")
        for t in groups[category]:
            first = t.description.strip().splitlines()[0] if t.description.strip() else ""
            lines.append(f"- {t.name}: {first}" if first else f"- {t.name}")
    return "\n".join(lines)


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
        tools_for: ToolsFor | None = None,
        tool_menu: bool = False,
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
        self.tools_for = tools_for
        self.tool_menu = tool_menu
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
        tools_for: ToolsFor | None = None,
        instructions: str | Callable[[RunState], str] | None = None,
    ) -> Self:
        """A copy of this agent with some of its declaration changed.

        Its tools, output schema, scratch setting, deadline, tool chooser (`tools_for`) or
        instructions.
        """
        clone = copy.copy(self)
        if tools_for is not None:
            clone.tools_for = tools_for
        if instructions is not None:
            clone.instructions = instructions
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
        """The system prompt for this state (with the tool menu, when `tool_menu` is set)."""
        instructions: Any = self.instructions
        if not callable(instructions):
            text = render_context(str(instructions), state.turn_context, agent=self.name)
        elif positional_count(instructions) >= 2:  # instructions(state, context)
            text = str(instructions(state, state.turn_context))
        else:
            text = str(instructions(state))
        if self.tool_menu:
            menu = render_tool_menu(self.tools.values())
            text = f"{text}\n\n{menu}" if text and menu else text or menu
        return text or None

    def check_context(self, context: Any) -> None:
        """Check that string instructions can be rendered with a turn's `context`.

        Raises:
            InvalidContextError: a `{context.<path>}` placeholder has nothing to read.
        """
        if not callable(self.instructions):
            render_context(str(self.instructions), context, agent=self.name)

    def for_turn(self, state: RunState) -> Self:
        """This agent as `state`'s turn may see it: only the tools `tools_for` allows.

        A tool filtered out is not shown to the model, and a call to it is an unknown tool.
        Names the agent does not have are ignored (a domain's `tools_for` names every agent's).

        Raises:
            UserError: `tools_for` returned a string, not a collection of names.
        """
        if self.tools_for is None:
            return self
        turn = TurnInfo(
            agent=self.name,
            org_id=state.org_id,
            user_id=state.user_id,
            roles=state.roles,
            session_id=state.session_id,
            context=state.turn_context,
        )
        allowed = self.tools_for(turn)
        if allowed is None:
            return self
        if isinstance(allowed, str):  # set("a.b") would be its letters
            raise UserError(
                f"Agent {self.name!r}: tools_for returned the string {allowed!r}; return a "
                f"list of tool names (or None for every tool)."
            )
        names = set(allowed)
        return self.replace(tools=[t for t in self.tools.values() if t.name in names])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, tools={list(self.tools)})"


def _definitions(tools: dict[str, Tool[Any]]) -> list[ToolDefinition]:
    """The function tools the model is told of (hosted ones are declared apart)."""
    return [t.definition for t in tools.values() if t.hosted is None]


def _hosted(tools: dict[str, Tool[Any]]) -> list[HostedTool]:
    """The tools the model provider runs itself."""
    return [t.hosted for t in tools.values() if t.hosted is not None]
