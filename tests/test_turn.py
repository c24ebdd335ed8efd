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
from handrail.messages import MESSAGES, Message, TextPart
from handrail.models import ModelRequest
from handrail.store import MemoryStore, SessionRecord
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
    assert not state.scratch  # the turn is over: its scratch is in the history, in its place
    supervised = decision("search", reason="needs a lookup", hints={"executor": "check A1 first"})
    assert [(m.role, m.agent, m.scratch, m.text) for m in state.messages] == [
        ("user", None, False, "Where is A1?"),
        ("assistant", "supervisor", True, supervised),  # kept for people, never for a model
        ("user", None, False, "Note from the supervisor: check A1 first"),  # the handoff
        ("assistant", "executor", False, ""),  # its lookup
        ("assistant", "executor", False, "A1 was delivered."),
        ("assistant", "responder", False, "Your order A1 was delivered yesterday."),
    ]
    assert state.messages[2].parts[0].synthetic  # type: ignore[union-attr]
    conversation = [m.text for m in state.messages if not m.scratch]
    assert all("route" not in t for t in conversation)  # the decision is not part of it


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
    assert "1. look up 2. answer" not in [m.text for m in state.messages if not m.scratch]
    # Kept for people, in its place: after the supervisor's decision, before the handoff.
    assert [(m.text, m.scratch) for m in state.messages] == [
        ("Sort out A1", False),
        (decision("multi_step"), True),
        ("1. look up 2. answer", True),
        ("planner handed over: 1. look up 2. answer", False),
        ("Done as planned.", False),
        ("All done.", False),
    ]


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


async def test_an_agent_twice_in_a_route_resumes_at_the_step_it_stopped_at():
    # executor -> responder -> executor: the second executor suspends on the refund, and the
    # resumption goes on from there (not from the executor's first place in the route).
    domain = desk(routes={"simple": ["responder"], "review": ["executor", "responder", "executor"]})
    engine = engine_for(
        [
            "Looked: A1 is damaged.",
            "A refund is due.",
            [call("orders.refund", order_id="A1")],
            "Refunded A1.",
        ],
        domain,
    )
    events = await events_of(engine.submit("s1", "Review A1", route="review"))
    assert [e.agent for e in events if e.type == "agent-started"] == [
        "executor",
        "responder",
        "executor",
    ]
    assert events[-1].type == "run-suspended"
    await engine.resolve("s1", events[-1].pending[0], Approve())
    resumed = await events_of(engine.resume("s1"))
    assert [e.agent for e in resumed if e.type == "agent-started"] == ["executor"]
    assert resumed[-1].type == "run-completed" and resumed[-1].output == "Refunded A1."


# -- the stored history: in the order things happened ----------------------------------------


