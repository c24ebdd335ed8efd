"""`python -m bench.age`: does a turn cost more as its session gets older?

A session is grown by real turns (a user message, one tool call, an answer; an instant
`FunctionModel`) to about 100, 500, 1,300 and 4,000 stored messages, copied into each store
with `export`/`import_`, and then timed:

- a turn (`Engine.submit` to `run-completed`): median ms of `TURNS` sequential turns, each on
  a fresh copy of the session, so every sample is at the same age (each copy has one untimed
  turn first, so that what the import left to settle, such as SQLite's write-ahead log of the
  whole history, is not counted as the turn's; on PostgreSQL the messages table is then
  vacuumed too: the copies imported and deleted before leave dead rows, which a read of a
  whole history would otherwise prune, writing WAL that no turn wrote);
- a pause/resume round trip (a gated call: submit -> `run-suspended` -> `resolve` -> `resume`);
- bytes written by the turn: for SQLite the growth of this process's `wchar`
  (`/proc/self/io`: the WAL and database writes of its connection thread); for PostgreSQL
  the growth of the server's write-ahead log (`pg_current_wal_insert_lsn()`: everything the
  server wrote for the turn, so the bench wants the server to itself); the memory store
  writes nothing.

Each with and without compaction (`Compaction(max_tokens=4000)`: the summary and the recent
turns are what the model sees). Issue 20's targets: with compaction, a turn and a round trip
at 4,000 messages cost at most 1.5x what they cost at 100 (time and bytes); without
compaction, the bytes written per turn do not grow with the history. PostgreSQL runs when a
server answers at $HANDRAIL_BENCH_PG_DSN (default postgresql://postgres@127.0.0.1:5432/test),
in a schema of its own that is dropped afterwards.

Then issue 35's protocol (`--only steady`), the steady state of one session: a session grown
by real turns (a user message, one read call, an answer) with `Compaction(max_tokens=3000)`
to about 120, 4,000 and 40,000 stored messages, each copy imported into the store and
settled (SQLite's log checkpointed, PostgreSQL's tables vacuumed and analysed), then driven on:
80 turns timed at each mark, the marks taking turns round by round (120, 4,000, 40,000, then
4,000, 40,000, 120, ...), so that whatever else the machine does falls on every mark alike.
Each turn goes on from where the last one at its mark left off, as in one long session. Beside
the median ms: what the store was asked per turn (the messages a load read and a save wrote,
the bytes of the session document), the bytes written (as above) and, on SQLite, the SQL
statements and the virtual machine's steps (what a statement scanned). Target: a turn at
4,000 and at 40,000 messages costs at most 1.2x one at 120, and the counts are equal.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from handrail import Agent, Approve, Compaction, Engine, MemoryStore, Runtime, tool
from handrail.models import ModelRequest
from handrail.store import SessionRecord, SqliteStore
from handrail.store._base import lease_and_load
from handrail.store._codec import encode
from handrail.testing import FunctionModel, Step, call

PG_DSN = os.environ.get("HANDRAIL_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
SIZES = (100, 500, 1300, 4000)
TURNS = 15
RATIO = 1.5  # the target: cost at the largest size / cost at the smallest


@tool(name="orders.lookup")
def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped", "items": ["kettle", "mug"]}


@tool(name="orders.refund", permission="write")
def refund(order_id: str, amount: float) -> dict[str, Any]:
    """Refund an order."""
    return {"refund_id": "R-1", "amount": amount}


def _answer(request: ModelRequest) -> Step:
    if request.agent == "compaction":
        return "The customer asked about many orders; all of them had shipped."
    last = request.messages[-1]
    if last.role == "user":
        if last.text.startswith("refund"):
            return call("orders.refund", order_id="A1", amount=12.5)
        return call("orders.lookup", order_id=f"A{len(request.messages)}")
    return "Your order has shipped: a kettle and a mug."


def _engine(store: Any, *, compaction: bool, budget: int = 4000) -> Engine:
    ids = itertools.count()
    tag = uuid.uuid4().hex[:6]  # an engine's ids never repeat those of a session it imports
    runtime: Runtime[Any] = Runtime(
        model=FunctionModel(_answer),
        ids=lambda prefix: f"{prefix}_{tag}{next(ids)}",
        compaction=Compaction(max_tokens=budget) if compaction else None,
    )
    return Engine(Agent("support", tools=[lookup, refund]), store=store, runtime=runtime)


async def _drain(run: AsyncIterable[Any]) -> Any:
    events = [event async for event in run]
    return events[-1]


def _wchar() -> int:
    with open("/proc/self/io") as io:
        for line in io:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    return 0


async def _grow(compaction: bool) -> dict[int, str]:
    """Exports of one session at each size, grown by real turns on the memory store."""
    store = MemoryStore()
    engine = _engine(store, compaction=compaction)
    exports: dict[int, str] = {}
    sizes = iter(SIZES)
    want = next(sizes)
    turn = 0
    while True:
        await _drain(engine.submit("grown", f"where is my order, question {turn}?"))
        turn += 1
        record = await store.load("grown")
        assert record is not None
        if record.messages_from + len(record.messages) >= want:
            exports[want] = await store.export("grown")
            want = next(sizes, 0)
            if not want:
                return exports


async def _written(store: Any) -> int:
    """A counter of the bytes written so far for `store` (see the module's docstring)."""
    if type(store).__name__ != "PostgresStore":
        return _wchar()
    async with store._connection(None) as connection:  # the bench's own look at the server
        cursor = await connection.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"
        )
        row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def _settle(store: Any) -> None:
    """Let the server tidy up after the bench's own imports and deletes (see the docstring)."""
    if type(store).__name__ == "PostgresStore":
        async with store._connection(None) as connection:
            await connection.execute(f"VACUUM {store._s}.handrail_messages")


