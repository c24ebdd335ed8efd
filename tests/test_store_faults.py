"""What a store fault does to a turn: retried when it passes, left for recovery when it stays.

The store fails through `FlakyStore` (tests/flaky_store.py) at a call the test names: once
(a dropped connection, a busy database: retried, and the turn goes on as if nothing
happened), or for a while (longer than the engine's retries: the turn is left as a crash
at that point leaves it, and the caller gets a `StoreUnavailableError`). Either way every
side effect happens once, checked against a ledger the tools write, and every call ends
settled once the user does what a user does (resolve, resume, `advance`).

The fault matrix runs every store method a turn calls, failing each of its calls in turn,
for gated and ungated calls run one after the other or in parallel, on the three stores.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import secrets
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest

from flaky_store import FlakyStore
from handrail import (
    Agent,
    Answer,
    Approve,
    ConflictError,
    Engine,
    Runtime,
    StoreUnavailableError,
    ToolContext,
    tool,
)
from handrail.engine import StoreRetry
from handrail.messages import ToolCallPart
from handrail.models import ModelRequest
from handrail.recovery import idempotency_key
from handrail.state import RunState
from handrail.store import MemoryStore, SessionStore
from handrail.testing import FunctionModel, call
from store.conftest import PG_DSN, empty_pg_schema, skip_without_postgres

ATTEMPTS = 3
"""The engine's tries of a store call in these tests (the default is 6, over about 3 s)."""
A_WHILE = 2 * ATTEMPTS + 1
"""Store calls an outage "for a while" fails: more than the retries of two calls in parallel."""


class Ledger:
    """The outside world: every side effect the tools had, as a payment provider records it.

    A non-idempotent tool's every run is an effect; an idempotent one's provider
    deduplicates on the idempotency key, so a run again with the same key is none.
    """

    def __init__(self) -> None:
        self.effects: collections.Counter[str] = collections.Counter()
        self.keys: set[str] = set()
        self.gate: asyncio.Event | None = None  # set: the parallel `slow` call may finish

    def effect(self, ctx: ToolContext[Any], *, idempotent: bool = False) -> None:
        if idempotent and ctx.idempotency_key in self.keys:
            return
        self.keys.add(ctx.idempotency_key)
        self.effects[ctx.idempotency_key] += 1


def tools() -> list[Any]:
    """The tools of the matrix, parallel and sequential, each writing to `ctx.deps`."""

    @tool(permission="write", approval="auto")
    async def charge(ctx: ToolContext[Ledger], order: str) -> str:
        """Charge an order (not idempotent)."""
        ctx.deps.effect(ctx)  # type: ignore[union-attr]
        return f"charged {order}"

    @tool(permission="write", approval="auto", idempotent=True)
    async def ship(ctx: ToolContext[Ledger], order: str) -> str:
        """Ship an order (idempotent: the carrier deduplicates on the key)."""
        ctx.deps.effect(ctx, idempotent=True)  # type: ignore[union-attr]
        return f"shipped {order}"

    @tool(permission="write", approval="required")
    async def refund(ctx: ToolContext[Ledger], order: str) -> str:
        """Refund an order (a person approves it first)."""
        ctx.deps.effect(ctx)  # type: ignore[union-attr]
        return f"refunded {order}"

    @tool(permission="write", approval="auto", sequential=True)
    async def charge_now(ctx: ToolContext[Ledger], order: str) -> str:
        """Charge an order, alone (not idempotent)."""
        ctx.deps.effect(ctx)  # type: ignore[union-attr]
        return f"charged {order}"

    @tool(permission="write", approval="auto", idempotent=True, sequential=True)
    async def ship_now(ctx: ToolContext[Ledger], order: str) -> str:
        """Ship an order, alone (idempotent)."""
        ctx.deps.effect(ctx, idempotent=True)  # type: ignore[union-attr]
        return f"shipped {order}"

    @tool(permission="write", approval="required", sequential=True)
    async def refund_now(ctx: ToolContext[Ledger], order: str) -> str:
        """Refund an order, alone, once approved."""
        ctx.deps.effect(ctx)  # type: ignore[union-attr]
        return f"refunded {order}"

    return [charge, ship, refund, charge_now, ship_now, refund_now]


