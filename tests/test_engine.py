"""`Engine` and `Domain`: sessions, routes, interruption, through the public API."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from handrail import (
    Agent,
    ApprovalCardPart,
    Compaction,
    Domain,
    Engine,
    Message,
    RunState,
    Runtime,
    SessionNotFoundError,
    StoreError,
    UserError,
    tool,
)
from handrail.store import MemoryStore
from handrail.testing import FunctionModel, ScriptedModel, call, sequential_ids


def engine_for(steps: list[Any], domain: Any, **kwargs: Any) -> Engine:
    runtime = Runtime(model=ScriptedModel(steps), ids=sequential_ids())
    return Engine(domain, runtime=runtime, **kwargs)


async def events_of(run: Any) -> list[Any]:
    return [e async for e in run]


def test_a_domain_checks_its_routes_when_it_is_made():
    a, b = Agent("a"), Agent("b")
    assert Domain(agents=[a, b]).routes == {"default": ["a"]}
    with pytest.raises(UserError, match="two agents are named 'a'"):
        Domain(agents=[a, Agent("a")])
    with pytest.raises(UserError, match="route 'r' names no agent or unknown agents \\('c'\\)"):
        Domain(agents=[a, b], routes={"r": ["a", "c"]})
    with pytest.raises(UserError, match="default_route 'x' is not a route"):
        Domain(agents=[a], routes={"r": ["a"]}, default_route="x")
    with pytest.raises(UserError, match="at least one agent"):
        Domain(agents=[])


async def test_turns_take_the_chosen_route_and_sessions_keep_their_history():
    domain = Domain(
        agents=[Agent("planner"), Agent("responder")],
        routes={"simple": ["responder"], "planned": ["planner", "responder"]},
    )
    engine = engine_for(["Hi!", "Plan: answer.", "Answered."], domain)
    first = await events_of(engine.submit("s1", "hello", route="simple"))
    assert [e.agent for e in first if e.type == "agent-started"] == ["responder"]
    second = await events_of(engine.submit("s1", "and now?", route="planned"))
    assert [e.agent for e in second if e.type == "agent-started"] == ["planner", "responder"]
    assert second[-1].output == "Answered."
    state = await engine.session("s1")
    assert [m.text for m in state.messages] == [
        "hello",
        "Hi!",
        "and now?",
        "Plan: answer.",
        "Answered.",
    ]
    assert state.turn == 2
    with pytest.raises(UserError, match="Unknown route 'nope'; routes: simple, planned"):
        engine.submit("s1", "x", route="nope")


async def test_the_last_event_of_a_turn_comes_once_the_session_is_free():
    """Whoever reads a turn's last event may start the next turn there and then (before, the
    turn still held the session's lock and lease, and the next one waited for ever)."""
    engine = engine_for(["One.", "Two."], Agent("a"))
    second: list[Any] = []
    async with asyncio.timeout(5):
        async for event in engine.submit("s1", "first"):
            if event.type == "run-completed":
                assert await engine.store.acquire_lease("s1", "someone else", 30.0)
                await engine.store.release_lease("s1", "someone else")
                second = await events_of(engine.submit("s1", "second"))
    assert second[-1].type == "run-completed"
    assert second[-1].output == "Two."
    assert [m.text for m in (await engine.session("s1")).messages][-1] == "Two."


async def test_a_turn_may_refuse_to_make_its_session():
    engine = engine_for(["Hi!", "Hi again!"], Agent("a"))
    with pytest.raises(SessionNotFoundError, match="No session 'new' for this caller"):
        await engine.submit("new", "hello", create=False).finish()
    assert await engine.store.load("new") is None
    await engine.submit("new", "hello").finish()  # made on first use, by default
    assert (await engine.submit("new", "again", create=False).finish()).outcome == "completed"


async def test_sessions_are_saved_with_their_status_and_scope():
    store = MemoryStore()
    engine = engine_for(["Hi."], Agent("a"), store=store)
    events = await events_of(engine.submit("s1", "hello", org_id="acme", user_id="u1"))
    assert events[-1].type == "run-completed"
    record = await store.load("s1")
    assert record is not None
    # Two writes: the user's message when the turn starts, the turn when it ends.
    assert (record.org_id, record.user_id, record.status, record.version) == (
        "acme",
        "u1",
        "completed",
        2,
    )


