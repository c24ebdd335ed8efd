"""Suspension: approval, elicitation and client execution, through `Engine` as users drive it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from handrail import (
    Agent,
    Answer,
    ApprovalCardPart,
    Approve,
    AskPerson,
    ClientResult,
    Deadlines,
    Domain,
    Engine,
    InvalidDecisionError,
    Reject,
    RunState,
    Runtime,
    SessionBusyError,
    SessionNotFoundError,
    StaleResolutionError,
    ToolCallPart,
    ToolContext,
    UserError,
    tool,
)
from handrail.models import ModelRequest
from handrail.store import MemoryStore, SessionRecord
from handrail.testing import FunctionModel, ScriptedModel, call, sequential_ids

# -- tools ---------------------------------------------------------------------------------

effects: list[tuple[str, Any]] = []


@pytest.fixture(autouse=True)
def _clear_effects() -> None:
    effects.clear()


class Refund(BaseModel):
    refund_id: str
    amount: float


class Size(BaseModel):
    size: str


class Opened(BaseModel):
    tab: int


@tool(name="orders.refund", permission="write", amendable=["amount"], prompt="Refund?")
def refund(order_id: str, amount: float) -> Refund:
    """Refund an order."""
    effects.append(("refund", (order_id, amount)))
    return Refund(refund_id=f"R-{order_id}", amount=amount)


@tool(name="orders.lookup")
def lookup(order_id: str) -> dict[str, str]:
    """Look an order up."""
    effects.append(("lookup", order_id))
    return {"id": order_id, "status": "delivered"}


@tool(executor="human", prompt="Which size?")
def ask_size(question: str) -> Size:
    """Ask the customer for a size."""
    raise AssertionError("a human tool never runs here")


@tool(executor="client")
def open_tab(url: str) -> Opened:
    """Open a tab in the user's browser."""
    raise AssertionError("a client tool never runs here")


@tool(executor="client", approval="required")
def pay(amount: float) -> Opened:
    """Pay in the user's browser, once approved."""
    raise AssertionError("a client tool never runs here")


TOOLS = [refund, lookup, ask_size, open_tab, pay]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def engine_for(
    steps: list[Any], *, agents: Any = None, store: MemoryStore | None = None, **runtime: Any
) -> tuple[Engine, ScriptedModel]:
    model = ScriptedModel(steps)
    runtime.setdefault("clock", Clock())
    domain = agents or Agent("support", tools=TOOLS)
    rt = Runtime(model=model, ids=sequential_ids(), **runtime)
    return Engine(domain, store=store or MemoryStore(), runtime=rt), model


async def events_of(run: Any) -> list[Any]:
    return [e async for e in run]


def call_parts(state: RunState) -> list[ToolCallPart]:
    return [p for m in state.messages for p in m.tool_calls]


def cards(state: RunState) -> list[ApprovalCardPart]:
    return [p for m in state.messages for p in m.parts if isinstance(p, ApprovalCardPart)]


async def suspended(engine: Engine, text: str = "go", **kwargs: Any) -> list[Any]:
    events = await events_of(engine.submit("s1", text, **kwargs))
    assert events[-1].type == "run-suspended", events[-1]
    return events


# -- suspend, resolve, resume -----------------------------------------------------------------


async def test_a_gated_call_suspends_and_resumes_in_the_same_turn_without_a_new_model_call():
    engine, model = engine_for([[call("orders.refund", order_id="A1", amount=84)], "Refunded 84."])
    events = await suspended(engine)
    assert [e.type for e in events] == [
        "run-started",
        "agent-started",
        "usage",
        "approval-required",  # not started: it starts when it runs, once approved
        "run-suspended",
    ]
    assert events[-1].pending == ["call_1"]
    assert effects == []

    stored = await engine.store.load("s1")
    assert stored is not None and stored.status == "suspended"
    state = await engine.session("s1")
    card = state.pending["call_1"]
    assert (card.kind, card.executor, card.prompt, card.args) == (
        "approval",
        "server",
        "Refund?",
        {"order_id": "A1", "amount": 84.0},
    )
    assert (card.created_at, card.expires_at) == (1_000.0, 1_000.0 + 24 * 3600)  # by default
    part = call_parts(state)[0]
    assert part.status == "waiting"
    assert part.result is not None and not part.result.ok
    assert "No result yet" in (part.result.error or "")

    resolution = await engine.resolve("s1", "call_1", Approve(by="ana"))
    assert (resolution.decided, resolution.pending, resolution.ready) == (["call_1"], [], True)
    assert effects == []  # recording a decision runs nothing

    resumed = await events_of(engine.resume("s1"))
    assert [e.type for e in resumed] == [
        "run-started",
        "agent-started",
        "tool-call-started",
        "tool-call-completed",
        "text-delta",
        "text-delta",
        "usage",
        "agent-completed",
        "run-completed",
    ]
    assert effects == [("refund", ("A1", 84.0))]
    assert len(model.calls) == 2  # the approved call was not re-decided by the model
    model.assert_complete()

    state = await engine.session("s1")
    assert state.pending == {} and state.progress is None
    suspended_message = state.messages[1]
    assert suspended_message.tool_calls[0].status == "completed"
    assert suspended_message.tool_calls[0].result.data == {  # type: ignore[union-attr]
        "refund_id": "R-A1",
        "amount": 84.0,
    }
    assert [m.role for m in state.messages] == ["user", "assistant", "assistant"]
    card = cards(state)[0]
    assert (card.decision, card.decided_by, card.decided_at) == ("approve", "ana", 1_000.0)
    stored = await engine.store.load("s1")
    assert stored is not None and stored.status == "completed"


