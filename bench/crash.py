"""`python -m bench.crash`: kill workers for real (SIGKILL) and check every side effect.

Not a test (never part of `make test`): it prints numbers and checks, and exits non-zero when
a check fails. Both parts run on SQLite (a file in a temporary directory) and on PostgreSQL (a
server at $HANDRAIL_BENCH_PG_DSN, default postgresql://postgres@127.0.0.1:5432/test, in a
schema of the benchmark's own, dropped at the end; skipped, loudly, when no server answers).
Models are scripted (`FunctionModel`); tools sleep a few random milliseconds around their
effect, so that kills land inside them.

The domain. Three tools act on an order (the session id is the order): `payments.charge`
(write, gated: a person approves it; not idempotent), `orders.ship` (write, approval="auto",
idempotent: the carrier deduplicates on the idempotency key) and `orders.post` (write,
approval="auto", not idempotent). Sessions come in four kinds, one after the other:
A = one response with two parallel calls [charge, ship]; B = [charge, post]; C = [ship, post]
(ungated); D = post, then charge in a second response. One gated session in five is rejected
by the desk (a real "no"). Every effect is a line appended to a ledger file (EFFECTS) under an
exclusive `flock`, flushed and fsynced, so it survives the kill: `TOOL SESSION` for the
non-idempotent tools, `orders.ship SESSION KEY` for the ship, appended only if that key is not
in the ledger yet (as a carrier deduplicates). Every call's start and end (also a deduplicated
one's) go to a second file, for the counts of re-runs and of calls cut off by a kill.

1. Kill loop. Worker processes run `handrail.Worker(engine, poll_interval=0.1, concurrency=4)`
   (`Engine(worker_id=..., lease_ttl=1.0)`) on the shared store. SQLite: ONE worker process;
   PostgreSQL: FOUR, one of which (`w0`) is killed again and again. `w0` also submits the
   sessions (`engine.submit`, so turns start, and first responses run, in the process that gets
   killed), released a few at a time as the kills go on (1.5 per kill). A "desk" process,
   another process again, loops: lists the suspended sessions
   (`store.list(status="suspended")`), reads their cards (`engine.session`) and decides them
   with `engine.resolve`: approves charges (rejects those of the sessions picked for a "no"),
   and for a `recovery` card (a non-idempotent call that may have run) checks the ledger, as
   one would check the bank: the effect is there -> `Reject` or `Answer(output=<what it
   returned>)` (half each), not there -> `Approve` (retry). Every rejection (and answer) is
   written to a rejections file before `resolve`. The desk is killed too, every 10th worker
   kill, and restarted.
   Each kill of `w0`: 70% at a random moment (a random sleep of 0-0.6 s after the process said
   it is ready, or, one in ten, 0-0.4 s after it was started, while it starts up), 30% at a
   chosen point: it kills itself (SIGKILL) the n-th time (n = 1-2) it gets to that point,
   inside a tool before or after its effect (`charge-started`, `charge-done`, `post-...`,
   `ship-...`) or in the model once a call's result is in (`after-result`; if the point does
   not come within 1.5 s, it is killed there and then, as a random kill). After every kill the
   process is restarted at once, one time in four under a new worker id, else under its own.
   After the last kill, the workers finish (at most 120 s, 60 s with --quick), then stop
   (SIGTERM). Checked against the ledger: every session `completed` in the store; each charge
   exactly once per session, or never if the desk rejected it; each post exactly once per
   session; each ship exactly once per session (one idempotency key, one line); no rejected
   call ran (a rejected approval: no charge line; a rejected or answered recovery card: the
   one line that was there when the desk looked, and no second); every planned "no" was
   recorded; no effect for a session that was never planned. Violations must be 0.
2. Recovery time after a kill. A worker drives a turn (a session of one call, submitted
   through that worker's stdin so that its turn runs there), and holds inside the tool, before
   or after its effect; this process then kills it (SIGKILL) and restarts it at once. Timed
   from just before the SIGKILL until the store shows the session's turn finished
   (`completed`: the idempotent ship ran again with its key) or suspended again (`suspended`:
   the non-idempotent post became a recovery card), polled every 5 ms from this process.
   SQLite: one worker, restarted under the SAME worker id (its `Worker.run` calls
   `Engine.reclaim`, which adopts the dead incarnation's leases, keyed by worker id, so it
   need not wait for them to lapse), then again under a NEW worker id (it must wait for the
   lease to lapse: lease_ttl, then its next sweep). PostgreSQL: four workers, `w0` killed and
   restarted, the same two ways; the three others may take the session over once its lease
   lapses. For the idempotent samples the ledger says which worker ran the call again.
   Median and max over 20 kills with the same worker id and 10 with a new one (6 and 3 with
   --quick); the interpreter's start-up is in the time (a restarted process pays it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import math
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.durability import Places, _pg_server, _postgres_version, handrail_store
from handrail import Agent, Answer, Approve, Engine, Reject, Runtime, ToolContext, Worker, tool
from handrail.exceptions import HandrailError
from handrail.models import ModelRequest
from handrail.store import PostgresStore, SqliteStore
from handrail.testing import FunctionModel, call

ROOT = Path(__file__).resolve().parent.parent  # where `-m bench.crash` resolves
LEASE_TTL = 1.0  # seconds: Engine(lease_ttl=...)
POLL = 0.1  # seconds: Worker(poll_interval=...) and the SQLite store's wake-up polling
CONCURRENCY = 4  # Worker(concurrency=...)
WORKERS = {"sqlite": 1, "postgres": 4}
CHOSEN = 0.3  # part 1: the share of kills at a chosen point
CHOSEN_WAIT = 1.5  # part 1: seconds a chosen point may take to come, after "ready"
RANDOM_KILL = 0.6  # part 1: a random kill comes 0-0.6 s after "ready"
STARTUP_KILL = 0.4  # part 1: ... or, one in ten, 0-0.4 s after the start
NEW_ID = 0.25  # part 1: the share of restarts under a new worker id
POINTS = (
    "charge-started",
    "charge-done",
    "post-started",
    "post-done",
    "ship-started",
    "ship-done",
    "after-result",
)
CHARGE, SHIP, POST = "payments.charge", "orders.ship", "orders.post"
OUTPUT = {CHARGE: "charged {}", SHIP: "shipped {}", POST: "posted {}"}
NAMES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


@dataclass
class Settings:
    kills: int  # part 1: worker kills per store
    sessions: int  # part 1: sessions per store
    finish: float  # part 1: seconds the workers get to finish after the last kill
    samples: int  # part 2: kills per row


FULL = Settings(kills=200, sessions=300, finish=120.0, samples=20)
QUICK = Settings(kills=30, sessions=60, finish=60.0, samples=6)


# -- the domain ---------------------------------------------------------------------------------


def sessions(count: int) -> list[str]:
    """The planned sessions: kinds A, B, C, D in turn."""
    return [f"{'ABCD'[i % 4]}-{i:04d}" for i in range(count)]


def rejected(session: str) -> bool:
    """Whether the desk says no to this session's charge (one gated session in five)."""
    kind, number = session.split("-")
    return kind in "ABD" and int(number) % 5 == 0


