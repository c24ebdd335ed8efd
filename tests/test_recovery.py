"""Crash recovery in one process: a worker stops mid-turn, another finishes the turn.

A stopped worker is simulated by cancelling the task that drives the turn at a chosen point:
the store then holds exactly what a killed process would leave (the last checkpoint and the
tool-call log). `tests/test_crash.py` kills real processes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from handrail import (
    Agent,
    Answer,
    Approve,
    ConflictError,
    Engine,
    Reject,
    Runtime,
    SessionBusyError,
    ToolContext,
    TurnCutOffError,
    UserError,
    tool,
)
from handrail.cli import app as cli
from handrail.models import ModelRequest
from handrail.recovery import RECOVERY_PROMPT
from handrail.store import MemoryStore, SessionStore, SqliteStore
from handrail.testing import FunctionModel, call, sequential_ids

effects: list[tuple[str, str]] = []
hang = asyncio.Event()  # replaced per test


@pytest.fixture(autouse=True)
def _fresh() -> None:
    global hang
    effects.clear()
    hang = asyncio.Event()


@tool(permission="write", approval="auto")
async def charge(ctx: ToolContext[None], order: str) -> str:
    """Charge an order (not idempotent)."""
    effects.append(("charge", ctx.idempotency_key))
    if order == "hang" and len(effects) == 1:
        await asyncio.sleep(3600)  # the worker dies in here (the first time)
    return f"charged {order}"


@tool(permission="write", approval="auto", idempotent=True)
async def book(ctx: ToolContext[None], slot: str) -> str:
    """Book a slot (idempotent: the provider deduplicates on the key)."""
    effects.append(("book", ctx.idempotency_key))
    if len(effects) == 1:
        await asyncio.sleep(3600)  # the first attempt never finishes
    return f"booked {slot}"


def model(first: Any, after: str = "Done.", *, hang_after_tools: bool = False) -> FunctionModel:
    async def answer(request: ModelRequest) -> Any:
        if request.messages[-1].role == "user":
            return first
        if hang_after_tools and not hang.is_set():
            hang.set()
            await asyncio.sleep(3600)  # the worker dies waiting for the model
        return after

    return FunctionModel(answer)


def engine(store: SessionStore, m: FunctionModel) -> Engine:
    agent = Agent("a", tools=[charge, book])
    return Engine(agent, store=store, runtime=Runtime(model=m, ids=sequential_ids()))


async def kill(run: Any, when: Callable[[], bool]) -> None:
    """Drive `run` and kill it as soon as `when()` holds (checked at every loop step)."""
    task = asyncio.create_task(events_of(run))
    # Polled at every step on purpose: the kill must land at that exact point of the turn.
    while not when():
        assert not task.done(), "the turn ended before the crash point"
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def crash(e: Engine, when: Callable[[], bool], text: str = "go") -> None:
    """Drive a turn of session s1 and kill it as soon as `when()` holds."""
    await kill(e.submit("s1", text), when)


async def events_of(run: Any) -> list[Any]:
    return [e async for e in run]


async def test_a_call_whose_result_was_logged_is_never_run_again():
    store = MemoryStore()
    await crash(
        engine(store, model(call("charge", order="A1"), hang_after_tools=True)), hang.is_set
    )
    assert effects == [("charge", effects[0][1])]
    (entry,) = await store.tool_log("s1")
    assert (entry.status, entry.tool) == ("finished", "charge")

    other = engine(store, model("unused", "Charged A1."))
    with pytest.raises(UserError, match=r"cut off while it ran .* recover it") as caught:
        await events_of(other.submit("s1", "hello?"))
    assert isinstance(caught.value, TurnCutOffError) and caught.value.session_id == "s1"
    assert "recover it with engine.recover(session_id)" in str(caught.value)
    events = await events_of(other.recover("s1"))
    assert events[-1].type == "run-completed"
    assert len(effects) == 1  # not charged twice
    part = (await other.session("s1")).messages[1].tool_calls[0]
    assert (part.status, part.result.data) == ("completed", "charged A1")  # type: ignore[union-attr]


async def test_a_call_cut_off_mid_run_becomes_a_card_a_person_decides():
    store = MemoryStore()
    await crash(engine(store, model(call("charge", order="hang"))), lambda: bool(effects))
    other = engine(store, model("unused", "Charged again."))
    events = await events_of(other.recover("s1"))
    assert [e.type for e in events] == ["run-started", "approval-required", "run-suspended"]
    assert events[1].prompt == RECOVERY_PROMPT
    state = await other.session("s1")
    card = state.pending[events[1].tool_call_id]
    assert (card.kind, card.tool_name) == ("recovery", "charge")

    await other.resolve("s1", card.tool_call_id, Reject(reason="the bank says it went through"))
    done = await events_of(other.resume("s1"))
    assert done[-1].type == "run-completed"
    part = (await other.session("s1")).messages[1].tool_calls[0]
    assert part.status == "rejected"
    assert "its effect is unknown" in (part.result.error or "")  # type: ignore[union-attr]
    assert len(effects) == 1  # skipped: not run again


async def test_a_skipped_retry_is_audited_as_a_reject_on_a_recovery_card(tmp_path: Path):
    path = tmp_path / "h.db"
    async with SqliteStore(path, audit_key=None) as store:
        await crash(engine(store, model(call("charge", order="hang"))), lambda: bool(effects))
        other = engine(store, model("unused", "Skipped."))
        events = await events_of(other.recover("s1"))
        await other.resolve("s1", events[1].tool_call_id, Reject(by="ops"))
        (decided,) = await store.audit(None)
    # what the reject meant: its retry skipped (the call may have run), not a call refused
    assert (decided.decision, decided.card, decided.who) == ("reject", "recovery", "ops")
    args = ["audit", "list", "--org", "", "--db", str(path)]
    listed = await asyncio.to_thread(CliRunner().invoke, cli, args, env={"COLUMNS": "200"})
    assert "reject (recovery card)" in listed.output, listed.output


async def test_a_person_can_say_a_cut_off_call_ran_and_what_it_returned():
    store = MemoryStore()
    await crash(engine(store, model(call("charge", order="hang"))), lambda: bool(effects))
    other = engine(store, model("unused", "Charged once."))
    events = await events_of(other.recover("s1"))
    assert events[1].kind == "recovery"
    # Someone checked the bank: it went through. The model is told so; nothing runs again.
    await other.resolve("s1", events[1].tool_call_id, Answer(output="charged hang", by="ops"))
    done = await events_of(other.resume("s1"))
    assert done[-1].type == "run-completed"
    assert len(effects) == 1
    state = await other.session("s1")
    part = state.messages[1].tool_calls[0]
    assert (part.status, part.result.data) == ("completed", "charged hang")  # type: ignore[union-attr]
    assert part.result.summary == "it ran before a crash (confirmed by ops)"  # type: ignore[union-attr]


async def test_a_person_can_retry_a_cut_off_call_with_the_same_key():
    store = MemoryStore()
    await crash(engine(store, model(call("charge", order="hang"))), lambda: bool(effects))
    other = engine(store, model("unused", "Charged."))
    events = await events_of(other.recover("s1"))
    await other.resolve("s1", events[1].tool_call_id, Approve(by="ops"))
    done = await events_of(other.resume("s1"))
    assert done[-1].type == "run-completed"
    assert [kind for kind, _ in effects] == ["charge", "charge"]
    assert effects[0][1] == effects[1][1]  # one idempotency key for both attempts
    part = (await other.session("s1")).messages[1].tool_calls[0]
    assert (part.status, part.result.data) == ("completed", "charged hang")  # type: ignore[union-attr]


async def test_an_idempotent_call_cut_off_mid_run_runs_again_with_the_same_key():
    store = MemoryStore()
    await crash(engine(store, model(call("book", slot="9:00"))), lambda: bool(effects))
    other = engine(store, model("unused", "Booked."))
    events = await events_of(other.recover("s1"))
    assert events[-1].type == "run-completed"
    assert [kind for kind, _ in effects] == ["book", "book"]
    assert effects[0][1] == effects[1][1]


async def test_a_call_cut_off_before_it_started_just_runs():
    stall = True

    class StallingStore(MemoryStore):
        async def save(self, record: Any, **grouped: Any) -> Any:
            if grouped.get("started") and stall:  # the checkpoint that logs the call `started`
                hang.set()
                await asyncio.sleep(3600)  # the worker dies before logging the call
                raise AssertionError
            return await super().save(record, **grouped)

    store = StallingStore()
    await crash(engine(store, model(call("charge", order="A1"))), hang.is_set)
    assert effects == []
    assert await store.tool_log("s1") == []
    # The calls went on record in that same write, so they are not on record either: the
    # model is asked again, and its call runs (once: nothing logged, nothing ran).
    other = engine(MemoryStore(), model(call("charge", order="A1"), "Charged."))
    other.store = store
    stall = False
    events = await events_of(other.recover("s1"))
    assert events[-1].type == "run-completed"
    assert [kind for kind, _ in effects] == ["charge"]


async def test_a_turn_cut_off_in_a_model_call_asks_the_model_again():
    store = MemoryStore()

    async def first(request: ModelRequest) -> Any:
        hang.set()
        await asyncio.sleep(3600)

    await crash(engine(store, FunctionModel(first)), hang.is_set)
    state = await engine(store, model("x")).session("s1")
    assert [m.text for m in state.messages] == ["go"]  # the user's message was saved first
    other = engine(store, FunctionModel(lambda r: "Hello!"))
    events = await events_of(other.recover("s1"))
    assert events[-1].output == "Hello!"


async def test_nothing_to_recover_and_a_live_worker_are_refused():
    store = MemoryStore()
    e = engine(store, model("Hi."))
    await events_of(e.submit("s1", "hello"))
    with pytest.raises(UserError, match="no turn cut off while running"):
        await events_of(e.recover("s1"))

    await crash(engine(store, model(call("charge", order="hang"))), lambda: bool(effects))
    assert await store.acquire_lease("s1", "live-worker", 60)
    with pytest.raises(SessionBusyError):
        await events_of(e.recover("s1"))
    assert await e.recover_stale() == []  # leased by a live worker: left alone
    await store.release_lease("s1", "live-worker")
    assert await e.recover_stale() == ["s1"]  # now recovered (suspended on its card)
    assert (await e.session("s1")).suspended


@tool(permission="write")
async def pay(ctx: ToolContext[None], amount: int) -> str:
    """Pay (gated: a person approves every payment)."""
    effects.append(("pay", ctx.idempotency_key))
    if len(effects) <= amount:  # the first `amount` attempts never finish
        await asyncio.sleep(3600)
    return f"paid {amount}"


async def test_a_resumption_cut_off_mid_call_asks_again_and_so_does_a_cut_off_retry():
    store = MemoryStore()
    agent = Agent("a", tools=[pay])

    def worker(answer: str = "Paid.") -> Engine:
        m = model(call("pay", amount=2), answer)
        return Engine(agent, store=store, runtime=Runtime(model=m, ids=sequential_ids()))

    first = worker()
    events = await events_of(first.submit("s1", "go"))
    (call_id,) = events[-1].pending
    await first.resolve("s1", call_id, Approve())

    # The worker dies inside the approved payment.
    await kill(first.resume("s1"), lambda: len(effects) == 1)
    second = worker()
    asked = await events_of(second.resume("s1"))
    assert [e.type for e in asked] == ["run-started", "approval-required", "run-suspended"]
    assert asked[1].prompt == RECOVERY_PROMPT
    await second.resolve("s1", call_id, Approve(by="ops"))

    await kill(second.resume("s1"), lambda: len(effects) == 2)  # and dies again inside the retry
    third = worker()
    asked = await events_of(third.resume("s1"))
    assert asked[1].prompt == RECOVERY_PROMPT  # asked again: the retry may have run too
    await third.resolve("s1", call_id, Approve(by="ops"))
    done = await events_of(third.resume("s1"))
    assert done[-1].type == "run-completed"
    assert len(effects) == 3 and len({key for _, key in effects}) == 1
    log = await store.tool_log("s1")
    assert [(e.tool_call_id, e.status) for e in log] == [
        (call_id, "started"),
        (f"{call_id}~1", "started"),
        (f"{call_id}~2", "finished"),
    ]


# -- one call to finish a session; a restart under the same worker id ------------------------


def named(store: MemoryStore, m: FunctionModel, worker_id: str, **kwargs: Any) -> Engine:
    agent = Agent("a", tools=[charge, book])
    runtime = Runtime(model=m, ids=sequential_ids())
    return Engine(agent, store=store, runtime=runtime, worker_id=worker_id, **kwargs)


async def test_advance_takes_a_session_as_far_as_it_goes_from_any_state():
    store = MemoryStore()
    e = engine(store, model("Hi."))
    await events_of(e.submit("s1", "hello"))
    assert await e.advance("s1") is None  # nothing to do: the turn is over

    # Cut off while running: recovered, and suspended on the card of the call that may have run.
    await crash(engine(store, model(call("charge", order="hang"))), lambda: bool(effects))
    other = engine(store, model("unused", "Charged once."))
    result = await other.advance("s1")
    assert result is not None and result.outcome == "suspended"
    assert await other.advance("s1") is None  # still waiting for the person: nothing to do
    (card_id,) = result.pending
    await other.resolve("s1", card_id, Answer(output="charged hang", by="ops"))
    # Decided, not resumed (the wake-up went nowhere): resumed to the end.
    result = await other.advance("s1")
    assert result is not None and result.outcome == "completed"
    assert result.output == "Charged once."
    assert len(effects) == 1
    logged = [e["type"] for _, e in await store.events("s1")]
    assert logged[-1] == "run-completed"


async def test_a_missing_session_cannot_be_advanced():
    from handrail import SessionNotFoundError

    with pytest.raises(SessionNotFoundError):
        await engine(MemoryStore(), model("x")).advance("nope")


async def test_a_process_restarted_under_its_worker_id_takes_its_turns_back_at_once():
    store = MemoryStore()
    first = named(store, model(call("charge", order="hang")), "w1", lease_ttl=3600)
    turn = asyncio.create_task(events_of(first.submit("s1", "go")))
    while not effects:  # noqa: ASYNC110 - polled: the charge has started
        await asyncio.sleep(0)
    # The process dies: nothing more of it runs, and its lease stays (for an hour).
    (held,) = [owner for owner, _ in [store._leases["s1"]]]  # type: ignore[attr-defined]
    assert held == first.lease_owner
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    await store.acquire_lease("s1", first.lease_owner, 3600)  # as a killed one leaves it

    stranger = named(store, model("unused", "Done."), "w2")
    with pytest.raises(SessionBusyError):
        await stranger.advance("s1")  # another worker id waits for the lease to lapse
    restarted = named(store, model("unused", "Done."), "w1")
    assert await restarted.reclaim() == ["s1"]  # at once: suspended on its recovery card
    state = await restarted.session("s1")
    assert [c.kind for c in state.pending.values()] == ["recovery"]


async def test_a_process_whose_lease_was_taken_over_acts_no_more():
    store = MemoryStore()
    release = asyncio.Event()

    @tool(permission="write", approval="auto")
    async def slow(ctx: ToolContext[None], order: str) -> str:
        """Charge slowly."""
        effects.append(("slow", ctx.idempotency_key))
        await release.wait()
        return "charged"

    def two_charges(request: ModelRequest) -> Any:
        done = [p for m in request.messages for p in m.tool_calls]
        if not done:
            return call("slow", order="A1")
        if len(done) == 1:
            return call("charge", order="A1")  # a second side effect, after the first
        return "Done."

    def make(worker_id: str) -> Engine:
        runtime = Runtime(model=FunctionModel(two_charges), ids=sequential_ids())
        agent = Agent("a", tools=[slow, charge])
        return Engine(agent, store=store, runtime=runtime, worker_id=worker_id, lease_ttl=3600)

    old = make("w1")
    turn = asyncio.create_task(events_of(old.submit("s1", "go")))
    while not effects:  # noqa: ASYNC110 - polled: the slow charge has started
        await asyncio.sleep(0)
    new = make("w1")  # the same worker id, started while the old process still lives
    assert await new.reclaim() == ["s1"]  # it takes the session over
    release.set()  # the old process's call returns; it must not go on to the next one
    # Refused at its next write: its checkpoint (the new process saved since) or, had the new
    # one not saved yet, the lease check before the next side effect.
    with pytest.raises((ConflictError, SessionBusyError)):
        await turn
    assert [kind for kind, _ in effects] == ["slow"]  # the second charge never started
    state = await new.session("s1")
    assert [c.kind for c in state.pending.values()] == ["recovery"]  # the new one's record


class _Clock:
    """A store's clock that the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _waiting_engine(store: MemoryStore, release: asyncio.Event, ttl: float) -> Engine:
    @tool(permission="read")
    async def wait(order: str) -> str:
        """Wait for the test."""
        effects.append(("wait", order))
        await release.wait()
        return "waited"

    def answer(request: ModelRequest) -> Any:
        return "Done." if request.messages[-1].role != "user" else call("wait", order="A1")

    runtime = Runtime(model=FunctionModel(answer), ids=sequential_ids())
    return Engine(Agent("a", tools=[wait]), store=store, runtime=runtime, lease_ttl=ttl)


