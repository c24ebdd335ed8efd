"""The app `tests/test_scheduling.py` runs under `handrail worker` and `handrail run`.

`scheduling_app:app` is an async context-manager function (the app contract's richest form):
it writes `opened` on entry and `closed` on exit to `SCHEDULING_DIR/app.txt`, so a test sees
the app closed after a drain. A message says what its turn does: `hello` answers; `fail`
makes the model fail; `refund ORDER` refunds it (gated: a person with the role `approver`
approves; headless: its `mint` predicts it); `slow ORDER` refunds it once the file
`SCHEDULING_DIR/gate` exists (a turn in flight for as long as the test likes); `wait` calls
a read-only tool that waits for the gate. Each refund's start and effect (and `waiting`) are
lines of `SCHEDULING_DIR/effects.txt`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from handrail import Agent, DecisionPolicy, Engine, temp_id, tool
from handrail.models import ModelRequest
from handrail.testing import FunctionModel, call


def folder() -> Path:
    return Path(os.environ["SCHEDULING_DIR"])


def _append(path: Path, line: str) -> None:
    with path.open("a") as file:
        file.write(line + "\n")
        file.flush()
        os.fsync(file.fileno())


APPROVERS = DecisionPolicy(roles={"approver"})
"""Who may approve a refund (and a batch of them): a person with the role `approver`."""


@tool
async def wait() -> str:
    """Wait until the file `gate` exists (read-only: runs at once, headless too)."""
    _append(folder() / "effects.txt", "waiting")
    while not (folder() / "gate").exists():  # noqa: ASYNC110 - another process opens it
        await asyncio.sleep(0.02)
    return "the gate is open"


@tool(
    permission="write",
    decision_policy=APPROVERS,
    mint=lambda args, i: {"refund_id": temp_id(i), "order": args["order"]},
)
async def refund(order: str, slow: bool = False) -> dict[str, str]:
    """Refund an order."""
    _append(folder() / "effects.txt", f"started {order}")
    while slow and not (folder() / "gate").exists():  # noqa: ASYNC110 - another process opens it
        await asyncio.sleep(0.02)
    _append(folder() / "effects.txt", f"refunded {order}")
    return {"refund_id": f"R-{order}", "order": order}


def answer(request: ModelRequest) -> Any:
    last = request.messages[-1]
    if last.role != "user":
        return "Refunded."
    verb, _, order = last.text.partition(" ")
    if verb == "fail":
        raise RuntimeError("the model is down")
    if verb == "wait":
        return call("wait")
    if verb in ("refund", "slow"):
        return call("refund", order=order, slow=verb == "slow")
    return "Hello."


def agent() -> Agent[Any]:
    return Agent("clerk", tools=[refund, wait], model=FunctionModel(answer))


@contextlib.asynccontextmanager
async def app() -> AsyncIterator[Engine]:
    _append(folder() / "app.txt", "opened")
    try:
        yield Engine(agent(), lease_ttl=float(os.environ.get("SCHEDULING_LEASE_TTL", "30")))
    finally:
        _append(folder() / "app.txt", "closed")
