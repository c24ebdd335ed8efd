"""Who may decide, through the HTTP API: five identities in two organisations.

acme: ana (requests the wipe; no role), bo and cy (it-admin), di (sales); globex: eve
(it-admin). The wipe needs two it-admins, neither of them its requester.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from handrail import Agent, DecisionPolicy, Domain, Engine, Runtime, tool
from handrail.server import ApiKeyAuthenticator, create_app
from handrail.store import MemoryStore
from handrail.testing import ScriptedModel, call

ANA, BO, CY, DI, EVE = (
    {"Authorization": f"Bearer key-{n}"} for n in ("ana", "bo", "cy", "di", "eve")
)
SPECS = [
    "acme:ana:key-ana",
    "id=bo-laptop,org=acme,user=bo,roles=it-admin,key=key-bo",
    "id=cy-1,org=acme,user=cy,roles=helpdesk+it-admin,expires=2100-01-01,key=key-cy",
    "id=di-1,org=acme,user=di,roles=sales,key=key-di",
    "id=eve-1,org=globex,user=eve,roles=it-admin,key=key-eve",
    "id=old,org=acme,user=bo,roles=it-admin,expires=2020-01-01,key=key-old",
]

wiped: list[str] = []


@tool(name="laptops.wipe", permission="destructive", amendable=["reason"])
def wipe(laptop: str, reason: str = "lost") -> str:
    """Wipe a laptop."""
    wiped.append(laptop)
    return f"wiped {laptop}"


@dataclass
class Api:
    app: Starlette
    client: httpx.AsyncClient

    async def wipe_requested(self) -> tuple[str, str]:
        """ana's session, suspended on the wipe of her laptop: (session id, call id)."""
        session = (await self.client.post("/sessions", headers=ANA)).json()["id"]
        turn = await self.client.post(
            f"/sessions/{session}/turns", json={"text": "wipe"}, headers=ANA
        )
        assert turn.status_code == 202, turn.text
        await self.app.state.runs.join(session)
        [card] = (await self.client.get(f"/sessions/{session}", headers=ANA)).json()["pending"]
        return session, card["tool_call_id"]

    async def decide(self, who: dict[str, str], session: str, call_id: str, **body: Any) -> Any:
        decision = {"decision": "approve", **body}
        return await self.client.post(
            f"/sessions/{session}/resolve",
            json={"tool_call_id": call_id, "decision": decision},
            headers=who,
        )


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    wiped.clear()
    model = ScriptedModel([[call("laptops.wipe", laptop="L-7")], "Wiped."])
    policy = DecisionPolicy(roles={"it-admin"}, four_eyes=True, approvals=2)
    engine = Engine(
        Domain(agents=[Agent("desk", tools=[wipe])], policies={"destructive": policy}),
        store=MemoryStore(),
        runtime=Runtime(model=model),
    )
    keys = ApiKeyAuthenticator()
    for spec in SPECS:
        keys.add_spec(spec)
    app = create_app(engine, authenticator=keys)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
    ):
        yield Api(app=app, client=client)


async def test_an_approver_reads_a_colleagues_session_that_waits_for_them_and_nothing_else(
    api: Api,
) -> None:
    session, call_id = await api.wipe_requested()
    path = f"/sessions/{session}"
    assert (await api.client.get(path, headers=BO)).json()["pending"][0]["tool_call_id"] == call_id
    for outsider in (DI, EVE):  # no role; the role, in another organisation
        response = await api.client.get(path, headers=outsider)
        assert (response.status_code, response.json()["error"]["type"]) == (404, "not_found")
    for method, tail in (
        ("GET", "/export"),
        ("GET", "/events"),
        ("DELETE", ""),
        ("POST", "/interrupt"),
    ):
        response = await api.client.request(method, path + tail, headers=BO)
        assert response.status_code == 404, (method, tail)  # only reading and deciding
    assert (await api.client.get("/sessions", headers=BO)).json()["sessions"] == []
    inbox = "/sessions?to_decide=true"
    assert [s["id"] for s in (await api.client.get(inbox, headers=BO)).json()["sessions"]] == [
        session
    ]
    for nobody in (ANA, DI, EVE):  # her own; no role; another organisation
        assert (await api.client.get(inbox, headers=nobody)).json()["sessions"] == []
    # decided, the session is no longer the approvers' to read
    await api.decide(BO, session, call_id)
    await api.decide(CY, session, call_id)
    await api.app.state.runs.join(session)
    assert (await api.client.get(path, headers=BO)).status_code == 404
    assert (await api.client.get(inbox, headers=BO)).json()["sessions"] == []
    assert (await api.client.get(path, headers=ANA)).json()["status"] == "completed"