async def test_a_failed_run_is_saved_as_failed_with_its_history():
    store = MemoryStore()
    engine = engine_for([], Agent("a"), store=store)  # the script is empty: the model fails
    events = await events_of(engine.submit("s1", "hello"))
    assert events[-1].type == "run-failed"
    assert "ScriptedModel ran out of steps" in (events[-1].error or "")
    record = await store.load("s1")
    assert record is not None and record.status == "failed"
    assert [m.text for m in (await engine.session("s1")).messages] == ["hello"]


async def test_interrupt_stops_a_running_turn_and_persists_a_valid_history():
    started = asyncio.Event()

    @tool
    async def slow() -> str:
        """Takes forever."""
        started.set()
        await asyncio.sleep(3600)
        return "never"

    engine = engine_for([[call("slow")]], Agent("a", tools=[slow]))
    assert not engine.interrupt("s1")  # nothing runs yet
    run = engine.submit("s1", "go")

    async def interrupt_when_started() -> None:
        await started.wait()
        assert engine.interrupt("s1")

    task = asyncio.create_task(interrupt_when_started())
    events = await events_of(run)
    await task
    assert events[-1].type == "run-failed" and events[-1].reason == "interrupted"
    state = await engine.session("s1")
    part = state.messages[-1].tool_calls[0]
    assert part.status == "interrupted"
    assert part.result is not None and "interrupted" in (part.result.error or "")
    record = await engine.store.load("s1")
    assert record is not None and record.status == "active"


async def test_a_turn_drops_its_own_outputs_when_it_ends_but_not_while_suspended():
    @tool
    def lookup(order: str) -> dict[str, str]:
        """Look up."""
        return {"order": order}

    @tool(permission="write")
    def refund(order: str) -> str:
        """Refund."""
        return "ok"

    engine = engine_for(
        [[call("lookup", order="A1"), call("refund", order="A1")], "Refunded."],
        Agent("a", tools=[lookup, refund]),
    )
    events = await events_of(engine.submit("s1", "go"))
    suspended = await engine.session("s1")
    assert suspended.context.get("tool:lookup.order") == "A1"  # kept across the pause
    from handrail import Approve

    await engine.resolve("s1", events[-1].pending[0], Approve())
    await events_of(engine.resume("s1"))
    ended = await engine.session("s1")
    assert ended.context.get("tool:lookup.order", None) is None
    assert ended.turn_calls == {}


async def test_a_session_that_cannot_be_read_is_a_store_error_naming_it():
    store = MemoryStore()
    engine = engine_for(["Hi."], Agent("a"), store=store)
    await events_of(engine.submit("s1", "hello"))
    record = await store.load("s1")
    assert record is not None
    record.messages[0]["parts"][0]["type"] = "hologram"
    await store.save(record)
    with pytest.raises(StoreError) as caught:
        await engine.session("s1")
    assert str(caught.value) == (
        "Session 's1' cannot be read: not a stored session state: at messages.0.parts.0: "
        "Input tag 'hologram' found using 'type' does not match any of the expected tags: "
        "'text', 'reasoning', 'tool-call', 'approval'. The stored row is left untouched; "
        "restore it from an export, or delete the session."
    )
    assert caught.value.session_id == "s1"
    record = await store.load("s1")
    assert record is not None and record.messages[0]["parts"][0]["type"] == "hologram"
    record.data["schema_version"] = 99
    await store.save(record)
    with pytest.raises(StoreError, match="schema_version=99: this handrail reads versions 1 to 2"):
        await engine.session("s1")


async def test_prune_deletes_idle_finished_sessions_only():
    now = [1_000.0]
    store = MemoryStore(clock=lambda: now[0])
    runtime = Runtime(model=ScriptedModel(["Hi.", "Hi again."]), clock=lambda: now[0])
    engine = Engine(Agent("a"), store=store, runtime=runtime)
    await events_of(engine.submit("old", "hello"))
    now[0] = 5_000.0
    await events_of(engine.submit("new", "hello"))
    assert await engine.prune(idle_for=3_600) == ["old"]
    assert await store.load("old") is None and await store.load("new") is not None