async def test_the_waiting_placeholder_is_replaced_before_any_model_sees_the_call():
    seen: list[str] = []

    def answer(request: ModelRequest) -> Any:
        if len(request.messages) == 1:
            return call("orders.refund", order_id="A1", amount=5)
        part = request.messages[1].tool_calls[0]
        seen.append(part.status)
        assert part.result is not None
        seen.append(part.result.model_text())
        return "done"

    engine = Engine(
        Agent("support", tools=TOOLS),
        runtime=Runtime(model=FunctionModel(answer), ids=sequential_ids()),
    )
    await suspended(engine)
    await engine.resolve("s1", "call_1", Approve())
    await events_of(engine.resume("s1"))
    assert seen == ["completed", '{"refund_id":"R-A1","amount":5.0}']


# -- the matrix: executor x gate x decision ------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "decision", "status", "model_reads", "ran"),
    [
        (call("orders.refund", order_id="A1", amount=5), Approve(), "completed", "R-A1", True),
        (
            call("orders.refund", order_id="A1", amount=5),
            Reject(reason="too much", by="ana"),
            "rejected",
            "rejected by ana and did not run. Reason: too much",
            False,
        ),
        (
            call("ask_size", question="S or M?"),
            Answer(output={"size": "M"}),
            "completed",
            "M",
            False,
        ),
        (  # a person asked for an answer declines: the model reads it so
            call("ask_size", question="S or M?"),
            Reject(reason="ask the customer", by="ana"),
            "rejected",
            "declined by ana and did not run. Reason: ask the customer",
            False,
        ),
        (
            call("open_tab", url="https://x"),
            ClientResult(output={"tab": 3}),
            "completed",
            '{"tab":3}',
            False,
        ),
        (
            call("open_tab", url="https://x"),
            ClientResult(output={"tab": "three"}),
            "failed",
            "does not match its output type",
            False,
        ),
        (
            call("open_tab", url="https://x"),
            ClientResult(error="popup blocked"),
            "failed",
            "The client could not run 'open_tab': popup blocked",
            False,
        ),
        (call("open_tab", url="https://x"), Reject(), "rejected", "rejected", False),
    ],
    ids=[
        "server-gated-approve",
        "server-gated-reject",
        "human-answer",
        "human-reject",
        "client-result",
        "client-invalid-result",
        "client-error",
        "client-reject",
    ],
)
async def test_each_executor_and_decision_settles_the_call(
    step: Any, decision: Any, status: str, model_reads: str, ran: bool
):
    engine, model = engine_for([[step], "ok"])
    await suspended(engine, client=True)
    await engine.resolve("s1", "call_1", decision)
    events = await events_of(engine.resume("s1", client=True))
    assert events[-1].type == "run-completed"
    part = call_parts(await engine.session("s1"))[0]
    assert part.status == status
    assert part.result is not None
    assert model_reads in part.result.model_text()
    assert bool(effects) == ran
    # The model read the settled result, not the placeholder.
    assert "No result yet" not in model.calls[-1].messages[1].tool_calls[0].result.model_text()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("step", "decision", "message"),
    [
        (
            call("orders.refund", order_id="A1", amount=5),
            Answer(output={}),
            "waits for a decision on its approval card, which is one of approve, reject; "
            "got 'answer'",
        ),
        (
            call("ask_size", question="?"),
            Approve(),
            "waits for a decision on its elicitation card, which is one of answer, reject; "
            "got 'approve'",
        ),
        (
            call("ask_size", question="?"),
            Answer(output={"colour": "red"}),
            "the answer is not valid",
        ),
        (
            call("open_tab", url="x"),
            Approve(),
            "waits for a decision on its client_exec card, which is one of client_result, reject",
        ),
    ],
)
async def test_a_decision_that_does_not_fit_changes_nothing(step: Any, decision: Any, message: str):
    engine, _ = engine_for([[step]])
    await suspended(engine, client=True)
    before = await engine.store.load("s1")
    with pytest.raises(InvalidDecisionError, match=message):
        await engine.resolve("s1", "call_1", decision)
    after = await engine.store.load("s1")
    assert after == before


