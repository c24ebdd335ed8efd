"""The rules of deciding hold on every surface: REST, AG-UI and the AI SDK's UI stream.

acme: ana requests (no role), bo and cy (finance), di (no role). `pay` needs two approvals
of the same arguments; `confirm` is a person's answer that only a manager other than the
requester may give; `scan` runs in the client and its result needs the role `kiosk`.
The AG-UI and UI-stream tests drive the protocols' own clients (Node) over a real socket.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from handrail import Agent, DecisionPolicy, Domain, Engine, Runtime, tool
from handrail.server import ApiKeyAuthenticator, create_app
from handrail.store import MemoryStore
from handrail.suspension import args_digest
from handrail.testing import ScriptedModel, call

from .test_uvicorn import serving

ANA, BO, CY, DI = ({"Authorization": f"Bearer key-{n}"} for n in ("ana", "bo", "cy", "di"))
SPECS = [
    "acme:ana:key-ana",
    "id=bo-1,org=acme,user=bo,roles=finance+manager+auditor,key=key-bo",
    "id=cy-1,org=acme,user=cy,roles=finance,key=key-cy",
    "id=di-1,org=acme,user=di,roles=kiosk,key=key-di",
]
PAY = DecisionPolicy(approvals=2)  # any member of acme, the requester included
MANAGERS = DecisionPolicy(roles={"manager"}, four_eyes=True)
STRICT = DecisionPolicy(roles={"manager"}, four_eyes=True, withdraw=False)

paid: list[float] = []


@tool(name="pay", permission="destructive", amendable=["amount"], decision_policy=PAY)
def pay(to: str, amount: float) -> str:
    """Pay someone."""
    paid.append(amount)
    return f"paid {amount} to {to}"


@tool(name="confirm", executor="human", decision_policy=MANAGERS)
def confirm(question: str) -> str:
    """Ask a manager to confirm something."""
    raise NotImplementedError


@tool(name="confirm_strict", executor="human", decision_policy=STRICT)
def confirm_strict(question: str) -> str:
    """Ask a manager; the requester may not withdraw the question."""
    raise NotImplementedError


@tool(
    name="scan",
    executor="client",
    approval="required",
    decision_policy=DecisionPolicy(roles={"kiosk"}),
)
def scan(badge: str) -> str:
    """Scan a badge at a kiosk (the client runs it, once someone with the role approved)."""
    raise NotImplementedError


def _engine(*steps: Any) -> Engine:
    agent = Agent("desk", tools=[pay, confirm, confirm_strict, scan])
    return Engine(
        Domain(agents=[agent]),
        store=MemoryStore(),
        runtime=Runtime(model=ScriptedModel([*steps, "Done."])),
    )


def _app(engine: Engine) -> Starlette:
    keys = ApiKeyAuthenticator()
    for spec in SPECS:
        keys.add_spec(spec)
    return create_app(engine, authenticator=keys, static_dir=None)


@dataclass
class Api:
    app: Starlette
    client: httpx.AsyncClient

    async def requested(self, text: str = "go", client: bool = False) -> tuple[str, str]:
        """ana's session, suspended on the scripted call: (session id, call id)."""
        session = (await self.client.post("/sessions", headers=ANA)).json()["id"]
        query = "?client=true" if client else ""
        turn = await self.client.post(
            f"/sessions/{session}/turns{query}", json={"text": text}, headers=ANA
        )
        assert turn.status_code == 202, turn.text
        await self.app.state.runs.join(session)
        [card] = (await self.client.get(f"/sessions/{session}", headers=ANA)).json()["pending"]
        return session, card["tool_call_id"]

    async def decide(self, who: dict[str, str], session: str, call_id: str, **body: Any) -> Any:
        decision = {"decision": "approve", **body}
        response = await self.client.post(
            f"/sessions/{session}/resolve",
            json={"tool_call_id": call_id, "decision": decision},
            headers=who,
        )
        await self.app.state.runs.join(session)
        return response

    async def card(self, who: dict[str, str], session: str) -> dict[str, Any]:
        [card] = (await self.client.get(f"/pending?session_id={session}", headers=who)).json()[
            "cards"
        ]
        return card  # type: ignore[no-any-return]


