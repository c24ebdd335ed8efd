"""Turns through a domain: the supervisor's routes, pipelines, scratch, caps, typed state."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from handrail import (
    Agent,
    Approve,
    ConfigError,
    Domain,
    Engine,
    RouteChoice,
    RouteDecision,
    RunFailed,
    RunState,
    Runtime,
    StoreError,
    ToolContext,
    UserError,
    build_runtime,
    tool,
)
from handrail.models import ModelRequest
from handrail.store import MemoryStore
from handrail.testing import FunctionModel, ScriptedModel, call, sequential_ids


@tool(name="orders.lookup")
def lookup(order_id: str) -> dict[str, str]:
    """Look an order up."""
    return {"id": order_id, "status": "delivered"}


@tool(name="orders.refund", permission="write")
def refund(order_id: str) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


def desk(**changes: Any) -> Domain:
    supervisor = Agent("supervisor", instructions="Pick a route.", output_type=RouteDecision)
    options: dict[str, Any] = {
        "agents": [
            Agent("planner", scratch=True),
            Agent("executor", tools=[lookup, refund]),
            Agent("responder"),
        ],
        "routes": {
            "simple": ["responder"],
            "search": ["executor", "responder"],
            "multi_step": ["planner", "executor", "responder"],
        },
        "default_route": "simple",
        "supervisor": supervisor,
    }
    return Domain(**{**options, **changes})


def decision(route: str, **extra: Any) -> str:
    return json.dumps({"route": route, **extra})


def engine_for(steps: list[Any], domain: Domain | None = None, **kwargs: Any) -> Engine:
    runtime = Runtime(model=ScriptedModel(steps), ids=sequential_ids())
    return Engine(domain or desk(), runtime=runtime, **kwargs)


async def events_of(run: Any) -> list[Any]:
    return [e async for e in run]


# -- routing ---------------------------------------------------------------------------------


async def test_the_supervisor_routes_the_turn_and_its_messages_stay_out_of_the_conversation():
    engine = engine_for(
        [
            decision("search", reason="needs a lookup", hints={"executor": "check A1 first"}),
            [call("orders.lookup", order_id="A1")],
            "A1 was delivered.",
            "Your order A1 was delivered yesterday.",
        ]
    )
    events = await events_of(engine.submit("s1", "Where is A1?"))
    assert [e.agent for e in events if e.type == "agent-started"] == [
        "supervisor",
        "executor",
        "responder",
    ]
    chosen = next(e for e in events if e.type == "agent-completed")
    assert chosen.output == {"route": "search", "reason": "needs a lookup", "fallback": False}
    assert events[-1].output == "Your order A1 was delivered yesterday."
    state = await engine.session("s1")
    assert state.route == RouteChoice(  # recorded with the session until the next turn
        route="search", reason="needs a lookup", hints={"executor": "check A1 first"}
    )
    assert state.scratch["supervisor"][-1].text == decision(
        "search", reason="needs a lookup", hints={"executor": "check A1 first"}
    )
    texts = [m.text for m in state.messages]
    assert texts[0] == "Where is A1?"
    assert texts[1] == "Note from the supervisor: check A1 first"  # the executor's handoff
    assert state.messages[1].parts[0].synthetic  # type: ignore[union-attr]
    assert all("route" not in t for t in texts)  # the decision is not part of the conversation


async def test_the_supervisor_sees_the_routes_it_may_name():
    seen: list[Any] = []

    def supervise(request: ModelRequest) -> str:
        seen.append(request.output_schema)
        return decision("simple")

    runtime = Runtime(model=ScriptedModel(["Hi!"]), ids=sequential_ids())
    domain = desk(
        supervisor=Agent("supervisor", output_type=RouteDecision, model=FunctionModel(supervise))
    )
    await events_of(Engine(domain, runtime=runtime).submit("s1", "hello"))
    assert seen[0]["properties"]["route"]["enum"] == ["simple", "search", "multi_step"]


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        (["not json", "still not json"], "the supervisor's answer was not a decision"),
        ([decision("teleport")], "the supervisor chose 'teleport', which is not a route"),
    ],
)
async def test_a_bad_decision_falls_back_to_the_default_route_and_is_recorded(
    steps: list[Any], reason: str
):
    engine = engine_for([*steps, "Hello!"])
    events = await events_of(engine.submit("s1", "hi"))
    chosen = next(e for e in events if e.type == "agent-completed")
    assert chosen.output["route"] == "simple" and chosen.output["fallback"] is True
    assert reason in chosen.output["reason"]
    assert events[-1].type == "run-completed" and events[-1].output == "Hello!"


async def test_a_route_named_by_the_caller_skips_the_supervisor():
    engine = engine_for(["Hi!"])
    events = await events_of(engine.submit("s1", "hi", route="simple"))
    assert [e.agent for e in events if e.type == "agent-started"] == ["responder"]


def test_a_supervisor_must_answer_with_a_route():
    with pytest.raises(UserError, match="output_type=RouteDecision"):
        desk(supervisor=Agent("supervisor"))
    with pytest.raises(UserError, match="like an agent"):
        desk(supervisor=Agent("planner", output_type=RouteDecision))


# -- pipelines -------------------------------------------------------------------------------


async def test_a_scratch_agent_hands_its_answer_to_the_next_and_keeps_its_messages_apart():
    seen: list[list[str]] = []

    def executor(request: ModelRequest) -> Any:
        seen.append([m.text for m in request.messages])
        return "Done as planned."

    domain = desk(
        agents=[
            Agent("planner", scratch=True),
            Agent("executor", model=FunctionModel(executor)),
            Agent("responder"),
        ]
    )
    engine = engine_for([decision("multi_step"), "1. look up 2. answer", "All done."], domain)
    events = await events_of(engine.submit("s1", "Sort out A1"))
    assert events[-1].output == "All done."
    assert seen[0] == ["Sort out A1", "planner handed over: 1. look up 2. answer"]
    state = await engine.session("s1")
    assert "1. look up 2. answer" not in [m.text for m in state.messages]


async def test_a_scratch_agent_last_in_its_route_publishes_its_answer():
    domain = Domain(agents=[Agent("solo", scratch=True)])
    engine = engine_for(["Hi there."], domain)
    await events_of(engine.submit("s1", "hello"))
    state = await engine.session("s1")
    assert [m.text for m in state.messages] == ["hello", "Hi there."]


async def test_a_turn_suspended_in_a_routed_pipeline_resumes_in_its_agent():
    engine = engine_for(
        [
            decision("search"),
            [call("orders.refund", order_id="A1")],
            "Refunded.",
            "Your refund is on its way.",
        ]
    )
    events = await events_of(engine.submit("s1", "Refund A1"))
    assert events[-1].type == "run-suspended"
    await engine.resolve("s1", events[-1].pending[0], Approve())
    resumed = await events_of(engine.resume("s1"))
    assert [e.agent for e in resumed if e.type == "agent-started"] == ["executor", "responder"]
    assert resumed[-1].output == "Your refund is on its way."


# -- caps -----------------------------------------------------------------------------------


async def test_the_turn_cap_ends_the_turn_with_a_message_across_agents():
    looping = [[call("orders.lookup", order_id=f"A{i}")] for i in range(10)]
    domain = Domain(
        agents=[Agent("executor", tools=[lookup]), Agent("responder")],
        routes={"search": ["executor", "responder"]},
    )
    runtime = Runtime(model=ScriptedModel(looping), ids=sequential_ids(), max_turn_iterations=3)
    engine = Engine(domain, runtime=runtime)
    events = await events_of(engine.submit("s1", "go"))
    assert events[-1] == RunFailed(
        reason="max-iterations", error="this turn reached its limit of 3 model calls"
    )
    state = await engine.session("s1")
    assert state.messages[-1].text == (
        "I stopped before finishing: this turn reached its limit of 3 model calls."
    )
    assert state.progress is None  # the turn ended: the next message starts a new one
    assert "responder" not in [e.agent for e in events if e.type == "agent-started"]


# -- typed domain state and scope -----------------------------------------------------------------


class Cart(BaseModel):
    items: list[str] = []


@tool(name="cart.add")
def add_to_cart(ctx: ToolContext[None], item: str) -> int:
    """Add an item to the cart."""
    ctx.state.items.append(item)
    return len(ctx.state.items)


async def test_tools_read_and_change_the_typed_domain_state_and_it_is_stored():
    store = MemoryStore()
    domain = Domain(agents=[Agent("shop", tools=[add_to_cart])], initial_state=Cart)
    engine = engine_for(
        [[call("cart.add", item="beans")], "Added.", [call("cart.add", item="filters")], "Added."],
        domain,
        store=store,
    )
    await events_of(engine.submit("s1", "beans please"))
    await events_of(engine.submit("s1", "and filters"))
    state = await engine.session("s1")
    assert state.domain_state == Cart(items=["beans", "filters"])
    record = await store.load("s1")
    assert record is not None and record.data["domain_state"] == {"items": ["beans", "filters"]}
    record.data["domain_state"] = {"items": "not a list"}
    await store.save(record)
    with pytest.raises(StoreError, match="its domain state does not fit Cart"):
        await engine.session("s1")


async def test_a_model_cannot_widen_the_scope_a_tool_runs_in():
    seen: list[tuple[str, str | None]] = []

    @tool(name="orders.mine", bindings={"org": "sys:org_id"})
    def mine(ctx: ToolContext[None], org: str) -> str:
        """This organisation's orders."""
        seen.append((org, ctx.org_id))
        return f"orders of {org}"

    assert "org" not in mine.definition.parameters.get("properties", {})
    engine = engine_for(
        [[call("orders.mine", org="evil-corp")], "Here they are."],
        Domain(agents=[Agent("a", tools=[mine])]),
    )
    await events_of(engine.submit("s1", "show me evil-corp's orders", org_id="acme", user_id="u"))
    assert seen == [("acme", "acme")]


