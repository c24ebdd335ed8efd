"""The audit trail in every store: numbered and chained per organisation under the store's
key, never forked, paged and filtered, kept when sessions go; and what `verify` finds when the
table is written behind the store's back (a deleted tail, an entry edited and the chain
recomputed, a forged entry appended, rows from before keys)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from handrail import AuditEntry, ConflictError, SessionRecord, StoreError
from handrail.audit import GENESIS, AuditAnchor, AuditKey, chain, entry_hash, verify
from handrail.store import MemoryStore, SessionStore, SqliteStore

from .conftest import PG_DSN, StoreFactory

K1 = AuditKey("k1", b"1" * 32)
K2 = AuditKey("k2", b"2" * 32)
MALLORY = AuditKey("k1", b"m" * 32)  # an intruder's guess at k1
COLUMNS = "org_id, seq, kind, session_id, tool, hash, entry, who"
"""The audit table's columns, as a row is written behind the store's back."""


@pytest.fixture(autouse=True)
def no_key_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The stores here are keyed only by what a test gives them."""
    monkeypatch.delenv("HANDRAIL_AUDIT_KEY", raising=False)
    yield


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


class Table:
    """A store's audit table, written behind the store's back: by an intruder who can write
    the database (not the key), or by a handrail from before keys."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store

    async def put(self, entry: AuditEntry) -> None:
        """Write `entry` as the row of its (org, seq), replacing what is there."""
        org, text = entry.org_id or "", json.dumps(entry.to_json())
        row = (
            org,
            entry.seq,
            entry.kind,
            entry.session_id,
            entry.tool,
            entry.hash,
            text,
            entry.who,
        )
        if isinstance(self.store, MemoryStore):
            from handrail.store.memory import _Audited

            trail = self.store._audit.setdefault(org, [])
            trail[:] = [r for r in trail if r.seq != entry.seq]
            trail.append(_Audited(*row[1:]))
            trail.sort(key=lambda r: r.seq)
        elif isinstance(self.store, SqliteStore):
            with sqlite3.connect(self.store.path) as db:
                db.execute(
                    f"INSERT OR REPLACE INTO handrail_audit ({COLUMNS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    row,
                )
        else:
            await self._postgres(
                f'INSERT INTO "{{s}}".handrail_audit ({COLUMNS}) '
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (org_id, seq) DO UPDATE SET hash = excluded.hash, "
                "entry = excluded.entry, who = excluded.who",
                row,
            )

    async def delete_after(self, org: str, seq: int) -> None:
        """Delete the organisation's entries after `seq`."""
        if isinstance(self.store, MemoryStore):
            self.store._audit[org] = [r for r in self.store._audit[org] if r.seq <= seq]
        elif isinstance(self.store, SqliteStore):
            with sqlite3.connect(self.store.path) as db:
                db.execute("DELETE FROM handrail_audit WHERE org_id = ? AND seq > ?", (org, seq))
        else:
            await self._postgres(
                'DELETE FROM "{s}".handrail_audit WHERE org_id = %s AND seq > %s', (org, seq)
            )

    async def _postgres(self, sql: str, params: tuple[object, ...]) -> None:
        import psycopg

        schema = self.store.schema  # type: ignore[attr-defined]
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as db:
            await db.execute(sql.format(s=schema), params)  # type: ignore[arg-type]


async def keyed_trail(
    make_store: StoreFactory, n: int = 5
) -> tuple[SessionStore, list[AuditEntry]]:
    store = await make_store(audit_key=K1)
    for _ in range(n):
        await store.append_audit(call("acme"))
    return store, await store.audit("acme")


