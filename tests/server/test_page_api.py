"""What the web page reads besides the session API: the domain, a turn's scratch, the page."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import handrail.server

from .conftest import ANA, Server
from .test_api import suspended

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
