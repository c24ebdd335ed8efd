"""Tool declarations: `@tool` and `Tool`, and every check made when a tool is defined."""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest
from inline_snapshot import snapshot
from pydantic import BaseModel, ValidationError

from handrail import HostedTool, Tool, ToolContext, ToolDefinitionError, UserError, tool


class Refund(BaseModel):
    refund_id: str
    amount: float


class Deps(BaseModel):
    db: str = "memory"


def lookup(order_id: str) -> dict[str, str]:
    """Look up an order."""
    return {"order_id": order_id}


def elsewhere(executor: str) -> dict[str, Any]:
    """What a tool run elsewhere needs besides its executor (a provider's: what it runs)."""
    return {"hosted": HostedTool(kind="web_search")} if executor == "provider" else {}


def definition_error(**options: Any) -> str:
    """The message of the ToolDefinitionError that `Tool(lookup, **options)` raises."""
    with pytest.raises(ToolDefinitionError) as caught:
        Tool(options.pop("function", lookup), **options)
    return str(caught.value)


# -- names ------------------------------------------------------------------------------------


def test_the_name_defaults_to_the_function_name():
    assert tool(lookup).name == "lookup"
    assert tool()(lookup).name == "lookup"


@pytest.mark.parametrize(
    "name", ["orders.refund", "crm.contacts.update", "send-email", "_private", "a" * 64]
)
def test_dotted_and_dashed_names_are_allowed(name: str):
    assert Tool(lookup, name=name).name == name
    assert Tool(lookup, name=name).definition.name == name


@pytest.mark.parametrize(
    "name",
    [
        "orders refund",
        "1orders",
        "orders.",
        ".orders",
        "orders..refund",
        "orders/refund",
        "ordérs",
        "a" * 65,
        "lookup\n",
    ],
)
def test_a_bad_name_is_rejected(name: str):
    assert definition_error(name=name) == (
        f"Tool {name!r}: a tool name is letters, digits, '_' and '-', in dot-separated "
        f"parts (like 'orders.refund'), at most 64 characters."
    )


def test_a_lambda_needs_an_explicit_name():
    assert "Tool '<lambda>': a tool name is letters" in definition_error(function=lambda: None)
    assert Tool(lambda: None, name="noop").name == "noop"


def test_a_tool_needs_a_function_or_a_name():
    with pytest.raises(ToolDefinitionError) as caught:
        Tool()
    assert str(caught.value) == "A tool needs a function, or at least a name=."


def test_a_definition_error_is_a_user_error():
    with pytest.raises(UserError):
        Tool(lookup, permission="admin")  # type: ignore[arg-type]


# -- description and schema -------------------------------------------------------------------


@tool(
    name="orders.refund",
    permission="write",
    amendable=["amount"],
    bindings={"user_id": "sys:user_id"},
)
async def refund(
    ctx: ToolContext[Deps],
    order_id: str,
    amount: float,
    user_id: str,
    reason: Literal["damaged", "late"] | None = None,
    notify: bool = True,
    tags: list[str] | None = None,
) -> Refund:
    """Refund part or all of an order.

    Use it once per order: a second refund is refused.

    Args:
        order_id: the order to refund, like A1042.
        amount: how much, in the order's
            currency.
        user_id: who asks for it.
        reason: why the customer wants it.

    Returns:
        The refund that was made.
    """
    return Refund(refund_id=f"R-{order_id}", amount=amount)


def test_the_description_is_the_docstring_text_before_its_sections():
    assert refund.description == (
        "Refund part or all of an order.\n\nUse it once per order: a second refund is refused."
    )
    assert refund.definition.description == refund.description


def test_the_schema_comes_from_the_signature_and_the_docstring():
    assert refund.definition.parameters == snapshot(
        {
            "additionalProperties": False,
            "properties": {
                "order_id": {"description": "the order to refund, like A1042.", "type": "string"},
                "amount": {"description": "how much, in the order's\ncurrency.", "type": "number"},
                "reason": {
                    "anyOf": [{"enum": ["damaged", "late"], "type": "string"}, {"type": "null"}],
                    "default": None,
                    "description": "why the customer wants it.",
                },
                "notify": {"default": True, "type": "boolean"},
                "tags": {
                    "anyOf": [{"items": {"type": "string"}, "type": "array"}, {"type": "null"}],
                    "default": None,
                },
            },
            "required": ["order_id", "amount"],
            "type": "object",
        }
    )


