"""The HTTP API on the scripted support desk: a refund proposed, streamed, approved, resumed."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from typing import Any

import httpx
import pytest
from dirty_equals import IsStr

from handrail import ApprovalCardPart, StoreError
from handrail.demo.support_desk import CUSTOMER_MESSAGE
from handrail.suspension import args_digest

from .conftest import ANA, BOB, Server, frames

SUSPENDED = [  # runs of one type counted once (a reply streams as many text deltas)
    "run-started",
    "agent-started",  # the supervisor routes the refund to the executor
    "text-delta",
    "usage",
    "agent-completed",
    "agent-started",  # the executor looks the order and the policy up, proposes the refund
    "usage",
    "tool-call-started",
    "tool-call-completed",
    "text-delta",
    "usage",
    "approval-required",  # a gated call starts only once approved
    "run-suspended",
]


async def suspended(server: Server) -> tuple[str, str]:
    """A session whose turn waits for the refund's approval, and the refund's call id."""
    session_id = await server.new_session()
    after = await server.submit(session_id)
    events = await server.events(session_id, after)
    assert events[-1].type == "run-suspended"
    (call_id,) = events[-1].data["pending"]
    return session_id, call_id


JSON = {"Content-Type": "application/json"}


def approve(call_id: str, **amended: Any) -> dict[str, Any]:
    return {"tool_call_id": call_id, "decision": {"decision": "approve", "amended_args": amended}}


# -- a turn, streamed ------------------------------------------------------------------------


async def test_events_are_framed_with_bare_newlines(server: Server) -> None:
    """`@ag-ui/client` and other strict readers split events on a blank line of `\\n` only."""
    session_id = await server.new_session()
    await server.submit(session_id)
    await server.join(session_id)
    async with server.streaming.stream(
        "GET", f"/sessions/{session_id}/events", headers=ANA
    ) as response:
        body = await response.aread()
    assert b"\r" not in body
    blocks = [b for b in body.split(b"\n\n") if b]
    assert [b.split(b"\n")[0] for b in blocks] == [b"id: %d" % n for n in range(1, len(blocks) + 1)]
    assert all(b.split(b"\n")[1].startswith(b"data: {") for b in blocks)


async def test_a_turn_streams_its_events_until_it_suspends(server: Server) -> None:
    session_id = await server.new_session()
    response = await server.client.post(
        f"/sessions/{session_id}/turns", json={"text": CUSTOMER_MESSAGE}, headers=ANA
    )
    assert response.status_code == 202
    assert response.json() == {
        "session_id": session_id,
        "after": 0,
        "events": f"/sessions/{session_id}/events?after=0",
    }

    events = await server.events(session_id, after=0)
    assert [t for t, _ in itertools.groupby(e.type for e in events)] == SUSPENDED
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    card = next(e for e in events if e.type == "approval-required")
    assert card.data["args"] == {
        "order_id": "A1042",
        "amount": 84.0,
        "reason": "damaged on arrival",
    }
    assert server.scenario.desk.refunds == []


async def test_the_pending_card_is_read_with_the_session(server: Server) -> None:
    session_id, call_id = await suspended(server)
    response = await server.client.get(f"/sessions/{session_id}", headers=ANA)
    assert response.status_code == 200
    body = response.json()
    assert (body["id"], body["status"], body["running"]) == (session_id, "suspended", False)
    assert [(m["role"], m["parts"][0]["text"]) for m in body["messages"]] == [
        ("user", CUSTOMER_MESSAGE)
    ]
    (card,) = body["pending"]
    assert card["expires_at"] == card["created_at"] + 24 * 3600  # the default deadline
    assert card | {"created_at": None, "expires_at": None} == {
        "type": "approval",
        "tool_call_id": call_id,
        "tool_name": "orders.refund",
        "args": {"order_id": "A1042", "amount": 84.0, "reason": "damaged on arrival"},
        "prompt": "Refund this order?",
        "amendable": ["amount"],
        "kind": "approval",
        "executor": "server",
        "agent": "executor",  # the demo's agent that proposed the refund
        "decision": None,
        "decided_by": None,
        "decided_at": None,
        "amended_args": None,
        "reason": None,
        "args_digest": None,
        "output": None,
        "created_at": None,
        "expires_at": None,
        "approvals": None,
        "current_args": {"order_id": "A1042", "amount": 84.0, "reason": "damaged on arrival"},
        "digest": args_digest(
            "orders.refund", {"order_id": "A1042", "amount": 84.0, "reason": "damaged on arrival"}
        ),
        "approved_by": [],
        "changes": {},
    }


@pytest.mark.parametrize(
    ("amount", "where"),
    [
        ("NaN", "body.decision.amended_args.amount"),
        ("Infinity", "body.decision.amended_args.amount"),
        ("-Infinity", "body.decision.amended_args.amount"),
        ("1e400", "body.decision.amended_args.amount"),
    ],
)
async def test_a_number_that_is_not_finite_is_refused_and_nothing_is_recorded(
    server: Server, amount: str, where: str
) -> None:
    session_id, call_id = await suspended(server)
    body = (
        f'{{"tool_call_id": "{call_id}", "decision": '
        f'{{"decision": "approve", "amended_args": {{"amount": {amount}}}}}}}'
    )
    response = await server.client.post(
        f"/sessions/{session_id}/resolve",
        content=body,
        headers={**ANA, "Content-Type": "application/json"},
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request"
    assert error["message"].startswith(f"{where}: numbers must be finite")
    assert [c["tool_call_id"] for c in await server.pending(session_id)] == [call_id]


async def test_an_amended_approval_resumes_the_turn_to_completion(server: Server) -> None:
    session_id, call_id = await suspended(server)
    response = await server.client.post(
        f"/sessions/{session_id}/resolve", json=approve(call_id, amount=40), headers=ANA
    )
    assert response.status_code == 200, response.text
    resolution = response.json()
    assert resolution == {
        "decided": [call_id],
        "pending": [],
        "resumed": True,
        "after": resolution["after"],
        "events": f"/sessions/{session_id}/events?after={resolution['after']}",
    }

    events = await server.events(session_id, resolution["after"])
    assert events[0].id == resolution["after"] + 1
    assert (events[0].type, events[-1].type) == ("run-started", "run-completed")
    refund = next(e for e in events if e.type == "tool-call-completed")
    assert refund.data["digest"] == {"refund": "R0001", "order": "A1042", "amount": "€40.00"}
    assert "€40.00" in events[-1].data["output"]
    assert server.scenario.desk.refunds[0]["amount"] == "€40.00"

    state = await server.scenario.engine.session(session_id, org_id="acme", user_id="ana")
    (card,) = [p for m in state.all_messages() for p in m.parts if isinstance(p, ApprovalCardPart)]
    assert (card.decision, card.decided_by, card.amended_args) == (
        "approve",
        "ana",  # the authenticated user, whatever the body said
        {"order_id": "A1042", "amount": 40.0, "reason": "damaged on arrival"},
    )


async def test_a_message_sent_the_moment_a_turn_ends_is_taken(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end of a turn reaches the client only once the session is free again, so a next
    message sent the instant it arrives is not refused as "busy", even when the store is
    slow to let the session go."""
    store = server.scenario.engine.store
    release = store.release_lease

    async def slow_release(session_id: str, owner: str) -> None:
        await asyncio.sleep(0.05)
        await release(session_id, owner)

    session_id, call_id = await suspended(server)
    monkeypatch.setattr(store, "release_lease", slow_release)
    rejection = {"tool_call_id": call_id, "decision": {"decision": "reject", "reason": "no"}}
    response = await server.client.post(
        f"/sessions/{session_id}/resolve", json=rejection, headers=ANA
    )
    events = await server.events(session_id, response.json()["after"])
    assert events[-1].type == "run-completed"
    response = await server.client.post(
        f"/sessions/{session_id}/turns", json={"text": "Thanks."}, headers=ANA
    )
    assert response.status_code == 202, response.text
    await server.join(session_id)


