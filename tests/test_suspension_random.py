"""Random storms of decisions against a suspended run: no tool ever runs twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from handrail import (
    Agent,
    ApprovalCardPart,
    Approve,
    ConflictError,
    Engine,
    Reject,
    Runtime,
    SessionBusyError,
    StaleResolutionError,
    UserError,
    tool,
)
from handrail.store import MemoryStore
from handrail.testing import FunctionModel, call, sequential_ids

# An operation: resolve call `i` (or an unknown id when i is None) with approve/reject, on
# engine `e`; or resume on engine `e`. Operations in one inner list run concurrently.
resolve_op = st.tuples(
    st.just("resolve"),
    st.one_of(st.none(), st.integers(0, 3)),
    st.booleans(),
    st.integers(0, 1),
)
resume_op = st.tuples(st.just("resume"), st.none(), st.booleans(), st.integers(0, 1))
storms = st.lists(st.lists(st.one_of(resolve_op, resume_op), min_size=1, max_size=4), max_size=8)


@settings(max_examples=80, deadline=None)
@given(n_calls=st.integers(1, 4), storm=storms)
def test_each_approved_call_runs_exactly_once_and_each_rejected_one_never(
    n_calls: int, storm: list[list[tuple[str, int | None, bool, int]]]
) -> None:
    asyncio.run(_storm(n_calls, storm))


async def _storm(n_calls: int, storm: list[list[tuple[str, int | None, bool, int]]]) -> None:
    ran: Counter[int] = Counter()

    @tool(permission="write")
    async def act(n: int) -> int:
        """Act on n."""
        await asyncio.sleep(0)  # let the other tasks of the storm in mid-call
        ran[n] += 1
        return n

    def answer(request: Any) -> Any:
        if len(request.messages) == 1:
            return [call("act", n=i) for i in range(n_calls)]
        return "done"

    store = MemoryStore()
    agent = Agent("a", tools=[act])
    runtime = Runtime(model=FunctionModel(answer), ids=sequential_ids())
    engines = [Engine(agent, store=store, runtime=runtime) for _ in range(2)]
    events = [e async for e in engines[0].submit("s", "go")]
    assert events[-1].type == "run-suspended"
    ids = events[-1].pending

    async def op(kind: str, index: int | None, approve: bool, e: int) -> None:
        engine = engines[e]
        try:
            if kind == "resume":
                async for _ in engine.resume("s"):
                    pass
            else:
                call_id = "unknown" if index is None else ids[index % n_calls]
                decision = Approve() if approve else Reject()
                await engine.resolve("s", call_id, decision)
        except (StaleResolutionError, UserError, SessionBusyError, ConflictError):
            pass  # refused: and refused means nothing changed

    for batch in storm:
        await asyncio.gather(*(op(*o) for o in batch))

    # Settle whatever the storm left (every call, from both workers at once), resume from both
    # workers at once, then check every call's fate against its card.
    await asyncio.gather(*(op("resolve", i, True, i % 2) for i in range(n_calls)))
    await asyncio.gather(op("resume", None, True, 0), op("resume", None, True, 1))
    state = await engines[0].session("s")
    assert state.progress is None and not state.pending
    decisions = {
        p.tool_call_id: p.decision
        for m in state.messages
        for p in m.parts
        if isinstance(p, ApprovalCardPart)
    }
    for i, call_id in enumerate(ids):
        expected = 1 if decisions[call_id] == "approve" else 0
        assert ran[i] == expected, (call_id, decisions[call_id], ran)