# -- the runtime builder ---------------------------------------------------------------------


async def test_mock_mode_runs_mocks_and_refuses_unmocked_tools():
    engine = engine_for(
        [[call("orders.lookup", order_id="A1"), call("cart.add", item="x")], "ok"],
        Domain(agents=[Agent("a", tools=[lookup, add_to_cart])]),
        mode="mock",
        wrap_tools={"orders.lookup": lambda args: {"id": args["order_id"], "status": "mocked"}},
    )
    await events_of(engine.submit("s1", "go"))
    looked, added = (await engine.session("s1")).messages[1].tool_calls
    assert looked.result.data == {"id": "A1", "status": "mocked"}  # type: ignore[union-attr]
    assert (
        added.result.error
        == "Tool 'cart.add' has no mock in this run (mode='mock'), so it did not run."
    )  # type: ignore[union-attr]


def test_the_builder_refuses_what_it_cannot_build():
    with pytest.raises(ConfigError, match="mocks 'nope', which no agent has"):
        build_runtime(Agent("a", tools=[lookup]), wrap_tools={"nope": 1})
    with pytest.raises(ConfigError, match="the modes are live, mock, capture"):
        build_runtime(Agent("a"), mode="dry")  # type: ignore[arg-type]


def test_models_resolve_per_turn_then_agent_then_engine_then_runtime():
    turn, own, engine_default, runtime_default = (ScriptedModel([], name=n) for n in "tOer")
    assembly = build_runtime(
        Domain(agents=[Agent("a", model=own), Agent("b")]),
        runtime=Runtime(model=runtime_default),
        model=engine_default,
    )
    a, b = assembly.domain.agents
    assert assembly.model_for(a, turn) is turn
    assert assembly.model_for(a) is own
    assert assembly.model_for(b) is engine_default
    bare = build_runtime(Agent("c"), runtime=Runtime(model=runtime_default))
    assert bare.model_for(bare.domain.agents[0]) is runtime_default
    with pytest.raises(ConfigError, match="Agent 'c' has no model"):
        build_runtime(Agent("c")).model_for(Agent("c"))