async def test_a_followed_stream_carries_the_turn_across_its_suspension(server: Server) -> None:
    session_id = await server.new_session()
    seen: list[str] = []

    async def watch() -> None:
        async with server.streaming.stream(
            "GET", f"/sessions/{session_id}/events?follow=1", headers=ANA
        ) as response:
            async for frame in frames(response):
                seen.append(frame.type)
                if frame.type == "run-suspended":
                    (call_id,) = frame.data["pending"]
                    answer = await server.client.post(
                        f"/sessions/{session_id}/resolve",
                        json=approve(call_id, amount=40),
                        headers=ANA,
                    )
                    assert answer.status_code == 200
                if frame.type == "run-completed":
                    return

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.05)  # the stream is open before the turn starts
    await server.submit(session_id)
    async with asyncio.timeout(5):
        await watcher
    assert seen.count("run-started") == 2
    assert seen[-1] == "run-completed"
    assert server.scenario.desk.refunds[0]["amount"] == "€40.00"


async def test_a_rejection_resumes_the_turn_and_nothing_is_refunded(server: Server) -> None:
    session_id, call_id = await suspended(server)
    decision = {"decision": "reject", "reason": "photos first"}
    response = await server.client.post(
        f"/sessions/{session_id}/resolve",
        json=[{"tool_call_id": call_id, "decision": decision}],
        headers=ANA,
    )
    assert response.json()["resumed"] is True
    events = await server.events(session_id, response.json()["after"])
    assert "photos first" in str([e.data for e in events])
    assert server.scenario.desk.refunds == []


# -- reconnecting, disconnecting -------------------------------------------------------------