class CountingStore(MemoryStore):
    """A memory store that remembers where each save started writing messages."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[int] = []

    async def save(self, record: Any) -> Any:
        self.writes.append(record.messages_from)
        return await super().save(record)


def routed_desk(answer: Any, **runtime: Any) -> tuple[Engine, CountingStore]:
    """supervisor -> worker (scratch, looks up, may refund) -> writer, on a counting store."""
    domain = Domain(
        agents=[Agent("worker", tools=[lookup, refund], scratch=True), Agent("writer")],
        routes={"simple": ["writer"], "search": ["worker", "writer"]},
        supervisor=Agent("supervisor", output_type=RouteDecision),
    )
    store = CountingStore()
    model = FunctionModel(answer)
    return Engine(
        domain, store=store, runtime=Runtime(model=model, ids=sequential_ids(), **runtime)
    ), store


def routed(request: ModelRequest, *, refund_it: bool = False) -> Any:
    last = request.messages[-1]
    if request.agent == "supervisor":
        return decision("search", reason="lookup", hints={"worker": "check A1"})
    if request.agent == "worker":
        if last.role == "user":
            return call("orders.refund" if refund_it else "orders.lookup", order_id="A1")
        return "A1 shipped."
    return "Your order A1 shipped."


def shown(message: Message) -> str:
    """A message as a model is shown it (or as people read it), in one line."""
    if message.tool_calls:
        return f"{message.agent}: " + ", ".join(f"{p.name} {p.status}" for p in message.tool_calls)
    return f"{message.agent or message.role}: {message.text}"


async def test_what_each_model_is_shown_is_unchanged_by_where_the_scratch_is_kept():
    # The requests below are those the engine made when a turn's scratch was appended after
    # the next turn's start: keeping it in its place changes what people read, not models.
    seen: list[tuple[str, list[str]]] = []

    def answer(request: ModelRequest) -> Any:
        seen.append((request.agent, [shown(m) for m in request.messages]))
        return routed(request)

    engine, _ = routed_desk(answer)
    for text in ["where is A1?", "and now?"]:
        await events_of(engine.submit("s1", text))
    first = ["user: where is A1?", "user: worker handed over: A1 shipped."]
    answered = [*first, "writer: Your order A1 shipped.", "user: and now?"]
    assert seen == [
        ("supervisor", ["user: where is A1?"]),
        ("worker", ["user: where is A1?", "user: Note from the supervisor: check A1"]),
        (
            "worker",
            [
                "user: where is A1?",
                "user: Note from the supervisor: check A1",
                "worker: orders.lookup completed",
            ],
        ),
        ("writer", first),
        ("supervisor", answered),
        ("worker", [*answered, "user: Note from the supervisor: check A1"]),
        (
            "worker",
            [
                *answered,
                "user: Note from the supervisor: check A1",
                "worker: orders.lookup completed",
            ],
        ),
        ("writer", [*answered, "user: worker handed over: A1 shipped."]),
    ]


async def test_a_turns_stored_history_reads_in_the_order_things_happened():
    engine, store = routed_desk(routed)
    turn = [
        ("user: where is A1?", False),
        (
            'supervisor: {"route": "search", "reason": "lookup", "hints": {"worker": "check A1"}}',
            True,
        ),
        ("user: Note from the supervisor: check A1", True),  # the worker's handoff
        ("worker: orders.lookup completed", True),
        ("worker: A1 shipped.", True),
        ("user: worker handed over: A1 shipped.", False),  # the writer's handoff
        ("writer: Your order A1 shipped.", False),
    ]
    await events_of(engine.submit("s1", "where is A1?"))
    store.writes.clear()
    await events_of(engine.submit("s1", "where is A1?"))
    history = MESSAGES.validate_python([m for _, m in await store.messages("s1")])
    assert [(shown(m), m.scratch) for m in history] == turn + turn
    assert store.writes and min(store.writes) == len(turn)  # the first turn's rows stay put
    state = await engine.session("s1")
    assert not state.scratch and not state.scratch_at  # nothing waits for the next turn


async def test_a_suspended_turn_keeps_its_scratch_until_it_ends():
    engine, store = routed_desk(lambda request: routed(request, refund_it=True))
    events = await events_of(engine.submit("s1", "refund A1"))
    assert events[-1].type == "run-suspended"
    state = await engine.session("s1")
    assert list(state.scratch) == ["supervisor", "worker"]  # the worker resumes with its own
    assert [shown(m) for m in state.messages] == ["user: refund A1"]
    await engine.resolve("s1", events[-1].pending[0], Approve())
    resumed = await events_of(engine.resume("s1"))
    assert resumed[-1].output == "Your order A1 shipped."
    history = MESSAGES.validate_python([m for _, m in await store.messages("s1")])
    assert [(shown(m), m.scratch) for m in history] == [
        ("user: refund A1", False),
        (
            'supervisor: {"route": "search", "reason": "lookup", "hints": {"worker": "check A1"}}',
            True,
        ),
        ("user: Note from the supervisor: check A1", True),
        ("worker: orders.refund completed", True),
        ("worker: A1 shipped.", True),
        ("user: worker handed over: A1 shipped.", False),
        ("writer: Your order A1 shipped.", False),
    ]


async def test_a_scratch_agent_cut_short_keeps_its_work_before_the_message_that_says_so():
    engine, store = routed_desk(routed, max_turn_iterations=2)
    events = await events_of(engine.submit("s1", "where is A1?"))
    assert events[-1].type == "run-failed" and events[-1].reason == "max-iterations"
    history = MESSAGES.validate_python([m for _, m in await store.messages("s1")])
    assert [(shown(m), m.scratch) for m in history][2:] == [
        ("user: Note from the supervisor: check A1", True),
        ("worker: orders.lookup completed", True),
        (
            "worker: I stopped before finishing: this turn reached its limit of 2 model calls.",
            False,
        ),
    ]


async def test_a_scratch_stored_to_wait_for_the_next_turn_is_still_kept():
    # A session saved before a turn's scratch moved when it ended: it waits in `scratch`.
    state = RunState(session_id="s1", turn=1)
    state.messages = [
        Message(id="u1", role="user", parts=[TextPart(text="hello")]),
        Message(id="a1", role="assistant", agent="solo", parts=[TextPart(text="Hi there.")]),
    ]
    note = Message(id="n1", role="assistant", agent="solo", parts=[TextPart(text="a note")])
    state.scratch = {"solo": [note, state.messages[1]]}  # its answer, published too
    store = MemoryStore()
    record = SessionRecord(
        id="s1",
        status="completed",
        data=state.dump(messages=False),
        messages=state.dump_messages(),
    )
    await store.save(record)
    engine = Engine(
        Domain(agents=[Agent("solo", scratch=True)]),
        store=store,
        runtime=Runtime(model=ScriptedModel(["Bye."]), ids=sequential_ids()),
    )
    await events_of(engine.submit("s1", "bye"))
    history = MESSAGES.validate_python([m for _, m in await store.messages("s1")])
    assert [(shown(m), m.scratch) for m in history] == [
        ("user: hello", False),
        ("solo: Hi there.", False),
        ("solo: a note", True),  # where the next turn's start put it, as before: not lost
        ("user: bye", False),
        ("solo: Bye.", False),  # this turn's answer, once (published, not scratch)
    ]


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