async def test_a_turn_longer_than_its_lease_renews_it_every_third_of_its_ttl():
    clock, release = _Clock(), asyncio.Event()
    store = MemoryStore(clock=clock)
    driving = _waiting_engine(store, release, ttl=0.03)
    turn = asyncio.create_task(events_of(driving.submit("s1", "go")))
    while not effects:  # noqa: ASYNC110 - polled: the turn is in its tool
        await asyncio.sleep(0)
    clock.now = 100.0  # the lease taken at 0 has lapsed, unless it was renewed since
    await asyncio.sleep(0.05)  # past a third of the ttl: renewed (at 100)
    assert not await store.acquire_lease("s1", "another", 0.03)
    release.set()
    assert (await turn)[-1].type == "run-completed"
    assert await store.acquire_lease("s1", "another", 0.03)  # released at the turn's end


async def test_a_turn_whose_lease_another_worker_took_stops_at_its_renewal():
    clock, release = _Clock(), asyncio.Event()
    store = MemoryStore(clock=clock)
    driving = _waiting_engine(store, release, ttl=3.0)
    turn = asyncio.create_task(events_of(driving.submit("s1", "go")))
    while not effects:  # noqa: ASYNC110 - polled: the turn is in its tool
        await asyncio.sleep(0)
    clock.now = 100.0  # lapsed (its renewal is a second away)...
    assert await store.acquire_lease("s1", "another", 3600)  # ...and taken by another worker
    # At its renewal (1 s on) the turn finds the lease gone: it is interrupted and writes no more.
    with pytest.raises(SessionBusyError):
        await turn
    release.set()


