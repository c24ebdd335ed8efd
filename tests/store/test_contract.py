"""The `SessionStore` contract, run against MemoryStore, SqliteStore and PostgresStore alike."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handrail import (
    AuditEntry,
    ConflictError,
    MemoryStore,
    SessionBusyError,
    SessionNotFoundError,
    SessionRecord,
    StoreError,
)
from handrail.store import (
    EXPORT_SCHEMA_VERSION,
    SessionStore,
    SessionSummary,
    ToolLogEntry,
)
from handrail.store._base import lease_and_load

from .conftest import Clock, StoreFactory

FIXTURES = Path(__file__).parent / "fixtures"


def document(**data: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "text": "hi"}], **data}


async def test_every_store_is_a_session_store(store: SessionStore) -> None:
    assert isinstance(store, SessionStore)


# -- save and load ------------------------------------------------------------------------


async def test_a_new_session_saves_at_version_1_and_loads_back_equal(
    store: SessionStore, clock: Clock
) -> None:
    record = SessionRecord(
        id="s-1", org_id="acme", user_id="u-1", status="suspended", expires_at=123.5,
        data=document(cart={"total": 31.5, "items": ["é", None, True]}),
    )  # fmt: skip
    saved = await store.save(record)
    assert saved == SessionRecord(
        id="s-1", org_id="acme", user_id="u-1", status="suspended", version=1,
        created_at=clock.now, updated_at=clock.now, expires_at=123.5, data=record.data,
    )  # fmt: skip
    assert await store.load("s-1") == saved


async def test_a_summary_is_the_metadata_without_the_document(store: SessionStore) -> None:
    assert await store.summary("nope") is None
    saved = await store.save(SessionRecord(id="s-1", org_id="o", user_id="u", data={"a": 1}))
    assert await store.summary("s-1") == saved.summary()


async def test_loading_an_unknown_session_gives_none(store: SessionStore) -> None:
    assert await store.load("nope") is None


async def test_a_save_returns_a_copy_and_leaves_the_callers_record_alone(
    store: SessionStore,
) -> None:
    record = SessionRecord(id="s-1", data=document())
    saved = await store.save(record)
    assert (record.version, record.created_at, record.updated_at) == (0, 0.0, 0.0)
    assert saved is not record
    assert saved.version == 1


async def test_each_save_adds_one_to_the_version_and_stamps_updated_at(
    store: SessionStore, clock: Clock
) -> None:
    first = await store.save(SessionRecord(id="s-1", data=document()))
    clock.advance(10)
    first.data["step"] = 2
    first.status = "completed"
    second = await store.save(first)
    assert (second.version, second.created_at, second.updated_at) == (
        2,
        first.created_at,
        first.created_at + 10,
    )
    assert await store.load("s-1") == second


async def test_changing_a_saved_or_loaded_dict_does_not_change_the_store(
    store: SessionStore,
) -> None:
    data = document(cart={"items": [1]})
    saved = await store.save(SessionRecord(id="s-1", data=data))
    data["cart"]["items"].append(2)
    saved.data["cart"]["items"].append(3)
    loaded = await store.load("s-1")
    assert loaded is not None and loaded.data == document(cart={"items": [1]})
    loaded.data["cart"]["items"].append(4)
    again = await store.load("s-1")
    assert again is not None and again.data == document(cart={"items": [1]})


async def test_a_stale_save_raises_conflict_and_changes_nothing(store: SessionStore) -> None:
    v1 = await store.save(SessionRecord(id="s-1", data={"n": 1}))
    v2 = await store.save(SessionRecord(id="s-1", version=1, data={"n": 2}))
    stale = SessionRecord(id="s-1", version=1, data={"n": "stale"})
    with pytest.raises(ConflictError) as caught:
        await store.save(stale)
    assert (caught.value.session_id, caught.value.expected, caught.value.actual) == ("s-1", 1, 2)
    assert "'s-1'" in str(caught.value) and "expected version 1, found 2" in str(caught.value)
    assert stale.version == 1 and stale.data == {"n": "stale"}
    assert await store.load("s-1") == v2
    assert v1.version == 1


async def test_creating_a_session_that_exists_is_a_conflict(store: SessionStore) -> None:
    saved = await store.save(SessionRecord(id="s-1", data={"n": 1}))
    with pytest.raises(ConflictError) as caught:
        await store.save(SessionRecord(id="s-1", data={"n": 2}))
    assert (caught.value.expected, caught.value.actual) == (0, 1)
    assert "already exists" in str(caught.value)
    assert await store.load("s-1") == saved


async def test_saving_a_deleted_session_is_a_conflict(store: SessionStore) -> None:
    saved = await store.save(SessionRecord(id="s-1", data={}))
    await store.delete("s-1")
    with pytest.raises(ConflictError) as caught:
        await store.save(saved)
    assert (caught.value.expected, caught.value.actual) == (1, None)
    assert await store.load("s-1") is None


async def test_of_concurrent_saves_of_one_version_exactly_one_wins(
    make_store: StoreFactory,
) -> None:
    stores = [await make_store(), await make_store()]  # two pools / connections where it counts
    current = await stores[0].save(SessionRecord(id="s-1", data={"winner": None}))
    for _round in range(5):
        copies = [
            SessionRecord(id="s-1", version=current.version, data={"winner": n}) for n in range(20)
        ]
        results = await asyncio.gather(
            *(stores[n % 2].save(copy) for n, copy in enumerate(copies)), return_exceptions=True
        )
        won = [r for r in results if isinstance(r, SessionRecord)]
        lost = [r for r in results if isinstance(r, ConflictError)]
        assert (len(won), len(lost)) == (1, 19), results
        assert won[0].version == current.version + 1
        assert await stores[0].load("s-1") == won[0]
        current = won[0]


async def test_concurrent_creations_of_one_session_have_one_winner(store: SessionStore) -> None:
    results = await asyncio.gather(
        *(store.save(SessionRecord(id="new", data={"n": n})) for n in range(10)),
        return_exceptions=True,
    )
    assert sum(isinstance(r, SessionRecord) for r in results) == 1
    assert sum(isinstance(r, ConflictError) for r in results) == 9


@pytest.mark.parametrize(
    "data",
    [
        {"x": object()},
        {"x": float("nan")},
        {"x": float("inf")},
        {"x": {1, 2}},
        ["not", "a", "dict"],
    ],
    ids=["object", "nan", "inf", "set", "list"],
)
async def test_a_document_that_is_not_json_is_refused(store: SessionStore, data: Any) -> None:
    with pytest.raises(StoreError, match=r"Session 's-1'") as caught:
        await store.save(SessionRecord(id="s-1", data=data))
    assert caught.value.session_id == "s-1"
    assert await store.load("s-1") is None


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (SessionRecord(id=""), "non-empty"),
        (SessionRecord(id="s", status="paused"), "status"),  # type: ignore[arg-type]
        (SessionRecord(id="s", version=-1), "version"),
        (SessionRecord(id="s", version=True), "version must be an int"),
        (SessionRecord(id="s", expires_at=math.inf), "expires_at"),
    ],
)
async def test_an_impossible_record_is_refused_before_the_store_is_touched(
    store: SessionStore, record: SessionRecord, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        await store.save(record)
    assert await store.list() == []


async def test_strings_round_trip_exactly(store: SessionStore) -> None:
    data = {
        "nul": "a\x00b",
        "lone surrogate": "\ud800",
        "emoji": "🦜 ünïcödé",
        "big float": 1e23,
        "big int": 10**30,
        "negative zero": -0.0,
        "tiny": 5e-324,
        "keys": {"": 1, 'with "quotes"': 2, "ключ": 3},
    }
    await store.save(SessionRecord(id="s-1", data=data))
    loaded = await store.load("s-1")
    assert loaded is not None
    assert loaded.data == data
    assert type(loaded.data["big float"]) is float
    assert math.copysign(1, loaded.data["negative zero"]) == -1


# -- list, due, delete ----------------------------------------------------------------------


async def add(store: SessionStore, clock: Clock, id: str, at: float, **fields: Any) -> None:
    clock.now = at
    await store.save(SessionRecord(id=id, data={}, **fields))


@pytest.fixture
async def many(store: SessionStore, clock: Clock) -> SessionStore:
    await add(store, clock, "a", 100, org_id="acme", user_id="u1", status="active")
    await add(store, clock, "b", 200, org_id="acme", user_id="u2", status="suspended")
    await add(store, clock, "c", 300, org_id="acme", user_id="u1", status="completed")
    await add(store, clock, "d", 300, org_id="other", user_id="u1", status="active")
    await add(store, clock, "e", 400, org_id=None, user_id=None, status="failed")
    return store


async def test_list_gives_summaries_newest_first_ties_by_id(many: SessionStore) -> None:
    found = await many.list()
    assert [s.id for s in found] == ["e", "d", "c", "b", "a"]
    assert all(type(s) is SessionSummary for s in found)
    assert found[1] == SessionSummary(
        id="d", org_id="other", user_id="u1", status="active", version=1,
        created_at=300, updated_at=300,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"org_id": "acme"}, ["c", "b", "a"]),
        ({"user_id": "u1"}, ["d", "c", "a"]),
        ({"org_id": "acme", "user_id": "u1"}, ["c", "a"]),
        ({"status": "active"}, ["d", "a"]),
        ({"org_id": "acme", "status": "suspended"}, ["b"]),
        ({"updated_after": 200}, ["e", "d", "c"]),
        ({"updated_before": 300}, ["b", "a"]),
        ({"updated_after": 100, "updated_before": 400}, ["d", "c", "b"]),
        ({"org_id": "nobody"}, []),
    ],
)
async def test_list_filters_combine(
    many: SessionStore, filters: dict[str, Any], expected: list[str]
) -> None:
    assert [s.id for s in await many.list(**filters)] == expected


async def test_list_pages_neither_repeat_nor_skip(many: SessionStore) -> None:
    pages = [[s.id for s in await many.list(limit=2, offset=o)] for o in (0, 2, 4, 6)]
    assert pages == [["e", "d"], ["c", "b"], ["a"], []]
    assert await many.list(limit=0) == []


async def test_list_refuses_a_status_no_session_can_have_and_a_negative_page(
    store: SessionStore,
) -> None:
    with pytest.raises(ValueError, match="status"):
        await store.list(status="paused")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        await store.list(limit=-1)
    with pytest.raises(ValueError, match="offset"):
        await store.list(offset=-1)


async def test_due_gives_sessions_whose_deadline_has_come_earliest_first(
    store: SessionStore,
) -> None:
    for id, expires_at in [("late", 50.0), ("none", None), ("early", 10.0), ("future", 99.0)]:
        await store.save(SessionRecord(id=id, expires_at=expires_at))
    await store.save(SessionRecord(id="tie", expires_at=10.0))
    assert [s.id for s in await store.due(50)] == ["early", "tie", "late"]
    assert [s.id for s in await store.due(50, limit=1)] == ["early"]
    assert await store.due(9.9) == []
    # Clearing the deadline takes the session off the list.
    early = await store.load("early")
    assert early is not None
    early.expires_at = None
    await store.save(early)
    assert [s.id for s in await store.due(50)] == ["tie", "late"]


async def test_delete_removes_the_session_its_logs_and_its_lease(store: SessionStore) -> None:
    await store.save(SessionRecord(id="s-1"))
    await store.save(SessionRecord(id="s-2"))
    await store.log_started("s-1", "c-1", key="k", tool="t", args={})
    await store.append_events("s-1", [{"type": "run-started"}])
    await store.acquire_lease("s-1", "w1", 30)
    assert await store.delete("s-1") is True
    assert await store.load("s-1") is None
    assert await store.tool_log("s-1") == []
    assert await store.events("s-1") == []
    assert await store.append_events("s-1", []) == 0  # numbering starts again
    assert await store.acquire_lease("s-1", "w2", 30) is True  # the lease went with it
    assert await store.delete("s-1") is False
    assert await store.load("s-2") is not None


# -- export and import ----------------------------------------------------------------------


async def test_export_then_import_gives_back_the_session_and_its_log(
    store: SessionStore, clock: Clock
) -> None:
    saved = await store.save(
        SessionRecord(id="s-1", org_id="acme", user_id="u", status="suspended", expires_at=9.5,
                      data=document(vars={"cart": [1, 2]}))
    )  # fmt: skip
    await store.log_started("s-1", "c-1", key="s-1:1:c-1", tool="orders.refund", args={"a": 1})
    clock.advance(1)
    await store.log_finished("s-1", "c-1", {"ok": True, "data": {"id": "R-1"}})
    await store.log_started("s-1", "c-2", key="s-1:1:c-2", tool="orders.lookup", args={})
    log = await store.tool_log("s-1")
    await store.append_events("s-1", [{"type": "run-started"}, {"type": "text-delta", "d": "é"}])
    events = await store.events("s-1")

    exported = await store.export("s-1")
    parsed = json.loads(exported)
    assert parsed["schema_version"] == EXPORT_SCHEMA_VERSION
    assert parsed["kind"] == "handrail.session"

    await store.delete("s-1")
    imported = await store.import_(exported)
    assert imported == saved
    assert await store.load("s-1") == saved
    assert await store.tool_log("s-1") == log
    assert await store.events("s-1") == events
    assert await store.export("s-1") == exported


async def test_export_of_an_unknown_session_says_so(store: SessionStore) -> None:
    with pytest.raises(SessionNotFoundError, match="'nope'"):
        await store.export("nope")


async def test_import_refuses_an_existing_session_unless_told_to_overwrite(
    store: SessionStore,
) -> None:
    await store.save(SessionRecord(id="s-1", data={"n": 1}))
    exported = await store.export("s-1")
    await store.log_started("s-1", "c-1", key="k", tool="t", args={})
    await store.append_events("s-1", [{"type": "run-started"}])
    current = await store.save(SessionRecord(id="s-1", version=1, data={"n": 2}))
    current = await store.save(current)
    assert current.version == 3

    with pytest.raises(StoreError, match=r"already exists \(version 3\).*overwrite=True"):
        await store.import_(exported)
    assert await store.load("s-1") == current

    imported = await store.import_(exported, overwrite=True)
    assert imported.version == 4  # past both: copies loaded before the import are stale
    assert imported.data == {"n": 1}
    assert await store.load("s-1") == imported
    assert await store.tool_log("s-1") == []  # the logs were replaced with the export's
    assert await store.events("s-1") == []
    with pytest.raises(ConflictError):
        await store.save(current)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[]", "Not a handrail session export"),
        ('{"kind": "something else", "schema_version": 1}', "Not a handrail session export"),
        ('{"kind": "handrail.session", "schema_version": 0}', "unknown schema_version 0"),
        ('{"kind": "handrail.session", "schema_version": "1"}', "unknown schema_version '1'"),
        ('{"kind": "handrail.session", "schema_version": 1}', "malformed"),
    ],
)
async def test_import_refuses_what_is_not_an_export(
    store: SessionStore, document: str, message: str
) -> None:
    with pytest.raises(StoreError, match=message):
        await store.import_(document)


async def test_import_refuses_an_export_newer_than_this_code(store: SessionStore) -> None:
    await store.save(SessionRecord(id="s-1"))
    newer = json.loads(await store.export("s-1"))
    newer["schema_version"] = EXPORT_SCHEMA_VERSION + 1
    await store.delete("s-1")
    with pytest.raises(StoreError, match=rf"schema_version {EXPORT_SCHEMA_VERSION + 1}, newer .*"):
        await store.import_(json.dumps(newer))
    assert await store.load("s-1") is None


@pytest.mark.parametrize(
    "change",
    [
        {"status": "paused"},
        {"version": 0},
        {"data": []},
        {"id": 7},
        {"created_at": "yesterday"},
    ],
)
async def test_import_refuses_a_malformed_session(
    store: SessionStore, change: dict[str, Any]
) -> None:
    fixture = json.loads((FIXTURES / "export_v1.json").read_text())
    fixture["session"].update(change)
    with pytest.raises(StoreError, match="malformed"):
        await store.import_(json.dumps(fixture))
    assert await store.list() == []


async def test_import_refuses_a_log_entry_with_an_unknown_status(store: SessionStore) -> None:
    fixture = json.loads((FIXTURES / "export_v1.json").read_text())
    fixture["tool_log"][0]["status"] = "running"
    with pytest.raises(StoreError, match=r"malformed.*running"):
        await store.import_(json.dumps(fixture))


async def test_import_refuses_a_log_with_a_call_twice(store: SessionStore) -> None:
    fixture = json.loads((FIXTURES / "export_v1.json").read_text())
    fixture["tool_log"][1]["tool_call_id"] = fixture["tool_log"][0]["tool_call_id"]
    with pytest.raises(StoreError, match="appears twice"):
        await store.import_(json.dumps(fixture))
    assert await store.list() == []


@pytest.mark.parametrize(
    "events",
    [
        [{"seq": 2, "event": {}}, {"seq": 2, "event": {}}],
        [{"seq": 0, "event": {}}],
        [{"seq": 1, "event": []}],
        [{"seq": "1", "event": {}}],
        {"seq": 1},
    ],
)
async def test_import_refuses_a_malformed_event_log(store: SessionStore, events: Any) -> None:
    fixture = json.loads((FIXTURES / "export_v2.json").read_text())
    fixture["events"] = events
    with pytest.raises(StoreError, match="malformed"):
        await store.import_(json.dumps(fixture))
    assert await store.list() == []


async def test_a_version_2_export_imports_with_its_event_log(store: SessionStore) -> None:
    imported = await store.import_((FIXTURES / "export_v2.json").read_text())
    assert imported.id == "sess-v2"
    assert await store.events("sess-v2") == [
        (1, {"type": "run-started", "run_id": "run_1", "session_id": "sess-v2"}),
        (2, {"type": "run-suspended", "pending": ["call_1"]}),
    ]
    assert await store.append_events("sess-v2", [{"type": "run-started"}]) == 3


async def test_a_version_1_export_still_imports(store: SessionStore) -> None:
    imported = await store.import_((FIXTURES / "export_v1.json").read_text())
    assert imported == SessionRecord(
        id="sess-v1", org_id="acme", user_id="u-7", status="suspended", version=3,
        created_at=1700000000.0, updated_at=1700000042.5, expires_at=1700003600.0,
        data={"messages": [{"id": "msg_1", "role": "user", "parts": [{"type": "text",
              "text": "Refund A1042"}]}], "vars": {"cart": {"total": 31.5}}},
    )  # fmt: skip
    assert await store.tool_log("sess-v1") == [
        ToolLogEntry(
            tool_call_id="call_1", key="sess-v1:1:call_1", tool="orders.refund",
            args={"order_id": "A1042", "amount": 84}, status="finished",
            result={"ok": True, "data": {"refund_id": "R-1"}},
            started_at=1700000040.0, finished_at=1700000041.0,
        ),
        ToolLogEntry(
            tool_call_id="call_2", key="sess-v1:1:call_2", tool="email.send",
            args={"to": "a@example.com"}, status="started", started_at=1700000042.0,
        ),
    ]  # fmt: skip
    assert await store.events("sess-v1") == []  # version 1 had no event log


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
_ids = itertools.count()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.dictionaries(st.text(max_size=8), json_values, max_size=6))
async def test_any_json_document_round_trips_losslessly(
    store: SessionStore, data: dict[str, Any]
) -> None:
    session_id = f"h-{next(_ids)}"
    saved = await store.save(SessionRecord(id=session_id, data=data))
    await store.log_started(session_id, "c", key="k", tool="t", args=data)
    await store.log_finished(session_id, "c", data)
    loaded = await store.load(session_id)
    assert loaded == saved and loaded.data == data
    exported = await store.export(session_id)
    await store.delete(session_id)
    assert await store.import_(exported) == saved
    assert await store.export(session_id) == exported
    [entry] = await store.tool_log(session_id)
    assert entry.args == data and entry.result == data
    await store.delete(session_id)


# -- the tool-call log ----------------------------------------------------------------------


async def test_a_started_call_is_never_overwritten(store: SessionStore, clock: Clock) -> None:
    assert await store.log_started("s-1", "c-1", key="k1", tool="email.send", args={"to": "a"})
    clock.advance(5)
    assert not await store.log_started("s-1", "c-1", key="k2", tool="other", args={"to": "b"})
    assert await store.tool_log("s-1") == [
        ToolLogEntry(
            tool_call_id="c-1", key="k1", tool="email.send", args={"to": "a"},
            status="started", started_at=clock.now - 5,
        )
    ]  # fmt: skip


async def test_a_finished_call_keeps_its_first_result(store: SessionStore, clock: Clock) -> None:
    await store.log_started("s-1", "c-1", key="k", tool="t", args={})
    clock.advance(2)
    assert await store.log_finished("s-1", "c-1", {"ok": True}) is True
    clock.advance(2)
    assert await store.log_finished("s-1", "c-1", {"ok": False}) is False
    assert not await store.log_started("s-1", "c-1", key="k", tool="t", args={})
    [entry] = await store.tool_log("s-1")
    assert (entry.status, entry.result, entry.finished_at) == (
        "finished",
        {"ok": True},
        clock.now - 2,
    )


async def test_finishing_a_call_that_never_started_is_an_error(store: SessionStore) -> None:
    with pytest.raises(StoreError, match=r"no tool call 'c-9' in the log.*log_started"):
        await store.log_finished("s-1", "c-9", {"ok": True})
    assert await store.tool_log("s-1") == []


async def test_the_log_is_in_start_order_and_per_session(store: SessionStore) -> None:
    for n in [3, 1, 2]:
        await store.log_started("s-1", f"c-{n}", key=f"k{n}", tool="t", args={"n": n})
        await store.log_started("s-2", f"c-{n}", key=f"other{n}", tool="t", args={})
    await store.log_finished("s-1", "c-1", {"ok": True})
    log = await store.tool_log("s-1")
    assert [(e.tool_call_id, e.key, e.status) for e in log] == [
        ("c-3", "k3", "started"),
        ("c-1", "k1", "finished"),
        ("c-2", "k2", "started"),
    ]
    assert await store.tool_log("nobody") == []


async def test_the_log_of_given_calls_is_theirs_alone_in_start_order(
    store: SessionStore,
) -> None:
    for n in [3, 1, 2, 4]:
        await store.log_started("s-1", f"c-{n}", key=f"k{n}", tool="t", args={"n": n})
        await store.log_started("s-2", f"c-{n}", key=f"other{n}", tool="t", args={})
    await store.log_finished("s-1", "c-2", {"ok": True, "n": 2})
    whole = {e.tool_call_id: e for e in await store.tool_log("s-1")}
    # Asked in any order, an id twice, one the log lacks: the log's entries, in its order.
    some = await store.tool_log("s-1", calls=["c-2", "c-9", "c-3", "c-2"])
    assert some == [whole["c-3"], whole["c-2"]]
    assert some[1].result == {"ok": True, "n": 2}
    assert await store.tool_log("s-1", calls={"c-4"}) == [whole["c-4"]]
    assert await store.tool_log("s-1", calls=()) == []
    assert await store.tool_log("s-1", calls=["c-9"]) == []
    assert await store.tool_log("nobody", calls=["c-1"]) == []
    assert await store.tool_log("s-1", calls=None) == list(whole.values())
    # More ids than one statement takes: the same answer.
    many = [f"x-{n}" for n in range(1200)] + ["c-1"]
    assert await store.tool_log("s-1", calls=many) == [whole["c-1"]]


async def test_the_log_of_a_string_of_calls_is_refused(store: SessionStore) -> None:
    await store.log_started("s-1", "c", key="k", tool="t", args={})
    with pytest.raises(TypeError, match=r"not the string 'c'.*calls=\['c'\]"):
        await store.tool_log("s-1", calls="c")


async def test_concurrent_starts_of_one_call_record_it_once(store: SessionStore) -> None:
    results = await asyncio.gather(
        *(store.log_started("s-1", "c-1", key=f"k{n}", tool="t", args={}) for n in range(10))
    )
    assert results.count(True) == 1
    assert len(await store.tool_log("s-1")) == 1


async def test_arguments_that_are_not_json_are_refused(store: SessionStore) -> None:
    with pytest.raises(StoreError, match="not JSON-compatible"):
        await store.log_started("s-1", "c-1", key="k", tool="t", args={"x": object()})
    assert await store.tool_log("s-1") == []


# -- event log ------------------------------------------------------------------------------


async def test_events_are_numbered_per_session_from_1(store: SessionStore) -> None:
    assert await store.append_events("s-1", [{"n": 1}, {"n": 2}]) == 2
    assert await store.append_events("s-2", [{"n": 1}]) == 1
    assert await store.append_events("s-1", [{"n": 3}]) == 3
    assert await store.events("s-1") == [(1, {"n": 1}), (2, {"n": 2}), (3, {"n": 3})]
    assert await store.events("s-2") == [(1, {"n": 1})]
    assert await store.events("nope") == []


async def test_appending_nothing_gives_the_number_of_the_last_event(store: SessionStore) -> None:
    assert await store.append_events("s-1", []) == 0
    await store.append_events("s-1", [{"n": 1}, {"n": 2}])
    assert await store.append_events("s-1", []) == 2
    assert await store.events("s-1") == [(1, {"n": 1}), (2, {"n": 2})]


async def test_events_are_read_after_a_number_a_page_at_a_time(store: SessionStore) -> None:
    await store.append_events("s-1", [{"n": n} for n in range(1, 8)])
    assert await store.events("s-1", after=5) == [(6, {"n": 6}), (7, {"n": 7})]
    assert await store.events("s-1", after=2, limit=2) == [(3, {"n": 3}), (4, {"n": 4})]
    assert await store.events("s-1", after=7) == []
    assert await store.events("s-1", after=99) == []
    assert await store.events("s-1", limit=0) == []


async def test_an_event_that_is_not_json_appends_nothing(store: SessionStore) -> None:
    await store.append_events("s-1", [{"n": 1}])
    with pytest.raises(StoreError, match="Session 's-1': event is not JSON-compatible"):
        await store.append_events("s-1", [{"n": 2}, {"bad": {1, 2}}])
    assert await store.events("s-1") == [(1, {"n": 1})]


async def test_reading_events_refuses_a_negative_number_or_page(store: SessionStore) -> None:
    with pytest.raises(ValueError, match="after and limit"):
        await store.events("s-1", after=-1)
    with pytest.raises(ValueError, match="after and limit"):
        await store.events("s-1", limit=-1)


async def test_concurrent_appends_never_share_or_skip_a_number(make_store: StoreFactory) -> None:
    stores = [await make_store() for _ in range(3)]
    lasts = await asyncio.gather(
        *(
            stores[n % 3].append_events("s-1", [{"batch": n, "i": i} for i in range(3)])
            for n in range(12)
        )
    )
    events = await stores[0].events("s-1", limit=100)
    assert [seq for seq, _ in events] == list(range(1, 37))
    assert sorted(lasts) == list(range(3, 37, 3))
    for last in lasts:  # each batch got consecutive numbers, in its order
        batch = [event for seq, event in events if last - 3 < seq <= last]
        assert [e["i"] for e in batch] == [0, 1, 2]
        assert len({e["batch"] for e in batch}) == 1


async def test_a_save_appends_its_events_after_the_logs_last_in_its_transaction(
    store: SessionStore,
) -> None:
    await store.append_events("s-1", [{"n": 1}])
    saved = await store.save(SessionRecord(id="s-1", data=document()), events=[{"n": 2}, {"n": 3}])
    assert saved.last_event == 3
    assert (await store.load("s-1")).last_event == 0  # not stored: said by the save only
    again = await store.save(saved, events=[])
    assert again.last_event == 0  # none carried
    assert await store.append_events("s-1", [{"n": 4}]) == 4
    assert await store.events("s-1") == [(n, {"n": n}) for n in range(1, 5)]


async def test_a_refused_save_appends_none_of_its_events(store: SessionStore) -> None:
    saved = await store.save(SessionRecord(id="s-1", data=document()), events=[{"n": 1}])
    with pytest.raises(ConflictError):  # a stale version
        await store.save(SessionRecord(id="s-1", data=document()), events=[{"n": 2}])
    assert await store.acquire_lease("s-1", "w1", ttl=30)
    with pytest.raises(SessionBusyError):  # the lease is another's
        await store.save(saved, lease=("w2", 30.0), events=[{"n": 2}])
    with pytest.raises(StoreError, match="event is not JSON-compatible"):
        await store.save(saved, events=[{"n": 2}, {"bad": {1, 2}}])
    assert await store.events("s-1") == [(1, {"n": 1})]
    assert (await store.load("s-1")).version == 1


async def test_saves_and_appends_at_once_never_share_or_skip_a_number(
    make_store: StoreFactory,
) -> None:
    stores = [await make_store() for _ in range(2)]

    async def saves() -> list[int]:
        lasts, record = [], await stores[0].save(SessionRecord(id="s-1", data=document()))
        for n in range(10):
            record = await stores[0].save(
                record, events=[{"by": "save", "n": n, "i": i} for i in range(2)]
            )
            lasts.append(record.last_event)
        return lasts

    async def appends() -> list[int]:
        return [
            await stores[1].append_events(
                "s-1", [{"by": "append", "n": n, "i": i} for i in range(2)]
            )
            for n in range(10)
        ]

    saved, appended = await asyncio.gather(saves(), appends())
    events = await stores[0].events("s-1", limit=100)
    assert [seq for seq, _ in events] == list(range(1, 41))
    assert sorted(saved + appended) == list(range(2, 41, 2))
    for last in saved + appended:  # each group got consecutive numbers, in its order
        group = [event for seq, event in events if last - 2 < seq <= last]
        assert [e["i"] for e in group] == [0, 1]
        assert len({(e["by"], e["n"]) for e in group}) == 1


async def test_a_saves_events_are_announced_once_committed(store: SessionStore) -> None:
    async with store.listen_events() as notices:
        await store.save(SessionRecord(id="s-1", data=document()), events=[{"n": 1}, {"n": 2}])
        async with asyncio.timeout(5):
            assert await anext(notices) == ("s-1", 2)


# -- leases ---------------------------------------------------------------------------------


async def test_a_lease_is_held_by_one_owner_until_it_expires(
    store: SessionStore, clock: Clock
) -> None:
    assert await store.acquire_lease("s-1", "w1", ttl=30) is True
    assert await store.acquire_lease("s-1", "w2", ttl=30) is False
    clock.advance(29.9)
    assert await store.acquire_lease("s-1", "w2", ttl=30) is False
    clock.advance(0.1)  # expired at exactly its deadline
    assert await store.acquire_lease("s-1", "w2", ttl=30) is True
    assert await store.acquire_lease("s-1", "w1", ttl=30) is False


async def test_renewing_a_lease_moves_its_expiry(store: SessionStore, clock: Clock) -> None:
    assert await store.acquire_lease("s-1", "w1", ttl=30)
    clock.advance(20)
    assert await store.acquire_lease("s-1", "w1", ttl=30)  # renewed until now + 30
    clock.advance(20)
    assert not await store.acquire_lease("s-1", "w2", ttl=30)
    clock.advance(10)
    assert await store.acquire_lease("s-1", "w2", ttl=30)


async def test_only_the_owner_can_release_a_lease(store: SessionStore) -> None:
    assert await store.acquire_lease("s-1", "w1", ttl=30)
    assert await store.release_lease("s-1", "w2") is False
    assert not await store.acquire_lease("s-1", "w2", ttl=30)
    assert await store.release_lease("s-1", "w1") is True
    assert await store.release_lease("s-1", "w1") is False
    assert await store.acquire_lease("s-1", "w2", ttl=30)


async def test_leases_are_per_session(store: SessionStore) -> None:
    assert await store.acquire_lease("s-1", "w1", ttl=30)
    assert await store.acquire_lease("s-2", "w2", ttl=30)


async def test_a_turn_takes_the_lease_and_reads_the_session_in_one_call(
    store: SessionStore, clock: Clock
) -> None:
    saved = await store.save(SessionRecord(id="s-1", data={"k": 1}, messages=[{"m": 0}, {"m": 1}]))
    held, record = await lease_and_load(store, "s-1", "w1", ttl=30)
    assert held is True
    assert record is not None
    assert (record.version, record.data, record.messages) == (
        saved.version,
        {"k": 1},
        saved.messages,
    )
    # Held by w1: w2 is refused and reads nothing; w1 renews it.
    assert await lease_and_load(store, "s-1", "w2", ttl=30) == (False, None)
    clock.advance(20)
    assert (await lease_and_load(store, "s-1", "w1", ttl=30))[0] is True
    clock.advance(20)
    assert not await store.acquire_lease("s-1", "w2", ttl=30)  # renewed until 50
    # No such session: the lease is taken all the same (a turn may create it).
    assert await lease_and_load(store, "s-new", "w1", ttl=30) == (True, None)
    assert not await store.acquire_lease("s-new", "w2", ttl=30)
    with pytest.raises(ValueError, match="ttl"):
        await lease_and_load(store, "s-2", "w1", ttl=0)


async def test_a_turn_whose_session_cannot_be_read_leaves_the_lease_free() -> None:
    class Unreadable(MemoryStore):  # no lease_and_load of its own: the two calls
        async def load(self, session_id: str) -> SessionRecord | None:
            raise StoreError(f"Session {session_id!r} cannot be read.", session_id=session_id)

    store = Unreadable()
    with pytest.raises(StoreError, match="cannot be read"):
        await lease_and_load(store, "s-1", "w1", ttl=30)
    assert await store.acquire_lease("s-1", "w2", ttl=30)  # not held until it lapses


async def test_of_owners_racing_for_a_lease_exactly_one_wins(make_store: StoreFactory) -> None:
    stores = [await make_store(), await make_store()]
    results = await asyncio.gather(
        *(stores[n % 2].acquire_lease("s-1", f"w{n}", ttl=30) for n in range(20))
    )
    assert results.count(True) == 1


async def test_claim_takes_the_due_sessions_no_live_worker_drives(
    store: SessionStore, clock: Clock
) -> None:
    for id, expires_at in [("late", 50.0), ("none", None), ("early", 10.0), ("future", 99.0)]:
        await store.save(SessionRecord(id=id, expires_at=expires_at))
    await store.save(SessionRecord(id="busy", expires_at=5.0))
    assert await store.acquire_lease("busy", "w2", ttl=30)  # a live worker drives it
    claimed = await store.claim(50, "w1", ttl=30)
    assert [s.id for s in claimed] == ["early", "late"]  # the busy one holds no place
    # Their leases are w1's now: nobody else claims or takes them while they hold.
    assert await store.claim(50, "w3", ttl=30) == []
    assert not await store.acquire_lease("early", "w3", ttl=30)
    assert [s.id for s in await store.claim(50, "w1", ttl=30)] == ["early", "late"]  # own
    clock.advance(30)  # every lease lapsed: all due sessions go to whoever claims
    assert [s.id for s in await store.claim(50, "w3", ttl=30, limit=2)] == ["busy", "early"]


async def test_claims_made_at_once_share_out_the_sessions(make_store: StoreFactory) -> None:
    stores = [await make_store(), await make_store()]
    for n in range(30):
        await stores[0].save(SessionRecord(id=f"s-{n:02}", expires_at=float(n)))
    batches = await asyncio.gather(
        *(stores[n % 2].claim(100, f"w{n}", ttl=30, limit=4) for n in range(10))
    )
    claimed = [s.id for batch in batches for s in batch]
    assert len(claimed) == len(set(claimed))  # no session went to two workers
    assert len(claimed) == 30 or all(len(batch) == 4 for batch in batches)


async def test_a_restarted_worker_adopts_its_previous_incarnations_leases(
    store: SessionStore,
) -> None:
    old, new = "w1#0123456789a", "w1#fedcba98765"
    assert await store.acquire_lease("s-1", old, ttl=30)
    assert await store.acquire_lease("s-2", old, ttl=30)
    assert await store.acquire_lease("s-3", "w1x#0123456789", ttl=30)  # another worker id
    assert await store.acquire_lease("s-4", "w1", ttl=30)  # not an incarnation of w1
    assert await store.adopt_leases("w1", new) == ["s-1", "s-2"]
    assert await store.acquire_lease("s-1", new, ttl=30)  # its own now
    assert not await store.acquire_lease("s-1", old, ttl=30)  # the old one lost it
    assert not await store.release_lease("s-2", old)
    assert not await store.acquire_lease("s-3", new, ttl=30)
    assert await store.adopt_leases("w1", new) == []


@pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf])
async def test_a_lease_needs_a_positive_ttl(store: SessionStore, ttl: float) -> None:
    with pytest.raises(ValueError, match="ttl"):
        await store.acquire_lease("s-1", "w1", ttl=ttl)


# -- wake-ups -------------------------------------------------------------------------------


async def next_wakeups(wakeups: Any, n: int) -> list[str]:
    async with asyncio.timeout(5):
        return [await anext(wakeups) for _ in range(n)]


async def test_listeners_hear_every_notify_after_they_subscribe(make_store: StoreFactory) -> None:
    notifier, listener = await make_store(), await make_store()
    await notifier.notify("before")
    async with listener.listen() as first, listener.listen() as second:
        await notifier.notify("s-1")
        await notifier.notify("s-2")
        assert await next_wakeups(first, 2) == ["s-1", "s-2"]
        assert await next_wakeups(second, 2) == ["s-1", "s-2"]


async def test_wakeups_can_be_read_with_async_for(store: SessionStore) -> None:
    heard = []
    async with store.listen() as wakeups:
        for n in range(3):
            await store.notify(f"s-{n}")
        async with asyncio.timeout(5):
            async for session_id in wakeups:
                heard.append(session_id)
                if len(heard) == 3:
                    break
    assert heard == ["s-0", "s-1", "s-2"]


async def test_a_listener_may_time_out_and_wait_again(store: SessionStore) -> None:
    async with store.listen() as wakeups:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await anext(wakeups)
        await store.notify("s-1")
        assert await next_wakeups(wakeups, 1) == ["s-1"]


async def test_listening_ends_when_the_store_closes(store: SessionStore) -> None:
    async with store.listen() as wakeups:
        waiter = asyncio.create_task(anext(wakeups, "ended"))
        await asyncio.sleep(0.05)
        await store.close()
        async with asyncio.timeout(5):
            assert await waiter == "ended"


async def test_event_notices_name_the_session_and_its_last_event(store: SessionStore) -> None:
    async with store.listen_events() as notices:
        await store.append_events("s-1", [{"type": "run-started"}, {"type": "text-delta"}])
        await store.append_events("s 2:x", [{"type": "run-started"}])
        await store.append_events("s-3", [])  # nothing appended: nothing announced
        await store.append_events("s-1", [{"type": "run-completed"}])
        heard: list[tuple[str, int]] = []
        async with asyncio.timeout(5):
            # Until both logs are announced to their end (appends may share a notice).
            while ("s-1", 3) not in heard or ("s 2:x", 1) not in heard:
                heard.append(await anext(notices))
    assert {session for session, _ in heard} == {"s-1", "s 2:x"}
    assert [last for session, last in heard if session == "s-1"] in ([2, 3], [3])
    assert [seq for seq, _ in await store.events("s-1", after=2)] == [3]


async def test_event_notices_reach_other_processes_only_where_the_store_says(
    make_store: StoreFactory,
) -> None:
    writer, reader = await make_store(), await make_store()
    async with reader.listen_events() as notices:
        await writer.append_events("s-1", [{"type": "run-started"}])
        await reader.append_events("s-2", [{"type": "run-started"}])
        heard: set[tuple[str, int]] = set()
        async with asyncio.timeout(5):
            while ("s-2", 1) not in heard:
                heard.add(await anext(notices))
            if writer is not reader and getattr(reader, "cross_process_events", False):
                while ("s-1", 1) not in heard:  # another store object, as another process
                    heard.add(await anext(notices))
    if writer is reader or getattr(reader, "cross_process_events", False):
        assert heard == {("s-1", 1), ("s-2", 1)}
    else:  # SQLite: the other store object's appends are not announced here
        assert heard == {("s-2", 1)}


async def test_event_notices_end_when_the_store_closes(store: SessionStore) -> None:
    async with store.listen_events() as notices:
        waiter = asyncio.create_task(anext(notices, "ended"))
        await asyncio.sleep(0.05)
        await store.close()
        async with asyncio.timeout(5):
            assert await waiter == "ended"


# -- the audit trail: one person's decisions --------------------------------------------------


def entry(org: str | None, kind: str, who: str | None, session: str = "s-1") -> AuditEntry:
    return AuditEntry(
        org_id=org, at=1.0, kind=kind, session_id=session, tool="pay",  # type: ignore[arg-type]
        tool_call_id=f"call_{kind}", who=who, decision="approve" if kind == "decision" else None,
    )  # fmt: skip


async def test_the_trail_is_filtered_by_who_and_read_newest_first(store: SessionStore) -> None:
    made = [
        await store.append_audit(entry("acme", "decision", "ana", "s-1")),  # 1
        await store.append_audit(entry("acme", "decision", "bo", "s-1")),  # 2
        await store.append_audit(entry("acme", "call", "ana", "s-1")),  # 3: ana's session ran it
        await store.append_audit(entry("acme", "decision", "ana", "s-2")),  # 4
        await store.append_audit(entry("acme", "decision", None, "s-2")),  # 5: nobody (expired)
        await store.append_audit(entry("acme", "decision", "ana", "s-3")),  # 6
    ]
    await store.append_audit(entry("globex", "decision", "ana"))  # another organisation's ana
    await store.append_audit(entry(None, "decision", "ana"))

    def seqs(found: list[AuditEntry]) -> list[int]:
        return [e.seq for e in found]

    assert seqs(await store.audit("acme", who="ana")) == [1, 3, 4, 6]
    assert await store.audit("acme", who="ana", kind="decision") == [made[0], made[3], made[5]]
    assert seqs(await store.audit("acme", who="bo")) == [2]
    assert await store.audit("acme", who="cy") == []
    assert seqs(await store.audit("globex", who="ana")) == [1]
    assert seqs(await store.audit(None, who="ana")) == [1]

    # newest first, a page at a time: the next page is before the last entry of this one
    async def anas(limit: int = 100, before: int | None = None) -> list[AuditEntry]:
        return await store.audit(
            "acme", who="ana", kind="decision", newest_first=True, limit=limit, before=before
        )

    assert seqs(await anas(limit=2)) == [6, 4]
    assert seqs(await anas(limit=2, before=4)) == [1]
    assert await anas(before=1) == []
    # `before` and `after` bound either order; the other filters still apply
    assert seqs(await store.audit("acme", after=1, before=6, who="ana")) == [3, 4]
    assert seqs(await store.audit("acme", before=6, newest_first=True)) == [5, 4, 3, 2, 1]
    assert seqs(await store.audit("acme", who="ana", session_id="s-2")) == [4]
    with pytest.raises(ValueError, match="before must be 0 or more"):
        await store.audit("acme", who="ana", before=-1)
    # a later decision is found at once (its `who` written with it)
    later = await store.append_audit(entry("acme", "decision", "ana", "s-4"))
    assert await anas(limit=1) == [later]


# -- closing --------------------------------------------------------------------------------


async def test_a_closed_store_refuses_work(store: SessionStore) -> None:
    await store.save(SessionRecord(id="s-1"))
    await store.close()
    await store.close()  # twice is harmless
    with pytest.raises(StoreError, match="closed"):
        await store.load("s-1")
    with pytest.raises(StoreError, match="closed"):
        await store.save(SessionRecord(id="s-2"))


async def test_stores_close_at_the_end_of_an_async_with() -> None:
    async with MemoryStore() as store:
        await store.save(SessionRecord(id="s-1"))
    with pytest.raises(StoreError, match="closed"):
        await store.load("s-1")


def test_the_store_package_has_no_other_lazy_names() -> None:
    import handrail.store

    with pytest.raises(AttributeError, match="NoSuchStore"):
        _ = handrail.store.NoSuchStore  # type: ignore[attr-defined]


# -- messages: stored apart, written from where they changed, read in pages ----------------


def msgs(*numbers: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"n": n, **extra} for n in numbers]


async def test_a_save_writes_messages_from_where_they_changed_and_keeps_those_before(
    store: SessionStore,
) -> None:
    saved = await store.save(SessionRecord(id="s-1", data={"turn": 1}, messages=msgs(0, 1, 2)))
    saved.messages, saved.messages_from = msgs(2, 3, edited=True), 2
    saved = await store.save(saved)
    loaded = await store.load("s-1")
    assert loaded is not None
    assert loaded.messages == [*msgs(0, 1), *msgs(2, 3, edited=True)]
    assert (loaded.messages_from, loaded.window) == (0, 0)
    # A shorter tail deletes what was stored after it.
    saved.messages, saved.messages_from = msgs(9), 1
    await store.save(saved)
    assert await store.messages("s-1") == [(0, {"n": 0}), (1, {"n": 9})]


async def test_a_load_reads_the_messages_from_the_window_on(store: SessionStore) -> None:
    await store.save(SessionRecord(id="s-1", messages=msgs(*range(6)), window=4))
    loaded = await store.load("s-1")
    assert loaded is not None
    assert (loaded.window, loaded.messages_from, loaded.messages) == (4, 4, msgs(4, 5))
    # The whole history is still there, in pages, newest first or before a position.
    assert await store.messages("s-1", limit=2) == [(4, {"n": 4}), (5, {"n": 5})]
    assert await store.messages("s-1", before=4, limit=3) == [
        (1, {"n": 1}),
        (2, {"n": 2}),
        (3, {"n": 3}),
    ]
    assert await store.messages("s-1", before=1, limit=10) == [(0, {"n": 0})]
    assert await store.messages("s-1", before=0) == []
    assert await store.messages("s-1", limit=0) == []
    assert await store.messages("unknown") == []
    with pytest.raises(ValueError, match="0 or more"):
        await store.messages("s-1", before=-1)


async def test_a_save_that_would_leave_a_gap_writes_nothing(store: SessionStore) -> None:
    saved = await store.save(SessionRecord(id="s-1", data={"a": 1}, messages=msgs(0, 1)))
    saved.data, saved.messages, saved.messages_from = {"a": 2}, msgs(3), 3
    with pytest.raises(ValueError, match="gap"):
        await store.save(saved)
    loaded = await store.load("s-1")
    assert loaded is not None and (loaded.version, loaded.data) == (1, {"a": 1})
    assert loaded.messages == msgs(0, 1)
    with pytest.raises(ValueError, match="window"):
        await store.save(SessionRecord(id="s-2", messages=msgs(0), window=2))
    assert await store.load("s-2") is None


async def test_a_save_that_loses_the_compare_and_swap_writes_no_message(
    store: SessionStore,
) -> None:
    await store.save(SessionRecord(id="s-1", messages=msgs(0)))
    stale = SessionRecord(id="s-1", version=0, messages=msgs(7, 8))
    with pytest.raises(ConflictError):
        await store.save(stale)
    mine = await store.load("s-1")
    assert mine is not None
    await store.save(SessionRecord(id="s-1", version=1, messages=msgs(1), messages_from=1))
    mine.messages, mine.messages_from = msgs(5), 0  # loaded at version 1: stale now
    with pytest.raises(ConflictError):
        await store.save(mine)
    assert await store.messages("s-1") == [(0, {"n": 0}), (1, {"n": 1})]


async def test_a_message_that_is_not_json_is_refused_before_anything_is_written(
    store: SessionStore,
) -> None:
    with pytest.raises(StoreError, match="message is not JSON-compatible"):
        await store.save(SessionRecord(id="s-1", messages=[{"n": math.nan}]))
    assert await store.load("s-1") is None


async def test_delete_takes_the_messages_with_the_session(store: SessionStore) -> None:
    await store.save(SessionRecord(id="s-1", messages=msgs(0, 1)))
    assert await store.delete("s-1")
    assert await store.messages("s-1") == []
    saved = await store.save(SessionRecord(id="s-1", messages=msgs(5)))  # made afresh
    assert saved.version == 1 and await store.messages("s-1") == [(0, {"n": 5})]


async def test_an_export_holds_the_whole_history_and_imports_with_its_window(
    store: SessionStore,
) -> None:
    await store.save(SessionRecord(id="s-1", data={"d": 1}, messages=msgs(0, 1, 2), window=2))
    document = json.loads(await store.export("s-1"))
    assert document["messages"] == msgs(0, 1, 2)  # those before the window too
    assert document["session"]["window"] == 2
    assert await store.delete("s-1")
    imported = await store.import_(json.dumps(document))
    assert imported.window == 2
    loaded = await store.load("s-1")
    assert loaded is not None and (loaded.messages_from, loaded.messages) == (2, msgs(2))
    assert await store.messages("s-1") == [(0, {"n": 0}), (1, {"n": 1}), (2, {"n": 2})]
    # An import over it replaces the history too.
    document["messages"] = msgs(7)
    document["session"]["window"] = 0
    await store.import_(json.dumps(document), overwrite=True)
    assert await store.messages("s-1") == [(0, {"n": 7})]