async def test_decisions_that_break_the_policy_are_refused_with_403_naming_the_rule(
    api: Api,
) -> None:
    session, call_id = await api.wipe_requested()
    refused = await api.decide(ANA, session, call_id)  # her own wipe, and she has no role
    assert refused.status_code == 403
    assert refused.json()["error"]["type"] == "decision_not_allowed"
    assert refused.json()["error"]["message"].startswith(
        "laptops.wipe needs the role it-admin; ana has none of them"
    )
    assert (await api.decide(DI, session, call_id)).status_code == 404  # cannot even reach it
    assert (await api.decide(EVE, session, call_id)).status_code == 404
    # the body names another decider: the caller decides, as its key says
    first = await api.decide(BO, session, call_id, by="cy")
    assert first.json() | {"events": None} == {
        "decided": [],
        "pending": [call_id],
        "resumed": False,
        "after": None,
        "events": None,
    }
    again = await api.decide(BO, session, call_id)
    assert again.status_code == 403
    assert "bo already approved it (1 of 2)" in again.json()["error"]["message"]
    [card] = (await api.client.get(f"/sessions/{session}", headers=ANA)).json()["pending"]
    assert [a["by"] for a in card["approvals"]] == ["bo"]
    assert wiped == []
    second = await api.decide(CY, session, call_id)
    assert second.status_code == 200 and second.json()["resumed"] is True
    assert second.json()["events"] is None  # the stream is ana's: no link cy cannot follow
    await api.app.state.runs.join(session)
    assert wiped == ["L-7"]


async def test_a_rejection_by_the_requester_withdraws_the_call(api: Api) -> None:
    session, call_id = await api.wipe_requested()
    response = await api.decide(ANA, session, call_id, decision="reject", reason="found it")
    assert response.status_code == 200 and response.json()["resumed"] is True
    assert response.json()["events"].startswith(f"/sessions/{session}/events?after=")
    await api.app.state.runs.join(session)
    assert wiped == []


async def test_two_approvers_racing_both_count_and_the_wipe_runs_once(api: Api) -> None:
    session, call_id = await api.wipe_requested()
    answers = await asyncio.gather(
        api.decide(BO, session, call_id), api.decide(CY, session, call_id)
    )
    assert [a.status_code for a in answers] == [200, 200]
    assert sorted(a.json()["resumed"] for a in answers) == [False, True]
    await api.app.state.runs.join(session)
    assert wiped == ["L-7"]
    body = (await api.client.get(f"/sessions/{session}", headers=ANA)).json()
    cards = [p for m in body["messages"] for p in m["parts"] if p["type"] == "approval"]
    assert sorted(a["by"] for a in cards[0]["approvals"]) == ["bo", "cy"]
    assert cards[0]["decision"] == "approve"


async def test_the_domain_tells_a_ui_who_decides(api: Api) -> None:
    [body] = (await api.client.get("/domain", headers=DI)).json()["tools"]
    assert body["decision_policy"] == {
        "roles": ["it-admin"],
        "four_eyes": True,
        "approvals": 2,
        "withdraw": True,
    }


async def test_an_expired_key_authenticates_nobody(api: Api) -> None:
    response = await api.client.get("/sessions", headers={"Authorization": "Bearer key-old"})
    assert response.status_code == 401