class _StallingStore(MemoryStore):
    """A store whose next lease renewal, once armed, finishes its statement even when cancelled
    (as a database driver does: it waits for the server's answer to its cancel)."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__(clock=clock)
        self.calls = 0
        self.stall: asyncio.Event | None = None
        self.in_flight = asyncio.Event()

    async def acquire_lease(self, session_id: str, owner: str, ttl: float) -> bool:
        self.calls += 1
        if self.stall is not None:
            gate, self.stall = self.stall, None
            self.in_flight.set()
            while not gate.is_set():
                with contextlib.suppress(asyncio.CancelledError):  # it runs to its end
                    await gate.wait()
        return await super().acquire_lease(session_id, owner, ttl)


async def test_a_renewal_that_ends_after_its_turn_does_not_go_on_renewing():
    # Seen on PostgreSQL under load: a renewal in flight when its turn ended finished anyway
    # and set the next one, so a process that drove nothing kept the lease for ever.
    clock, release = _Clock(), asyncio.Event()
    store = _StallingStore(clock)
    driving = _waiting_engine(store, release, ttl=0.03)
    turn = asyncio.create_task(events_of(driving.submit("s1", "go")))
    while not effects:  # noqa: ASYNC110 - polled: the turn is in its tool
        await asyncio.sleep(0)
    gate = store.stall = asyncio.Event()
    await store.in_flight.wait()  # a renewal is in flight...
    release.set()  # ...when the turn ends
    await asyncio.sleep(0.02)
    gate.set()
    assert (await turn)[-1].type == "run-completed"
    calls = store.calls
    await asyncio.sleep(0.05)  # five renewal periods
    assert store.calls == calls  # nothing renews a lease nobody holds
    assert await store.acquire_lease("s1", "another", 0.03)  # it was given back


async def test_a_recovery_cards_answer_is_governed_by_the_calls_policy():
    """Saying a cut-off call ran produces its result: the policy's roles and four eyes hold."""
    from handrail import Decider, DecisionNotAllowedError, DecisionPolicy, Domain

    policy = DecisionPolicy(roles={"finance"}, four_eyes=True)

    def governed(store: MemoryStore, m: FunctionModel) -> Engine:
        domain = Domain(agents=[Agent("a", tools=[charge, book])], policies={"write": policy})
        return Engine(domain, store=store, runtime=Runtime(model=m, ids=sequential_ids()))

    store = MemoryStore()
    first = governed(store, model(call("charge", order="hang")))
    await kill(first.submit("s1", "go", org_id="acme", user_id="ana"), lambda: bool(effects))
    other = governed(store, model("unused", "Charged once."))
    events = await events_of(other.recover("s1", org_id="acme", user_id="ana"))
    card_id = events[1].tool_call_id
    ana = Decider(user_id="ana", roles=frozenset({"finance"}), org_id="acme")  # the requester
    di = Decider(user_id="di", roles=frozenset({"sales"}), org_id="acme")
    said_it_ran = Answer("charged A1")
    with pytest.raises(DecisionNotAllowedError, match="four eyes: ana requested the call"):
        await other.resolve("s1", card_id, said_it_ran, decider=ana)
    with pytest.raises(DecisionNotAllowedError, match="needs the role finance; di has none"):
        await other.resolve("s1", card_id, said_it_ran, decider=di)
    with pytest.raises(DecisionNotAllowedError, match="four eyes"):
        await other.resolve("s1", card_id, Approve(), decider=ana)  # nor run it again
    bo = Decider(user_id="bo", roles=frozenset({"finance"}), org_id="acme")
    assert (await other.resolve("s1", card_id, said_it_ran, decider=bo)).ready
    done = await events_of(other.resume("s1", org_id="acme", user_id="ana"))
    assert done[-1].type == "run-completed" and len(effects) == 1


