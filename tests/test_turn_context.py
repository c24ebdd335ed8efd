"""Per-turn context: what an application tells a turn (the page, the record, the locale)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from handrail import (
    Agent,
    Approve,
    Domain,
    Engine,
    InvalidContextError,
    Runtime,
    ToolContext,
    UserError,
    tool,
)
from handrail.server import ApiKeyAuthenticator, Caller, create_app
from handrail.store import MemoryStore, SqliteStore
from handrail.testing import FunctionModel, ScriptedModel, call, sequential_ids
from handrail.tools import Default


class Page(BaseModel):
    page: str
    record_id: int
    locale: str = "en"


seen: list[Any] = []


@tool(permission="read")
def where(ctx: ToolContext[Any]) -> str:
    """Where the user is."""
    seen.append(ctx.turn_context)
    return "ok"


@tool(permission="write", bindings={"order": "sys:context.record_id"})
def refund(ctx: ToolContext[Any], order: int) -> str:
    """Refund the order the user is looking at."""
    seen.append((order, ctx.turn_context))
    return f"refunded {order}"


def engine_for(steps: list[Any], *, store: Any = None, **domain: Any) -> Engine:
    runtime = Runtime(model=ScriptedModel(steps), ids=sequential_ids())
    agents = [Agent("a", tools=[where, refund])]
    return Engine(Domain(agents=agents, **domain), runtime=runtime, store=store or MemoryStore())


async def drain(run: Any) -> list[Any]:
    return [e async for e in run]


@pytest.fixture(autouse=True)
def _clear() -> None:
    seen.clear()


async def test_a_tool_reads_the_turns_context_validated_against_the_domains_model() -> None:
    engine = engine_for([[call("where")], "Done."], context_model=Page)
    events = await drain(engine.submit("s1", "hi", context={"page": "orders", "record_id": "7"}))
    assert events[-1].type == "run-completed"
    assert seen == [Page(page="orders", record_id=7)]
    state = await engine.session("s1")
    assert state.turn_context == Page(page="orders", record_id=7)
    assert all("orders" not in (m.text or "") for m in state.messages)  # not in the chat


async def test_without_a_model_the_context_is_a_dict_and_a_non_object_is_refused() -> None:
    engine = engine_for([[call("where")], "Done."])
    await drain(engine.submit("s1", "hi", context={"page": "home"}))
    assert seen == [{"page": "home"}]
    with pytest.raises(InvalidContextError, match="a JSON object"):
        engine.submit("s2", "hi", context=["home"])


async def test_an_invalid_context_is_a_typed_error_naming_the_field_and_nothing_is_stored() -> None:
    store = MemoryStore()
    engine = engine_for(["Done."], store=store, context_model=Page)
    with pytest.raises(InvalidContextError, match=r"context\.record_id") as info:
        engine.submit("s1", "hi", context={"page": "orders", "record_id": "seven"})
    assert info.value.field == "record_id"
    assert await store.load("s1") is None
    with pytest.raises(InvalidContextError, match=r"context\.page"):
        await engine.run_headless("s1", "hi", context={"record_id": 1})
    assert await store.load("s1") is None


async def test_a_binding_reads_the_context_and_a_resumed_turn_after_a_restart_has_it(
    tmp_path: Any,
) -> None:
    path = tmp_path / "s.db"
    steps = [[call("refund")], "Refunded."]
    first = engine_for(steps, store=SqliteStore(path), context_model=Page)
    events = await drain(first.submit("s1", "refund it", context={"page": "o", "record_id": 42}))
    assert events[-1].type == "run-suspended"
    (call_id,) = events[-1].pending
    # a new process: a new engine on the same store
    second = engine_for(steps[1:], store=SqliteStore(path), context_model=Page)
    await second.resolve("s1", call_id, Approve())
    events = await drain(second.resume("s1"))
    assert events[-1].type == "run-completed"
    assert seen == [(42, Page(page="o", record_id=42))]


async def test_transform_args_receives_the_tool_context_and_the_old_form_still_works() -> None:
    calls: list[Any] = []

    def with_ctx(t: Any, args: dict[str, Any], ctx: ToolContext[Any]) -> dict[str, Any]:
        calls.append((t.name, ctx.session_id, ctx.turn_context))
        return args

    def old(t: Any, args: dict[str, Any]) -> dict[str, Any]:
        calls.append(t.name)
        return args

    for hook in (with_ctx, old):
        runtime = Runtime(
            model=ScriptedModel([[call("where")], "Done."]),
            ids=sequential_ids(),
            transform_args=hook,
        )
        engine = Engine(Domain(agents=[Agent("a", tools=[where])]), runtime=runtime)
        await drain(engine.submit("s1", "hi", context={"page": "p"}))
    assert calls == [("where", "s1", {"page": "p"}), "where"]


async def test_the_http_turn_body_carries_the_context_and_a_bad_one_is_a_422() -> None:
    engine = engine_for([[call("where")], "Done."], context_model=Page)
    auth = ApiKeyAuthenticator({"key-ana": Caller("acme", "ana")})
    app = create_app(engine, authenticator=auth, poll_interval=0.2)
    ana = {"Authorization": "Bearer key-ana"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client,
    ):
        session_id = (await client.post("/sessions", headers=ana)).json()["id"]
        bad = await client.post(
            f"/sessions/{session_id}/turns",
            json={"text": "hi", "context": {"page": "orders", "record_id": "x"}},
            headers=ana,
        )
        assert bad.status_code == 422, bad.text
        assert bad.json()["error"]["type"] == "invalid_context"
        assert "context.record_id" in bad.json()["error"]["message"]
        state = await engine.session(session_id, org_id="acme", user_id="ana")
        assert state.turn == 0 and state.messages == []
        ok = await client.post(
            f"/sessions/{session_id}/turns",
            json={"text": "hi", "context": {"page": "orders", "record_id": 3}},
            headers=ana,
        )
        assert ok.status_code == 202, ok.text
        await app.state.runs.join(session_id)
    assert seen == [Page(page="orders", record_id=3)]


async def test_the_agui_and_ui_stream_bodies_carry_the_context_and_a_bad_one_is_a_422() -> None:
    engine = engine_for([[call("where")], "Done.", [call("where")], "Done."], context_model=Page)
    auth = ApiKeyAuthenticator({"key-ana": Caller("acme", "ana")})
    app = create_app(engine, authenticator=auth, static_dir=None)
    ana = {"Authorization": "Bearer key-ana"}
    user = {"id": "u1", "role": "user", "content": "hi"}

    def agui(context: Any) -> dict[str, Any]:
        return {
            "threadId": "t1",
            "runId": "r1",
            "state": {},
            "messages": [user],
            "tools": [],
            "context": [],
            "forwardedProps": {"context": context},
        }

    def chat(context: Any) -> dict[str, Any]:
        parts = [{"type": "text", "text": "hi"}]
        return {"id": "c1", "messages": [{"id": "m1", "role": "user", "parts": parts}], **context}

    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client,
    ):
        for path, body in (
            ("/agui", agui({"page": "p", "record_id": "x"})),
            ("/chat", chat({"context": {"page": "p", "record_id": "x"}})),
        ):
            bad = await client.post(path, json=body, headers=ana)
            assert bad.status_code == 422, (path, bad.text)
            assert bad.json()["error"]["type"] == "invalid_context"
            assert "context.record_id" in bad.json()["error"]["message"]
        assert await engine.store.list(org_id="acme") == []  # nothing stored
        ok = await client.post("/agui", json=agui({"page": "a", "record_id": 1}), headers=ana)
        assert ok.status_code == 200, ok.text
        ok = await client.post(
            "/chat", json=chat({"context": {"page": "c", "record_id": 2}}), headers=ana
        )
        assert ok.status_code == 200, ok.text
    assert seen == [Page(page="a", record_id=1), Page(page="c", record_id=2)]


@tool(
    permission="read",
    bindings={"order": "sys:context.record_id", "locale": Default("sys:context.locale")},
)
def label(order: int, locale: str) -> str:
    """Label an order."""
    seen.append((order, locale))
    return "ok"


def test_a_default_binding_stays_in_the_schema_and_is_not_required() -> None:
    schema = label.definition.parameters
    assert "order" not in schema["properties"]  # forced: hidden
    assert "locale" in schema["properties"]  # a default: the model sees it
    assert "locale" not in schema.get("required", [])


async def test_a_default_binding_fills_only_what_the_model_leaves_out() -> None:
    runtime = Runtime(
        model=ScriptedModel(
            [[call("label", order=999)], "One.", [call("label", order=1, locale="fr")], "Two."]
        ),
        ids=sequential_ids(),
    )
    engine = Engine(Domain(agents=[Agent("a", tools=[label])], context_model=Page), runtime=runtime)
    await drain(engine.submit("s1", "a", context={"page": "p", "record_id": 5, "locale": "de"}))
    await drain(engine.submit("s1", "b", context={"page": "p", "record_id": 6, "locale": "de"}))
    # the forced one replaces the model's value; the default yields to it
    assert seen == [(5, "de"), (6, "fr")]
    state = await engine.session("s1")
    stored = [p.args for m in state.messages for p in m.tool_calls]
    assert stored == [{"locale": "de"}, {"locale": "fr"}]


class Cart(BaseModel):
    customer: int
    items: list[str] = []


def cart_for(context: Page | None) -> Cart:
    return Cart(customer=context.record_id if context is not None else 0)


@tool(permission="write", approval="auto")
def add(ctx: ToolContext[Any], item: str) -> str:
    """Add an item to the cart."""
    ctx.state.items.append(item)
    return f"cart of {ctx.state.customer}: {ctx.state.items}"


async def test_the_initial_state_is_built_from_the_first_turns_context(tmp_path: Any) -> None:
    path = tmp_path / "s.db"

    def engine(steps: list[Any]) -> Engine:
        domain = Domain(
            agents=[Agent("a", tools=[add])], context_model=Page, initial_state=cart_for
        )
        runtime = Runtime(model=ScriptedModel(steps), ids=sequential_ids())
        return Engine(domain, runtime=runtime, store=SqliteStore(path))

    first = engine([[call("add", item="tea")], "Added."])
    await drain(first.submit("s1", "tea", context={"page": "cart", "record_id": 8}))
    # a later turn's context does not rebuild it; a restarted engine loads it typed
    second = engine([[call("add", item="jam")], "Added."])
    await drain(second.submit("s1", "jam", context={"page": "cart", "record_id": 9}))
    state = await second.session("s1")
    assert state.domain_state == Cart(customer=8, items=["tea", "jam"])


def test_an_initial_state_function_must_say_what_it_returns() -> None:
    with pytest.raises(UserError, match="annotated to return a model"):
        Domain(agents=[Agent("a")], initial_state=lambda context: Cart(customer=1))


async def test_instructions_read_the_context_and_agent_run_takes_one() -> None:
    prompts: list[Any] = []

    def answer(request: Any) -> Any:
        prompts.append(request.instructions)
        return "Done."

    def instructions(state: Any, context: Any) -> str:
        return f"The user is on the {context['page']} page." if context else "Nowhere."

    agent = Agent("a", instructions=instructions, tools=[where])
    runtime = Runtime(model=FunctionModel(answer), ids=sequential_ids())
    result = await agent.run("hi", runtime=runtime, context={"page": "orders"})
    assert result.state.turn_context == {"page": "orders"}
    await agent.run("again", state=result.state, runtime=runtime)  # a turn without one
    assert prompts == ["The user is on the orders page.", "Nowhere."]
    # the one-argument form still works
    plain = Agent("b", instructions=lambda state: f"turn {state.turn}")
    await plain.run("hi", runtime=runtime)
    assert prompts[-1] == "turn 1"


async def test_the_model_is_chosen_per_organisation_below_the_agent_and_the_turn() -> None:
    def named(name: str) -> FunctionModel:
        return FunctionModel(lambda request: f"from {name}")

    plain, pinned = Agent("plain"), Agent("pinned", model=named("agent"))
    engine = Engine(
        Domain(agents=[plain, pinned], routes={"p": ["plain"], "a": ["pinned"]}),
        runtime=Runtime(model=named("runtime"), ids=sequential_ids()),
        model=named("engine"),
        org_models={"acme": named("acme")},
    )

    async def answer(org: str, route: str, model: Any = None) -> str:
        run = engine.submit(
            f"{org}-{route}-{model is not None}", "hi", org_id=org, route=route, model=model
        )
        events = await drain(run)
        return str(events[-1].output)

    assert await answer("globex", "p") == "from engine"
    assert await answer("acme", "p") == "from acme"
    assert await answer("acme", "a") == "from agent"
    assert await answer("acme", "a", named("turn")) == "from turn"


def _currency(args: dict[str, Any], context: Any) -> dict[str, Any]:
    if "currency" not in args and context is not None:
        args["currency"] = {"de": "EUR", "en": "GBP"}[context.locale]
    return args


@tool(permission="read", normalize=_currency)
def price(item: str, currency: str) -> str:
    """Price an item."""
    seen.append((item, currency))
    return "ok"


async def test_normalize_may_read_the_context() -> None:
    runtime = Runtime(
        model=ScriptedModel([[call("price", item="tea")], "Done."]), ids=sequential_ids()
    )
    engine = Engine(Domain(agents=[Agent("a", tools=[price])], context_model=Page), runtime=runtime)
    await drain(engine.submit("s1", "hi", context={"page": "p", "record_id": 1, "locale": "de"}))
    assert seen == [("tea", "EUR")]


async def test_a_turn_without_a_context_never_reads_the_previous_turns() -> None:
    @tool(permission="read", bindings={"page": "sys:context.page"})
    def page(page: str) -> str:
        """The page."""
        seen.append(page)
        return page

    agent = Agent("a", tools=[page])
    runtime = Runtime(
        model=ScriptedModel([[call("page")], "One.", [call("page")], "Two."]),
        ids=sequential_ids(),
    )
    first = await agent.run("hi", runtime=runtime, context={"page": "orders"})
    second = await agent.run("again", state=first.state, runtime=runtime)
    assert seen == ["orders"]  # the second call could not bind: no stale page
    (_, failed) = [p for m in second.state.messages for p in m.tool_calls]
    assert failed.result is not None and failed.result.code == "invalid_arguments"


# -- string instructions templated with the turn's context ------------------------------------


def prompts_of(steps: list[Any]) -> tuple[list[Any], FunctionModel]:
    prompts: list[Any] = []
    replies = iter(steps)

    def answer(request: Any) -> Any:
        prompts.append(request.instructions)
        return next(replies)

    return prompts, FunctionModel(answer)


async def test_string_instructions_read_the_context_and_keep_every_other_brace() -> None:
    prompts, model = prompts_of(["One.", "Two."])
    text = (
        "You help on {context.page} for {context.record_id} ({context.locale}). "
        'Answer as {"ok": true, "items": [{"id": 1}]}; {context} and {{context.page}} stay.'
    )
    engine = Engine(
        Domain(agents=[Agent("desk", instructions=text)], context_model=Page),
        runtime=Runtime(model=model, ids=sequential_ids()),
    )
    await drain(engine.submit("s1", "hi", context={"page": "orders", "record_id": 7}))
    await drain(engine.submit("s1", "and?", context={"page": "refunds", "record_id": 8}))
    assert prompts == [
        'You help on orders for 7 (en). Answer as {"ok": true, "items": [{"id": 1}]}; '
        "{context} and {context.page} stay.",
        'You help on refunds for 8 (en). Answer as {"ok": true, "items": [{"id": 1}]}; '
        "{context} and {context.page} stay.",
    ]


async def test_a_placeholder_reads_a_path_and_a_non_string_goes_in_as_json() -> None:
    prompts, model = prompts_of(["Done."])
    agent = Agent("a", instructions="{context.user.name} has {context.tags} ({context.tags[-1]})")
    context = {"user": {"name": "Ana"}, "tags": ["vip", "eu"]}
    await agent.run("hi", runtime=Runtime(model=model), context=context)
    assert prompts == ['Ana has ["vip", "eu"] (eu)']


async def test_a_missing_field_or_no_context_is_a_typed_error_before_anything_is_stored() -> None:
    store = MemoryStore()
    prompts, model = prompts_of(["Done."])
    engine = Engine(
        Domain(agents=[Agent("desk", instructions="On {context.section}.")]),
        runtime=Runtime(model=model),
        store=store,
    )
    with pytest.raises(InvalidContextError, match=r"'desk'.*\{context\.section\}") as info:
        engine.submit("s1", "hi", context={"page": "orders"})
    assert info.value.field == "section"
    with pytest.raises(InvalidContextError, match="no context") as info:
        engine.submit("s1", "hi")
    assert info.value.field == "section"
    with pytest.raises(InvalidContextError, match="section"):
        await engine.run_headless("s1", "hi", context={"page": "orders"})
    assert await store.load("s1") is None and prompts == []
    # an agent alone: refused before its loop starts
    with pytest.raises(InvalidContextError, match="no context"):
        await Agent("solo", instructions="On {context.page}.").run(
            "hi", runtime=Runtime(model=model)
        )
    assert prompts == []


def test_a_placeholder_naming_no_field_of_the_context_model_fails_when_the_domain_is_made() -> None:
    with pytest.raises(UserError, match=r"'desk'.*\{context\.pgae\}.*Page has no field 'pgae'"):
        Domain(agents=[Agent("desk", instructions="On {context.pgae}.")], context_model=Page)


async def test_only_the_agents_a_turn_may_run_need_their_placeholders() -> None:
    prompts, model = prompts_of(["Batch done.", "Copilot done."])
    domain = Domain(
        agents=[
            Agent("batch", instructions="Nightly."),
            Agent("copilot", instructions="On {context.page}."),
        ],
        routes={"batch": ["batch"], "copilot": ["copilot"]},
    )
    engine = Engine(domain, runtime=Runtime(model=model))
    # the default route (batch) reads no context: a turn without one runs
    events = await drain(engine.submit("s1", "go"))
    assert events[-1].type == "run-completed"
    with pytest.raises(InvalidContextError, match="'copilot'"):
        engine.submit("s1", "go", route="copilot")
    await drain(engine.submit("s1", "go", route="copilot", context={"page": "home"}))
    assert prompts == ["Nightly.", "On home."]


async def test_the_http_turn_with_a_context_missing_a_placeholders_field_is_a_422() -> None:
    engine = Engine(
        Domain(agents=[Agent("desk", instructions="On {context.page}.")]),
        runtime=Runtime(model=ScriptedModel(["Done."])),
    )
    auth = ApiKeyAuthenticator({"key-ana": Caller("acme", "ana")})
    app = create_app(engine, authenticator=auth, poll_interval=0.2)
    ana = {"Authorization": "Bearer key-ana"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client,
    ):
        session_id = (await client.post("/sessions", headers=ana)).json()["id"]
        bad = await client.post(
            f"/sessions/{session_id}/turns", json={"text": "hi", "context": {}}, headers=ana
        )
        assert bad.status_code == 422, bad.text
        assert bad.json()["error"]["type"] == "invalid_context"
        assert "'desk'" in bad.json()["error"]["message"]
        state = await engine.session(session_id, org_id="acme", user_id="ana")
        assert state.turn == 0 and state.messages == []


async def test_get_session_shows_the_latest_turns_context() -> None:
    engine = engine_for([[call("where")], "Done.", "Again."], context_model=Page)
    auth = ApiKeyAuthenticator({"key-ana": Caller("acme", "ana")})
    app = create_app(engine, authenticator=auth, poll_interval=0.2)
    ana = {"Authorization": "Bearer key-ana"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client,
    ):
        session_id = (await client.post("/sessions", headers=ana)).json()["id"]
        assert (await client.get(f"/sessions/{session_id}", headers=ana)).json()["context"] is None
        turn = {"text": "hi", "context": {"page": "orders", "record_id": 3}}
        await client.post(f"/sessions/{session_id}/turns", json=turn, headers=ana)
        await app.state.runs.join(session_id)
        shown = (await client.get(f"/sessions/{session_id}", headers=ana)).json()
        assert shown["context"] == {"page": "orders", "record_id": 3, "locale": "en"}
        await client.post(f"/sessions/{session_id}/turns", json={"text": "again"}, headers=ana)
        await app.state.runs.join(session_id)
        shown = (await client.get(f"/sessions/{session_id}", headers=ana)).json()
        assert shown["context"] is None  # the latest turn carried none
