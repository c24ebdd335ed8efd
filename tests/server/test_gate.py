"""The app's gate: a caller it refuses starts no turn over any protocol (403 and the app's
reason), and nothing is stored; a caller it lets in goes on as before."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from handrail import Engine, TurnRefusedError, TurnRequest
from handrail.demo.support_desk import CUSTOMER_MESSAGE, build_scenario
from handrail.server import ApiKeyAuthenticator, Caller, create_app
from handrail.store import MemoryStore

from .conftest import ANA, BOB, StreamingTransport

REASON = "Your plan does not include the support desk: upgrade at example.com/plans."


class Plans:
    """A gate: organisations on a plan start turns; what it was asked is kept."""

    def __init__(self, *paying: str) -> None:
        self.paying = set(paying)
        self.asked: list[TurnRequest] = []

    async def __call__(self, request: TurnRequest) -> str | None:  # a coroutine: may await
        self.asked.append(request)
        return None if request.org_id in self.paying else REASON


def _server(gate: Plans) -> tuple[Engine, MemoryStore, Any]:
    store = MemoryStore()
    engine = build_scenario(store=store).engine
    engine.gate = gate
    keys = ApiKeyAuthenticator(
        {
            "key-ana": Caller("acme", "ana", frozenset({"agent"}), "key:ana"),
            "key-bob": Caller("globex", "bob"),
        }
    )
    return engine, store, create_app(engine, authenticator=keys, static_dir=None)


def _agui_input(thread: str) -> dict[str, Any]:
    message = {"id": "m-1", "role": "user", "content": CUSTOMER_MESSAGE}
    return {
        "threadId": thread,
        "runId": "r-1",
        "state": None,
        "messages": [message],
        "tools": [],
        "context": [],
        "forwardedProps": None,
    }


def _chat_input(chat: str) -> dict[str, Any]:
    message = {"id": "m-1", "role": "user", "parts": [{"type": "text", "text": CUSTOMER_MESSAGE}]}
    return {"id": chat, "messages": [message]}


def _refused(response: httpx.Response) -> None:
    assert response.status_code == 403, response.text
    assert response.json()["error"]["type"] == "turn_refused"
    assert response.json()["error"]["message"] == REASON


async def _nothing_stored(store: MemoryStore) -> None:
    assert await store.list() == []


async def test_a_refused_caller_makes_no_session_over_the_http_api() -> None:
    gate = Plans("acme")
    _, store, app = _server(gate)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        _refused(await c.post("/sessions", headers=BOB))
        await _nothing_stored(store)
        created = await c.post("/sessions", headers=ANA)
        assert created.status_code == 201
    assert [(r.org_id, r.via, r.session_id) for r in gate.asked] == [
        ("globex", "http", None),
        ("acme", "http", None),
    ]
    assert gate.asked[1].roles == {"agent"} and gate.asked[1].credential == "key:ana"


async def test_a_caller_whose_plan_lapsed_starts_no_turn_in_its_session() -> None:
    gate = Plans("acme")
    _, store, app = _server(gate)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        session = (await c.post("/sessions", headers=ANA)).json()["id"]
        gate.paying.clear()  # the plan lapsed
        turn = {"text": CUSTOMER_MESSAGE}
        _refused(await c.post(f"/sessions/{session}/turns", json=turn, headers=ANA))
        streamed = await c.post(
            f"/sessions/{session}/turns",
            json=turn,
            headers={**ANA, "Accept": "text/event-stream"},
        )
        _refused(streamed)
    assert await store.events(session, after=0, limit=10) == []
    assert await store.messages(session, limit=10) == []
    assert gate.asked[-1].text == CUSTOMER_MESSAGE and gate.asked[-1].session_id == session


@pytest.mark.parametrize(
    ("path", "body", "via"),
    [("/agui", _agui_input, "agui"), ("/chat", _chat_input, "ui-stream")],
    ids=["agui", "ui-stream"],
)
async def test_a_refused_caller_gets_403_before_a_chat_protocols_stream(
    path: str, body: Any, via: str
) -> None:
    gate = Plans("acme")
    _, store, app = _server(gate)
    async with httpx.AsyncClient(transport=StreamingTransport(app), base_url="http://t") as c:
        refused = await c.post(path, json=body("t-1"), headers=BOB)
        await refused.aread()
        _refused(refused)
        await _nothing_stored(store)
        async with c.stream("POST", path, json=body("t-1"), headers=ANA) as theirs:
            assert theirs.status_code == 200  # a paying organisation's turn starts
            assert b"failed" not in await theirs.aread()
    assert [(r.org_id, r.via, r.text) for r in gate.asked] == [
        ("globex", via, CUSTOMER_MESSAGE),
        ("acme", via, CUSTOMER_MESSAGE),
    ]
    assert len(await store.list()) == 1


async def test_admit_raises_the_gates_reason_and_refuses_a_gate_that_answers_otherwise() -> None:
    engine = build_scenario().engine
    engine.gate = lambda request: REASON if request.user_id == "bob" else None
    await engine.admit(TurnRequest(org_id="acme", user_id="ana"))
    with pytest.raises(TurnRefusedError, match=r"^Your plan") as refused:
        await engine.admit(TurnRequest(org_id="acme", user_id="bob"))
    assert refused.value.reason == REASON
    engine.gate = lambda request: False  # type: ignore[assignment,return-value]
    with pytest.raises(Exception, match="returns None to let the caller start a turn"):
        await engine.admit(TurnRequest(org_id="acme", user_id="ana"))
