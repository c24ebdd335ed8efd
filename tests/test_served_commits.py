"""How many commits a served turn makes: the engine's writes, and nothing for its events.

A server logs each event of a turn to the session's event log (what a client that reconnects
reads). The turn's saves carry them (`Engine.log_run`): its first write `run-started`, its
last the rest, however many text deltas its answer streams; a group goes on its own only when
no save carries it within `coalesce` seconds (never, for an instant turn). Counted in the
SQLite connection, as tests/test_durable_writes.py counts the engine's own.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import httpx
import pytest

from handrail import Agent, Engine, Runtime, tool
from handrail.models import ModelRequest
from handrail.server import ApiKeyAuthenticator, Caller, create_app
from handrail.store import SqliteStore
from handrail.testing import FunctionModel, Step, call
from test_durable_writes import Commits

KEY = {"Authorization": "Bearer key-ana"}
ANSWER = " ".join(f"word{n}" for n in range(40))  # streamed as many text deltas


@tool(name="orders.lookup")
def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped"}


@tool(name="orders.note", permission="write", approval="auto")
def note(order_id: str) -> str:
    """Note something on an order (a side effect, ungated)."""
    return "noted"


CALLS: dict[str, Step] = {
    "text": ANSWER,
    "read": call("orders.lookup", order_id="A1"),
    "write": call("orders.note", order_id="A1"),
}


def answer(request: ModelRequest) -> Step:
    last = request.messages[-1]
    return CALLS[last.text.split()[0]] if last.role == "user" else ANSWER


async def served_commits(tmp_path: Path, shape: str) -> tuple[int, int]:
    """(writing commits, events logged) of a served turn of `shape` (the second: the first
    sets the session up)."""
    store = SqliteStore(tmp_path / "h.db", audit_key=None)
    ids = itertools.count()
    engine = Engine(
        Agent("a", tools=[lookup, note]),
        store=store,
        runtime=Runtime(model=FunctionModel(answer), ids=lambda p: f"{p}_{next(ids)}"),
    )
    app = create_app(engine, authenticator=ApiKeyAuthenticator({"key-ana": Caller("acme", "ana")}))
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client,
        ):
            app.state.runs.coalesce = 60.0  # no group by the clock: the count is the turn's
            session = (await client.post("/sessions", headers=KEY)).json()["id"]
            counted = (0, 0)
            for turn in range(2):
                counter = Commits()
                await store._call(lambda db, c=counter: db.set_trace_callback(c), None)
                response = await client.post(
                    f"/sessions/{session}/turns", json={"text": f"{shape} {turn}"}, headers=KEY
                )
                assert response.status_code == 202, response.text
                after = int(response.json()["after"])
                await app.state.runs.join(session)
                await store._call(lambda db: db.set_trace_callback(None), None)
                logged = await store.events(session, after=after)
                assert logged[-1][1]["type"] == "run-completed"
                counted = (counter.writing, len(logged))
            return counted
    finally:
        await store.close()


@pytest.mark.parametrize(("shape", "engine"), [("text", 2), ("read", 2), ("write", 4)])
async def test_a_served_turns_events_cost_no_commit_beside_the_engines(
    tmp_path: Path, shape: str, engine: int
) -> None:
    commits, events = await served_commits(tmp_path, shape)
    assert events > 40  # every delta is logged, in the engine's own commits: 47 to 52
    # commits a turn here when each event was appended, engine + 2 when they were grouped
    assert commits == engine, (commits, events)