async def _measure(
    store: Any, exports: dict[int, str], *, compaction: bool
) -> dict[int, tuple[float, float, float]]:
    """size -> (turn ms, bytes a turn, round trip ms), medians."""
    engine = _engine(store, compaction=compaction)
    results: dict[int, tuple[float, float, float]] = {}
    for size, document in exports.items():
        turns: list[float] = []
        written: list[float] = []
        trips: list[float] = []
        for i in range(TURNS + 2):
            sid = f"age-{uuid.uuid4().hex[:12]}"
            await store.import_(document.replace('"grown"', f'"{sid}"'))
            event = await _drain(engine.submit(sid, "hello again"))  # settles the import
            assert event.type == "run-completed", event
            await _settle(store)
            before = await _written(store)
            start = time.perf_counter_ns()
            event = await _drain(engine.submit(sid, f"where is my order {i}?"))
            elapsed = (time.perf_counter_ns() - start) / 1e6
            bytes_ = await _written(store) - before
            assert event.type == "run-completed", event
            start = time.perf_counter_ns()
            event = await _drain(engine.submit(sid, "refund A1, please"))
            assert event.type == "run-suspended", event
            await engine.resolve(sid, event.pending[0], Approve(by="bench"))
            event = await _drain(engine.resume(sid))
            trip = (time.perf_counter_ns() - start) / 1e6
            assert event.type == "run-completed", event
            await store.delete(sid)
            if i >= 2:  # warm-up
                turns.append(elapsed)
                written.append(bytes_)
                trips.append(trip)
        results[size] = (
            statistics.median(turns),
            statistics.median(written),
            statistics.median(trips),
        )
    return results