SCENARIOS: dict[str, list[tuple[str, str]]] = {
    "ungated-parallel": [("charge", "A1"), ("ship", "A2")],
    "ungated-sequential": [("charge_now", "A1"), ("ship_now", "A2")],
    "gated-parallel": [("refund", "A0"), ("charge", "A1"), ("ship", "A2")],
    "gated-sequential": [("refund_now", "A0"), ("charge_now", "A1")],
}
"""The calls of the model's one response, by scenario: with or without a call that waits for
approval, run in parallel or one after the other."""


def model(calls: list[tuple[str, str]]) -> FunctionModel:
    def answer(request: ModelRequest) -> Any:
        if request.messages[-1].role == "user":
            return [call(name, order=order) for name, order in calls]
        return "Done."

    return FunctionModel(answer)


async def no_sleep(seconds: float) -> None:
    await asyncio.sleep(0)


def engine_for(store: Any, calls: list[tuple[str, str]], ledger: Ledger) -> Engine:
    return Engine(
        Agent("a", tools=tools()),
        store=store,
        runtime=Runtime(model=model(calls), deps=ledger),
        store_retry=StoreRetry(attempts=ATTEMPTS, delay=0.0, sleep=no_sleep),
    )


async def drain(run: Any) -> list[Any]:
    return [event async for event in run]


async def by_hand(step: Any) -> Any:
    """A user's call to the engine: made again while the store is away (as a person would)."""
    for _ in range(10):
        try:
            return await step()
        except StoreUnavailableError:
            continue
    raise AssertionError("the store never came back")


async def finish(
    engine: Engine, inspect: Engine, session: str, ledger: Ledger, *, submit: bool = True
) -> list[str]:
    """Do what a user does until the session's turn is over; what happened, in order.

    Submit; a card waiting for approval is approved; a recovery card ("this call may have
    run") is answered from the ledger, as a person who checked the provider would: it ran
    (Answer) or it did not (Approve: run it). A `StoreUnavailableError` from a turn leaves it
    for `advance`, what a Worker does.
    """
    story: list[str] = []
    try:
        if submit:
            await drain(engine.submit(session, "go"))
    except StoreUnavailableError as error:
        assert session in str(error) and "ExceptionGroup" not in str(error)
        story.append("left")
    for _ in range(12):
        summary = await inspect.store.summary(session)
        if summary is None:  # the store went away before the user's message was stored
            story.append("resubmitted")
            with contextlib.suppress(StoreUnavailableError):
                await drain(engine.submit(session, "go"))
            continue
        assert summary.status != "failed", "a fault must never fail the session"
        state = await inspect.session(session)
        if state.progress is None:
            if not state.call_ids:  # the message was stored, not its turn: send it again
                story.append("resubmitted")
                with contextlib.suppress(StoreUnavailableError):
                    await drain(engine.submit(session, "go"))
                continue
            return story
        try:
            if state.progress.status == "running":  # cut off: what a Worker does
                story.append("advanced")
                await engine.advance(session)
                continue
            decisions: dict[str, Any] = {}
            for call_id, card in state.pending.items():
                if card.kind == "recovery":
                    ran = idempotency_key(state, part_of(state, call_id)) in ledger.keys
                    decisions[call_id] = Answer("done") if ran else Approve()
                    story.append(f"recovery-{'answered' if ran else 'retried'}")
                else:
                    decisions[call_id] = Approve()
            if decisions:
                await by_hand(lambda d=decisions: engine.resolve_many(session, d))  # type: ignore[misc]
            await drain(engine.resume(session))
        except StoreUnavailableError:
            story.append("left")
    raise AssertionError(f"session {session} never settled: {story}")


def part_of(state: RunState, call_id: str) -> ToolCallPart:
    return next(p for m in state.all_messages() for p in m.tool_calls if p.id == call_id)


async def check_settled(inspect: Engine, session: str, ledger: Ledger) -> None:
    """Every call ran exactly once and ended completed; the session is done, nothing waits."""
    summary = await inspect.store.summary(session)
    assert summary is not None and summary.status == "completed"
    state = await inspect.session(session)
    assert state.progress is None and not state.pending
    parts = [p for m in state.messages for p in m.tool_calls]
    assert parts and all(p.status == "completed" for p in parts), [
        (p.name, p.status) for p in parts
    ]
    keys = {idempotency_key(state, p) for p in parts}
    assert ledger.effects == dict.fromkeys(keys, 1)