@pytest.mark.parametrize("latency", [0.2])
async def test_a_reconnection_gets_exactly_the_missed_events_then_the_live_ones(
    server: Server,
) -> None:
    session_id = await server.new_session()
    after = await server.submit(session_id)
    async with server.streaming.stream(
        "GET", f"/sessions/{session_id}/events", params={"after": after}, headers=ANA
    ) as response:
        first = []
        async for frame in frames(response):
            first.append(frame)
            if len(first) == 3:
                break  # the connection drops

    await asyncio.sleep(0.02)  # events go on meanwhile
    assert server.app.state.runs.running(session_id)  # the rest will be live
    async with server.streaming.stream(
        "GET",
        f"/sessions/{session_id}/events",
        headers={**ANA, "Last-Event-ID": str(first[-1].id)},
    ) as response:
        rest = [frame async for frame in frames(response)]

    logged = await server.scenario.engine.store.events(session_id)
    assert [(f.id, f.data) for f in first + rest] == logged
    assert rest[-1].type == "run-suspended"


@pytest.mark.parametrize("latency", [0.05])
async def test_a_client_that_disconnects_does_not_stop_the_run(server: Server) -> None:
    session_id = await server.new_session()
    after = await server.submit(session_id)
    async with server.streaming.stream(
        "GET", f"/sessions/{session_id}/events?after={after}", headers=ANA
    ) as response:
        async for _ in frames(response):
            break
    assert server.app.state.runs.running(session_id)

    await server.join(session_id)
    assert len(await server.pending(session_id)) == 1
    logged = await server.scenario.engine.store.events(session_id)
    assert logged[-1][1]["type"] == "run-suspended"


@pytest.mark.parametrize("latency", [0.2])
async def test_at_shutdown_turns_are_interrupted_then_the_streams_end(server: Server) -> None:
    """The running turn stops (saved, and its stream gets `run-failed`, interrupted), and a
    followed stream, which would never end by itself, ends once it has sent the log."""
    idle = await server.new_session()
    busy = await server.new_session()
    after = await server.submit(busy)

    async def read(session_id: str, **params: Any) -> list[str]:
        async with server.streaming.stream(
            "GET", f"/sessions/{session_id}/events", params=params, headers=ANA
        ) as response:
            return [frame.type async for frame in frames(response)]

    following = asyncio.ensure_future(read(idle, follow="true"))
    turn = asyncio.ensure_future(read(busy, after=after))
    await asyncio.sleep(0.05)  # both streams are open, the turn waits for a tool
    async with asyncio.timeout(5):
        await server.app.state.runs.aclose(grace=5)
        assert await following == []
        types = await turn
    assert types[0] == "run-started" and types[-1] == "run-failed"
    logged = await server.scenario.engine.store.events(busy)
    assert logged[-1][1] == {**logged[-1][1], "type": "run-failed", "reason": "interrupted"}
    assert not server.app.state.runs.running(busy)


