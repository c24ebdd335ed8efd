"""`Domain`: what an application declares: its agents, the routes through them, who decides.

A domain is a declaration, like an agent: the runtime assembles one (`build_runtime`), the
turn runs its routes (`run_turn`), and the engine drives its sessions (`handrail.engine`,
which re-exports `Domain`). A supervisor agent picks each turn's route with a
`RouteDecision`; `Domain.router` pairs it with the routes as a `Router`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args, get_type_hints

from pydantic import BaseModel, Field, ValidationError

from ._agent_spec import AgentSpec, ToolsFor, check_placeholders
from ._deadlines import INHERIT, Expiry, Inherit, check_expiry
from .exceptions import InvalidContextError, UserError
from .policy import DecisionPolicy
from .tools import Permission, Tool

__all__ = ["Domain", "RouteDecision", "Router"]

_PERMISSIONS: tuple[str, ...] = get_args(Permission)


class RouteDecision(BaseModel):
    """What a supervisor decides: the `output_type` of a supervisor agent (or a subclass)."""

    route: str = Field(description="The name of the route to take.")
    reason: str = Field(default="", description="Why, in a sentence.")
    hints: dict[str, str] = Field(
        default_factory=dict,
        description="Optional notes for the route's agents, by agent name.",
    )


@dataclass(kw_only=True, slots=True)
class Router:
    """A supervisor agent and the routes it chooses between."""

    supervisor: AgentSpec[Any]
    """Decides the route: its structured output is a `RouteDecision`."""
    routes: Mapping[str, Sequence[AgentSpec[Any]]]
    """Route name -> its agents, in order."""
    default: str
    """The route taken when the supervisor's output does not parse or names no route."""


