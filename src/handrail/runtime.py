"""`Runtime`: everything a run needs that is not the agent or the session.

The model to fall back on, the application's dependencies, the hooks of the dispatch
pipeline, the permission policy, and the sources of time and ids (injectable, so a test is
deterministic without patching). One runtime serves many concurrent runs.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from ._agent_spec import AgentSpec, ToolsFor, TurnInfo
from ._deadlines import Deadlines, Expiry, Inherit, check_expiry
from ._random import token_hex
from .domain import Domain
from .exceptions import ConfigError, ModelRetry
from .models._infer import as_model
from .tools._workers import WorkerThreads

if TYPE_CHECKING:
    from .compaction import Compaction
    from .messages import ToolCallPart
    from .models import Model
    from .tools import Permission, Tool, ToolResult
    from .tracing import Tracing


__all__ = [
    "Assembly",
    "IdFactory",
    "Mock",
    "Mode",
    "Runtime",
    "WrapTools",
    "build_runtime",
    "random_ids",
    "sequential_ids",
]

DepsT = TypeVar("DepsT")
IdFactory = Callable[[str], str]
"""Makes a new id with a prefix: `ids("msg") -> "msg_5f3a..."`."""


DEFAULT_WORKERS = WorkerThreads()
"""The worker threads every runtime shares unless it is given its own."""


def random_ids(prefix: str) -> str:
    """A random id with a prefix (the default id factory)."""
    return f"{prefix}_{token_hex(8)}"


def sequential_ids() -> IdFactory:
    """An id factory counting from 1 (`msg_1`, `call_2`, ...): deterministic, for tests."""
    counter = itertools.count(1)
    return lambda prefix: f"{prefix}_{next(counter)}"


@dataclass(kw_only=True, slots=True)
class Runtime(Generic[DepsT]):
    """What a run needs besides the agent and the session state."""

    model: Model | str | None = None
    """The default model, for agents that name none: a model, or a string `infer` reads
    (`"openai:gpt-4o-mini"`), turned into one at once."""
    deps: DepsT | None = None
    """The application's dependencies, handed to tools as `ctx.deps`."""
    clock: Callable[[], float] = time.time
    """Wall time in seconds since the epoch (stamps tool calls and decisions)."""
    ids: IdFactory = random_ids
    """Makes message, run and tool-call ids."""
    workers: WorkerThreads = field(default_factory=lambda: DEFAULT_WORKERS)
    """Where sync tools run (shared by default; give a runtime its own to isolate it)."""
    allowed_permissions: frozenset[Permission] | None = None
    """When set, calls to tools with another permission fail (e.g. a read-only run)."""
    tracing: Tracing | None = None
    """When set (`Tracing()`, the `otel` extra), turns, routing, agents, model calls, tool
    calls and suspensions are OpenTelemetry spans (see `handrail.tracing`)."""
    compaction: Compaction | None = None
    """When set, each model request over its token budget is compacted first: history
    becomes `[summary, recent turns]` (see `handrail.compaction`)."""
    max_turn_iterations: int | None = 50
    """Model calls one turn may make across its agents (each agent also has its own
    `max_iterations`); reaching it ends the turn with a message that says so (None: no cap)."""
    max_approvals_per_turn: int | None = None
    """Past this many calls waiting for approval in one turn, further gated calls get a tool
    error telling the model to stop and summarise (None: no cap)."""
    pending_ttl: Expiry = field(default_factory=Deadlines)
    """How long a waiting call accepts a decision (or a client's result), unless its tool,
    agent or domain says otherwise (`expires_after=`): seconds, a `Deadlines` (by kind of card;
    the default: a day for a person, fifteen minutes for a client), or None (no deadline:
    only when asked for). An expired call resolves to a tool error the model can recover
    from; the sweeps (`Engine.expire_due`, a served process, `handrail worker`) enforce it."""
    dedup: bool = True
    """Reuse the result of a `read` call identical to an earlier one of the same turn, with no
    side-effecting call in between (see `Tool(dedup=...)`); False: every call runs."""
    max_reused_responses: int | None = 3
    """Model responses in a row whose every call was reused (see `dedup`) after which the
    next request asks for an answer without tools (`tool_choice="none"`). Until then a
    response that only repeated reads gets their results, marked as reused, and the model
    goes on acting (a repeated read is never a reason to stop it writing). None: never asked
    (`max_iterations` and `max_turn_iterations` still bound the turn)."""
    transform_args: Callable[..., dict[str, Any]] | None = None
    """Domain hook: rewrite a call's parsed arguments before binding and validation:
    `transform_args(tool, args)`, or `transform_args(tool, args, ctx)` to read the call's
    `ToolContext` (the session, its scope, the context store, the per-turn context
    `ctx.turn_context`) and pre-fill what the session knows. Returns the new arguments."""
    on_tool_result: Callable[[ToolCallPart, ToolResult], Awaitable[None] | None] | None = None
    """Observe each result (logging, metrics) before it is stamped on its part."""
    transform_tool_result: Callable[[ToolCallPart, ToolResult], ToolResult] | None = None
    """Rewrite each result before the model sees it (redaction, truncation)."""

    def __post_init__(self) -> None:
        check_expiry(self.pending_ttl, "Runtime(pending_ttl=...)")
        if self.max_reused_responses is not None and self.max_reused_responses < 1:
            raise ConfigError(
                f"Runtime(max_reused_responses=...) must be at least 1 (or None), "
                f"not {self.max_reused_responses}."
            )
        if self.model is not None:
            self.model = as_model(self.model, where="Runtime(model=...)")


