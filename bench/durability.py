"""`python -m bench.durability`: handrail's durable sessions against LangGraph's checkpointers.

Every part runs on SQLite (a file in a temporary directory) and on PostgreSQL (a server at
$HANDRAIL_BENCH_PG_DSN, default postgresql://postgres@127.0.0.1:5432/test, in schemas of the
benchmark's own, dropped at the end; skipped, loudly, when no server answers). Models are
scripted and instant, so the numbers are the frameworks' and the stores' own costs.

1. Save/load throughput. One conversation, the same in both frameworks (user turns, each with
   one tool call and its result and a reply, then a last "thanks"), is built by running its
   turns through each framework on the store itself: 20 and 200 handrail messages, which
   LangGraph holds as 26 and 266 (a tool result is a message of its own there). Then one
   session is saved, and loaded, over and over, one call after the other: handrail
   `RunState.dump(messages=False)` and the messages that changed + `store.save()` (what the
   engine does at a checkpoint) and `store.load()` + `RunState.load()`; LangGraph `aput` of
   the thread's checkpoint under a new id with every
   channel at a new version (what a superstep writes; making that checkpoint is not timed) and
   `aget_tuple` of the thread's latest. Each call is timed with `perf_counter_ns`, handrail's
   and LangGraph's taking turns; saves/s and loads/s are 1 / the median, after a warm-up.
   Bytes: what the database holds for the session, payload columns only (documents and blobs,
   not ids), as stored (SQLite `length`, PostgreSQL `pg_column_size`, so after TOAST
   compression): handrail the session document, its message rows and its tool-call log rows;
   LangGraph its latest checkpoint with the channel blobs and pending writes it points to.
   LangGraph also keeps a checkpoint per superstep: the "whole thread" line counts everything the
   conversation left in the database (handrail keeps one row, its messages and its log).
2. Across processes. Process A (a subprocess) submits N turns that each ship an order and then
   pause for approval of the charge, and exits. A fresh process B then resumes them one after
   the other: handrail `resolve(Approve)` then `resume` until `run-completed` (the pending call
   ids come from A, as an approval screen would hold them); LangGraph
   `ainvoke(Command(resume="approve"))` on a persistent checkpointer. Timed per session from
   before `resolve` (before `ainvoke`) to the terminal event (`ainvoke`'s return), after B has
   opened the store and resumed one untimed warm-up session; interpreter start-up and imports
   are not timed. In three rounds, handrail's A and B then LangGraph's, so that a spell of load
   on the machine falls on both; median and 95th percentile of all rounds' sessions.
3. Fleet. 1,000 sessions (200 with --quick) suspended on the charge and approved, not resumed.
   Four worker processes each run `Worker(engine, poll_interval=0.05)`, which finds ready
   sessions itself and takes a lease on each; LangGraph: four processes each resume a quarter
   of the interrupted threads, handed to them, one after the other. Wall time from "go" (sent
   once all four have started and opened the store) until the store lists every session
   `completed` (polled every 50 ms), or until all four LangGraph processes are done. Then the
   effects are counted (every order shipped once and charged once) and, for handrail, every
   session must be `completed`, none `failed`.

Each table puts handrail's number over LangGraph's (hr/LG: above 1 is better for rates, below 1
for milliseconds and bytes) and marks the target (handrail faster, smaller) ✓ or ✗.

The domain, the same in both frameworks: the agent ships an order (`ship`, idempotent) and
charges it (`charge`, gated: handrail's approval card, LangGraph's `interrupt()` in the tool).
Effects are lines appended to a file (O_APPEND, not fsynced: this is no crash test). SQLite runs
in WAL mode with synchronous=NORMAL in both (handrail's default; LangGraph's connection is set
to it, since its default, FULL, would pay an fsync per commit that handrail does not).
PostgreSQL runs with the server's defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.stores import PG_DSN

ROOT = Path(__file__).resolve().parent.parent  # where `-m bench.durability` resolves
WORKERS = 4
POLL = 0.05  # seconds: the workers' sweep interval, and how often the fleet's progress is read
BATCH = 20  # sessions set up concurrently
ROUNDS = 3  # part 2: its sessions in this many rounds of process A then B
SIZES = (20, 200)  # handrail messages in a part-1 session


@dataclass
class Settings:
    repeat: dict[int, int]  # part 1: timed saves (and loads) per session size
    warmup: dict[int, int]
    sessions: int  # part 2
    fleet: int  # part 3


FULL = Settings(repeat={20: 1000, 200: 200}, warmup={20: 50, 200: 10}, sessions=50, fleet=1000)
QUICK = Settings(repeat={20: 200, 200: 40}, warmup={20: 20, 200: 5}, sessions=20, fleet=200)


# -- the domain, in both frameworks -------------------------------------------------------------


def _effect(path: str, line: str) -> None:
    """Append one line to the effects file (one `write` with O_APPEND: atomic between processes)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def _orders(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i:04d}" for i in range(count)]


def _order_text(order: str) -> str:
    return f"Please process order {order}"


def _done_text(order: str) -> str:
    return f"Order {order} shipped and charged."


