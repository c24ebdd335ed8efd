"""Input no store can hold, and rows no store can read: typed answers, never a store failure."""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from handrail import Agent, Engine, Runtime, tool
from handrail.demo.support_desk import build_scenario
from handrail.messages import ToolCallPart
from handrail.server import create_app
from handrail.store import MemoryStore, SessionStore, SqliteStore
from handrail.testing import ScriptedModel, call, sequential_ids

from .conftest import ANA, Server, StreamingTransport, authenticator
from .test_processes import PG_DSN, _postgres_unavailable

FILTERS = [
    ("/audit", "session_id"),
    ("/audit", "tool"),
    ("/pending", "tool"),
    ("/pending", "session_id"),
    ("/pending", "cursor"),
]


@pytest.fixture(scope="module")
def pg_schema() -> Iterator[str]:
    if reason := _postgres_unavailable():
        pytest.skip(reason)
    import psycopg

    schema = f"handrail_bad_input_{os.getpid()}_{secrets.token_hex(3)}"
    yield schema
    with psycopg.connect(PG_DSN, autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def client(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the support desk on each kind of store."""
    store: SessionStore | None = None
    if request.param == "sqlite":
        store = SqliteStore(tmp_path / "handrail.db")
    elif request.param == "postgres":
        from handrail.store import PostgresStore

        schema = request.getfixturevalue("pg_schema")
        store = await PostgresStore.connect(PG_DSN, schema=schema, pool_size=2)
    # every member reads the trail here: these tests are about the filters, not the role
    app = create_app(
        build_scenario(store=store).engine, authenticator=authenticator(), audit_roles=None
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
    ):
        yield client
    if store is not None:
        await store.close()


@pytest.mark.parametrize(("path", "name"), FILTERS)
async def test_a_nul_in_a_query_filter_is_422_naming_the_parameter(
    client: httpx.AsyncClient, path: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    answer = await client.get(f"{path}?{name}=a%00b", headers=ANA)
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request"
    assert error["message"].startswith(f"{name!r}: ")
    assert "NUL" in error["message"]
    assert "store" not in caplog.text  # no store failure logged
    if name != "cursor":  # (a cursor is the server's own token: "ab" is not one)
        assert (await client.get(f"{path}?{name}=ab", headers=ANA)).status_code == 200


@settings(max_examples=50, deadline=None)
@given(
    before=st.text(max_size=5),
    after=st.text(max_size=5),
    filter=st.sampled_from(FILTERS),
)
async def test_any_filter_value_holding_a_nul_is_refused(
    before: str, after: str, filter: tuple[str, str]
) -> None:
    path, name = filter
    app = create_app(build_scenario().engine, authenticator=authenticator(), audit_roles=None)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://test"
    ) as client:
        answer = await client.get(path, params={name: f"{before}\x00{after}"}, headers=ANA)
    assert answer.status_code == 422
    assert answer.json()["error"]["message"].startswith(f"{name!r}: ")


# -- rows that are not UTF-8 ------------------------------------------------------------------


async def _corrupted(tmp_path: Path, sql: str) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A SQLite-backed app with a session of Ana's whose row `sql` then spoils."""
    path = tmp_path / "handrail.db"
    store = SqliteStore(path)
    scenario = build_scenario(store=store)
    app = create_app(scenario.engine, authenticator=authenticator())
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
    ):
        session = (await client.post("/sessions", headers=ANA)).json()["id"]
        turn = await client.post(f"/sessions/{session}/turns", json={"text": "hi"}, headers=ANA)
        assert turn.status_code == 202
        await app.state.runs.join(session)
        with sqlite3.connect(path) as db:  # bytes that are not UTF-8, in a TEXT column
            assert db.execute(sql, (session,)).rowcount >= 1
        db.close()
        yield client, session
    await store.close()


async def test_a_session_row_that_is_not_utf8_is_session_corrupt_naming_it(
    tmp_path: Path,
) -> None:
    spoil = "UPDATE handrail_sessions SET data = CAST(x'7b2261223aff7d' AS TEXT) WHERE id = ?"
    async for client, session in _corrupted(tmp_path, spoil):
        for path in (f"/sessions/{session}", f"/sessions/{session}/export"):
            answer = await client.get(path, headers=ANA)
            assert answer.status_code == 500, answer.text
            error = answer.json()["error"]
            assert error["type"] == "session_corrupt"
            assert f"Session {session!r}" in error["message"]
            assert "utf-8" in error["message"]  # what could not be read
        assert (await client.delete(f"/sessions/{session}", headers=ANA)).status_code == 204


async def test_a_message_row_that_is_not_utf8_is_session_corrupt(tmp_path: Path) -> None:
    spoil = "UPDATE handrail_messages SET message = CAST(x'7bff7d' AS TEXT) WHERE session_id = ?"
    async for client, session in _corrupted(tmp_path, spoil):
        answer = await client.get(f"/sessions/{session}/messages", headers=ANA)
        assert answer.status_code == 500, answer.text
        assert answer.json()["error"]["type"] == "session_corrupt"
        assert session in answer.json()["error"]["message"]


async def test_an_event_row_that_is_not_utf8_is_sent_as_unreadable(tmp_path: Path) -> None:
    spoil = (
        "UPDATE handrail_events SET event = CAST(x'7bff7d' AS TEXT) "
        "WHERE session_id = ? AND seq = 1"
    )
    async for client, session in _corrupted(tmp_path, spoil):
        answer = await client.get(f"/sessions/{session}/events", headers=ANA)
        assert answer.status_code == 200
        first = next(line for line in answer.text.splitlines() if line.startswith("data:"))
        assert '"type":"event-unreadable"' in first.replace(" ", "")


# -- numbers that are not finite ----------------------------------------------------------------

NOT_FINITE = ["inf", "-inf", "Infinity", "-Infinity", "nan", "NaN", "1e999", "-1e999"]


@pytest.fixture
async def desk() -> AsyncIterator[Server]:
    scenario = build_scenario()
    app = create_app(scenario.engine, authenticator=authenticator())
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
        httpx.AsyncClient(transport=StreamingTransport(app), base_url="http://test") as streaming,
    ):
        yield Server(app=app, scenario=scenario, client=client, streaming=streaming)


