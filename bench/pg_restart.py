"""`python -m bench.pg_restart`: restart PostgreSQL under a running fleet; check every effect.

**It restarts the PostgreSQL server** (`pg_ctlcluster --skip-systemctl-redirect 15 main
restart`, the cluster set with `--cluster`): never run it where anyone else uses that server.
Not a test (never part of `make test`): it prints what happened and exits non-zero when a
check fails. `--no-restart` runs the same load without the restart (a dry run of the
harness).

The load. `--workers` worker processes run `handrail.Worker(engine, poll_interval=0.2,
concurrency=8)` (`Engine(worker_id=wN, lease_ttl=3.0)`) on one `PostgresStore` schema of the
benchmark's own (dropped at the end). This process submits `--sessions` sessions, a few at a
time, with its own engine; each turn's one response calls three tools in parallel:
`payments.charge` (not idempotent), `orders.ship` (idempotent: the carrier deduplicates on
the idempotency key) and `payments.refund` (gated: a person approves it). A desk in this
process approves every approval card, and answers a recovery card (a call that may have
run) from the ledger, as one would check with the bank: the effect is there -> `Answer`, it
is not -> `Approve` (run it). The resumed turns run on the workers (a decision wakes them).
Each tool sleeps a few random milliseconds around its effect, so that the restart lands
inside calls. Every effect is a line in a ledger file (flock, fsync).

The fault. Once the load runs, the server is restarted (every connection of every process
is cut; the server refuses connections for a moment). The engines retry their store calls
(`StoreRetry`), a turn whose store stays away longer is left for recovery
(`StoreUnavailableError`), the workers' sweeps and wake-ups take the sessions up again, and
a session whose first message was never stored is submitted again (as a client retries).

Checked at the end (at most `--timeout` s): every session `completed` (none `failed`),
nothing pending; per session exactly one charge, one ship and one refund in the ledger.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import fcntl
import logging
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from handrail import Agent, Engine, Runtime, ToolContext, tool
from handrail.models import ModelRequest
from handrail.testing import FunctionModel, call

DSN = os.environ.get("HANDRAIL_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def append(path: str, line: str, *, unless_present: bool = False) -> None:
    """Append `line` to the ledger under an exclusive lock (once only, if `unless_present`)."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            if unless_present:
                f.seek(0)
                if line in f.read().splitlines():
                    return
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines() if Path(path).exists() else []


def build(store: Any, ledger: str, worker_id: str) -> Any:
    """The engine every process runs: the three tools, a model that calls them, then answers."""

    async def jitter() -> None:
        await asyncio.sleep(random.uniform(0, 0.05))

    @tool(name="payments.charge", permission="write", approval="auto")
    async def charge(ctx: ToolContext[None], order: str) -> str:
        """Charge an order (not idempotent)."""
        await jitter()
        append(ledger, f"charge {ctx.session_id} {ctx.idempotency_key}")
        await jitter()
        return f"charged {order}"

    @tool(name="orders.ship", permission="write", approval="auto", idempotent=True)
    async def ship(ctx: ToolContext[None], order: str) -> str:
        """Ship an order (the carrier deduplicates on the idempotency key)."""
        await jitter()
        append(ledger, f"ship {ctx.session_id} {ctx.idempotency_key}", unless_present=True)
        await jitter()
        return f"shipped {order}"

    @tool(name="payments.refund", permission="write", approval="required")
    async def refund(ctx: ToolContext[None], order: str) -> str:
        """Refund an order, once a person approved it."""
        await jitter()
        append(ledger, f"refund {ctx.session_id} {ctx.idempotency_key}")
        await jitter()
        return f"refunded {order}"

    def answer(request: ModelRequest) -> Any:
        if request.messages[-1].role == "user":
            order = request.messages[-1].text
            return [
                call("payments.charge", order=order),
                call("orders.ship", order=order),
                call("payments.refund", order=order),
            ]
        return "Done."

    agent = Agent("desk", tools=[charge, ship, refund])
    runtime = Runtime(model=FunctionModel(answer))
    return Engine(agent, store=store, runtime=runtime, worker_id=worker_id, lease_ttl=3.0)