@asynccontextmanager
async def _stores(which: list[str]) -> AsyncIterator[list[tuple[str, Any]]]:
    opened: list[tuple[str, Any]] = []
    cleanups: list[Callable[[], Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if "memory" in which:
            opened.append(("memory", MemoryStore()))
        if "sqlite" in which:
            opened.append(("sqlite", SqliteStore(Path(tmp) / "age.db")))
        if "postgres" in which:
            postgres = await _postgres()
            if postgres is not None:
                opened.append(("postgres", postgres[0]))
                cleanups.append(postgres[1])
        try:
            yield opened
        finally:
            for _, store in opened:
                await store.close()
            for cleanup in cleanups:
                await cleanup()


async def _postgres() -> tuple[Any, Callable[[], Any]] | None:
    try:
        import psycopg

        from handrail.store.postgres import PostgresStore
    except ImportError:
        print("postgres: skipped (psycopg is not installed)")
        return None
    schema = f"bench_age_{os.getpid()}"
    try:
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as conn:
            await conn.execute(f"CREATE SCHEMA {schema}")
    except psycopg.OperationalError as exc:
        print(f"postgres: SKIPPED, no server at {PG_DSN} ({exc})")
        return None
    store = PostgresStore(PG_DSN, schema=schema)

    async def drop() -> None:
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as conn:
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")

    return store, drop


def _report(name: str, compaction: bool, results: dict[int, tuple[float, float, float]]) -> None:
    label = f"{name}, {'with' if compaction else 'without'} compaction"
    print(f"\n{label}")
    print(f"  {'messages':>8}  {'turn ms':>8}  {'bytes/turn':>10}  {'pause/resume ms':>15}")
    for size, (turn, written, trip) in results.items():
        print(f"  {size:>8}  {turn:>8.2f}  {written:>10.0f}  {trip:>15.2f}")
    small, large = results[SIZES[0]], results[SIZES[-1]]
    checks = [("turn", 0), ("pause/resume", 2)]
    if name != "memory":
        checks.insert(1, ("bytes", 1))
    for what, index in checks:
        ratio = large[index] / small[index] if small[index] else float("inf")
        if compaction or what == "bytes":
            verdict = "ok" if ratio <= RATIO else "MISSED"
            target = f"target ≤ {RATIO}x: {verdict}"
            print(f"  {what} at {SIZES[-1]} / at {SIZES[0]}: {ratio:.2f}x ({target})")
        else:
            print(f"  {what} at {SIZES[-1]} / at {SIZES[0]}: {ratio:.2f}x")


STEADY_MARKS = (120, 4000, 40000)
STEADY_TURNS = 80
STEADY_BUDGET = 3000
STEADY_RATIO = 1.2  # issue 35's target: a turn at 4,000 and at 40,000 / one at 120


class _Counted:
    """A store that counts what a turn asks of it, passing every call through.

    `lease_and_load` is defined here too, so a store that does both in one trip still does.
    """

    def __init__(self, store: Any) -> None:
        self._store = store
        self.read = self.written = self.document = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def lease_and_load(
        self, session_id: str, owner: str, ttl: float
    ) -> tuple[bool, SessionRecord | None]:
        held, record = await lease_and_load(self._store, session_id, owner, ttl)
        self.read += len(record.messages) if record is not None else 0
        return held, record

    async def load(self, session_id: str) -> SessionRecord | None:
        record: SessionRecord | None = await self._store.load(session_id)
        self.read += len(record.messages) if record is not None else 0
        return record

    async def save(self, record: SessionRecord) -> SessionRecord:
        self.written += len(record.messages)
        self.document = max(self.document, len(encode(record.id, record.data)))
        saved: SessionRecord = await self._store.save(record)
        return saved


class _Statements:
    """SQLite's statements and virtual-machine steps on the store's connection (the bench's
    own look inside the store: `set_trace_callback` and `set_progress_handler`)."""

    STEP = 100  # the progress handler is called every this many steps

    def __init__(self) -> None:
        self.statements = self.steps = 0

    def _trace(self, _: str) -> None:
        self.statements += 1

    def _progress(self) -> int:
        self.steps += self.STEP
        return 0

    async def attach(self, store: Any) -> None:
        def attach(db: Any) -> None:
            db.set_trace_callback(self._trace)
            db.set_progress_handler(self._progress, self.STEP)

        await store._call(attach, None)


async def _grow_steady() -> dict[int, str]:
    """Exports of one session at each of `STEADY_MARKS`, grown by real turns (memory store)."""
    store = MemoryStore()
    engine = _engine(store, compaction=True, budget=STEADY_BUDGET)
    exports: dict[int, str] = {}
    marks = iter(STEADY_MARKS)
    want = next(marks)
    turn = 0
    while True:
        await _drain(engine.submit("grown", f"where is my order, question {turn}?"))
        turn += 1
        record = await store.load("grown")
        assert record is not None
        if record.messages_from + len(record.messages) >= want:
            exports[want] = await store.export("grown")
            want = next(marks, 0)
            if not want:
                return exports


async def _settle_copy(store: Any) -> None:
    """What an import leaves behind, tidied before the timing (see the module's docstring)."""
    if type(store).__name__ == "PostgresStore":
        async with store._connection(None) as connection:
            for table in ("handrail_messages", "handrail_sessions"):
                await connection.execute(f"VACUUM ANALYZE {store._s}.{table}")
    elif isinstance(store, SqliteStore):
        await store._call(lambda db: db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone(), None)


Steady = dict[int, dict[str, float]]


async def _steady(store: Any, exports: dict[int, str]) -> Steady:
    """mark -> medians per turn: ms, messages read, messages written, document and bytes
    written, SQLite statements and steps (issue 35's protocol, see the module's docstring)."""
    counted = _Counted(store)
    engine = _engine(counted, compaction=True, budget=STEADY_BUDGET)
    sessions = {mark: f"steady-{mark}-{uuid.uuid4().hex[:8]}" for mark in exports}
    for mark, document in exports.items():
        await store.import_(document.replace('"grown"', f'"{sessions[mark]}"'))
    await _settle_copy(store)
    sql = _Statements() if isinstance(store, SqliteStore) else None
    if sql is not None:
        await sql.attach(store)
    for mark in exports:  # warm-up
        for i in range(3):
            await _drain(engine.submit(sessions[mark], f"hello again {i}"))
    samples: dict[int, dict[str, list[float]]] = {mark: {} for mark in exports}
    marks = list(exports)
    for turn in range(STEADY_TURNS):
        shift = turn % len(marks)
        for mark in marks[shift:] + marks[:shift]:
            counted.read = counted.written = counted.document = 0
            statements, steps = (sql.statements, sql.steps) if sql else (0, 0)
            before = await _written(store)
            start = time.perf_counter_ns()
            event = await _drain(engine.submit(sessions[mark], f"where is my order {turn}?"))
            elapsed = (time.perf_counter_ns() - start) / 1e6
            written = await _written(store) - before
            assert event.type == "run-completed", event
            sample = {
                "ms": elapsed,
                "read": counted.read,
                "saved": counted.written,
                "document": counted.document,
                "bytes": written,
            }
            if sql is not None:
                sample["statements"] = sql.statements - statements
                sample["steps"] = sql.steps - steps
            for key, value in sample.items():
                samples[mark].setdefault(key, []).append(value)
    for session_id in sessions.values():
        await store.delete(session_id)
    return {
        mark: {key: statistics.median(values) for key, values in by_key.items()}
        for mark, by_key in samples.items()
    }


def _report_steady(name: str, results: Steady) -> None:
    print(f"\n{name}, one session's steady state (compaction at {STEADY_BUDGET} tokens)")
    columns = [
        ("turn ms", "ms", ".2f"),
        ("read", "read", ".0f"),
        ("saved", "saved", ".0f"),
        ("document B", "document", ".0f"),
        ("bytes/turn", "bytes", ".0f"),
        ("statements", "statements", ".0f"),
        ("VM steps", "steps", ".0f"),
    ]
    columns = [c for c in columns if c[1] in results[STEADY_MARKS[0]]]
    print(f"  {'messages':>8}  " + "  ".join(f"{title:>10}" for title, _, _ in columns))
    for mark, values in results.items():
        print(f"  {mark:>8}  " + "  ".join(f"{values[k]:>10{f}}" for _, k, f in columns))
    small = results[STEADY_MARKS[0]]
    for mark in STEADY_MARKS[1:]:
        ratio = results[mark]["ms"] / small["ms"]
        verdict = "ok" if ratio <= STEADY_RATIO else "MISSED"
        print(
            f"  turn at {mark} / at {STEADY_MARKS[0]}: {ratio:.2f}x "
            f"(target ≤ {STEADY_RATIO}x: {verdict})"
        )


async def main(which: list[str], only: str | None = None) -> None:
    print(__doc__.split("\n\n")[0])
    if only != "steady":
        for compaction in (True, False):
            exports = await _grow(compaction)
            async with _stores(which) as stores:
                for name, store in stores:
                    _report(name, compaction, await _measure(store, exports, compaction=compaction))
    if only != "copies":
        exports = await _grow_steady()
        async with _stores([w for w in which if w != "memory"]) as stores:
            for name, store in stores:
                _report_steady(name, await _steady(store, exports))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--stores", default="memory,sqlite,postgres", help="comma-separated: memory,sqlite,postgres"
    )
    parser.add_argument(
        "--only",
        choices=["copies", "steady"],
        help="copies: issue 20's fresh copies at each size; steady: issue 35's one session",
    )
    arguments = parser.parse_args()
    asyncio.run(main(arguments.stores.split(","), arguments.only))