def order_engine(store: Any, effects: str) -> Any:
    """handrail: ship (idempotent, runs at once), then charge (waits for a person's approval)."""
    from handrail import Agent, Engine, Runtime, tool
    from handrail.models import ModelRequest
    from handrail.testing import FunctionModel, Step, call

    @tool(name="orders.ship", permission="write", approval="auto", idempotent=True)
    async def ship(order: str) -> str:
        """Ship an order (the carrier deduplicates on the idempotency key)."""
        _effect(effects, f"ship {order}")
        return f"shipped {order}"

    @tool(name="orders.charge", permission="write")
    async def charge(order: str) -> str:
        """Charge an order (not idempotent; a person approves it first)."""
        _effect(effects, f"charge {order}")
        return f"charged {order}"

    def answer(request: ModelRequest) -> Step:
        order = request.messages[0].text.split()[-1]
        done = {p.name for m in request.messages for p in m.tool_calls}
        if "orders.ship" not in done:
            return call("orders.ship", order=order)
        if "orders.charge" not in done:
            return call("orders.charge", order=order)
        return _done_text(order)

    runtime = Runtime(model=FunctionModel(answer))
    return Engine(Agent("desk", tools=[ship, charge]), store=store, runtime=runtime)


def order_agent(checkpointer: Any, effects: str) -> Any:
    """LangGraph: the same, the prebuilt ReAct agent; `charge` calls `interrupt()` first."""
    from langchain_core.messages import AIMessage, BaseMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.types import interrupt

    @lc_tool
    async def ship(order: str) -> str:
        """Ship an order."""
        _effect(effects, f"ship {order}")
        return f"shipped {order}"

    @lc_tool
    async def charge(order: str) -> str:
        """Charge an order (not idempotent; a person approves it first)."""
        if interrupt({"tool": "charge", "order": order}) != "approve":
            return "not charged: the charge was rejected"
        _effect(effects, f"charge {order}")
        return f"charged {order}"

    def script(messages: list[BaseMessage]) -> AIMessage:
        order = str(messages[0].content).split()[-1]
        done = {c["name"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
        for name in ("ship", "charge"):
            if name not in done:
                return AIMessage("", tool_calls=[_lc_call(name, f"{name}-{order}", order=order)])
        return AIMessage(_done_text(order))

    return _react_agent(script, [ship, charge], checkpointer)


def _lc_call(name: str, call_id: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def _react_agent(script: Any, tools: list[Any], checkpointer: Any) -> Any:
    from bench._langgraph import ScriptedChatModel, create_react_agent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated for `langchain.agents`, not installed here
        return create_react_agent(
            ScriptedChatModel(script=script), tools, checkpointer=checkpointer
        )


# The part-1 conversation: each user turn looks an order up or ships it, then a reply.
THANKS = "Thanks, that's all."


_VOCABULARY = """order parcel late delivery refund address courier warehouse invoice customer help
week today tomorrow box damaged missing tracking number payment card bank account email phone
support ticket status shipped delayed returned replaced item size colour price discount coupon
store online again still never arrived sorry wait check update team manager label carrier road
van driver door neighbour signed photo proof credit note receipt total tax shipping express
standard option choose confirm cancel change return window policy days weeks month morning
evening noon street city postcode country customs fee duty held depot scan route slot"""


def _prose(seed: str, length: int = 60) -> str:
    """Deterministic filler text that compresses about as well as real text (not a repeat)."""
    rng, words = random.Random(seed), _VOCABULARY.split()
    return " ".join(rng.choice(words) for _ in range(length)).capitalize() + "."


def _user_text(n: int) -> str:
    return f"Customer message {n}: my order A10{n} is late. {_prose(f'user {n}')}"


def _reply_text(n: int) -> str:
    return f"Reply {n}: your order A10{n} is on its way. {_prose(f'reply {n}')}"


def _turn_of(text: str) -> int:
    return -1 if text == THANKS else int(text.split(":")[0].split()[-1])


def _lookup(order_id: str) -> dict[str, Any]:
    items = [{"sku": "B-2", "qty": 1}, {"sku": "C-3", "qty": 2}]
    return {"id": order_id, "status": "shipped", "total": 84.5, "items": items}


def _shipment(order_id: str) -> dict[str, Any]:
    return {"shipment": f"S-{order_id}", "carrier": "DHL", "eta_days": 2}


def _chat_texts(messages: int) -> list[str]:
    """User turns whose conversation holds `messages` handrail messages (3 a turn, 2 the last)."""
    turns, rest = divmod(messages - 2, 3)
    assert rest == 0, messages
    return [_user_text(n) for n in range(turns)] + [THANKS]


def chat_engine(store: Any) -> Any:
    from handrail import Agent, Engine, Runtime, tool
    from handrail.models import ModelRequest
    from handrail.testing import FunctionModel, Step, call

    @tool(name="orders.lookup", permission="read")
    async def lookup(order_id: str) -> dict[str, Any]:
        """Look an order up."""
        return _lookup(order_id)

    @tool(name="orders.ship", permission="write", approval="auto", idempotent=True)
    async def ship(order_id: str) -> dict[str, Any]:
        """Ship an order."""
        return _shipment(order_id)

    def answer(request: ModelRequest) -> Step:
        last = request.messages[-1]
        user = next(m for m in reversed(request.messages) if m.role == "user")
        n = _turn_of(user.text)
        if last.role == "user" and n >= 0:
            name = "orders.lookup" if n % 2 == 0 else "orders.ship"
            return call(name, order_id=f"A10{n}")
        return _reply_text(n)

    runtime = Runtime(model=FunctionModel(answer))
    return Engine(Agent("desk", tools=[lookup, ship]), store=store, runtime=runtime)


def chat_agent(checkpointer: Any) -> Any:
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
    from langchain_core.tools import tool as lc_tool

    @lc_tool
    async def lookup(order_id: str) -> dict[str, Any]:
        """Look an order up."""
        return _lookup(order_id)

    @lc_tool
    async def ship(order_id: str) -> dict[str, Any]:
        """Ship an order."""
        return _shipment(order_id)

    def script(messages: list[BaseMessage]) -> AIMessage:
        user = next(m for m in reversed(messages) if isinstance(m, HumanMessage))
        n = _turn_of(str(user.content))
        if isinstance(messages[-1], HumanMessage) and n >= 0:
            name = "lookup" if n % 2 == 0 else "ship"
            return AIMessage("", tool_calls=[_lc_call(name, f"call_{n}", order_id=f"A10{n}")])
        return AIMessage(_reply_text(n))

    return _react_agent(script, [lookup, ship], checkpointer)


# -- stores -------------------------------------------------------------------------------------


def _pg_conninfo(schema: str) -> str:
    from psycopg.conninfo import make_conninfo

    return make_conninfo(PG_DSN, options=f"-c search_path={schema}")


@contextlib.asynccontextmanager
async def handrail_store(kind: str, where: str) -> AsyncIterator[Any]:
    """handrail's store: a SQLite file (`where` is its path) or a PostgreSQL schema."""
    from handrail.store import PostgresStore, SqliteStore

    if kind == "sqlite":
        store: Any = SqliteStore(where)
    else:
        store = await PostgresStore.connect(PG_DSN, schema=where, pool_size=4)
    try:
        yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def langgraph_saver(kind: str, where: str, *, setup: bool = True) -> AsyncIterator[Any]:
    """LangGraph's checkpointer on a SQLite file or in a PostgreSQL schema (which must exist)."""
    if kind == "sqlite":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with AsyncSqliteSaver.from_conn_string(where) as saver:
            await saver.conn.execute("PRAGMA synchronous=NORMAL")
            await saver.setup()
            yield saver
    else:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        # from_conn_string: autocommit, prepare_threshold=0, dict rows, as its docs ask.
        async with AsyncPostgresSaver.from_conn_string(_pg_conninfo(where)) as saver:
            if setup:
                await saver.setup()
            yield saver


def _thread(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


class Places:
    """Where each part keeps its data: files in a temporary directory, or PostgreSQL schemas."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.schemas: list[str] = []

    async def location(self, kind: str, name: str) -> str:
        if kind == "sqlite":
            return str(self.directory / f"{name}.db")
        import psycopg

        schema = f"durabench_{os.getpid()}_{name}"
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
            await connection.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        self.schemas.append(schema)
        return schema

    def effects(self, name: str) -> str:
        return str(self.directory / f"{name}.effects")

    async def drop_schemas(self) -> None:
        if not self.schemas:
            return
        import psycopg

        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
            for schema in self.schemas:
                await connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def _postgres_version() -> str | None:
    """The server's version, or None if no server answers."""
    try:
        import psycopg

        async with await psycopg.AsyncConnection.connect(PG_DSN, connect_timeout=3) as connection:
            row = await (await connection.execute("SHOW server_version")).fetchone()
    except Exception:
        return None
    return str(row[0]) if row else "?"


def _pg_server() -> str:
    try:
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(PG_DSN)
    except Exception:  # no psycopg, or a DSN it cannot read
        return PG_DSN
    return f"{params.get('host', 'localhost')}:{params.get('port', 5432)}"


# -- part 1: save/load throughput ---------------------------------------------------------------


@dataclass
class Throughput:
    saves: float  # per second
    loads: float
    bytes: int  # the session as stored (LangGraph: its latest checkpoint)
    thread_bytes: int  # everything the conversation left in the database
    messages: int


@dataclass
class Subject:
    """One framework's session, ready to be saved and loaded again and again."""

    save: Callable[[], Awaitable[Any]]
    load: Callable[[], Awaitable[Any]]
    before_save: Callable[[], Any]  # untimed
    messages: int


async def _rates(
    steps: list[tuple[Callable[[], Awaitable[Any]], Callable[[], Any]]], count: int, warmup: int
) -> list[float]:
    """Calls per second of each `step()` (after its untimed `prepare()`): 1 / the median time of
    `count` calls after `warmup`. The steps take turns, so a spell of load falls on all."""
    samples: list[list[int]] = [[] for _ in steps]
    for i in range(warmup + count):
        for (step, prepare), times in zip(steps, samples, strict=True):
            prepare()
            start = time.perf_counter_ns()
            await step()
            if i >= warmup:
                times.append(time.perf_counter_ns() - start)
    return [1e9 / statistics.median(times) for times in samples]


def _nothing() -> None:
    return None


@contextlib.asynccontextmanager
async def handrail_session(kind: str, where: str, size: int) -> AsyncIterator[Subject]:
    """The conversation run through an engine on the store, then a copy saved as the engine
    saves (the document and the messages that changed, `store.save()`) and loaded as it loads
    (`load`, `RunState.load`)."""
    from handrail.state import RunState
    from handrail.store import SessionRecord

    async with handrail_store(kind, where) as store:
        engine = chat_engine(store)
        for text in _chat_texts(size):
            event = await _last(engine.submit(f"chat-{size}", text))
            assert event.type == "run-completed", event
        record = await store.load(f"chat-{size}")
        state = RunState.load(record.data, messages=record.messages, base=record.messages_from)
        assert len(state.messages) == size, len(state.messages)
        target = SessionRecord(id=f"chat-{size}-again")
        state.clean = 0  # the copy's first save writes every message, later ones what changed

        async def save() -> None:
            start = state.changed_from()
            target.data = state.dump(messages=False)
            target.messages, target.messages_from = state.dump_messages(start), start
            target.version = (await store.save(target)).version
            state.mark_saved()

        async def load() -> None:
            loaded = await store.load(target.id)
            RunState.load(loaded.data, messages=loaded.messages, base=loaded.messages_from)

        yield Subject(save, load, _nothing, len(state.messages))


@contextlib.asynccontextmanager
async def langgraph_thread(kind: str, where: str, size: int) -> AsyncIterator[Subject]:
    """The conversation run through the agent on the checkpointer, then its latest checkpoint
    put again and again under a new id with every channel at a new version (as a superstep
    does; making that checkpoint is untimed) and the thread's latest read back."""
    from langgraph.checkpoint.base import copy_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    async with langgraph_saver(kind, where) as saver:
        agent = chat_agent(saver)
        for text in _chat_texts(size):
            result = await agent.ainvoke({"messages": [("user", text)]}, _thread(f"chat-{size}"))
            assert result["messages"][-1].content == _reply_text(_turn_of(text))
        latest = await saver.aget_tuple(_thread(f"chat-{size}"))
        checkpoint, meta = latest.checkpoint, latest.metadata
        config = _thread(f"chat-{size}-again")
        versions: dict[str, Any] = {}

        def next_checkpoint() -> None:
            nonlocal checkpoint, versions
            checkpoint = copy_checkpoint(checkpoint)
            checkpoint["id"] = str(uuid6(clock_seq=0))
            versions = {
                channel: saver.get_next_version(version, None)
                for channel, version in checkpoint["channel_versions"].items()
            }
            checkpoint["channel_versions"].update(versions)

        async def save() -> None:
            nonlocal config
            config = await saver.aput(config, checkpoint, meta, versions)

        async def load() -> None:
            await saver.aget_tuple(_thread(f"chat-{size}-again"))

        messages = len(checkpoint["channel_values"]["messages"])
        yield Subject(save, load, next_checkpoint, messages)


_HR_BYTES = {
    "sqlite": (
        """SELECT length(CAST(data AS BLOB))
            + (SELECT COALESCE(SUM(length(CAST(message AS BLOB))), 0)
                FROM handrail_messages m WHERE m.session_id = s.id)
        FROM handrail_sessions s WHERE id = ?""",
        """SELECT COALESCE(SUM(length(CAST(args AS BLOB))
            + COALESCE(length(CAST(result AS BLOB)), 0)), 0)
        FROM handrail_tool_log WHERE session_id = ?""",
    ),
    "postgres": (
        """SELECT pg_column_size(data) + (SELECT COALESCE(SUM(pg_column_size(m.message)), 0)
            FROM {s}.handrail_messages m WHERE m.session_id = t.id)
        FROM {s}.handrail_sessions t WHERE id = %s""",
        """SELECT COALESCE(SUM(pg_column_size(args) + COALESCE(pg_column_size(result), 0)), 0)
        FROM {s}.handrail_tool_log WHERE session_id = %s""",
    ),
}
_LG_BYTES = {
    "sqlite": (
        """WITH latest AS (SELECT * FROM checkpoints WHERE thread_id = ?1
            ORDER BY checkpoint_id DESC LIMIT 1)
        SELECT (SELECT length(checkpoint) + length(metadata) FROM latest)
            + (SELECT COALESCE(SUM(length(w.value)), 0) FROM writes w JOIN latest l
               ON w.thread_id = l.thread_id AND w.checkpoint_ns = l.checkpoint_ns
               AND w.checkpoint_id = l.checkpoint_id)""",
        """SELECT (SELECT SUM(length(checkpoint) + length(metadata)) FROM checkpoints
                   WHERE thread_id = ?1)
            + (SELECT COALESCE(SUM(length(value)), 0) FROM writes WHERE thread_id = ?1)""",
    ),
    "postgres": (
        """WITH latest AS (SELECT * FROM checkpoints WHERE thread_id = %(t)s
            ORDER BY checkpoint_id DESC LIMIT 1)
        SELECT (SELECT pg_column_size(checkpoint) + pg_column_size(metadata) FROM latest)
            + (SELECT COALESCE(SUM(pg_column_size(b.blob)), 0) FROM latest l
               CROSS JOIN jsonb_each_text(l.checkpoint -> 'channel_versions') v
               JOIN checkpoint_blobs b ON b.thread_id = l.thread_id
               AND b.checkpoint_ns = l.checkpoint_ns AND b.channel = v.key
               AND b.version = v.value)
            + (SELECT COALESCE(SUM(pg_column_size(w.blob)), 0) FROM latest l
               JOIN checkpoint_writes w ON w.thread_id = l.thread_id
               AND w.checkpoint_ns = l.checkpoint_ns AND w.checkpoint_id = l.checkpoint_id)""",
        """SELECT (SELECT SUM(pg_column_size(checkpoint) + pg_column_size(metadata))
                   FROM checkpoints WHERE thread_id = %(t)s)
            + (SELECT COALESCE(SUM(pg_column_size(blob)), 0) FROM checkpoint_blobs
               WHERE thread_id = %(t)s)
            + (SELECT COALESCE(SUM(pg_column_size(blob)), 0) FROM checkpoint_writes
               WHERE thread_id = %(t)s)""",
    ),
}


async def _handrail_bytes(kind: str, where: str, session: str) -> int:
    queries = [q.format(s=f'"{where}"') for q in _HR_BYTES[kind]]
    return sum(await _scalars(kind, where, queries, (session,)))


async def _langgraph_bytes(kind: str, where: str, thread: str) -> tuple[int, int]:
    params: Any = (thread,) if kind == "sqlite" else {"t": thread}
    latest, whole = await _scalars(kind, where, list(_LG_BYTES[kind]), params)
    return latest, whole


async def _scalars(kind: str, where: str, queries: list[str], params: Any) -> list[int]:
    """The first column of the first row of each query, read straight from the database."""
    if kind == "sqlite":
        with contextlib.closing(sqlite3.connect(where)) as db:
            return [int(db.execute(q, params).fetchone()[0]) for q in queries]
    import psycopg

    values: list[int] = []
    async with await psycopg.AsyncConnection.connect(_pg_conninfo(where)) as connection:
        for query in queries:
            row = await (await connection.execute(query, params)).fetchone()
            values.append(int(row[0]))
    return values


async def save_load(
    kind: str, places: Places, settings: Settings
) -> dict[int, tuple[Throughput, Throughput]]:
    results: dict[int, tuple[Throughput, Throughput]] = {}
    for size in SIZES:
        ours_at = await places.location(kind, f"p1_hr_{size}")
        theirs_at = await places.location(kind, f"p1_lg_{size}")
        repeat, warmup = settings.repeat[size], settings.warmup[size]
        async with (
            handrail_session(kind, ours_at, size) as ours,
            langgraph_thread(kind, theirs_at, size) as theirs,
        ):
            saves = await _rates(
                [(ours.save, ours.before_save), (theirs.save, theirs.before_save)], repeat, warmup
            )
            loads = await _rates([(ours.load, _nothing), (theirs.load, _nothing)], repeat, warmup)
        stored = await _handrail_bytes(kind, ours_at, f"chat-{size}")
        latest, whole = await _langgraph_bytes(kind, theirs_at, f"chat-{size}")
        results[size] = (
            Throughput(saves[0], loads[0], stored, stored, ours.messages),
            Throughput(saves[1], loads[1], latest, whole, theirs.messages),
        )
    return results


# -- part 2: across processes ------------------------------------------------------------------


async def role_suspend(job: dict[str, Any]) -> dict[str, Any]:
    """Process A: submit every order's turn, which pauses for approval of the charge; exit."""
    kind, where, effects = job["kind"], job["where"], job["effects"]
    orders = _orders(job["prefix"], job["count"])
    pending: dict[str, str] = {}
    if job["framework"] == "handrail":
        async with handrail_store(kind, where) as store:
            engine = order_engine(store, effects)
            for order in orders:
                event = await _last(engine.submit(order, _order_text(order)))
                assert event.type == "run-suspended", event
                pending[order] = event.pending[0]
    else:
        async with langgraph_saver(kind, where) as saver:
            agent = order_agent(saver, effects)
            for order in orders:
                result = await agent.ainvoke(
                    {"messages": [("user", _order_text(order))]}, _thread(order)
                )
                assert "__interrupt__" in result, result
    return {"pending": pending}


async def role_resume(job: dict[str, Any]) -> dict[str, Any]:
    """Process B: resolve and resume every session, timed one by one; the first is a warm-up."""
    kind, where, effects = job["kind"], job["where"], job["effects"]
    samples: list[float] = []
    if job["framework"] == "handrail":
        from handrail import Approve

        async with handrail_store(kind, where) as store:
            engine = order_engine(store, effects)
            for order, call_id in job["pending"].items():
                start = time.perf_counter_ns()
                await engine.resolve(order, call_id, Approve(by="ops"))
                event = await _last(engine.resume(order))
                samples.append((time.perf_counter_ns() - start) / 1e6)
                assert event.type == "run-completed", event
    else:
        from langgraph.types import Command

        async with langgraph_saver(kind, where, setup=False) as saver:
            agent = order_agent(saver, effects)
            for order in _orders(job["prefix"], job["count"]):
                start = time.perf_counter_ns()
                result = await agent.ainvoke(Command(resume="approve"), _thread(order))
                samples.append((time.perf_counter_ns() - start) / 1e6)
                assert result["messages"][-1].content == _done_text(order), result
    return {"ms": samples[1:]}


@dataclass
class Latency:
    median: float
    p95: float
    check: str


async def across_processes(kind: str, places: Places, settings: Settings) -> dict[str, Latency]:
    """Rounds of A then B, handrail's and LangGraph's in turn, so that a spell of load on the
    machine falls on both; the samples of all rounds are pooled."""
    frameworks = ("handrail", "langgraph")
    where = {f: await places.location(kind, f"p2_{f}") for f in frameworks}
    samples: dict[str, list[float]] = {f: [] for f in frameworks}
    orders: list[str] = []
    per_round = -(-settings.sessions // ROUNDS)
    for r in range(ROUNDS):
        count = min(per_round, settings.sessions - r * per_round) + 1  # one warm-up
        orders += _orders(f"p2r{r}", count)
        for framework in frameworks:
            job = {
                "framework": framework,
                "kind": kind,
                "where": where[framework],
                "effects": places.effects(f"p2_{kind}_{framework}"),
                "prefix": f"p2r{r}",
                "count": count,
            }
            suspended = await run_role("suspend", job)
            resumed = await run_role("resume", {**job, "pending": suspended["pending"]})
            samples[framework] += resumed["ms"]
    return {
        f: Latency(
            statistics.median(samples[f]),
            _p95(samples[f]),
            exactly_once(places.effects(f"p2_{kind}_{f}"), orders),
        )
        for f in frameworks
    }


def _p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20)[-1]


# -- part 3: a fleet of workers ----------------------------------------------------------------


async def role_worker(job: dict[str, Any]) -> dict[str, Any]:
    """A handrail worker process: `Worker.run` from "go" until "stop"."""
    from handrail import Worker

    async with handrail_store(job["kind"], job["where"]) as store:
        worker = Worker(order_engine(store, job["effects"]), poll_interval=POLL)
        await _ready_then_go()
        stop = asyncio.Event()
        stopper = asyncio.create_task(_set_on_line(stop))
        await worker.run(stop)
        await stopper
    return {"done": True}


async def role_lg_resume(job: dict[str, Any]) -> dict[str, Any]:
    """A LangGraph process: resume its share of the interrupted threads, one after the other."""
    from langgraph.types import Command

    orders = _orders(job["prefix"], job["count"])[job["share"] :: WORKERS]
    async with langgraph_saver(job["kind"], job["where"], setup=False) as saver:
        agent = order_agent(saver, job["effects"])
        await _ready_then_go()
        for order in orders:
            result = await agent.ainvoke(Command(resume="approve"), _thread(order))
            assert result["messages"][-1].content == _done_text(order), result
    return {"done": len(orders)}


@dataclass
class Fleet:
    seconds: float
    check: str


async def _gather_batches(step: Callable[[str], Awaitable[Any]], orders: list[str]) -> None:
    for start in range(0, len(orders), BATCH):
        await asyncio.gather(*(step(order) for order in orders[start : start + BATCH]))


async def handrail_fleet(kind: str, places: Places, count: int) -> Fleet:
    from handrail import Approve

    where = await places.location(kind, "p3_handrail")
    effects = places.effects(f"p3_{kind}_handrail")
    orders = _orders("p3", count)
    async with handrail_store(kind, where) as store:
        engine = order_engine(store, effects)

        async def suspend_and_approve(order: str) -> None:
            event = await _last(engine.submit(order, _order_text(order)))
            assert event.type == "run-suspended", event
            resolution = await engine.resolve(order, event.pending[0], Approve(by="ops"))
            assert resolution.ready

        await _gather_batches(suspend_and_approve, orders)
        assert len(await store.list(status="suspended", limit=count + 1)) == count
        job = {"kind": kind, "where": where, "effects": effects}
        async with fleet_of("worker", [job] * WORKERS) as workers:
            start = await workers.go()
            await _until_completed(store, count, workers)
            seconds = time.perf_counter() - start
        failed = len(await store.list(status="failed", limit=count + 1))
        completed = len(await store.list(status="completed", limit=count + 1))
    check = exactly_once(effects, orders)
    if failed or completed != count:
        check = f"✗ {completed} completed, {failed} failed; " + check
    return Fleet(seconds, check)


async def _until_completed(store: Any, count: int, workers: Processes) -> None:
    """Read the store's completed sessions every `POLL` seconds until there are `count`."""
    while True:
        if len(await store.list(status="completed", limit=count + 1)) >= count:
            return
        workers.check()
        await asyncio.sleep(POLL)


async def langgraph_fleet(kind: str, places: Places, count: int) -> Fleet:
    where = await places.location(kind, "p3_langgraph")
    effects = places.effects(f"p3_{kind}_langgraph")
    orders = _orders("p3", count)
    async with langgraph_saver(kind, where) as saver:
        agent = order_agent(saver, effects)

        async def suspend(order: str) -> None:
            result = await agent.ainvoke(
                {"messages": [("user", _order_text(order))]}, _thread(order)
            )
            assert "__interrupt__" in result, result

        await _gather_batches(suspend, orders)
    job = {"kind": kind, "where": where, "effects": effects, "prefix": "p3", "count": count}
    async with fleet_of("lg-resume", [{**job, "share": k} for k in range(WORKERS)]) as shares:
        start = await shares.go()
        seconds = time.perf_counter() - start  # `go` returned when all of them were done
    return Fleet(seconds, exactly_once(effects, orders))


async def fleet(kind: str, places: Places, settings: Settings) -> tuple[Fleet, Fleet]:
    ours = await handrail_fleet(kind, places, settings.fleet)
    theirs = await langgraph_fleet(kind, places, settings.fleet)
    return ours, theirs


# -- processes ----------------------------------------------------------------------------------


ROLES: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "suspend": role_suspend,
    "resume": role_resume,
    "worker": role_worker,
    "lg-resume": role_lg_resume,
}


async def _spawn(role: str, job: dict[str, Any]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.durability",
        "--role",
        role,
        "--job",
        json.dumps(job),
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def _message(process: asyncio.subprocess.Process) -> dict[str, Any]:
    """The child's next JSON line on stdout (other lines are skipped)."""
    assert process.stdout is not None
    while line := await process.stdout.readline():
        if line.startswith(b"{"):
            message: dict[str, Any] = json.loads(line)
            return message
    await process.wait()
    raise RuntimeError(f"a benchmark process exited ({process.returncode}) without answering")


async def run_role(role: str, job: dict[str, Any]) -> dict[str, Any]:
    """Run one child process to its end; its answer."""
    process = await _spawn(role, job)
    try:
        answer = await _message(process)
        await process.wait()
        return answer
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@dataclass
class Processes:
    """Processes of one role, started together by `go()`."""

    role: str
    processes: list[asyncio.subprocess.Process]

    async def go(self) -> float:
        """Wait until all are ready, tell them to go, and return the clock at that moment.

        For `lg-resume`, return only once every process is done.
        """
        for process in self.processes:
            assert (await _message(process)).get("ready")
        started = time.perf_counter()
        for process in self.processes:
            _send(process, "go")
        if self.role == "lg-resume":
            for process in self.processes:
                await _message(process)
        return started

    def check(self) -> None:
        """Raise if one of them has exited (a worker runs until it is told to stop)."""
        for process in self.processes:
            if process.returncode is not None:
                raise RuntimeError(f"a {self.role} process exited ({process.returncode})")


@contextlib.asynccontextmanager
async def fleet_of(role: str, jobs: list[dict[str, Any]]) -> AsyncIterator[Processes]:
    """One process per job; workers are told to stop when the block ends."""
    fleet = Processes(role, [await _spawn(role, job) for job in jobs])
    try:
        yield fleet
        if role == "worker":
            for process in fleet.processes:
                _send(process, "stop")
            for process in fleet.processes:
                await _message(process)
        for process in fleet.processes:
            if await process.wait():
                raise RuntimeError(f"a {role} process failed ({process.returncode})")
    finally:
        for process in fleet.processes:
            if process.returncode is None:
                process.kill()
                await process.wait()


def _send(process: asyncio.subprocess.Process, line: str) -> None:
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        process.stdin.write(f"{line}\n".encode())


def _say(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


async def _line() -> str:
    return await asyncio.to_thread(sys.stdin.readline)


async def _ready_then_go() -> None:
    _say({"ready": True})
    await _line()


async def _set_on_line(event: asyncio.Event) -> None:
    await _line()
    event.set()


def child(role: str, job: str) -> None:
    _say(asyncio.run(ROLES[role](json.loads(job))))


# -- checks and helpers -------------------------------------------------------------------------


async def _last(run: AsyncIterator[Any]) -> Any:
    last = None
    async for event in run:
        last = event
    return last


def exactly_once(effects: str, orders: list[str]) -> str:
    """✓ if every order was shipped once and charged once, and nothing else happened."""
    path = Path(effects)
    counts = Counter(path.read_text().splitlines() if path.exists() else [])
    expected = {f"{verb} {order}" for order in orders for verb in ("ship", "charge")}
    twice = sorted(line for line in expected if counts[line] > 1)
    never = sorted(line for line in expected if counts[line] == 0)
    unknown = sorted(set(counts) - expected)
    if not (twice or never or unknown):
        return f"✓ {len(orders)} orders, each shipped once and charged once"
    return f"✗ {len(twice)} twice, {len(never)} never, {len(unknown)} unexpected: " + ", ".join(
        (twice + never + unknown)[:3]
    )


# -- the tables ---------------------------------------------------------------------------------


NAMES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


def _better(ratio: float, higher: bool, word: str) -> str:
    return f"✓ {word}" if (ratio > 1 if higher else ratio < 1) else f"✗ not {word}"


def _ratio(value: float) -> str:
    return f"{value:>8.2f}" if value >= 0.1 else f"{value:>8.4f}"


def show_save_load(kind: str, results: dict[int, tuple[Throughput, Throughput]]) -> None:
    for size, (ours, theirs) in results.items():
        label = f"{ours.messages} msgs (LangGraph {theirs.messages})"
        rows = [
            ("saves/s", ours.saves, theirs.saves, True, "faster"),
            ("loads/s", ours.loads, theirs.loads, True, "faster"),
            ("bytes stored", ours.bytes, theirs.bytes, False, "smaller"),
            ("bytes, whole thread", ours.thread_bytes, theirs.thread_bytes, False, ""),
        ]
        for i, (metric, mine, other, higher, word) in enumerate(rows):
            ratio = mine / other
            target = _better(ratio, higher, word) if word else "(LangGraph keeps every step)"
            name = NAMES[kind] if i == 0 and size == SIZES[0] else ""
            print(
                f"{name:<11}{label if i == 0 else '':<26}{metric:<20}"
                f"{mine:>11,.0f}{other:>12,.0f}{_ratio(ratio)}  {target}"
            )


def show_latency(kind: str, results: dict[str, Latency]) -> None:
    ours, theirs = results["handrail"], results["langgraph"]
    ratio = ours.median / theirs.median
    print(
        f"{NAMES[kind]:<11}{ours.median:>10.2f}{ours.p95:>8.2f}{theirs.median:>12.2f}"
        f"{theirs.p95:>8.2f}{_ratio(ratio)}  {_better(ratio, False, 'faster')}"
    )
    print(f"{'':11}handrail:  {ours.check}\n{'':11}LangGraph: {theirs.check}")


def show_fleet(kind: str, count: int, results: tuple[Fleet, Fleet]) -> None:
    ours, theirs = results
    ratio = theirs.seconds / ours.seconds  # of the rates: handrail's sessions/s / LangGraph's
    print(
        f"{NAMES[kind]:<11}{ours.seconds:>10.2f}{count / ours.seconds:>12,.0f}"
        f"{theirs.seconds:>12.2f}{count / theirs.seconds:>12,.0f}{_ratio(ratio)}"
        f"  {_better(ratio, True, 'faster')}"
    )
    print(f"{'':11}handrail:  {ours.check}\n{'':11}LangGraph: {theirs.check}")


def _versions(postgres: str | None) -> str:
    packages = ", ".join(
        f"{name} {metadata.version(name)}"
        for name in ("langgraph", "langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres")
    )
    server = f"PostgreSQL {postgres}" if postgres else "no PostgreSQL"
    return (
        f"handrail {metadata.version('handrail')}; {packages}; SQLite {sqlite3.sqlite_version}; "
        f"{server}; Python {sys.version.split()[0]}; {os.cpu_count()} CPUs"
    )


async def main(quick: bool) -> None:
    settings = QUICK if quick else FULL
    postgres = await _postgres_version()
    print(_versions(postgres))
    kinds = ["sqlite"]
    if postgres:
        kinds.append("postgres")
    else:
        banner = f"PostgreSQL: skipped (no server at {_pg_server()})"
        print(f"\n{'!' * len(banner)}\n{banner}\n{'!' * len(banner)}")
    with tempfile.TemporaryDirectory(prefix="durabench-") as directory:
        places = Places(Path(directory))
        try:
            await _parts(kinds, places, settings)
        finally:
            await places.drop_schemas()


async def _parts(kinds: list[str], places: Places, settings: Settings) -> None:
    repeat = ", ".join(f"{settings.repeat[s]:,} at {s} msgs" for s in SIZES)
    print(f"\n1. Save/load throughput: one session, sequential calls, 1 / median ({repeat})")
    print(f"{'':57}{'handrail':>11}{'LangGraph':>12}{'hr/LG':>8}  target")
    for kind in kinds:
        show_save_load(kind, await save_load(kind, places, settings))

    n = settings.sessions
    print(f"\n2. Across processes: A suspends {n} turns and exits; a fresh B resolves and resumes")
    print("   each: ms per session from resolve to the terminal event, median and p95")
    print(f"{'':11}{'handrail':>10}{'p95':>8}{'LangGraph':>12}{'p95':>8}{'hr/LG':>8}  target")
    for kind in kinds:
        show_latency(kind, await across_processes(kind, places, settings))

    count = settings.fleet
    print(f"\n3. {count:,} approved sessions resumed by {WORKERS} processes: wall time, rate")
    print(
        f"{'':11}{'handrail s':>10}{'sessions/s':>12}{'LangGraph s':>12}{'threads/s':>12}"
        f"{'hr/LG':>8}  target"
    )
    for kind in kinds:
        show_fleet(kind, count, await fleet(kind, places, settings))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.durability", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer calls and sessions")
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        child(args.role, args.job)
    else:
        asyncio.run(main(args.quick))
