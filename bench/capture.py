"""Capture + apply of 100 chained actions: `python -m bench.capture`.

One headless turn on an instant scripted model makes 100 gated calls, each chained on the
previous one's temporary id (`orders.add_note(order_id="temp_41")`); all are captured. Then:

- `apply(actions, tools)`: the 100 actions run for real (async tools), each one's temporary
  ids replaced by the real ids the earlier ones returned;
- the same through the batch card on an `Engine` with a `MemoryStore` and a SQLite store
  (`run_headless(propose=True)`, one `Approve`, `Engine.apply`: every action logged in the
  tool-call log before and after it runs).

Printed: the capture turn's time per captured call, and apply's time per action (median of
several rounds). No target was set for these in the issue; the numbers are for the record.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from handrail import Agent, Approve, Engine, Runtime, apply, temp_id, tool
from handrail.store import MemoryStore, SessionStore, SqliteStore
from handrail.testing import ScriptedModel, call

N, ROUNDS = 100, 7


@tool(
    name="orders.step",
    permission="write",
    mint=lambda args, i: {"order_id": temp_id(i), "parent": args["parent"]},
)
async def step(parent: str, note: str) -> dict[str, Any]:
    """Make the next order of a chain."""
    return {"order_id": f"ORD-{note}", "parent": parent}


def script() -> ScriptedModel:
    steps: list[Any] = [[call("orders.step", parent="root", note="0")]]
    steps += [[call("orders.step", parent=f"temp_{i - 1}", note=str(i))] for i in range(1, N)]
    return ScriptedModel([*steps, "done"])


async def one_round(store: SessionStore | None) -> tuple[float, float]:
    agent = Agent("chain", tools=[step], model=script(), max_iterations=N + 5)
    runtime = Runtime(max_turn_iterations=N + 5)
    engine = Engine(agent, store=store or MemoryStore(), runtime=runtime)
    start = time.perf_counter()
    result = await engine.run_headless("s", "go", propose=store is not None)
    captured = time.perf_counter() - start
    assert len(result.actions) == N, result.text
    start = time.perf_counter()
    if store is None:
        report = await apply(result.actions, [step])
    else:
        assert result.card is not None
        await engine.resolve("s", result.card, Approve())
        report = await engine.apply("s")
    applied = time.perf_counter() - start
    assert report.ok and report.ids[f"temp_{N - 2}"] == f"ORD-{N - 2}"
    return captured, applied


async def measure(label: str, make_store: Any) -> None:
    rounds = [await one_round(make_store()) for _ in range(ROUNDS)]
    capture_us = statistics.median(c for c, _ in rounds) / N * 1e6
    apply_us = statistics.median(a for _, a in rounds) / N * 1e6
    print(f"  {label:<34} capture {capture_us:7.1f} µs/call   apply {apply_us:7.1f} µs/action")


async def main() -> None:
    print(f"capture + apply of {N} chained actions (median of {ROUNDS} rounds)")
    await measure("apply() (no store)", lambda: None)
    await measure("Engine batch card, MemoryStore", MemoryStore)
    with tempfile.TemporaryDirectory() as tmp:
        counter = iter(range(1000))

        def sqlite() -> SqliteStore:
            return SqliteStore(Path(tmp) / f"bench-{next(counter)}.db")

        await measure("Engine batch card, SqliteStore", sqlite)


if __name__ == "__main__":
    asyncio.run(main())
