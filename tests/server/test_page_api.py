"""What the web page reads besides the session API: the domain, a turn's scratch, the page."""

from __future__ import annotations

import re
import sqlite3
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

import handrail.server
from handrail import Agent, DecisionPolicy, Domain, Engine, Runtime, tool
from handrail.audit import AuditKey
from handrail.demo.support_desk import CUSTOMER_MESSAGE
from handrail.models import ModelRequest
from handrail.server import ApiKeyAuthenticator, Caller, create_app
from handrail.server._page import title_of
from handrail.store import MemoryStore
from handrail.testing import FunctionModel, Step, call

from .conftest import ANA, BOB, Server
from .test_api import JSON, approve, suspended
from .test_audit import CY, audited

__all__ = ["audited"]  # a fixture, imported to be used here

JS_TYPES = {"text/javascript", "application/javascript"}


async def test_the_domain_describes_agents_and_the_schemas_of_tools(server: Server) -> None:
    response = await server.client.get("/domain", headers=ANA)
    assert response.status_code == 200
    body = response.json()
    assert body["agents"] == [
        {"name": "executor", "scratch": True, "supervisor": False},
        {"name": "responder", "scratch": False, "supervisor": False},
        {"name": "supervisor", "scratch": True, "supervisor": True},
    ]
    tools = {t["name"]: t for t in body["tools"]}
    assert set(tools) == {"orders.lookup", "policy.refunds", "orders.refund"}
    refund = tools["orders.refund"]
    assert (refund["gated"], refund["amendable"], refund["permission"], refund["executor"]) == (
        True,
        ["amount"],
        "write",
        "server",
    )
    assert refund["parameters"]["properties"]["amount"] == {
        "type": "number",
        "description": "how much to refund, in euros (at most the order's total).",
    }
    assert tools["policy.refunds"]["parameters"]["properties"]["reason"]["enum"] == [
        "damaged",
        "changed-mind",
        "late",
    ]
    assert tools["orders.lookup"]["gated"] is False


async def test_the_domain_needs_a_key(server: Server) -> None:
    response = await server.client.get("/domain")
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "unauthorized"


async def test_the_session_view_carries_the_turns_scratch(server: Server) -> None:
    session_id, call_id = await suspended(server)
    body = (await server.client.get(f"/sessions/{session_id}", headers=ANA)).json()
    assert list(body["scratch"]) == ["supervisor", "executor"]
    calls = [
        (p["name"], p["status"])
        for m in body["scratch"]["executor"]
        for p in m["parts"]
        if p["type"] == "tool-call"
    ]
    assert calls == [
        ("orders.lookup", "completed"),
        ("policy.refunds", "completed"),
        ("orders.refund", "waiting"),
    ]
    assert body["pending"][0]["tool_call_id"] == call_id


async def test_the_page_is_served_at_the_root(server: Server) -> None:
    page = await server.client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="js/main.js"></script>' in page.text
    # every module the page imports is served, as JavaScript (a module needs the type)
    modules = ["main", "api", "dom", "state", "stream", "sessions", "conversation", "cards"]
    modules += ["forms", "inbox", "audit"]
    for name in modules:
        script = await server.client.get(f"/js/{name}.js")
        assert script.status_code == 200, name
        assert script.headers["content-type"].split(";")[0] in JS_TYPES, name
        assert "script-src 'self'" in script.headers["content-security-policy"]
    stream = await server.client.get("/js/stream.js")
    assert "/events?after=" in stream.text
    assert (await server.client.get("/app.js")).status_code == 404  # split into the modules


def test_the_wheel_ships_every_module_the_page_imports() -> None:
    static = Path(handrail.server.__file__).parent / "static"
    imported = set()
    for module in (static / "js").glob("*.js"):
        imported |= set(re.findall(r'from "\./([a-z_]+\.js)"', module.read_text()))
    assert imported == {p.name for p in (static / "js").glob("*.js")} - {"main.js"}
    # hatchling puts every file of src/handrail in the wheel but those git ignores
    ignored = subprocess.run(
        ["git", "check-ignore", "index.html", "style.css", *(f"js/{n}" for n in sorted(imported))],
        cwd=static,
        capture_output=True,
        text=True,
    )
    assert ignored.returncode == 1, ignored.stdout  # 1: none of them is ignored


# -- who the caller is, sessions' titles -----------------------------------------------------


async def test_me_names_the_caller_and_whether_it_may_read_the_trail(server: Server) -> None:
    me = (await server.client.get("/me", headers=ANA)).json()
    assert me == {"org_id": "acme", "user_id": "ana", "roles": [], "audit": False}
    assert (await server.client.get("/me")).status_code == 401