@pytest.fixture
async def api(request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    paid.clear()
    app = _app(_engine(*request.param))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
    ):
        yield Api(app=app, client=client)


def steps(*calls: Any) -> Any:
    return pytest.mark.parametrize("api", [[list(calls)]], indirect=True)


PAY_500 = call("pay", to="acme-supplies", amount=500)


# -- one exact set of arguments ---------------------------------------------------------------


@steps(PAY_500)
async def test_a_second_approver_on_a_stale_card_is_refused_and_what_they_saw_never_runs(
    api: Api,
) -> None:
    session, call_id = await api.requested()
    seen = await api.card(CY, session)  # cy's page, loaded before bo amends
    assert (seen["args"]["amount"], seen["approved_by"], seen["changes"]) == (500, [], {})
    first = await api.decide(
        BO, session, call_id, amended_args={"amount": 999999}, digest=seen["digest"]
    )
    assert first.status_code == 200 and first.json()["pending"] == [call_id]
    for stale in ({"digest": seen["digest"]}, {}):  # cy approves what her page showed
        refused = await api.decide(CY, session, call_id, **stale)
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["type"] == "arguments_changed"
        assert (
            "amended by bo" in error["message"] and "amount: 500.0 -> 999999.0" in error["message"]
        )
        [details] = error["details"]
        assert details["args"]["amount"] == 999999
    assert paid == []
    now = await api.card(CY, session)  # what the inbox shows now
    assert now["args"] == {"to": "acme-supplies", "amount": 999999}
    assert now["proposed_args"] == {"to": "acme-supplies", "amount": 500}
    assert now["changes"] == {"amount": {"proposed": 500, "now": 999999}}
    assert now["approved_by"] == ["bo"]
    assert now["digest"] == details["digest"] == args_digest("pay", now["args"])
    # the session's own view says the same
    [part] = (await api.client.get(f"/sessions/{session}", headers=CY)).json()["pending"]
    assert (part["current_args"], part["approved_by"], part["digest"]) == (
        now["args"],
        ["bo"],
        now["digest"],
    )
    done = await api.decide(CY, session, call_id, digest=now["digest"])  # she saw 999999
    assert done.status_code == 200 and done.json()["decided"] == [call_id]
    assert paid == [999999]


@steps(PAY_500)
async def test_an_amendment_restarts_the_approvals_and_each_is_audited_with_its_digest(
    api: Api,
) -> None:
    session, call_id = await api.requested()
    proposal = (await api.card(BO, session))["digest"]
    assert (await api.decide(BO, session, call_id, digest=proposal)).status_code == 200
    amended = await api.decide(CY, session, call_id, amended_args={"amount": 300}, digest=proposal)
    assert amended.json()["pending"] == [call_id]  # a new proposal: bo's approval was of 500
    card = await api.card(BO, session)
    assert (card["args"]["amount"], card["approved_by"]) == (300, ["cy"])
    assert [a["by"] for a in card["approvals"]] == ["bo", "cy"]
    # cy may not approve her own amendment twice; bo approves what he now sees
    again = await api.decide(CY, session, call_id, digest=card["digest"])
    assert (again.status_code, again.json()["error"]["type"]) == (403, "decision_not_allowed")
    assert (await api.decide(BO, session, call_id, digest=card["digest"])).status_code == 200
    assert paid == [300]
    entries = (await api.client.get("/audit", headers=BO)).json()["entries"]
    decisions = [(e["who"], e["args_digest"]) for e in entries if e["kind"] == "decision"]
    assert decisions == [
        ("bo", args_digest("pay", {"to": "acme-supplies", "amount": 500.0})),
        ("cy", args_digest("pay", {"to": "acme-supplies", "amount": 300.0})),
        ("bo", args_digest("pay", {"to": "acme-supplies", "amount": 300.0})),
    ]