async def test_a_gated_client_tool_suspends_twice_approval_then_the_client_result():
    engine, model = engine_for([[call("pay", amount=20)], "Paid."])
    first = await suspended(engine, client=True)
    assert [e.type for e in first if e.type.endswith("-required")] == ["approval-required"]
    await engine.resolve("s1", "call_1", Approve(amended_args=None))
    second = await events_of(engine.resume("s1", client=True))
    assert [e.type for e in second][-2:] == ["client-exec-required", "run-suspended"]
    state = await engine.session("s1")
    assert [c.kind for c in cards(state)] == ["approval", "client_exec"]
    assert list(state.pending) == ["call_1"]
    with pytest.raises(InvalidDecisionError):
        await engine.resolve("s1", "call_1", Approve())
    await engine.resolve("s1", "call_1", ClientResult(output={"tab": 1}))
    third = await events_of(engine.resume("s1", client=True))
    assert third[-1].type == "run-completed"
    assert call_parts(await engine.session("s1"))[0].result.data == {"tab": 1}  # type: ignore[union-attr]
    model.assert_complete()


async def test_an_approved_client_tool_resumed_by_a_worker_waits_for_the_client():
    engine, _ = engine_for([[call("pay", amount=20)], "Paid."])
    await suspended(engine, client=True)
    await engine.resolve("s1", "call_1", Approve())
    result = await engine.advance("s1")  # a worker: no client of its own
    assert result is not None and result.outcome == "suspended"
    state = await engine.session("s1")
    assert [c.kind for c in state.pending.values()] == ["client_exec"]
    await engine.resolve("s1", "call_1", ClientResult(output={"tab": 3}))
    result = await engine.advance("s1")
    assert result is not None and result.outcome == "completed"
    assert call_parts(await engine.session("s1"))[0].result.data == {"tab": 3}  # type: ignore[union-attr]


async def test_a_client_tool_with_no_client_connected_fails_fast():
    engine, _ = engine_for([[call("open_tab", url="x"), call("pay", amount=1)], "Sorry."])
    events = await events_of(engine.submit("s1", "go"))
    assert events[-1].type == "run-completed"
    errors = [e.error for e in events if e.type == "tool-call-completed"]
    assert errors == [
        "Tool 'open_tab' runs in the client, and no client is connected to run it. Tell the "
        "user to open the app (or do it another way).",
        "Tool 'pay' runs in the client, and no client is connected to run it. Tell the user "
        "to open the app (or do it another way).",
    ]


# -- amendments and digests ---------------------------------------------------------------------


async def test_an_amended_argument_runs_and_both_versions_are_recorded():
    engine, _ = engine_for([[call("orders.refund", order_id="A1", amount=84)], "Refunded 40."])
    await suspended(engine)
    await engine.resolve("s1", "call_1", Approve(amended_args={"amount": "40"}, by="ana"))
    state = await engine.session("s1")
    card = cards(state)[0]
    assert card.args == {"order_id": "A1", "amount": 84.0}
    assert card.amended_args == {"order_id": "A1", "amount": 40.0}
    assert card.args_digest is not None
    events = await events_of(engine.resume("s1"))
    started = next(e for e in events if e.type == "tool-call-started")
    assert started.args == {"order_id": "A1", "amount": 40.0}
    assert effects == [("refund", ("A1", 40.0))]


@pytest.mark.parametrize(
    ("amended", "message"),
    [
        ({"order_id": "B2"}, r"order_id cannot be amended \(amendable: amount\)"),
        ({"amount": "lots"}, "the amended arguments are not valid: invalid arguments:\n- amount"),
    ],
)
async def test_a_bad_amendment_is_refused_and_changes_nothing(amended: Any, message: str):
    engine, _ = engine_for([[call("orders.refund", order_id="A1", amount=84)]])
    await suspended(engine)
    before = await engine.store.load("s1")
    with pytest.raises(InvalidDecisionError, match=message):
        await engine.resolve("s1", "call_1", Approve(amended_args=amended))
    assert await engine.store.load("s1") == before


async def test_an_approved_call_whose_arguments_changed_refuses_to_run():
    store = MemoryStore()
    engine, _ = engine_for(
        [[call("orders.refund", order_id="A1", amount=5)], "Not done."], store=store
    )
    await suspended(engine)
    await engine.resolve("s1", "call_1", Approve())
    record = await store.load("s1")
    assert record is not None
    # Someone edits the stored call after the approval (a bug, a bad migration, an attacker).
    record.messages[1]["parts"][0]["args"]["amount"] = 5000
    await store.save(record)
    await events_of(engine.resume("s1"))
    part = call_parts(await engine.session("s1"))[0]
    assert effects == []
    assert part.status == "failed"
    assert "not the ones that were approved" in (part.result.error or "")  # type: ignore[union-attr]


async def test_revalidate_can_refuse_an_approved_call_against_the_state_of_now():
    stock = {"A1": 0}

    @tool(
        name="orders.ship", permission="write", revalidate=lambda ctx, args: _in_stock(stock, args)
    )
    def ship(order_id: str) -> str:
        """Ship an order."""
        effects.append(("ship", order_id))
        return "shipped"

    engine, _ = engine_for(
        [[call("orders.ship", order_id="A1")], "Out of stock."],
        agents=Agent("support", tools=[ship]),
    )
    await suspended(engine)
    await engine.resolve("s1", "call_1", Approve())
    await events_of(engine.resume("s1"))
    part = call_parts(await engine.session("s1"))[0]
    assert effects == []
    assert part.result.error == "A1 is out of stock now"  # type: ignore[union-attr]


