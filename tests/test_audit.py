"""The audit trail: the chain and `verify`; what the engine records, and what it does not."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from handrail import (
    Agent,
    Approve,
    AuditEntry,
    Engine,
    InvalidDecisionError,
    Reject,
    Runtime,
    SessionRecord,
    StaleResolutionError,
    StoreError,
    tool,
)
from handrail.audit import GENESIS, chain, entry_hash, verify
from handrail.store import MemoryStore
from handrail.suspension import args_digest
from handrail.testing import ScriptedModel, call, sequential_ids


def trail(n: int) -> list[AuditEntry]:
    entries: list[AuditEntry] = []
    for seq in range(1, n + 1):
        entry = AuditEntry(org_id="acme", at=float(seq), session_id="s", tool="t", outcome="ok")
        entries.append(chain(entry, seq=seq, prev_hash=entries[-1].hash if entries else GENESIS))
    return entries


def test_a_whole_trail_verifies() -> None:
    assert verify(trail(4)) == []
    assert verify([]) == []


def test_an_edited_entry_is_named() -> None:
    entries = trail(4)
    entries[1].outcome = "error: declined"
    (problem,) = verify(entries)
    assert (problem.seq, problem.kind) == (2, "edited")


def test_an_entry_edited_with_its_hash_recomputed_breaks_the_next_link() -> None:
    entries = trail(4)
    entries[1].outcome = "error: declined"
    entries[1].hash = entry_hash(entries[1])
    (problem,) = verify(entries)
    assert (problem.seq, problem.kind) == (3, "relinked")


def test_deleted_entries_are_named_from_the_next_one() -> None:
    entries = trail(5)
    del entries[1:3]
    (problem,) = verify(entries)
    assert (problem.seq, problem.kind) == (4, "deleted")
    assert problem.message == "entries 2 to 3 before entry 4 are missing (deleted)"
    (first,) = verify(trail(3)[1:])
    assert (first.seq, first.message) == (2, "entry 1 before entry 2 is missing (deleted)")


def test_reordered_entries_are_named() -> None:
    entries = trail(4)
    entries[1], entries[2] = entries[2], entries[1]
    problems = verify(entries)
    assert [(p.seq, p.kind) for p in problems][:2] == [(3, "deleted"), (2, "reordered")]


def test_an_entry_reads_back_from_its_json_and_refuses_what_is_not_one() -> None:
    (entry,) = trail(1)
    assert AuditEntry.from_json(entry.to_json()) == entry
    with pytest.raises(ValueError, match="unknown keys"):
        AuditEntry.from_json({**entry.to_json(), "extra": 1})
    with pytest.raises(ValueError, match="kind"):
        AuditEntry.from_json({**entry.to_json(), "kind": "other"})


@tool(name="orders.lookup")
def lookup(order_id: str) -> str:
    """Look an order up (read-only: never audited)."""
    return f"{order_id}: shipped"


@tool(name="orders.cancel", permission="write", approval="auto")
def cancel(order_id: str) -> str:
    """Cancel an order (a side effect that fails here)."""
    raise RuntimeError(f"order {order_id} already shipped")


@tool(name="orders.refund", permission="write", approval="required", amendable=["amount"])
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    return f"refunded {amount} on {order_id}"


def engine_for(steps: list[Any], store: MemoryStore) -> Engine:
    runtime = Runtime(model=ScriptedModel(steps), ids=sequential_ids(), clock=lambda: 1000.0)
    return Engine(Agent("a", tools=[lookup, cancel, refund]), store=store, runtime=runtime)


async def test_a_failed_side_effect_is_recorded_and_a_read_is_not() -> None:
    store = MemoryStore()
    engine = engine_for(
        [[call("orders.lookup", order_id="A1"), call("orders.cancel", order_id="A1")], "Done."],
        store,
    )
    await engine.submit("s-1", "cancel A1", org_id="acme", user_id="dana").finish()
    (entry,) = await store.audit("acme")
    assert dataclasses.replace(entry, tool_call_id="", hash="") == AuditEntry(
        org_id="acme", seq=1, at=1000.0, kind="call", session_id="s-1", tool="orders.cancel",
        who="dana", args_digest=args_digest("orders.cancel", {"order_id": "A1"}),
        outcome=entry.outcome, latency_ms=0.0, prev_hash=GENESIS,
    )  # fmt: skip
    assert entry.outcome is not None and entry.outcome.startswith("error: ")
    assert "already shipped" in entry.outcome


async def test_decisions_record_who_via_what_and_a_refused_one_records_nothing() -> None:
    store = MemoryStore()
    engine = engine_for(
        [[call("orders.refund", order_id="A1", amount=84.0)], "Waiting.", "Refunded."], store
    )
    scope = {"org_id": "acme", "user_id": "dana"}
    await engine.submit("s-1", "refund A1", **scope).finish()
    (call_id,) = (await engine.session("s-1", **scope)).pending

    with pytest.raises(InvalidDecisionError):
        await engine.resolve("s-1", call_id, Approve(amended_args={"order_id": "B2"}), **scope)
    with pytest.raises(StaleResolutionError):
        await engine.resolve("s-1", "call_nope", Reject(), **scope)
    assert await store.audit("acme") == []  # nothing was decided

    await engine.resolve(
        "s-1", call_id, Approve(amended_args={"amount": 40.0}, by="ana", via="key-7"), **scope
    )
    (decided,) = await store.audit("acme")
    assert (decided.who, decided.via, decided.decision, decided.at) == (
        "ana", "key-7", "approve", 1000.0,
    )  # fmt: skip
    assert (decided.amended_before, decided.amended_after) == ({"amount": 84.0}, {"amount": 40.0})
    assert decided.args_digest == args_digest("orders.refund", {"order_id": "A1", "amount": 40.0})
    await engine.resume("s-1", **scope).finish()
    _, ran = await store.audit("acme")
    assert (ran.kind, ran.outcome, ran.args_digest) == ("call", "ok", decided.args_digest)
    assert verify(await store.audit("acme")) == []


class _NoTrail(MemoryStore):
    """A store whose audit trail cannot be written (its table is gone, say)."""

    async def save(self, record: SessionRecord) -> SessionRecord:
        if record.audit:
            raise StoreError("the audit table is gone")
        return await super().save(record)


async def test_a_decision_whose_audit_entry_cannot_be_written_is_not_recorded() -> None:
    store = _NoTrail()
    engine = engine_for([[call("orders.refund", order_id="A1", amount=84.0)], "Waiting."], store)
    await engine.submit("s-1", "refund A1", org_id="acme").finish()
    (call_id,) = (await engine.session("s-1", org_id="acme")).pending
    before = await store.load("s-1")
    with pytest.raises(StoreError, match="the audit table is gone"):
        await engine.resolve("s-1", call_id, Reject(by="ana"), org_id="acme")
    # The decision and its entry are one write: neither is stored, the call still waits.
    after = await store.load("s-1")
    assert before is not None and after is not None and after.version == before.version
    assert list((await engine.session("s-1", org_id="acme")).pending) == [call_id]
    assert await store.audit("acme") == []


async def test_a_decision_and_its_audit_entry_are_one_save() -> None:
    store = MemoryStore()
    engine = engine_for([[call("orders.refund", order_id="A1", amount=84.0)], "Waiting."], store)
    await engine.submit("s-1", "refund A1", org_id="acme").finish()
    (call_id,) = (await engine.session("s-1", org_id="acme")).pending
    saves: list[int] = []
    original = store.save

    async def counting(record: SessionRecord) -> SessionRecord:
        saves.append(len(record.audit))
        return await original(record)

    store.save = counting  # type: ignore[method-assign]
    await engine.resolve("s-1", call_id, Reject(by="ana"), org_id="acme")
    assert saves == [1]  # one write: the decision with its entry
    (entry,) = await store.audit("acme")
    assert (entry.tool_call_id, entry.decision, entry.who) == (call_id, "reject", "ana")