def test_an_explicit_description_wins_over_the_docstring():
    assert Tool(lookup, description="Find an order by id.").description == "Find an order by id."


def test_without_a_docstring_the_description_is_the_name():
    def ping() -> str:
        return "pong"

    assert Tool(ping, name="health.ping").description == "health.ping"


def test_a_parameter_with_a_default_is_optional():
    def search(query: str, limit: int = 10) -> list[str]:
        """Search."""
        return []

    schema = Tool(search).definition.parameters
    assert schema["required"] == ["query"]
    assert schema["properties"]["limit"] == {"default": 10, "type": "integer"}


def test_a_tool_without_arguments_has_an_empty_object_schema():
    def ping() -> str:
        """Ping."""
        return "pong"

    assert Tool(ping).definition.parameters == {
        "additionalProperties": False,
        "properties": {},
        "type": "object",
    }
    assert Tool(ping).param_names == ()


def test_an_unannotated_parameter_accepts_anything():
    def echo(value):  # type: ignore[no-untyped-def]
        """Echo."""
        return value

    echoed = Tool(echo)
    assert echoed.definition.parameters["properties"] == {"value": {}}
    assert echoed.input_model.model_validate({"value": [1, {"a": None}]}).value == [1, {"a": None}]


def test_the_input_model_forbids_unknown_arguments():
    with pytest.raises(ValidationError) as caught:
        Tool(lookup).input_model.model_validate({"order_id": "A1", "limit": 3})
    assert [e["type"] for e in caught.value.errors()] == ["extra_forbidden"]


def test_an_annotation_that_cannot_be_resolved_is_a_definition_error():
    def broken(order: Order) -> None:  # type: ignore[name-defined] # noqa: F821
        """Broken."""

    message = definition_error(function=broken)
    assert message.startswith("Tool 'broken': cannot resolve an annotation of ")
    assert "broken" in message
    assert message.endswith("import the type at module level.")


# -- ToolContext and parameter kinds ----------------------------------------------------------


def test_a_first_tool_context_parameter_is_not_an_argument():
    assert refund.takes_ctx
    assert "ctx" not in refund.param_names
    assert "ctx" not in refund.definition.parameters["properties"]
    assert not Tool(lookup).takes_ctx


def test_a_bare_tool_context_annotation_counts_too():
    def whoami(ctx: ToolContext) -> str:  # type: ignore[type-arg]
        """Who am I."""
        return str(ctx.user_id)

    who = Tool(whoami)
    assert who.takes_ctx
    assert who.param_names == ()


def test_tool_context_must_be_the_first_parameter():
    def late(order_id: str, ctx: ToolContext[Deps]) -> None:
        """Late."""

    assert definition_error(function=late) == (
        "Tool 'late': ToolContext must be the first parameter, not 'ctx'."
    )


def test_var_positional_parameters_are_rejected():
    def many(*order_ids: str) -> None:
        """Many."""

    assert definition_error(function=many) == (
        "Tool 'many': parameter 'order_ids' is variadic positional; tool arguments must be "
        "named (plain or keyword-only parameters)."
    )


def test_var_keyword_parameters_are_rejected():
    def loose(order_id: str, **extra: Any) -> None:
        """Loose."""

    assert definition_error(function=loose) == (
        "Tool 'loose': parameter 'extra' is variadic keyword; tool arguments must be named "
        "(plain or keyword-only parameters)."
    )


def test_positional_only_parameters_are_rejected():
    def strict(order_id: str, /) -> None:
        """Strict."""

    assert definition_error(function=strict) == (
        "Tool 'strict': parameter 'order_id' is positional-only; tool arguments must be named "
        "(plain or keyword-only parameters)."
    )


def test_keyword_only_parameters_are_arguments():
    def find(*, order_id: str, limit: int = 5) -> None:
        """Find."""

    assert Tool(find).param_names == ("order_id", "limit")


def test_a_positional_only_tool_context_is_fine():
    def scoped(ctx: ToolContext[Deps], /, order_id: str) -> None:
        """Scoped."""

    assert Tool(scoped).param_names == ("order_id",)