def expected(session: str) -> dict[str, int]:
    """How many effects each tool must leave for the session."""
    made = {"A": (CHARGE, SHIP), "B": (CHARGE, POST), "C": (SHIP, POST), "D": (POST, CHARGE)}
    counts = {name: int(name in made[session[0]]) for name in (CHARGE, SHIP, POST)}
    if rejected(session):
        counts[CHARGE] = 0
    return counts


def append(path: str, line: str, *, unless_present: bool = False, sync: bool = True) -> bool:
    """Append one line under an exclusive lock, flushed and fsynced; False if deduplicated."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released by the kernel if the process dies here
        if unless_present:
            f.seek(0)
            if line in f.read().splitlines():
                return False
        f.write(line + "\n")
        f.flush()
        if sync:
            os.fsync(f.fileno())
    return True


def lines(path: str) -> list[str]:
    p = Path(path)
    return p.read_text().splitlines() if p.exists() else []


def ran(ledger: str, name: str, session: str) -> bool:
    """Whether the ledger holds an effect of `tool` for `session` (the bank's answer)."""
    return any(line.split()[:2] == [name, session] for line in lines(ledger))


class Crash:
    """Where this process kills itself (part 1) or holds for the orchestrator's kill (part 2)."""

    def __init__(self, spec: str) -> None:
        point, _, times = spec.partition(":")
        self.point, self.left = point, int(times or 1)
        self.holds: dict[str, str] = {}  # session -> the point where its turn waits for a kill

    async def at(self, point: str, session: str) -> None:
        if self.point == point:
            self.left -= 1
            if self.left <= 0:
                os.kill(os.getpid(), signal.SIGKILL)
        if self.holds.get(session) == point:
            print(f"holding {session} {point}", flush=True)
            await asyncio.sleep(3600)  # killed in here


def build(store: Any, job: dict[str, Any], crash: Crash, worker_id: str) -> Engine:
    """The engine of every process: the three tools and the scripted model."""
    ledger, attempts = job["ledger"], job["attempts"]

    async def jitter() -> None:
        await asyncio.sleep(random.uniform(0, 0.03))

    async def effect(name: str, order: str, key: str | None = None) -> str:
        short = name.split(".")[1]
        append(attempts, f"{name} {order} {key or '-'} {worker_id} start", sync=False)
        await jitter()
        await crash.at(f"{short}-started", order)
        line = f"{name} {order}" + (f" {key}" if key else "")
        append(ledger, line, unless_present=key is not None)
        await crash.at(f"{short}-done", order)
        await jitter()
        append(attempts, f"{name} {order} {key or '-'} {worker_id} end", sync=False)
        return OUTPUT[name].format(order)

    @tool(name=CHARGE, permission="write")
    async def charge(order: str) -> str:
        """Charge an order (gated: a person approves it; not idempotent)."""
        return await effect(CHARGE, order)

    @tool(name=SHIP, permission="write", approval="auto", idempotent=True)
    async def ship(ctx: ToolContext[None], order: str) -> str:
        """Ship an order (the carrier deduplicates on the idempotency key)."""
        return await effect(SHIP, order, ctx.idempotency_key)

    @tool(name=POST, permission="write", approval="auto")
    async def post(order: str) -> str:
        """Post an order (runs at once; not idempotent: a second call posts twice)."""
        return await effect(POST, order)

    first = {
        "A": (CHARGE, SHIP),
        "B": (CHARGE, POST),
        "C": (SHIP, POST),
        "D": (POST,),
        "S": (SHIP,),
        "P": (POST,),
    }

    async def answer(request: ModelRequest) -> Any:
        await asyncio.sleep(random.uniform(0, 0.01))
        order = request.messages[0].text.split()[-1]
        done = {p.name for m in request.messages for p in m.tool_calls}
        if not done:
            return [call(name, order=order) for name in first[order[0]]]
        await crash.at("after-result", order)
        if order[0] == "D" and CHARGE not in done:
            return call(CHARGE, order=order)
        return f"Order {order} done."

    agent = Agent("desk", tools=[charge, ship, post])
    runtime = Runtime(model=FunctionModel(answer))
    return Engine(agent, store=store, runtime=runtime, worker_id=worker_id, lease_ttl=LEASE_TTL)


async def open_store(job: dict[str, Any]) -> Any:
    if job["kind"] == "sqlite":
        return SqliteStore(job["where"], poll_interval=POLL)
    from bench.stores import PG_DSN

    return await PostgresStore.connect(PG_DSN, schema=job["where"], pool_size=4)


# -- the processes ------------------------------------------------------------------------------


async def _commands(engine: Any, crash: Crash, tasks: set[asyncio.Task[Any]]) -> None:
    """Part 2: `submit SESSION POINT` lines on stdin start a turn that holds at POINT."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        _, session, point = line.decode().split()
        crash.holds[session] = point
        task = asyncio.create_task(_submit(engine, session))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def _submit(engine: Any, session: str) -> None:
    try:
        async for _ in engine.submit(session, f"Please process order {session}"):
            pass
    except Exception as exc:  # the workers take it from wherever it stopped
        print(f"submit {session}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


async def _submitter(engine: Any, job: dict[str, Any]) -> None:
    """Part 1: submit the planned sessions, as the quota allows (only `w0` does)."""
    mine = sessions(job["sessions"])
    done: set[str] = set()
    gate = asyncio.Semaphore(2)

    async def one(session: str) -> None:
        async with gate:
            try:
                if await engine.store.load(session) is None:
                    await _submit(engine, session)
            except Exception as exc:  # the store was away a moment: the next round tries again
                print(f"load {session}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                return
            done.add(session)

    while len(done) < len(mine):
        quota = int((lines(job["quota"]) or ["0"])[0])
        todo = [s for s in sessions(quota) if s not in done]
        await asyncio.gather(*(one(s) for s in todo))
        await asyncio.sleep(0.1)


async def role_worker(job: dict[str, Any]) -> None:
    crash = Crash(os.environ.get("CRASH_AT", ""))
    store = await open_store(job)
    engine = build(store, job, crash, job["worker_id"])
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    tasks: set[asyncio.Task[Any]] = set()
    helpers = [asyncio.create_task(_commands(engine, crash, tasks))]
    if job["submits"]:
        helpers.append(asyncio.create_task(_submitter(engine, job)))
    print("ready", flush=True)
    try:
        await Worker(engine, poll_interval=POLL, concurrency=CONCURRENCY).run(stop)
    finally:
        for task in [*helpers, *tasks]:
            task.cancel()
        await asyncio.gather(*helpers, *tasks, return_exceptions=True)
        await store.close()


def _decide(card: Any, session: str, job: dict[str, Any]) -> Any:
    """What the person at the desk decides; rejections (and answers) are written down first."""
    name, call_id = card.tool_name, card.tool_call_id
    record = f"{session} {name} {call_id} {card.kind}"
    if card.kind == "recovery":
        if name == SHIP:  # an idempotent call runs again with its key: never a card
            append(job["rejections"], f"unexpected {record}")
        if not ran(job["ledger"], name, session):
            return Approve(by="desk")  # it did not happen: retry
        if random.random() < 0.5:
            append(job["rejections"], f"reject {record}")
            return Reject(reason="it went through", by="desk")
        append(job["rejections"], f"answer {record}")
        return Answer(output=OUTPUT[name].format(session), by="desk")
    if card.kind == "approval" and name == CHARGE:
        if rejected(session):
            append(job["rejections"], f"reject {record}")
            return Reject(reason="the customer cancelled", by="desk")
        return Approve(by="desk")
    append(job["rejections"], f"unexpected {record}")
    raise AssertionError(f"unexpected card {card.kind} on {name}")


async def role_desk(job: dict[str, Any]) -> None:
    store = await open_store(job)
    engine = build(store, job, Crash(""), "desk")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    looked: dict[str, int] = {}  # session -> the version seen with nothing to decide
    print("ready", flush=True)
    try:
        while not stop.is_set():
            for summary in await store.list(status="suspended", limit=job["sessions"] + 10):
                if looked.get(summary.id) == summary.version:
                    continue
                try:
                    state = await engine.session(summary.id)
                    for call_id, card in list(state.pending.items()):
                        decision = _decide(card, summary.id, job)
                        await engine.resolve(summary.id, call_id, decision)
                    looked[summary.id] = summary.version
                except HandrailError:
                    pass  # the session moved on meanwhile: the next round sees it again
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), random.uniform(0.02, 0.15))
    finally:
        await store.close()


ROLES = {"worker": role_worker, "desk": role_desk}


class Proc:
    """A child process of this benchmark (`python -m bench.crash --role ...`)."""

    def __init__(self, role: str, job: dict[str, Any], log: Path, crash_at: str = "") -> None:
        self.role, self.job, self.log, self.crash_at = role, job, log, crash_at
        self.lines: asyncio.Queue[str] = asyncio.Queue()
        self.process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> Proc:
        env = {**os.environ, "CRASH_AT": self.crash_at}
        with self.log.open("a") as err:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.crash",
                "--role",
                self.role,
                "--job",
                json.dumps(self.job),
                cwd=ROOT,
                env=env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
            )
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        while line := await self.process.stdout.readline():
            await self.lines.put(line.decode().strip())
        await self.lines.put("")  # it exited: no line will come

    async def line(self, prefix: str, wait: float) -> str | None:
        """The next line starting with `prefix`, or None if none comes within `wait` s."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                while line := await self.lines.get():
                    if line.startswith(prefix):
                        return line
        return None

    def send(self, line: str) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(f"{line}\n".encode())

    @property
    def returncode(self) -> int | None:
        assert self.process is not None
        return self.process.returncode

    async def kill(self) -> int:
        """SIGKILL (unless it died already); its exit status."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGKILL)
        return await self.wait()

    async def wait(self) -> int:
        assert self.process is not None
        code = await self.process.wait()
        if self._reader is not None:
            await self._reader
        return code

    async def stop(self, grace: float = 30.0) -> int:
        """SIGTERM, then SIGKILL if it has not stopped within `grace` seconds."""
        assert self.process is not None
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    return await self.wait()
        return await self.kill()


def child(role: str, job: str) -> None:
    asyncio.run(ROLES[role](json.loads(job)))


# -- part 1: the kill loop ----------------------------------------------------------------------


@dataclass
class KillLoop:
    kind: str
    kills: int = 0
    chosen: int = 0  # of the kills: at a chosen point
    startup: int = 0  # of the kills: while the process started up
    new_ids: int = 0  # restarts under a new worker id
    desk_kills: int = 0
    sessions: int = 0
    completed: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    checked: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    notes: dict[str, int] = field(default_factory=dict)


async def kill_loop(kind: str, places: Places, settings: Settings) -> KillLoop:
    started = time.perf_counter()
    result = KillLoop(kind, sessions=settings.sessions)
    where = await places.location(kind, "crash_kill")
    directory = places.directory
    quota = directory / f"{kind}.quota"
    job = {
        "kind": kind,
        "where": where,
        "ledger": str(directory / f"{kind}.effects"),
        "attempts": str(directory / f"{kind}.attempts"),
        "rejections": str(directory / f"{kind}.rejections"),
        "quota": str(quota),
        "sessions": settings.sessions,
    }
    log = directory / f"{kind}.log"
    per_kill = settings.sessions / settings.kills
    quota.write_text("8")

    def worker(slot: int, worker_id: str, crash_at: str = "") -> Proc:
        return Proc("worker", {**job, "submits": slot == 0, "worker_id": worker_id}, log, crash_at)

    async with handrail_store(kind, where) as store:  # made here: schema before the workers
        await store.list(limit=1)
        others = [await worker(slot, f"w{slot}").start() for slot in range(1, WORKERS[kind])]
        desk = await Proc("desk", job, log).start()
        victim_id, generation = "w0", 0
        victim: Proc | None = None
        try:
            while result.kills < settings.kills:
                point = ""
                if random.random() < CHOSEN:
                    point = f"{random.choice(POINTS)}:{random.randint(1, 2)}"
                victim = await worker(0, victim_id, point).start()
                if point:
                    await victim.line("ready", 20.0)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(CHOSEN_WAIT):
                            await victim.wait()
                    result.chosen += victim.returncode == -signal.SIGKILL
                elif random.random() < 0.1:
                    await asyncio.sleep(random.uniform(0, STARTUP_KILL))
                    result.startup += victim.returncode is None
                else:
                    await victim.line("ready", 20.0)
                    await asyncio.sleep(random.uniform(0, RANDOM_KILL))
                code = await victim.kill()
                if code != -signal.SIGKILL:
                    result.violations.append(f"worker w0 exited by itself ({code}); see {log}")
                result.kills += 1
                quota.write_text(
                    str(min(settings.sessions, 8 + math.ceil(result.kills * per_kill)))
                )
                if desk.returncode is not None:
                    result.violations.append(f"the desk exited by itself ({desk.returncode})")
                    desk = await Proc("desk", job, log).start()
                if result.kills % 10 == 0:
                    await desk.kill()
                    result.desk_kills += 1
                    desk = await Proc("desk", job, log).start()
                if random.random() < NEW_ID:
                    generation += 1
                    victim_id = f"w0-{generation}"
                    result.new_ids += 1
                for other in others:
                    if other.returncode is not None:
                        raise RuntimeError(f"worker {other.job['worker_id']} died; see {log}")
            quota.write_text(str(settings.sessions))
            victim = await worker(0, victim_id).start()
            deadline = time.perf_counter() + settings.finish
            while time.perf_counter() < deadline:
                done = await store.list(status="completed", limit=settings.sessions + 10)
                if len(done) >= settings.sessions:
                    break
                await asyncio.sleep(0.2)
        finally:
            for proc in [*others, desk, *([victim] if victim else [])]:
                if proc.returncode is None:
                    await proc.stop()
        every = await store.list(limit=settings.sessions + 100)
        result.statuses = Counter(s.status for s in every)
        result.completed = result.statuses["completed"]
        status = {s.id: s.status for s in every}
    result.seconds = time.perf_counter() - started
    check_ledger(result, job, status)
    return result


def check_ledger(result: KillLoop, job: dict[str, Any], status: dict[str, str]) -> None:
    planned = sessions(result.sessions)
    ledger = lines(job["ledger"])
    counts = Counter(tuple(line.split()[:2]) for line in ledger)
    bad = result.violations
    for session in planned:
        if status.get(session) != "completed":
            bad.append(f"{session}: {status.get(session, 'never stored')}, not completed")
        for name, want in expected(session).items():
            result.checked += 1
            if counts[(name, session)] != want:
                bad.append(f"{session}: {name} ran {counts[(name, session)]} times, not {want}")
    for name, session in set(counts) - {(t, s) for s in planned for t in expected(s)}:
        bad.append(f"{session}: {name} ran, for no planned session")
    said_no = set()
    decisions = Counter()
    for line in lines(job["rejections"]):
        verb, session, name, _, card = line.split()
        decisions[f"{verb} {card}"] += 1
        result.checked += 1
        if verb == "unexpected":
            bad.append(f"{session}: an unexpected {card} card on {name}")
        elif card == "approval":
            said_no.add(session)
            if counts[(name, session)]:
                bad.append(f"{session}: the rejected {name} ran")
        elif counts[(name, session)] != 1:  # rejected/answered once the effect was in
            bad.append(f"{session}: {name} {verb}ed on recovery, ran {counts[(name, session)]}x")
    for session in planned:
        if rejected(session) and session not in said_no:
            result.checked += 1
            bad.append(f"{session}: the desk's planned 'no' is not recorded")
    runs = [line.split() for line in lines(job["attempts"])]
    tried = Counter((r[0], r[1]) for r in runs if r[4] == "start")
    ends = sum(r[4] == "end" for r in runs)
    result.notes = {
        "tool calls started": sum(tried.values()),
        "by w0": sum(r[4] == "start" and r[3].startswith("w0") for r in runs),
        "cut off by a kill": sum(tried.values()) - ends,
        "recovery cards rejected": decisions["reject recovery"],
        "recovery cards answered": decisions["answer recovery"],
        "charges rejected": decisions["reject approval"],
        "ship re-runs (deduplicated by key)": sum(
            n - 1 for (t, _), n in tried.items() if t == SHIP and n > 1
        ),
        "post/charge retries after a recovery card": sum(
            n - 1 for (t, _), n in tried.items() if t != SHIP and n > 1
        ),
    }


def show_kill_loops(results: list[KillLoop]) -> None:
    print(
        f"{'store':<11}{'kills':>6}{'chosen':>7}{'desk':>5}{'sessions':>9}{'completed':>10}"
        f"{'effects':>8}{'violations':>11}{'wall s':>8}"
    )
    for r in results:
        print(
            f"{NAMES[r.kind]:<11}{r.kills:>6}{r.chosen:>7}{r.desk_kills:>5}{r.sessions:>9}"
            f"{r.completed:>10}{r.checked:>8}{len(r.violations):>11}{r.seconds:>8.1f}"
        )
    for r in results:
        notes = ", ".join(f"{v} {k}" for k, v in r.notes.items())
        print(
            f"  {NAMES[r.kind]}: {r.startup} kills during start-up, {r.new_ids} restarts under a "
            f"new worker id; {notes}"
        )
        if r.completed != r.sessions:
            print(f"  {NAMES[r.kind]}: statuses {dict(r.statuses)}")
        for violation in r.violations[:20]:
            print(f"  ✗ {NAMES[r.kind]}: {violation}")
        if len(r.violations) > 20:
            print(f"  ✗ ... and {len(r.violations) - 20} more")


# -- part 2: recovery time ----------------------------------------------------------------------


@dataclass
class Recovery:
    kind: str
    same_id: bool
    seconds: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    by_restarted: int = 0  # idempotent samples: ran again by the restarted worker
    idempotent: int = 0
    lost: list[str] = field(default_factory=list)


async def recovery_times(kind: str, places: Places, settings: Settings) -> list[Recovery]:
    where = await places.location(kind, "crash_recovery")
    directory = places.directory
    job = {
        "kind": kind,
        "where": where,
        "ledger": str(directory / f"{kind}-r.effects"),
        "attempts": str(directory / f"{kind}-r.attempts"),
        "rejections": str(directory / f"{kind}-r.rejections"),
        "quota": "",
        "sessions": 0,
        "submits": False,
    }
    log = directory / f"{kind}-r.log"
    rows = []
    victim: Proc | None = None
    async with handrail_store(kind, where) as store:
        await store.list(limit=1)
        others = [
            await Proc("worker", {**job, "worker_id": f"w{slot}"}, log).start()
            for slot in range(1, WORKERS[kind])
        ]
        try:
            n = 0
            for same_id in (True, False):
                row = Recovery(kind, same_id)
                rows.append(row)
                worker_id = "w0"
                victim = await Proc("worker", {**job, "worker_id": worker_id}, log).start()
                await victim.line("ready", 20.0)
                for i in range(settings.samples if same_id else settings.samples // 2):
                    n += 1
                    session = f"{'SP'[i % 2]}-{n:04d}"
                    name = "ship" if session[0] == "S" else "post"
                    point = f"{name}-{('started', 'done')[i // 2 % 2]}"
                    victim.send(f"submit {session} {point}")
                    if await victim.line(f"holding {session}", 20.0) is None:
                        raise RuntimeError(f"{session} never reached {point}; see {log}")
                    killed = time.monotonic()
                    await victim.kill()
                    if not same_id:
                        worker_id = f"w0-{n}"
                    victim = await Proc("worker", {**job, "worker_id": worker_id}, log).start()
                    status = await _settled(store, session, within=20.0)
                    if status is None:
                        row.lost.append(session)
                        continue
                    row.seconds.append(time.monotonic() - killed)
                    row.outcomes[status] += 1
                    if session[0] == "S":
                        row.idempotent += 1
                        runs = [line.split() for line in lines(job["attempts"])]
                        last = [r[3] for r in runs if r[1] == session and r[4] == "start"][-1]
                        row.by_restarted += last == worker_id
                    await victim.line("ready", 20.0)
                await victim.stop()
        finally:
            for proc in others:
                await proc.stop()
            if victim is not None and victim.returncode is None:
                await victim.stop()
    return rows


async def _settled(store: Any, session: str, within: float) -> str | None:
    """Poll until the session's turn is over or suspended again; its status, or None."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        record = await store.load(session)
        if record is not None and record.status in ("completed", "suspended", "failed"):
            return record.status
        await asyncio.sleep(0.005)
    return None


def show_recovery(rows: list[Recovery]) -> None:
    print(
        f"{'store':<11}{'workers':>8}  {'restarted as':<14}{'kills':>6}{'median s':>9}"
        f"{'max s':>7}  outcome"
    )
    for r in rows:
        if not r.seconds:
            print(f"{NAMES[r.kind]:<11} no sample recovered ({len(r.lost)} lost)")
            continue
        who = "same worker id" if r.same_id else "new worker id"
        outcome = ", ".join(f"{n} {s}" for s, n in sorted(r.outcomes.items()))
        ran_again = f"; ship re-run by the restarted w0: {r.by_restarted}/{r.idempotent}"
        print(
            f"{NAMES[r.kind]:<11}{WORKERS[r.kind]:>8}  {who:<14}{len(r.seconds):>6}"
            f"{statistics.median(r.seconds):>9.2f}{max(r.seconds):>7.2f}  {outcome}{ran_again}"
        )
        for session in r.lost:
            print(f"  ✗ {NAMES[r.kind]}: {session} not finished nor suspended within 20 s")


# -- main ---------------------------------------------------------------------------------------


async def main(quick: bool) -> int:
    settings = QUICK if quick else FULL
    begun = time.perf_counter()
    postgres = await _postgres_version()
    kinds = ["sqlite"]
    print(
        f"handrail crash bench; SQLite, {'PostgreSQL ' + postgres if postgres else 'no PostgreSQL'}"
    )
    if postgres:
        kinds.append("postgres")
    else:
        banner = f"PostgreSQL: SKIPPED (no server at {_pg_server()}): only SQLite was checked"
        print(f"\n{'!' * len(banner)}\n{banner}\n{'!' * len(banner)}")
    print(
        f"lease_ttl {LEASE_TTL} s, Worker poll_interval {POLL} s, concurrency {CONCURRENCY}; "
        f"workers: SQLite 1, PostgreSQL 4 (w0 killed)"
    )
    loops: list[KillLoop] = []
    recoveries: list[Recovery] = []
    with tempfile.TemporaryDirectory(prefix="crashbench-") as directory:
        places = Places(Path(directory))
        try:
            print(
                f"\n1. Kill loop: {settings.kills} SIGKILLs of a worker per store, "
                f"{settings.sessions} sessions"
            )
            for kind in kinds:
                loops.append(await kill_loop(kind, places, settings))
            show_kill_loops(loops)
            print(
                "\n2. Recovery time: SIGKILL of the worker driving a turn (inside the tool) "
                "-> turn completed or suspended again"
            )
            for kind in kinds:
                recoveries += await recovery_times(kind, places, settings)
            show_recovery(recoveries)
        finally:
            await places.drop_schemas()
    violations = sum(len(r.violations) for r in loops) + sum(len(r.lost) for r in recoveries)
    print(
        f"\n{'✓' if not violations else '✗'} {violations} violations; "
        f"{time.perf_counter() - begun:.0f} s in all"
    )
    if not postgres:
        print(f"!!! PostgreSQL was SKIPPED (no server at {_pg_server()})")
    return 1 if violations else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.crash", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer kills, sessions, samples")
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        child(args.role, args.job)
    else:
        sys.exit(asyncio.run(main(args.quick)))
