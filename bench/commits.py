"""`python -m bench.commits`: what a turn writes to its database, beside the fewest it may.

One session a shape, `TURNS` turns of it after `WARMUP` untimed ones, an instant
`FunctionModel` (the model costs nothing, so what is left is the engine and its store):

- `text`: a user message, a text answer;
- `read`: a user message, one `read` tool call, an answer;
- `write`: a user message, one ungated side-effecting call (`permission="write"`,
  `approval="auto"`), an answer;
- `read+write`: both calls in one response (they run in parallel), an answer;
- `gated`: a gated call: `submit` -> `run-suspended` -> `resolve(Approve)` -> `resume` ->
  `run-completed`, counted whole (the three calls together are one turn).

For each, per turn:

- **commits**: on PostgreSQL, the database's `xact_commit` (`pg_stat_database`: every
  transaction, reads too; the store's connections are closed before it is read, so that
  their counts are flushed) and, apart, the **writing commits**: transactions that wrote to
  the log, each a commit record (`pg_walinspect`); on SQLite, the transactions the store's
  connection committed, traced (`set_trace_callback`), and apart those that wrote
  (`BEGIN IMMEDIATE`: every write of the store begins so);
- **WAL bytes**: on PostgreSQL, the records of the bench's own database in the write-ahead
  log (`pg_get_wal_records_info`, filtered by the database's OID and its transactions: the
  server is shared, and other databases' records are not counted); on SQLite, the growth of
  the `-wal` file, with the store's checkpoints held off for the run so that the log only
  grows;
- **fsyncs**: the commits that wait for the disk. PostgreSQL (`synchronous_commit=on`)
  flushes the log at every writing commit, so it is the writing commits (concurrent commits
  may share a flush); SQLite in WAL mode syncs the log at each writing commit under
  `synchronous=FULL` (the bench's setting) and at none under `NORMAL` (the store's default,
  which syncs at checkpoints only);
- **ms**: wall time per turn (2 cores shared with other work: a rough figure).

With `--logged`, each turn's events are kept in the session's event log as `handrail serve`
and the worker keep them (`Engine.log_run`): the turn's saves carry them, so the writing
commits are the same, the WAL bytes grow by the events'.

Beside each: the minimum that keeps every promise (docs/durability.md, "What is written, and
when") and the numbers measured before issue 35's change (commit d3c3d71). PostgreSQL runs when
a server answers at $HANDRAIL_BENCH_PG_DSN (default postgresql://postgres@127.0.0.1:5432/test),
in a database of its own, made and dropped by the bench (it needs the right to make one).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handrail import Agent, AgentRun, Approve, Engine, Runtime, tool
from handrail.events import Event
from handrail.models import ModelRequest
from handrail.store import SqliteStore
from handrail.testing import FunctionModel, Step, call

PG_DSN = os.environ.get("HANDRAIL_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
TURNS = 50
LOGGED = False
WARMUP = 3
SHAPES = ("text", "read", "write", "read+write", "gated")

# The fewest writing commits each shape needs (docs/durability.md derives them).
MINIMUM = {"text": 2, "read": 2, "write": 4, "read+write": 4, "gated": 6}
# Measured before the change (d3c3d71), this bench: commits (all / writing), WAL bytes,
# fsyncs, ms per turn.
BEFORE: dict[str, dict[str, tuple[float, float, float, float, float]]] = {
    "sqlite": {
        "text": (4.00, 4.00, 77291, 4.00, 29.2),
        "read": (4.00, 4.00, 82977, 4.00, 35.9),
        "write": (8.00, 8.00, 146507, 8.00, 36.0),
        "read+write": (8.00, 8.00, 154582, 8.00, 42.2),
        "gated": (14.00, 12.00, 237642, 12.00, 85.9),
    },
    "postgres": {
        "text": (5.04, 4.00, 3565, 4.00, 22.6),
        "read": (5.04, 4.00, 4312, 4.00, 25.2),
        "write": (9.06, 8.00, 8458, 8.00, 48.1),
        "read+write": (9.06, 8.00, 9755, 8.00, 37.2),
        "gated": (16.10, 11.00, 13307, 11.00, 70.5),
    },
}


@tool(name="orders.lookup")
def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped"}


@tool(name="orders.note", permission="write", approval="auto")
def note(order_id: str, text: str) -> dict[str, Any]:
    """Add a note to an order (a side effect, ungated)."""
    return {"order_id": order_id, "noted": text}


@tool(name="orders.refund", permission="write")
def refund(order_id: str, amount: float) -> dict[str, Any]:
    """Refund an order (gated: a person approves)."""
    return {"refund_id": "R-1", "amount": amount}


_CALLS: dict[str, Callable[[], Step]] = {
    "text": lambda: "Hello: how can I help?",
    "read": lambda: call("orders.lookup", order_id="A1"),
    "write": lambda: call("orders.note", order_id="A1", text="called"),
    "read+write": lambda: [
        call("orders.lookup", order_id="A1"),
        call("orders.note", order_id="A1", text="called"),
    ],
    "gated": lambda: call("orders.refund", order_id="A1", amount=12.5),
}


def _answer(request: ModelRequest) -> Step:
    last = request.messages[-1]
    if last.role == "user":
        return _CALLS[last.text.split()[0]]()
    return "Done: the order has shipped."


def _engine(store: Any) -> Engine:
    ids = itertools.count()
    runtime = Runtime(model=FunctionModel(_answer), ids=lambda prefix: f"{prefix}_{next(ids)}")
    return Engine(Agent("support", tools=[lookup, note, refund]), store=store, runtime=runtime)


async def _events(engine: Engine, session: str, run: AgentRun[Any]) -> list[Event]:
    if LOGGED:  # its events kept in the session's event log, as a server's or worker's are
        engine.log_run(session, run)
    return [event async for event in run]


async def _turn(engine: Engine, session: str, shape: str, n: int) -> None:
    events = await _events(engine, session, engine.submit(session, f"{shape} please ({n})"))
    if shape == "gated":
        assert events[-1].type == "run-suspended", events[-1]
        await engine.resolve(session, events[-1].pending[0], Approve(by="bench"))
        events = await _events(engine, session, engine.resume(session))
    assert events[-1].type == "run-completed", events[-1]


@dataclass
class Row:
    commits: float  # every transaction
    writing: float  # those that wrote
    wal: float  # bytes
    fsyncs: float
    ms: float


# -- SQLite -------------------------------------------------------------------------------


def _size(path: Path) -> int:
    return path.stat().st_size


class _Tracer:
    """Counts the transactions a SQLite connection commits, and those that wrote.

    A statement outside `BEGIN`...`COMMIT` is a transaction of its own (autocommit).
    """

    _WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")

    def __init__(self) -> None:
        self.commits = self.writing = 0
        self._open = self._wrote = False

    def __call__(self, sql: str) -> None:
        word = sql.lstrip()[:16].upper()
        if word.startswith("BEGIN"):
            self._open, self._wrote = True, False
        elif word.startswith(("COMMIT", "END")):
            self._open = False
            self.commits += 1
            self.writing += self._wrote
        elif word.startswith("ROLLBACK") and not word.startswith("ROLLBACK TO"):
            self._open = False
        elif word.startswith(("SAVEPOINT", "RELEASE", "ROLLBACK", "PRAGMA")):
            pass
        elif self._open:
            self._wrote = self._wrote or word.startswith(self._WRITES)
        else:
            self.commits += 1
            self.writing += word.startswith(self._WRITES)


async def _sqlite(tmp: Path) -> dict[str, Row]:
    import handrail.store.sqlite as sqlite_module

    # Checkpoints held off: the log only grows, and its growth is what the turns wrote.
    sqlite_module.CHECKPOINT_AFTER = sqlite_module.WAL_FRAMES_MAX = 1 << 40
    rows: dict[str, Row] = {}
    for shape in SHAPES:
        path = tmp / f"commits-{shape.replace('+', '-')}.db"
        store = SqliteStore(path, synchronous="FULL", audit_key=None)
        engine = _engine(store)
        session = f"s-{shape}"
        for n in range(WARMUP):
            await _turn(engine, session, shape, n)
        traced = _Tracer()
        await store._call(lambda db, t=traced: db.set_trace_callback(t), None)  # the bench's
        wal = Path(f"{path}-wal")
        size = _size(wal)
        begun = time.perf_counter()
        for n in range(TURNS):
            await _turn(engine, session, shape, WARMUP + n)
        ms = (time.perf_counter() - begun) * 1000 / TURNS
        await store._call(lambda db: db.set_trace_callback(None), None)
        grown = _size(wal) - size
        await store.close()
        commits, writing = traced.commits, traced.writing
        rows[shape] = Row(commits / TURNS, writing / TURNS, grown / TURNS, writing / TURNS, ms)
    return rows


# -- PostgreSQL ---------------------------------------------------------------------------


async def _postgres() -> dict[str, Row] | None:
    try:
        import psycopg

        from handrail.store.postgres import PostgresStore
    except ImportError:
        print("postgres: skipped (psycopg is not installed)")
        return None
    database = f"handrail_bench_commits_{os.getpid()}"
    try:
        admin = await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True)
    except psycopg.OperationalError as exc:
        print(f"postgres: SKIPPED, no server at {PG_DSN} ({exc})")
        return None
    dsn = re.sub(r"/[^/?]*(\?|$)", f"/{database}\\1", PG_DSN.split("://", 1)[1], count=1)
    dsn = PG_DSN.split("://", 1)[0] + "://" + dsn
    async with admin:
        await admin.execute(f"CREATE DATABASE {database}")
        try:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute("CREATE EXTENSION pg_walinspect")
            cursor = await admin.execute(
                "SELECT oid FROM pg_database WHERE datname = %s", (database,)
            )
            row = await cursor.fetchone()
            assert row is not None
            oid = int(row[0])

            async def quiet() -> None:  # the database's backends gone, their counts flushed
                for _ in range(500):
                    cursor = await admin.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,)
                    )
                    found = await cursor.fetchone()
                    if found is not None and found[0] == 0:
                        break
                    await asyncio.sleep(0.01)
                await admin.execute("SELECT pg_stat_clear_snapshot()")

            async def counters() -> tuple[int, str]:
                await quiet()
                cursor = await admin.execute(
                    "SELECT xact_commit, pg_current_wal_flush_lsn()::text "
                    "FROM pg_stat_database WHERE datname = %s",
                    (database,),
                )
                found = await cursor.fetchone()
                assert found is not None
                return int(found[0]), str(found[1])

            async def wal(start: str, end: str) -> tuple[int, int]:
                """(bytes, commit records) of this database's transactions in [start, end)."""
                if start == end:  # nothing written (pg_walinspect refuses an empty range)
                    return 0, 0
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                    cursor = await conn.execute(
                        "SELECT xid::text::bigint, resource_manager, record_type, "
                        "record_length, coalesce(block_ref, '') "
                        "FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)",
                        (start, end),
                    )
                    records = await cursor.fetchall()
                mark = f"/{oid}/"
                xids = {r[0] for r in records if mark in r[4] and r[0]}
                mine = [r for r in records if mark in r[4] or (r[0] and r[0] in xids)]
                commits = sum(1 for r in mine if r[1] == "Transaction" and r[2] == "COMMIT")
                return sum(r[3] for r in mine), commits

            async def measured(
                body: Callable[[Engine], Awaitable[None]],
            ) -> tuple[int, int, int, float]:
                """(xact_commit, WAL bytes, writing commits, seconds) of `body` on a fresh store."""
                xacts, lsn = await counters()
                store = PostgresStore(dsn, schema="bench", audit_key=None)
                begun = time.perf_counter()
                await body(_engine(store))
                elapsed = time.perf_counter() - begun
                await store.close()
                xacts2, lsn2 = await counters()
                written, commits = await wal(lsn, lsn2)
                return xacts2 - xacts, written, commits, elapsed

            async def nothing(engine: Engine) -> None:
                await engine.store.summary("none")  # opens (and migrates) the store

            await measured(nothing)  # makes the schema
            base = await measured(nothing)  # what opening and closing a store costs
            rows: dict[str, Row] = {}
            for shape in SHAPES:
                session = f"s-{shape}"

                async def warm(engine: Engine, shape: str = shape, session: str = session) -> None:
                    for n in range(WARMUP):
                        await _turn(engine, session, shape, n)

                async def run(engine: Engine, shape: str = shape, session: str = session) -> None:
                    await engine.store.summary(session)  # opened before the clock starts
                    for n in range(TURNS):
                        await _turn(engine, session, shape, WARMUP + n)

                await measured(warm)
                xacts, written, commits, elapsed = await measured(run)
                writing = (commits - base[2]) / TURNS
                rows[shape] = Row(
                    (xacts - base[0] - 1) / TURNS,  # less the summary read before the turns
                    writing,
                    (written - base[1]) / TURNS,
                    writing,
                    elapsed * 1000 / TURNS,
                )
            return rows
        finally:
            await quiet_drop(admin, database)