def takes_schema(schema: int) -> int:
    """A parameter named like a BaseModel attribute."""
    return schema


def takes_json(json: int) -> int:
    """A parameter named like a BaseModel method."""
    return json


def takes_model_config(model_config: int) -> int:
    """A parameter named like pydantic's model configuration."""
    return model_config


def takes_model_dump(model_dump: int) -> int:
    """A parameter in pydantic's protected namespace."""
    return model_dump


def takes_private(_secret: int) -> int:
    """A parameter with a leading underscore."""
    return _secret


@pytest.mark.parametrize(
    "function",
    [takes_schema, takes_json, takes_model_config, takes_model_dump, takes_private],
    ids=lambda f: f.__name__,
)
def test_any_parameter_name_becomes_an_argument_or_a_clear_definition_error(function: Any):
    # Never a silently dropped argument, a pydantic warning or a foreign exception.
    [param] = inspect.signature(function).parameters
    try:
        defined = Tool(function)
    except ToolDefinitionError as error:
        assert repr(param) in str(error)
    else:
        assert defined.param_names == (param,)
        assert defined.definition.parameters["properties"] == {param: {"type": "integer"}}
        assert defined.definition.parameters["required"] == [param]


class AsyncLookup:
    async def __call__(self, order_id: str) -> str:
        return order_id


async def find_orders(customer: str, limit: int) -> list[str]:
    """Find a customer's orders."""
    return [customer] * limit


@pytest.mark.parametrize(
    "function",
    [AsyncLookup(), functools.partial(find_orders, limit=3)],
    ids=["callable-object", "partial"],
)
def test_any_callable_becomes_a_tool_or_a_clear_definition_error(function: Any):
    # `Tool(function: Callable[..., Any])` accepts any callable; a typing TypeError is not a fix.
    try:
        defined = Tool(function, name="orders.find")
    except ToolDefinitionError as error:
        assert "orders.find" in str(error)
    else:
        assert defined.kind == "async"


# -- output and kind --------------------------------------------------------------------------


def test_a_pydantic_return_annotation_is_the_output_model():
    assert refund.output_type is Refund
    assert refund.output_adapter is not None
    assert refund.output_adapter.validate_python({"refund_id": "R1", "amount": 2}) == Refund(
        refund_id="R1", amount=2.0
    )


def test_a_plain_return_annotation_does_not_validate_the_output():
    assert Tool(lookup).output_type is None
    assert Tool(lookup).output_adapter is None


def test_output_type_overrides_the_return_annotation():
    shipped = Tool(lookup, output_type=list[int])
    assert shipped.output_type == list[int]
    assert shipped.output_adapter is not None
    assert shipped.output_adapter.validate_python(["1", 2]) == [1, 2]


def sync_tool() -> str:
    """Sync."""
    return "s"


async def async_tool() -> str:
    """Async."""
    return "a"


async def stream_tool() -> AsyncIterator[int]:
    """Stream."""
    yield 1


@pytest.mark.parametrize(
    ("function", "kind"), [(sync_tool, "sync"), (async_tool, "async"), (stream_tool, "stream")]
)
def test_the_kind_follows_the_function(function: Any, kind: str):
    assert Tool(function).kind == kind


# -- approval policy --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("permission", "approval"),
    [("read", "auto"), ("draft", "auto"), ("write", "required"), ("destructive", "required")],
)
def test_write_and_destructive_tools_need_approval_by_default(permission: Any, approval: str):
    defined = Tool(lookup, permission=permission)
    assert (defined.permission, defined.approval) == (permission, approval)
    assert defined.gated == (approval == "required")


@pytest.mark.parametrize("permission", ["read", "draft", "write", "destructive"])
def test_a_client_tool_follows_the_same_defaults(permission: Any):
    defined = Tool(lookup, executor="client", permission=permission)
    assert defined.gated == (permission in ("write", "destructive"))


def test_a_write_tool_can_be_auto_approved_explicitly():
    defined = Tool(lookup, permission="write", approval="auto")
    assert (defined.approval, defined.gated) == ("auto", False)


def test_a_read_tool_can_require_approval_explicitly():
    defined = Tool(lookup, permission="read", approval="required")
    assert (defined.approval, defined.gated) == ("required", True)