def _in_stock(stock: dict[str, int], args: dict[str, Any]) -> None:
    from handrail import ModelRetry

    if stock[args["order_id"]] <= 0:
        raise ModelRetry(f"{args['order_id']} is out of stock now")


# -- stale and out-of-order resolutions ---------------------------------------------------------


async def test_unknown_duplicate_and_late_resolutions_are_stale_and_change_nothing():
    engine, _ = engine_for([[call("orders.refund", order_id="A1", amount=5)], "ok"])
    await suspended(engine)
    with pytest.raises(StaleResolutionError, match=r"No pending call 'nope' .*pending: call_1"):
        await engine.resolve("s1", "nope", Approve())
    await engine.resolve("s1", "call_1", Approve(by="ana"))
    before = await engine.store.load("s1")
    with pytest.raises(StaleResolutionError, match=r"already decided \(approve by ana\)"):
        await engine.resolve("s1", "call_1", Reject())
    assert await engine.store.load("s1") == before
    await events_of(engine.resume("s1"))
    with pytest.raises(StaleResolutionError):
        await engine.resolve("s1", "call_1", Approve())
    assert effects == [("refund", ("A1", 5.0))]


async def test_a_batch_is_recorded_whole_or_not_at_all():
    engine, _ = engine_for(
        [[call("orders.refund", order_id="A1", amount=5), call("ask_size", question="?")], "ok"]
    )
    await suspended(engine)
    before = await engine.store.load("s1")
    with pytest.raises(InvalidDecisionError):
        await engine.resolve_many("s1", {"call_1": Approve(), "call_2": Approve()})
    assert await engine.store.load("s1") == before
    resolution = await engine.resolve_many(
        "s1", {"call_1": Approve(), "call_2": Answer(output={"size": "S"})}
    )
    assert resolution.ready
    assert (await events_of(engine.resume("s1")))[-1].type == "run-completed"


async def test_resuming_too_early_twice_or_past_a_pending_call_is_refused():
    engine, _ = engine_for(
        [[call("orders.refund", order_id="A1", amount=5), call("ask_size", question="?")], "ok"]
    )
    with pytest.raises(UserError, match="no suspended turn"):
        await events_of(engine.resume("s1"))
    await suspended(engine)
    await engine.resolve("s1", "call_1", Approve())
    with pytest.raises(UserError, match="still waiting for a decision on call_2"):
        await events_of(engine.resume("s1"))
    with pytest.raises(UserError, match="suspended, waiting on call_2"):
        await events_of(engine.submit("s1", "hello?"))
    await engine.resolve("s1", "call_2", Answer(output={"size": "S"}))
    await events_of(engine.resume("s1"))
    with pytest.raises(UserError, match="no suspended turn"):
        await events_of(engine.resume("s1"))
    assert effects == [("refund", ("A1", 5.0))]


async def test_a_second_worker_cannot_resume_a_turn_another_worker_drives():
    store = MemoryStore()
    first, _ = engine_for([[call("orders.refund", order_id="A1", amount=5)], "ok"], store=store)
    second, _ = engine_for(["unused"], store=store)
    await suspended(first)
    await first.resolve("s1", "call_1", Approve())
    assert await store.acquire_lease("s1", "worker-elsewhere", 60)  # another worker drives it
    with pytest.raises(SessionBusyError, match="being driven by another worker"):
        await events_of(second.resume("s1"))
    assert effects == []
    await store.release_lease("s1", "worker-elsewhere")
    assert (await events_of(second.resume("s1")))[-1].type == "run-completed"
    assert effects == [("refund", ("A1", 5.0))]


async def test_another_tenants_session_is_not_found():
    engine, _ = engine_for([[call("orders.refund", order_id="A1", amount=5)]])
    await suspended(engine, org_id="acme", user_id="u1")
    with pytest.raises(SessionNotFoundError):
        await engine.resolve("s1", "call_1", Approve(), org_id="evil", user_id="u1")
    with pytest.raises(SessionNotFoundError):
        await engine.session("s1", org_id="acme", user_id="u2")
    await engine.resolve("s1", "call_1", Approve(), org_id="acme", user_id="u1")


# -- several calls, several agents ----------------------------------------------------------------


async def test_ungated_calls_of_the_same_response_run_while_the_gated_one_waits():
    engine, _ = engine_for(
        [
            [
                call("orders.lookup", order_id="A1"),
                call("orders.refund", order_id="A1", amount=5),
                call("orders.lookup", order_id="A2"),
            ],
            "ok",
        ]
    )
    events = await suspended(engine)
    assert effects == [("lookup", "A1"), ("lookup", "A2")] or sorted(effects) == [
        ("lookup", "A1"),
        ("lookup", "A2"),
    ]
    assert events[-1].pending == ["call_2"]
    statuses = [p.status for p in call_parts(await engine.session("s1"))]
    assert statuses == ["completed", "waiting", "completed"]