async def test_entries_are_hashed_under_the_store_key_which_is_stored_nowhere(
    make_store: StoreFactory,
) -> None:
    store, entries = await keyed_trail(make_store, 3)
    assert [e.key_id for e in entries] == ["k1"] * 3
    assert entries[0].hash == entry_hash(entries[0], K1.secret)
    assert verify(entries, keys=[K1]) == []
    assert all(K1.secret.decode() not in json.dumps(e.to_json()) for e in entries)
    if isinstance(store, SqliteStore):
        await store.close()
        assert K1.secret not in Path(store.path).read_bytes()  # noqa: ASYNC240
    # A save's entries, and a result's, are keyed too.
    other = await make_store(audit_key=K1)
    await other.save(SessionRecord(id="s-1", org_id="acme", audit=[decision("acme")]))
    await other.log_started("s-1", "c-1", key="k", tool="orders.refund", args={})
    await other.log_finished("s-1", "c-1", {"ok": True}, audit=call("acme"))
    trail = await other.audit("acme")
    assert [e.key_id for e in trail] == ["k1"] * 5
    assert verify(trail, keys=[K1]) == []


async def test_a_deleted_tail_is_found_with_the_anchor(make_store: StoreFactory) -> None:
    store, entries = await keyed_trail(make_store)
    anchor = AuditAnchor.of(entries[-1])
    await Table(store).delete_after("acme", 3)
    left = await store.audit("acme")
    assert verify(left, keys=[K1]) == []  # the trail alone cannot show it
    (problem,) = verify(left, keys=[K1], anchor=anchor)
    assert (problem.seq, problem.kind) == (5, "truncated")


@pytest.mark.parametrize("rechain", [None, MALLORY], ids=["sha256", "guessed-key"])
async def test_an_entry_edited_with_every_later_hash_recomputed_is_found(
    make_store: StoreFactory, rechain: AuditKey | None
) -> None:
    store, entries = await keyed_trail(make_store)
    anchor = AuditAnchor.of(entries[-1])
    prev = entries[1].hash
    for entry in entries[2:]:  # entry 3 edited, 3 to 5 chained again without the key
        if entry.seq == 3:
            entry.outcome = "error: declined"
        chain(entry, seq=entry.seq, prev_hash=prev, key=rechain)
        entry.key_id = "k1"
        entry.hash = entry_hash(entry, None if rechain is None else rechain.secret)
        prev = entry.hash
        await Table(store).put(entry)
    stored = await store.audit("acme")
    assert stored[2].outcome == "error: declined"
    assert [e.prev_hash for e in stored[1:]] == [e.hash for e in stored[:-1]]  # it chains
    (problem,) = verify(stored, keys=[K1])
    assert (problem.seq, problem.kind) == (3, "edited")
    assert [p.kind for p in verify(stored, keys=[K1], anchor=anchor)] == ["edited", "rewritten"]


async def test_a_forged_entry_appended_in_chain_is_found(make_store: StoreFactory) -> None:
    store, entries = await keyed_trail(make_store, 3)
    forged = chain(call("acme"), seq=4, prev_hash=entries[-1].hash, key=MALLORY)
    await Table(store).put(forged)
    stored = await store.audit("acme")
    assert stored[-1] == forged
    (problem,) = verify(stored, keys=[K1])
    assert (problem.seq, problem.kind) == (4, "edited")
    # Unkeyed, it is a downgrade; and the store chains on from it, so a later entry is no
    # proof of what came before it: verify names the forged one.
    await Table(store).put(chain(call("acme"), seq=4, prev_hash=entries[-1].hash))
    await store.append_audit(call("acme"))
    problems = verify(await store.audit("acme"), keys=[K1])
    assert [(p.seq, p.kind) for p in problems] == [(4, "downgraded")]


async def test_the_wrong_key_fails_and_rotation_keeps_both_keys(make_store: StoreFactory) -> None:
    old = await make_store(audit_key=K1)
    for _ in range(2):
        await old.append_audit(call("acme"))
    new = await make_store(audit_key=K2)  # rotated: the same trail, a new key
    if isinstance(new, MemoryStore):  # one store in memory: rotated in place
        new.audit_key = K2
    for _ in range(2):
        await new.append_audit(call("acme"))
    trail = await new.audit("acme")
    assert [e.key_id for e in trail] == ["k1", "k1", "k2", "k2"]
    assert verify(trail, keys=[K1, K2]) == []
    assert [(p.seq, p.kind) for p in verify(trail, keys=[K2])] == [(1, "unknown_key")]
    wrong = verify(trail, keys=[MALLORY, K2])
    assert [(p.seq, p.kind) for p in wrong] == [(1, "edited")]
    assert wrong[0].message.startswith("entries 1 to 2 do not authenticate under key 'k1'")