def test_a_destructive_tool_cannot_be_auto_approved():
    assert definition_error(name="orders.delete", permission="destructive", approval="auto") == (
        "Tool 'orders.delete' is destructive, so it always needs approval; drop "
        "approval='auto' (or lower its permission if it is not destructive)."
    )


@pytest.mark.parametrize("executor", ["human", "provider"])
def test_a_human_or_provider_tool_cannot_be_gated(executor: str):
    assert definition_error(
        name="orders.refund", executor=executor, approval="required", **elsewhere(executor)
    ) == (
        f"Tool 'orders.refund' is gated (approval='required') but its executor is "
        f"{executor!r}: a {executor}-executed tool cannot also need approval. Drop approval= "
        f"or use executor='server'."
    )


@pytest.mark.parametrize("executor", ["human", "provider"])
@pytest.mark.parametrize("permission", ["read", "draft", "write", "destructive"])
def test_a_human_or_provider_tool_is_never_gated(executor: Any, permission: Any):
    defined = Tool(lookup, executor=executor, permission=permission, **elsewhere(executor))
    assert (defined.approval, defined.gated) == ("auto", False)
    assert Tool(lookup, executor=executor, approval="auto", **elsewhere(executor)).gated is False


# -- amendable --------------------------------------------------------------------------------


def test_amendable_names_the_arguments_a_human_may_change():
    assert refund.amendable == ("amount",)
    assert Tool(lookup).amendable == ()


def test_amendable_on_a_tool_that_is_not_gated_is_rejected():
    assert definition_error(amendable=["order_id"]) == (
        "Tool 'lookup': amendable fields only mean something when a human approves the call; "
        "set approval='required' or drop amendable=."
    )
    assert "approval='required'" in definition_error(
        permission="write", approval="auto", amendable=["order_id"]
    )


def test_amendable_naming_a_non_argument_is_rejected():
    assert definition_error(permission="write", amendable=["amount"]) == (
        "Tool 'lookup': amendable names 'amount', which is not an argument the model sets "
        "(arguments: order_id)."
    )


def test_amendable_naming_a_bound_argument_is_rejected():
    def scoped(order_id: str, user_id: str) -> None:
        """Scoped."""

    message = definition_error(
        function=scoped,
        permission="write",
        amendable=["user_id"],
        bindings={"user_id": "sys:user_id"},
    )
    assert message == (
        "Tool 'scoped': amendable names 'user_id', which is not an argument the model sets "
        "(arguments: order_id, user_id)."
    )


# -- bindings ---------------------------------------------------------------------------------


def test_bound_arguments_are_left_out_of_the_model_schema():
    assert refund.bindings == {"user_id": "sys:user_id"}
    assert "user_id" in refund.param_names
    assert "user_id" not in refund.definition.parameters["properties"]
    assert "user_id" not in refund.definition.parameters["required"]


def test_when_every_required_argument_is_bound_the_schema_has_no_required_list():
    def mine(user_id: str, limit: int = 5) -> None:
        """Mine."""

    schema = Tool(mine, bindings={"user_id": "sys:user_id"}).definition.parameters
    assert schema == {
        "additionalProperties": False,
        "properties": {"limit": {"default": 5, "type": "integer"}},
        "type": "object",
    }


@pytest.mark.parametrize(
    "path", ["sys:user_id", "var:cart.id", "tool:orders.lookup.items[0].sku", "call:call_1"]
)
def test_a_binding_may_read_any_namespace(path: str):
    def scoped(value: str) -> None:
        """Scoped."""

    assert Tool(scoped, bindings={"value": path}).bindings == {"value": path}


def test_a_binding_naming_a_non_argument_is_rejected():
    assert definition_error(bindings={"user_id": "sys:user_id"}) == (
        "Tool 'lookup': bindings name 'user_id', which is not an argument (arguments: order_id)."
    )


def test_a_binding_on_a_tool_without_arguments_says_there_are_none():
    assert definition_error(function=sync_tool, bindings={"user_id": "sys:user_id"}) == (
        "Tool 'sync_tool': bindings name 'user_id', which is not an argument (arguments: none)."
    )


