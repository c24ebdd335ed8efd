"""The audit trail through the HTTP API and the CLI, on SQLite: an approved and amended refund,
a rejected one and the refund's outcome, for two organisations, read by auditors only and
exported a page at a time; then rows edited, deleted and forged behind handrail's back, and
`handrail audit verify` (with its key, and an anchor) names the entry."""

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

from handrail.audit import GENESIS, AuditEntry, AuditKey, chain, entry_hash, verify
from handrail.cli import app as cli
from handrail.demo.support_desk import CUSTOMER_MESSAGE, TODAY, build_scenario
from handrail.server import ApiKeyAuthenticator, Caller, create_app
from handrail.store import MemoryStore, SqliteStore
from handrail.suspension import args_digest

from .conftest import ANA, BOB, Server, StreamingTransport, frames

KEY = AuditKey("2026-11", b"k" * 32)
CY = {"Authorization": "Bearer key-cy"}  # acme / cy, no role
NDJSON = {"Accept": "application/x-ndjson"}


def authenticator() -> ApiKeyAuthenticator:
    """Ana (acme) and Bob (globex), auditors of their organisations; Cy (acme), not one."""
    auditor = frozenset({"auditor"})
    return ApiKeyAuthenticator(
        {
            "key-ana": Caller("acme", "ana", auditor),
            "key-bob": Caller("globex", "bob", auditor),
            "key-cy": Caller("acme", "cy"),
        }
    )


REFUND = {"order_id": "A1042", "amount": 84.0, "reason": "damaged on arrival"}
AMENDED = {**REFUND, "amount": 40.0}


@pytest.fixture
async def audited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Server, Path]]:
    """The support desk's app on a SQLite file (whose clock is a little behind the engine's,
    so that a finished session is prunable at once) keyed by HANDRAIL_AUDIT_KEY, and the file."""
    monkeypatch.setenv("HANDRAIL_AUDIT_KEY", KEY.spec())
    monkeypatch.delenv("HANDRAIL_AUDIT_OLD_KEYS", raising=False)
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
        card="approval", amended_before={"amount": 84.0}, amended_after={"amount": 40.0},
        args_digest=args_digest("orders.refund", AMENDED), key_id="2026-11", prev_hash=GENESIS,
        hash=decided.hash,
    )  # fmt: skip
    assert called == AuditEntry(
        org_id="acme", seq=2, at=now, kind="call", session_id=ana, tool="orders.refund",
        tool_call_id=decided.tool_call_id, who="ana",
        args_digest=args_digest("orders.refund", AMENDED), outcome="ok", latency_ms=0.0,
        key_id="2026-11", prev_hash=decided.hash, hash=called.hash,
    )  # fmt: skip
    assert verify([decided, called], keys=[KEY]) == []
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
    assert (
        f"3 entries verified (3 keyed, 0 unkeyed); the last is 3:{acme[-1]['hash']} (an "
        f"anchor: keep it away from the store)." in ok.output
    )
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
    assert "entry 2: edited: entry 2 does not authenticate under key '2026-11'" in broken.output
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
        return Caller("acme", "ana", frozenset({"auditor"}), credential="key:key-7")


async def test_a_decision_records_the_key_the_caller_came_through() -> None:
    scenario = build_scenario(store=MemoryStore(audit_key=KEY))
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


async def test_reading_the_trail_takes_an_audit_role(audited: tuple[Server, Path]) -> None:
    server, _ = audited
    await decide(server, ANA, {"decision": "reject"})
    for headers in (CY, {**CY, **NDJSON}):  # a member of acme without the role
        refused = await server.client.get("/audit", headers=headers)
        assert refused.status_code == 403
        assert refused.json()["error"]["type"] == "audit_role_required"
        assert refused.json()["error"]["message"].startswith(
            "Reading the audit trail needs the role 'auditor'; this caller's roles: none."
        )
    assert [e["who"] for e in await trail(server, ANA)] == ["ana"]
    document = (await server.client.get("/openapi.json")).json()
    assert "403" in document["paths"]["/audit"]["get"]["responses"]


@pytest.mark.parametrize(
    ("roles", "readers"),
    [({"compliance", "auditor"}, {"ana", "cy"}), ({"compliance"}, {"cy"}), (None, {"ana", "cy"})],
)
async def test_the_roles_that_read_the_trail_are_configurable(
    roles: set[str] | None, readers: set[str]
) -> None:
    keys = ApiKeyAuthenticator(
        {
            "key-ana": Caller("acme", "ana", frozenset({"auditor"})),
            "key-cy": Caller("acme", "cy", frozenset({"compliance"}) if roles else frozenset()),
        }
    )
    scenario = build_scenario(store=MemoryStore(audit_key=KEY))
    app = create_app(scenario.engine, authenticator=keys, static_dir=None, audit_roles=roles)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        status = {
            who: (await c.get("/audit", headers={"Authorization": f"Bearer key-{who}"})).status_code
            for who in ("ana", "cy")
        }
    assert status == {who: 200 if who in readers else 403 for who in ("ana", "cy")}


