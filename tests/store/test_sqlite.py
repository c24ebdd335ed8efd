"""What is particular to `SqliteStore`: the file, WAL, the thread, locks, corrupt rows."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handrail import AuditEntry, ConflictError, SessionRecord, StoreError
from handrail.store import SqliteStore
from handrail.store import sqlite as sqlite_store
from handrail.store._base import lease_and_load
from handrail.store.sqlite import MIGRATIONS, SCHEMA_VERSION

from .conftest import Clock


def raw(path: Path) -> contextlib.closing[sqlite3.Connection]:
    """A connection of the test's own, like another process's; closed after the `with`."""
    return contextlib.closing(sqlite3.connect(path, isolation_level=None))


async def test_the_default_file_is_handrail_db_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with SqliteStore() as store:
        assert not (tmp_path / "handrail.db").exists()  # created on first use
        await store.save(SessionRecord(id="s-1"))
    assert (tmp_path / "handrail.db").exists()


@pytest.mark.parametrize(("synchronous", "level"), [("FULL", 2), ("NORMAL", 1)])
async def test_the_file_is_in_wal_mode_with_the_chosen_sync(
    tmp_path: Path, synchronous: Any, level: int
) -> None:
    async with SqliteStore(tmp_path / "s.db", synchronous=synchronous) as store:
        await store.save(SessionRecord(id="s-1"))
        assert (
            await store._call(lambda db: db.execute("PRAGMA synchronous").fetchone()[0], None)
            == level
        )
    with raw(tmp_path / "s.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_synchronous_is_full_or_normal(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        SqliteStore(tmp_path / "s.db", synchronous="OFF")  # type: ignore[arg-type]


async def test_sessions_and_logs_survive_a_reopen(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        saved = await store.save(SessionRecord(id="s-1", org_id="acme", data={"n": [1, 2]}))
        await store.log_started("s-1", "c-1", key="k", tool="t", args={"a": 1})
        log = await store.tool_log("s-1")
    async with SqliteStore(tmp_path / "s.db") as store:
        assert await store.load("s-1") == saved
        assert await store.tool_log("s-1") == log


async def test_all_sqlite_work_happens_on_the_stores_thread_not_the_loops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: set[int] = set()
    connect = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        threads.add(threading.get_ident())
        connection = connect(*args, **kwargs)
        connection.set_trace_callback(lambda _: threads.add(threading.get_ident()))
        return connection

    monkeypatch.setattr(sqlite3, "connect", traced)
    async with SqliteStore(tmp_path / "s.db") as store:
        saved = await store.save(SessionRecord(id="s-1", data={"n": 1}))
        await store.save(saved)
        await store.load("s-1")
        await store.list(org_id="x")
        await store.due(0)
        await store.log_started("s-1", "c-1", key="k", tool="t", args={})
        await store.log_finished("s-1", "c-1", {})
        await store.import_(await store.export("s-1"), overwrite=True)
        await store.acquire_lease("s-1", "w", 1)
        await store.release_lease("s-1", "w")
        async with store.listen() as wakeups:
            await store.notify("s-1")
            assert await anext(wakeups) == "s-1"
        await store.delete("s-1")
        assert threads == {store.thread_ident}
    assert threading.get_ident() not in threads


async def test_the_loop_keeps_running_while_a_save_waits_for_another_writer(
    tmp_path: Path,
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        await store.save(SessionRecord(id="warm-up"))
        other = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
            save = asyncio.create_task(store.save(SessionRecord(id="s-1")))
            started = time.perf_counter()
            for _ in range(20):
                await asyncio.sleep(0.01)
            assert time.perf_counter() - started < 1.0  # the loop was never stuck
            assert not save.done()
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert (await save).version == 1


async def test_a_writer_holding_the_lock_past_busy_timeout_gives_a_store_error(
    tmp_path: Path,
) -> None:
    async with SqliteStore(tmp_path / "s.db", busy_timeout=0.1) as store:
        await store.save(SessionRecord(id="warm-up"))
        other = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreError, match=r"session 's-1'.*busy_timeout") as caught:
                await store.save(SessionRecord(id="s-1"))
            assert caught.value.session_id == "s-1"
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert (await store.save(SessionRecord(id="s-1"))).version == 1


@pytest.mark.parametrize(
    ("corruption", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON list, not an object"),
        (b"\xff\xfe", "not valid JSON"),  # a blob that is not even UTF-8
    ],
)
async def test_a_corrupt_row_raises_a_store_error_and_is_left_alone(
    tmp_path: Path, corruption: str | bytes, message: str
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        good = await store.save(SessionRecord(id="good", data={"n": 1}))
        await store.save(SessionRecord(id="bad", data={"n": 2}))
        with raw(tmp_path / "s.db") as db:
            db.execute("UPDATE handrail_sessions SET data = ? WHERE id = 'bad'", (corruption,))

        with pytest.raises(StoreError, match=rf"Session 'bad'.*{message}.*left as it is") as caught:
            await store.load("bad")
        assert caught.value.session_id == "bad"
        with pytest.raises(StoreError, match="Session 'bad'"):
            await store.export("bad")
        with pytest.raises(StoreError, match="Session 'bad'"):  # a turn's start: refused,
            await store.lease_and_load("bad", "w1", ttl=30)
        assert await store.acquire_lease("bad", "w2", ttl=30)  # and its lease not taken
        assert await store.load("good") == good
        assert [s.id for s in await store.list()] == ["bad", "good"]
        assert await store.delete("bad")  # the way out the message names
    with raw(tmp_path / "s.db") as db:
        assert db.execute("SELECT count(*) FROM handrail_sessions").fetchone()[0] == 1


async def test_a_corrupt_log_entry_raises_a_store_error_naming_the_session(
    tmp_path: Path,
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        await store.log_started("s-1", "c-1", key="k", tool="t", args={})
        with raw(tmp_path / "s.db") as db:
            db.execute("UPDATE handrail_tool_log SET args = 'oops'")
        with pytest.raises(StoreError, match=r"Session 's-1': the stored tool-call arguments"):
            await store.tool_log("s-1")


async def test_a_corrupt_event_row_is_passed_over_with_its_number(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        await store.append_events("s-1", [{"type": "a"}, {"type": "b"}, {"type": "c"}])
        with raw(tmp_path / "s.db") as db:
            db.execute("UPDATE handrail_events SET event = '{cut' WHERE seq = 2")
        with caplog.at_level("ERROR", logger="handrail.store"):
            page = await store.events("s-1")
        assert [seq for seq, _ in page] == [1, 2, 3]
        assert page[0][1] == {"type": "a"} and page[2][1] == {"type": "c"}
        unreadable = page[1][1]
        assert (unreadable["type"], unreadable["seq"]) == ("event-unreadable", 2)
        assert "Session 's-1': the stored event 2 is not valid JSON" in unreadable["error"]
        assert "restore it from a backup" in unreadable["error"]
        assert "event 2 is not valid JSON" in caplog.text
        assert await store.events("s-1", after=2) == [(3, {"type": "c"})]  # left as it is:
    with raw(tmp_path / "s.db") as db:
        assert db.execute("SELECT event FROM handrail_events WHERE seq = 2").fetchone() == ("{cut",)


async def test_the_schema_is_made_once_and_versioned(tmp_path: Path, clock: Clock) -> None:
    for _ in range(2):
        async with SqliteStore(tmp_path / "s.db", clock=clock) as store:
            await store.load("s-1")
    with raw(tmp_path / "s.db") as db:
        rows = db.execute("SELECT version, applied_at FROM handrail_schema_version").fetchall()
    assert rows == [(version, clock.now) for version in range(1, SCHEMA_VERSION + 1)]


async def test_a_version_1_database_is_migrated_and_keeps_its_sessions(
    tmp_path: Path, clock: Clock
) -> None:
    with raw(tmp_path / "s.db") as db:
        db.execute(
            "CREATE TABLE handrail_schema_version "
            "(version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
        )
        for statement in MIGRATIONS[1]:
            db.execute(statement)
        db.execute("INSERT INTO handrail_schema_version VALUES (1, 0)")
        db.execute(
            "INSERT INTO handrail_sessions "
            "VALUES ('s-1', NULL, NULL, 'active', 1, 0, 0, NULL, '{}')"
        )
    async with SqliteStore(tmp_path / "s.db", clock=clock) as store:
        assert (await store.load("s-1")) is not None
        assert await store.append_events("s-1", [{"type": "run-started"}]) == 1
        assert (await store.append_audit(AuditEntry(org_id="acme", session_id="s-1"))).seq == 1
    with raw(tmp_path / "s.db") as db:
        rows = db.execute("SELECT version, applied_at FROM handrail_schema_version").fetchall()
    assert rows == [(1, 0.0), *((v, clock.now) for v in range(2, SCHEMA_VERSION + 1))]


async def test_a_database_from_a_newer_handrail_is_refused_untouched(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        await store.save(SessionRecord(id="s-1"))
    with raw(tmp_path / "s.db") as db:
        db.execute("INSERT INTO handrail_schema_version VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    async with SqliteStore(tmp_path / "s.db") as store:
        newer = rf"schema version {SCHEMA_VERSION + 1}, newer .* upgrade handrail"
        with pytest.raises(StoreError, match=newer):
            await store.load("s-1")
    with raw(tmp_path / "s.db") as db:
        assert db.execute("SELECT count(*) FROM handrail_sessions").fetchone()[0] == 1


async def test_a_missing_directory_is_named_and_the_store_can_try_again(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "s.db"
    async with SqliteStore(path) as store:
        with pytest.raises(StoreError, match=r"missing/s\.db.*directory exists"):
            await store.load("s-1")
        path.parent.mkdir()
        assert await store.load("s-1") is None


async def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    (tmp_path / "s.db").write_bytes(b"this is not a database, it is a text file" * 100)
    async with SqliteStore(tmp_path / "s.db") as store:
        with pytest.raises(StoreError, match="not a SQLite database"):
            await store.load("s-1")


async def test_a_cancelled_call_leaves_the_store_usable(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        await store.save(SessionRecord(id="s-1"))
        load = asyncio.create_task(store.load("s-1"))
        await asyncio.sleep(0)
        load.cancel()
        with pytest.raises(asyncio.CancelledError):
            await load
        assert (await store.load("s-1")) is not None


async def test_closing_ends_the_stores_thread(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    await store.load("s-1")
    [thread] = [t for t in threading.enumerate() if t.ident == store.thread_ident]
    await store.close()
    thread.join(timeout=5)
    assert not thread.is_alive()


async def test_old_wakeups_are_pruned(tmp_path: Path, clock: Clock) -> None:
    async with SqliteStore(tmp_path / "s.db", clock=clock) as store:
        await store.notify("s-1")
        await store.notify("s-2")
        clock.advance(61)
        await store.notify("s-3")
    with raw(tmp_path / "s.db") as db:
        assert db.execute("SELECT session_id FROM handrail_wakeups").fetchall() == [("s-3",)]


async def test_an_in_memory_database_works_for_one_store() -> None:
    async with SqliteStore(":memory:") as store:
        saved = await store.save(SessionRecord(id="s-1", data={"n": 1}))
        assert await store.load("s-1") == saved


async def test_appends_made_at_once_are_numbered_per_session_in_the_order_made(
    tmp_path: Path,
) -> None:
    """Appends made while the store's thread is busy commit together; each session's events
    are still numbered from 1, without gaps, in the order its appends were made."""
    async with SqliteStore(tmp_path / "h.db") as store:
        appends = [store.append_events(f"s{i % 10}", [{"n": i}, {"n": i}]) for i in range(200)]
        lasts = await asyncio.gather(*appends)
        assert lasts == [2 * (i // 10 + 1) for i in range(200)]
        for k in range(10):
            logged = await store.events(f"s{k}", limit=1000)
            assert [seq for seq, _ in logged] == list(range(1, 41))
            assert [e["n"] for _, e in logged] == [n for n in range(k, 200, 10) for _ in "ab"]


async def test_an_append_that_fails_fails_alone(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    async with SqliteStore(path) as store:
        await store.append_events("good", [{"n": 0}])
        with raw(path) as db:
            db.execute(
                "CREATE TRIGGER refuse BEFORE INSERT ON handrail_events "
                "WHEN NEW.session_id = 'bad' BEGIN SELECT RAISE(ABORT, 'refused here'); END"
            )
        outcomes = await asyncio.gather(
            store.append_events("good", [{"n": 1}]),
            store.append_events("bad", [{"n": 1}]),
            store.append_events("good", [{"n": 2}]),
            return_exceptions=True,
        )
        assert outcomes[0] == 2 and outcomes[2] == 3
        assert isinstance(outcomes[1], StoreError)
        assert outcomes[1].session_id == "bad" and "refused here" in str(outcomes[1])
        assert [e["n"] for _, e in await store.events("good")] == [0, 1, 2]
        assert await store.events("bad") == []


async def test_closing_commits_the_appends_already_made(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    store = SqliteStore(path)
    appending = asyncio.ensure_future(store.append_events("s-1", [{"n": 1}]))
    await asyncio.sleep(0)  # the append is made; its commit has not run yet
    await store.close()
    assert await appending == 1
    async with SqliteStore(path) as reopened:
        assert await reopened.events("s-1") == [(1, {"n": 1})]


async def test_an_append_the_store_cannot_make_says_why(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "missing" / "h.db") as store:
        outcomes = await asyncio.gather(
            store.append_events("s-1", [{"n": 1}]),
            store.append_events("s-2", [{"n": 1}]),
            return_exceptions=True,
        )
    for outcome in outcomes:
        assert isinstance(outcome, StoreError)
        assert "unable to open" in str(outcome) and "directory exists" in str(outcome)


async def test_an_append_whose_caller_is_cancelled_is_logged_all_the_same(
    tmp_path: Path,
) -> None:
    async with SqliteStore(tmp_path / "h.db") as store:
        await store.append_events("s-1", [{"n": 1}])
        appending = asyncio.ensure_future(store.append_events("s-1", [{"n": 2}]))
        await asyncio.sleep(0)  # made, not committed yet
        appending.cancel()
        assert await store.append_events("s-1", [{"n": 3}]) == 3
        assert [e["n"] for _, e in await store.events("s-1")] == [1, 2, 3]


# -- group commit ------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def lock_held(path: Path) -> Any:
    """Another process holds the write lock while the block queues writes; they run (together,
    one transaction) once it lets go, at the end of the block."""
    with raw(path) as other:
        other.execute("BEGIN IMMEDIATE")
        try:
            yield
            await asyncio.sleep(0.05)  # every write of the block is queued behind the first
        finally:
            other.execute("ROLLBACK")


async def test_writes_that_wait_together_each_get_their_own_outcome(tmp_path: Path) -> None:
    """Writes queued while the store's thread was busy commit in one transaction; one that
    fails (a lost compare-and-swap, a save refused after its update ran, a result for an
    unknown call) is rolled back alone, and the others are committed."""
    path = tmp_path / "g.db"
    async with SqliteStore(path) as store:
        for session_id in ("s-a", "s-b", "s-c"):
            await store.save(SessionRecord(id=session_id, data={"v": 1}))
        async with lock_held(path):
            writes = asyncio.gather(
                store.save(SessionRecord(id="s-new", data={"v": 1})),
                store.save(SessionRecord(id="s-b", version=5, data={"v": "lost"})),
                # Refused after its UPDATE ran (a gap after the stored messages): undone.
                store.save(SessionRecord(id="s-c", version=1, data={"v": 2}, messages_from=3)),
                store.log_started("s-a", "c-1", key="k-1", tool="t", args={"a": 1}),
                store.log_finished("s-a", "c-unknown", {"ok": True}),
                store.acquire_lease("s-a", "w-1", 30.0),
                store.append_events("s-a", [{"n": 1}, {"n": 2}]),
                store.save(SessionRecord(id="s-a", version=1, data={"v": 2})),
                return_exceptions=True,
            )
        outcomes = await writes
    new, lost, gap, started, unknown, leased, appended, saved = outcomes
    assert isinstance(new, SessionRecord) and new.version == 1
    assert isinstance(lost, ConflictError) and (lost.expected, lost.actual) == (5, 1)
    assert isinstance(gap, ValueError) and "gap" in str(gap)
    assert started is True
    assert isinstance(unknown, StoreError) and "c-unknown" in str(unknown)
    assert leased is True and appended == 2
    assert isinstance(saved, SessionRecord) and saved.version == 2
    async with SqliteStore(path) as reopened:  # what was acknowledged was committed
        versions = {s: (await reopened.load(s)) for s in ("s-new", "s-a", "s-b", "s-c")}
        assert {s: (r.version, r.data) for s, r in versions.items() if r} == {
            "s-new": (1, {"v": 1}),
            "s-a": (2, {"v": 2}),
            "s-b": (1, {"v": 1}),
            "s-c": (1, {"v": 1}),
        }
        assert [e.tool_call_id for e in await reopened.tool_log("s-a")] == ["c-1"]
        assert [e for _, e in await reopened.events("s-a")] == [{"n": 1}, {"n": 2}]
        assert not await reopened.acquire_lease("s-a", "w-2", 30.0)  # w-1 holds it


async def test_saves_of_one_session_in_one_group_compare_and_swap_in_the_order_made(
    tmp_path: Path,
) -> None:
    """Within a group each write sees the ones before it: of two saves from version 1 the
    first made wins, the second conflicts; a save from the winner's version goes on."""
    path = tmp_path / "g.db"
    async with SqliteStore(path) as store:
        await store.save(SessionRecord(id="s-1", data={"by": "creator"}))
        async with lock_held(path):
            writes = asyncio.gather(
                store.save(SessionRecord(id="s-1", version=1, data={"by": "first"})),
                store.save(SessionRecord(id="s-1", version=1, data={"by": "second"})),
                store.save(SessionRecord(id="s-1", version=2, data={"by": "third"})),
                *(store.append_events("s-1", [{"n": n}]) for n in range(5)),
                return_exceptions=True,
            )
        first, second, third, *lasts = await writes
        assert isinstance(first, SessionRecord) and first.version == 2
        assert isinstance(second, ConflictError) and (second.expected, second.actual) == (1, 2)
        assert isinstance(third, SessionRecord) and third.version == 3
        assert lasts == [1, 2, 3, 4, 5]
        loaded = await store.load("s-1")
        assert loaded is not None and (loaded.version, loaded.data) == (3, {"by": "third"})
        assert [e["n"] for _, e in await store.events("s-1")] == [0, 1, 2, 3, 4]