# -- the stores --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def open_store(kind: str, tmp_path: Path) -> AsyncIterator[SessionStore]:
    store: SessionStore
    if kind == "memory":
        store = MemoryStore()
    elif kind == "sqlite":
        from handrail.store import SqliteStore

        store = SqliteStore(tmp_path / "faults.db")
    else:
        skip_without_postgres()
        from handrail.store import PostgresStore

        schema = f"faults_{secrets.token_hex(4)}_{tmp_path.name}"[:54]  # its own, always
        store = await PostgresStore.connect(PG_DSN, schema=schema)
        await empty_pg_schema(store.schema)
    try:
        yield store
    finally:
        if kind == "postgres":
            import psycopg

            async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as db:
                await db.execute(f'DROP SCHEMA IF EXISTS "{store.schema}" CASCADE')  # type: ignore[attr-defined]
        await store.close()


STORES = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]

# -- the cases, one by one --------------------------------------------------------


async def test_a_result_the_store_could_not_log_leaves_the_turn_for_recovery_not_failed():
    # The call's effect happened; log_finished failed past the retries. Before, the turn
    # ended `failed` for good and the refund waiting for approval was stranded on it.
    inner, ledger = MemoryStore(), Ledger()
    calls = SCENARIOS["gated-parallel"]
    flaky = FlakyStore(inner, fail={"log_finished": [1]}, down_for=2 * ATTEMPTS)
    engine, inspect = engine_for(flaky, calls, ledger), engine_for(inner, calls, ledger)

    with pytest.raises(StoreUnavailableError) as caught:
        await drain(engine.submit("s1", "go"))

    error = caught.value
    assert error.session_id == "s1" and error.attempts == ATTEMPTS
    assert "engine.advance" in str(error) and "ExceptionGroup" not in str(error)
    summary = await inner.summary("s1")
    assert summary is not None and summary.status == "active"  # not failed: cut off
    state = await inspect.session("s1")
    assert state.progress is not None and state.progress.status == "running"
    assert [c.kind for c in state.pending.values()] == ["approval"]  # the refund still waits
    # The charge and the ship ran (logged `started` together, with the checkpoint before
    # them); neither result could be logged.
    assert sum(ledger.effects.values()) == 2
    assert {entry.tool: entry.status for entry in await inner.tool_log("s1")} == {
        "charge": "started",
        "ship": "started",
    }

    # What a worker does: the turn is recovered (the ship, idempotent, runs again with its
    # key: the carrier keeps one), and suspends on the refund (and on the charge, whose
    # result was not logged: a person says whether it ran).
    result = await engine.advance("s1")
    assert result is not None and result.outcome == "suspended"
    state = await inspect.session("s1")
    kinds = {state.pending[c].kind for c in state.pending}
    assert kinds == {"approval", "recovery"}
    assert await finish(engine, inspect, "s1", ledger, submit=False) == ["recovery-answered"]
    await check_settled(inspect, "s1", ledger)


async def test_a_fault_once_is_retried_and_the_turn_goes_on_as_if_nothing_happened():
    inner, ledger = MemoryStore(), Ledger()
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    flaky = FlakyStore(inner, fail={"log_finished": [1], "save": [2]}, down_for=2)
    engine = Engine(
        Agent("a", tools=tools()),
        store=flaky,
        runtime=Runtime(model=model(SCENARIOS["ungated-parallel"]), deps=ledger),
        store_retry=StoreRetry(attempts=3, delay=0.5, max_delay=0.75, sleep=sleep),
    )

    events = await drain(engine.submit("s1", "go"))

    assert events[-1].type == "run-completed"
    assert flaky.failed == ["save", "save", "log_finished", "log_finished"]
    assert waits == [0.5, 0.75, 0.5, 0.75]  # doubled, at most max_delay
    await check_settled(engine_for(inner, [], ledger), "s1", ledger)


@pytest.mark.parametrize(
    "error",
    [ConnectionResetError("reset by peer"), TimeoutError("the store took too long")],
    ids=["connection-reset", "timeout"],
)
async def test_a_store_of_ones_own_that_loses_its_connection_is_retried_too(error: Exception):
    inner, ledger = MemoryStore(), Ledger()
    flaky = FlakyStore(inner, fail={"log_finished": [1], "save": [3]}, error=lambda _: error)
    engine = engine_for(flaky, SCENARIOS["ungated-sequential"], ledger)

    events = await drain(engine.submit("s1", "go"))

    assert events[-1].type == "run-completed"
    assert flaky.failed == ["log_finished", "save"]
    await check_settled(engine_for(inner, [], ledger), "s1", ledger)