async def open_store(schema: str) -> Any:
    from handrail.store import PostgresStore

    return await PostgresStore.connect(DSN, schema=schema, pool_size=8)


# -- the worker processes ---------------------------------------------------------------------


async def role_worker(schema: str, ledger: str, worker_id: str) -> None:
    from handrail import Worker

    log = Path(ledger).with_name(f"{worker_id}.log")
    logging.basicConfig(filename=log, level=logging.WARNING, format="%(name)s %(message)s")

    store = await open_store(schema)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    engine = build(store, ledger, worker_id)
    print("ready", flush=True)
    try:
        await Worker(engine, poll_interval=0.2, concurrency=8).run(stop)
    finally:
        await store.close()


# -- this process: submissions, the desk, the restart, the checks ----------------------------


class Counts(collections.Counter[str]):
    """What happened to this process's calls (submissions left, decisions retried, ...)."""


async def submit(engine: Any, session: str, counts: Counts) -> None:
    from handrail import StoreUnavailableError

    try:
        async for _ in engine.submit(session, session):
            pass
        counts["submitted"] += 1
    except StoreUnavailableError:
        counts["submit left for recovery"] += 1
    except Exception as error:
        counts[f"submit failed: {type(error).__name__}"] += 1


async def desk(engine: Any, ledger: str, counts: Counts, stop: asyncio.Event) -> None:
    """Decide every card: approve approvals; a recovery card from the ledger."""
    from handrail import Answer, Approve
    from handrail.recovery import idempotency_key

    while not stop.is_set():
        try:
            waiting = await engine.store.list(status="suspended", limit=500)
            for summary in waiting:
                state = await engine.session(summary.id)
                decisions: dict[str, Any] = {}
                for call_id, card in state.pending.items():
                    if card.kind == "recovery":
                        part = next(
                            p for m in state.all_messages() for p in m.tool_calls if p.id == call_id
                        )
                        key = idempotency_key(state, part)
                        ran = any(line.endswith(key) for line in lines(ledger))
                        decisions[call_id] = Answer("done") if ran else Approve()
                        counts[f"recovery card {'answered' if ran else 'retried'}"] += 1
                    else:
                        decisions[call_id] = Approve()
                if decisions:
                    await engine.resolve_many(summary.id, decisions)
                    counts["decisions"] += len(decisions)
        except Exception as error:  # the server restarts: look again in a moment
            counts[f"desk retried after {type(error).__name__}"] += 1
        await asyncio.sleep(0.1)


def start_worker(schema: str, ledger: str, worker_id: str) -> subprocess.Popen[str]:
    """A worker process on the schema; it says `ready` once its store is open."""
    command = [sys.executable, "-m", "bench.pg_restart", "--role", "worker", "--schema", schema]
    return subprocess.Popen(
        [*command, "--ledger", ledger, "--worker-id", worker_id],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        text=True,
    )


SIGNS = {
    "store call retried": "trying again in",
    "recovering a cut-off turn": "recovering session",
    "wake-ups lost, subscribed again": "lost the store's wake-ups",
    "sweep failed": "a sweep failed",
}
"""What the engines' and workers' log lines say, by kind (the parked sessions apart)."""


def logged(workdir: Path) -> collections.Counter[str]:
    """What the processes' logs say happened, counted by kind."""
    found: collections.Counter[str] = collections.Counter()
    for path in workdir.glob("*.log"):
        for line in path.read_text().splitlines():
            if line.startswith("handrail.worker") and "time(s) in a row" in line:
                found["session parked (back-off)"] += 1
                continue
            for kind, sign in SIGNS.items():
                if line.startswith("handrail.") and sign in line:
                    found[kind] += 1
                    break
    return found