async def test_a_write_that_rolls_back_the_whole_group_fails_alone(tmp_path: Path) -> None:
    """A failure that makes SQLite roll the whole transaction back (here a trigger's
    RAISE(ROLLBACK); a full disk does the same) fails its own write only: the others of the
    group are written again, and committed."""
    path = tmp_path / "g.db"
    async with SqliteStore(path) as store:
        await store.save(SessionRecord(id="warm-up"))
        with raw(path) as db:
            db.execute(
                "CREATE TRIGGER doom BEFORE INSERT ON handrail_sessions "
                "WHEN NEW.id = 'doomed' BEGIN SELECT RAISE(ROLLBACK, 'the disk is full'); END"
            )
            db.execute(
                "CREATE TRIGGER doom_events BEFORE INSERT ON handrail_events "
                "WHEN NEW.session_id = 'doomed' BEGIN SELECT RAISE(ROLLBACK, 'full again'); END"
            )
        async with lock_held(path):
            writes = asyncio.gather(
                store.save(SessionRecord(id="ok-1")),
                store.append_events("ok-1", [{"n": 1}]),
                store.save(SessionRecord(id="doomed")),
                store.save(SessionRecord(id="ok-2")),
                return_exceptions=True,
            )
        ok1, appended, doomed, ok2 = await writes
        assert isinstance(doomed, StoreError) and "the disk is full" in str(doomed)
        assert isinstance(ok1, SessionRecord) and isinstance(ok2, SessionRecord)
        assert appended == 1
        # Appends of one batch (made together), one of which rolls the group back.
        async with lock_held(path):
            writes = asyncio.gather(
                store.save(SessionRecord(id="ok-3")),
                store.append_events("ok-2", [{"n": 1}]),
                store.append_events("doomed", [{"n": 1}]),
                store.append_events("ok-2", [{"n": 2}]),
                store.save(SessionRecord(id="ok-4")),
                return_exceptions=True,
            )
        ok3, first, lost, second, ok4 = await writes
        assert isinstance(lost, StoreError) and "full again" in str(lost)
        assert (first, second) == (1, 2)
        assert isinstance(ok3, SessionRecord) and isinstance(ok4, SessionRecord)
    async with SqliteStore(path) as reopened:
        assert await reopened.load("doomed") is None
        assert await reopened.events("doomed") == []
        for session_id in ("ok-1", "ok-2", "ok-3", "ok-4"):
            assert (loaded := await reopened.load(session_id)) and loaded.version == 1
        assert await reopened.events("ok-1") == [(1, {"n": 1})]
        assert await reopened.events("ok-2") == [(1, {"n": 1}), (2, {"n": 2})]