@pytest.mark.parametrize("method", ["save", "log_started", "log_finished"])
async def test_a_write_made_whose_answer_was_lost_is_not_made_twice(method: str):
    # The connection dropped between the commit and the reply: the retry finds the write
    # made (a save is recognised as its own, a log entry is kept) and the turn goes on.
    inner, ledger = MemoryStore(), Ledger()
    flaky = FlakyStore(inner, fail={method: [1]}, lost_reply=True)
    engine = engine_for(flaky, SCENARIOS["ungated-sequential"], ledger)

    events = await drain(engine.submit("s1", "go"))

    assert events[-1].type == "run-completed"
    assert flaky.failed == [method]
    await check_settled(engine_for(inner, [], ledger), "s1", ledger)
    trail = await inner.audit(None)
    assert len(trail) == 2  # one audit entry a call, never two


async def test_a_sibling_finishes_its_side_effect_when_another_call_cannot_log_its_result():
    # Before, the task group cancelled the slow call in the middle of its effect, marked it
    # `interrupted`, and the turn failed with "ExceptionGroup: unhandled errors in a
    # TaskGroup".
    inner, ledger = MemoryStore(), Ledger()
    ledger.gate = asyncio.Event()
    finished: list[str] = []

    @tool(permission="write", approval="auto")
    async def quick(ctx: ToolContext[Ledger], order: str) -> str:
        """Charge at once."""
        ledger.effect(ctx)
        return "quick"

    @tool(permission="write", approval="auto")
    async def slow(ctx: ToolContext[Ledger], order: str) -> str:
        """Charge once the gate opens."""
        assert ledger.gate is not None
        await ledger.gate.wait()
        ledger.effect(ctx)
        finished.append(order)
        return "slow"

    def answer(request: ModelRequest) -> Any:
        if request.messages[-1].role == "user":
            return [call("quick", order="A1"), call("slow", order="A2")]
        return "Done."

    flaky = FlakyStore(inner, fail={"log_finished": [1]}, down_for=ATTEMPTS, only_method=True)
    engine = Engine(
        Agent("a", tools=[quick, slow]),
        store=flaky,
        runtime=Runtime(model=FunctionModel(answer), deps=ledger),
        store_retry=StoreRetry(attempts=ATTEMPTS, delay=0.0, sleep=no_sleep),
    )
    run = asyncio.create_task(drain(engine.submit("s1", "go")))
    for _ in range(1000):  # until quick's result could not be logged, however often tried
        if flaky.failed.count("log_finished") >= ATTEMPTS or run.done():
            break
        await asyncio.sleep(0)
    ledger.gate.set()
    with pytest.raises(StoreUnavailableError) as caught:
        await run

    assert "ExceptionGroup" not in str(caught.value)
    assert finished == ["A2"]  # never cancelled mid-effect
    log = {entry.tool: entry for entry in await inner.tool_log("s1")}
    assert log["slow"].status == "finished" and log["quick"].status == "started"
    summary = await inner.summary("s1")
    assert summary is not None and summary.status == "active"


async def test_a_store_that_refuses_is_not_retried_and_a_conflict_is_not_either():
    inner, ledger = MemoryStore(), Ledger()

    def refused(method: str) -> Exception:
        return ConflictError("s1", expected=1, actual=2)

    # The second save is the checkpoint that logs the first call `started`.
    flaky = FlakyStore(inner, fail={"save": [2]}, error=refused)
    engine = engine_for(flaky, SCENARIOS["ungated-sequential"], ledger)
    with pytest.raises(ConflictError):
        await drain(engine.submit("s1", "go"))
    assert flaky.calls["save"] == 2  # tried once
    assert not ledger.effects  # nothing ran
    assert await inner.tool_log("s1") == []
    summary = await inner.summary("s1")
    assert summary is not None and summary.status == "active"  # left as a crash leaves it


async def test_a_store_down_when_the_turn_starts_does_nothing_and_says_so():
    inner, ledger = MemoryStore(), Ledger()
    # A turn starts with a read (its first write takes the lease).
    flaky = FlakyStore(inner, fail={"load": [1]}, down_for=ATTEMPTS)
    engine = engine_for(flaky, SCENARIOS["ungated-parallel"], ledger)
    with pytest.raises(StoreUnavailableError, match="Nothing was done: try again"):
        await drain(engine.submit("s1", "go"))
    assert await inner.summary("s1") is None and not ledger.effects