@pytest.mark.parametrize("latency", [0.05])
async def test_a_turns_own_stream_starts_from_the_events_at_hand_not_the_log(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream of a turn running in this server starts from the events the server logged
    for it (a burst of turns does not queue a read of the log each before its first event)."""
    session_id = await server.new_session()
    store = server.app.state.runs.engine.store
    reads: list[int] = []
    read_log = store.events

    async def counted(session_id: str, **kwargs: Any) -> Any:
        reads.append(kwargs.get("after", 0))
        return await read_log(session_id, **kwargs)

    monkeypatch.setattr(store, "events", counted)
    async with server.streaming.stream(
        "POST",
        f"/sessions/{session_id}/turns",
        json={"text": CUSTOMER_MESSAGE},
        headers={**ANA, "Accept": "text/event-stream"},
    ) as response:
        streamed = [frame async for frame in frames(response)]
    assert reads == []
    assert [(f.id, f.data) for f in streamed] == await read_log(session_id)
    assert streamed[-1].type == "run-suspended"


@pytest.mark.parametrize("latency", [0.1])
async def test_an_event_logged_elsewhere_mid_turn_reaches_every_stream_in_order(
    server: Server,
) -> None:
    """An event another process logs for the session while its turn runs here (a worker's
    late events) is in the log between the turn's: a stream started before it, and one
    reconnecting after it, both get the log as it is, never the server's own events alone."""
    session_id = await server.new_session()
    engine = server.app.state.runs.engine
    elsewhere = {"type": "text-delta", "agent": "w", "message_id": "m", "delta": "elsewhere"}
    async with server.streaming.stream(
        "POST",
        f"/sessions/{session_id}/turns",
        json={"text": CUSTOMER_MESSAGE},
        headers={**ANA, "Accept": "text/event-stream"},
    ) as response:
        streamed = []
        async for frame in frames(response):
            streamed.append(frame)
            if len(streamed) == 2:  # the turn waits for its tool (latency)
                foreign, _ = await engine.log_events(session_id, [elsewhere])
                reconnected = await server.events(session_id, after=1)
    logged = await engine.store.events(session_id)
    assert (foreign, elsewhere) in logged
    assert [(f.id, f.data) for f in streamed] == logged
    assert [(f.id, f.data) for f in reconnected] == logged[1:]
    assert logged[-1][1]["type"] == "run-suspended"


async def test_a_stream_of_a_finished_turn_replays_it_from_the_log(server: Server) -> None:
    session_id, _ = await suspended(server)
    replay = await server.events(session_id, 0)
    assert [f.id for f in replay] == list(range(1, len(replay) + 1))
    assert replay[-1].type == "run-suspended"
    tail = await server.events(session_id, replay[-2].id)
    assert [f.type for f in tail] == ["run-suspended"]


async def test_a_last_event_id_that_is_not_a_number_is_refused(server: Server) -> None:
    session_id = await server.new_session()
    response = await server.client.get(
        f"/sessions/{session_id}/events", headers={**ANA, "Last-Event-ID": "abc"}
    )
    assert response.status_code == 422
    assert response.json()["error"]["type"] == "invalid_request"


@pytest.mark.parametrize("latency", [0.2])
async def test_interrupting_a_running_turn_ends_its_stream(server: Server) -> None:
    session_id = await server.new_session()
    after = await server.submit(session_id)
    response = await server.client.post(f"/sessions/{session_id}/interrupt", headers=ANA)
    assert (response.status_code, response.json()) == (202, {"interrupted": True})
    events = await server.events(session_id, after)
    assert events[-1].data == {
        "type": "run-failed",
        "reason": "interrupted",
        "error": IsStr(),
        "reference": None,  # no failure to look up: it was interrupted
    }

    response = await server.client.post(f"/sessions/{session_id}/interrupt", headers=ANA)
    assert response.status_code == 409
    assert response.json()["error"]["type"] == "not_running"


# -- conflicts -------------------------------------------------------------------------------


async def test_a_duplicate_resolution_is_a_conflict_with_the_reason(server: Server) -> None:
    session_id, call_id = await suspended(server)
    first = await server.client.post(
        f"/sessions/{session_id}/resolve", json=approve(call_id, amount=40), headers=ANA
    )
    assert first.status_code == 200
    again = await server.client.post(
        f"/sessions/{session_id}/resolve", json=approve(call_id, amount=10), headers=ANA
    )
    assert again.status_code == 409
    assert again.json() == {
        "error": {
            "type": "stale_resolution",
            "message": IsStr(regex=rf".*{call_id}.*"),
            "request_id": IsStr(),
        }
    }
    await server.join(session_id)
    assert [r["amount"] for r in server.scenario.desk.refunds] == ["€40.00"]


async def test_a_new_message_while_the_turn_waits_is_a_conflict(server: Server) -> None:
    session_id, _ = await suspended(server)
    response = await server.client.post(
        f"/sessions/{session_id}/turns", json={"text": "hello?"}, headers=ANA
    )
    assert response.status_code == 409
    assert response.json()["error"]["type"] == "conflict"
    assert "waiting on" in response.json()["error"]["message"]


@pytest.mark.parametrize("latency", [0.1])
async def test_a_second_turn_while_one_runs_is_a_conflict(server: Server) -> None:
    session_id = await server.new_session()
    await server.submit(session_id)
    response = await server.client.post(
        f"/sessions/{session_id}/turns", json={"text": "again"}, headers=ANA
    )
    assert response.status_code == 409
    assert response.json()["error"]["type"] == "turn_in_progress"
    deleting = await server.client.delete(f"/sessions/{session_id}", headers=ANA)
    assert deleting.status_code == 409
    await server.join(session_id)


@pytest.mark.parametrize("latency", [0.1])
async def test_a_turn_of_another_tenants_running_session_is_not_found(server: Server) -> None:
    """Not 409 "a turn is running": that would tell another tenant the session exists."""
    session_id = await server.new_session()
    await server.submit(session_id)
    for target in (session_id, "nope"):
        response = await server.client.post(
            f"/sessions/{target}/turns", json={"text": "mine now"}, headers=BOB
        )
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "not_found"
    await server.join(session_id)
    assert await server.scenario.engine.store.load("nope") is None  # nor was one made


# -- sessions --------------------------------------------------------------------------------


async def test_the_caller_lists_only_its_own_sessions(server: Server) -> None:
    mine = [await server.new_session() for _ in range(2)]
    await server.new_session(BOB)
    response = await server.client.get("/sessions", headers=ANA)
    assert response.status_code == 200
    assert sorted(s["id"] for s in response.json()["sessions"]) == sorted(mine)
    assert response.json()["sessions"][0] == {
        "id": IsStr(),
        "status": "active",
        "running": False,
        "created_at": pytest.approx(server.scenario.engine.runtime.clock(), abs=1e9),
        "updated_at": pytest.approx(server.scenario.engine.runtime.clock(), abs=1e9),
        "user_id": "ana",
        "title": None,  # no user message yet
    }
    page = await server.client.get("/sessions?limit=1&status=active", headers=ANA)
    assert len(page.json()["sessions"]) == 1


async def test_a_session_is_exported_and_deleted_with_its_logs(server: Server) -> None:
    session_id, _ = await suspended(server)
    response = await server.client.get(f"/sessions/{session_id}/export", headers=ANA)
    assert response.status_code == 200
    document = response.json()
    assert (document["kind"], document["session"]["id"]) == ("handrail.session", session_id)
    assert document["events"][-1]["event"]["type"] == "run-suspended"

    assert (await server.client.delete(f"/sessions/{session_id}", headers=ANA)).status_code == 204
    assert (await server.client.get(f"/sessions/{session_id}", headers=ANA)).status_code == 404
    assert await server.scenario.engine.store.events(session_id) == []


# -- tenants and keys ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "", None),
        ("DELETE", "", None),
        ("GET", "/export", None),
        ("GET", "/events", None),
        ("POST", "/turns", {"text": "hi"}),
        ("POST", "/resolve", {"tool_call_id": "c", "decision": {"decision": "reject"}}),
        ("POST", "/interrupt", None),
    ],
)
async def test_another_tenants_session_is_not_found(
    server: Server, method: str, path: str, body: Any
) -> None:
    session_id, call_id = await suspended(server)
    if body and "tool_call_id" in body:
        body = {**body, "tool_call_id": call_id}
    theirs = await server.client.request(
        method, f"/sessions/{session_id}{path}", json=body, headers=BOB
    )
    nobodys = await server.client.request(method, f"/sessions/nope{path}", json=body, headers=BOB)
    assert theirs.status_code == nobodys.status_code == 404
    assert theirs.json() == {
        "error": {
            "type": "not_found",
            "message": f"No session {session_id!r} for this caller.",
            "request_id": IsStr(),
        }
    }
    # The library's message names the caller's scope and how a session is found; over HTTP
    # a stranger's session and nobody's read the same, and say no more.
    assert nobodys.json()["error"]["message"] == "No session 'nope' for this caller."
    assert len(await server.pending(session_id)) == 1  # nothing changed


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Basic key-ana"},
        {"Authorization": "Bearer"},
    ],
)
async def test_a_request_without_a_valid_key_is_unauthorized(
    server: Server, headers: dict[str, str]
) -> None:
    response = await server.client.get("/sessions", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["type"] == "unauthorized"


async def test_nothing_secret_is_logged(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    session_id, call_id = await suspended(server)
    await server.client.post(
        f"/sessions/{session_id}/resolve", json=approve(call_id, amount=40), headers=ANA
    )
    await server.join(session_id)
    await server.client.get("/sessions", headers={"Authorization": "Bearer not-a-key-123"})
    for secret in ("key-ana", "not-a-key-123", "A1042", "damaged on arrival"):
        assert secret not in caplog.text


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "loc", "message"),
    [
        ("/turns", {}, ["text"], "text: Field required"),
        ("/turns", {"text": ""}, ["text"], "text: String should have at least 1 character"),
        ("/turns", {"text": "hi", "extra": 1}, ["extra"], "extra: Extra inputs are not permitted"),
        (
            "/turns",
            {"text": "hi", "route": "nope"},
            None,
            "route: no route 'nope' (routes: ",
        ),
        ("/resolve", [], [], "List should have at least 1 item"),
        (
            "/resolve",
            {"tool_call_id": "c", "decision": {"decision": "maybe"}},
            ["ResolveItem", "decision"],
            "Input tag 'maybe' found using 'decision' does not match any of the expected tags",
        ),
    ],
)
async def test_a_bad_body_is_422_saying_where(
    server: Server, path: str, body: Any, loc: list[str] | None, message: str
) -> None:
    session_id = await server.new_session()
    response = await server.client.post(f"/sessions/{session_id}{path}", json=body, headers=ANA)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["type"] == "invalid_request"
    assert any(
        message in text
        for text in [error["message"], *(d["msg"] for d in error.get("details", []))]
    )
    if loc:
        assert error["details"][0]["loc"][: len(loc)] == loc
        assert "input" not in error["details"][0]


