"""The engine that `handrail serve` processes load in tests/server/test_processes.py.

`handrail serve procs_app:engine` (from this directory), configured by the environment:
`PROCS_DSN` and `PROCS_SCHEMA` (the PostgreSQL store they share), `PROCS_DIR` (where
effects and markers are written), `PROCS_LEASE_TTL`.

A session's first message says what its one turn does: `ship ORDER` ships it (a side effect,
idempotent: deduplicated on the idempotency key, as a carrier would); `hold ORDER` ships it
and then, on the first attempt only, blocks inside the tool (after its effect, before its
result is logged) so that the test can kill the process there; `charge ORDER` charges it (a
side effect, gated: a person approves it). Effects are lines of `PROCS_DIR/effects.txt`.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from handrail import Agent, Engine, Runtime, ToolContext, tool
from handrail.models import ModelRequest
from handrail.store import MemoryStore, PostgresStore
from handrail.testing import FunctionModel, call


def _append(path: Path, line: str) -> None:
    with path.open("a") as file:
        file.write(line + "\n")
        file.flush()
        os.fsync(file.fileno())


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def build(store: Any, folder: Path, lease_ttl: float) -> Engine:
    effects = folder / "effects.txt"

    @tool(name="orders.ship", permission="write", approval="auto", idempotent=True)
    async def ship(ctx: ToolContext[None], order: str, hold: bool = False) -> str:
        """Ship an order (the carrier deduplicates on the idempotency key)."""
        line = f"ship {order} {ctx.idempotency_key}"
        if line not in _lines(effects):
            _append(effects, line)
        marker = folder / f"holding-{order}"
        if hold and not marker.exists():
            _append(marker, str(os.getpid()))  # the test kills this process now
            await asyncio.Event().wait()  # forever
        return f"shipped {order}"

    @tool(name="orders.charge", permission="write")
    async def charge(order: str) -> str:
        """Charge an order (not idempotent: a second call charges twice)."""
        _append(effects, f"charge {order}")
        return f"charged {order}"

    async def answer(request: ModelRequest) -> Any:
        verb, order = request.messages[0].text.split()[:2]
        made = [p.name for m in request.messages for p in m.tool_calls]
        if made:
            return f"Done: {verb} {order}."
        if verb == "charge":
            return call("orders.charge", order=order)
        return call("orders.ship", order=order, hold=verb == "hold")

    agent = Agent("desk", tools=[ship, charge])
    return Engine(
        agent, store=store, runtime=Runtime(model=FunctionModel(answer)), lease_ttl=lease_ttl
    )


def engine() -> Engine:
    """The engine of one server process (a factory: each process makes its own)."""
    store = PostgresStore(os.environ["PROCS_DSN"], schema=os.environ["PROCS_SCHEMA"], pool_size=4)
    return build(store, Path(os.environ["PROCS_DIR"]), float(os.environ["PROCS_LEASE_TTL"]))


def memory_engine() -> Engine:
    """An engine on a `MemoryStore`, which `handrail serve --workers 2` refuses."""
    return build(MemoryStore(), Path("."), 30.0)
