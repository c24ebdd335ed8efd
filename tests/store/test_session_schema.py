"""Stored sessions of every `RunState` schema version, read by every store through an engine.

A fixture a version: `fixtures/session_v1.json` is a suspended session (a finished turn, then
a refund waiting for approval) as handrail wrote it at schema version 1, its messages inside
the document.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from handrail import Agent, Approve, Engine, Runtime, SessionRecord, tool
from handrail.messages import MESSAGES
from handrail.state import SCHEMA_VERSION
from handrail.store import SessionStore
from handrail.testing import ScriptedModel

FIXTURES = Path(__file__).parent / "fixtures"
refunds: list[float] = []


@tool(name="orders.lookup")
def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"{order_id}: delivered"


@tool(name="orders.refund", permission="write")
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    refunds.append(amount)
    return f"refunded {amount}"


def engine(store: SessionStore, steps: list[Any]) -> Engine:
    counter = itertools.count(100)
    runtime = Runtime(model=ScriptedModel(steps), ids=lambda prefix: f"{prefix}_{next(counter)}")
    return Engine(Agent("desk", tools=[lookup, refund]), store=store, runtime=runtime)


async def test_a_version_1_session_is_read_and_stored_apart_at_its_next_save(
    store: SessionStore,
) -> None:
    assert SCHEMA_VERSION == 2
    stored = json.loads((FIXTURES / "session_v1.json").read_text())
    assert stored["data"]["schema_version"] == 1
    await store.save(  # the row as an older handrail left it
        SessionRecord(
            id="v1",
            org_id="acme",
            user_id="ana",
            status=stored["status"],
            expires_at=stored["expires_at"],
            data=stored["data"],
        )
    )
    desk = engine(store, ["Refunded €84."])
    state = await desk.session("v1", org_id="acme", user_id="ana")
    assert [m.role for m in state.messages] == [
        "user",
        "assistant",
        "assistant",
        "user",
        "assistant",
    ]
    assert list(state.pending) == ["call_2"]

    await desk.resolve("v1", "call_2", Approve(by="ana"), org_id="acme", user_id="ana")
    record = await store.load("v1")
    assert record is not None
    assert record.data["schema_version"] == 2 and "messages" not in record.data
    history = MESSAGES.validate_python([m for _, m in await store.messages("v1")])
    assert history[:4] == MESSAGES.validate_python(stored["data"]["messages"][:4])
    assert len(history) == 5 and history[-1].parts[-1].decision == "approve"  # type: ignore[union-attr]

    refunds.clear()
    events = [e async for e in desk.resume("v1", org_id="acme", user_id="ana")]
    assert events[-1].type == "run-completed" and refunds == [84.0]
    state = await desk.session("v1", org_id="acme", user_id="ana")
    assert [m.text for m in state.messages][-1] == "Refunded €84."
    assert len(await store.messages("v1")) == 6


async def test_a_version_2_export_of_a_version_1_session_imports_and_goes_on(
    store: SessionStore,
) -> None:
    document = (FIXTURES / "export_v2_session.json").read_text()
    assert json.loads(document)["schema_version"] == 2
    await store.import_(document)
    desk = engine(store, ["Refunded €84."])
    await desk.resolve("v1", "call_2", Approve(by="ana"), org_id="acme", user_id="ana")
    refunds.clear()
    events = [e async for e in desk.resume("v1", org_id="acme", user_id="ana")]
    assert events[-1].type == "run-completed" and refunds == [84.0]
    # Exported again, today's export holds the whole history, apart from the document.
    exported = json.loads(await store.export("v1"))
    assert exported["schema_version"] == 3 and "messages" not in exported["session"]["data"]
    assert [m["role"] for m in exported["messages"]] == [
        "user",
        "assistant",
        "assistant",
        "user",
        "assistant",
        "assistant",
    ]


async def test_a_version_2_session_is_read_as_stored(store: SessionStore) -> None:
    stored = json.loads((FIXTURES / "session_v2.json").read_text())
    assert stored["data"]["schema_version"] == 2 and "messages" not in stored["data"]
    await store.save(
        SessionRecord(
            id="v2",
            org_id="acme",
            user_id="ana",
            status=stored["status"],
            expires_at=stored["expires_at"],
            data=stored["data"],
            messages=stored["messages"],
            window=stored["window"],
        )
    )
    desk = engine(store, ["Refunded €84."])
    state = await desk.session("v2", org_id="acme", user_id="ana")
    assert (state.base, state.turn_start, len(state.messages)) == (0, 3, 5)
    assert list(state.pending) == ["call_2"]
    await desk.resolve("v2", "call_2", Approve(by="ana"), org_id="acme", user_id="ana")
    refunds.clear()
    events = [e async for e in desk.resume("v2", org_id="acme", user_id="ana")]
    assert events[-1].type == "run-completed" and refunds == [84.0]
    history = [m for _, m in await store.messages("v2")]
    assert history[:3] == stored["messages"][:3]  # the finished turn, as it was stored
    assert len(history) == 6