async def test_a_body_that_is_not_json_is_422(server: Server) -> None:
    session_id = await server.new_session()
    response = await server.client.post(
        f"/sessions/{session_id}/turns", content=b"{nope", headers={**ANA, **JSON}
    )
    assert response.status_code == 422
    assert "Invalid JSON" in response.json()["error"]["message"]


@pytest.mark.parametrize("media", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_that_is_not_said_to_be_json_is_415(server: Server, media: str | None) -> None:
    session_id = await server.new_session()
    headers = {**ANA, **({"Content-Type": media} if media else {})}
    response = await server.client.post(
        f"/sessions/{session_id}/turns", content=b'{"text": "hi"}', headers=headers
    )
    assert response.status_code == 415
    assert response.json()["error"]["type"] == "unsupported_media_type"


async def test_a_decision_that_does_not_fit_the_card_is_422(server: Server) -> None:
    session_id, call_id = await suspended(server)
    response = await server.client.post(
        f"/sessions/{session_id}/resolve", json=approve(call_id, order_id="B2001"), headers=ANA
    )
    assert response.status_code == 422
    assert response.json()["error"] == {
        "type": "invalid_decision",
        "message": IsStr(regex=r".*order_id cannot be amended \(amendable: amount\).*"),
        "request_id": IsStr(),
    }
    twice = await server.client.post(
        f"/sessions/{session_id}/resolve", json=[approve(call_id), approve(call_id)], headers=ANA
    )
    assert twice.status_code == 422
    assert twice.json()["error"]["message"] == "A tool_call_id is decided twice."


@pytest.mark.parametrize("app_options", [{"max_body_size": 1000}])
async def test_an_oversized_body_is_413(server: Server) -> None:
    session_id = await server.new_session()
    big = {"text": "x" * 2000}
    response = await server.client.post(f"/sessions/{session_id}/turns", json=big, headers=ANA)
    assert response.status_code == 413
    assert response.json()["error"] == {
        "type": "body_too_large",
        "message": "The request body is over 1000 bytes.",
        "request_id": IsStr(),
    }

    async def chunked() -> Any:  # no Content-Length: counted as it arrives
        for _ in range(20):
            yield b"x" * 100

    response = await server.client.post(
        f"/sessions/{session_id}/turns", content=chunked(), headers={**ANA, **JSON}
    )
    assert response.status_code == 413


async def test_an_unknown_route_and_method_answer_json(server: Server) -> None:
    missing = await server.client.get("/nope", headers=ANA)
    assert (missing.status_code, missing.json()["error"]["type"]) == (404, "not_found")
    wrong = await server.client.put("/sessions", headers=ANA)
    assert (wrong.status_code, wrong.json()["error"]["type"]) == (405, "method_not_allowed")


# -- OpenAPI ---------------------------------------------------------------------------------


async def test_the_openapi_document_describes_every_route(server: Server) -> None:
    response = await server.client.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    routes = {
        (method.lower(), route.path)
        for route in server.app.routes
        for method in getattr(route, "methods", None) or ()
        if method != "HEAD"
    }
    described = {(m, path) for path, ops in document["paths"].items() for m in ops}
    assert described == routes
    turns = document["paths"]["/sessions/{session_id}/turns"]["post"]
    assert turns["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/TurnBody"
    }
    assert {"202", "401", "404", "409", "413", "422"} <= set(turns["responses"])
    schemas = document["components"]["schemas"]
    assert {"TurnBody", "ResolveBody", "ResolveItem", "Approve", "Event", "ErrorBody"} <= set(
        schemas
    )


async def test_the_api_key_authenticator_keeps_only_hashes() -> None:
    from handrail.server import ApiKeyAuthenticator, Caller

    auth = ApiKeyAuthenticator({"s3cret-key": Caller("acme", "ana")}, salt=b"salt")
    assert "s3cret-key" not in repr(vars(auth)) + repr(auth._callers)
    assert auth.digest("s3cret-key") in auth._callers
    other = ApiKeyAuthenticator(salt=b"salt")
    other.add_digest(auth.digest("s3cret-key"), Caller("acme", "ana"))
    request = httpx.Request("GET", "http://x", headers={"Authorization": "Bearer s3cret-key"})
    from starlette.requests import Request

    headers = [(k.lower(), v) for k, v in request.headers.raw]
    scope = {"type": "http", "headers": headers, "method": "GET", "path": "/"}
    key_id = f"key:{auth.digest('s3cret-key')[:12]}"  # stable under one salt; not the key
    assert await other.authenticate(Request(scope)) == Caller("acme", "ana", credential=key_id)
    with pytest.raises(ValueError, match="API key"):
        other.add(" padded ", Caller("a", "b"))


async def test_many_turns_at_once_each_stream_whole_and_in_order() -> None:
    """More turns than go per pass of the loop: every one streams all its events, in order."""
    from handrail import Agent, Engine, MemoryStore, Runtime
    from handrail.models import ModelRequest
    from handrail.server import create_app
    from handrail.testing import FunctionModel

    from .conftest import StreamingTransport, authenticator

    def answer(request: ModelRequest) -> str:
        return " ".join(f"w{i}" for i in range(30))

    engine = Engine(Agent("a"), store=MemoryStore(), runtime=Runtime(model=FunctionModel(answer)))
    app = create_app(engine, authenticator=authenticator())
    transport = StreamingTransport(app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://test", headers=ANA) as client,
    ):

        async def turn() -> list[Any]:
            session_id = (await client.post("/sessions")).json()["id"]
            async with client.stream(
                "POST",
                f"/sessions/{session_id}/turns",
                json={"text": "hi"},
                headers={"Accept": "text/event-stream"},
            ) as response:
                return [frame async for frame in frames(response)]

        streams = await asyncio.gather(*(turn() for _ in range(20)))
    for events in streams:
        assert [e.id for e in events] == list(range(1, len(events) + 1))
        assert events[-1].type == "run-completed"
        assert sum(e.type == "text-delta" for e in events) == 30


# -- bounded inputs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "params", "headers", "problem"),
    [
        ("/sessions", {"offset": str(2**63)}, {}, "offset"),
        ("/sessions/{id}/events", {"after": str(2**63)}, {}, "after"),
        ("/sessions/{id}/events", {}, {"Last-Event-ID": "\u00b2"}, "Last-Event-ID"),
        ("/sessions/{id}/events", {}, {"Last-Event-ID": str(2**63)}, "Last-Event-ID"),
        ("/sessions/a%00b", {}, {}, "Not a session id"),
        ("/sessions/a%00b/events", {}, {}, "Not a session id"),
        ("/sessions/" + "x" * 300, {}, {}, "Not a session id"),
    ],
)
async def test_numbers_and_ids_no_store_could_take_are_refused_with_json(
    server: Server, path: str, params: dict[str, str], headers: dict[str, str], problem: str
) -> None:
    session_id = await server.new_session()
    encoded = {k: v.encode("latin-1") for k, v in headers.items()}  # a raw header byte
    response = await server.client.get(
        path.replace("{id}", session_id), params=params, headers={**ANA, **encoded}
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request"
    assert problem in error["message"]


# -- security headers ---------------------------------------------------------------------------


async def test_the_page_and_the_api_carry_security_headers(server: Server) -> None:
    page = await server.client.get("/")
    api = await server.client.get("/sessions", headers=ANA)
    refused = await server.client.get("/sessions")  # an error answer too
    for response in (page, api, refused):
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "no-referrer"
    assert api.headers["cache-control"] == "no-store"
    assert refused.headers["cache-control"] == "no-store"
    assert page.status_code == 200 and "no-store" not in page.headers.get("cache-control", "")


async def test_every_error_names_its_request_and_an_unexpected_one_is_json(
    server: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    refused = await server.client.get("/sessions", headers={"X-Request-ID": "trace-42"})
    assert refused.headers["x-request-id"] == "trace-42"
    assert refused.json()["error"]["request_id"] == "trace-42"
    odd = await server.client.get("/sessions", headers={"X-Request-ID": "no spaces\tplease"})
    assert odd.headers["x-request-id"] != "no spaces\tplease"  # not taken: a new one

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("internal detail: db at 10.0.0.7")

    monkeypatch.setattr(server.app.state.runs.engine.store, "list", broken)
    app = server.app
    # Answered and logged by the app: not raised again for the server to log a second time.
    transport = httpx.ASGITransport(app, raise_app_exceptions=True)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        with caplog.at_level("ERROR"):
            response = await client.get("/sessions", headers=ANA)
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "internal_error" and "10.0.0.7" not in error["message"]
    rid = error["request_id"]
    assert response.headers["x-request-id"] == rid
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert rid in record.getMessage() and record.exc_info is not None
    assert (record.reference, record.request_id) == (rid, rid)  # type: ignore[attr-defined]
    assert 'raise RuntimeError("internal detail: db at 10.0.0.7")' in caplog.text


async def test_another_tenants_decision_is_refused_before_any_wait(server: Server) -> None:
    session_id, call_id = await suspended(server)
    engine = server.app.state.runs.engine
    async with engine._lock(session_id):  # the session is busy here (a long save, say)
        async with asyncio.timeout(2):  # answered at once, not after the lock is free
            response = await server.client.post(
                f"/sessions/{session_id}/resolve", json=approve(call_id), headers=BOB
            )
    assert response.status_code == 404


async def test_a_stream_that_fails_after_its_200_ends_with_an_error_event(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id = await server.new_session()

    async def unreadable(*args: Any, **kwargs: Any) -> Any:
        raise StoreError("the event log cannot be read")

    monkeypatch.setattr(server.app.state.runs.engine.store, "events", unreadable)
    async with server.streaming.stream(
        "GET", f"/sessions/{session_id}/events", headers={**ANA, "X-Request-ID": "r-7"}
    ) as response:
        assert response.status_code == 200
        body = (await response.aread()).decode()
    assert body.startswith("event: error\ndata: ")
    error = json.loads(body.split("data: ", 1)[1])["error"]
    assert (error["type"], error["request_id"]) == ("stream_failed", "r-7")


async def test_a_corrupt_event_row_does_not_stop_every_reconnect_at_it(server: Server) -> None:
    session_id = await server.new_session()
    await server.submit(session_id, "Where is my order A1042?")
    await server.join(session_id)
    store = server.app.state.runs.engine.store
    log = store._events[session_id]  # the memory store's rows: corrupt the second one
    log[1] = (log[1][0], '{"type": "text-delta", "delta": ')

    frames_ = await server.events(session_id)
    assert [f.id for f in frames_] == [seq for seq, _ in log]  # every event, the bad one too
    bad = frames_[1]
    assert bad.type == "event-unreadable" and bad.data["seq"] == 2
    assert frames_[-1].type == "run-completed"
    # A client that had the event before it reconnects past it, and on to the end.
    again = await server.events(session_id, after=1)
    assert [f.id for f in again] == [f.id for f in frames_[1:]]


async def test_a_corrupt_session_says_so_and_can_still_be_deleted(server: Server) -> None:
    session_id = await server.new_session()
    await server.submit(session_id, "Where is my order A1042?")
    await server.join(session_id)
    store = server.app.state.runs.engine.store
    record = await store.load(session_id)
    record.data = {**record.data, "schema_version": 99}  # written by a newer handrail, say
    await store.save(record)

    read = await server.client.get(f"/sessions/{session_id}", headers=ANA)
    assert read.status_code == 500
    error = read.json()["error"]
    assert error["type"] == "session_corrupt"
    assert "DELETE the session" in error["message"] and "upgrade handrail" in error["message"]
    assert (await server.client.get(f"/sessions/{session_id}", headers=BOB)).status_code == 404
    deleted = await server.client.delete(f"/sessions/{session_id}", headers=ANA)
    assert deleted.status_code == 204
    assert (await server.client.get(f"/sessions/{session_id}", headers=ANA)).status_code == 404


# -- the history, in pages ----------------------------------------------------------------


async def test_the_history_is_read_in_pages_newest_first_then_before_a_position(
    server: Server,
) -> None:
    session_id = await server.new_session()
    for text in ("Where is my order A1042?", "And A1043?"):
        await server.submit(session_id, text)
        await server.join(session_id)
    whole = (await server.client.get(f"/sessions/{session_id}", headers=ANA)).json()
    assert whole["first"] == 0
    count = len(whole["messages"])
    assert count >= 4

    url = f"/sessions/{session_id}/messages"
    newest = (await server.client.get(url, params={"limit": 2}, headers=ANA)).json()
    assert newest == {"messages": whole["messages"][-2:], "first": count - 2}
    pages = [newest]
    while pages[-1]["first"] > 0:
        before = {"before": pages[-1]["first"], "limit": 3}
        pages.append((await server.client.get(url, params=before, headers=ANA)).json())
    assert [m for page in reversed(pages) for m in page["messages"]] == whole["messages"]
    empty = (await server.client.get(url, params={"before": 0}, headers=ANA)).json()
    assert empty == {"messages": [], "first": 0}

    assert (await server.client.get(url, headers=BOB)).status_code == 404
    for bad in ({"limit": 0}, {"before": -1}, {"limit": "many"}, {"after": 1}):
        refused = await server.client.get(url, params=bad, headers=ANA)
        assert refused.status_code == 422, bad


async def test_a_new_message_while_the_turn_waits_says_what_to_post(server: Server) -> None:
    session_id, call_id = await suspended(server)
    response = await server.client.post(
        f"/sessions/{session_id}/turns", json={"text": "hello?"}, headers=ANA
    )
    assert (response.status_code, response.json()["error"]["type"]) == (409, "conflict")
    assert response.json()["error"]["message"] == (
        f"Session {session_id!r} is waiting on decisions for {call_id}: POST them to "
        f"/sessions/{session_id}/resolve (the turn resumes once none is left), then send the "
        f"message again."
    )


async def test_a_new_message_after_a_cut_off_turn_says_the_server_recovers_it(
    server: Server,
) -> None:
    session_id, _ = await suspended(server)
    store = server.scenario.engine.store
    record = await store.load(session_id)
    assert record is not None
    record.data["progress"]["status"] = "running"  # as a server killed mid-turn leaves it
    await store.save(record)
    response = await server.client.post(
        f"/sessions/{session_id}/turns", json={"text": "hello?"}, headers=ANA
    )
    assert (response.status_code, response.json()["error"]["type"]) == (409, "conflict")
    assert response.json()["error"]["message"] == (
        f"Session {session_id!r}: the previous turn was cut off while it ran (a server "
        f"stopped), and the server recovers it by itself; wait for it to end (its events: "
        f"GET /sessions/{session_id}/events), then send the message again."
    )
