"""`python -m bench.fleet [--quick] [--part ...]`: a fleet of processes over one PostgreSQL.

Everything runs against the server at $HANDRAIL_BENCH_PG_DSN (default
postgresql://postgres@127.0.0.1:5432/test), in a **database of the benchmark's own**
(`fleetbench_<pid>`, created from that DSN and dropped at the end, even on failure): the
commits are counted from `pg_stat_database.xact_commit` of that database, so nobody else's
work (other clients of `test`) is counted. Models are scripted and instant, so a turn's time
is handrail's and PostgreSQL's own. Every process started is a real command: `handrail
worker` and `handrail serve` (with `--dsn`, over `bench.fleet:app`), stopped with SIGTERM
(killed if that fails) at the end.

1. Throughput for 1, 2 and 4 processes, and PostgreSQL's ceiling in the same run.
   - workers: `SESSIONS` sessions (per process count) are submitted, suspend on an approval
     card (`orders.charge`, gated) and are approved before the workers start; N `handrail
     worker` processes (`--concurrency 16 --sweep-interval 0.05`) then claim and resume them
     (the tool runs, the model answers). turns/s: the resumed turns over the time from the
     first to the last completion (the sessions' `updated_at`, the database's clock), so the
     processes' start-up is not counted; nor is it in their CPU: the CPU of N processes of the
     same command started and idle for 3 s (while nothing was ready) is taken off.
   - served: one `handrail serve --workers N`; `CLIENTS` clients in this process (the bare
     HTTP/1.1 client of bench/server.py, keep-alive), each with a session of its own, post
     turns one after the other (a user message, a `read` tool call, a text answer, the turn's
     events streamed in the answer) for `SECONDS` seconds after a warm-up. turns/s: the turns
     that ended in that window over its length.
   - commits per turn: every commit of the database while the processes ran (from before they
     start until they have exited: a backend's counts reach `pg_stat_database` when it goes
     idle, at most once a second, and when it exits), over every turn they ran (warm-up,
     sweeps, session creation, read-only commits all included: what a deployment pays).
   - ceiling: `pgbench` in a scratch database of its own (`pgbench -i -s 10`), with a script
     of single-row commits (one `UPDATE` of a random account), `-c 1, 2, 4, 8 -j 2 -T 10`;
     the best tps is the machine's commits/s ceiling.
   - share = turns/s x commits/turn / ceiling. Target ≥ 0.5. Where the rest goes: the CPU
     seconds (from /proc) of handrail's processes and of their PostgreSQL backends, per turn,
     and of this process (the clients), against the time the machine's cores had per turn,
     and the rest (other processes, idle);
     `--profile` profiles one worker (cProfile over CPU time, not wall time: an async turn's
     waits on the database are not its cost) and prints its top functions.
2. A resume storm: 4 `handrail worker` processes run (`--storm-workers 2,4`: a storm with 2,
   then one with 4); `STORM` sessions (1,000 with --quick; `--storm N`) wait on an approval
   card. The workers are started, subscribed and idle, then frozen (SIGSTOP); this process
   decides every card (`Engine.resolve`, 64 at a time; the wake-ups queue in PostgreSQL),
   and the workers are thawed (SIGCONT) all at once: to them, 10,000 sessions were decided
   at the same instant. sessions/s from the thaw to the last completion; the slowest wait,
   from the thaw to a session's `run-completed` (its `updated_at`, the database's clock: one
   machine); the session loads per session (each worker counts its `PostgresStore.load`
   calls by session, written out at exit: a load is what a wake-up cost a worker that then
   found the session another's). The rate at which one process records decisions is printed
   apart (it is the decider's, not the fleet's); and what a waiting session costs: database
   bytes per suspended session, and the workers' RSS (nothing of a waiting session is held
   in a process).
3. Idle streams: one `handrail serve` (PostgreSQL store, its connection caps off for the
   bench: `--max-connections 0 --max-client-connections 0 --streams 0`, file descriptors
   raised) and `STREAMS` streams (10,000; 1,000 with --quick) opened by this process
   (`GET /sessions/{id}/events?follow=true`, one connection each, raw asyncio sockets), on
   sessions with no events. RSS per stream: the server's RSS with them open minus before,
   over the count. Then, on `SAMPLE` of them, one at a time while the rest idle, this process
   appends an event to the session's log (`PostgresStore.append_events`, as another process
   running a turn does) and times it until the event arrives on that stream: p50/p99/max from
   the start of the append, and from its return.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import json
import os
import pstats
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.server import KEY, _Connection, _percentile
from bench.stores import PG_DSN

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = "fleet"
PROCESSES = (1, 2, 4)
CONCURRENCY = 16  # sessions a worker drives at once
SWEEP = 0.05  # seconds between a worker's sweeps
TARGET_SHARE = 0.5
PGBENCH = "/usr/bin/pgbench"
PGBENCH_CLIENTS = (1, 2, 4, 8)
PGBENCH_SCRIPT = (
    "\\set aid random(1, 100000 * :scale)\n"
    "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n"
)
ORGS = 100  # sessions spread over this many organisations (each has an audit trail of its own)
AUDIT_KEY = "bench:" + "ab" * 32  # keyed, as production runs (and no warning per process)
PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Settings:
    sessions: int  # part 1, workers: sessions per process count
    clients: int  # part 1, served: concurrent clients
    seconds: float  # part 1, served: the timed window
    pgbench_seconds: int
    pgbench_scale: int
    storm: int  # part 2
    streams: int  # part 3
    sample: int  # part 3
    storm_workers: tuple[int, ...] = (4,)  # part 2: one storm per worker count


FULL = Settings(
    sessions=1000,
    clients=32,
    seconds=15,
    pgbench_seconds=10,
    pgbench_scale=10,
    storm=10_000,
    streams=10_000,
    sample=300,
)
QUICK = Settings(
    sessions=300,
    clients=32,
    seconds=6,
    pgbench_seconds=5,
    pgbench_scale=4,
    storm=1000,
    streams=1000,
    sample=100,
)


# -- the app the processes serve ----------------------------------------------------------------


def app(store: Any = None) -> Any:
    """The engine `handrail worker`/`handrail serve` open (`bench.fleet:app`); `--dsn` gives it
    its store. A message "charge X" calls the gated `orders.charge`, any other the `read`
    tool `orders.lookup`; then the model answers."""
    from handrail import Agent, Engine, MemoryStore, Runtime, tool
    from handrail.models import ModelRequest
    from handrail.testing import FunctionModel, Step, call

    @tool(name="orders.lookup", permission="read")
    async def lookup(order: str) -> dict[str, str]:
        """Look an order up."""
        return {"order": order, "status": "delivered"}

    @tool(name="orders.charge", permission="write")
    async def charge(order: str) -> str:
        """Charge an order (a person approves it first)."""
        return f"charged {order}"

    def answer(request: ModelRequest) -> Step:
        last = request.messages[-1]
        if last.role == "user":
            verb, _, order = last.text.partition(" ")
            if verb == "charge":
                return call("orders.charge", order=order)
            return call("orders.lookup", order=order)
        return "Done, as asked."

    runtime = Runtime(model=FunctionModel(answer))
    agent = Agent("desk", tools=[lookup, charge])
    return Engine(agent, store=store or MemoryStore(), runtime=runtime)


# -- PostgreSQL ---------------------------------------------------------------------------------


def _dsn(database: str) -> str:
    from psycopg.conninfo import make_conninfo

    return make_conninfo(PG_DSN, dbname=database)


async def _admin(statement: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
        await connection.execute(statement)


async def _scalar(query: str, database: str | None = None) -> Any:
    """One value, read on a connection to the admin database (so the bench's database does not
    count it), or to `database`."""
    import psycopg

    dsn = PG_DSN if database is None else _dsn(database)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
        await connection.execute("SELECT pg_stat_clear_snapshot()")
        row = await (await connection.execute(query)).fetchone()
        return row[0] if row else None


async def commits(database: str) -> int:
    """The database's committed transactions so far (`pg_stat_database`)."""
    await asyncio.sleep(1.2)  # a backend that went idle reports within a second
    count = await _scalar(f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{database}'")
    return int(count)


@contextlib.asynccontextmanager
async def scratch_database(name: str) -> AsyncIterator[str]:
    await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await _admin(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Watcher:
    """Reads the bench's tables inside one transaction that is rolled back at the end (READ
    COMMITTED: every statement sees what was committed before it), so that watching adds no
    commit to the count."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, database: str) -> AsyncIterator[Watcher]:
        import psycopg

        connection = await psycopg.AsyncConnection.connect(_dsn(database))
        try:
            yield cls(connection)
        finally:
            await connection.rollback()
            await connection.close()

    async def rows(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        cursor = await self.connection.execute(query, params)
        return list(await cursor.fetchall())

    async def count(self, status: str, prefix: str) -> int:
        rows = await self.rows(
            f"SELECT count(*) FROM {SCHEMA}.handrail_sessions WHERE status = %s AND id LIKE %s",
            status,
            f"{prefix}%",
        )
        return int(rows[0][0])

    async def until(self, status: str, prefix: str, count: int, processes: Fleet) -> None:
        while await self.count(status, prefix) < count:
            processes.check()
            await asyncio.sleep(0.1)

    async def times(self, prefix: str) -> dict[str, float]:
        rows = await self.rows(
            f"SELECT id, updated_at FROM {SCHEMA}.handrail_sessions "
            f"WHERE status = 'completed' AND id LIKE %s",
            f"{prefix}%",
        )
        return {str(r[0]): float(r[1]) for r in rows}

    async def decided(self) -> dict[str, float]:
        """When each session's approval was decided: its audit entry's `at` (the deciding
        process's clock), by session."""
        rows = await self.rows(
            f"SELECT session_id, (entry::json->>'at')::float FROM {SCHEMA}.handrail_audit "
            f"WHERE kind = 'decision'"
        )
        return {str(r[0]): float(r[1]) for r in rows}

    async def backends(self, database: str) -> list[int]:
        rows = await self.rows(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            database,
        )
        return [int(r[0]) for r in rows]


@contextlib.asynccontextmanager
async def bench_store(database: str) -> AsyncIterator[Any]:
    from handrail.store import PostgresStore

    store = await PostgresStore.connect(_dsn(database), schema=SCHEMA, pool_size=8)
    try:
        yield store
    finally:
        await store.close()


# -- processes ----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (0 if it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE


def children(pid: int) -> list[int]:
    """`pid` and its descendants (a `serve --workers N` supervisor and its processes)."""
    found = [pid]
    for each in found:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{each}/task"):
                with open(f"/proc/{each}/task/{task}/children") as f:
                    found += [int(c) for c in f.read().split()]
    return found


def _environment() -> dict[str, str]:
    paths = [str(ROOT / "src"), str(ROOT)]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "HANDRAIL_API_KEYS": " ".join(f"{_org(i)}:bench:{_key(i)}" for i in range(ORGS)),
        "HANDRAIL_AUDIT_KEY": AUDIT_KEY,
    }


def _org(index: int) -> str:
    return f"org{index % ORGS:03d}"


def _key(index: int) -> str:
    return f"{KEY}-{index % ORGS:03d}"


class _Client(_Connection):
    """bench/server.py's bare client, with the key of organisation `index % ORGS`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__(reader, writer)
        self.key = _key(0)

    @classmethod
    async def to(cls, port: int, index: int) -> _Client:
        client = cls(*await asyncio.open_connection("127.0.0.1", port))
        client.key = _key(index)
        return client

    def send(self, method: str, path: str, body: bytes = b"", *, stream: bool = False) -> None:
        head = f"{method} {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {self.key}\r\n"
        head += f"Content-Length: {len(body)}\r\n"
        if stream:
            head += "Accept: text/event-stream\r\n"
        if body:
            head += "Content-Type: application/json\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)


def handrail_command(args: list[str], profile: str | None = None) -> list[str]:
    """The `handrail` command line, run by this interpreter (the worktree's handrail)."""
    command = [sys.executable, "-m", "bench.fleet", "--cli"]
    if profile:
        command += ["--profile-to", profile]
    return [*command, "--", *args]


@dataclass
class Fleet:
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(
        self, command: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**_environment(), **(env or {})},
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.processes.append(process)
        return process

    def check(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args!r} exited with {process.returncode}")

    def pids(self) -> list[int]:
        return [p for process in self.processes for p in children(process.pid)]

    def cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids())

    async def stop(self, timeout: float = 30) -> None:  # noqa: ASYNC109
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in self.processes:
            while process.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()


@contextlib.asynccontextmanager
async def fleet() -> AsyncIterator[Fleet]:
    processes = Fleet()
    try:
        yield processes
    finally:
        await processes.stop(timeout=10)


def worker_command(database: str, index: int, profile: str | None = None) -> list[str]:
    return handrail_command(
        [
            "worker",
            "bench.fleet:app",
            "--dsn",
            _dsn(database),
            "--schema",
            SCHEMA,
            "--worker-id",
            f"fleet-{index}",
            "--concurrency",
            str(CONCURRENCY),
            "--sweep-interval",
            str(SWEEP),
            "--health-interval",
            "0",
            "--log-level",
            "warning",
        ],
        profile,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(database: str, port: int, workers: int) -> list[str]:
    return handrail_command(
        [
            "serve",
            "bench.fleet:app",
            "--dsn",
            _dsn(database),
            "--schema",
            SCHEMA,
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--worker-id",
            "fleet-serve",
            "--rate",
            "0",
            "--turns",
            "0",
            "--streams",
            "0",
            "--stream-bytes",
            "0",
            "--max-connections",
            "0",
            "--max-client-connections",
            "0",
            "--log-level",
            "warning",
        ]
    )


async def until_up(port: int, processes: Fleet) -> None:
    for _ in range(600):
        processes.check()
        try:
            connection = await _Connection.open(port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        try:
            status, _ = await connection.json("GET", "/openapi.json")
            if status == 200:
                return
        finally:
            connection.close()
        await asyncio.sleep(0.1)
    raise RuntimeError("the server did not start")


# -- setting sessions up ------------------------------------------------------------------------


async def to_cards(engine: Any, ids: list[str]) -> dict[str, str]:
    """Submit "charge X" in each session: each waits on its approval card (its id, returned)."""
    cards: dict[str, str] = {}

    async def submit(session_id: str) -> None:
        last = None
        async for event in engine.submit(
            session_id, f"charge {session_id}", org_id=_org(int(session_id[-5:]))
        ):
            last = event
        assert last is not None and last.type == "run-suspended", last
        cards[session_id] = last.pending[0]

    await _gather(submit, ids, 32)
    return cards


async def decide(engine: Any, cards: dict[str, str], decided: dict[str, float]) -> None:
    from handrail import Approve

    async def one(session_id: str) -> None:
        resolution = await engine.resolve(
            session_id, cards[session_id], Approve(by="ops"), org_id=_org(int(session_id[-5:]))
        )
        assert resolution.ready
        decided[session_id] = time.time()

    await _gather(one, list(cards), 64)


async def _gather(step: Any, items: list[str], width: int) -> None:
    queue = list(reversed(items))

    async def lane() -> None:
        while queue:
            await step(queue.pop())

    await asyncio.gather(*(lane() for _ in range(width)))


# -- part 1: throughput -------------------------------------------------------------------------


@dataclass
class Throughput:
    kind: str
    processes: int
    turns: int
    turns_per_s: float
    commits: int  # in the database while the processes ran
    all_turns: int  # every turn they ran (with the warm-up)
    handrail_cpu: float  # CPU s of handrail's processes in the measured window
    postgres_cpu: float  # CPU s of their backends
    client_cpu: float  # CPU s of this process (the served turns' clients; the watcher)
    seconds: float

    @property
    def commits_per_turn(self) -> float:
        return self.commits / self.all_turns


async def workers_throughput(
    database: str, n: int, settings: Settings, profile: str | None = None
) -> Throughput:
    prefix = f"w{n}{'p' if profile else ''}-"
    ids = [f"{prefix}{i:05d}" for i in range(settings.sessions)]
    async with bench_store(database) as store:
        engine = app(store)
        cards = await to_cards(engine, ids)
        # The processes' start-up (an interpreter's imports, ~0.4 CPU s each) is no turn's:
        # measured on the same command started while nothing is ready, and taken off.
        async with fleet() as processes:
            for i in range(n):
                processes.start(worker_command(database, i))
            await asyncio.sleep(3)  # started, subscribed, idle
            processes.check()
            startup = processes.cpu()
            await processes.stop()
        await decide(engine, cards, {})
    before = await commits(database)
    async with fleet() as processes, Watcher.open(database) as watcher:
        client0 = time.process_time()
        for i in range(n):
            processes.start(worker_command(database, i, profile if i == 0 else None))
        await watcher.until("completed", prefix, len(ids), processes)
        client_cpu = time.process_time() - client0
        backends = await watcher.backends(database)
        handrail_cpu = processes.cpu() - startup
        postgres_cpu = sum(cpu_seconds(pid) for pid in backends)
        times = sorted((await watcher.times(prefix)).values())
        await processes.stop()
    after = await commits(database)
    seconds = times[-1] - times[0]
    return Throughput(
        "worker",
        n,
        len(ids),
        (len(times) - 1) / seconds,
        after - before,
        len(ids),
        handrail_cpu,
        postgres_cpu,
        client_cpu,
        seconds,
    )


async def served_throughput(database: str, n: int, settings: Settings) -> Throughput:
    port = free_port()
    before = await commits(database)
    stopping = False
    ended: list[float] = []

    async def client(index: int) -> None:
        connection = await _Client.to(port, index)
        try:
            status, body = await connection.json("POST", "/sessions")
            assert status == 201, body
            turn = f"/sessions/{body['id']}/turns"
            text = json.dumps({"text": f"look A{index}"}).encode()
            while not stopping:
                connection.send("POST", turn, text, stream=True)
                status, headers = await connection.head()
                assert status == 200, status
                async for _ in connection.body(headers):
                    pass
                ended.append(time.perf_counter())
        finally:
            connection.close()

    async with fleet() as processes, Watcher.open(database) as watcher:
        processes.start(serve_command(database, port, n))
        await until_up(port, processes)
        clients = [asyncio.create_task(client(i)) for i in range(settings.clients)]
        await asyncio.sleep(2)  # warm-up: every process has served turns
        started, cpu0, client0 = time.perf_counter(), processes.cpu(), time.process_time()
        backends = await watcher.backends(database)
        pg0 = {pid: cpu_seconds(pid) for pid in backends}
        await asyncio.sleep(settings.seconds)
        window = time.perf_counter() - started
        client_cpu = time.process_time() - client0
        handrail_cpu = processes.cpu() - cpu0
        postgres_cpu = sum(cpu_seconds(pid) - pg0.get(pid, 0.0) for pid in backends)
        stopping = True
        await asyncio.gather(*clients)
        await processes.stop()
    after = await commits(database)
    timed = sum(1 for t in ended if started <= t <= started + window)
    return Throughput(
        "served",
        n,
        timed,
        timed / window,
        after - before,
        len(ended),
        handrail_cpu,
        postgres_cpu,
        client_cpu,
        window,
    )


@dataclass
class Ceiling:
    tps: dict[int, float]

    @property
    def best(self) -> float:
        return max(self.tps.values())


async def pgbench(settings: Settings) -> Ceiling:
    name = f"fleetbench_pgb_{os.getpid()}"
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(PG_DSN)
    base = [
        "-h",
        str(params.get("host", "127.0.0.1")),
        "-p",
        str(params.get("port", 5432)),
        "-U",
        str(params.get("user", "postgres")),
    ]
    tps: dict[int, float] = {}
    async with scratch_database(name):
        init = [PGBENCH, *base, "-i", "-q", "-s", str(settings.pgbench_scale), name]
        await _run(init)
        with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
            script.write(PGBENCH_SCRIPT)
        try:
            for clients in PGBENCH_CLIENTS:
                run = [PGBENCH, *base, "-n", "-c", str(clients), "-j", "2"]
                run += ["-T", str(settings.pgbench_seconds), "-f", script.name, name]
                out = await _run(run)
                found = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
                assert found, out
                tps[clients] = float(found.group(1))
        finally:
            os.unlink(script.name)
    return Ceiling(tps)


async def _run(command: list[str]) -> str:
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await process.communicate()
    if process.returncode:
        raise RuntimeError(f"{command[0]} failed ({process.returncode}): {out.decode()[-500:]}")
    return out.decode()


def show_profile(path: str, lines: int = 18) -> None:
    if not os.path.exists(path):
        print("  (no profile written)")
        return
    stats = pstats.Stats(path)
    total = stats.total_tt  # type: ignore[attr-defined]
    print(f"  profile of worker 0 (cProfile, {total:.1f} CPU s, by own time):")
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    for (file, line, name), (_, calls, own, cumulative, _) in rows[:lines]:
        where = f"{Path(file).name}:{line}" if line else file
        print(
            f"    {own / total * 100:5.1f}%  own {own:6.2f} s  cum {cumulative:6.2f} s  "
            f"{calls:>8}  {name}  ({where})"
        )


async def throughput(database: str, settings: Settings, profile: bool) -> None:
    results: list[Throughput] = []
    profile_path = os.path.join(tempfile.gettempdir(), f"fleetbench_{os.getpid()}.prof")
    for n in PROCESSES:
        results.append(await workers_throughput(database, n, settings))
        print(f"  workers x{n}: {results[-1].turns_per_s:.0f} turns/s", file=sys.stderr)
    for n in PROCESSES:
        results.append(await served_throughput(database, n, settings))
        print(f"  served x{n}: {results[-1].turns_per_s:.0f} turns/s", file=sys.stderr)
    ceiling = await pgbench(settings)
    cores = os.cpu_count() or 1
    print(
        f"\n1. Throughput over one PostgreSQL ({await _scalar('SHOW server_version')}, "
        f"synchronous_commit={await _scalar('SHOW synchronous_commit')}), {cores} cores shared "
        f"by everything (PostgreSQL, the processes, this client)"
    )
    shown = ", ".join(f"-c {c}: {t:,.0f}" for c, t in ceiling.tps.items())
    print(
        f"  ceiling: pgbench, single-row UPDATE commits, -j 2 -T {settings.pgbench_seconds}, "
        f"scale {settings.pgbench_scale}: {shown} tps; best {ceiling.best:,.0f} commits/s"
    )
    print(
        f"  {'':14} {'turns':>7} {'turns/s':>8} {'commits':>8} {'commits/s':>10} {'share':>6}"
        f"  {'core ms/turn: handrail':>22} {'postgres':>9} {'client':>7} {'rest':>6}"
        f" {'cores busy':>11}"
    )
    for r in results:
        per_s = r.turns_per_s * r.commits_per_turn
        share = per_s / ceiling.best
        busy = (r.handrail_cpu + r.postgres_cpu) / r.seconds
        mark = "✓" if share >= TARGET_SHARE else "✗"
        handrail, postgres = r.handrail_cpu / r.turns * 1000, r.postgres_cpu / r.turns * 1000
        client = r.client_cpu / r.turns * 1000
        rest = cores * 1000 / r.turns_per_s - handrail - postgres - client  # others', or idle
        print(
            f"  {r.kind + ' x' + str(r.processes):14} {r.turns:7d} {r.turns_per_s:8.0f} "
            f"{r.commits_per_turn:8.2f} {per_s:10,.0f} {share:5.2f}{mark}"
            f"  {handrail:22.2f} {postgres:9.2f} {client:7.2f} {rest:6.2f} {busy:8.2f}/{cores}"
        )
    print(
        f"  target: share = turns/s x commits/turn / pgbench's best ≥ {TARGET_SHARE}; "
        f"commits/turn counts every commit in the database (read-only ones, sweeps, session "
        f"creation) over every turn; core ms/turn: the {cores} cores' time per turn "
        f"({cores} x 1000 / turns/s) split into the CPU of handrail's processes, of their "
        f"PostgreSQL backends, of this process (the served turns' HTTP clients; for the "
        f"workers, its watching) and the rest (WAL writer, checkpointer, other work on the "
        f"machine, idle: waits on the disk's flush; below 0 where the CPU was counted over a "
        f"longer span than the turns' first to last); 'cores busy': handrail's + the "
        f"backends' CPU s over the window"
    )
    worker_turn = "worker: a decided turn resumed (the charge runs, then the answer)"
    print(f"  turn shapes: {worker_turn}; served: a user message, a read call, an answer")
    if profile:  # apart: cProfile slows the worker down
        await workers_throughput(database, 1, settings, profile_path)
        show_profile(profile_path)
        with contextlib.suppress(OSError):
            os.unlink(profile_path)


# -- part 2: a resume storm ---------------------------------------------------------------------


async def storm(database: str, settings: Settings) -> None:
    for workers in settings.storm_workers:
        await storm_once(database, settings.storm, workers)


def _read_loads(folder: Path) -> list[dict[str, int]]:
    return [json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))]


async def storm_once(database: str, count: int, workers: int) -> None:
    prefix = f"s{workers}-"
    ids = [f"{prefix}{i:05d}" for i in range(count)]
    size0 = int(await _scalar(f"SELECT pg_database_size('{database}')"))
    loads = Path(tempfile.mkdtemp(prefix="fleet-loads-"))
    async with bench_store(database) as store:
        engine = app(store)
        began = time.perf_counter()
        cards = await to_cards(engine, ids)
        setup = time.perf_counter() - began
        await _admin("CHECKPOINT")  # the heap and indexes reach their size on disk
        size1 = int(await _scalar(f"SELECT pg_database_size('{database}')"))
        decided: dict[str, float] = {}
        async with fleet() as processes, Watcher.open(database) as watcher:
            for i in range(workers):
                processes.start(
                    worker_command(database, 10 + i), env={LOADS: str(loads / f"{i}.json")}
                )
            await asyncio.sleep(3)  # started, subscribed (LISTEN), idle
            processes.check()
            rss = [rss_bytes(pid) for pid in processes.pids()]
            for pid in processes.pids():
                os.kill(pid, signal.SIGSTOP)  # frozen: the decisions land "at once" for them
            try:
                first = time.time()
                await decide(engine, cards, decided)
                last_decision = time.time()
                assert await watcher.count("completed", prefix) == 0  # nobody drained yet
            finally:
                go = time.time()
                for pid in processes.pids():
                    os.kill(pid, signal.SIGCONT)
            await watcher.until("completed", prefix, count, processes)
            completed = await watcher.times(prefix)
            await processes.stop()
    counted = _read_loads(loads)
    loaded = sum(n for c in counted for s, n in c.items() if s.startswith(prefix))
    waits = sorted(completed[s] - go for s in ids)
    seconds = max(completed.values()) - go
    print(
        f"\n2. Resume storm: {count:,} sessions waiting on an approval, decided at once, "
        f"{workers} workers"
    )
    print(
        f"  set-up: {count:,} turns submitted to their card in {setup:.1f} s "
        f"({count / setup:.0f}/s, this process, 32 at a time)"
    )
    print(
        f"  decisions: {count:,} in {last_decision - first:.1f} s "
        f"({count / (last_decision - first):.0f}/s, this process, 64 at a time)"
    )
    print(
        f"  drained by {workers} `handrail worker` (--concurrency {CONCURRENCY}), thawed at "
        f"once: {count / seconds:.0f} sessions/s, thaw to last completion {seconds:.1f} s"
    )
    print(
        f"  wait, thaw to run-completed: p50 {statistics.median(waits) * 1000:.0f} ms, "
        f"p99 {_percentile(waits, 99) * 1000:.0f} ms, slowest {waits[-1] * 1000:.0f} ms"
    )
    print(
        f"  session loads (the whole session read by a worker): {loaded / count:.2f} per "
        f"session ({loaded:,} by {len(counted)} workers"
        f"{'' if len(counted) == workers else ', some did not report'})"
    )
    print(
        f"  a waiting session: {(size1 - size0) / count / 1024:.1f} KB of database "
        f"(pg_database_size after {count:,} suspended, over the count); in the workers: "
        f"nothing (their RSS, idle: {', '.join(f'{r / 2**20:.0f}' for r in rss)} MiB)"
    )


# -- part 3: idle streams -----------------------------------------------------------------------


def _raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


async def streams(database: str, settings: Settings) -> None:
    limit = _raise_nofile()  # the server inherits it
    count = settings.streams
    if count + 100 > limit:
        raise SystemExit(f"{count} streams need more file descriptors than ulimit -n {limit}")
    port = free_port()
    async with fleet() as processes, bench_store(database) as store:
        processes.start(serve_command(database, port, 1))
        await until_up(port, processes)
        server = processes.processes[0].pid
        ids: list[str] = []

        async def create() -> None:
            connection = await _Client.to(port, 0)
            try:
                while len(ids) < count:
                    index = len(ids)  # taken before the request: no more than `count`
                    ids.append("")
                    connection.key = _key(index)  # the session is the organisation's
                    status, body = await connection.json("POST", "/sessions")
                    assert status == 201, body
                    ids[index] = body["id"]
            finally:
                connection.close()

        await asyncio.gather(*(create() for _ in range(16)))
        opened = await _stream(port, ids[0], 0)  # one first: the listener connection is opened
        await asyncio.sleep(1.0)
        before = rss_bytes(server)
        connections = [opened]
        for index, session_id in enumerate(ids[1:], 1):
            connections.append(await _stream(port, session_id, index))
            processes.check()
        await asyncio.sleep(2.0)  # every stream has read its (empty) log and waits
        during = rss_bytes(server)
        step = max(1, count // settings.sample)
        sampled = list(range(0, count, step))[: settings.sample]
        from_start: list[float] = []
        from_return: list[float] = []
        for k, index in enumerate(sampled):
            reader = connections[index].reader
            marker = f"ping-{k}-".encode()
            arrived = asyncio.create_task(_until(reader, marker))
            t0 = time.perf_counter()
            await store.append_events(ids[index], [{"type": "bench-ping", "mark": marker.decode()}])
            t1 = time.perf_counter()
            t2 = await asyncio.wait_for(arrived, 10)
            from_start.append((t2 - t0) * 1000)
            from_return.append((t2 - t1) * 1000)
            await asyncio.sleep(0.01)
        for connection in connections:
            connection.close()
        processes.check()
    print(
        f"\n3. Idle streams: {count:,} followed streams open on one `handrail serve` (PostgreSQL)"
    )
    print(
        f"  server RSS {before / 2**20:.0f} MiB with one stream open, {during / 2**20:.0f} MiB "
        f"with {count:,}: {(during - before) / (count - 1) / 1024:.1f} KB per stream"
    )
    print(
        f"  append -> delivery on {len(sampled)} of them, one at a time while the rest idle "
        f"(appended by this process, over LISTEN/NOTIFY):"
    )
    for label, values in (
        ("from the append's start", from_start),
        ("from its return", from_return),
    ):
        print(
            f"    {label:24} p50 {statistics.median(values):6.1f} ms  p99 "
            f"{_percentile(values, 99):6.1f} ms  max {max(values):6.1f} ms"
        )


async def _stream(port: int, session_id: str, index: int) -> _Connection:
    connection = await _Client.to(port, index)
    connection.send("GET", f"/sessions/{session_id}/events?follow=true", stream=True)
    status, _ = await connection.head()
    if status != 200:
        connection.close()
        raise RuntimeError(f"a stream answered {status}")
    return connection


async def _until(reader: asyncio.StreamReader, marker: bytes) -> float:
    """Read `reader` until `marker` arrives; the time it did."""
    seen = b""
    while marker not in seen:
        chunk = await reader.read(65536)
        if not chunk:
            raise RuntimeError("a stream closed")
        seen = seen[-len(marker) :] + chunk
    return time.perf_counter()


# -- main ---------------------------------------------------------------------------------------


def cli(args: list[str], profile_to: str | None) -> None:
    """Run the `handrail` command (this worktree's), under cProfile when `profile_to` is set."""
    from handrail.cli import app as handrail

    counts = os.environ.get(LOADS)
    if counts is not None:  # the storm: how often this process reads a whole session
        count_loads(counts)
    if profile_to is None:
        handrail(args=args, prog_name="handrail")
        return
    profiler = cProfile.Profile(time.process_time)  # CPU, not the turns' waits on the database
    try:
        profiler.runcall(handrail, args=args, prog_name="handrail")
    finally:
        profiler.dump_stats(profile_to)


LOADS = "HANDRAIL_BENCH_LOADS"
"""Set for a worker process: the file it writes its session loads to at exit (JSON, by id)."""


def count_loads(path: str) -> None:
    """Count `PostgresStore.load` calls by session in this process, written to `path` at exit."""
    import atexit
    from collections import Counter

    from handrail.store import PostgresStore

    loads: Counter[str] = Counter()
    load = PostgresStore.load

    async def counted(self: Any, session_id: str) -> Any:
        loads[session_id] += 1
        return await load(self, session_id)

    PostgresStore.load = counted  # type: ignore[method-assign]
    atexit.register(lambda: Path(path).write_text(json.dumps(loads)))


async def main_async(parts: list[str], settings: Settings, profile: bool) -> None:
    database = f"fleetbench_{os.getpid()}"
    async with scratch_database(database):
        if "throughput" in parts:
            await throughput(database, settings, profile)
        if "storm" in parts:
            await storm(database, settings)
        if "streams" in parts:
            await streams(database, settings)


@contextlib.contextmanager
def _on_sigterm() -> Iterator[None]:
    """SIGTERM ends the bench as Ctrl-C does, so that its clean-up runs."""

    def raise_interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer sessions, streams, seconds")
    parser.add_argument(
        "--part",
        action="append",
        choices=("throughput", "storm", "streams"),
        help="run only these parts (repeatable; default: all)",
    )
    parser.add_argument("--profile", action="store_true", help="profile worker 0 (part 1)")
    parser.add_argument("--storm", type=int, help="sessions decided at once in part 2")
    parser.add_argument(
        "--storm-workers",
        help="worker counts part 2 runs with, comma-separated (default 4)",
    )
    parser.add_argument("--cli", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cli:
        cli(args.rest, args.profile_to)
        return
    settings = QUICK if args.quick else FULL
    if args.storm is not None:
        settings = dataclasses.replace(settings, storm=args.storm)
    if args.storm_workers:
        workers = tuple(int(n) for n in args.storm_workers.split(","))
        settings = dataclasses.replace(settings, storm_workers=workers)
    os.environ.setdefault("HANDRAIL_AUDIT_KEY", AUDIT_KEY)  # this process's store too
    parts = args.part or ["throughput", "storm", "streams"]
    with _on_sigterm():
        asyncio.run(main_async(parts, settings, args.profile))


if __name__ == "__main__":
    main()
