"""A server over a `PartitionedStore`: each tenant's sessions are made in its partition.

`POST /sessions` and the chat endpoints mint ids that begin with the caller's organisation's
partition, and everything else (turns, streams, decisions, the inbox) follows the id.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import httpx
import pytest

from handrail.demo.support_desk import CUSTOMER_MESSAGE, build_scenario
from handrail.server import Caller, create_app
from handrail.server._ui_stream import chat_session
from handrail.store import MemoryStore, PartitionedStore

from .conftest import ANA, BOB, Server, StreamingTransport, authenticator
from .test_api import SUSPENDED, approve


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    parts = {"a": MemoryStore(), "b": MemoryStore()}
    store = PartitionedStore(parts, {"acme": "a", "globex": "b"}.__getitem__)
    scenario = build_scenario(store=store)
    app = create_app(scenario.engine, authenticator=authenticator(), poll_interval=0.2)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
        httpx.AsyncClient(transport=StreamingTransport(app), base_url="http://test") as streaming,
    ):
        yield Server(app=app, scenario=scenario, client=client, streaming=streaming)


def parts(server: Server) -> dict[str, MemoryStore]:
    store = server.scenario.engine.store
    assert isinstance(store, PartitionedStore)
    return {key: s for key, s in store.stores.items() if isinstance(s, MemoryStore)}


async def test_each_tenants_sessions_are_made_and_driven_in_its_partition(server: Server):
    ana, bob = await server.new_session(ANA), await server.new_session(BOB)
    assert ana.startswith("a:") and bob.startswith("b:")
    assert [s.id for s in await parts(server)["a"].list()] == [ana]
    assert [s.id for s in await parts(server)["b"].list()] == [bob]

    after = await server.submit(ana)
    events = await server.events(ana, after)
    assert [t for t, _ in itertools.groupby(e.type for e in events)] == SUSPENDED
    (call_id,) = events[-1].data["pending"]

    inbox = await server.client.get("/pending", headers=ANA)
    assert [c["session_id"] for c in inbox.json()["cards"]] == [ana]
    assert (await server.client.get("/pending", headers=BOB)).json()["cards"] == []
    assert (await server.client.get(f"/sessions/{ana}", headers=BOB)).status_code == 404

    response = await server.client.post(
        f"/sessions/{ana}/resolve", json=approve(call_id), headers=ANA
    )
    assert response.status_code == 200, response.text
    events = await server.events(ana, response.json()["after"])
    assert events[-1].type == "run-completed"
    assert [e.session_id for e in await parts(server)["a"].audit("acme")] == [ana, ana]
    assert await parts(server)["b"].audit("acme") == []


async def test_a_chat_is_made_in_its_tenants_partition(server: Server):
    body = {
        "id": "c-1",
        "messages": [
            {"id": "u1", "role": "user", "parts": [{"type": "text", "text": CUSTOMER_MESSAGE}]}
        ],
    }
    async with server.streaming.stream("POST", "/chat", json=body, headers=BOB) as response:
        assert response.status_code == 200
        text = (await response.aread()).decode()
    assert "approval" in text  # the refund waits for its approval
    store = server.scenario.engine.store
    session_id = chat_session(Caller("globex", "bob"), "c-1", store)
    assert session_id.startswith("b:chat-")
    assert [s.id for s in await parts(server)["b"].list()] == [session_id]
    assert await parts(server)["a"].list() == []
