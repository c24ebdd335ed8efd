"""`Tool`: one declaration of something an agent can do, and the `@tool` decorator."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import (
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    TypeAlias,
    TypedDict,
    TypeVar,
    Unpack,
    overload,
)

import docstring_parser
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from .._deadlines import INHERIT, Expiry, Inherit, check_expiry
from .._tool_result import ToolResult
from ..context import ContextStore, check_path
from ..exceptions import PathError, ToolDefinitionError, UserError
from ..messages import Executor, Message
from ..policy import DecisionPolicy
from ._arguments import NOT_FINITE, not_finite, validate_arguments
from ._definition import HostedTool, ToolDefinition

__all__ = [
    "Approval",
    "Default",
    "Permission",
    "Tool",
    "ToolContext",
    "ToolDecorator",
    "ToolOptions",
    "tool",
]

DepsT = TypeVar("DepsT")
_P = ParamSpec("_P")
Permission: TypeAlias = Literal["read", "draft", "write", "destructive"]
Approval: TypeAlias = Literal["auto", "required"]

_PERMISSIONS = ("read", "draft", "write", "destructive")
_EXECUTORS = ("server", "human", "client", "provider")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*$")
# No `str_strip_whitespace`, nor any other rewriting: a value that validates reaches the tool
# exactly as the model sent it (code, e-mail bodies and YAML live in their whitespace).
# No NaN or Infinity either (`"inf"` as a string is a float to pydantic): no tool can use one,
# and stored arguments and the audit trail cannot hold it.
_INPUT_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)
# A schema given as is (parameters=) is the callee's to enforce: every argument passes through.
_RAW_INPUT_CONFIG = ConfigDict(extra="allow", allow_inf_nan=False)


class Default(str):
    """A default binding: `bindings={"locale": Default("sys:context.locale")}`.

    A forced binding (a plain path) replaces whatever the model sent and is hidden from it.
    A `Default` stays in the schema the model sees (no longer required): the model may set the
    argument; when it leaves it out, the path's value fills it (a path that does not resolve
    then leaves it out too).
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Default({str(self)!r})"


Normalizer: TypeAlias = Callable[..., "dict[str, Any] | tuple[dict[str, Any], list[str]]"]
"""A tool's `normalize`: `normalize(args)`, or `normalize(args, context)` to read the turn's
per-turn context; returns the repaired arguments, or `(arguments, warnings for the model)`."""


@dataclass(kw_only=True, slots=True)
class ToolContext(Generic[DepsT]):
    """What a tool receives besides its arguments (declare a first parameter of this type).

    Scope (`org_id`, `user_id`) comes from the session, never from the model: a tool
    argument cannot widen it.
    """

    deps: DepsT
    """The application's dependencies (database handles, API clients), from the runtime."""
    context: ContextStore
    """The context store: read `var:`/`tool:`/`call:`/`sys:` paths, write `var:` ones."""
    agent: str
    """The agent that called the tool."""
    tool_name: str
    """The tool being run."""
    tool_call_id: str
    """The call being run."""
    run_id: str
    """The run this call belongs to."""
    org_id: str | None = None
    """The caller's organisation (from the session)."""
    user_id: str | None = None
    """The caller (from the session)."""
    session_id: str | None = None
    """The session."""
    state: Any = None
    """The domain's typed state (`Domain(initial_state=...)`), stored with the session: read
    it, change its fields; the change is saved with the session."""
    idempotency_key: str = ""
    """The same for every attempt to run this call (a retry after a crash included): pass it
    to APIs that deduplicate (payments, bookings) so an idempotent tool has one effect."""
    answer: str | None = None
    """When the tool asked a person (`raise AskPerson(...)`) and runs again: their answer."""
    answered_by: str | None = None
    """Who gave `answer` (as the decision recorded it), when known."""
    turn_context: Any = None
    """The per-turn context the application passed with the turn (`submit(context=...)`,
    the HTTP body's `context`): a `Domain(context_model=...)` instance, a dict without one,
    or None. The page, the record the user is on, the locale; the model never sees it."""
    messages: Sequence[Message] = ()
    """The session's conversation up to this call (earlier turns, then this one's messages):
    read it, do not change it. A tool that answers follow-up questions reads it."""