async def test_rows_from_before_keys_still_read_and_the_keyed_chain_goes_on(
    make_store: StoreFactory,
) -> None:
    from tests.test_audit import legacy

    store = await make_store(audit_key=K1)
    assert await store.audit("acme") == []  # (the table made)
    old = legacy()
    for entry in old:
        await Table(store).put(entry)
    assert await store.audit("acme") == old  # read as written, with no key id
    appended = await store.append_audit(call("acme"))
    assert (appended.seq, appended.prev_hash, appended.key_id) == (3, old[-1].hash, "k1")
    trail = await store.audit("acme")
    assert [(p.seq, p.kind) for p in verify(trail)] == [(3, "unknown_key")]  # no keyring
    (note,) = verify(trail, keys=[K1])
    assert (note.seq, note.kind, note.severity) == (1, "unkeyed", "warning")


async def test_a_store_unkeyed_for_want_of_a_key_says_so_once(
    make_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    store = await make_store()  # HANDRAIL_AUDIT_KEY is not set
    assert store.audit_key is None  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, logger="handrail.audit"):
        await store.append_audit(call("acme"))
        await store.save(SessionRecord(id="s-1", org_id="acme", audit=[decision("acme")]))
    (record,) = caplog.records
    assert "chains the audit trail WITHOUT A KEY" in record.getMessage()
    assert [e.key_id for e in await store.audit("acme")] == [None, None]


# -- the migration to schema 6: who decided, a column with an index ---------------------------


def old_trail() -> list[tuple[str, AuditEntry | str]]:
    """Rows of an audit table as a schema-5 handrail wrote them: (org, entry), chained under
    K1; and an entry edited outside handrail until it is no JSON (org `broken`)."""
    rows: list[tuple[str, AuditEntry | str]] = []
    tail: dict[str, AuditEntry] = {}
    for entry in (
        decision("acme", session="s-1"),  # ana, acme 1
        call("acme", session="s-1"),  # acme 2 (who: None)
        AuditEntry(org_id="acme", at=3.0, kind="call", session_id="s-2", tool="orders.refund",
                   tool_call_id="call_2", who="ana", outcome="ok"),  # acme 3: ana's session ran it
        AuditEntry(org_id="acme", at=4.0, kind="decision", session_id="s-2",
                   tool="orders.refund", tool_call_id="call_2", who="bo", decision="reject"),
        decision("acme", session="s-3"),  # ana, acme 5
        decision("globex", session="s-9"),  # ana of another organisation
    ):  # fmt: skip
        org = entry.org_id or ""
        before = tail.get(org)
        chain(entry, seq=(before.seq if before else 0) + 1,
              prev_hash=before.hash if before else GENESIS, key=K1)  # fmt: skip
        tail[org] = entry
        rows.append((org, entry))
    rows.append(("broken", "{not json"))
    return rows


def old_row(org: str, entry: AuditEntry | str) -> tuple[object, ...]:
    """The row schema 5 inserted (seven columns, no `who`)."""
    if isinstance(entry, str):
        return (org, 1, "decision", "s-x", "orders.refund", "0" * 64, entry)
    text = json.dumps(entry.to_json(), ensure_ascii=False)
    return (org, entry.seq, entry.kind, entry.session_id, entry.tool, entry.hash, text)