async def quiet_drop(admin: Any, database: str) -> None:
    await admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


# -- report -------------------------------------------------------------------------------


def _report(name: str, rows: dict[str, Row]) -> None:
    print(f"\n{name}: per turn, {TURNS} turns a shape (writing commits: minimum, target +1)")
    head = (
        f"  {'shape':<11} {'commits':>7} {'writing':>7} {'min':>4} {'target':>6} "
        f"{'WAL B':>7} {'fsyncs':>6} {'ms':>6}"
    )
    before = BEFORE.get(name, {})
    if before:
        head += "   before: commits writing  WAL B fsyncs   ms"
    print(head)
    for shape, row in rows.items():
        minimum = MINIMUM[shape]
        met = "ok" if row.writing <= minimum + 1 else "MISSED"
        line = (
            f"  {shape:<11} {row.commits:>7.2f} {row.writing:>7.2f} {minimum:>4} "
            f"{met:>6} {row.wal:>7.0f} {row.fsyncs:>6.2f} {row.ms:>6.2f}"
        )
        if shape in before:
            c, w, b, f, ms = before[shape]
            line += f"   {'':>7} {c:>7.2f} {w:>7.2f} {b:>6.0f} {f:>6.2f} {ms:>4.1f}"
        print(line)


async def main(which: list[str]) -> None:
    if "sqlite" in which:
        with tempfile.TemporaryDirectory() as tmp:
            _report("sqlite", await _sqlite(Path(tmp)))
    if "postgres" in which:
        rows = await _postgres()
        if rows is not None:
            _report("postgres", rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--stores", default="sqlite,postgres", help="comma-separated")
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument(
        "--logged",
        action="store_true",
        help="keep each turn's events in the session's event log (Engine.log_run), as "
        "`handrail serve` and the worker do",
    )
    args = parser.parse_args()
    TURNS = args.turns
    LOGGED = args.logged
    asyncio.run(main(args.stores.split(",")))