async def test_a_turn_suspended_in_the_second_agent_of_a_route_resumes_there():
    planner = Agent("planner")
    executor = Agent("executor", tools=TOOLS)
    responder = Agent("responder")
    domain = Domain(
        agents=[planner, executor, responder],
        routes={"action": ["planner", "executor", "responder"]},
    )
    engine, model = engine_for(
        [
            "Plan: refund A1.",
            [call("orders.refund", order_id="A1", amount=5)],
            "Refund issued.",
            "Your refund of 5 is on its way.",
        ],
        agents=domain,
    )
    events = await suspended(engine)
    assert [e.agent for e in events if e.type == "agent-started"] == ["planner", "executor"]
    (asked,) = [e for e in events if e.type == "approval-required"]
    assert asked.agent == "executor"  # the agent that proposed the call, not the route's first
    state = await engine.session("s1")
    assert state.pending["call_1"].agent == "executor"
    assert state.progress is not None
    assert (state.progress.agent, state.progress.step, state.progress.route) == (
        "executor",
        1,
        ["planner", "executor", "responder"],
    )
    await engine.resolve("s1", "call_1", Approve())
    resumed = await events_of(engine.resume("s1"))
    assert [e.agent for e in resumed if e.type == "agent-started"] == ["executor", "responder"]
    assert resumed[-1].output == "Your refund of 5 is on its way."
    model.assert_complete()


# -- expiry and caps ------------------------------------------------------------------------------


async def test_an_expired_call_is_stale_then_swept_into_an_error_the_model_recovers_from():
    clock = Clock()
    engine, model = engine_for(
        [[call("orders.refund", order_id="A1", amount=5)], "The refund is still to be approved."],
        clock=clock,
        pending_ttl=60,
    )
    await suspended(engine)
    card = (await engine.session("s1")).pending["call_1"]
    assert card.expires_at == 1_060.0
    stored = await engine.store.load("s1")
    assert stored is not None and stored.expires_at == 1_060.0
    assert await engine.expire_due() == []  # not yet
    clock.now = 1_060.0
    with pytest.raises(StaleResolutionError, match="expired"):
        await engine.resolve("s1", "call_1", Approve())
    assert await engine.expire_due() == ["s1"]
    assert await engine.expire_due() == []
    events = await events_of(engine.resume("s1"))
    assert events[-1].type == "run-completed"
    part = call_parts(await engine.session("s1"))[0]
    assert part.status == "failed"
    assert "Nobody decided on this call before its deadline" in (part.result.error or "")  # type: ignore[union-attr]
    assert effects == []
    model.assert_complete()


async def test_every_waiting_card_has_a_deadline_by_default_and_a_sweep_expires_it():
    clock = Clock()
    engine, model = engine_for(
        [
            [
                call("orders.refund", order_id="A1", amount=5),
                call("ask_size", question="?"),
                call("open_tab", url="https://x"),
            ],
            "Nothing was done in time.",
        ],
        clock=clock,
    )
    await suspended(engine, client=True)
    deadlines = {c.kind: c.expires_at for c in (await engine.session("s1")).pending.values()}
    day, quarter = 24 * 3600, 15 * 60
    assert deadlines == {
        "approval": 1_000.0 + day,
        "elicitation": 1_000.0 + day,
        "client_exec": 1_000.0 + quarter,
    }
    clock.now = 1_000.0 + quarter
    assert await engine.expire_due() == ["s1"]  # the client call only
    assert [c.kind for c in (await engine.session("s1")).pending.values()] == [
        "approval",
        "elicitation",
    ]
    clock.now = 1_000.0 + day
    assert await engine.expire_due() == ["s1"]
    events = await events_of(engine.resume("s1"))
    assert events[-1].type == "run-completed"
    parts = call_parts(await engine.session("s1"))
    assert [p.status for p in parts] == ["failed", "failed", "failed"]
    errors = [p.result.error or "" for p in parts]  # type: ignore[union-attr]
    assert all("Nobody decided on this call before its deadline" in e for e in errors[:2])
    assert "The app was closed before it could run 'open_tab'" in errors[2]
    assert effects == []
    model.assert_complete()


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("tool", None),  # the tool's own None wins over everything
        ("agent", 1_030.0),
        ("domain", 1_045.0),
        ("runtime", 1_007.0),
    ],
)
async def test_a_deadline_is_set_by_the_tool_the_agent_the_domain_or_the_runtime(
    where: str, expected: float | None
):
    forever = tool(name="orders.refund", permission="write", expires_after=None)(refund.function)
    tools = [forever if where == "tool" else refund]
    kwargs: dict[str, Any] = {}
    if where in ("tool", "agent"):
        kwargs["expires_after"] = 30
    agent = Agent("support", tools=tools, **kwargs)
    domain = Domain(
        agents=[agent],
        **({"expires_after": Deadlines(approval=45)} if where != "runtime" else {}),
    )
    engine, _ = engine_for(
        [[call("orders.refund", order_id="A1", amount=5)]],
        agents=domain,
        pending_ttl=Deadlines(approval=7),
    )
    await suspended(engine)
    card = (await engine.session("s1")).pending["call_1"]
    assert card.expires_at == expected