def test_a_binding_to_a_path_without_a_namespace_is_rejected():
    assert definition_error(bindings={"order_id": "order_id"}) == (
        "Tool 'lookup': binding 'order_id' <- 'order_id' is not a valid context path: "
        '"order_id": a context path starts with a namespace, one of: var:, tool:, call:, sys:'
    )


@pytest.mark.parametrize("path", ["nope:x", "var:", "var:cart[", "call:"])
def test_a_binding_to_a_malformed_context_path_is_rejected(path: str):
    message = definition_error(bindings={"order_id": path})
    assert message.startswith(
        f"Tool 'lookup': binding 'order_id' <- {path!r} is not a valid context path: "
    )


# -- caching, timeouts, executors -------------------------------------------------------------


def test_cache_ttl_needs_an_idempotent_tool():
    assert definition_error(cache_ttl=60) == (
        "Tool 'lookup': cache_ttl= reuses results, which is only safe for a tool that is "
        "idempotent; set idempotent=True or drop cache_ttl=."
    )
    cached = Tool(lookup, cache_ttl=60, idempotent=True)
    assert (cached.cache_ttl, cached.idempotent) == (60, True)


@pytest.mark.parametrize("timeout", [0, -1, -0.5])
def test_a_timeout_must_be_positive(timeout: float):
    assert definition_error(timeout=timeout) == (
        "Tool 'lookup': timeout must be a positive number of seconds."
    )


def test_a_positive_timeout_is_kept():
    assert Tool(lookup, timeout=0.25).timeout == 0.25
    assert Tool(lookup).timeout is None


def test_a_server_tool_needs_a_function():
    with pytest.raises(ToolDefinitionError) as caught:
        Tool(name="orders.lookup")
    assert str(caught.value) == (
        "Tool 'orders.lookup' runs on the server but has no function: pass one, or set "
        "executor='human' / 'client' / 'provider'."
    )


@pytest.mark.parametrize("executor", ["human", "client", "provider"])
def test_a_tool_run_elsewhere_needs_no_function(executor: Any):
    declared = Tool(
        name="web.search", executor=executor, description="Search the web.", **elsewhere(executor)
    )
    assert (declared.executor, declared.kind, declared.param_names) == (executor, "sync", ())
    assert declared.definition.parameters == {
        "additionalProperties": False,
        "properties": {},
        "type": "object",
    }


def test_a_bad_permission_is_rejected():
    assert definition_error(permission="admin") == (
        "Tool 'lookup': permission must be one of ('read', 'draft', 'write', 'destructive')."
    )


def test_a_bad_executor_is_rejected():
    assert definition_error(executor="robot") == (
        "Tool 'lookup': executor must be one of ('server', 'human', 'client', 'provider')."
    )


@pytest.mark.parametrize("approval", ["never", True, "Required"])
def test_a_bad_approval_is_rejected(approval: Any):
    assert definition_error(approval=approval) == (
        "Tool 'lookup': approval must be 'auto' or 'required'."
    )


# -- the other options and direct calls -------------------------------------------------------


def test_the_other_options_are_kept_as_given():
    def normalize(args: dict[str, Any]) -> dict[str, Any]:
        return args

    def digest(output: Any) -> Any:
        return output

    def mint(args: dict[str, Any], local_index: int) -> Any:
        return {"id": f"temp_{local_index}"}

    defined = Tool(
        lookup,
        normalize=normalize,
        digest=digest,
        mint=mint,
        ends_turn=True,
        sequential=True,
        prompt="Look it up?",
    )
    assert (defined.normalize, defined.digest, defined.mint) == (normalize, digest, mint)
    assert (defined.ends_turn, defined.sequential, defined.prompt) == (True, True, "Look it up?")
    assert (defined.idempotent, defined.cache_ttl) == (False, None)


def test_bare_and_called_decorators_make_the_same_tool():
    bare = tool(lookup)
    called = tool(permission="read")(lookup)
    assert isinstance(bare, Tool)
    assert isinstance(called, Tool)
    assert bare.definition == called.definition


def test_the_decorated_tool_is_still_callable_directly():
    assert tool(lookup)("A1") == {"order_id": "A1"}
    assert tool(lookup)(order_id="A1") == {"order_id": "A1"}


async def test_a_decorated_async_tool_is_awaited_directly():
    ctx: Any = None  # the function does not touch its context
    assert await refund(ctx, "A1", 5.0, "u1") == Refund(refund_id="R-A1", amount=5.0)