async def test_another_tenants_session_id_cannot_be_taken_over_by_a_new_turn():
    from handrail import SessionNotFoundError

    engine = engine_for(["Hi.", "unused"], Agent("a"))
    await events_of(engine.submit("s1", "hello", org_id="acme", user_id="u1"))
    with pytest.raises(SessionNotFoundError, match="No session 's1' for this caller"):
        await events_of(engine.submit("s1", "mine now", org_id="evil", user_id="u1"))
    state = await engine.session("s1", org_id="acme", user_id="u1")
    assert [m.text for m in state.messages] == ["hello", "Hi."]


async def test_a_session_asked_for_without_its_scope_is_not_found_with_how_to_find_it():
    from handrail import Approve, Decider

    @tool(name="mail.send", permission="write")
    def send(to: str) -> str:
        """Send a mail."""
        return f"sent to {to}"

    engine = engine_for([[call("mail.send", to="x")], "Sent."], Agent("a", tools=[send]))
    events = await events_of(engine.submit("s1", "mail x", org_id="acme", user_id="u1"))
    (call_id,) = events[-1].pending
    hint = (
        "A session is found with the org_id= and user_id= it was created with: pass the same "
        "ones to submit, resolve, resume and session."
    )
    attempts = {
        "resolve": lambda: engine.resolve("s1", call_id, Approve()),
        "resume": lambda: events_of(engine.resume("s1")),
        "session": lambda: engine.session("s1"),
    }
    for name, attempt in attempts.items():
        with pytest.raises(SessionNotFoundError) as caught:
            await attempt()
        assert str(caught.value) == (
            f"No session 's1' for this caller (org_id=None, user_id=None). {hint}"
        ), name
        assert caught.value.session_id == "s1"
    # the same words for a session that is nobody's: they never say whether one exists
    with pytest.raises(SessionNotFoundError) as caught:
        await engine.session("nope", org_id="acme", user_id="u2")
    assert str(caught.value) == (
        f"No session 'nope' for this caller (org_id='acme', user_id='u2'). {hint}"
    )
    # a decider reaches its own organisation's sessions only
    eve = Decider(user_id="eve", org_id="globex")
    with pytest.raises(SessionNotFoundError) as caught:
        await engine.resolve("s1", call_id, Approve(), decider=eve)
    assert str(caught.value) == (
        "No session 's1' in organisation 'globex' (the decider's). A decider= reaches the "
        "sessions of its own organisation: check the session id and the decider's org_id."
    )
    # with the scope it was made with, it is found, and nothing was changed before
    resolution = await engine.resolve("s1", call_id, Approve(), org_id="acme", user_id="u1")
    assert resolution.ready
    events = await events_of(engine.resume("s1", org_id="acme", user_id="u1"))
    assert events[-1].output == "Sent."


# -- history: a save writes what changed, a load reads what a turn needs ------------------