_SESSIONS = ("s-a", "s-b")  # s-a starts at version 1 with one message; s-b does not exist
_SAVE = st.tuples(
    # From a version that may be stale, of messages from a position that may leave a gap.
    st.just("save"),
    st.sampled_from(_SESSIONS),
    st.integers(0, 2),
    st.integers(0, 2),
)
_WRITE = st.one_of(
    _SAVE,
    _SAVE,
    _SAVE,
    st.tuples(st.just("append"), st.sampled_from(_SESSIONS), st.integers(1, 3), st.just(0)),
    st.tuples(st.just("started"), st.sampled_from(_SESSIONS), st.integers(0, 2), st.just(0)),
    st.tuples(st.just("finished"), st.sampled_from(_SESSIONS), st.integers(0, 2), st.just(0)),
    st.tuples(st.just("lease"), st.sampled_from(_SESSIONS), st.integers(0, 1), st.just(0)),
)


def _write(store: SqliteStore, n: int, op: tuple[str, str, int, int]) -> Any:
    kind, session_id, a, b = op
    if kind == "save":
        record = SessionRecord(
            id=session_id, version=a, data={"n": n}, messages=[{"n": n}], messages_from=b
        )
        return store.save(record)
    if kind == "append":
        return store.append_events(session_id, [{"n": n, "i": i} for i in range(a)])
    if kind == "started":
        return store.log_started(session_id, f"c-{a}", key=f"k-{n}", tool="t", args={"n": n})
    if kind == "finished":
        return store.log_finished(session_id, f"c-{a}", {"n": n})
    return store.acquire_lease(session_id, f"w-{a}", 30.0)