def test_calling_a_tool_without_a_function_says_so():
    ask = Tool(name="ask_customer", executor="human")
    with pytest.raises(TypeError) as caught:
        ask(question="Which size?")
    assert str(caught.value) == "Tool 'ask_customer' (human-executed) has no function"


def test_a_tool_shows_its_name_permission_and_executor():
    assert repr(refund) == "Tool('orders.refund', permission='write', executor='server')"


# -- hosted tools -----------------------------------------------------------------------------


def test_a_provider_tool_must_say_what_the_provider_runs():
    assert definition_error(name="web.search", executor="provider") == (
        "Tool 'web.search' runs at the model provider (executor='provider') but does not say "
        "what the provider runs: make it with handrail.tools.web_search(), code_execution() or "
        "web_fetch()."
    )
    assert definition_error(name="lookup", hosted=HostedTool(kind="web_search")) == (
        "Tool 'lookup': hosted= is for a tool the model provider runs; set executor='provider' "
        "or drop hosted=."
    )


def test_hosted_tools_are_read_only_provider_tools_declared_apart():
    from handrail import Agent, code_execution, web_fetch, web_search

    search = web_search(max_uses=3, allowed_domains=["docs.python.org"], name="search")
    assert (search.name, search.executor, search.permission, search.gated) == (
        "search",
        "provider",
        "read",
        False,
    )
    assert search.hosted == HostedTool(
        kind="web_search", name="search", max_uses=3, allowed_domains=["docs.python.org"]
    )
    agent = Agent("a", tools=[search, code_execution(), web_fetch(citations=True), Tool(lookup)])
    assert [d.name for d in agent.tool_definitions] == ["lookup"]
    assert [(h.kind, h.name) for h in agent.hosted_tools] == [
        ("web_search", "search"),
        ("code_execution", "code_execution"),
        ("web_fetch", "web_fetch"),
    ]


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (
            {"allowed_domains": ["a.com"], "blocked_domains": ["b.com"]},
            "give allowed_domains= or blocked_domains=, not both",
        ),
        ({"max_uses": 0}, "max_uses must be a positive whole number"),
        ({"allowed_domains": "a.com"}, "allowed_domains is a list of domains; write ['a.com']"),
    ],
)
def test_a_bad_hosted_option_fails_at_definition(options: dict[str, Any], problem: str):
    from handrail import web_search

    with pytest.raises(ToolDefinitionError, match=problem.replace("[", r"\[")):
        web_search(**options)


# -- options: one typed list, checked at run time and by a type checker ------------------------


def test_a_misspelled_option_of_the_decorator_names_the_closest_one():
    with pytest.raises(ToolDefinitionError) as caught:
        tool(permision="write")  # type: ignore[call-overload]
    assert str(caught.value) == "tool(): unknown option 'permision'; did you mean 'permission'?"
    with pytest.raises(ToolDefinitionError) as caught:
        tool(lookup, cache_tll=60)  # type: ignore[call-overload]
    assert str(caught.value) == "tool(): unknown option 'cache_tll'; did you mean 'cache_ttl'?"


def test_a_misspelled_option_of_tool_names_the_closest_one():
    with pytest.raises(ToolDefinitionError) as caught:
        Tool(lookup, aproval="required")  # type: ignore[call-arg]
    assert str(caught.value) == "Tool(): unknown option 'aproval'; did you mean 'approval'?"


def test_an_option_like_no_other_lists_them_all():
    with pytest.raises(ToolDefinitionError) as caught:
        tool(lookup, colour="red")  # type: ignore[call-overload]
    assert str(caught.value) == (
        "tool(): unknown option 'colour'; the options: amendable, approval, bindings, "
        "cache_ttl, category, decision_policy, dedup, description, digest, ends_turn, executor, "
        "expires_after, hosted, idempotent, mint, name, normalize, output_type, parameters, "
        "permission, prompt, revalidate, sequential, summary, timeout."
    )


def test_the_decorator_takes_exactly_the_options_of_tool():
    from handrail.tools import ToolOptions

    keywords = {
        name: str(param.annotation)
        for name, param in inspect.signature(Tool).parameters.items()
        if param.kind is param.KEYWORD_ONLY
    }
    options = {name: ref.__forward_arg__ for name, ref in ToolOptions.__annotations__.items()}
    assert options == keywords  # the same names with the same types
    assert list(options) == list(keywords)  # in the same order