@pytest.mark.parametrize(
    ("attempts", "delay", "max_delay"), [(0, 0.1, 1.0), (3, -1.0, 1.0), (3, 2.0, 1.0)]
)
def test_a_retry_that_cannot_be_is_refused(attempts: int, delay: float, max_delay: float):
    with pytest.raises(Exception, match="StoreRetry") as caught:
        StoreRetry(attempts=attempts, delay=delay, max_delay=max_delay)
    assert type(caught.value).__name__ == "UserError"


async def test_a_lease_renewal_the_store_fails_is_tried_again_and_the_turn_goes_on():
    inner, ledger = MemoryStore(), Ledger()
    gate, started = asyncio.Event(), asyncio.Event()

    @tool(permission="write", approval="auto")
    async def long(ctx: ToolContext[Ledger], order: str) -> str:
        """Take a while."""
        started.set()
        await gate.wait()
        ledger.effect(ctx)
        return "done"

    def answer(request: ModelRequest) -> Any:
        return call("long", order="A1") if request.messages[-1].role == "user" else "Done."

    flaky = FlakyStore(inner)
    engine = Engine(
        Agent("a", tools=[long]),
        store=flaky,
        runtime=Runtime(model=FunctionModel(answer), deps=ledger),
        lease_ttl=0.3,
    )
    run = asyncio.create_task(drain(engine.submit("s1", "go")))
    await started.wait()
    # The renewals from now on fail twice: the engine tries again sooner, and holds on.
    flaky.fail = {"acquire_lease": [flaky.calls["acquire_lease"] + 1]}
    flaky.down_for = 2
    for _ in range(500):  # two renewals fail, and the ones after go through
        if flaky.failed.count("acquire_lease") == 2 and flaky.calls["acquire_lease"] >= 6:
            break
        await asyncio.sleep(0.01)
    gate.set()
    events = await run
    assert events[-1].type == "run-completed"
    assert sum(ledger.effects.values()) == 1


# -- the matrix -----------------------------------------------------------------------------

TURN_METHODS = [
    "acquire_lease",
    "load",
    "save",
    "log_started",
    "log_finished",
    "tool_log",
    "release_lease",
    "append_events",
]
"""The store methods a turn and its recovery call (the audit entries of calls and decisions
are written by `log_finished` and `save`, in their transactions)."""


async def dry_run(inner: SessionStore, calls: list[tuple[str, str]]) -> collections.Counter[str]:
    """How many times a fault-free turn (its approval and resumption included) calls each."""
    ledger = Ledger()
    flaky = FlakyStore(inner)
    engine, inspect = engine_for(flaky, calls, ledger), engine_for(inner, calls, ledger)
    await finish(engine, inspect, "dry", ledger)
    await engine.advance("dry")  # what a worker's sweep would do after (append_events)
    await check_settled(inspect, "dry", ledger)
    return flaky.calls


async def run_cells(
    inner: SessionStore,
    scenario: str,
    method: str,
    nths: Iterable[int],
    *,
    down_for: int,
    lost_reply: bool = False,
) -> list[tuple[str, tuple[str, ...]]]:
    calls = SCENARIOS[scenario]
    outcomes = []
    for nth in nths:
        session, ledger = f"{scenario}-{method}-{nth}-{down_for}-{lost_reply:d}", Ledger()
        flaky = FlakyStore(inner, fail={method: [nth]}, down_for=down_for, lost_reply=lost_reply)
        engine, inspect = engine_for(flaky, calls, ledger), engine_for(inner, calls, ledger)
        story = await finish(engine, inspect, session, ledger)
        await check_settled(inspect, session, ledger)
        outcomes.append((f"{method}#{nth}", tuple(story)))
    return outcomes


@pytest.mark.parametrize("store_kind", STORES)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_fault_matrix(store_kind: str, scenario: str, tmp_path: Path):
    """Each call of each method the turn makes fails once (before the store, or after it with
    the answer lost), then for a while: every effect happens once, every call ends settled."""
    async with open_store(store_kind, tmp_path) as inner:
        counts = await dry_run(inner, SCENARIOS[scenario])
        once: list[tuple[str, tuple[str, ...]]] = []
        a_while: list[tuple[str, tuple[str, ...]]] = []
        for method in TURN_METHODS:
            nths = range(1, counts[method] + 1)
            once += await run_cells(inner, scenario, method, nths, down_for=1)
            # The write made, its answer lost (a connection dropped after the commit).
            once += await run_cells(inner, scenario, method, nths, down_for=1, lost_reply=True)
            a_while += await run_cells(inner, scenario, method, nths, down_for=A_WHILE)
    MATRIX[store_kind, scenario] = (once, a_while)
    # A fault that passes is never seen: the turn went straight through, with no recovery.
    assert [cell for cell, story in once if story] == []
    # A store away for longer than the retries leaves turns for recovery, which finishes them.
    assert any("left" in story for _, story in a_while)