def _outcome(value: Any) -> Any:
    """What a caller can tell of an outcome: a saved version, or the error's type and words."""
    if isinstance(value, SessionRecord):
        return ("saved", value.version)
    if isinstance(value, BaseException):
        return (type(value).__name__, str(value))
    return value


async def _stored(store: SqliteStore) -> Any:
    stored = {}
    for session_id in _SESSIONS:
        record = await store.load(session_id)
        stored[session_id] = (
            None if record is None else (record.version, record.data, record.messages),
            await store.events(session_id),
            [(e.tool_call_id, e.status, e.result) for e in await store.tool_log(session_id)],
        )
    return stored


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(writes=st.lists(_WRITE, min_size=2, max_size=10))
def test_writes_in_one_group_end_as_they_would_one_at_a_time(
    writes: list[tuple[str, str, int, int]],
) -> None:
    """Whatever mix of writes waits together (some failing: a stale save, a save that would
    leave a gap after its update ran, a result for an unknown call), each gets the outcome it
    would have got alone, in the order they were made, and the file ends up the same."""

    async def run(path: Path, together: bool) -> tuple[list[Any], Any]:
        async with SqliteStore(path) as store:
            await store.save(SessionRecord(id="s-a", data={"n": -1}, messages=[{"n": -1}]))
            if together:  # queued behind another process's lock: one group, one commit
                async with lock_held(path):
                    made = asyncio.gather(
                        *(_write(store, n, op) for n, op in enumerate(writes)),
                        return_exceptions=True,
                    )
                outcomes = await made
            else:
                outcomes = []
                for n, op in enumerate(writes):
                    try:
                        outcomes.append(await _write(store, n, op))
                    except Exception as error:
                        outcomes.append(error)
            stored = await _stored(store)
        async with SqliteStore(path) as reopened:  # what was acknowledged was committed
            assert await _stored(reopened) == stored
        return [_outcome(o) for o in outcomes], stored

    with tempfile.TemporaryDirectory() as directory:
        grouped = asyncio.run(run(Path(directory) / "grouped.db", together=True))
        alone = asyncio.run(run(Path(directory) / "alone.db", together=False))
    assert grouped == alone