def test_no_deadline_is_only_had_by_asking_for_none():
    assert Runtime(pending_ttl=None).pending_ttl is None
    with pytest.raises(UserError, match=r"expires_after: give a positive number of seconds"):
        Agent("support", expires_after=0)
    with pytest.raises(UserError, match=r"pending_ttl=...\): give a positive number"):
        Runtime(pending_ttl=-1)


async def test_one_model_numbers_its_calls_per_session():
    def refund_each_time(request: ModelRequest) -> Any:
        return [
            call("orders.lookup", order_id="A1"),
            call("orders.refund", order_id="A1", amount=5),
        ]

    model = FunctionModel(refund_each_time)
    engine = Engine(
        Agent("support", tools=TOOLS), store=MemoryStore(), runtime=Runtime(model=model)
    )
    for session in ("s1", "s2"):  # a fresh session's first card is not call_4
        events = await events_of(engine.submit(session, "refund A1"))
        assert events[-1].pending == ["call_2"]
        assert [p.id for p in call_parts(await engine.session(session))] == ["call_1", "call_2"]


async def test_past_max_approvals_further_gated_calls_are_told_to_stop():
    engine, _ = engine_for(
        [
            [
                call("orders.refund", order_id="A1", amount=1),
                call("orders.refund", order_id="A2", amount=2),
            ]
        ],
        max_approvals_per_turn=1,
    )
    events = await suspended(engine)
    assert events[-1].pending == ["call_1"]
    second = call_parts(await engine.session("s1"))[1]
    assert second.status == "failed"
    assert "Stop calling tools that need approval" in (second.result.error or "")  # type: ignore[union-attr]


# -- durability of the stored form ----------------------------------------------------------------


async def test_a_reloaded_session_keeps_every_card_decision_and_digest():
    store = MemoryStore()
    engine, _ = engine_for(
        [[call("orders.refund", order_id="A1", amount=9), call("ask_size", question="?")], "ok"],
        store=store,
    )
    await suspended(engine)
    await engine.resolve("s1", "call_1", Approve(amended_args={"amount": 3}, by="ana"))
    exported = json.dumps((await engine.session("s1")).dump())
    reloaded = RunState.load(json.loads(exported))
    assert reloaded.dump() == (await engine.session("s1")).dump()
    assert list(reloaded.pending) == ["call_2"]
    card = cards(reloaded)[0]
    assert (card.decision, card.decided_by, card.amended_args["amount"]) == ("approve", "ana", 3)  # type: ignore[index]
    assert card.args_digest is not None

    # A new process: a fresh engine on the same store finishes the turn.
    restarted, _ = engine_for(["ok"], store=store)
    await restarted.resolve("s1", "call_2", Answer(output={"size": "L"}))
    assert (await events_of(restarted.resume("s1")))[-1].type == "run-completed"
    assert effects == [("refund", ("A1", 3.0))]


async def test_a_state_from_a_newer_handrail_is_refused():
    with pytest.raises(UserError, match="schema_version=99"):
        RunState.load({"schema_version": 99})


# -- deploys, races and edge cases -----------------------------------------------------------------


async def test_a_call_whose_tool_was_removed_by_a_deploy_can_only_be_rejected():
    store = MemoryStore()
    before, _ = engine_for(
        [[call("orders.refund", order_id="A1", amount=5), call("ask_size", question="?")]],
        store=store,
    )
    await suspended(before)
    await before.resolve("s1", "call_2", Answer(output={"size": "M"}))
    after, _ = engine_for(["Sorry."], store=store, agents=Agent("support", tools=[lookup]))
    with pytest.raises(InvalidDecisionError, match="no longer has: reject it"):
        await after.resolve("s1", "call_1", Approve())
    await after.resolve("s1", "call_1", Reject(reason="tool gone"))
    assert (await events_of(after.resume("s1")))[-1].type == "run-completed"
    first, second = call_parts(await after.session("s1"))
    assert first.status == "rejected"
    assert second.status == "failed"
    assert "Tool 'ask_size' no longer exists" in (second.result.error or "")  # type: ignore[union-attr]
    assert effects == []


async def test_a_turn_suspended_in_an_agent_that_is_gone_cannot_resume():
    store = MemoryStore()
    before, _ = engine_for([[call("orders.refund", order_id="A1", amount=5)]], store=store)
    await suspended(before)
    await before.resolve("s1", "call_1", Approve())
    after, _ = engine_for([], store=store, agents=Agent("other"))
    with pytest.raises(UserError, match="agent\\(s\\) 'support', which this engine's domain"):
        await events_of(after.resume("s1"))
    assert effects == []


