"""A worker process for the crash tests: drives one session to its end, whatever it finds.

`python tests/crash_worker.py DB EFFECTS SESSION [LEASE_TTL]`. The test kills it with SIGKILL
at a random moment, or the worker kills itself with SIGKILL at the point named by the
environment variable `CRASH_AT`; then the test starts another one on the same session, which
must finish the turn with exactly one effect per approved call.

`CRASH_AT`: `charge-started` (inside the charge, before its effect), `charge-done` (inside the
charge, after its effect), `suspended` (while the charge waits for approval), `after-result`
(the charge returned; the worker dies before the session is saved again); and right after each
write that groups several of a turn's (docs/durability.md, "What is written, and when"):
`leased` (the user's message with the lease taken: a drive's first write),
`checkpoint-started` (the session with the ship call, the lease check and the ship's `started`),
`suspend-released` (the suspension with the lease given back), `decided` (the decision that
wakes the workers), `resume-started` (the resumption's first write: its lease taken, with the
session and the charge's `started`), `started-leased` (a call's `started` alone, with the lease
check: a later sequential call's; not in this domain's turn), `completed-released` (the last
save with the lease given back).

The domain: a customer orders; the agent ships the order (`orders.ship`: a side effect,
idempotent: the carrier deduplicates on the idempotency key) and charges it (`orders.charge`:
a side effect, not idempotent, gated: a person approves it). Effects are lines appended to the
EFFECTS file, flushed and fsynced, so they survive the kill. The person in the loop approves
charges, and when asked about a charge that may have run after a crash, checks the EFFECTS
file (as one would check the bank) and retries only if it did not happen.
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path
from typing import Any

from handrail import (
    Agent,
    Approve,
    Engine,
    Reject,
    Runtime,
    SessionBusyError,
    ToolContext,
    tool,
)
from handrail.models import ModelRequest
from handrail.store import SessionStore, SqliteStore
from handrail.testing import FunctionModel, call
from kill_points import append, crash, lines


class KillingStore(SqliteStore):
    """A `SqliteStore` whose process dies right after a grouped write commits (`CRASH_AT`)."""

    async def save(self, record: Any, **grouped: Any) -> Any:
        saved = await super().save(record, **grouped)
        if grouped.get("lease") and not grouped.get("started"):
            crash("leased")  # a drive's first write (the user's message): its lease taken
        if grouped.get("started"):
            crash("checkpoint-started")
            if any(entry.tool == "orders.charge" for entry in grouped["started"]):
                # the resumption's first write: its lease, the session and the charge's start
                crash("resume-started")
        if grouped.get("release"):
            crash(f"{'suspend' if record.status == 'suspended' else record.status}-released")
        if grouped.get("notify"):
            crash("decided")
        return saved

    async def log_started(self, *args: Any, **kwargs: Any) -> bool:
        logged = await super().log_started(*args, **kwargs)
        if kwargs.get("lease") is not None:
            crash("started-leased")
        return logged


async def _jitter() -> None:
    await asyncio.sleep(random.uniform(0, 0.03))


def build(store: SessionStore, effects: Path, lease_ttl: float) -> Engine:
    @tool(name="orders.ship", permission="write", approval="auto", idempotent=True)
    async def ship(ctx: ToolContext[None], order: str) -> str:
        """Ship an order (the carrier deduplicates on the idempotency key)."""
        await _jitter()
        if f"ship {order} {ctx.idempotency_key}" not in lines(effects):
            append(effects, f"ship {order} {ctx.idempotency_key}")
        await _jitter()
        return f"shipped {order}"

    @tool(name="orders.charge", permission="write")
    async def charge(order: str) -> str:
        """Charge an order (not idempotent: a second call charges twice)."""
        await _jitter()
        crash("charge-started")
        append(effects, f"charge {order}")
        crash("charge-done")
        await _jitter()
        return f"charged {order}"

    async def answer(request: ModelRequest) -> Any:
        await _jitter()
        done = {p.name for m in request.messages for p in m.tool_calls}
        order = request.messages[0].text.split()[-1]
        if "orders.ship" not in done:
            return call("orders.ship", order=order)
        if "orders.charge" not in done:
            return call("orders.charge", order=order)
        crash("after-result")
        return f"Order {order} shipped and charged."

    agent = Agent("desk", tools=[ship, charge])
    runtime = Runtime(model=FunctionModel(answer))
    return Engine(agent, store=store, runtime=runtime, lease_ttl=lease_ttl)


def decide(card: Any, session: str, effects: Path) -> Any:
    """What the person in the loop decides on a card."""
    if card.kind == "recovery":  # did the charge happen? check the bank
        ran = f"charge {session}" in lines(effects)
        return Reject(reason="it went through") if ran else Approve()
    return Approve(by="ops")


async def drive(engine: Engine, session: str, effects: Path) -> str:
    """Take the session from wherever it is to the end of its turn; return its last event."""
    while True:
        try:
            record = await engine.store.load(session)
            if record is None:
                run = engine.submit(session, f"Please process order {session}")
            else:
                state = await engine.session(session)
                progress = state.progress
                if progress is None:
                    return record.status
                if progress.status == "running":
                    run = engine.recover(session)
                else:
                    for call_id, card in list(state.pending.items()):
                        await engine.resolve(session, call_id, decide(card, session, effects))
                    run = engine.resume(session)
            async for event in run:
                if event.type == "run-suspended":
                    crash("suspended")
        except SessionBusyError:
            await asyncio.sleep(0.05)  # the killed worker's lease has not expired yet


async def main(db: str, effects: str, session: str, lease_ttl: float) -> None:
    engine = build(KillingStore(db), Path(effects), lease_ttl)
    try:
        print("started", flush=True)
        outcome = await drive(engine, session, Path(effects))
        print(f"done {outcome}", flush=True)
    finally:
        await engine.store.close()


if __name__ == "__main__":
    ttl = float(sys.argv[4]) if len(sys.argv) > 4 else 0.5
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], ttl))