async def test_each_write_of_many_writers_is_committed_before_it_is_acknowledged(
    tmp_path: Path,
) -> None:
    """Many writers at once: whenever a save returns, another process already reads it."""
    path = tmp_path / "g.db"
    async with SqliteStore(path) as store:
        await store.save(SessionRecord(id="warm-up"))

        async def writer(i: int) -> None:
            record = await store.save(SessionRecord(id=f"s-{i}", data={"i": i}))
            await store.append_events(f"s-{i}", [{"i": i}])
            record = await store.save(record)
            with raw(path) as other:
                row = other.execute(
                    "SELECT version FROM handrail_sessions WHERE id = ?", (f"s-{i}",)
                ).fetchone()
                events = other.execute(
                    "SELECT COUNT(*) FROM handrail_events WHERE session_id = ?", (f"s-{i}",)
                ).fetchone()
            assert (row, events) == ((record.version,), (1,))

        await asyncio.gather(*(writer(i) for i in range(100)))


async def test_the_write_ahead_log_stays_bounded_under_many_writes(tmp_path: Path) -> None:
    # The store checkpoints from a thread of its own (not inside commits, where SQLite would),
    # and copies the log itself if that thread falls behind: however many writes, one at a time
    # or many at once, the log is copied back and starts over.
    path = tmp_path / "s.db"
    wal = tmp_path / "s.db-wal"
    cap = 20 * 1024 * 1024  # without checkpoints, the first loop makes a log of about 54 MB
    async with SqliteStore(path) as store:
        for n in range(8000):
            await store.append_events(f"s-{n % 50}", [{"type": "text-delta", "delta": "x" * 40}])
        assert wal.stat().st_size < cap
        for round in range(20):
            ids = [f"r{round}-{i}" for i in range(100)]
            await asyncio.gather(
                *(store.save(SessionRecord(id=i, data={"x": "y" * 500})) for i in ids)
            )
            await asyncio.gather(*(store.append_events(i, [{"e": "z" * 40}] * 3) for i in ids))
        assert wal.stat().st_size < cap
        assert len(await store.events("s-7", limit=1000)) == 160  # nothing lost on the way
    with raw(path) as db:  # and every commit is in the database, for any reader
        assert db.execute("SELECT count(*) FROM handrail_events").fetchone()[0] == 8000 + 6000


