"""Capture mode, apply, batch approval and Engine.run_headless, through the public API."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from handrail import (
    ActionChoice,
    Agent,
    Approve,
    CapturedAction,
    Decider,
    Domain,
    Engine,
    InvalidDecisionError,
    Reject,
    Runtime,
    StaleResolutionError,
    UserError,
    apply,
    temp_id,
    tool,
)
from handrail.capture import substitute, unresolved
from handrail.store import MemoryStore
from handrail.testing import ScriptedModel, call

RAN: list[tuple[str, dict[str, Any]]] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


@tool(name="orders.lookup")
def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    RAN.append(("orders.lookup", {"order_id": order_id}))
    return {"order_id": order_id, "status": "delivered"}


@tool(
    name="orders.create",
    permission="write",
    amendable=["quantity"],
    mint=lambda args, i: {"order_id": temp_id(i), "item": args["item"]},
)
def create(item: str, quantity: int = 1) -> dict[str, Any]:
    """Create an order."""
    RAN.append(("orders.create", {"item": item, "quantity": quantity}))
    return {"order_id": f"ORD-{len(RAN)}", "item": item}


@tool(
    name="orders.add_note",
    permission="write",
    amendable=["note"],
    mint=lambda args, i: {"note_id": temp_id(i), "order_id": args["order_id"]},
)
def add_note(order_id: str, note: str, links: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """Add a note to an order."""
    RAN.append(("orders.add_note", {"order_id": order_id, "note": note, "links": links}))
    if order_id.startswith("BAD"):
        raise ValueError(f"no order {order_id}")
    return {"note_id": f"N-{len(RAN)}", "order_id": order_id}


@tool(name="orders.cancel", permission="destructive")
def cancel(order_id: str) -> str:
    """Cancel an order (no mint: it cannot be captured)."""
    RAN.append(("orders.cancel", {"order_id": order_id}))
    return "cancelled"


@tool(name="ask.person", executor="human")
def ask(question: str) -> str:
    """Ask a person."""
    raise AssertionError("never called")


TOOLS = [lookup, create, add_note, cancel, ask]


def chained_model() -> ScriptedModel:
    return ScriptedModel(
        [
            [call("orders.lookup", order_id="A1")],
            [call("orders.create", item="mug")],
            [
                call(
                    "orders.add_note",
                    order_id="temp_0",
                    note="gift for temp_0",
                    links=[{"order": "temp_0"}],
                )
            ],
            "Ordered a mug and noted it.",
        ]
    )


def engine_for(model: ScriptedModel, **kwargs: Any) -> Engine:
    agent = Agent("clerk", tools=TOOLS, model=model)
    return Engine(agent, store=kwargs.pop("store", MemoryStore()), **kwargs)


async def test_a_headless_turn_captures_gated_calls_and_runs_the_read_only_ones() -> None:
    model = chained_model()
    result = await engine_for(model).run_headless("s1", "Order a mug for A1 and note it")

    assert result.outcome == "completed"
    assert result.text == "Ordered a mug and noted it."
    assert RAN == [("orders.lookup", {"order_id": "A1"})]  # only the read ran
    assert [(a.tool, a.local_index, a.status) for a in result.actions] == [
        ("orders.create", 0, "captured"),
        ("orders.add_note", 1, "captured"),
    ]
    assert result.actions[0].predicted_output == {"order_id": "temp_0", "item": "mug"}
    assert result.actions[1].args["order_id"] == "temp_0"
    # The model saw the prediction, so it could chain on the temporary id.
    seen = model.calls[2].messages[-1].parts[0]
    assert seen.result.data == {"order_id": "temp_0", "item": "mug"}  # type: ignore[union-attr]
    assert [e.type for e in result.events][-1] == "run-completed"


async def test_local_indexes_grow_across_agents_iterations_and_turns() -> None:
    first = Agent(
        "first",
        tools=[create],
        model=ScriptedModel([[call("orders.create", item="a")], "one"] * 2),
        scratch=True,
    )
    second = Agent(
        "second",
        tools=[create],
        model=ScriptedModel(
            [[call("orders.create", item="b")], [call("orders.create", item="c")], "two"] * 2
        ),
    )
    engine = Engine(Domain(agents=[first, second], routes={"both": ["first", "second"]}))
    one = await engine.run_headless("s1", "go")
    assert [a.local_index for a in one.actions] == [0, 1, 2]
    assert [a.predicted_output["order_id"] for a in one.actions] == ["temp_0", "temp_1", "temp_2"]
    two = await engine.run_headless("s1", "again")
    assert [a.local_index for a in two.actions] == [3, 4, 5]  # never reused in a session


async def test_a_gated_tool_without_mint_is_captured_with_an_opaque_placeholder() -> None:
    model = ScriptedModel(
        [
            [call("orders.cancel", order_id="A1"), call("ask.person", question="?")],
            [call("orders.add_note", order_id="A1", note="cancel ref temp_0")],
            "Proposed cancelling A1.",
        ]
    )
    result = await engine_for(model).run_headless("s1", "cancel A1", propose=True)
    assert result.outcome == "suspended" and result.card is not None  # queued on the card
    assert [(a.tool, a.local_index, a.predicted_output) for a in result.actions] == [
        ("orders.cancel", 0, "temp_0"),
        ("orders.add_note", 1, {"note_id": "temp_1", "order_id": "A1"}),
    ]
    assert RAN == []
    cancelled, asked = model.calls[1].messages[-1].parts
    seen = cancelled.result.model_text()  # type: ignore[union-attr]
    assert seen.startswith("Proposed, not done yet: queued for approval as action 0")
    assert "temp_0 (a placeholder for the whole output, unknown until it runs" in seen
    assert "headless run (capture mode) with nobody to ask" in asked.result.error  # type: ignore[union-attr,operator]

    report = await apply(result.actions, TOOLS)
    assert report.ok and report.ids["temp_0"] == "cancelled"
    assert RAN[0] == ("orders.cancel", {"order_id": "A1"})
    assert RAN[1][1]["note"] == "cancel ref cancelled"  # the placeholder chained on


async def test_the_model_reads_a_captured_call_as_a_proposal_not_a_result() -> None:
    model = chained_model()
    await engine_for(model).run_headless("s1", "Order a mug for A1 and note it")
    created = model.calls[2].messages[-1].parts[0].result  # type: ignore[union-attr]
    assert created.data == {"order_id": "temp_0", "item": "mug"}  # type: ignore[union-attr]
    assert created.model_text() == (  # type: ignore[union-attr]
        "Proposed, not done yet: queued for approval as action 0 of this run's batch; nothing "
        "has run, and it runs only if the batch is applied (a person may skip it), so do not "
        'say it is done: say it is proposed. Predicted result: {"order_id":"temp_0","item":"mug"}'
    )


@pytest.mark.parametrize("propose", [False, True])
async def test_with_or_without_a_batch_card_a_captured_call_reads_as_proposed(
    propose: bool,
) -> None:
    model = ScriptedModel(
        [[call("orders.cancel", order_id="A1"), call("orders.create", item="mug")], "Proposed."]
    )
    result = await engine_for(model).run_headless("s1", "cancel A1, order a mug", propose=propose)
    assert (result.card is not None) is propose and RAN == []
    cancelled, created = model.calls[1].messages[-1].parts
    for index, part in enumerate([cancelled, created]):
        seen = part.result.model_text()  # type: ignore[union-attr]
        assert seen.startswith(f"Proposed, not done yet: queued for approval as action {index}")
        assert "do not say it is done: say it is proposed" in seen


async def test_an_applied_batch_tells_the_history_and_the_next_turn_what_really_happened() -> None:
    model = ScriptedModel(
        [
            [call("orders.create", item="mug")],
            [call("orders.add_note", order_id="temp_0", note="gift")],
            "Proposed: order a mug, and note it.",
            "Your mug is ordered as ORD-1; the note was skipped.",
        ]
    )
    engine = engine_for(model)
    card_id = (await engine.run_headless("s1", "go", propose=True)).card
    assert card_id is not None
    await engine.resolve(
        "s1",
        card_id,
        Approve(by="bo", actions={1: ActionChoice(approve=False, reason="no note")}),
    )
    events = [e async for e in engine.resume("s1")]
    assert events[-1].output == "Applied 1 of 2 action(s); skipped: action 1 (orders.add_note)."
    state = await engine.session("s1")
    told = state.messages[-1]
    assert told.role == "system"
    assert told.text.splitlines() == [
        f"Batch {card_id} was decided: 1 of 2 action(s) applied. What really happened (the "
        f"calls proposed earlier did not run then; their predicted results were not results):",
        '- action 0 (orders.create): applied; real output: {"item": "mug", "order_id": "ORD-1"}',
        "- action 1 (orders.add_note): skipped, not done (no note)",
        "Temporary ids now stand for: temp_0 = ORD-1.",
    ]

    async for _ in engine.submit("s1", "What happened?"):
        pass
    assert any(m.text == told.text for m in model.calls[-1].messages)  # the next turn reads it


async def test_a_batch_a_worker_applies_logs_its_events_with_its_saves() -> None:
    # The apply's first save carries `run-started`, its last `run-completed`: the worker's
    # drive (`Engine.advance`) keeps them in the event log, in order, each once.
    model = ScriptedModel(
        [[call("orders.create", item="mug")], [call("orders.cancel", order_id="A1")], "Proposed."]
    )
    appends: list[int] = []

    class Counting(MemoryStore):
        async def append_events(self, session_id: str, events: list[dict[str, Any]]) -> int:
            appends.append(len(events))
            return await super().append_events(session_id, events)

    store = Counting()
    engine = engine_for(model, store=store)
    card_id = (await engine.run_headless("s1", "go", propose=True)).card
    assert card_id is not None
    await engine.resolve("s1", card_id, Approve(by="bo"))
    before = len(await store.events("s1"))
    result = await engine.advance("s1")
    assert result is not None and result.output == "Applied 2 of 2 action(s)."
    logged = await store.events("s1", after=before)
    assert [seq for seq, _ in logged] == list(range(before + 1, before + 1 + len(logged)))
    assert [event["type"] for _, event in logged] == [
        "run-started",
        "tool-call-completed",
        "tool-call-completed",
        "run-completed",
    ]
    assert appends == []  # none on its own: the apply's two saves carried them all


def _calls(model: ScriptedModel) -> list[str]:
    return [p.result.error for p in model.calls[1].messages[-1].parts]  # type: ignore[union-attr]


async def test_apply_runs_the_actions_in_order_with_real_ids_substituted_everywhere() -> None:
    result = await engine_for(chained_model()).run_headless("s1", "go")
    RAN.clear()
    report = await apply(result.actions, TOOLS)

    assert report.ok and not report.not_run and report.failed is None
    assert report.ids == {"temp_0": "ORD-1", "temp_1": "N-2"}
    assert RAN == [
        ("orders.create", {"item": "mug", "quantity": 1}),
        (
            "orders.add_note",
            {"order_id": "ORD-1", "note": "gift for ORD-1", "links": [{"order": "ORD-1"}]},
        ),
    ]
    assert [a.status for a in report.actions] == ["applied", "applied"]
    assert report.actions[1].output == {"note_id": "N-2", "order_id": "ORD-1"}

    again = await apply(report.actions, TOOLS)  # idempotent: nothing left to run
    assert again.ok and len(RAN) == 2


async def test_apply_stops_at_the_first_failure_and_applying_again_runs_only_the_rest() -> None:
    actions = [
        CapturedAction(tool="orders.create", args={"item": "a"}, local_index=0,
                       predicted_output={"order_id": "temp_0"}),
        CapturedAction(tool="orders.add_note", args={"order_id": "BAD", "note": "x"},
                       local_index=1, predicted_output={"note_id": "temp_1"}),
        CapturedAction(tool="orders.add_note", args={"order_id": "temp_0", "note": "y"},
                       local_index=2, predicted_output={"note_id": "temp_2"}),
    ]  # fmt: skip
    report = await apply(actions, TOOLS)
    assert [a.status for a in report.actions] == ["applied", "failed", "captured"]
    assert report.failed is not None and "ValueError: no order BAD" in (report.failed.error or "")
    assert [a.local_index for a in report.not_run] == [2]
    assert len(RAN) == 2

    report.actions[1].args["order_id"] = "temp_0"  # a person fixes the failed action
    RAN.clear()
    again = await apply(report.actions, TOOLS)
    assert again.ok
    assert [name for name, _ in RAN] == ["orders.add_note", "orders.add_note"]  # not create
    assert RAN[0][1]["order_id"] == "ORD-1"


async def test_apply_refuses_an_action_whose_temp_id_nothing_produced() -> None:
    actions = [
        CapturedAction(tool="orders.create", args={"item": "a"}, local_index=0, status="skipped"),
        CapturedAction(tool="orders.add_note", args={"order_id": "temp_0", "note": "y"},
                       local_index=1),
    ]  # fmt: skip
    report = await apply(actions, TOOLS)
    assert RAN == []
    assert report.failed is not None
    assert "refers to temp_0, which no applied action produced" in (report.failed.error or "")


async def test_apply_reports_an_unknown_tool_and_invalid_arguments() -> None:
    unknown = await apply([CapturedAction(tool="orders.creat", args={}, local_index=0)], TOOLS)
    assert "Unknown tool 'orders.creat'. Did you mean 'orders.create'" in (
        unknown.failed.error or ""  # type: ignore[union-attr]
    )
    invalid = await apply(
        [CapturedAction(tool="orders.create", args={"item": 3, "zz": 1}, local_index=0)], TOOLS
    )
    assert invalid.failed is not None and "zz" in (invalid.failed.error or "")
    assert RAN == []


@given(
    st.recursive(
        st.one_of(st.integers(), st.text(max_size=12), st.sampled_from(["temp_0", "temp_1"])),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=12,
    )
)
def test_substitution_leaves_no_known_temp_id_and_changes_nothing_else(value: Any) -> None:
    ids = {"temp_0": "R0", "temp_1": 41}
    out = substitute(value, ids)
    assert not unresolved(out)
    assert substitute(out, ids) == out  # idempotent
    assert substitute(value, {}) == value  # nothing known: nothing changes


# -- batch approval -------------------------------------------------------------------------


async def proposed(store: MemoryStore | None = None) -> tuple[Engine, str]:
    engine = engine_for(chained_model(), store=store or MemoryStore())
    result = await engine.run_headless("s1", "go", propose=True)
    assert result.outcome == "suspended" and result.card is not None
    assert [e.type for e in result.events][-2:] == ["approval-required", "run-suspended"]
    RAN.clear()
    return engine, result.card


async def test_one_batch_card_lists_every_action_and_approving_it_applies_them() -> None:
    engine, card_id = await proposed()
    state = await engine.session("s1")
    (card,) = state.pending.values()
    assert card.kind == "batch" and card.tool_call_id == card_id
    assert [a["tool"] for a in card.args["actions"]] == ["orders.create", "orders.add_note"]
    assert card.args["amendable"] == {"0": ["quantity"], "1": ["note"]}
    with pytest.raises(Exception, match="suspended"):
        async for _ in engine.submit("s1", "another message"):
            pass

    await engine.resolve("s1", card_id, Approve(by="ana"))
    events = [e async for e in engine.resume("s1")]
    assert [e.type for e in events] == [
        "run-started",
        "tool-call-completed",
        "tool-call-completed",
        "run-completed",
    ]
    assert events[-1].output == "Applied 2 of 2 action(s)."  # nothing skipped or failed
    assert [name for name, _ in RAN] == ["orders.create", "orders.add_note"]
    assert RAN[1][1]["order_id"] == "ORD-1"
    after = await engine.session("s1")
    assert after.progress is None and not after.pending
    with pytest.raises(StaleResolutionError, match="already decided"):
        await engine.resolve("s1", card_id, Approve())


async def test_the_batch_card_names_the_agents_that_proposed_its_actions() -> None:
    engine, _ = await proposed()
    (card,) = (await engine.session("s1")).pending.values()
    assert card.agent == "clerk"
    assert [a["agent"] for a in card.args["actions"]] == ["clerk", "clerk"]

    planner = Agent(
        "planner",
        tools=[create],
        model=ScriptedModel([[call("orders.create", item="a")], "planned"]),
        scratch=True,
    )
    writer = Agent(
        "writer",
        tools=[add_note],
        model=ScriptedModel([[call("orders.add_note", order_id="temp_0", note="n")], "noted"]),
    )
    routed = Engine(Domain(agents=[planner, writer], routes={"both": ["planner", "writer"]}))
    result = await routed.run_headless("s2", "go", propose=True, org_id="acme", user_id="ana")
    assert [a.agent for a in result.actions] == ["planner", "writer"]
    (event,) = [e for e in result.events if e.type == "approval-required"]
    assert event.agent == "planner, writer"  # type: ignore[union-attr]
    # the inbox's card names them too
    [pending] = (await routed.pending("acme", Decider(user_id="ana", org_id="acme"))).cards
    assert (pending.kind, pending.agent) == ("batch", "planner, writer")


async def test_per_action_decisions_amend_and_skip() -> None:
    engine, card_id = await proposed()
    await engine.resolve(
        "s1",
        card_id,
        Approve(actions={0: ActionChoice(amended_args={"quantity": 3})}),
    )
    report = await engine.apply("s1")
    assert report.ok and RAN[0] == ("orders.create", {"item": "mug", "quantity": 3})

    engine, card_id = await proposed()
    await engine.resolve(
        "s1", card_id, Approve(actions={1: ActionChoice(approve=False, reason="no notes")})
    )
    report = await engine.apply("s1")
    assert [a.status for a in report.actions] == ["applied", "skipped"]
    assert report.skipped[0].error == "no notes"
    assert [name for name, _ in RAN] == ["orders.create"]


async def test_rejecting_the_batch_runs_nothing() -> None:
    engine, card_id = await proposed()
    await engine.resolve("s1", card_id, Reject(reason="not today"))
    report = await engine.apply("s1")
    assert RAN == []
    assert [(a.status, a.error) for a in report.actions] == [("skipped", "not today")] * 2


async def test_bad_batch_decisions_are_refused_and_change_nothing() -> None:
    engine, card_id = await proposed()
    before = (await engine.session("s1")).dump()
    bad = [
        (Approve(actions={7: ActionChoice()}), "has no action 7 \\(actions: 0, 1\\)"),
        (Approve(actions={0: ActionChoice(amended_args={"item": "x"})}), "item cannot be amended"),
        (Approve(actions={0: ActionChoice(amended_args={"quantity": "many"})}), "not valid"),
        (Approve(amended_args={"quantity": 2}), "amend them one by one"),
    ]
    for decision, message in bad:
        with pytest.raises(InvalidDecisionError, match=message):
            await engine.resolve("s1", card_id, decision)
    assert (await engine.session("s1")).dump() == before
    with pytest.raises(InvalidDecisionError, match="is one call, not a batch"):
        from handrail.suspension import decide

        state = await engine.session("s1")
        state.pending[card_id].kind = "approval"
        decide(state, {}, card_id, Approve(actions={0: ActionChoice()}), now=0)


async def test_a_batch_cut_off_mid_way_never_runs_an_action_twice() -> None:
    store = MemoryStore()
    gate, inside = asyncio.Event(), asyncio.Event()

    @tool(name="orders.add_note", permission="write", mint=lambda a, i: {"note_id": temp_id(i)})
    async def slow_note(order_id: str, note: str, links: list[Any] | None = None) -> dict[str, Any]:
        """Add a note (hangs: the worker dies while it runs)."""
        RAN.append(("orders.add_note", {"order_id": order_id}))
        inside.set()
        await gate.wait()
        return {"note_id": "N"}

    agent = Agent("clerk", tools=[lookup, create, slow_note], model=chained_model())
    engine = Engine(agent, store=store, lease_ttl=0.05)
    result = await engine.run_headless("s1", "go", propose=True)
    assert result.card is not None
    RAN.clear()
    await engine.resolve("s1", result.card, Approve())
    task = asyncio.create_task(engine.apply("s1"))
    await asyncio.wait([task, asyncio.ensure_future(inside.wait())], return_when="FIRST_COMPLETED")
    assert not task.done(), task.result()
    task.cancel()  # the worker "dies" inside the second action
    with pytest.raises(asyncio.CancelledError):
        await task

    survivor = Engine(agent, store=store)
    events = [e async for e in survivor.recover("s1")]
    assert [name for name, _ in RAN] == ["orders.create", "orders.add_note"]  # nothing again
    assert events[-1].output.startswith("Applied 1 of 2 action(s); action 1 (orders.add_note)")
    assert "may have run before the worker applying it stopped" in events[-1].output


async def test_a_rejected_batch_tells_the_history_nothing_was_done() -> None:
    engine, card_id = await proposed()
    await engine.resolve("s1", card_id, Reject(reason="not now"))
    events = [e async for e in engine.resume("s1")]
    assert events[-1].output == (
        "Applied 0 of 2 action(s); skipped: action 0 (orders.create), action 1 (orders.add_note)."
    )
    told = (await engine.session("s1")).messages[-1]
    assert told.role == "system" and told.text.splitlines()[1:] == [
        "- action 0 (orders.create): skipped, not done (not now)",
        "- action 1 (orders.add_note): skipped, not done (not now)",
    ]
    assert RAN == []


async def test_an_expired_batch_applies_nothing() -> None:
    now = [1000.0]
    engine = Engine(
        Agent("clerk", tools=TOOLS, model=chained_model()),
        runtime=Runtime(pending_ttl=60, clock=lambda: now[0]),
    )
    result = await engine.run_headless("s1", "go", propose=True)
    RAN.clear()
    now[0] += 61
    assert await engine.expire_due() == ["s1"]
    report = await engine.apply("s1")
    assert RAN == [] and {a.status for a in report.actions} == {"skipped"}
    assert result.card is not None


async def test_engine_apply_refuses_a_session_without_a_decided_batch() -> None:
    engine, card_id = await proposed()
    with pytest.raises(
        UserError, match=f"no decided batch card to apply \\(still waiting on {card_id}"
    ):
        await engine.apply("s1")
    plain = engine_for(ScriptedModel([[call("orders.create", item="x")], "ok"]))
    async for _ in plain.submit("s2", "create"):
        pass
    (call_id,) = (await plain.session("s2")).pending
    await plain.resolve("s2", call_id, Approve())
    with pytest.raises(UserError, match="no decided batch card to apply"):
        await plain.apply("s2")  # an ordinary suspended turn is not resumed by apply
    assert RAN == []


async def test_a_batch_is_decided_under_the_policies_of_its_actions_tools() -> None:
    """create and add_note are `write`: the domain's policy for writes governs their batch."""
    from handrail import Decider, DecisionNotAllowedError, DecisionPolicy, Domain

    policy = DecisionPolicy(roles={"buyer"}, approvals=2)
    agent = Agent("clerk", tools=TOOLS, model=chained_model())
    engine = Engine(Domain(agents=[agent], policies={"write": policy}), store=MemoryStore())
    result = await engine.run_headless("s1", "go", propose=True, org_id="acme", user_id="ana")
    assert result.card is not None
    RAN.clear()
    clerk = Decider(user_id="cy", roles=frozenset({"sales"}), org_id="acme")
    with pytest.raises(DecisionNotAllowedError, match=r"orders\.add_note needs the role buyer"):
        await engine.resolve("s1", result.card, Approve(), decider=clerk)
    for who in ("bo", "di"):
        buyer = Decider(user_id=who, roles=frozenset({"buyer"}), org_id="acme")
        resolution = await engine.resolve("s1", result.card, Approve(), decider=buyer)
    assert resolution.ready
    report = await engine.apply("s1", org_id="acme", user_id="ana")
    assert report.ok and [name for name, _ in RAN] == ["orders.create", "orders.add_note"]