async def test_sessions_are_titled_by_their_first_message_and_name_their_owner(
    server: Server,
) -> None:
    empty = await server.new_session()
    session_id, _ = await suspended(server)
    listed = {
        s["id"]: s for s in (await server.client.get("/sessions", headers=ANA)).json()["sessions"]
    }
    assert listed[session_id]["title"] == CUSTOMER_MESSAGE  # under 80 characters: whole
    assert listed[empty]["title"] is None  # nothing written yet
    assert listed[session_id]["user_id"] == "ana"
    view = (await server.client.get(f"/sessions/{session_id}", headers=ANA)).json()
    assert (view["title"], view["user_id"]) == (CUSTOMER_MESSAGE, "ana")


def test_a_title_is_the_first_persons_message_on_one_line_cut_at_80() -> None:
    def user(text: str, synthetic: bool = False) -> dict[str, Any]:
        return {"role": "user", "parts": [{"type": "text", "text": text, "synthetic": synthetic}]}

    long = "word " * 40
    assert title_of([user("handover note", synthetic=True), user("  my\n laptop  ")]) == (
        "my laptop"
    )
    cut = title_of([user(long)])
    assert cut is not None and len(cut) == 80 and cut.endswith("word…")
    assert title_of([{"role": "system", "parts": [{"type": "text", "text": "be kind"}]}]) is None


# -- what came of a decision -----------------------------------------------------------------


async def test_the_outcome_of_a_decided_call_is_read_back_by_its_owner_only(
    server: Server,
) -> None:
    session_id, call_id = await suspended(server)
    url = f"/sessions/{session_id}/calls/{call_id}"
    waiting = (await server.client.get(url, headers=ANA)).json()
    assert (waiting["decision"], waiting["done"], waiting["status"]) == (None, False, "waiting")
    decided = await server.client.post(
        f"/sessions/{session_id}/resolve", headers={**ANA, **JSON}, json=approve(call_id)
    )
    assert decided.status_code == 200
    await server.join(session_id)
    outcome = (await server.client.get(url, headers=ANA)).json()
    assert (outcome["decision"], outcome["decided_by"]) == ("approve", ["ana"])
    assert (outcome["status"], outcome["done"], outcome["error"]) == ("completed", True, None)
    assert outcome["tool_name"] == "orders.refund"
    assert outcome["digest"] == {"refund": "R0001", "order": "A1042", "amount": "€84.00"}
    # another organisation's caller, an unknown call: the same 404 as for a stranger
    assert (await server.client.get(url, headers=BOB)).status_code == 404
    unknown = await server.client.get(f"/sessions/{session_id}/calls/nope", headers=ANA)
    assert unknown.status_code == 404
    bad = await server.client.get(f"/sessions/{session_id}/calls/a%01b", headers=ANA)
    assert bad.status_code == 422


# -- the trail's check -----------------------------------------------------------------------


async def test_verify_says_the_trail_holds_then_names_an_edited_entry(
    audited: tuple[Server, Path],
) -> None:
    server, path = audited
    session_id, call_id = await suspended(server)
    await server.client.post(
        f"/sessions/{session_id}/resolve", headers={**ANA, **JSON}, json=approve(call_id)
    )
    await server.join(session_id)
    holds = (await server.client.get("/audit/verify", headers=ANA)).json()
    assert (holds["holds"], holds["count"], holds["keyed"], holds["problems"]) == (
        True,
        2,
        2,
        [],
    )
    assert holds["last"].startswith("2:")
    refused = await server.client.get("/audit/verify", headers=CY)  # no audit role
    assert refused.status_code == 403
    assert refused.json()["error"]["type"] == "audit_role_required"

    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE handrail_audit SET entry = replace(entry, 'ana', 'eve') "
            "WHERE org_id = 'acme' AND seq = 1"
        )
    broken = (await server.client.get("/audit/verify", headers=ANA)).json()
    assert broken["holds"] is False
    (problem,) = broken["problems"]
    assert (problem["seq"], problem["kind"], problem["severity"]) == (1, "edited", "error")


# -- a colleague's session: decide its cards, never write in it --------------------------------


@tool(
    name="pay",
    permission="destructive",
    amendable=["amount"],
    decision_policy=DecisionPolicy(roles={"it-admin"}, approvals=2),
    digest=lambda paid: paid,
)
def pay(to: str, amount: float) -> str:
    """Pay a supplier."""
    return f"paid {amount:g} to {to}"


def pay_script(request: ModelRequest) -> Step:
    if request.messages[-1].role == "user":
        return call("pay", to="acme-supplies", amount=500)
    return "Paid."