def test_every_option_still_reaches_the_tool_by_keyword():
    made = tool(lookup, name="orders.lookup", timeout=3, idempotent=True, cache_ttl=60)
    assert (made.name, made.timeout, made.cache_ttl) == ("orders.lookup", 3, 60)
    assert Tool(function=lookup).name == "lookup"
    assert tool()(lookup).name == "lookup"  # `@tool()` is `@tool`


SNIPPET = """
from typing import reveal_type

from handrail import Tool, ToolContext, tool


class Deps: ...


def plain(x: int) -> int:
    return x


@tool(permision="write")
def misspelled(x: int) -> int:
    return x


Tool(plain, aproval="required")


@tool(permission="writ")
def wrong_value(x: int) -> int:
    return x


@tool
def with_deps(ctx: ToolContext[Deps], x: int) -> int:
    return x


@tool(name="a.b", timeout=3)
def configured(ctx: ToolContext[Deps], x: int) -> int:
    return x


reveal_type(with_deps)
reveal_type(configured)
reveal_type(tool(plain))
"""


def test_a_type_checker_refuses_what_the_runtime_refuses(tmp_path):
    """mypy sees every option: a misspelling or a wrong value fails the check, not a run."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET)
    root = Path(__file__).parents[1]  # the project's .mypy_cache: warm after `make typecheck`
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", str(snippet)],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root / "src")},
    )
    lines = [line.split(": ", 1)[1] for line in done.stdout.splitlines() if ": " in line]
    unexpected = 'error: Unexpected keyword argument "{}" for {}; did you mean "{}"?  [{}]'
    assert (
        unexpected.format("permision", 'overloaded function "tool"', "permission", "call-overload")
        in lines
    )
    assert unexpected.format("aproval", '"Tool"', "approval", "call-arg") in lines
    assert any(line.startswith("error: No overload variant of") for line in lines)  # "writ"
    revealed = [line for line in lines if line.startswith("note: Revealed type")]
    assert revealed == [
        'note: Revealed type is "handrail.tools._tool.Tool[snippet.Deps]"',
        'note: Revealed type is "handrail.tools._tool.Tool[snippet.Deps]"',
        'note: Revealed type is "handrail.tools._tool.Tool[Any]"',
    ]


# -- replace: a variant of a tool ---------------------------------------------------------------


def _refund_tool() -> Tool[Any]:
    @tool(name="orders.refund", permission="write", amendable=["amount"])
    def refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        return {"order_id": order_id, "amount": amount}

    return refund


def test_replace_changes_only_what_it_names_and_checks_again() -> None:
    refund = _refund_tool()
    quiet = refund.replace(approval="auto", amendable=(), description="No questions asked.")
    assert (quiet.name, quiet.permission) == ("orders.refund", "write")
    assert not quiet.gated and refund.gated  # the original keeps its gate
    assert quiet.definition.description == "No questions asked."
    with pytest.raises(ToolDefinitionError, match="set approval='required' or drop amendable"):
        refund.replace(approval="auto")  # every check runs again
    assert quiet.definition.parameters == refund.definition.parameters
    with pytest.raises(ToolDefinitionError, match="did you mean 'amendable'"):
        refund.replace(amendible=["amount"])  # type: ignore[call-arg]
    with pytest.raises(ToolDefinitionError, match="destructive"):
        refund.replace(permission="destructive", approval="auto")


async def test_a_replaced_mock_is_rebuilt_from_the_declaration() -> None:
    refund = _refund_tool()
    mocked = refund.mocked({"order_id": "X", "amount": 0})
    rebuilt = mocked.replace(name="orders.refund_v2")
    assert rebuilt.name == "orders.refund_v2"
    assert rebuilt.definition.parameters == refund.definition.parameters
    assert rebuilt.function is refund.function  # the real function, not the mock


def test_a_tool_without_a_function_can_be_replaced() -> None:
    ask = Tool(
        name="customer.ask",
        executor="human",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}},
    )
    asked = ask.replace(prompt="Ask the customer")
    assert asked.executor == "human" and asked.name == "customer.ask"
