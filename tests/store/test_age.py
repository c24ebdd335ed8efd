"""A turn costs the store the same however long the session's stored history (issue 35, 5).

With compaction, a turn needs only the summary and the turns after it: what it reads, what it
writes and the size of the session document must not depend on how many messages came before.
Each test grows a session by real turns (a user message, one read call, an answer) until
compaction has written a summary, and makes its twin with thousands of older messages before
the same recent turns (the history a long life leaves: stored, never needed by a turn). Both
are then driven on, turn for turn, and must cost the store exactly the same: the messages a
load reads and a save writes, the document's bytes (up to the digits of its positions), and
on SQLite the SQL statements and the virtual machine's steps, which grow with anything a
statement scans.
"""

from __future__ import annotations

import json
from typing import Any

from handrail import Agent, Compaction, Engine, MemoryStore, Runtime, tool
from handrail.models import ModelRequest
from handrail.store import SessionRecord, SessionStore, SqliteStore
from handrail.testing import FunctionModel, Step, call

from .conftest import StoreFactory

OLDER = 4000  # messages of history before the twin's recent turns
BUDGET = 1500  # tokens: compaction summarises after a few dozen messages
TURNS = 6


@tool(name="orders.lookup")
def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped", "items": ["kettle", "mug"]}


def _answer(request: ModelRequest) -> Step:
    if request.agent == "compaction":
        return "The customer asked about many orders; all of them had shipped."
    if request.messages[-1].role == "user":
        return call("orders.lookup", order_id="A1")
    return "Your order has shipped: a kettle and a mug."


def _engine(store: Any, tag: str) -> Engine:
    numbers = iter(range(1_000_000))
    runtime: Runtime[Any] = Runtime(
        model=FunctionModel(_answer),
        ids=lambda prefix: f"{prefix}_{tag}{next(numbers)}",
        compaction=Compaction(max_tokens=BUDGET),
    )
    return Engine(Agent("support", tools=[lookup]), store=store, runtime=runtime)


async def _drain(engine: Engine, session_id: str, text: str) -> None:
    events = [event async for event in engine.submit(session_id, text)]
    assert events[-1].type == "run-completed", events[-1]


class _Counted:
    """The store, passed through, counting what the engine asks of it."""

    def __init__(self, store: SessionStore) -> None:
        self._store = store
        self.read = self.written = self.document = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def load(self, session_id: str) -> SessionRecord | None:
        record: SessionRecord | None = await self._store.load(session_id)
        self.read += len(record.messages) if record is not None else 0
        return record

    async def save(self, record: SessionRecord) -> SessionRecord:
        self.written += len(record.messages)
        self.document = max(self.document, len(json.dumps(record.data)))
        saved: SessionRecord = await self._store.save(record)
        return saved


class _Statements:
    """SQLite's statements and virtual-machine steps on the store's own connection."""

    def __init__(self) -> None:
        self.statements = self.steps = 0

    def _trace(self, _: str) -> None:
        self.statements += 1

    def _step(self) -> int:
        self.steps += 1
        return 0

    async def attach(self, store: SqliteStore) -> None:
        def attach(db: Any) -> None:
            db.set_trace_callback(self._trace)
            db.set_progress_handler(self._step, 1)

        await store._call(attach, None)  # the test's look inside the store's thread


async def _young_session() -> str:
    """An export of a session grown by real turns until compaction has summarised."""
    store = MemoryStore()
    engine = _engine(store, "grow")
    for turn in range(200):
        await _drain(engine, "young", f"where is my order, question {turn}?")
        record = await store.load("young")
        assert record is not None
        if record.window >= 12:  # a summary, and a few turns after it
            return await store.export("young")
    raise AssertionError("compaction never summarised")


def _older_twin(document: str) -> str:
    """The same session with `OLDER` more messages of history before it, under another id."""
    export = json.loads(document)
    session = export["session"]
    data = session["data"]
    older = [
        {"id": f"older-{i}", "role": "user" if i % 2 == 0 else "assistant", "parts": [part]}
        for i in range(OLDER)
        for part in [{"type": "text", "text": f"an old question or answer, number {i}"}]
    ]
    export["messages"][:0] = older
    session["window"] += OLDER
    for key in ("base", "turn_start"):
        data[key] += OLDER
    data["summary"]["messages"] += OLDER
    return json.dumps(export).replace('"young"', '"old"')


async def test_a_turn_costs_the_store_the_same_at_4000_stored_messages_as_at_100(
    make_store: StoreFactory,
) -> None:
    store = await make_store()
    young = await _young_session()
    await store.import_(young)
    await store.import_(_older_twin(young))
    counted = _Counted(store)
    sql = _Statements()
    if isinstance(store, SqliteStore):
        await sql.attach(store)
    engines = {"young": _engine(counted, "y"), "old": _engine(counted, "o")}
    costs: dict[str, list[tuple[int, ...]]] = {"young": [], "old": []}
    for turn in range(TURNS):
        for session_id, engine in engines.items():
            counted.read = counted.written = counted.document = 0
            statements, steps = sql.statements, sql.steps
            await _drain(engine, session_id, f"and order {turn}?")
            costs[session_id].append(
                (
                    counted.read,
                    counted.written,
                    counted.document,
                    sql.statements - statements,
                    sql.steps - steps,
                )
            )
    for young_cost, old_cost in zip(costs["young"], costs["old"], strict=True):
        read, written, document, statements, steps = young_cost
        # The document differs only by the digits of the positions it holds (base, the
        # turn's start, the summary's end): a few bytes, where a list growing by turn would
        # add thousands.
        assert old_cost[2] - document <= 16, (young_cost, old_cost)
        assert old_cost[:2] == (read, written), (young_cost, old_cost)
        assert old_cost[3] == statements, (young_cost, old_cost)
        # A statement that scanned the older messages would take thousands of steps more;
        # a seek in a deeper B-tree may take one or two.
        assert abs(old_cost[4] - steps) <= 8, (young_cost, old_cost)
    # A turn reads the summary's turns on, not the history: the twin's older messages stay
    # where they are, stored and read in pages.
    assert max(cost[0] for cost in costs["old"]) < 200
    page = await store.messages("old", before=10, limit=3)
    assert [(position, message["id"]) for position, message in page] == [
        (7, "older-7"),
        (8, "older-8"),
        (9, "older-9"),
    ]
    old = await store.load("old")
    assert old is not None and old.window > OLDER