def restart(cluster: list[str]) -> float:
    began = time.monotonic()
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", *cluster, "restart"],
        check=True,
        capture_output=True,
    )
    return time.monotonic() - began


async def main(args: argparse.Namespace) -> int:
    import psycopg

    schema = f"handrail_pgrestart_{os.getpid()}_{secrets.token_hex(2)}"
    workdir = Path(tempfile.mkdtemp(prefix="pg_restart_"))
    ledger = str(workdir / "effects.txt")
    sessions = [f"S{i:03}" for i in range(args.sessions)]
    counts = Counts()
    logging.basicConfig(
        filename=workdir / "api.log", level=logging.WARNING, format="%(name)s %(message)s"
    )
    store = await open_store(schema)  # creates the schema before the workers start
    engine = build(store, ledger, "api")
    workers = [start_worker(schema, ledger, f"w{i}") for i in range(args.workers)]
    for worker in workers:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
    stop = asyncio.Event()
    deciding = asyncio.create_task(desk(engine, ledger, counts, stop))
    restarted: float | None = None
    failures: list[str] = []
    try:
        submitting: set[asyncio.Task[None]] = set()
        began = time.monotonic()
        for i, session in enumerate(sessions):
            submitting.add(asyncio.create_task(submit(engine, session, counts)))
            await asyncio.sleep(args.spread / len(sessions))
            if restarted is None and not args.no_restart and i == len(sessions) // 3:
                restarted = await asyncio.to_thread(restart, args.cluster.split())
                print(f"restarted PostgreSQL in {restarted:.2f} s", flush=True)
        await asyncio.gather(*submitting)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            try:
                done = 0
                for session in sessions:
                    summary = await store.summary(session)
                    if summary is None:  # its message never got stored: the client retries
                        counts["resubmitted"] += 1
                        await submit(engine, session, counts)
                    elif summary.status == "completed":
                        done += 1
                if done == len(sessions):
                    break
            except Exception as error:
                counts[f"check retried after {type(error).__name__}"] += 1
            await asyncio.sleep(0.25)
        took = time.monotonic() - began
        # The checks.
        effects = collections.Counter(tuple(line.split()[:2]) for line in lines(ledger))
        statuses = collections.Counter()
        for session in sessions:
            summary = await store.summary(session)
            status = "missing" if summary is None else summary.status
            statuses[status] += 1
            if status != "completed":
                failures.append(f"{session}: {status}")
                continue
            state = await engine.session(session)
            if state.pending or state.progress is not None:
                failures.append(f"{session}: still waiting on {list(state.pending)}")
            for tool_name in ("charge", "ship", "refund"):
                if effects[tool_name, session] != 1:
                    failures.append(f"{session}: {tool_name} x{effects[tool_name, session]}")
        print(f"sessions: {len(sessions)}, workers: {args.workers}, took {took:.1f} s")
        print(f"statuses: {dict(statuses)}")
        print(f"effects: {sum(effects.values())} lines for {3 * len(sessions)} calls")
        print(f"this process: {dict(counts)}")
        print(f"logged by the workers and this process: {dict(logged(workdir))}")
        print(f"violations: {len(failures)}")
        for failure in failures[:20]:
            print(f"  {failure}")
    finally:
        stop.set()
        deciding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await deciding
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            if worker.stdout is not None:
                worker.stdout.close()
        await store.close()
        async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as db:
            await db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return 1 if failures else 0


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", default="main", choices=["main", "worker"])
    parser.add_argument("--schema")
    parser.add_argument("--ledger")
    parser.add_argument("--worker-id")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=60)
    parser.add_argument("--spread", type=float, default=4.0, help="seconds to submit them over")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--cluster", default="15 main", help="pg_ctlcluster's version and name")
    parser.add_argument("--no-restart", action="store_true", help="the load alone")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse()
    if arguments.role == "worker":
        asyncio.run(role_worker(arguments.schema, arguments.ledger, arguments.worker_id))
    else:
        sys.exit(asyncio.run(main(arguments)))