async def test_an_amended_batch_is_a_new_plan_that_needs_its_own_approvals() -> None:
    """A batch needing two approvals: an amendment restarts them; a stale approval is refused."""
    from handrail import ArgumentsChangedError, Decider, DecisionPolicy, Domain, PendingCard
    from handrail.suspension import ActionChoice

    policy = DecisionPolicy(roles={"buyer"}, approvals=2)
    agent = Agent("clerk", tools=TOOLS, model=chained_model())
    engine = Engine(Domain(agents=[agent], policies={"write": policy}), store=MemoryStore())
    result = await engine.run_headless("s1", "go", propose=True, org_id="acme", user_id="ana")
    assert result.card is not None
    RAN.clear()
    bo, di, cy = (
        Decider(user_id=who, roles=frozenset({"buyer"}), org_id="acme")
        for who in ("bo", "di", "cy")
    )

    async def card() -> PendingCard:
        [found] = (await engine.pending("acme", bo)).cards
        return found

    proposal = (await card()).digest
    assert not (await engine.resolve("s1", result.card, Approve(), decider=bo)).ready
    more = Approve(actions={0: ActionChoice(amended_args={"quantity": 3})}, digest=proposal)
    assert not (await engine.resolve("s1", result.card, more, decider=di)).ready
    amended = await card()
    assert amended.approved_by == ["di"] and amended.digest != proposal  # bo's no longer counts
    with pytest.raises(ArgumentsChangedError):
        await engine.resolve("s1", result.card, Approve(digest=proposal), decider=cy)
    assert (
        await engine.resolve("s1", result.card, Approve(digest=amended.digest), decider=cy)
    ).ready
    report = await engine.apply("s1", org_id="acme", user_id="ana")
    assert report.ok and RAN[0] == ("orders.create", {"item": "mug", "quantity": 3})