@dataclass(kw_only=True)
class Domain:
    """The agents of an application, the routes through them, and the supervisor that picks.

    Args:
        agents: every agent of the domain (names must be unique).
        routes: route name -> the agents that run, in order, for a turn on that route (e.g.
            `{"simple": ["responder"], "action": ["executor", "responder"]}`). Default: one
            route, `default`, through the first agent.
        default_route: the route a turn takes when none is chosen and when the supervisor's
            output does not parse or names no route (default: the first route).
        supervisor: an agent whose structured output (`output_type`) is a `RouteDecision` (or
            a subclass): it picks each turn's route. It runs in scratch: its messages stay out
            of the conversation. Without one, turns take the default route (or the one
            `submit` names).
        initial_state: the domain's typed state for a new session (a pydantic model
            instance, or a model class whose defaults make one, or a function of the first
            turn's per-turn context that returns one, `initial_state(context)`, annotated with
            its return type); tools read and change it as `ctx.state`, and it is stored with
            the session. A function is called when the session's first turn starts, with that
            turn's context (None when it carries none).
        policies: who may decide calls, by tool permission (`{"destructive":
            DecisionPolicy(roles={"it-admin"})}`), for tools that declare no
            `decision_policy=` of their own (`handrail.policy`).
        context_model: the per-turn context a turn may carry (`submit(context=...)`, the
            HTTP body's `context`): a pydantic model it is validated against. Without one, any
            JSON object is accepted as a dict. Tools read it as `ctx.turn_context`, bindings as
            `sys:context.<field>`; the model never sees it unless the instructions say so.
        expires_after: how long waiting calls accept a decision, for agents and tools that
            set none: seconds, a `Deadlines` (by kind of card), or None (no deadline). Default
            (`INHERIT`): the runtime's `pending_ttl` (`Deadlines()`).
        tools_for: chooses the tools each turn may see and call, for every agent (and the
            routes the supervisor is shown), from the caller (`TurnInfo`): the allowed names,
            or None for all. An agent's own `tools_for` applies as well (both must allow).
    """

    agents: Sequence[AgentSpec[Any]]
    routes: Mapping[str, Sequence[str]] = field(default_factory=dict)
    default_route: str | None = None
    supervisor: AgentSpec[Any] | None = None
    initial_state: BaseModel | type[BaseModel] | Callable[[Any], BaseModel] | None = None
    policies: Mapping[str, DecisionPolicy] = field(default_factory=dict)
    expires_after: Expiry | Inherit = INHERIT
    tools_for: ToolsFor | None = None
    context_model: type[BaseModel] | None = None

    def __post_init__(self) -> None:
        check_expiry(self.expires_after, "Domain: expires_after")
        unknown = sorted(set(self.policies) - set(_PERMISSIONS))
        if unknown:
            raise UserError(
                f"Domain: policies are keyed by tool permission ({', '.join(_PERMISSIONS)}), "
                f"not {', '.join(map(repr, unknown))}."
            )
        self.by_name: dict[str, AgentSpec[Any]] = {}
        for agent in self.agents:
            if agent.name in self.by_name:
                raise UserError(f"Domain: two agents are named {agent.name!r}.")
            self.by_name[agent.name] = agent
        if not self.by_name:
            raise UserError("Domain: give at least one agent.")
        if not self.routes:
            self.routes = {"default": [self.agents[0].name]}
        for route, names in self.routes.items():
            unknown = [n for n in names if n not in self.by_name]
            if unknown or not names:
                raise UserError(
                    f"Domain: route {route!r} names no agent or unknown agents "
                    f"({', '.join(map(repr, unknown)) or 'empty'}); agents: "
                    f"{', '.join(self.by_name)}."
                )
        if self.default_route is None:
            self.default_route = next(iter(self.routes))
        elif self.default_route not in self.routes:
            raise UserError(
                f"Domain: default_route {self.default_route!r} is not a route "
                f"(routes: {', '.join(self.routes)})."
            )
        supervisor = self.supervisor
        if supervisor is not None:
            kind = supervisor.output_type
            if not (isinstance(kind, type) and issubclass(kind, RouteDecision)):
                raise UserError(
                    f"Domain: the supervisor {supervisor.name!r} must answer with a route: "
                    f"give it output_type=RouteDecision (or a subclass)."
                )
            if supervisor.name in self.by_name:
                raise UserError(
                    f"Domain: the supervisor is named {supervisor.name!r}, like an agent; "
                    f"give it a name of its own."
                )
        if self.context_model is not None:
            for agent in [*self.agents, *([supervisor] if supervisor is not None else [])]:
                check_placeholders(agent, self.context_model)
        state = self.initial_state
        self.state_type: type[BaseModel] | None
        if state is None:
            self.state_type = None
        elif isinstance(state, type):
            self.state_type = state
        elif isinstance(state, BaseModel):
            self.state_type = type(state)
        else:
            try:
                kind = get_type_hints(state).get("return") if callable(state) else None
            except Exception:  # an annotation that does not resolve here
                kind = None
            if not (isinstance(kind, type) and issubclass(kind, BaseModel)):
                raise UserError(
                    "Domain: initial_state is a pydantic model, a model class, or a function "
                    "of the first turn's context annotated to return a model "
                    "(`def initial_state(context: Page | None) -> Cart: ...`)."
                )
            self.state_type = kind

    def tools(self) -> dict[str, Tool[Any]]:
        """Every tool of the domain's agents, by name (what a batch card's actions may call)."""
        return {name: t for agent in self.agents for name, t in agent.tools.items()}

    def route(self, name: str | None) -> list[AgentSpec[Any]]:
        """The agents of route `name` (the default route when None)."""
        key = name if name is not None else self.default_route
        if key is None or key not in self.routes:
            raise UserError(f"Unknown route {key!r}; routes: {', '.join(self.routes)}.")
        return [self.by_name[n] for n in self.routes[key]]

    def router(self) -> Router | None:
        """The supervisor with the routes it chooses between (None without a supervisor)."""
        if self.supervisor is None:
            return None
        assert self.default_route is not None
        schema = dict(self.supervisor.output_schema or {})
        properties = dict(schema.get("properties", {}))
        # The model may only name a route that exists.
        properties["route"] = {**properties.get("route", {}), "enum": list(self.routes)}
        schema["properties"] = properties
        return Router(
            supervisor=self.supervisor.replace(output_schema=schema, scratch=True),
            routes={name: self.route(name) for name in self.routes},
            default=self.default_route,
        )

    @property
    def state_from_context(self) -> bool:
        """Whether the domain state is built from the first turn's context."""
        state = self.initial_state
        return state is not None and not isinstance(state, (type, BaseModel))

    def new_state(self) -> Any:
        """The domain state of a new session: a copy of `initial_state`.

        None when it is built from the first turn's context, until that turn starts
        (`first_state`).
        """
        state = self.initial_state
        if state is None:
            return None
        if isinstance(state, type):
            return state()
        if isinstance(state, BaseModel):
            return state.model_copy(deep=True)
        return None

    def first_state(self, context: Any) -> Any:
        """The domain state built from the session's first turn's `context`.

        Raises:
            UserError: `initial_state(context)` did not return a `state_type`.
        """
        build: Any = self.initial_state
        assert self.state_from_context and self.state_type is not None
        state = build(context)
        if not isinstance(state, self.state_type):
            raise UserError(
                f"Domain: initial_state(context) returned {type(state).__name__}, "
                f"not {self.state_type.__name__}."
            )
        return state

    def check_context(self, context: Any, *, route: str | None = None) -> Any:
        """A turn's context validated: a `context_model` instance, a dict, or None.

        The string instructions of the agents the turn may run must find the fields their
        `{context.<path>}` placeholders read: the supervisor's and the route's (`route`, or,
        when the supervisor picks, every route's; without a supervisor, the default route's).

        Raises:
            InvalidContextError: it does not fit `context_model` (or, without one, is not a
                JSON object), or an agent's instructions read a field it lacks (or there is
                none); the error names the field (and the agent).
        """
        checked = self._validated(context)
        if route is not None:
            agents = self.route(route)
        elif self.supervisor is not None:
            agents = [self.supervisor, *(self.by_name[n] for r in self.routes.values() for n in r)]
        else:
            agents = self.route(None)
        for agent in dict.fromkeys(agents):
            agent.check_context(checked)
        return checked

    def _validated(self, context: Any) -> Any:
        if context is None:
            return None
        model = self.context_model
        if model is None:
            if isinstance(context, BaseModel):
                return context.model_dump(mode="json")
            if not isinstance(context, Mapping):
                raise InvalidContextError(
                    f"context: a JSON object, not {type(context).__name__}.", field=""
                )
            return dict(context)
        if isinstance(context, model):
            return context
        data = context.model_dump(mode="json") if isinstance(context, BaseModel) else context
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"])
            raise InvalidContextError(
                f"context.{where}: {error['msg']} (the domain's context model is {model.__name__})."
                if where
                else f"context: {error['msg']} ({model.__name__}).",
                field=where,
            ) from None

    def load_context(self, data: Any) -> Any:
        """A stored per-turn context, as its turn saw it."""
        if data is None or self.context_model is None:
            return data
        return self.context_model.model_validate(data)

    def load_state(self, data: Any) -> Any:
        """The domain state from what a session stored."""
        if self.state_type is None or data is None:
            return data if data is not None else self.new_state()
        return self.state_type.model_validate(data)