Mode = Literal["live", "capture", "mock"]
"""How tools run: for real (`live`), captured for a later batch (`capture`: gated calls
are recorded with a predicted output, see `handrail.capture`), or replaced by mocks
(`mock`: a tool without a mock fails with a tool error)."""
Mock = Callable[[dict[str, Any]], Any] | Any
"""A mocked tool output: a function of the call's arguments, or the output itself."""
WrapTools = Callable[["Tool[Any]"], "Tool[Any] | None"] | Mapping[str, Mock]


@dataclass(kw_only=True, slots=True)
class Assembly:
    """A domain assembled for one mode: the agents as they run, and how models resolve."""

    domain: Domain
    """The domain, its agents' tools wrapped or mocked as the mode says."""
    runtime: Runtime[Any]
    """The runtime the runs use."""
    mode: Mode
    """The mode it was built for."""
    default_model: Model | None = None
    """The engine's default model (over the runtime's)."""

    def model_for(
        self,
        agent: AgentSpec[Any],
        override: Model | str | None = None,
        *,
        org: Model | str | None = None,
    ) -> Model:
        """The model `agent` uses: the turn's, the agent's, the organisation's, the default.

        Raises:
            ConfigError: none of them is set.
        """
        model = override or agent.model or org or self.default_model or self.runtime.model
        if model is None:
            raise ConfigError(
                f"Agent {agent.name!r} has no model: pass model= to the Agent, to the "
                f"engine, to Runtime(model=...), or give one for the turn."
            )
        return as_model(model, where="the turn's model=")


def build_runtime(
    config: Domain | AgentSpec[Any],
    *,
    runtime: Runtime[Any] | None = None,
    mode: Mode = "live",
    model: Model | str | None = None,
    wrap_tools: WrapTools | None = None,
) -> Assembly:
    """Assemble a domain for a mode: the ONE place a run's models and tools are put together.

    Live runs, evals and tests all go through it (`Engine` calls it).

    Args:
        config: the domain (a lone agent is a domain of one).
        runtime: dependencies, hooks, policy, clock and ids (default: a new `Runtime`).
        mode: `live`, `mock` (every tool without a mock in `wrap_tools` fails with a tool
            error instead of running) or `capture` (gated calls are recorded with their
            `mint` prediction instead of running; see `handrail.capture`).
        model: the default model for agents that name none (over `runtime.model`).
        wrap_tools: replaces tools: a function `tool -> new tool (or None to keep it)`, or a
            mapping `tool name -> mock output (or a function of the arguments)`.

    Raises:
        ConfigError: an unknown mode, or mocks for tools that no agent has.
    """
    domain = config if isinstance(config, Domain) else Domain(agents=[config])
    runtime = runtime if runtime is not None else Runtime()
    if mode not in ("live", "mock", "capture"):
        raise ConfigError(f"build_runtime(mode={mode!r}): the modes are live, mock, capture.")
    everyone = [*domain.agents, *([domain.supervisor] if domain.supervisor else [])]
    if isinstance(wrap_tools, Mapping):
        known = {t for agent in everyone for t in agent.tools}
        unknown = sorted(set(wrap_tools) - known)
        if unknown:
            raise ConfigError(
                f"wrap_tools mocks {', '.join(map(repr, unknown))}, which no agent has "
                f"(tools: {', '.join(sorted(known)) or 'none'})."
            )

    def wrap(tool: Tool[Any]) -> Tool[Any]:
        if mode == "capture" and (tool.gated or tool.executor in ("human", "client")):
            tool = tool.for_capture()  # a mock in wrap_tools stands in for it in `apply`
        if callable(wrap_tools) and not isinstance(wrap_tools, Mapping):
            return wrap_tools(tool) or tool
        if isinstance(wrap_tools, Mapping) and tool.name in wrap_tools:
            return tool.mocked(wrap_tools[tool.name])
        if mode == "mock" and tool.executor == "server":
            return tool.mocked(_no_mock(tool.name))
        return tool

    expiry = domain.expires_after  # the domain's deadline, for agents that set none

    def rebuilt(agent: AgentSpec[Any]) -> AgentSpec[Any]:
        if isinstance(agent.expires_after, Inherit) and not isinstance(expiry, Inherit):
            agent = agent.replace(expires_after=expiry)
        if domain.tools_for is not None:  # the domain's choice, and the agent's own
            agent = agent.replace(tools_for=_both(domain.tools_for, agent.tools_for))
        if wrap_tools is None and mode == "live":
            return agent
        return agent.replace(tools=[wrap(t) for t in agent.tools.values()])

    changes = wrap_tools is not None or mode != "live" or domain.tools_for is not None
    if changes or not isinstance(expiry, Inherit):
        domain = dataclasses.replace(
            domain,
            agents=[rebuilt(a) for a in domain.agents],
            supervisor=rebuilt(domain.supervisor) if domain.supervisor else None,
        )
    default = None if model is None else as_model(model, where="build_runtime(model=...)")
    return Assembly(domain=domain, runtime=runtime, mode=mode, default_model=default)


def _both(first: ToolsFor, second: ToolsFor | None) -> ToolsFor:
    """A `tools_for` allowing what both allow (None from either: that one allows all)."""
    if second is None:
        return first

    def tools_for(turn: TurnInfo) -> set[str] | None:
        one, two = first(turn), second(turn)
        if one is None:
            return None if two is None else set(two)
        if two is None:
            return set(one)
        return set(one) & set(two)

    return tools_for


def _no_mock(name: str) -> Callable[[dict[str, Any]], Any]:
    def unmocked(args: dict[str, Any]) -> Any:
        raise ModelRetry(f"Tool {name!r} has no mock in this run (mode='mock'), so it did not run.")

    return unmocked