@steps(PAY_500)
async def test_a_rejection_on_a_stale_card_is_recorded_since_it_runs_nothing(api: Api) -> None:
    session, call_id = await api.requested()
    seen = (await api.card(CY, session))["digest"]
    await api.decide(BO, session, call_id, amended_args={"amount": 999999}, digest=seen)
    rejected = await api.decide(CY, session, call_id, decision="reject", digest=seen)
    assert rejected.status_code == 200 and rejected.json()["decided"] == [call_id]
    assert paid == []


# -- a policy governs every decision that produces a result --------------------------------


CONFIRM = call("confirm", question="Is the refund legit?")


@steps(CONFIRM)
async def test_the_requester_may_not_answer_their_own_card_under_four_eyes_and_roles(
    api: Api,
) -> None:
    session, call_id = await api.requested()
    for who in (ANA, CY, DI):  # the requester (no role); no manager role
        refused = await api.decide(who, session, call_id, decision="answer", output="yes")
        assert refused.status_code in (403, 404), refused.text
        if refused.status_code == 403:
            assert refused.json()["error"]["type"] == "decision_not_allowed"
    ana = (await api.decide(ANA, session, call_id, decision="answer", output="yes")).json()
    assert (
        "needs the role manager; ana has none of them (no role) to answer"
        in (ana["error"]["message"])
    )
    answered = await api.decide(BO, session, call_id, decision="answer", output="yes")
    assert answered.status_code == 200 and answered.json()["decided"] == [call_id]


@steps(CONFIRM)
async def test_a_manager_who_requested_the_call_may_not_answer_it(api: Api) -> None:
    app = _app(_engine(CONFIRM))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
    ):
        mine = Api(app=app, client=client)
        session = (await client.post("/sessions", headers=BO)).json()["id"]
        await client.post(f"/sessions/{session}/turns", json={"text": "go"}, headers=BO)
        await app.state.runs.join(session)
        [card] = (await client.get(f"/sessions/{session}", headers=BO)).json()["pending"]
        refused = await mine.decide(
            BO, session, card["tool_call_id"], decision="answer", output="y"
        )
        assert refused.status_code == 403
        assert (
            "four eyes: bo requested the call and may not answer it"
            in (refused.json()["error"]["message"])
        )


@steps(CONFIRM)
async def test_the_requester_may_withdraw_their_own_card(api: Api) -> None:
    session, call_id = await api.requested()
    withdrawn = await api.decide(ANA, session, call_id, decision="reject", reason="never mind")
    assert withdrawn.status_code == 200 and withdrawn.json()["decided"] == [call_id]


@steps(call("confirm_strict", question="Is it legit?"))
async def test_a_policy_without_withdraw_refuses_the_requesters_rejection(api: Api) -> None:
    session, call_id = await api.requested()
    refused = await api.decide(ANA, session, call_id, decision="reject")
    assert refused.status_code == 403, refused.text
    assert (await api.decide(BO, session, call_id, decision="reject")).status_code == 200


@steps(call("scan", badge="B-1"))
async def test_a_gated_client_calls_result_comes_from_the_requesters_client_alone(
    api: Api,
) -> None:
    session, call_id = await api.requested(client=True)
    mine = await api.decide(ANA, session, call_id)  # the approval is the policy's
    assert mine.status_code == 403 and "needs the role kiosk" in mine.json()["error"]["message"]
    assert (await api.decide(DI, session, call_id)).status_code == 200
    [card] = (await api.client.get(f"/sessions/{session}", headers=ANA)).json()["pending"]
    assert card["kind"] == "client_exec"
    # di, who approved it, may not post what the client returned: ana's client runs it
    theirs = await api.decide(DI, session, card["tool_call_id"], decision="client_result")
    assert theirs.status_code in (403, 404), theirs.text
    posted = await api.client.post(
        f"/sessions/{session}/resolve?client=true",
        json={
            "tool_call_id": card["tool_call_id"],
            "decision": {"decision": "client_result", "output": "B-1 ok"},
        },
        headers=ANA,
    )
    assert posted.status_code == 200, posted.text