@pytest.mark.parametrize("amount", NOT_FINITE)
async def test_an_amendment_with_a_number_that_is_not_finite_as_a_string_is_422_naming_it(
    desk: Server, amount: str
) -> None:
    session_id = await desk.new_session()
    await desk.submit(session_id)
    await desk.join(session_id)
    (card,) = await desk.pending(session_id)
    call_id = card["tool_call_id"]
    decision = {"decision": "approve", "amended_args": {"amount": amount}}
    answer = await desk.client.post(
        f"/sessions/{session_id}/resolve",
        json={"tool_call_id": call_id, "decision": decision},
        headers=ANA,
    )
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_decision"
    assert "- amount: Input should be a finite number" in error["message"]
    assert [c["tool_call_id"] for c in await desk.pending(session_id)] == [call_id]  # intact
    decision["amended_args"] = {"amount": 40.0}
    answer = await desk.client.post(
        f"/sessions/{session_id}/resolve",
        json={"tool_call_id": call_id, "decision": decision},
        headers=ANA,
    )
    assert answer.status_code == 200, answer.text
    await desk.join(session_id)
    assert desk.scenario.desk.refunds[0]["amount"] == "€40.00"


class Parcel(BaseModel):
    weight: float


ran: list[Any] = []


@tool(name="ship")
def ship(count: float, parcel: Parcel | None = None, extra: Any = None) -> str:
    """Ship a parcel."""
    ran.append((count, parcel, extra))
    return "shipped"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        *[(f'{{"count": "{text}"}}', "count") for text in NOT_FINITE],
        *[(f'{{"count": {text}}}', "count") for text in ("Infinity", "-Infinity", "NaN", "1e999")],
        ('{"count": 1, "parcel": {"weight": "nan"}}', "parcel.weight"),
        ('{"count": 1, "parcel": {"weight": -Infinity}}', "parcel.weight"),
        ('{"count": 1, "extra": {"list": [1, NaN]}}', "extra.list.1"),
    ],
)
async def test_a_model_sending_a_number_that_is_not_finite_reads_an_error_naming_it(
    raw: str, field: str
) -> None:
    model = ScriptedModel([[ToolCallPart(id="c-1", name="ship", raw_args=raw)], "Sorry."])
    runtime = Runtime(model=model, ids=sequential_ids())
    engine = Engine(Agent("shop", tools=[ship]), store=MemoryStore(), runtime=runtime)
    app = create_app(engine, authenticator=authenticator(), audit_roles=None)
    ran.clear()
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
    ):
        session = (await client.post("/sessions", headers=ANA)).json()["id"]
        turn = await client.post(f"/sessions/{session}/turns", json={"text": "go"}, headers=ANA)
        assert turn.status_code == 202
        await app.state.runs.join(session)
        view = (await client.get(f"/sessions/{session}", headers=ANA)).json()
        audit = await client.get("/audit", headers=ANA)
    assert ran == []  # the tool never ran
    assert view["status"] != "failed", view
    (result,) = [
        part
        for message in view["messages"]
        for part in message.get("parts", [])
        if part.get("type") == "tool-call" and part.get("id") == "c-1"
    ]
    assert f"- {field}: Input should be a finite number" in json.dumps(result)
    assert audit.status_code == 200, audit.text


class Weight(BaseModel):
    kg: float


@tool(name="ask.weight", executor="human", prompt="How heavy is it?")
def ask_weight(question: str) -> Weight:
    """Ask the customer for the parcel's weight."""
    raise AssertionError("a person answers it")


@pytest.mark.parametrize("kg", ["inf", "-Infinity", "nan", "1e999"])
async def test_an_answer_with_a_number_that_is_not_finite_is_422_naming_it(kg: str) -> None:
    model = ScriptedModel([[call("ask.weight", question="How heavy?")], "Thanks."])
    runtime = Runtime(model=model, ids=sequential_ids())
    engine = Engine(Agent("shop", tools=[ask_weight]), store=MemoryStore(), runtime=runtime)
    app = create_app(engine, authenticator=authenticator())
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
    ):
        session = (await client.post("/sessions", headers=ANA)).json()["id"]
        await client.post(f"/sessions/{session}/turns", json={"text": "go"}, headers=ANA)
        await app.state.runs.join(session)
        (card,) = (await client.get(f"/sessions/{session}", headers=ANA)).json()["pending"]

        async def answer(value: Any) -> httpx.Response:
            decision = {"decision": "answer", "output": {"kg": value}}
            body = {"tool_call_id": card["tool_call_id"], "decision": decision}
            return await client.post(f"/sessions/{session}/resolve", json=body, headers=ANA)

        refused = await answer(kg)
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["type"] == "invalid_decision"
        assert "kg: Input should be a finite number" in refused.json()["error"]["message"]
        still = (await client.get(f"/sessions/{session}", headers=ANA)).json()["pending"]
        assert [c["tool_call_id"] for c in still] == [card["tool_call_id"]]
        assert (await answer(2.5)).status_code == 200