async def test_the_export_streams_a_page_at_a_time() -> None:
    """The export is written as it is read: the server sends a page before it reads the next
    (the test holds each read until the page before has arrived), so it never holds the
    trail, and each page is one write."""
    store = MemoryStore(audit_key=KEY)
    for n in range(2500):
        await store.append_audit(AuditEntry(org_id="acme", session_id=f"s-{n}", tool="t"))
    served: list[int] = []
    arrived = [asyncio.Event() for _ in range(3)]  # the client has had the page n
    read = store.audit

    async def audit(org_id: str | None, **page: Any) -> list[AuditEntry]:
        if page["after"] > 0:
            await arrived[page["after"] // 1000 - 1].wait()
        served.append(page["after"])
        return await read(org_id, **page)

    store.audit = audit  # type: ignore[method-assign]
    app = create_app(
        build_scenario(store=store).engine, authenticator=authenticator(), static_dir=None
    )
    chunks: list[bytes] = []
    async with (
        httpx.AsyncClient(transport=StreamingTransport(app), base_url="http://t") as client,
        asyncio.timeout(30),  # a server that reads the whole trail first never answers
        client.stream("GET", "/audit", headers={**ANA, **NDJSON}) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/x-ndjson")
        assert "content-length" not in response.headers
        async for chunk in response.aiter_raw():
            assert served == [0, 1000, 2000][: len(chunks) + 1]  # nothing read ahead
            arrived[len(chunks)].set()
            chunks.append(chunk)
    assert served == [0, 1000, 2000]
    assert [chunk.count(b"\n") for chunk in chunks] == [1000, 1000, 500]
    entries = [AuditEntry.from_json(json.loads(line)) for line in b"".join(chunks).splitlines()]
    assert [e.seq for e in entries] == list(range(1, 2501))
    assert verify(entries, keys=[KEY]) == []


async def test_anchor_then_verify_finds_a_deleted_tail_an_edit_and_a_forgery(
    audited: tuple[Server, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, path = audited
    for decision in ({"decision": "approve"}, {"decision": "reject"}):
        await decide(server, ANA, decision)
    acme = await trail(server, ANA)
    assert [e["seq"] for e in acme] == [1, 2, 3]

    anchored = await asyncio.to_thread(audit_cli, "anchor", "--org", "acme", "--db", str(path))
    assert anchored.exit_code == 0, anchored.output
    anchor = anchored.stdout.strip()
    assert anchor == f"3:{acme[-1]['hash']}"

    def rows(sql: str, *params: Any) -> None:
        with sqlite3.connect(path) as db:
            db.execute(sql, params)

    def verify_cli(*more: str) -> Any:
        return audit_cli("verify", "--org", "acme", "--db", str(path), *more)

    ok = await asyncio.to_thread(verify_cli, "--anchor", anchor)
    assert ok.exit_code == 0, ok.output
    assert "3 entries verified (3 keyed, 0 unkeyed), up to the anchor 3" in ok.output

    # The last entry deleted: the trail still holds together, but not with its anchor.
    rows("DELETE FROM handrail_audit WHERE org_id = 'acme' AND seq = 3")
    assert (await asyncio.to_thread(verify_cli)).exit_code == 0
    cut = await asyncio.to_thread(verify_cli, "--anchor", anchor)
    assert cut.exit_code == 1
    assert "entry 3: truncated: the trail ends at entry 2 but the anchor is entry 3" in cut.output

    # Entry 1 edited and entries 1-2 chained again, without the key (plain SHA-256).
    entries = [AuditEntry.from_json(e) for e in acme[:2]]
    entries[0].reason = "approved by the manager"
    prev = GENESIS
    for entry in entries:
        entry.prev_hash = prev
        entry.hash = prev = entry_hash(entry)
        rows(
            "UPDATE handrail_audit SET entry = ?, hash = ? WHERE org_id = 'acme' AND seq = ?",
            json.dumps(entry.to_json()), entry.hash, entry.seq,
        )  # fmt: skip
    edited = await asyncio.to_thread(verify_cli)
    assert edited.exit_code == 1
    assert "entry 1: edited: entries 1 to 2 do not authenticate under key '2026-11'" in (
        edited.output
    )

    # A forged entry, chained after the last one under a guessed key.
    forged = chain(
        AuditEntry(org_id="acme", session_id="s-x", tool="orders.refund", decision="approve"),
        seq=3, prev_hash=entries[-1].hash, key=AuditKey("2026-11", b"g" * 32),
    )  # fmt: skip
    rows(
        "INSERT INTO handrail_audit (org_id, seq, kind, session_id, tool, hash, entry) "
        "VALUES ('acme', 3, 'decision', 's-x', 'orders.refund', ?, ?)",
        forged.hash, json.dumps(forged.to_json()),
    )  # fmt: skip
    appended = await asyncio.to_thread(verify_cli)
    assert appended.exit_code == 1
    assert "entries 1 to 3 do not authenticate" in appended.output

    # Without the key, keyed entries cannot be checked at all.
    monkeypatch.delenv("HANDRAIL_AUDIT_KEY")
    keyless = await asyncio.to_thread(verify_cli)
    assert keyless.exit_code == 1
    assert "HANDRAIL_AUDIT_KEY is not set" in keyless.output
    assert "(unknown_key)" in keyless.output
    bad = await asyncio.to_thread(verify_cli, "--anchor", "3:nothex")
    assert bad.exit_code == 1 and "SEQ:HASH" in bad.output


async def test_a_rotated_key_and_an_unkeyed_past_verify_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "handrail.db")
    old, new = AuditKey("2026-10", b"o" * 32), AuditKey("2026-11", b"n" * 32)
    for key in (None, old, new):  # before keys, then a key, then the key rotated
        async with SqliteStore(path, audit_key=key) as store:
            await store.append_audit(AuditEntry(org_id="acme", session_id="s", tool="t"))
    monkeypatch.setenv("HANDRAIL_AUDIT_KEY", new.spec())
    monkeypatch.setenv("HANDRAIL_AUDIT_OLD_KEYS", old.spec())
    ok = await asyncio.to_thread(audit_cli, "verify", "--org", "acme", "--db", path)
    assert ok.exit_code == 0, ok.output
    assert "entry 1: unkeyed (warning): entry 1 is unkeyed" in ok.output
    assert "3 entries verified (2 keyed, 1 unkeyed)" in ok.output
    strict = await asyncio.to_thread(audit_cli, "verify", "--org", "acme", "--db", path, "--strict")
    assert strict.exit_code == 1
    assert "broken at entry 1 (unkeyed)" in strict.output

    monkeypatch.delenv("HANDRAIL_AUDIT_OLD_KEYS")  # the old key dropped: its entry unchecked
    dropped = await asyncio.to_thread(audit_cli, "verify", "--org", "acme", "--db", path)
    assert dropped.exit_code == 1
    assert "entry 2 was made with key '2026-10' and cannot be checked" in dropped.output

    made = await asyncio.to_thread(audit_cli, "keygen", "--id", "2026-12")
    assert made.exit_code == 0
    assert AuditKey.parse(made.stdout.strip()).id == "2026-12"


async def test_anchor_of_an_empty_trail_and_refusal_of_a_forged_last_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "handrail.db")
    async with SqliteStore(path, audit_key=KEY) as store:
        assert await store.audit("acme") == []
    monkeypatch.setenv("HANDRAIL_AUDIT_KEY", KEY.spec())
    empty = await asyncio.to_thread(audit_cli, "anchor", "--org", "acme", "--db", path)
    assert empty.exit_code == 0 and empty.stdout.strip() == f"0:{GENESIS}"
    async with SqliteStore(path, audit_key=AuditKey(KEY.id, b"x" * 32)) as store:
        for _ in range(5):  # a store under a key of the same name, but not the key
            await store.append_audit(AuditEntry(org_id="acme"))
    refused = await asyncio.to_thread(audit_cli, "anchor", "--org", "acme", "--db", path)
    assert refused.exit_code == 1
    assert "The last entry of 'acme' (5) does not authenticate" in refused.output


async def test_a_server_on_a_store_without_a_key_says_so(caplog: pytest.LogCaptureFixture) -> None:
    authenticate = authenticator()
    create_app(build_scenario(store=MemoryStore(audit_key=KEY)).engine, authenticator=authenticate)
    assert "WITHOUT A KEY" not in caplog.text
    create_app(build_scenario(store=MemoryStore(audit_key=None)).engine, authenticator=authenticate)
    assert "The engine's store chains the audit trail WITHOUT A KEY" in caplog.text