async def test_an_approved_call_whose_binding_no_longer_resolves_does_not_run():
    @tool(name="cart.checkout", permission="write", bindings={"cart": "var:cart"})
    def checkout(cart: dict[str, Any], note: str) -> str:
        """Check the cart out."""
        effects.append(("checkout", cart))
        return "ok"

    engine, _ = engine_for(
        [[call("cart.checkout", note="asap")], "Could not."],
        agents=Agent("support", tools=[checkout]),
    )
    state = RunState()
    state.context.set("var:cart", {"id": "c1"})
    record = await engine.store.save(
        SessionRecord(id="s1", data=state.dump())  # a session that has a cart
    )
    assert record.version == 1
    await suspended(engine)
    # While the call waits, the cart is emptied out of the session.
    saved = await engine.store.load("s1")
    assert saved is not None
    saved.data["context"]["vars"] = {}
    await engine.store.save(saved)
    await engine.resolve("s1", "call_1", Approve())
    await events_of(engine.resume("s1"))
    part = call_parts(await engine.session("s1"))[0]
    assert effects == []
    assert "the approved call no longer holds" in (part.result.error or "")  # type: ignore[union-attr]


async def test_a_decision_racing_another_workers_save_is_decided_again_on_the_new_state():
    class RacingStore(MemoryStore):
        """Before the first save after `race` is armed, another worker saves first."""

        race = False

        async def save(self, record: SessionRecord) -> SessionRecord:
            if self.race:
                self.race = False
                other = await self.load(record.id)
                assert other is not None
                await super().save(other)  # the other worker's (unrelated) change lands first
            return await super().save(record)

    store = RacingStore()
    engine, _ = engine_for(
        [[call("orders.refund", order_id="A1", amount=5), call("ask_size", question="?")], "ok"],
        store=store,
    )
    await suspended(engine)
    before = await store.load("s1")
    assert before is not None
    store.race = True
    resolution = await engine.resolve("s1", "call_1", Approve(amended_args={"amount": "4"}))
    assert resolution.pending == ["call_2"]
    record = await store.load("s1")
    assert record is not None and record.version == before.version + 2  # the other, then this
    card = cards(await engine.session("s1"))[0]
    assert card.amended_args == {"order_id": "A1", "amount": 4.0}


def test_the_approval_digest_ignores_key_order_but_not_values():
    from handrail.suspension import args_digest

    one = args_digest("t", {"b": [{"y": 1, "x": 2}], "a": 1})
    assert one == args_digest("t", {"a": 1, "b": [{"x": 2, "y": 1}]})
    assert one != args_digest("t", {"a": 1, "b": [{"x": 2, "y": 2}]})
    assert one != args_digest("u", {"a": 1, "b": [{"x": 2, "y": 1}]})


async def test_resolve_many_needs_a_decision():
    engine, _ = engine_for([])
    with pytest.raises(UserError, match="at least one decision"):
        await engine.resolve_many("s1", {})
    with pytest.raises(SessionNotFoundError):
        await engine.resolve("nope", "call_1", Approve())


# -- a call starts once; reuse ends at a side effect (memory and SQLite, across a reload) -------