MATRIX: dict[tuple[str, str], Any] = {}
"""The cells each matrix test ran, with what the user saw: printed with `-s` at the end."""


def teardown_module() -> None:
    for (store_kind, scenario), (once, a_while) in sorted(MATRIX.items()):
        left = collections.Counter(" ".join(story) or "straight" for _, story in a_while)
        print(
            f"\nfault matrix {store_kind:8} {scenario:18}: {len(once)} cells once (half of "
            f"them with the reply lost): all straight; {len(a_while)} cells for a while: "
            f"{dict(left)}"
        )


# -- real faults ----------------------------------------------------------------------------


async def test_the_events_of_an_advance_the_store_cannot_log_are_retried_then_reported():
    # A drive's saves carry its events (`Engine.log_run`): a save that fails for a moment is
    # made again with them; a store that stays away leaves the turn as a crash leaves it,
    # with no end logged that it did not reach.
    inner, ledger = MemoryStore(), Ledger()
    calls = SCENARIOS["ungated-sequential"]
    flaky = FlakyStore(inner, fail={"log_finished": [1]}, down_for=ATTEMPTS)
    engine = engine_for(flaky, calls, ledger)
    with pytest.raises(StoreUnavailableError):
        await drain(engine.submit("s1", "go"))

    before = len(await inner.events("s1"))
    flaky.fail, flaky.calls["save"], flaky.down_for = {"save": [1]}, 0, 1  # once: retried
    result = await engine.advance("s1")
    assert result is not None and result.outcome == "suspended"  # on the charge's card
    assert flaky.failed[-1] == "save"
    logged = await inner.events("s1", after=before)
    assert [seq for seq, _ in logged] == list(range(before + 1, before + 1 + len(logged)))
    types = [e["type"] for _, e in logged]
    assert types[0] == "run-started" and types.count("run-started") == 1
    assert types[-1] == "run-suspended"

    state = await engine.session("s1")
    await engine.resolve_many("s1", dict.fromkeys(state.pending, Answer("done")))
    before = len(await inner.events("s1"))
    flaky.fail, flaky.calls["save"] = {"save": [1]}, 0
    flaky.down_for = ATTEMPTS  # for a while: the turn stops where the store left it
    with pytest.raises(StoreUnavailableError):
        await engine.advance("s1")
    cut = [e["type"] for _, e in await inner.events("s1", after=before)]
    assert not {"run-completed", "run-failed"} & set(cut)
    back = engine_for(inner, [], ledger)  # the store is back: a worker finishes the turn
    await finish(back, back, "s1", ledger, submit=False)
    await check_settled(back, "s1", ledger)


async def test_a_drained_turn_whose_save_fails_once_logs_its_events_once():
    clean = MemoryStore()
    engine = engine_for(clean, SCENARIOS["ungated-parallel"], Ledger())
    await engine.drain("s1", engine.submit("s1", "go"))
    expected = [event["type"] for _, event in await clean.events("s1")]
    for lost_reply in (False, True):  # the save not made, or made and its answer lost
        for nth in (1, 2, 3):  # the message's, the checkpoint's, the answer's
            inner, ledger = MemoryStore(), Ledger()
            flaky = FlakyStore(inner, fail={"save": [nth]}, lost_reply=lost_reply)
            engine = engine_for(flaky, SCENARIOS["ungated-parallel"], ledger)

            result = await engine.drain("s1", engine.submit("s1", "go"))

            assert result.outcome == "completed" and flaky.failed == ["save"]
            logged = await inner.events("s1")
            assert [event["type"] for _, event in logged] == expected, (lost_reply, nth)
            assert [seq for seq, _ in logged] == list(range(1, len(expected) + 1))