class ToolOptions(TypedDict, total=False):
    """Every option of `@tool(...)`: the keyword arguments of `Tool` (which documents them).

    Spelled out so that an editor completes them and a type checker checks them in
    `@tool(...)`; a test keeps it equal to `Tool`'s keyword arguments.
    """

    name: str | None
    description: str | None
    output_type: Any
    permission: Permission
    executor: Executor
    approval: Approval | None
    amendable: Sequence[str]
    bindings: Mapping[str, str] | None
    normalize: Normalizer | None
    digest: Callable[[Any], Any] | None
    summary: Callable[[Any], str] | None
    mint: Callable[[dict[str, Any], int], Any] | None
    ends_turn: bool
    idempotent: bool
    cache_ttl: float | None
    timeout: float | None
    sequential: bool
    prompt: str | None
    revalidate: Callable[[ToolContext[Any], dict[str, Any]], Any] | None
    expires_after: Expiry | Inherit
    dedup: bool
    parameters: Mapping[str, Any] | None
    hosted: HostedTool | None
    decision_policy: DecisionPolicy | None
    category: str | None


def _check_options(where: str, given: Iterable[str], known: Iterable[str]) -> None:
    """Refuse an option that does not exist, naming the closest one that does.

    Raises:
        ToolDefinitionError: `given` holds a name that is not in `known`.
    """
    known = sorted(known)
    for option in given:
        if option not in known:
            close = difflib.get_close_matches(option, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"the options: {', '.join(known)}."
            raise ToolDefinitionError(f"{where}: unknown option {option!r}; {hint}")


def _named_options(init: Callable[_P, None]) -> Callable[_P, None]:
    """`Tool.__init__`, refusing a misspelled option and recording the declaration.

    A misspelled option is a `ToolDefinitionError` naming the close one (Python's own refusal
    is a bare `TypeError` that names no alternative). The declaration (`Tool._declared`: the
    function and options) is what `replace` makes a variant from.
    """
    known = [name for name in inspect.signature(init).parameters if name != "self"]

    @functools.wraps(init)
    def checked(*args: _P.args, **kwargs: _P.kwargs) -> None:
        _check_options("Tool()", kwargs, known)
        init(*args, **kwargs)
        tool: Tool[Any] = args[0]  # type: ignore[assignment]
        function = args[1] if len(args) > 1 else kwargs.pop("function", None)
        tool._declared = (function, dict(kwargs))  # what `replace` rebuilds from

    return checked


_UNSET: Any = object()


class Tool(Generic[DepsT]):
    """One tool: its name, arguments, policy and implementation.

    Usually made with `@tool`; every option is checked when the tool is defined, so an
    illegal combination fails at import time with a message naming the fix.

    Args:
        function: the implementation (sync, async, or async generator of progress). Its
            signature defines the arguments and, for `human`/`client` tools, it is never
            called: it only declares the arguments and (by its return annotation) the answer.
        name: the name the model calls (`category.action` allowed); default: the function's.
        description: for the model; default: the docstring's text before its `Args:`.
        output_type: validates the output (and is the answer schema of a `human` tool);
            default: the return annotation when it is a pydantic model.
        permission: `read`, `draft`, `write` or `destructive`.
        executor: `server` (runs here), `human` (a person answers), `client` (the app runs
            it and posts the result) or `provider` (runs at the model provider).
        approval: `auto` or `required`; default `required` for `write` and `destructive`
            server/client tools. A destructive tool can never be `auto`.
        amendable: argument names a human may change when approving.
        bindings: argument name -> context path (`sys:user_id`, `var:cart.id`,
            `sys:context.record_id` for the per-turn context): the engine fills these
            arguments; the model never sees or sets them. A path wrapped in `Default(...)` is
            a default instead: the argument stays in the schema, and is filled only when the
            model leaves it out.
        normalize: lenient repair of the raw argument dict, run before validation; it
            returns the repaired dict, or `(dict, warnings)`: the warnings (a list of
            strings, "order_id 'a1' read as 'A1'") reach the model with the call's result.
            `normalize(args, context)` (two parameters) also gets the turn's per-turn
            context (None without one).
        digest: output -> small JSON projection for the UI (pure).
        summary: output -> the one-line UI summary of a successful call (pure), when the
            tool does not return a `ToolResult` with its own.
        mint: `(args, local_index) -> predicted output`, for capture mode (pure); without
            it a captured call predicts an opaque placeholder, `temp_id(local_index)`.
        ends_turn: the agent's loop stops after this tool's result.
        idempotent: running twice with the same arguments has the effect of running once;
            crash recovery may re-run it, and `cache_ttl` may cache it.
        cache_ttl: seconds an idempotent tool's successful result is reused for the same
            arguments within the session.
        timeout: seconds before the call fails with a timeout error the model can read.
        sequential: run alone, in order, never in parallel with other calls.
        prompt: what to ask the human for a gated or `human` call.
        revalidate: `(ctx, args) -> None`, sync or async: runs just before an approved call
            executes, against the state of that moment (the world may have changed while the
            call waited); raise `ModelRetry` (or any exception) to refuse with a message.
        expires_after: how long this tool's waiting calls accept a decision (or the
            client's result): seconds, a `Deadlines` (seconds by kind of card), or None for
            no deadline at all; after it the call resolves to an "expired" tool error.
            Default (`INHERIT`): the agent's, else the domain's, else the runtime's
            `pending_ttl` (`Deadlines()`: a day for a person, fifteen minutes for a client).
        dedup: a `read` call identical to an earlier one of the same turn, with no
            side-effecting call in between, reuses its result instead of running again
            (that is what stops a model from looping on one lookup). False: every call runs
            (a read whose answer changes by itself: a clock, a queue, a sensor).
        parameters: the arguments' JSON Schema (an object schema), given as is instead of
            read from the signature: for a tool defined elsewhere (an MCP server's). The
            function then takes `(ctx, **arguments)` or `(**arguments)` and receives the
            arguments as sent (a JSON object, not checked against the schema: the tool
            behind it validates them). Cannot be combined with `bindings=` or `amendable=`.
        hosted: what the model provider runs, for a `provider` tool (required there, and only
            there); made by `web_search()`, `code_execution()` and `web_fetch()`.
        decision_policy: who may decide this tool's calls: roles, four eyes, how many
            approvals (`handrail.policy.DecisionPolicy`); for a gated or `human` tool.
            Default: the domain's policy for the tool's permission, else only the person who
            requested the call decides.
        category: what kind of tool it is, for a grouped tool menu (`render_tool_menu`,
            `Agent(tool_menu=True)`): `control`, `system`, `capability`, or the app's own.
    """

    _declared: tuple[Any, dict[str, Any]]
    """The function and options the tool was made with (`replace` makes a new one from them)."""

    @_named_options
    def __init__(
        self,
        function: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        output_type: Any = None,
        permission: Permission = "read",
        executor: Executor = "server",
        approval: Approval | None = None,
        amendable: Sequence[str] = (),
        bindings: Mapping[str, str] | None = None,
        normalize: Normalizer | None = None,
        digest: Callable[[Any], Any] | None = None,
        summary: Callable[[Any], str] | None = None,
        mint: Callable[[dict[str, Any], int], Any] | None = None,
        ends_turn: bool = False,
        idempotent: bool = False,
        cache_ttl: float | None = None,
        timeout: float | None = None,
        sequential: bool = False,
        prompt: str | None = None,
        revalidate: Callable[[ToolContext[Any], dict[str, Any]], Any] | None = None,
        expires_after: Expiry | Inherit = INHERIT,
        dedup: bool = True,
        parameters: Mapping[str, Any] | None = None,
        hosted: HostedTool | None = None,
        decision_policy: DecisionPolicy | None = None,
        category: str | None = None,
    ) -> None:
        if function is None and name is None:
            raise ToolDefinitionError("A tool needs a function, or at least a name=.")
        self.function = function
        self.name: str = name or str(getattr(function, "__name__", ""))
        label = f"Tool {self.name!r}"
        if not _NAME.fullmatch(self.name) or len(self.name) > 64:
            raise ToolDefinitionError(
                f"{label}: a tool name is letters, digits, '_' and '-', in dot-separated "
                f"parts (like 'orders.refund'), at most 64 characters."
            )
        if permission not in _PERMISSIONS:
            raise ToolDefinitionError(f"{label}: permission must be one of {_PERMISSIONS}.")
        if executor not in _EXECUTORS:
            raise ToolDefinitionError(f"{label}: executor must be one of {_EXECUTORS}.")
        if executor == "server" and function is None:
            raise ToolDefinitionError(
                f"{label} runs on the server but has no function: pass one, or set "
                f"executor='human' / 'client' / 'provider'."
            )
        if executor == "provider" and hosted is None:
            raise ToolDefinitionError(
                f"{label} runs at the model provider (executor='provider') but does not say "
                f"what the provider runs: make it with handrail.tools.web_search(), "
                f"code_execution() or web_fetch()."
            )
        if hosted is not None and executor != "provider":
            raise ToolDefinitionError(
                f"{label}: hosted= is for a tool the model provider runs; set "
                f"executor='provider' or drop hosted=."
            )
        self.hosted: HostedTool | None = (
            dataclasses.replace(hosted, name=self.name) if hosted is not None else None
        )
        self.permission: Permission = permission
        self.category: str | None = category
        self.executor: Executor = executor
        self.approval: Approval = self._check_approval(label, approval)
        self.gated: bool = self.approval == "required"

        target = _target(function)
        doc = docstring_parser.parse(inspect.getdoc(target) or "") if target else None
        self.description: str = str(description or _description(doc) or self.name)
        signature = _signature(self.name, function)
        self.raw_parameters: dict[str, Any] | None = None
        if parameters is None:
            self.takes_ctx, self.input_model, self.renamed = _input_model(
                self.name, function, signature, doc
            )
        else:
            self.raw_parameters = _raw_schema(label, parameters, bindings, amendable)
            self.takes_ctx, self.input_model, self.renamed = _raw_input_model(self.name, signature)
        self.param_names: tuple[str, ...] = tuple(
            self.renamed.get(field, field) for field in self.input_model.model_fields
        )

        self.bindings: dict[str, str] = dict(bindings or {})
        self.forced: set[str] = {p for p, path in self.bindings.items() if not _is_default(path)}
        """The bound arguments the model never sees (every binding that is not a `Default`)."""
        for param, path in self.bindings.items():
            if param not in self.param_names:
                raise ToolDefinitionError(
                    f"{label}: bindings name {param!r}, which is not an argument "
                    f"(arguments: {', '.join(self.param_names) or 'none'})."
                )
            try:
                check_path(path)
            except PathError as exc:
                raise ToolDefinitionError(
                    f"{label}: binding {param!r} <- {path!r} is not a valid context path: {exc}"
                ) from None
        if isinstance(amendable, str):
            raise ToolDefinitionError(
                f"{label}: amendable is a list of argument names; write [{amendable!r}]."
            )
        self.amendable: tuple[str, ...] = tuple(amendable)
        for field_name in self.amendable:
            if field_name not in self.param_names or field_name in self.forced:
                raise ToolDefinitionError(
                    f"{label}: amendable names {field_name!r}, which is not an argument the "
                    f"model sets (arguments: {', '.join(self.param_names) or 'none'})."
                )
        if self.amendable and not self.gated:
            raise ToolDefinitionError(
                f"{label}: amendable fields only mean something when a human approves the "
                f"call; set approval='required' or drop amendable=."
            )
        if decision_policy is not None and not isinstance(decision_policy, DecisionPolicy):
            raise ToolDefinitionError(
                f"{label}: decision_policy= takes a handrail.policy.DecisionPolicy, not "
                f"{type(decision_policy).__name__}."
            )
        if decision_policy is not None and not (self.gated or executor == "human"):
            raise ToolDefinitionError(
                f"{label}: decision_policy= says who decides a call, and nobody decides this "
                f"tool's calls; gate the tool (approval='required') or drop decision_policy=."
            )
        self.decision_policy: DecisionPolicy | None = decision_policy
        if cache_ttl is not None and not idempotent:
            raise ToolDefinitionError(
                f"{label}: cache_ttl= reuses results, which is only safe for a tool that is "
                f"idempotent; set idempotent=True or drop cache_ttl=."
            )
        if revalidate is not None and not self.gated:
            raise ToolDefinitionError(
                f"{label}: revalidate= checks an approved call before it runs, so it needs "
                f"approval='required'; drop revalidate= or gate the tool."
            )
        if not isinstance(expires_after, Inherit) and not (
            self.gated or executor in ("human", "client")
        ):
            raise ToolDefinitionError(
                f"{label}: expires_after= bounds how long a call waits for a decision, and "
                f"this tool never waits; drop it, or gate the tool."
            )
        for option, seconds in (
            ("timeout", timeout),
            ("cache_ttl", cache_ttl),
        ):
            if seconds is not None and not seconds > 0:  # `not >` also refuses NaN
                raise ToolDefinitionError(
                    f"{label}: {option} must be a positive number of seconds."
                )
        self.bound_fields: set[str] = {
            field for field, param in self._fields() if param in self.forced
        }

        self.output_type = output_type if output_type is not None else _return_model(signature)
        self.output_adapter: TypeAdapter[Any] | None = (
            TypeAdapter(self.output_type) if self.output_type is not None else None
        )
        self.normalize = normalize
        self._normalize_reads_context = normalize is not None and positional_count(normalize) >= 2
        self.digest = digest
        self.summary = summary
        self.mint = mint
        self.capture = False  # set on the copies capture mode runs (`for_capture`)
        self.ends_turn = ends_turn
        self.idempotent = idempotent
        self.cache_ttl = cache_ttl
        self.timeout = timeout
        self.sequential = sequential
        self.prompt = prompt
        self.revalidate = revalidate
        try:
            check_expiry(expires_after, f"{label}: expires_after")
        except UserError as exc:
            raise ToolDefinitionError(str(exc)) from None
        self.expires_after = expires_after
        self.dedup = dedup
        # Only what cannot change the world, runs here and needs nobody is ever reused.
        self.reusable: bool = (
            dedup and permission == "read" and executor == "server" and not self.gated
        )
        self.kind: Literal["sync", "async", "stream"] = _kind(function)
        self.definition = ToolDefinition(
            name=self.name, description=self.description, parameters=self._model_schema()
        )

    def _fields(self) -> list[tuple[str, str]]:
        """(field name in the input model, argument name) pairs."""
        return [(field, self.renamed.get(field, field)) for field in self.input_model.model_fields]

    def bind(self, context: ContextStore) -> dict[str, Any]:
        """The bound arguments of a call, read from `context` (step 3 of dispatch).

        The values are JSON-compatible, so a call keeps them (`ToolCallPart.bound`): a
        captured call is applied later with exactly what it was captured with.

        Raises:
            PathError: a binding's path does not resolve.
        """
        bound: dict[str, Any] = {}
        for param, path in self.bindings.items():
            if _is_default(path):
                value = context.get(path, _ABSENT)
                if value is not _ABSENT:
                    bound[param] = jsonable(value)
            else:
                bound[param] = jsonable(context.get(path))
        return bound

    def validate(
        self,
        args: dict[str, Any],
        context: ContextStore,
        bound: Mapping[str, Any] | None = None,
        warnings: list[str] | None = None,
        turn_context: Any = None,
    ) -> BaseModel:
        """Bind, normalize and validate a call's arguments (steps 3 and 4 of dispatch).

        Bound arguments always win over what was sent. They are `bound` when given (what a
        captured call was captured with); otherwise they are read from `context`. The
        warnings `normalize` returns are appended to `warnings` when given.

        Raises:
            ArgumentsError: listing every bad field, after lenient repair.
            PathError: a binding's path does not resolve.
            Exception: whatever the tool's `normalize` raised.
        """
        if self.bindings:
            values = bound if bound is not None else self.bind(context)
            forced = {p: v for p, v in values.items() if p in self.forced}
            defaults = {p: v for p, v in values.items() if p not in self.forced}
            args = {**defaults, **args, **forced}
        if self.normalize is not None:
            normalized = (
                self.normalize(dict(args), turn_context)
                if self._normalize_reads_context
                else self.normalize(dict(args))
            )
            if isinstance(normalized, tuple):
                args, noted = normalized
                if warnings is not None:
                    warnings.extend(str(w) for w in noted)
            else:
                args = normalized
        return validate_arguments(self.input_model, args)

    def stored_args(self, validated: BaseModel) -> dict[str, Any]:
        """The arguments as history keeps them: JSON, without the bound ones."""
        return validated.model_dump(mode="json", by_alias=True, exclude=self.bound_fields or None)

    def to_result(self, output: Any) -> ToolResult:
        """What the tool returned (or a client or a person answered for it), as a result.

        A `ToolResult` is taken as is; otherwise the output is validated against the output
        type when there is one (a mismatch is a failed result) and made JSON-compatible.
        """
        if isinstance(output, ToolResult):
            return output
        adapter = self.output_adapter
        if adapter is None:
            return ToolResult(data=jsonable(output))
        try:
            validated = adapter.validate_python(output)
        except ValidationError as exc:
            return ToolResult.failure(
                f"Tool {self.name!r} returned output that does not match its output type: "
                f"{exc.error_count()} error(s): {exc.errors(include_url=False)[0]['msg']}"
            )
        # `"inf"` is a float to pydantic: no reader of the result (nor JSON) can hold one.
        where = not_finite(adapter.dump_python(validated, warnings=False))
        if where is not None:
            return ToolResult.failure(
                f"Tool {self.name!r} returned output that does not match its output type: "
                f"{where}: {NOT_FINITE}"
            )
        return ToolResult(data=adapter.dump_python(validated, mode="json"))

    def mocked(self, mock: Any) -> Tool[DepsT]:
        """A copy of this tool whose implementation is `mock`.

        It keeps the name, schema and policy, so the rest of the pipeline (validation,
        gates, digest) runs as in production.

        Args:
            mock: the output itself, or a function of the validated arguments (a dict) that
                returns it (it may raise `ModelRetry` to fail the call).
        """
        clone = copy.copy(self)

        async def run(**kwargs: Any) -> Any:
            return mock(kwargs) if callable(mock) else copy.deepcopy(mock)

        clone.function = run
        clone.kind = "async"
        clone.takes_ctx = False
        return clone

    def replace(self, **changes: Unpack[ToolOptions]) -> Tool[DepsT]:
        """A new tool declared as this one was, with some options changed.

        ```python
        plain = refund.replace(decision_policy=None)  # the same tool, no decision policy
        ```

        The new tool is made from the same function and options, so every check runs again
        (an illegal combination fails here, naming the fix). A mocked or capture copy
        (`mocked`, `for_capture`) is rebuilt from its declaration, without the mock.

        Raises:
            ToolDefinitionError: a misspelled option (naming the close one), or a
                combination a tool cannot have.
        """
        _check_options(f"Tool {self.name!r}.replace()", changes, list(ToolOptions.__annotations__))
        function, options = self._declared
        new: Tool[DepsT] = Tool(function, **{**options, **changes})
        return new

    def for_capture(self) -> Tool[DepsT]:
        """A copy of this tool for capture mode: its gated calls are recorded, not run."""
        clone = copy.copy(self)
        clone.capture = True
        return clone

    def arguments(self, validated: BaseModel) -> dict[str, Any]:
        """The keyword arguments for the function, from a validated input model."""
        if self.raw_parameters is not None:
            return dict(validated.model_extra or {})
        values = validated.__dict__
        if not self.renamed:
            return values
        return {self.renamed.get(field, field): value for field, value in values.items()}

    def _check_approval(self, label: str, approval: Approval | None) -> Approval:
        if approval not in (None, "auto", "required"):
            raise ToolDefinitionError(f"{label}: approval must be 'auto' or 'required'.")
        if self.executor in ("human", "provider"):
            if approval == "required":
                raise ToolDefinitionError(
                    f"{label} is gated (approval='required') but its executor is "
                    f"{self.executor!r}: a {self.executor}-executed tool cannot also need "
                    f"approval. Drop approval= or use executor='server'."
                )
            return "auto"
        if self.permission == "destructive" and approval == "auto":
            raise ToolDefinitionError(
                f"{label} is destructive, so it always needs approval; drop approval='auto' "
                f"(or lower its permission if it is not destructive)."
            )
        if approval is None:
            return "required" if self.permission in ("write", "destructive") else "auto"
        return approval

    def _model_schema(self) -> dict[str, Any]:
        if self.raw_parameters is not None:
            return copy.deepcopy(self.raw_parameters)
        schema = self.input_model.model_json_schema()
        schema.pop("title", None)
        properties: dict[str, Any] = schema.get("properties", {})
        for param in self.forced:
            properties.pop(param, None)
        for prop in properties.values():
            if isinstance(prop, dict):
                prop.pop("title", None)
        if "required" in schema:
            schema["required"] = [r for r in schema["required"] if r not in self.bindings]
            # (a default binding stays visible, but the model may leave it out)
            if not schema["required"]:
                del schema["required"]
        return schema

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (handy in unit tests)."""
        if self.function is None:
            raise TypeError(f"Tool {self.name!r} ({self.executor}-executed) has no function")
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, permission={self.permission!r}, executor={self.executor!r})"


class ToolDecorator(Protocol):
    """What `@tool(...)` returns: it makes a `Tool` of the function it decorates."""

    @overload
    def __call__(
        self, function: Callable[Concatenate[ToolContext[DepsT], ...], Any], /
    ) -> Tool[DepsT]: ...

    @overload
    def __call__(self, function: Callable[..., Any], /) -> Tool[Any]: ...


@overload
def tool(
    function: Callable[Concatenate[ToolContext[DepsT], ...], Any],
    /,
    **options: Unpack[ToolOptions],
) -> Tool[DepsT]: ...


@overload
def tool(function: Callable[..., Any], /, **options: Unpack[ToolOptions]) -> Tool[Any]: ...


@overload
def tool(**options: Unpack[ToolOptions]) -> ToolDecorator: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    **options: Unpack[ToolOptions],
) -> Tool[Any] | ToolDecorator:
    """Make a `Tool` from a plain function; use bare (`@tool`) or with options (`@tool(...)`).

    The arguments' JSON Schema comes from the signature (pydantic), descriptions from the
    docstring's `Args:` section (Google, NumPy or Sphinx style). A first parameter annotated
    `ToolContext[Deps]` receives the context and is not an argument; the tool is then a
    `Tool[Deps]`.

    ```python
    @tool(name="orders.refund", permission="write", amendable=["amount"])
    async def refund(ctx: ToolContext[Deps], order_id: str, amount: float) -> Refund: ...
    ```

    Args:
        function: the function, when used bare as `@tool`.
        **options: the keyword arguments of `Tool` (`ToolOptions`: `name=`, `permission=`,
            ...). A misspelled one is a `ToolDefinitionError` naming the closest option,
            and a type checker refuses it too.
    """
    _check_options("tool()", options, ToolOptions.__optional_keys__)
    if function is not None:
        return Tool(function, **options)

    def decorate(fn: Callable[..., Any]) -> Tool[Any]:
        return Tool(fn, **options)

    return decorate


_SCALARS = (str, int, float, bool, type(None))


def jsonable(value: Any) -> Any:
    """`value` as JSON-compatible data (pydantic models dumped; unknown objects as repr)."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return pydantic_core.to_jsonable_python(value, fallback=repr)


def _description(doc: docstring_parser.Docstring | None) -> str:
    if doc is None:
        return ""
    return "\n\n".join(d for d in (doc.short_description, doc.long_description) if d)


def _target(function: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """What documents `function`: the wrapped function of a partial."""
    while isinstance(function, functools.partial):
        function = function.func
    return function


def _kind(function: Callable[..., Any] | None) -> Literal["sync", "async", "stream"]:
    # A callable object is judged by its __call__ (a partial is unwrapped by inspect).
    for candidate in (function, type(function).__call__):
        if inspect.isasyncgenfunction(candidate):
            return "stream"
        if inspect.iscoroutinefunction(candidate):
            return "async"
    return "sync"


def _signature(name: str, function: Callable[..., Any] | None) -> inspect.Signature | None:
    if function is None:
        return None
    try:
        signature = inspect.signature(function, eval_str=True)
    except NameError as exc:
        raise ToolDefinitionError(
            f"Tool {name!r}: cannot resolve an annotation of {function!r} ({exc}); import the "
            f"type at module level."
        ) from exc
    except (TypeError, ValueError) as exc:
        raise ToolDefinitionError(
            f"Tool {name!r}: cannot read the signature of {function!r} ({exc}); wrap it in a "
            f"plain function."
        ) from exc
    if isinstance(function, functools.partial):  # arguments fixed by the partial stay fixed
        fixed = set(function.keywords)
        signature = signature.replace(
            parameters=[p for p in signature.parameters.values() if p.name not in fixed]
        )
    return signature


def _reserved(param: str) -> bool:
    """Names pydantic keeps for itself: such arguments get an internal field name."""
    return param.startswith(("_", "model_")) or hasattr(BaseModel, param)


def _input_model(
    name: str,
    function: Callable[..., Any] | None,
    signature: inspect.Signature | None,
    doc: docstring_parser.Docstring | None,
) -> tuple[bool, type[BaseModel], dict[str, str]]:
    model_name = name.replace(".", "_").replace("-", "_") + "_args"
    if signature is None:
        return False, create_model(model_name, __config__=_INPUT_CONFIG), {}
    label = f"Tool {name!r}"
    descriptions = {p.arg_name: p.description for p in doc.params} if doc else {}
    params = list(signature.parameters.values())
    takes_ctx = bool(params) and _is_context(params[0].annotation)
    if takes_ctx:
        params = params[1:]
    fields: dict[str, Any] = {}
    renamed: dict[str, str] = {}
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ToolDefinitionError(
                f"{label}: parameter {param.name!r} is {param.kind.description}; tool "
                f"arguments must be named (plain or keyword-only parameters)."
            )
        if _is_context(param.annotation):
            raise ToolDefinitionError(
                f"{label}: ToolContext must be the first parameter, not {param.name!r}."
            )
        annotation = Any if param.annotation is param.empty else param.annotation
        default = ... if param.default is param.empty else param.default
        field_name = param.name
        if _reserved(param.name):
            field_name = f"arg{len(renamed)}_{param.name.strip('_')}"
            renamed[field_name] = param.name
        fields[field_name] = (
            annotation,
            Field(
                default,
                description=descriptions.get(param.name),
                alias=param.name if field_name != param.name else None,
            ),
        )
    return takes_ctx, create_model(model_name, __config__=_INPUT_CONFIG, **fields), renamed


def _raw_schema(
    label: str,
    parameters: Mapping[str, Any],
    bindings: Mapping[str, str] | None,
    amendable: Sequence[str],
) -> dict[str, Any]:
    """A copy of a given arguments schema, checked to be one that the model can fill."""
    if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
        raise ToolDefinitionError(
            f'{label}: parameters= must be a JSON Schema of type "object" (the arguments are '
            f"named); got {parameters!r:.80}."
        )
    if bindings or amendable:
        raise ToolDefinitionError(
            f"{label}: bindings= and amendable= name arguments of the function's signature, "
            f"and this tool's arguments come from parameters=; drop them."
        )
    return copy.deepcopy(dict(parameters))


def _raw_input_model(
    name: str, signature: inspect.Signature | None
) -> tuple[bool, type[BaseModel], dict[str, str]]:
    """An input model that passes any JSON object through (the schema was given as is)."""
    params = list(signature.parameters.values()) if signature is not None else []
    takes_ctx = bool(params) and _is_context(params[0].annotation)
    model_name = name.replace(".", "_").replace("-", "_") + "_args"
    return takes_ctx, create_model(model_name, __config__=_RAW_INPUT_CONFIG), {}


def _is_context(annotation: Any) -> bool:
    origin = getattr(annotation, "__origin__", annotation)
    return origin is ToolContext


def _return_model(signature: inspect.Signature | None) -> Any:
    returns = signature.return_annotation if signature is not None else None
    if isinstance(returns, type) and issubclass(returns, BaseModel):
        return returns
    return None


_ABSENT: Any = object()


def _is_default(path: str) -> bool:
    return isinstance(path, Default)


def positional_count(function: Callable[..., Any]) -> int:
    """How many positional arguments `function` takes (99 for `*args`)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return 99
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)