class CountingStore(MemoryStore):
    """A memory store that remembers where each save started writing messages, and how many."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[int, int]] = []

    async def save(self, record: Any) -> Any:
        self.writes.append((record.messages_from, len(record.messages)))
        return await super().save(record)


@tool(name="orders.lookup")
def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"{order_id}: shipped"


async def test_a_save_writes_the_turns_messages_only_however_long_the_session():
    store = CountingStore()

    def answer(request: Any) -> Any:
        last = request.messages[-1]
        return call("orders.lookup", order_id="A1") if last.role == "user" else "Shipped."

    runtime = Runtime(model=FunctionModel(answer), ids=sequential_ids())
    engine = Engine(Agent("a", tools=[lookup]), store=store, runtime=runtime)
    for n in range(8):
        store.writes.clear()
        await events_of(engine.submit("s1", f"where is A1, question {n}?"))
        start = 3 * n  # each turn: the question, the call, the answer
        assert store.writes and all(first >= start for first, _ in store.writes)
        assert max(first + count for first, count in store.writes) == start + 3
    history = await store.messages("s1", limit=100)
    assert [p for p, _ in history] == list(range(24))
    state = await engine.session("s1")  # without compaction, a load reads it all
    assert (state.base, len(state.messages)) == (0, 24)


async def test_a_decision_on_a_card_before_the_turn_start_is_still_written():
    # The pending map is an index over cards wherever they are: a save covers each one.
    state = RunState(messages=[Message(id=f"m{i}", role="user", parts=[]) for i in range(6)])
    state.turn_start = state.clean = 5
    assert state.changed_from() == 5
    card = ApprovalCardPart(tool_call_id="c1", tool_name="t", args={})
    state.messages[2].parts.append(card)
    state.pending["c1"] = card
    assert state.changed_from() == 2
    state.scratch["helper"] = [Message(id="s", role="assistant", parts=[card])]
    assert state.changed_from() == 5  # a scratch card is saved with the document


async def test_a_compacted_session_loads_from_its_summary_and_calls_never_share_an_id():
    seen: list[int] = []

    def answer(request: Any) -> Any:
        if request.agent == "compaction":
            return "Many orders were looked up; all had shipped."
        seen.append(len(request.messages))
        last = request.messages[-1]
        if last.role == "user":  # a server that numbers its calls per response
            return call("orders.note", order_id="A1" + "0" * 60, id="call_0")
        return "Shipped. " * 30

    @tool(name="orders.note", permission="write", approval="auto")
    def note(order_id: str) -> str:
        """Note an order (a side effect: logged before it runs)."""
        return f"{order_id}: noted"

    store = MemoryStore()
    runtime = Runtime(
        model=FunctionModel(answer),
        ids=sequential_ids(),
        compaction=Compaction(max_tokens=700, keep_recent_turns=1),
    )
    engine = Engine(Agent("a", tools=[note]), store=store, runtime=runtime)
    for n in range(12):
        events = await events_of(engine.submit("s1", f"where is my order, question {n}?"))
        assert events[-1].type == "run-completed"
    state = await engine.session("s1")
    assert state.summary is not None and state.base == state.summary.messages > 0
    assert state.base + len(state.messages) == 36 == len(await store.messages("s1", limit=99))
    assert max(seen) < 20  # the model saw the summary and the recent turns only
    stored = [
        p["id"]
        for _, m in await store.messages("s1", limit=99)
        for p in m["parts"]
        if p["type"] == "tool-call"
    ]
    assert len(set(stored)) == len(stored) == 12  # one id a call, though the model sent one
    assert "call_0" in stored  # kept while the whole history was loaded
    # The tool-call log has each call once, with its own result: none was taken for another.
    log = await store.tool_log("s1")
    assert [e.tool_call_id for e in log] == stored
    assert all(e.status == "finished" for e in log) and len({e.key for e in log}) == 12


async def test_a_session_saved_with_a_window_is_loaded_whole_without_compaction():
    def answer(request: Any) -> Any:
        if request.agent == "compaction":
            return "Earlier: greetings."
        return "Hello! " * 40

    store = MemoryStore()
    compacting = Engine(
        Agent("a"),
        store=store,
        runtime=Runtime(
            model=FunctionModel(answer),
            ids=sequential_ids(),
            compaction=Compaction(max_tokens=400, keep_recent_turns=1),
        ),
    )
    for n in range(8):
        await events_of(compacting.submit("s1", f"hi {n}"))
    record = await store.load("s1")
    assert record is not None and record.window > 0
    seen: list[list[str]] = []

    def count(request: Any) -> str:
        seen.append([m.text for m in request.messages if m.role == "user"])
        return "Hi."

    plain = Engine(Agent("a"), store=store, runtime=Runtime(model=FunctionModel(count)))
    await events_of(plain.submit("s1", "hi again"))
    # The whole history, in order: eight turns of two messages, and this one.
    assert seen == [[*(f"hi {n}" for n in range(8)), "hi again"]]
    record = await store.load("s1")
    assert record is not None and (record.window, len(record.messages)) == (0, 18)


async def test_a_turns_scratch_is_kept_in_the_history_for_people_and_never_shown_to_a_model():
    seen: list[list[Message]] = []
    notes: list[int] = []

    def answer(request: Any) -> Any:
        seen.append(list(request.messages))
        if request.agent == "worker":
            if request.messages[-1].role == "user":
                return call("orders.lookup", order_id="A1")
            return f"note {len(notes)}: A1 shipped" if notes.append(1) is None else ""
        return "Your order shipped."

    domain = Domain(
        agents=[Agent("worker", tools=[lookup], scratch=True), Agent("writer")],
        routes={"default": ["worker", "writer"]},
    )
    store = MemoryStore()
    engine = Engine(
        domain, store=store, runtime=Runtime(model=FunctionModel(answer), ids=sequential_ids())
    )
    await events_of(engine.submit("s1", "where is A1?"))
    seen.clear()
    await events_of(engine.submit("s1", "and again?"))
    # The first turn's scratch (its lookup, the worker's notes) is never shown again.
    shown = [m for request in seen for m in request]
    assert not any(m.scratch for m in shown)
    history = [m for _, m in await store.messages("s1")]
    kept = [m for m in history if m.get("scratch")]
    calls = [p["id"] for m in kept for p in m["parts"] if p["type"] == "tool-call"]
    assert len(calls) == 2  # each turn's lookup, on record once its turn is over
    assert not any(p.id == calls[0] for m in shown for p in m.tool_calls)
    assert [m["agent"] for m in kept if m["role"] == "assistant"] == ["worker"] * 4


def test_a_state_round_trips_with_its_messages_and_where_they_start():
    state = RunState(
        messages=[Message(id=f"m{n}", role="user", parts=[]) for n in range(3)],
        base=7,
        turn_start=8,
    )
    again = RunState.load(json.loads(json.dumps(state.dump())))
    assert (again.base, again.turn_start, [m.id for m in again.messages]) == (
        7,
        8,
        ["m0", "m1", "m2"],
    )
    assert again.changed_from() == 7  # came inside the document: all of them to be written
    assert again.dump_messages(8) == state.dump_messages(8)
    with pytest.raises(UserError, match="holds them from 7 on"):
        again.dump_messages(6)
    apart = RunState.load(state.dump(messages=False), messages=state.dump_messages(7), base=7)
    assert apart.changed_from() == 10  # stored as they are, and no turn in progress
    with pytest.raises(UserError, match="both in the document and given apart"):
        RunState.load(state.dump(), messages=state.dump_messages(7), base=7)


async def test_a_new_message_while_the_turn_waits_says_which_library_calls_end_it():
    from handrail import Approve, TurnSuspendedError

    @tool(permission="write")
    def refund(order: str) -> str:
        """Refund."""
        return "ok"

    engine = engine_for(
        [[call("refund", order="A1")], "Refunded.", "Hello."], Agent("a", tools=[refund])
    )
    events = await events_of(engine.submit("s1", "refund A1"))
    (call_id,) = events[-1].pending
    with pytest.raises(TurnSuspendedError) as caught:
        await events_of(engine.submit("s1", "hello?"))
    assert (caught.value.session_id, caught.value.pending) == ("s1", (call_id,))
    assert str(caught.value) == (
        f"The turn of session 's1' is suspended, waiting on {call_id}: decide each call with "
        f"engine.resolve(session_id, tool_call_id, decision), then continue the turn with "
        f"engine.resume(session_id), before sending a new message."
    )
    assert isinstance(caught.value, UserError)

    await engine.resolve("s1", call_id, Approve())  # decided, not yet resumed
    with pytest.raises(TurnSuspendedError) as caught:
        await events_of(engine.submit("s1", "hello?"))
    assert caught.value.pending == ()
    assert str(caught.value) == (
        "The turn of session 's1' is suspended, its calls all decided: continue it with "
        "engine.resume(session_id), before sending a new message."
    )
    assert (await events_of(engine.resume("s1")))[-1].type == "run-completed"
    assert (await events_of(engine.submit("s1", "hello?")))[-1].type == "run-completed"