async def migrated_as_before(store: SessionStore) -> None:
    """What a store opened on the old rows reads: each person's decisions, off the index."""
    entries = [e for _, e in old_trail() if isinstance(e, AuditEntry)]
    acme = await store.audit("acme")
    assert acme == entries[:5]  # the entries unchanged: the chain holds under the key
    assert verify(acme, keys=[K1]) == []
    anas = await store.audit("acme", who="ana", kind="decision", newest_first=True)
    assert [(e.seq, e.session_id) for e in anas] == [(5, "s-3"), (1, "s-1")]
    assert [e.seq for e in await store.audit("acme", who="ana")] == [1, 3, 5]
    assert [e.seq for e in await store.audit("acme", who="bo")] == [4]
    assert [e.org_id for e in await store.audit("globex", who="ana")] == ["globex"]
    assert await store.audit("broken", who="ana") == []  # its `who` unknown, migrated anyway
    # the chain goes on, and the next decision is found by who made it
    later = await store.append_audit(decision("acme", session="s-4"))
    assert later.seq == 6 and later.prev_hash == entries[4].hash
    assert (await store.audit("acme", who="ana", kind="decision", newest_first=True))[0] == later


async def test_an_sqlite_trail_of_schema_5_gets_its_who_column_and_index(tmp_path: Path) -> None:
    from handrail.store._sql import audit_query
    from handrail.store.sqlite import _DIALECT, MIGRATIONS

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE handrail_schema_version (version INTEGER PRIMARY KEY, applied_at REAL)"
    )
    for version in range(1, 6):  # the schema as handrail left it at version 5
        for statement in MIGRATIONS[version]:
            db.execute(statement)
        db.execute("INSERT INTO handrail_schema_version VALUES (?, 0)", (version,))
    db.executemany(
        "INSERT INTO handrail_audit VALUES (?, ?, ?, ?, ?, ?, ?)",
        [old_row(org, entry) for org, entry in old_trail()],
    )
    db.commit()
    db.close()
    async with SqliteStore(path, audit_key=K1) as store:
        await migrated_as_before(store)
    query = audit_query(_DIALECT, "acme", after=0, limit=20, session_id=None, tool=None,
                        kind="decision", who="ana", before=None, newest_first=True)  # fmt: skip
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute(f"EXPLAIN QUERY PLAN {query.sql}", query.params).fetchall()
    plan = " ".join(row[-1] for row in rows)
    # one person's decisions off the index, in its order: neither the trail nor a sort
    assert "USING INDEX handrail_audit_who" in plan and "TEMP B-TREE" not in plan, plan


@pytest.mark.postgres
async def test_a_postgres_trail_of_schema_5_gets_its_who_column_and_index() -> None:
    from .conftest import skip_without_postgres

    skip_without_postgres()
    import secrets

    import psycopg

    from handrail.store import PostgresStore
    from handrail.store._sql import audit_query
    from handrail.store.postgres import MIGRATIONS

    schema = f"handrail_old_{secrets.token_hex(4)}"
    s = f'"{schema}"'
    async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
        await connection.execute(f"CREATE SCHEMA {s}")
        await connection.execute(
            f"CREATE TABLE {s}.handrail_schema_version (version integer PRIMARY KEY, "
            "applied_at double precision NOT NULL)"
        )
        for version in range(1, 6):
            for statement in MIGRATIONS[version]:
                await connection.execute(statement.format(s=s))
            await connection.execute(
                f"INSERT INTO {s}.handrail_schema_version VALUES (%s, 0)", (version,)
            )
        for org, entry in old_trail():
            await connection.execute(
                f"INSERT INTO {s}.handrail_audit VALUES (%s, %s, %s, %s, %s, %s, %s)",
                old_row(org, entry),
            )
    try:
        store = await PostgresStore.connect(PG_DSN, schema=schema, audit_key=K1)
        try:
            await migrated_as_before(store)
            query = audit_query(store._dialect, "acme", after=0, limit=20, session_id=None,  # type: ignore[attr-defined]
                                tool=None, kind="decision", who="ana", before=None,
                                newest_first=True)  # fmt: skip
        finally:
            await store.close()
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
            await connection.execute("SET enable_seqscan = off")  # a tiny table: scanned else
            cursor = await connection.execute(f"EXPLAIN {query.sql}", query.params)
            plan = " ".join(row[0] for row in await cursor.fetchall())
        assert "handrail_audit_who" in plan and "Sort" not in plan, plan
    finally:
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
            await connection.execute(f"DROP SCHEMA {s} CASCADE")