async def test_a_sqlite_database_another_process_locks_is_waited_for_then_written(
    tmp_path: Path,
):
    import sqlite3

    from handrail.store import SqliteStore

    path, ledger = tmp_path / "locked.db", Ledger()
    store = SqliteStore(path, busy_timeout=0.05)
    await store.summary("s0")  # the database exists, with its tables
    other = sqlite3.connect(path, isolation_level=None)  # another process's connection
    other.execute("BEGIN IMMEDIATE")  # it holds the write lock
    try:
        with pytest.raises(StoreUnavailableError, match="locked"):
            await store.acquire_lease("s0", "someone", 30.0)
        waits: list[float] = []

        async def sleep(seconds: float) -> None:
            waits.append(seconds)
            if len(waits) == 2:
                other.execute("COMMIT")  # that process is done: the next try goes through

        engine = Engine(
            Agent("a", tools=tools()),
            store=store,
            runtime=Runtime(model=model(SCENARIOS["ungated-parallel"]), deps=ledger),
            store_retry=StoreRetry(attempts=4, delay=0.01, sleep=sleep),
        )
        events = await drain(engine.submit("s1", "go"))
        assert events[-1].type == "run-completed" and len(waits) == 2
        await check_settled(engine_for(store, [], ledger), "s1", ledger)
    finally:
        other.close()
        await store.close()


@pytest.mark.postgres
async def test_postgres_connections_terminated_mid_turn_are_replaced_and_the_turn_goes_on(
    tmp_path: Path,
):
    skip_without_postgres()
    import psycopg

    from handrail.store import PostgresStore

    name = f"faults_{secrets.token_hex(4)}_{tmp_path.name}"[:54]  # its connections, no others
    ledger, terminated = Ledger(), []
    store = await PostgresStore.connect(
        f"{PG_DSN}?application_name={name}", schema=name, pool_size=2
    )

    @tool(permission="write", approval="auto")
    async def charge(ctx: ToolContext[Ledger], order: str) -> str:
        """Charge, and lose every connection of the store right after the effect."""
        ledger.effect(ctx)
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as db:
            cursor = await db.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            terminated.extend(await cursor.fetchall())
        return f"charged {order}"

    def answer(request: ModelRequest) -> Any:
        if request.messages[-1].role == "user":
            return [call("charge", order="A1"), call("charge", order="A2")]
        return "Done."

    engine = Engine(
        Agent("a", tools=[charge]),
        store=store,
        runtime=Runtime(model=FunctionModel(answer), deps=ledger),
        store_retry=StoreRetry(attempts=6, delay=0.05),
    )
    try:
        events = await drain(engine.submit("s1", "go"))
        assert terminated  # the store's connections were cut, twice, mid-turn
        assert events[-1].type == "run-completed"
        await check_settled(engine_for(store, [], ledger), "s1", ledger)
    finally:
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as db:
            await db.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await store.close()


async def test_a_worker_whose_wake_ups_are_lost_subscribes_again_and_goes_on():
    # Before, the lost subscription (a PostgreSQL restart) raised out of the worker's task
    # group: it cancelled the turns the worker drove, and the worker stopped.
    from handrail import Worker

    inner, ledger = MemoryStore(), Ledger()
    lost = asyncio.Event()

    class Dropping(FlakyStore):
        subscriptions = 0

        def listen(self) -> Any:
            Dropping.subscriptions += 1
            if Dropping.subscriptions > 1:
                return inner.listen()

            @contextlib.asynccontextmanager
            async def dropped() -> AsyncIterator[Any]:
                async def wakeups() -> AsyncIterator[str]:
                    await lost.wait()
                    raise StoreUnavailableError("injected: the listening connection dropped")
                    yield ""  # pragma: no cover - an async generator

                yield wakeups()

            return dropped()

    store = Dropping(inner)
    calls = SCENARIOS["gated-parallel"]
    worker_engine, api = engine_for(store, calls, ledger), engine_for(inner, calls, ledger)
    stop = asyncio.Event()
    worker = asyncio.create_task(Worker(worker_engine, poll_interval=0.05).run(stop))
    lost.set()
    events = await drain(api.submit("s1", "go"))
    while Dropping.subscriptions < 2:
        assert not worker.done(), worker
        await asyncio.sleep(0.01)
    await api.resolve("s1", events[-1].pending[0], Approve())
    async with asyncio.timeout(5):
        while (await inner.summary("s1")).status != "completed":  # type: ignore[union-attr]  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    stop.set()
    await worker
    await check_settled(api, "s1", ledger)