# -- what recovery reads of the tool-call log ------------------------------------------------


class AskedStore(MemoryStore):
    """A MemoryStore that notes what each read of the tool-call log asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[list[str] | None] = []

    @property
    def logged(self) -> list[Any]:
        """The log's entries as they stand (read without a call to the store)."""
        return [logged.entry for log in self._logs.values() for logged in log.values()]

    async def tool_log(self, session_id: str, *, calls: Any = None) -> Any:
        self.asked.append(None if calls is None else sorted(calls))
        return await super().tool_log(session_id, calls=calls)


class OldStore(AskedStore):
    """A store written before `tool_log(calls=)`: it reads the whole log, always."""

    async def tool_log(self, session_id: str) -> Any:  # type: ignore[override]
        self.asked.append(None)
        return await MemoryStore.tool_log(self, session_id)


async def an_old_log(store: MemoryStore, n: int = 40) -> None:
    """Earlier turns' calls in the session's log."""
    for i in range(n):
        await store.log_started("s1", f"old_{i}", key=f"k{i}", tool="refund", args={})
        await store.log_finished("s1", f"old_{i}", {"ok": True, "data": "refunded long ago"})


@pytest.mark.parametrize("kind", [AskedStore, OldStore])
async def test_recovery_reads_only_its_responses_calls_from_an_old_log(kind: type) -> None:
    store = kind()
    await an_old_log(store)
    first = engine(store, model([call("book", slot="9:00"), call("charge", order="A1")]))

    # Cut off inside `book`, once `charge` (run beside it) is done and logged.
    def charged() -> bool:
        return any(e.tool == "charge" and e.status == "finished" for e in store.logged)

    await crash(first, charged)
    (turn,) = [m for m in (await first.session("s1")).messages if m.tool_calls]
    ids = sorted(part.id for part in turn.tool_calls)
    store.asked.clear()

    other = engine(store, model("unused", "Booked and charged."))
    events = await events_of(other.recover("s1"))
    assert events[-1].type == "run-completed"
    # `book` (idempotent, cut off) ran again with its key; `charge` (its result logged) did not.
    assert [name for name, _ in effects] == ["book", "charge", "book"]
    assert effects[0][1] == effects[2][1]
    # The turn's own calls, not the log's 40 others (an old store: its whole log, kept from).
    assert store.asked == ([None] if kind is OldStore else [ids])