async def test_a_slow_checkpoint_holds_up_no_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A checkpoint syncs the database file (tens of milliseconds on a slow disk): it runs in a
    # thread of its own, while the store's thread goes on with its jobs.
    copying, done = threading.Event(), threading.Event()
    where: list[int] = []
    copy = sqlite_store._Checkpoints._copy

    def slow(self: Any, connection: sqlite3.Connection) -> None:
        where.append(threading.get_ident())
        copying.set()
        done.wait(10)  # as long as the test writes
        copy(self, connection)

    monkeypatch.setattr(sqlite_store._Checkpoints, "_copy", slow)
    async with SqliteStore(tmp_path / "s.db") as store:
        try:
            n = 0
            while not copying.is_set():  # write until the checkpointer is woken
                assert n < 5 * sqlite_store.CHECKPOINT_AFTER, "no checkpoint began"
                await store.append_events("s", [{"n": n}])
                n += 1
            for i in range(300):  # it is copying (slowly): every write goes on meanwhile
                await store.append_events("s", [{"i": i}])
                await store.save(SessionRecord(id=f"r-{i}", data={"i": i}))
            assert not done.is_set() and store.thread_ident not in where
        finally:
            done.set()
        assert len(await store.events("s", limit=10_000)) == n + 300
    with raw(tmp_path / "s.db") as db:  # closed: the log is copied back, every row is there
        assert db.execute("SELECT count(*) FROM handrail_events").fetchone()[0] == n + 300
    assert not (tmp_path / "s.db-wal").exists()


async def test_a_wrapper_passing_attributes_through_keeps_its_own_lease_and_load(
    tmp_path: Path,
) -> None:
    class Counting:  # a user's wrapper: its own load, the rest passed through
        def __init__(self, inner: SqliteStore) -> None:
            self.inner, self.loads = inner, 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def load(self, session_id: str) -> SessionRecord | None:
            self.loads += 1
            return await self.inner.load(session_id)

    async with SqliteStore(tmp_path / "s.db") as inner:
        await inner.save(SessionRecord(id="s-1", data={"n": 1}))
        wrapper = Counting(inner)
        held, record = await lease_and_load(wrapper, "s-1", "w1", ttl=30)  # type: ignore[arg-type]
        assert held and record is not None and record.data == {"n": 1}
        assert wrapper.loads == 1  # not the inner store's one trip, which would bypass it
        assert await inner.lease_and_load("s-1", "w2", ttl=30) == (False, None)