@pytest.fixture
async def payments() -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    """ana (acme) asks to pay; bo and cy (acme, it-admin) are the two who must approve."""
    engine = Engine(
        Domain(agents=[Agent("desk", tools=[pay])]),
        store=MemoryStore(audit_key=AuditKey("k1", b"k" * 32)),
        runtime=Runtime(model=FunctionModel(pay_script)),
    )
    keys = ApiKeyAuthenticator(
        {
            "key-ana": Caller("acme", "ana"),
            "key-bo": Caller("acme", "bo", frozenset({"it-admin"})),
            "key-cy": Caller("acme", "cy", frozenset({"it-admin"})),
            # another organisation, with people of the same names
            "key-globex-ana": Caller("globex", "ana"),
            "key-globex-bo": Caller("globex", "bo", frozenset({"it-admin"})),
        }
    )
    app = create_app(engine, authenticator=keys, static_dir=None)
    transport = httpx.ASGITransport(app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://test") as client,
    ):
        yield app, client


BO_KEY = {"Authorization": "Bearer key-bo"}
CY_KEY = {"Authorization": "Bearer key-cy"}


GLOBEX_ANA = {"Authorization": "Bearer key-globex-ana"}
GLOBEX_BO = {"Authorization": "Bearer key-globex-bo"}


async def _asked(
    app: Starlette, client: httpx.AsyncClient, owner: dict[str, str] = ANA
) -> tuple[str, str]:
    session_id = (await client.post("/sessions", headers=owner)).json()["id"]
    turn = await client.post(f"/sessions/{session_id}/turns", headers=owner, json={"text": "Pay"})
    assert turn.status_code == 202, turn.text
    await app.state.runs.join(session_id)
    [card] = (await client.get(f"/sessions/{session_id}", headers=owner)).json()["pending"]
    return session_id, card["tool_call_id"]


async def test_a_colleague_who_may_decide_reads_the_session_but_cannot_write_in_it(
    payments: tuple[Starlette, httpx.AsyncClient],
) -> None:
    app, client = payments
    session_id, _ = await _asked(app, client)
    url = f"/sessions/{session_id}"
    before = (await client.get(url, headers=ANA)).json()
    assert (await client.get(url, headers=BO_KEY)).status_code == 200  # his card is there
    # a message, the stream, the history, an export, an interrupt, a delete: the owner's only
    refused = [
        await client.post(f"{url}/turns", headers=BO_KEY, json={"text": "Pay 5000 instead"}),
        await client.get(f"{url}/events", headers=BO_KEY),
        await client.get(f"{url}/messages", headers=BO_KEY),
        await client.get(f"{url}/export", headers=BO_KEY),
        await client.post(f"{url}/interrupt", headers=BO_KEY),
        await client.delete(url, headers=BO_KEY),
    ]
    assert [(r.status_code, r.json()["error"]["type"]) for r in refused] == [
        (404, "not_found")
    ] * len(refused)
    after = (await client.get(url, headers=ANA)).json()
    assert after["messages"] == before["messages"]  # nothing written, the card still waits
    assert [c["tool_call_id"] for c in after["pending"]] == [
        c["tool_call_id"] for c in before["pending"]
    ]
    assert not app.state.runs.running(session_id)


async def test_the_outcome_names_the_arguments_that_run_and_what_approvers_changed(
    payments: tuple[Starlette, httpx.AsyncClient],
) -> None:
    app, client = payments
    session_id, call_id = await _asked(app, client)
    url = f"/sessions/{session_id}/calls/{call_id}"
    decided = await client.post(
        f"/sessions/{session_id}/resolve",
        headers={**BO_KEY, **JSON},
        json=approve(call_id, amount=450),
    )
    assert decided.json()["resumed"] is False  # one of two
    waiting = (await client.get(url, headers=BO_KEY)).json()
    assert (waiting["decision"], waiting["approved_by"], waiting["status"]) == (
        None,
        ["bo"],
        "waiting",
    )
    assert waiting["args"] == {"to": "acme-supplies", "amount": 450}
    assert waiting["changes"] == {"amount": {"proposed": 500, "now": 450}}
    [card] = (await client.get(f"/sessions/{session_id}", headers=CY_KEY)).json()["pending"]
    last = await client.post(
        f"/sessions/{session_id}/resolve",
        headers={**CY_KEY, **JSON},
        json={
            "tool_call_id": call_id,
            "decision": {"decision": "approve", "digest": card["digest"]},
        },
    )
    assert last.json()["resumed"] is True
    await app.state.runs.join(session_id)
    ran = (await client.get(url, headers=BO_KEY)).json()
    assert (ran["status"], ran["done"], ran["decided_by"]) == ("completed", True, ["bo", "cy"])
    assert ran["args"] == {"to": "acme-supplies", "amount": 450}
    assert ran["changes"] == {"amount": {"proposed": 500, "now": 450}}
    assert ran["digest"] == "paid 450 to acme-supplies"