@pytest.fixture(params=["memory", "sqlite"])
async def reopen(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """Opens the session store as a new process would: the same data, a new store object."""
    from handrail.store import SqliteStore

    opened: list[Any] = []
    memory = MemoryStore()

    def open_store() -> Any:
        if request.param == "memory":
            return memory
        store = SqliteStore(tmp_path / "sessions.db")
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        await store.close()


def engine_on(store: Any, steps: list[Any]) -> tuple[Engine, ScriptedModel]:
    model = ScriptedModel(steps)
    runtime = Runtime(model=model, ids=sequential_ids(), clock=Clock())
    return Engine(Agent("support", tools=TOOLS), store=store, runtime=runtime), model


@pytest.mark.parametrize("decision", ["approve", "reject"])
async def test_a_gated_call_starts_once_and_only_when_it_runs(reopen: Any, decision: str):
    steps = [[call("orders.refund", order_id="A1", amount=84)], "Done."]
    engine, _ = engine_on(reopen(), steps)
    first = await suspended(engine)
    assert "tool-call-started" not in [e.type for e in first]

    engine, _ = engine_on(reopen(), steps[1:])  # a restart between suspension and decision
    chosen = Approve(by="ana") if decision == "approve" else Reject(reason="no", by="ana")
    await engine.resolve("s1", "call_1", chosen)
    resumed = await events_of(engine.resume("s1"))
    started = [e for e in resumed if e.type == "tool-call-started"]
    completed = [e for e in resumed if e.type == "tool-call-completed"]
    if decision == "approve":
        assert [(e.tool_call_id, e.args) for e in started] == [
            ("call_1", {"order_id": "A1", "amount": 84.0})
        ]
        assert effects == [("refund", ("A1", 84.0))]
    else:
        assert started == []  # it never ran, so it never started
        assert effects == []
    assert [e.tool_call_id for e in completed] == ["call_1"]


async def test_a_read_after_an_approved_write_runs_again_across_a_reload(reopen: Any):
    steps = [
        [call("orders.lookup", order_id="A1")],
        # Nothing in between: A1 is reused (and A2, new, runs: the model is not told to stop).
        [call("orders.lookup", order_id="A1"), call("orders.lookup", order_id="A2")],
        [call("orders.refund", order_id="A1", amount=84)],
        [call("orders.lookup", order_id="A1")],  # after the refund: runs again
        "Refunded.",
    ]
    engine, _ = engine_on(reopen(), steps)
    await suspended(engine)
    assert effects == [("lookup", "A1"), ("lookup", "A2")]
    engine, _ = engine_on(reopen(), steps[3:])
    await engine.resolve("s1", "call_4", Approve())
    await events_of(engine.resume("s1"))
    assert effects[2:] == [("refund", ("A1", 84.0)), ("lookup", "A1")]
    parts = call_parts(await engine.session("s1"))
    assert [p.reused_from for p in parts] == [None, "call_1", None, None, None]


# -- a tool that asks a person mid-call (AskPerson) -----------------------------------------


@tool(name="policy.answer")
def policy_answer(ctx: ToolContext[None], question: str) -> dict[str, Any]:
    """Answer a policy question, or ask a person when unsure."""
    effects.append(("policy.answer", (question, ctx.answer, ctx.answered_by)))
    if ctx.answer is None:
        raise AskPerson(f"Nobody wrote down the answer to {question!r}: do you know it?")
    return {"answer": ctx.answer, "by": ctx.answered_by}


def asking_engine(store: Any, steps: list[Any]) -> Engine:
    runtime = Runtime(model=ScriptedModel(steps), ids=sequential_ids(), clock=Clock())
    return Engine(Agent("support", tools=[policy_answer, lookup]), store=store, runtime=runtime)


async def test_a_tool_that_asks_a_person_waits_and_runs_again_with_the_answer(reopen: Any):
    steps = [
        [call("policy.answer", question="pets?"), call("orders.lookup", order_id="A1")],
        "Pets are welcome.",
    ]
    engine = asking_engine(reopen(), steps)
    first = await suspended(engine)
    types = [e.type for e in first]
    assert types.count("tool-call-started") == 2  # it ran, and asked
    asked = next(e for e in first if e.type == "input-required")
    assert asked.tool_call_id == "call_1" and asked.output_schema == {"type": "string"}
    assert asked.prompt == "Nobody wrote down the answer to 'pets?': do you know it?"
    assert effects == [("policy.answer", ("pets?", None, None)), ("lookup", "A1")]
    state = await engine.session("s1")
    (card,) = state.pending.values()
    assert (card.kind, card.executor) == ("question", "server")

    engine = asking_engine(reopen(), steps[1:])  # a restart while it waits
    with pytest.raises(InvalidDecisionError, match="answer it with text"):
        await engine.resolve("s1", "call_1", Answer(output={"answer": "yes"}))
    await engine.resolve("s1", "call_1", Answer(output="Yes, on a lead.", by="ana"))
    resumed = await events_of(engine.resume("s1"))
    assert "tool-call-started" not in [e.type for e in resumed]  # a call starts once
    (done,) = [e for e in resumed if e.type == "tool-call-completed"]
    assert (done.tool_call_id, done.ok) == ("call_1", True)
    assert effects[-1] == ("policy.answer", ("pets?", "Yes, on a lead.", "ana"))
    assert resumed[-1].type == "run-completed"
    state = await engine.session("s1")
    (part,) = [p for p in call_parts(state) if p.id == "call_1"]
    assert part.status == "completed"
    assert part.result is not None and part.result.data == {
        "answer": "Yes, on a lead.",
        "by": "ana",
    }


async def test_a_declined_question_fails_the_call_with_the_reason_for_the_model(reopen: Any):
    engine = asking_engine(reopen(), [[call("policy.answer", question="pets?")], "Sorry."])
    await suspended(engine)
    await engine.resolve("s1", "call_1", Reject(reason="not my area", by="bo"))
    resumed = await events_of(engine.resume("s1"))
    (done,) = [e for e in resumed if e.type == "tool-call-completed"]
    assert not done.ok
    state = await engine.session("s1")
    (part,) = call_parts(state)
    assert part.result is not None and part.result.error is not None
    assert "declined to answer: not my area" in part.result.error
    assert len([e for e in effects if e[0] == "policy.answer"]) == 1  # it did not run again


def test_ask_person_needs_a_question() -> None:
    with pytest.raises(TypeError, match="needs the question"):
        AskPerson("  ")


# -- decisions as people write them ---------------------------------------------------------


def test_a_decisions_first_field_is_positional_and_the_rest_are_keywords():
    from handrail import DECISION, Answer, Approve, ClientResult, Reject

    assert Answer("size M", by="ana") == Answer(output="size M", by="ana")
    assert Reject("too expensive") == Reject(reason="too expensive")
    assert Approve({"amount": 40}) == Approve(amended_args={"amount": 40})
    assert ClientResult({"ok": True}) == ClientResult(output={"ok": True})
    assert Reject() == Reject(reason=None) and Approve() == Approve(amended_args=None)
    with pytest.raises(TypeError):
        Answer("size M", "ana")  # type: ignore[misc]  # who decided is always by=
    # The JSON form is unchanged.
    assert DECISION.validate_json('{"decision": "answer", "output": "M", "by": "ana"}') == (
        Answer("M", by="ana")
    )
    assert json.loads(DECISION.dump_json(Reject("no"))) == {
        "decision": "reject",
        "reason": "no",
        "by": None,
        "via": None,
        "digest": None,
    }