async def test_a_resumption_cut_off_reads_only_its_calls_current_attempts():
    """A retry a person approved has its own log id (`call~1`): that is the one read."""
    store = AskedStore()
    await an_old_log(store)
    first = engine(store, model(call("charge", order="hang")))
    await crash(first, lambda: bool(effects))
    other = engine(store, model("unused", "Charged."))
    events = await events_of(other.recover("s1"))
    card_id = events[1].tool_call_id
    await other.resolve("s1", card_id, Approve())  # retry it...
    effects.clear()
    await kill(other.resume("s1"), lambda: bool(effects))  # ...and that retry is cut off too
    store.asked.clear()
    again = engine(store, model("unused", "Charged."))
    await events_of(again.resume("s1"))
    assert store.asked == [[f"{card_id}~1"]]


@tool(
    name="ship",
    permission="write",
    mint=lambda args, i: {"shipment": f"temp_{i}"},
)
async def ship(ctx: ToolContext[None], order: str) -> dict[str, str]:
    """Ship an order (hangs the first time: the worker applying the batch dies in it)."""
    effects.append(("ship", order))
    if len(effects) == 1:
        await asyncio.sleep(3600)
    return {"shipment": f"SH-{order}"}


async def test_a_batch_apply_cut_off_reads_only_its_actions_from_an_old_log():
    from handrail.testing import ScriptedModel

    store = AskedStore()
    await an_old_log(store)
    agent = Agent("clerk", tools=[ship])
    scripted = ScriptedModel(
        [[call("ship", order="A1"), call("ship", order="B2")], "Proposed shipping both."]
    )
    first = Engine(agent, store=store, runtime=Runtime(model=scripted, ids=sequential_ids()))
    proposed = await first.run_headless("s1", "ship them", propose=True)
    assert proposed.card is not None and effects == []
    actions = sorted(a.call_id for a in proposed.actions)
    await first.resolve("s1", proposed.card, Approve())
    await kill(first.resume("s1"), lambda: bool(effects))  # cut off inside the first `ship`
    store.asked.clear()

    second = Engine(agent, store=store, runtime=Runtime(model=scripted, ids=sequential_ids()))
    result = await second.advance("s1")
    assert result is not None and result.outcome == "completed"
    assert store.asked == [actions]  # the batch's own actions, not the log's 40 others
    assert effects == [("ship", "A1")]  # it may have run: not run again, and the rest waits
    assert result.output.startswith("Applied 0 of 2 action(s); action 0 (ship) failed")
    assert "may have run" in result.output
