"""The audit trail in every store: numbered and chained per organisation, never forked,
paged and filtered, and kept when sessions go."""

from __future__ import annotations

import asyncio

import pytest

from handrail import AuditEntry, ConflictError, SessionRecord, StoreError
from handrail.audit import GENESIS, entry_hash, verify
from handrail.store import SessionStore

from .conftest import StoreFactory


def decision(org: str | None, session: str = "s-1", **fields: object) -> AuditEntry:
    return AuditEntry(
        org_id=org, at=1.5, kind="decision", session_id=session, tool="orders.refund",
        tool_call_id="call_1", who="ana", decision="approve", **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def call(org: str | None, session: str = "s-1", tool: str = "orders.refund") -> AuditEntry:
    return AuditEntry(
        org_id=org, at=2.0, kind="call", session_id=session, tool=tool, tool_call_id="call_1",
        outcome="ok", latency_ms=3.25, args_digest="d" * 64,
    )  # fmt: skip


async def test_entries_are_numbered_and_chained_per_organisation(store: SessionStore) -> None:
    first = await store.append_audit(
        decision("acme", amended_before={"amount": 84.0}, amended_after={"amount": 40.0})
    )
    other = await store.append_audit(decision("globex"))
    second = await store.append_audit(call("acme"))
    assert (first.seq, first.prev_hash) == (1, GENESIS)
    assert (other.seq, other.prev_hash) == (1, GENESIS)
    assert (second.seq, second.prev_hash) == (2, first.hash)
    assert first.hash == entry_hash(first) and second.hash == entry_hash(second)

    acme = await store.audit("acme")
    assert acme == [first, second]  # read back byte for byte: the hashes still hold
    assert verify(acme) == []
    assert await store.audit("globex") == [other]
    assert await store.audit("nobody") == []


async def test_sessions_without_an_organisation_share_a_trail(store: SessionStore) -> None:
    entry = await store.append_audit(decision(None))
    assert entry.seq == 1
    assert await store.audit(None) == [entry]
    assert await store.audit("") == [entry]  # "" names the same trail (as on the CLI)


async def test_the_trail_is_paged_and_filtered(store: SessionStore) -> None:
    for n in range(5):
        await store.append_audit(decision("acme", session=f"s-{n % 2}"))
        await store.append_audit(call("acme", session=f"s-{n % 2}", tool=f"t{n % 3}"))
    page = await store.audit("acme", limit=4)
    assert [e.seq for e in page] == [1, 2, 3, 4]
    assert [e.seq for e in await store.audit("acme", after=4, limit=4)] == [5, 6, 7, 8]
    assert [e.seq for e in await store.audit("acme", after=8)] == [9, 10]
    assert [e.seq for e in await store.audit("acme", kind="call")] == [2, 4, 6, 8, 10]
    assert [e.seq for e in await store.audit("acme", session_id="s-1")] == [3, 4, 7, 8]
    assert [e.seq for e in await store.audit("acme", tool="t0")] == [2, 8]
    calls = await store.audit("acme", session_id="s-0", kind="call", tool="t1")
    assert [e.seq for e in calls] == [10]
    with pytest.raises(ValueError, match="after and limit"):
        await store.audit("acme", after=-1)
    with pytest.raises(ValueError, match="kind"):
        await store.audit("acme", kind="nope")  # type: ignore[arg-type]


async def test_an_entry_json_cannot_carry_is_refused_and_nothing_is_appended(
    store: SessionStore,
) -> None:
    with pytest.raises(StoreError, match="JSON-compatible"):
        await store.append_audit(decision("acme", amended_after={"amount": float("nan")}))
    assert await store.audit("acme") == []
    assert (await store.append_audit(decision("acme"))).seq == 1


async def test_deleting_a_session_keeps_its_trail(store: SessionStore) -> None:
    await store.save(SessionRecord(id="s-1", org_id="acme", user_id="ana"))
    kept = [await store.append_audit(decision("acme")), await store.append_audit(call("acme"))]
    assert await store.delete("s-1")
    assert await store.audit("acme") == kept


async def test_concurrent_appends_from_two_stores_keep_one_chain(
    make_store: StoreFactory,
) -> None:
    """Two store objects (two connection pools; two connection threads for SQLite) append to
    one organisation's trail at once, as two processes would: one unbroken chain."""
    one, two = await make_store(), await make_store()
    await asyncio.gather(
        *((one if n % 2 else two).append_audit(call("acme", session=f"s-{n}")) for n in range(40))
    )
    trail = await one.audit("acme", limit=1000)
    assert [e.seq for e in trail] == list(range(1, 41))
    assert sorted(e.session_id for e in trail) == sorted(f"s-{n}" for n in range(40))
    assert verify(trail) == []


async def test_a_result_is_logged_with_its_audit_entry_or_not_at_all(store: SessionStore) -> None:
    await store.log_started("s-1", "c-1", key="k", tool="orders.refund", args={})
    with pytest.raises(StoreError, match="JSON-compatible"):
        bad = call("acme")
        bad.latency_ms = float("inf")
        await store.log_finished("s-1", "c-1", {"ok": True}, audit=bad)
    assert [e.status for e in await store.tool_log("s-1")] == ["started"]  # nothing recorded
    assert await store.audit("acme") == []

    assert await store.log_finished("s-1", "c-1", {"ok": True}, audit=call("acme"))
    assert [e.status for e in await store.tool_log("s-1")] == ["finished"]
    (entry,) = await store.audit("acme")
    assert (entry.seq, entry.kind, entry.outcome) == (1, "call", "ok")

    # A second result is not recorded, and neither is its entry.
    assert not await store.log_finished("s-1", "c-1", {"ok": False}, audit=call("acme"))
    assert await store.audit("acme") == [entry]
    with pytest.raises(StoreError, match="log_started"):
        await store.log_finished("s-1", "c-9", {"ok": True}, audit=call("acme"))
    assert await store.audit("acme") == [entry]


async def test_a_save_appends_its_audit_entries_in_its_own_transaction(
    store: SessionStore,
) -> None:
    first = await store.append_audit(call("acme"))
    saved = await store.save(
        SessionRecord(
            id="s-1", org_id="acme", data={"n": 1}, audit=[decision("acme"), decision("globex")]
        )
    )
    assert saved.audit == []  # the saved copy holds none: saving it again appends nothing
    acme = await store.audit("acme")
    assert [(e.seq, e.kind) for e in acme] == [(1, "call"), (2, "decision")]
    assert acme[1].prev_hash == first.hash and verify(acme) == []
    assert [e.seq for e in await store.audit("globex")] == [1]

    # A save that loses its compare-and-swap appends nothing.
    stale = SessionRecord(id="s-1", org_id="acme", data={"n": 2}, audit=[decision("acme")])
    with pytest.raises(ConflictError):
        await store.save(stale)
    assert await store.audit("acme") == acme
    # Nor does one whose entry JSON cannot carry; the session is left as it was.
    bad = SessionRecord(
        id="s-1", org_id="acme", version=1, data={"n": 3},
        audit=[decision("acme", amended_after={"amount": float("nan")})],
    )  # fmt: skip
    with pytest.raises(StoreError):
        await store.save(bad)
    loaded = await store.load("s-1")
    assert loaded is not None and (loaded.version, loaded.data) == (1, {"n": 1})
    assert await store.audit("acme") == acme