# -- the chat protocols, through their own clients ------------------------------------------

NODE = shutil.which("node")
JS = Path(__file__).resolve().parents[2] / "js" / "node_modules"
node = pytest.mark.skipif(
    NODE is None or not (JS / "ai").is_dir() or not (JS / "@ag-ui" / "client").is_dir(),
    reason="AG-UI / AI SDK NODE TESTS SKIPPED: `node` or js/node_modules is missing "
    "(install Node 20 and the js/ packages, npm ci --prefix js, to run them).",
)


async def _node(script: str, spec: dict[str, Any]) -> list[Any]:
    assert NODE is not None
    process = await asyncio.create_subprocess_exec(
        NODE,
        str(Path(__file__).with_name(script)),
        json.dumps({"key": "key-ana", "nodeModules": str(JS), **spec}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]


async def _amend_as_bo(url: str, amount: float) -> dict[str, Any]:
    """bo amends ana's waiting payment over REST (the call's card, as the inbox shows it)."""
    async with httpx.AsyncClient(base_url=url) as client:
        [card] = (await client.get("/pending", headers=BO)).json()["cards"]
        decision = {"decision": "approve", "amended_args": {"amount": amount}}
        decision["digest"] = card["digest"]
        body = {"tool_call_id": card["tool_call_id"], "decision": decision}
        answer = await client.post(f"/sessions/{card['session_id']}/resolve", json=body, headers=BO)
        assert answer.status_code == 200, answer.text
        [card] = (await client.get("/pending", headers=BO)).json()["cards"]
        return card  # type: ignore[no-any-return]


@node
async def test_agui_an_approval_of_what_the_interrupt_showed_is_refused_after_an_amendment() -> (
    None
):
    paid.clear()
    app = _app(_engine(PAY_500))
    async with serving(app) as url:
        spec = {"url": f"{url}/agui", "threadId": "t-pay"}
        (first, final) = await _node("agui_client.mjs", {**spec, "steps": [{"message": "pay"}]})
        [interrupt] = first["pendingInterrupts"]
        shown = interrupt["metadata"]["handrail"]
        assert shown["args"] == {"to": "acme-supplies", "amount": 500}
        assert shown["approvedBy"] == [] and shown["changes"] == {}
        assert "digest" in interrupt["responseSchema"]["properties"]
        now = await _amend_as_bo(url, 999999)
        carry = {"pendingInterrupts": final["final"]["pendingInterrupts"]}
        for payload in (
            {"approved": True, "editedArgs": shown["args"]},  # "no change" to what it showed
            {"approved": True, "editedArgs": shown["args"], "digest": shown["digest"]},
            {"approved": True, "digest": shown["digest"]},
        ):
            (step, _) = await _node(
                "agui_client.mjs",
                {
                    **spec,
                    **carry,
                    "steps": [{"resume": [{"status": "resolved", "payload": payload}]}],
                },
            )
            errors = [e for e in step["events"] if e["type"] == "RUN_ERROR"]
            assert errors and errors[0]["code"] == "ArgumentsChangedError", step
            assert "amount: 500.0 -> 999999.0" in errors[0]["message"]
        assert paid == []
        # ana, shown the current card, approves it: the second approval of 999999
        payload = {"approved": True, "editedArgs": now["args"], "digest": now["digest"]}
        (step, _) = await _node(
            "agui_client.mjs",
            {**spec, **carry, "steps": [{"resume": [{"status": "resolved", "payload": payload}]}]},
        )
        assert step["error"] is None and not [e for e in step["events"] if e["type"] == "RUN_ERROR"]
    assert paid == [999999]


@node
async def test_agui_the_requester_cannot_answer_their_own_card_against_the_policy() -> None:
    app = _app(_engine(CONFIRM))
    async with serving(app) as url:
        spec = {"url": f"{url}/agui", "threadId": "t-confirm"}
        steps_ = [
            {"message": "go"},
            {"resume": [{"status": "resolved", "payload": {"answer": "yes"}}]},
        ]
        first, second, _ = await _node("agui_client.mjs", {**spec, "steps": steps_})
    assert first["pendingInterrupts"]
    [error] = [e for e in second["events"] if e["type"] == "RUN_ERROR"]
    assert error["code"] == "DecisionNotAllowedError"
    assert "needs the role manager" in error["message"]


def _ui_card(step: dict[str, Any]) -> dict[str, Any]:
    [card] = [c["data"] for c in step["chunks"] if c["type"] == "data-handrail-card"]
    return card  # type: ignore[no-any-return]


@node
async def test_ui_stream_an_approval_of_what_the_card_showed_is_refused_after_an_amendment() -> (
    None
):
    paid.clear()
    app = _app(_engine(PAY_500))
    async with serving(app) as url:
        spec = {"url": url, "chatId": "c-pay"}
        first, final = await _node("ui_stream_client.mjs", {**spec, "steps": [{"message": "pay"}]})
        shown = _ui_card(first)
        assert shown["args"]["amount"] == 500 and shown["digest"]
        now = await _amend_as_bo(url, 999999)
        carry = {"messages": final["final"]["messages"]}
        call_id = shown["toolCallId"]
        for step_ in (
            {"approve": True},
            {"approve": True, "edits": {}},
            {"approve": True, "edits": {}, "handrail": {"digests": {call_id: shown["digest"]}}},
        ):
            (step, _) = await _node("ui_stream_client.mjs", {**spec, **carry, "steps": [step_]})
            assert step["error"] is not None and "amount: 500.0 -> 999999.0" in step["error"], step
        assert paid == []
        approve = {
            "approve": True,
            "edits": {"amount": 999999},
            "handrail": {"digests": {call_id: now["digest"]}},
        }
        (step, _) = await _node("ui_stream_client.mjs", {**spec, **carry, "steps": [approve]})
        assert step["error"] is None, step
    assert paid == [999999]
    # ana's tool part shows what bo's amendment made of the call, not the 500 it first showed
    [part] = [p for p in step["message"]["parts"] if p["type"] == "tool-pay"]
    assert part["state"] == "output-available"
    assert part["input"] == {"to": "acme-supplies", "amount": 999999}
    assert _ui_card(step)["digest"] == now["digest"]


@node
async def test_ui_stream_a_refused_stale_approval_is_retried_by_sending_the_current_card() -> None:
    paid.clear()
    app = _app(_engine(PAY_500))
    async with serving(app) as url:
        spec = {"url": url, "chatId": "c-retry"}
        first, final = await _node("ui_stream_client.mjs", {**spec, "steps": [{"message": "pay"}]})
        shown = _ui_card(first)
        now = await _amend_as_bo(url, 999999)
        # ana approves what she was shown: refused; the part stays approval-responded, the
        # card now shows bo's arguments and their digest, and sending again with them runs it.
        steps = [
            {"approve": True, "handrail": {"digests": {shown["toolCallId"]: shown["digest"]}}},
            {"retry": True, "card": True},
        ]
        refused, retried, last = await _node(
            "ui_stream_client.mjs", {**spec, "messages": final["final"]["messages"], "steps": steps}
        )
    assert refused["status"] == "error"
    assert refused["error"].startswith("ArgumentsChangedError: ")
    assert "amount: 500.0 -> 999999.0" in refused["error"]
    [part] = [p for p in refused["message"]["parts"] if p["type"] == "tool-pay"]
    assert part["state"] == "approval-responded"
    [card] = [p["data"] for p in refused["message"]["parts"] if p["type"] == "data-handrail-card"]
    assert card["args"] == now["args"] and card["digest"] == now["digest"]
    assert card["kind"] == "approval" and card["amendable"] == ["amount"]
    assert retried["error"] is None, retried
    assert paid == [999999]
    [part] = [p for p in retried["message"]["parts"] if p["type"] == "tool-pay"]
    assert part["state"] == "output-available" and part["input"]["amount"] == 999999
    assert [m["role"] for m in last["final"]["messages"]] == ["user", "assistant"]