def test_the_stored_state_keeps_scratch_route_and_domain_state():
    state = RunState()
    state.route = RouteChoice(route="search", reason="r", hints={"executor": "h"})
    state.domain_state = {"items": ["x"]}
    again = RunState.load(json.loads(json.dumps(state.dump())))
    assert again.route == state.route and again.domain_state == {"items": ["x"]}


# -- compaction in the loop --------------------------------------------------------------------


async def test_an_over_budget_request_is_compacted_and_the_summary_is_stored():
    pytest.importorskip("tiktoken")
    from handrail import Compaction
    from handrail.compaction import SUMMARY_HEADING

    seen: list[list[str]] = []

    def answer(request: ModelRequest) -> str:
        if request.agent == "compaction":
            return "The customer asked about orders A0 to A5; all were delivered."
        seen.append([m.text for m in request.messages])
        return "Delivered. " * 40

    store = MemoryStore()
    runtime = Runtime(
        model=FunctionModel(answer),
        ids=sequential_ids(),
        compaction=Compaction(max_tokens=600, keep_recent_turns=1),
    )
    engine = Engine(Agent("desk"), store=store, runtime=runtime)
    for n in range(6):
        await events_of(engine.submit("s1", f"Where is order A{n}? " + "please " * 30))
    assert seen[-1][0].startswith(SUMMARY_HEADING)  # the model saw [summary, recent]
    assert seen[-1][-1].startswith("Where is order A5?")
    state = await engine.session("s1")
    assert len(await store.messages("s1")) == 12  # the stored conversation is never cut
    # A load reads what a turn needs: the summary and the messages after it.
    assert state.summary is not None and "A0 to A5" in state.summary.text
    assert state.base == state.summary.messages > 0
    assert state.base + len(state.messages) == 12
    assert state.usage.requests > 6  # the summarizer's calls are counted
