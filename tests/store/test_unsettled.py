"""A store refuses to finish a session while one of its calls still waits for a decision.

A `completed` or `failed` session is never driven again: an undecided card on it (an
approval, an answer, a client call, a recovery card) would strand its call for good. Every
store refuses such a save with an `UnsettledSaveError` naming the session and the calls, and
writes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from handrail import UnsettledSaveError
from handrail.store import SessionRecord

from .conftest import StoreFactory


def card(call_id: str, decision: str | None = None, kind: str = "approval") -> dict[str, Any]:
    return {
        "type": "approval",
        "tool_call_id": call_id,
        "tool_name": "refund",
        "args": {},
        "kind": kind,
        "decision": decision,
    }


def message(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"id": "m1", "role": "assistant", "parts": list(parts)}


async def saved(store: Any, **fields: Any) -> SessionRecord:
    return await store.save(SessionRecord(id="s1", data={"n": 0}, **fields))


@pytest.mark.parametrize("status", ["completed", "failed"])
async def test_a_session_with_an_undecided_card_cannot_be_saved_finished(
    make_store: StoreFactory, status: str
):
    store = await make_store()
    first = await saved(store, status="suspended", messages=[message(card("call_1"))])

    record = SessionRecord(
        id="s1",
        version=first.version,
        status=status,  # type: ignore[arg-type]
        data={"n": 1},
        messages=[message(card("call_1"), card("call_2", "approve"), card("call_3"))],
    )
    with pytest.raises(UnsettledSaveError) as caught:
        await store.save(record)

    error = caught.value
    assert error.session_id == "s1" and error.status == status
    assert error.pending == ("call_1", "call_3")
    assert "'s1'" in str(error) and "call_1, call_3" in str(error)
    stored = await store.load("s1")  # nothing was written
    assert stored is not None and stored.version == first.version
    assert stored.status == "suspended" and stored.data == {"n": 0}

    # Decided (a card decided later in the history settles its call too), it saves.
    record.messages = [
        message(card("call_1"), card("call_2", "approve"), card("call_3", "reject")),
        message(card("call_1", "answer")),
    ]
    assert (await store.save(record)).status == status


async def test_a_card_waiting_in_an_agents_scratch_counts_too(make_store: StoreFactory):
    store = await make_store()
    scratch = {"scratch": {"researcher": [message(card("call_9", kind="recovery"))]}}
    with pytest.raises(UnsettledSaveError, match="call_9"):
        await store.save(SessionRecord(id="s1", status="failed", data=scratch))
    assert await store.load("s1") is None