# -- what the caller decided, from the audit trail --------------------------------------------


async def _decided(
    client: httpx.AsyncClient, headers: dict[str, str], **params: Any
) -> tuple[list[tuple[str, str, str | None, str | None]], int | None]:
    response = await client.get("/me/decided", headers=headers, params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    rows = [
        (d["session_id"], d["tool_call_id"], d["decision"], d["owner"]) for d in body["decisions"]
    ]
    for d in body["decisions"]:
        assert d["tool"] == "pay" and d["at"] > 0 and d["seq"] > 0
    return rows, body["before"]


async def test_each_person_reads_their_own_decisions_newest_first_a_page_at_a_time(
    payments: tuple[Starlette, httpx.AsyncClient],
) -> None:
    app, client = payments
    asked = [await _asked(app, client) for _ in range(3)]
    for session_id, call_id in asked:  # bo approves each (one of the two approvals)
        approved = await client.post(
            f"/sessions/{session_id}/resolve", headers={**BO_KEY, **JSON}, json=approve(call_id)
        )
        assert approved.status_code == 200, approved.text
    first, first_call = asked[0]
    [card] = (await client.get(f"/sessions/{first}", headers=CY_KEY)).json()["pending"]
    last = await client.post(  # cy's approval, the second: the payment runs
        f"/sessions/{first}/resolve",
        headers={**CY_KEY, **JSON},
        json={
            "tool_call_id": first_call,
            "decision": {"decision": "approve", "digest": card["digest"]},
        },
    )
    assert last.json()["resumed"] is True
    await app.state.runs.join(first)
    # in globex, a bo and an ana of its own: bo approves ana's payment
    theirs, their_call = await _asked(app, client, GLOBEX_ANA)
    await client.post(
        f"/sessions/{theirs}/resolve", headers={**GLOBEX_BO, **JSON}, json=approve(their_call)
    )

    bos = [(s, c, "approve", "ana") for s, c in reversed(asked)]
    assert await _decided(client, BO_KEY) == (bos, None)  # newest first, his only
    assert await _decided(client, CY_KEY) == ([(first, first_call, "approve", "ana")], None)
    # ana decided nothing (the payment her session made is hers, but no decision)
    assert await _decided(client, ANA) == ([], None)
    # globex's bo reads globex's decision, never acme's bo's, and the other way round
    assert await _decided(client, GLOBEX_BO) == ([(theirs, their_call, "approve", "ana")], None)

    # a page at a time: full pages name where the next starts, the last says it is the last
    page, before = await _decided(client, BO_KEY, limit=2)
    assert page == bos[:2] and before is not None
    rest, end = await _decided(client, BO_KEY, limit=2, before=before)
    assert (rest, end) == (bos[2:], None)

    # a session deleted since: its decision stays (the trail keeps it), its owner unknown
    deleted = await client.delete(f"/sessions/{asked[2][0]}", headers=ANA)
    assert deleted.status_code == 204
    assert (await _decided(client, BO_KEY))[0][0] == (*asked[2], "approve", None)


async def test_decided_reads_no_one_elses_and_refuses_a_bad_page(
    payments: tuple[Starlette, httpx.AsyncClient],
) -> None:
    _, client = payments
    assert (await client.get("/me/decided")).status_code == 401
    for params in ({"who": "cy"}, {"user_id": "cy"}, {"before": "0"}, {"limit": "0"},
                   {"limit": "201"}, {"before": "x"}):  # fmt: skip
        refused = await client.get("/me/decided", headers=BO_KEY, params=params)
        assert refused.status_code == 422, params
        assert refused.json()["error"]["type"] == "invalid_request", params


async def test_an_entry_whose_indexed_who_was_edited_is_shown_to_no_one_else(
    payments: tuple[Starlette, httpx.AsyncClient],
) -> None:
    app, client = payments
    session_id, call_id = await _asked(app, client)
    await client.post(
        f"/sessions/{session_id}/resolve", headers={**BO_KEY, **JSON}, json=approve(call_id)
    )
    store = app.state.runs.engine.store
    [row] = [r for r in store._audit["acme"] if r.kind == "decision"]
    row.who = "cy"  # the index says cy; the entry, hashed, says bo
    assert await _decided(client, CY_KEY) == ([], None)
