"""The audit trail: the chain and `verify`; what the engine records, and what it does not."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

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
from handrail.audit import (
    GENESIS,
    AuditAnchor,
    AuditKey,
    AuditVerifier,
    chain,
    entry_hash,
    keyring_from_env,
    verify,
)
from handrail.exceptions import ConfigError
from handrail.store import MemoryStore
from handrail.suspension import args_digest
from handrail.testing import ScriptedModel, call, sequential_ids

K1 = AuditKey("k1", b"1" * 32)
K2 = AuditKey("k2", b"2" * 32)
MALLORY = AuditKey("k1", b"m" * 32)  # an intruder's guess at k1: the id, not the secret
RING = {"k1": K1.secret, "k2": K2.secret}


def trail(
    n: int, key: AuditKey | None = None, after: list[AuditEntry] | None = None
) -> list[AuditEntry]:
    """`n` entries chained (after `after`, if given) under `key` (None: unkeyed)."""
    entries = list(after or [])
    for seq in range(len(entries) + 1, len(entries) + n + 1):
        entry = AuditEntry(org_id="acme", at=float(seq), session_id="s", tool="t", outcome="ok")
        prev = entries[-1].hash if entries else GENESIS
        entries.append(chain(entry, seq=seq, prev_hash=prev, key=key))
    return entries


def rechained(entries: list[AuditEntry], start: int, key: AuditKey | None) -> list[AuditEntry]:
    """The trail with every entry from position `start` on chained again under `key`: what
    an intruder who edits an entry does to the entries after it."""
    out = [dataclasses.replace(e) for e in entries]
    for i in range(start, len(out)):
        keep = out[i].key_id
        chain(out[i], seq=out[i].seq, prev_hash=out[i - 1].hash if i else GENESIS, key=key)
        if key is None and keep is not None:
            out[i].key_id = keep  # keeps claiming the key it cannot use
            out[i].hash = entry_hash(out[i])
    return out


def kinds(problems: list[Any]) -> list[tuple[int, str]]:
    return [(p.seq, p.kind) for p in problems]


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


def test_the_card_a_decision_was_on_is_hashed_with_it() -> None:
    entry = AuditEntry(org_id="acme", session_id="s", tool="t", decision="reject", card="recovery")
    entries = [chain(entry, seq=1, prev_hash=GENESIS)]
    assert verify(entries) == []
    assert AuditEntry.from_json(entries[0].to_json()) == entries[0]
    entries[0].card = "approval"  # a skipped retry passed off as a rejection
    assert kinds(verify(entries)) == [(1, "edited")]


# Two entries as handrail wrote them before keys (no key_id): stores hold such rows.
LEGACY = [
    '{"org_id": "acme", "seq": 1, "at": 1700000001.0, "kind": "decision", "session_id": "s-1", '
    '"tool": "orders.refund", "tool_call_id": "call_1", "who": "ana", "via": null, "decision": '
    '"approve", "reason": null, "amended_before": {"amount": 84.0}, "amended_after": {"amount": '
    '40.0}, "args_digest": "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd", '
    '"outcome": null, "latency_ms": null, "prev_hash": '
    '"0000000000000000000000000000000000000000000000000000000000000000", "hash": '
    '"1043b8adcfe86c91478727b18b775b74e0e494627f1c8608eed590935cf82774"}',
    '{"org_id": "acme", "seq": 2, "at": 1700000002.0, "kind": "call", "session_id": "s-1", '
    '"tool": "orders.refund", "tool_call_id": "call_1", "who": "ana", "via": null, "decision": '
    'null, "reason": null, "amended_before": null, "amended_after": null, "args_digest": '
    '"dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd", "outcome": "ok", '
    '"latency_ms": 3.5, "prev_hash": '
    '"1043b8adcfe86c91478727b18b775b74e0e494627f1c8608eed590935cf82774", "hash": '
    '"9a4b387346d22f5b968d2a30f5a1167a3620929639a50f5e5fa42144af06886c"}',
]


def legacy() -> list[AuditEntry]:
    return [AuditEntry.from_json(json.loads(line)) for line in LEGACY]


def test_a_keyed_trail_verifies_under_its_key_and_records_the_key_id() -> None:
    entries = trail(4, K1)
    assert [e.key_id for e in entries] == ["k1"] * 4
    assert verify(entries, keys=RING) == []
    assert verify(entries, keys=[K1]) == []  # AuditKeys, or id -> secret
    assert entries[0].hash == entry_hash(entries[0], K1.secret) != entry_hash(entries[0])


def test_a_keyed_trail_cannot_be_verified_without_its_key() -> None:
    (problem,) = verify(trail(3, K1))
    assert (problem.seq, problem.kind, problem.severity) == (1, "unknown_key", "error")
    assert "entries 1 to 3 were made with key 'k1'" in problem.message
    (missing,) = verify(trail(3, K1), keys=[K2])
    assert "it is not in the keyring" in missing.message


def test_the_wrong_key_fails_every_entry_in_one_problem() -> None:
    (problem,) = verify(trail(5, K1), keys=[MALLORY])
    assert (problem.seq, problem.kind) == (1, "edited")
    assert problem.message.startswith("entries 1 to 5 do not authenticate under key 'k1'")
    assert "is not the one the trail was written with" in problem.message


@pytest.mark.parametrize("rechain", [None, MALLORY], ids=["sha256", "guessed-key"])
def test_an_entry_edited_and_every_later_hash_recomputed_fails_without_the_key(
    rechain: AuditKey | None,
) -> None:
    entries = trail(6, K1)
    entries[2].outcome = "error: declined"  # entry 3
    forged = rechained(entries, 2, rechain)
    assert [e.key_id for e in forged] == ["k1"] * 6  # the chain itself holds...
    assert [e.prev_hash for e in forged[1:]] == [e.hash for e in forged[:-1]]
    (problem,) = verify(forged, keys=RING)  # ...but not under the key
    assert (problem.seq, problem.kind) == (3, "edited")
    assert problem.message.startswith("entries 3 to 6 do not authenticate under key 'k1'")


def test_an_edited_and_rechained_trail_does_not_match_its_anchor() -> None:
    entries = trail(6, K1)
    anchor = AuditAnchor.of(entries[-1])
    entries[2].outcome = "error: declined"
    problems = verify(rechained(entries, 2, None), keys=RING, anchor=anchor)
    assert kinds(problems) == [(3, "edited"), (6, "rewritten")]
    assert "entry 6 is not the anchored one" in problems[1].message


def test_a_forged_entry_appended_in_chain_fails_without_the_key() -> None:
    entries = trail(4, K1)
    for key in (None, MALLORY):
        forged = trail(1, key, after=entries)
        if key is None:
            forged[-1].key_id = "k1"
            forged[-1].hash = entry_hash(forged[-1])
        assert forged[-1].prev_hash == entries[-1].hash
        (problem,) = verify(forged, keys=RING)
        assert (problem.seq, problem.kind) == (5, "edited")
        assert problem.message.startswith("entry 5 does not authenticate under key 'k1'")


def test_unkeyed_entries_after_keyed_ones_are_a_downgrade() -> None:
    entries = trail(3, K1)
    appended = trail(2, None, after=entries)  # forged, or written by a store without its key
    (problem,) = verify(appended, keys=RING)
    assert (problem.seq, problem.kind, problem.severity) == (4, "downgraded", "error")
    assert problem.message.startswith("entries 4 to 5 are unkeyed, after keyed entries")
    stripped = rechained(entries, 0, None)  # the whole trail rechained unkeyed: no key_id
    for entry in stripped:
        entry.key_id = None
    stripped = rechained(stripped, 0, None)
    (unkeyed,) = verify(stripped, keys=RING)  # an unkeyed trail proves nothing...
    assert (unkeyed.kind, unkeyed.severity) == ("unkeyed", "warning")
    (cut,) = verify(stripped, keys=RING, anchor=AuditAnchor.of(entries[-1]))[1:]
    assert cut.kind == "rewritten"  # ...but the anchor taken earlier finds it


def test_deleting_the_last_entries_is_found_with_an_anchor() -> None:
    entries = trail(6, K1)
    anchor = AuditAnchor.of(entries[-1])
    assert verify(entries[:4], keys=RING) == []  # nothing in the trail shows it
    (problem,) = verify(entries[:4], keys=RING, anchor=anchor)
    assert (problem.seq, problem.kind) == (6, "truncated")
    assert problem.message == (
        "the trail ends at entry 4 but the anchor is entry 6: entries 5 to 6 (at least) were "
        "deleted"
    )
    (gone,) = verify([*entries[:2], *entries[3:]], keys=RING, anchor=AuditAnchor.of(entries[2]))[1:]
    assert (gone.seq, gone.kind, gone.message) == (
        3, "truncated", "the anchor's entry 3 is missing (deleted)"
    )  # fmt: skip
    assert verify(entries, keys=RING, anchor=AuditAnchor.of(entries[3])) == []
    assert verify([], anchor=AuditAnchor.of(None)) == []
    assert kinds(verify([], anchor=AuditAnchor(0, "f" * 64))) == [(0, "rewritten")]


def test_rotation_new_entries_under_the_new_key_old_ones_under_the_kept_one() -> None:
    entries = trail(3, K2, after=trail(3, K1))
    assert [e.key_id for e in entries] == ["k1"] * 3 + ["k2"] * 3
    assert verify(entries, keys=[K1, K2]) == []
    (problem,) = verify(entries, keys=[K2])  # the old key dropped from the keyring
    assert (problem.seq, problem.kind) == (1, "unknown_key")
    assert "entries 1 to 3 were made with key 'k1'" in problem.message


def test_entries_written_before_keys_still_read_and_verify_as_unkeyed() -> None:
    old = legacy()
    assert [e.key_id for e in old] == [None, None]
    assert old[1].prev_hash == old[0].hash
    assert verify(old) == []  # without a keyring: the chain, as before
    assert AuditEntry.from_json(old[0].to_json()) == old[0]
    entries = trail(2, K1, after=old)  # the store got its key: the chain goes on, keyed
    (note,) = verify(entries, keys=RING)
    assert (note.seq, note.kind, note.severity) == (1, "unkeyed", "warning")
    assert note.message.startswith("entries 1 to 2 are unkeyed")
    # An old entry edited, the old ones rechained: the first keyed entry no longer chains.
    old[0].reason = "nothing to see"
    problems = verify(trail(0, None, after=rechained(old, 0, None)) + entries[2:], keys=RING)
    assert kinds(problems) == [(1, "unkeyed"), (3, "relinked")]


def test_verify_a_page_at_a_time_finds_what_verify_finds() -> None:
    entries = trail(3, K2, after=trail(4, K1))
    entries[5].outcome = "error: declined"
    verifier = AuditVerifier(keys=[K1, K2], anchor=AuditAnchor(9, "a" * 64))
    for start in range(0, 7, 2):
        verifier.feed(entries[start : start + 2])
    assert verifier.problems() == verify(entries, keys=[K1, K2], anchor=AuditAnchor(9, "a" * 64))
    assert (verifier.count, verifier.keyed, verifier.last) == (7, 7, AuditAnchor.of(entries[-1]))


def test_audit_keys_refuse_weak_or_malformed_settings() -> None:
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        AuditKey("k1", b"short")
    with pytest.raises(ConfigError, match="letters, digits"):
        AuditKey("k 1", b"1" * 32)
    with pytest.raises(ConfigError, match="ID:SECRET"):
        AuditKey.parse("no-secret")
    with pytest.raises(ConfigError, match=r"HANDRAIL_AUDIT_KEY: .*at least 32 bytes") as caught:
        keyring_from_env({"HANDRAIL_AUDIT_KEY": "k1:tooshort-secret"})
    assert "tooshort" not in str(caught.value)  # never the secret
    with pytest.raises(ConfigError, match="different secrets"):
        keyring_from_env(
            {"HANDRAIL_AUDIT_KEY": "k1:" + "a" * 32, "HANDRAIL_AUDIT_OLD_KEYS": "k1:" + "b" * 32}
        )
    ring = keyring_from_env(
        {"HANDRAIL_AUDIT_KEY": "k2:" + "2" * 32, "HANDRAIL_AUDIT_OLD_KEYS": f" k1:{'1' * 32} "}
    )
    assert ring == RING
    assert keyring_from_env({}) == {}
    made = AuditKey.generate("2026-11")
    assert AuditKey.parse(made.spec()) == made and len(made.secret) == 64
    assert made.secret.decode() not in repr(made)


@given(
    st.integers(min_value=0, max_value=10**12),
    st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
)
def test_an_anchor_reads_back_from_its_text(seq: int, digest: str) -> None:
    anchor = AuditAnchor(seq, digest)
    assert AuditAnchor.parse(str(anchor)) == anchor


@given(st.text(max_size=80))
def test_an_anchor_is_seq_and_hash_or_refused(text: str) -> None:
    try:
        anchor = AuditAnchor.parse(text)
    except ValueError as error:
        assert "SEQ:HASH" in str(error)
    else:
        assert AuditAnchor.parse(str(anchor)) == anchor
        assert str(anchor).endswith(text.strip()[-64:])


async def test_a_store_without_a_key_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("HANDRAIL_AUDIT_KEY", raising=False)
    store = MemoryStore()
    with caplog.at_level(logging.WARNING, logger="handrail.audit"):
        await store.append_audit(AuditEntry(org_id="acme"))
        await store.append_audit(AuditEntry(org_id="acme"))
    (record,) = caplog.records
    assert "WITHOUT A KEY" in record.getMessage()
    assert (await store.audit("acme"))[0].key_id is None

    monkeypatch.setenv("HANDRAIL_AUDIT_KEY", K1.spec())
    keyed = MemoryStore()  # the key from the environment, by default
    assert (await keyed.append_audit(AuditEntry(org_id="acme"))).key_id == "k1"
    chosen = MemoryStore(audit_key=None)  # None: unkeyed, deliberately, whatever is set
    with caplog.at_level(logging.WARNING, logger="handrail.audit"):
        assert (await chosen.append_audit(AuditEntry(org_id="acme"))).key_id is None
    assert len(caplog.records) == 1  # a choice in the code: no warning
    monkeypatch.setenv("HANDRAIL_AUDIT_KEY", "k1")
    with pytest.raises(ConfigError, match="HANDRAIL_AUDIT_KEY is ID:SECRET"):
        MemoryStore()


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
    assert decided.card == "approval"  # what the decision was on: what an `approve` meant
    assert decided.args_digest == args_digest("orders.refund", {"order_id": "A1", "amount": 40.0})
    await engine.resume("s-1", **scope).finish()
    _, ran = await store.audit("acme")
    assert (ran.kind, ran.outcome, ran.args_digest, ran.card) == (
        "call", "ok", decided.args_digest, None,
    )  # fmt: skip
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

    async def counting(record: SessionRecord, **grouped: Any) -> SessionRecord:
        saves.append(len(record.audit))
        return await original(record, **grouped)

    store.save = counting  # type: ignore[method-assign]
    await engine.resolve("s-1", call_id, Reject(by="ana"), org_id="acme")
    assert saves == [1]  # one write: the decision with its entry
    (entry,) = await store.audit("acme")
    assert (entry.tool_call_id, entry.decision, entry.who) == (call_id, "reject", "ana")


@given(st.text(st.characters(exclude_categories=()), max_size=120))
@example("k1:" + "\udcff" * 32)  # a variable that is not UTF-8, as os.environ gives it
def test_an_audit_key_spec_is_id_and_secret_or_refused(text: str) -> None:
    try:
        key = AuditKey.parse(text)
    except ConfigError as error:
        secret = text.partition(":")[2].strip()
        assert len(secret) < 8 or secret not in str(error)  # the message never shows it
    else:
        assert AuditKey.parse(key.spec()) == key
        assert key.spec() == text.strip()
