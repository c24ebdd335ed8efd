"""The audit trail through the HTTP API and the CLI, on SQLite: an approved and amended refund,
a rejected one and the refund's outcome, for two organisations; then a row edited, and one
deleted, behind handrail's back, and `handrail audit verify` names the entry."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from typer.testing import CliRunner

from handrail.audit import GENESIS, AuditEntry, verify
from handrail.cli import app as cli
from handrail.demo.support_desk import CUSTOMER_MESSAGE, TODAY, build_scenario
from handrail.server import Caller, create_app
from handrail.store import SqliteStore
from handrail.suspension import args_digest

from .conftest import ANA, BOB, Server, StreamingTransport, authenticator, frames

REFUND = {"order_id": "A1042", "amount": 84.0, "reason": "damaged on arrival"}
AMENDED = {**REFUND, "amount": 40.0}


@pytest.fixture
async def audited(tmp_path: Path) -> AsyncIterator[tuple[Server, Path]]:
    """The support desk's app on a SQLite file (whose clock is a little behind the engine's,
    so that a finished session is prunable at once), and the file."""
    path = tmp_path / "handrail.db"
    store = SqliteStore(path, clock=lambda: TODAY.timestamp() - 100)
    scenario = build_scenario(store=store)
    app = create_app(
        scenario.engine, authenticator=authenticator(), poll_interval=0.2, static_dir=None
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
        httpx.AsyncClient(transport=StreamingTransport(app), base_url="http://test") as streaming,
    ):
        yield Server(app=app, scenario=scenario, client=client, streaming=streaming), path
    await store.close()


async def decide(server: Server, headers: dict[str, str], decision: dict[str, Any]) -> str:
    """A refund proposed in a new session of the caller's, then decided; the session's id."""
    session_id = await server.new_session(headers)
    sent = await server.client.post(
        f"/sessions/{session_id}/turns", json={"text": CUSTOMER_MESSAGE}, headers=headers
    )
    assert sent.status_code == 202, sent.text
    async with server.streaming.stream(
        "GET", f"/sessions/{session_id}/events", headers=headers
    ) as response:
        events = [frame async for frame in frames(response)]
    (call_id,) = events[-1].data["pending"]
    resolved = await server.client.post(
        f"/sessions/{session_id}/resolve",
        json={"tool_call_id": call_id, "decision": decision},
        headers=headers,
    )
    assert resolved.status_code == 200, resolved.text
    await server.join(session_id)
    return session_id


async def trail(server: Server, headers: dict[str, str], **params: Any) -> list[dict[str, Any]]:
    response = await server.client.get("/audit", params=params, headers=headers)
    assert response.status_code == 200, response.text
    return list(response.json()["entries"])


def audit_cli(*args: str) -> Any:
    """`handrail audit ...`, in a thread: the command runs its own event loop."""
    return CliRunner().invoke(cli, ["audit", *args])


async def test_each_organisation_reads_its_own_trail_of_decisions_and_calls(
    audited: tuple[Server, Path],
) -> None:
    server, _ = audited
    ana = await decide(
        server,
        ANA,
        {"decision": "approve", "amended_args": {"amount": 40}, "by": "mallory", "via": "forged"},
    )
    bob = await decide(server, BOB, {"decision": "reject", "reason": "photos first"})
    now = TODAY.timestamp()

    acme = await trail(server, ANA)
    decided, called = (AuditEntry.from_json(e) for e in acme)
    assert decided == AuditEntry(
        org_id="acme", seq=1, at=now, kind="decision", session_id=ana, tool="orders.refund",
        tool_call_id=decided.tool_call_id, who="ana", via=decided.via, decision="approve",
        amended_before={"amount": 84.0}, amended_after={"amount": 40.0},
        args_digest=args_digest("orders.refund", AMENDED), prev_hash=GENESIS,
        hash=decided.hash,
    )  # fmt: skip
    assert called == AuditEntry(
        org_id="acme", seq=2, at=now, kind="call", session_id=ana, tool="orders.refund",
        tool_call_id=decided.tool_call_id, who="ana",
        args_digest=args_digest("orders.refund", AMENDED), outcome="ok", latency_ms=0.0,
        prev_hash=decided.hash, hash=called.hash,
    )  # fmt: skip
    assert verify([decided, called]) == []
    assert decided.via is not None and decided.via.startswith("key:")  # ana's key, not "forged"

    (rejected,) = await trail(server, BOB)  # the rejected refund never ran: no call entry
    assert {k: rejected[k] for k in ("org_id", "seq", "kind", "session_id", "who")} == {
        "org_id": "globex", "seq": 1, "kind": "decision", "session_id": bob, "who": "bob",
    }  # fmt: skip
    assert (rejected["decision"], rejected["reason"]) == ("reject", "photos first")
    assert rejected["args_digest"] == args_digest("orders.refund", REFUND)
    assert rejected["prev_hash"] == GENESIS

    # Nobody reads another organisation's trail, whatever they ask for.
    assert await trail(server, ANA, session_id=bob) == []
    assert await trail(server, BOB, session_id=ana) == []
    assert await trail(server, ANA, kind="call") == [acme[1]]
    assert await trail(server, ANA, tool="orders.lookup") == []
    page = await server.client.get("/audit", params={"limit": 1}, headers=ANA)
    assert page.json() == {"entries": [acme[0]], "after": 1}
    assert await trail(server, ANA, after=1) == [acme[1]]

    export = await server.client.get("/audit", headers={**ANA, "Accept": "application/x-ndjson"})
    assert export.headers["content-type"].startswith("application/x-ndjson")
    assert [json.loads(line) for line in export.text.splitlines()] == acme

    assert (await server.client.get("/audit")).status_code == 401
    bad = await server.client.get("/audit", params={"kind": "nope"}, headers=ANA)
    assert bad.status_code == 422


async def test_pruned_sessions_leave_their_trail(audited: tuple[Server, Path]) -> None:
    server, _ = audited
    ana = await decide(server, ANA, {"decision": "approve"})
    before = await trail(server, ANA)
    assert [e["kind"] for e in before] == ["decision", "call"]

    assert await server.scenario.engine.prune(idle_for=0) == [ana]
    assert (await server.client.get(f"/sessions/{ana}", headers=ANA)).status_code == 404
    assert await trail(server, ANA) == before


async def test_verify_names_an_edited_entry_and_a_deleted_one(
    audited: tuple[Server, Path],
) -> None:
    server, path = audited
    await decide(server, ANA, {"decision": "approve", "amended_args": {"amount": 40}})
    await decide(server, ANA, {"decision": "reject", "reason": "no"})
    await decide(server, BOB, {"decision": "reject"})
    acme = await trail(server, ANA)
    assert [e["seq"] for e in acme] == [1, 2, 3]

    ok = await asyncio.to_thread(audit_cli, "verify", "--org", "acme", "--db", str(path))
    assert ok.exit_code == 0, ok.output
    assert f"3 entries verified; the last hash is {acme[-1]['hash']}." in ok.output
    exported = await asyncio.to_thread(audit_cli, "export", "--org", "acme", "--db", str(path))
    assert [json.loads(line) for line in exported.output.splitlines()] == acme
    listed = await asyncio.to_thread(
        audit_cli, "list", "--org", "acme", "--db", str(path), "--kind", "call", "--json"
    )
    assert json.loads(listed.output) == [acme[1]]
    table = await asyncio.to_thread(audit_cli, "list", "--org", "acme", "--db", str(path))
    assert all(word in table.output for word in ("approve", "amended", "reject", "ok"))

    # Someone turns the refund's outcome into a failure, behind handrail's back.
    with sqlite3.connect(path) as db:
        edited = db.execute(
            'UPDATE handrail_audit SET entry = replace(entry, \'"outcome": "ok"\', '
            "'\"outcome\": \"error: declined\"') WHERE org_id = 'acme' AND seq = 2"
        ).rowcount
    assert edited == 1
    (entry,) = await trail(server, ANA, kind="call")
    assert entry["outcome"] == "error: declined"  # read as stored...
    broken = await asyncio.to_thread(audit_cli, "verify", "--org", "acme", "--db", str(path))
    assert broken.exit_code == 1  # ...and caught
    assert "entry 2: edited" in broken.output
    assert "broken at entry 2 (edited)" in broken.output
    other = await asyncio.to_thread(audit_cli, "verify", "--org", "globex", "--db", str(path))
    assert other.exit_code == 0, other.output  # another organisation's trail is unaffected

    # Someone deletes the approval.
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM handrail_audit WHERE org_id = 'acme' AND seq = 1")
    gone = await asyncio.to_thread(audit_cli, "verify", "--org", "acme", "--db", str(path))
    assert gone.exit_code == 1
    assert "broken at entry 2 (deleted)" in gone.output
    assert "entry 1 before entry 2 is missing (deleted)" in gone.output


class _KeyAuthenticator:
    async def authenticate(self, request: Request) -> Caller | None:
        return Caller("acme", "ana", credential="key:key-7")


async def test_a_decision_records_the_key_the_caller_came_through() -> None:
    scenario = build_scenario()
    app = create_app(scenario.engine, authenticator=_KeyAuthenticator(), static_dir=None)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
        httpx.AsyncClient(transport=StreamingTransport(app), base_url="http://test") as streaming,
    ):
        server = Server(app=app, scenario=scenario, client=client, streaming=streaming)
        await decide(server, ANA, {"decision": "reject", "via": "forged"})
        (entry,) = await trail(server, ANA)
    assert (entry["who"], entry["via"]) == ("ana", "key:key-7")
