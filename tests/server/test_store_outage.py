"""A store that stops answering mid-turn, under the server: the turn is cut off, not failed.

The turn's event log ends with `run-failed` `cut-off` (a client's stream ends, saying the turn
is left for recovery); the session stays `active` for a worker, and once the store is back the
turn is finished, the tool's effect made once.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import httpx

from flaky_store import FlakyStore
from handrail import Agent, Engine, Runtime, ToolContext, tool
from handrail.engine import StoreRetry
from handrail.server import create_app
from handrail.store import MemoryStore, SessionStore
from handrail.testing import FunctionModel, call

from .conftest import ANA, authenticator

charged: list[str] = []


@tool(permission="write", approval="auto", idempotent=True)
async def charge(ctx: ToolContext[None], order: str) -> str:
    """Charge an order (the provider deduplicates on the idempotency key)."""
    if ctx.idempotency_key not in charged:
        charged.append(ctx.idempotency_key)
    return f"charged {order}"


def _answer(request: Any) -> Any:
    return call("charge", order="A1") if request.messages[-1].role == "user" else "Charged."


async def test_a_turn_the_store_abandons_is_cut_off_for_recovery_not_failed() -> None:
    charged.clear()
    # log_finished fails past the retries (the rest of the store answers): as in the issue
    flaky = FlakyStore(MemoryStore(), fail={"log_finished": [1]}, down_for=10_000, only_method=True)
    engine = Engine(
        Agent("desk", tools=[charge]),
        store=cast(SessionStore, flaky),
        runtime=Runtime(model=FunctionModel(_answer)),
        store_retry=StoreRetry(attempts=2, delay=0.0, sleep=lambda _: asyncio.sleep(0)),
    )
    app = create_app(engine, authenticator=authenticator(), static_dir=None)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
    ):
        session = (await client.post("/sessions", headers=ANA)).json()["id"]
        turn = await client.post(f"/sessions/{session}/turns", json={"text": "go"}, headers=ANA)
        assert turn.status_code == 202, turn.text
        await asyncio.wait_for(app.state.runs.join(session), 30)
        flaky.heal()  # the store answers again: what the turn left is there to read
        logged = [event for _, event in await engine.store.events(session)]
        assert logged[-1]["type"] == "run-failed", logged  # the turn's streams end on it
        assert logged[-1]["reason"] == "cut-off"
        assert "left where it was" in logged[-1]["error"]
        view = (await client.get(f"/sessions/{session}", headers=ANA)).json()
        assert view["status"] == "active"  # left for recovery, never failed
        result = await engine.advance(session, org_id="acme", user_id="ana")
        assert result is not None and result.outcome == "completed"
    assert len(charged) == 1  # one charge, whatever ran again with its key
