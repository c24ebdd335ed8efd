"""A client call whose app was closed mid-turn expires after a short grace; the turn goes on."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from handrail import Agent, ApprovalCardPart, Engine, Runtime, tool
from handrail.models import ModelRequest
from handrail.server import create_app
from handrail.server._auth import Caller
from handrail.server._ui_stream import chat_session
from handrail.store import MemoryStore
from handrail.testing import FunctionModel, call

from .conftest import ANA, authenticator, frames
from .test_connections import serving

release: dict[str, asyncio.Event] = {}  # the event the `hold` tool waits for, per test


@tool(name="hold")
async def hold() -> str:
    """Work a while (until the test lets it finish)."""
    await release["hold"].wait()
    return "held"


@tool(executor="client")
def open_tab(url: str) -> str:
    """Open a tab in the user's browser."""
    raise AssertionError("a client tool never runs on the server")


def answer(request: ModelRequest) -> Any:
    calls = [p for m in request.messages for p in m.tool_calls]
    if not calls:
        return call("hold")
    if len(calls) == 1:
        return call("open_tab", url="https://example.com")
    return f"Could not open it: {calls[-1].result.error}"  # type: ignore[union-attr]


async def _closed_mid_turn_over_rest(client: httpx.AsyncClient) -> str:
    """A turn with client tools, its event stream in the same response, left mid-turn."""
    session = (await client.post("/sessions", headers=ANA)).json()["id"]
    seen: list[str] = []
    async with client.stream(
        "POST",
        f"/sessions/{session}/turns?client=true",
        json={"text": "open example.com"},
        headers={**ANA, "Accept": "text/event-stream"},
    ) as stream:
        async for frame in frames(stream):
            seen.append(frame.data["type"])
            if frame.data["type"] == "tool-call-started":
                break  # the app is closed while a tool runs
    assert "run-suspended" not in seen
    return str(session)


async def _closed_mid_turn_over_the_ui_stream(client: httpx.AsyncClient) -> str:
    """The AI SDK's `useChat` with client tools, its stream left mid-turn."""
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "open example.com"}]}
    body = {"id": "c-gone", "messages": [user], "handrail": {"clientTools": True}}
    async with client.stream("POST", "/chat", json=body, headers=ANA) as stream:
        assert stream.status_code == 200
        async for line in stream.aiter_lines():
            if '"type":"tool-input-available"' in line.replace(" ", ""):
                break  # the tab is closed while a tool runs
    return chat_session(Caller("acme", "ana"), "c-gone")


@pytest.mark.parametrize(
    "closed_mid_turn", [_closed_mid_turn_over_rest, _closed_mid_turn_over_the_ui_stream]
)
async def test_a_client_call_expires_soon_after_its_app_was_closed_and_the_turn_goes_on(
    closed_mid_turn: Callable[[httpx.AsyncClient], Awaitable[str]],
) -> None:
    release["hold"] = asyncio.Event()  # of this test's loop
    engine = Engine(
        Agent("desk", tools=[hold, open_tab]),
        store=MemoryStore(),
        runtime=Runtime(model=FunctionModel(answer)),
    )
    app = create_app(
        engine,
        authenticator=authenticator(),
        poll_interval=0.05,
        sweep_interval=0.05,
        client_grace=0.2,
    )
    async with (
        serving(app) as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client,
    ):
        session = await closed_mid_turn(client)
        release["hold"].set()  # the turn goes on to the client call, with nobody to run it
        async with asyncio.timeout(10):
            while True:
                view = (await client.get(f"/sessions/{session}", headers=ANA)).json()
                if view["status"] == "completed":
                    break
                await asyncio.sleep(0.05)
        assert view["pending"] == []
        text = view["messages"][-1]["parts"][0]["text"]
        assert text.startswith(
            "Could not open it: The app was closed before it could run 'open_tab'"
        )
        state = await engine.session(session, org_id="acme", user_id="ana")
        (card,) = [p for m in state.messages for p in m.parts if isinstance(p, ApprovalCardPart)]
        assert (card.kind, card.decision) == ("client_exec", "expire")
