"""`handrail worker` and `handrail run`, as real processes on a shared store.

The app is `tests/scheduling_app.py` (an async context-manager function). A worker runs as a
subprocess on a SQLite file (and, two of them, on PostgreSQL); this test process plays the
people: it submits and decides turns with an engine of its own on the same store, and never
resumes them, so what moves after a decision was moved by a worker. `handrail run` runs as
a subprocess too: its exit status, its output, and what it left in the store.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import scheduling_app
from handrail import Approve, Decider, Engine
from handrail.store import SessionStore, SqliteStore

HERE = Path(__file__).parent
SRC = HERE.parent / "src"
CLI = [sys.executable, "-c", "from handrail.cli import app; app()"]
WAIT = 30.0
"""Seconds any one step may take."""
ANA = Decider(user_id="ana", roles={"approver"}, org_id="acme")
"""A person who may approve refunds (scheduling_app.APPROVERS)."""
PG_HOST, PG_PORT = "127.0.0.1", 5432
PG_DSN = f"postgresql://postgres@{PG_HOST}:{PG_PORT}/test"


def _env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HANDRAIL_WORKER_ID", "HANDRAIL_DSN")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    env["SCHEDULING_DIR"] = str(folder)
    return env


def handrail(folder: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """`handrail ARGS` run to its end from this directory (where the app is)."""
    return subprocess.run(
        [*CLI, *map(str, args)],
        cwd=HERE,
        env=_env(folder),
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )


class Worker:
    """A `handrail worker` process, its output (both streams) in a file."""

    def __init__(self, folder: Path, name: str, *args: str | Path) -> None:
        self.log = folder / f"{name}.log"
        command = [*CLI, "worker", "scheduling_app:app", "--worker-id", name]
        command += ["--sweep-interval", "0.1", "--health-interval", "0.2", *map(str, args)]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                command, cwd=HERE, env=_env(folder), stdout=out, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def started(self) -> None:
        await eventually(lambda: "started on" in self.output(), self)

    async def stop(self) -> int:
        """SIGTERM, then the exit status."""
        self.process.send_signal(signal.SIGTERM)
        return await asyncio.to_thread(self.process.wait, WAIT)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    """Every worker a test starts, killed at its end if still alive."""
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.kill()


async def eventually(condition: Callable[[], Any], *workers: Worker) -> None:
    """Wait for `condition()` (awaited if it is a coroutine) to hold; show the workers' logs."""
    try:
        async with asyncio.timeout(WAIT):
            while True:
                found = condition()
                if isinstance(found, Awaitable):
                    found = await found
                if found:
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        logs = "\n".join(f"--- {w.log.name}:\n{w.output()}" for w in workers)
        raise AssertionError(f"still waiting after {WAIT} s\n{logs}") from None


def effects(folder: Path) -> list[str]:
    path = folder / "effects.txt"
    return path.read_text().splitlines() if path.exists() else []


def app_events(folder: Path) -> list[str]:
    path = folder / "app.txt"
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
async def people(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Engine]:
    """The people's engine, on the workers' SQLite file: it submits and decides, never resumes."""
    monkeypatch.setenv("SCHEDULING_DIR", str(tmp_path))
    engine = Engine(scheduling_app.agent(), store=SqliteStore(tmp_path / "s.db"))
    yield engine
    await engine.store.close()


async def suspend_and_approve(engine: Engine, session_id: str, text: str) -> None:
    """A turn of `text` that waits for a refund's approval, approved by a person."""
    events = [e async for e in engine.submit(session_id, text, org_id="acme", user_id="cy")]
    assert events[-1].type == "run-suspended"
    (call_id,) = events[-1].pending
    resolution = await engine.resolve(session_id, call_id, Approve(), decider=ANA)
    assert resolution.ready


async def has_status(store: SessionStore, session_id: str, wanted: str) -> bool:
    return await status(store, session_id) == wanted


async def status(store: SessionStore, session_id: str) -> str | None:
    record = await store.load(session_id)
    return None if record is None else record.status


# -- handrail worker ---------------------------------------------------------------------------


async def test_a_worker_resumes_a_turn_decided_in_another_process(
    tmp_path: Path, people: Engine, workers: list[Worker]
) -> None:
    worker = Worker(tmp_path, "w1", "--db", tmp_path / "s.db")
    workers.append(worker)
    await worker.started()

    await suspend_and_approve(people, "s1", "refund A1")
    await eventually(lambda: has_status(people.store, "s1", "completed"), worker)
    assert effects(tmp_path) == ["started A1", "refunded A1"]  # run once, by the worker
    # What the worker drove is in the session's event log, for a client to stream.
    logged = [event["type"] for _, event in await people.store.events("s1")]
    assert logged[-1] == "run-completed" and "tool-call-completed" in logged

    # Its health line names its lease owner and says what it did.
    health = re.compile(r"handrail worker w1#\w+: health: .*moved 1 \(resumed 1,")
    await eventually(lambda: health.search(worker.output()), worker)
    assert await worker.stop() == 0
    assert re.search(r"w1#\w+: stopped: .*moved 1 \(resumed 1, recovered 0", worker.output())
    assert app_events(tmp_path) == ["opened", "closed"]  # the app's exit ran


async def test_sigterm_lets_the_turn_in_flight_finish_then_exits_0(
    tmp_path: Path, people: Engine, workers: list[Worker]
) -> None:
    worker = Worker(tmp_path, "w1", "--db", tmp_path / "s.db")
    workers.append(worker)
    await worker.started()
    await suspend_and_approve(people, "s1", "slow B1")
    await eventually(lambda: effects(tmp_path) == ["started B1"], worker)  # in the tool

    worker.process.send_signal(signal.SIGTERM)
    await eventually(lambda: "draining: 1 session(s)" in worker.output(), worker)
    await asyncio.sleep(0.3)  # sweeps would have claimed new work by now: none is taken
    assert worker.process.poll() is None  # still finishing the turn
    (tmp_path / "gate").touch()
    assert await asyncio.to_thread(worker.process.wait, WAIT) == 0
    assert effects(tmp_path) == ["started B1", "refunded B1"]
    assert await status(people.store, "s1") == "completed"
    assert app_events(tmp_path) == ["opened", "closed"]


async def test_a_turn_still_running_past_the_grace_is_cut_off_and_recovered_by_another_worker(
    tmp_path: Path, people: Engine, workers: list[Worker]
) -> None:
    first = Worker(tmp_path, "w1", "--db", tmp_path / "s.db", "--shutdown-grace", "0.2")
    workers.append(first)
    await first.started()
    await suspend_and_approve(people, "s1", "slow C1")
    await eventually(lambda: effects(tmp_path) == ["started C1"], first)

    assert await first.stop() == 0  # the gate never opens: the turn is cut off
    assert "cut off, their leases given back" in first.output()
    assert app_events(tmp_path) == ["opened", "closed"]

    # Another worker recovers it at once (the lease was given back, not left to lapse): the
    # refund started and may have run, so a person is asked, never guessed for.
    second = Worker(tmp_path, "w2", "--db", tmp_path / "s.db")
    workers.append(second)

    async def asked() -> list[str]:
        state = await people.session("s1", org_id="acme", user_id="cy")
        return [card.kind for card in state.pending.values()]

    await eventually(asked, second)
    assert await asked() == ["recovery"]
    assert await status(people.store, "s1") == "suspended"
    assert effects(tmp_path) == ["started C1"]
    recovered = re.compile(r"w2#\w+: health: .*recovered 1,")
    await eventually(lambda: recovered.search(second.output()), second)
    assert await second.stop() == 0


def test_a_worker_refuses_a_store_no_other_process_sees(tmp_path: Path) -> None:
    done = handrail(tmp_path, "worker", "scheduling_app:app", "--health-interval", "0")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("error: scheduling_app:app's store is a ")
    assert "--db FILE or --dsn" in done.stderr
    assert "Traceback" not in done.stderr


# -- handrail run ------------------------------------------------------------------------------


def test_run_prints_the_answer_and_exits_0_when_the_turn_completes(tmp_path: Path) -> None:
    done = handrail(tmp_path, "run", "scheduling_app:app", "hello", "--db", tmp_path / "s.db")
    assert (done.returncode, done.stdout) == (0, "Hello.\n")

    done = handrail(
        tmp_path, "run", "scheduling_app:app", "hello", "--db", tmp_path / "s.db",
        "--session", "daily", "--json",
    )  # fmt: skip
    assert done.returncode == 0
    assert json.loads(done.stdout) == {
        "session": "daily",
        "status": "completed",
        "cards": [],
        "text": "Hello.",
    }
    assert app_events(tmp_path) == ["opened", "closed"] * 2


async def test_run_exits_3_when_the_turn_waits_for_people_and_prints_its_cards(
    tmp_path: Path, people: Engine
) -> None:
    done = handrail(
        tmp_path, "run", "scheduling_app:app", "refund E1", "--db", tmp_path / "s.db",
        "--session", "s1", "--org", "acme", "--user", "cy",
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    state = await people.session("s1", org_id="acme", user_id="cy")
    assert done.stdout.split() == list(state.pending)  # the card ids, one a line
    assert "waits for people" in done.stderr
    assert effects(tmp_path) == []

    # Run again on it while it waits: the message is not run, and it still waits.
    again = handrail(
        tmp_path, "run", "scheduling_app:app", "refund E2", "--db", tmp_path / "s.db",
        "--session", "s1", "--org", "acme", "--user", "cy", "--json",
    )  # fmt: skip
    assert again.returncode == 3
    answer = json.loads(again.stdout)
    assert (answer["status"], answer["cards"]) == ("waiting", list(state.pending))
    assert "was not run" in answer["error"]


def test_run_exits_1_when_the_turn_fails(tmp_path: Path) -> None:
    done = handrail(tmp_path, "run", "scheduling_app:app", "fail", "--db", tmp_path / "s.db")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "error: the turn failed (error): RuntimeError: the model is down"
    )
    done = handrail(
        tmp_path, "run", "scheduling_app:app", "fail", "--db", tmp_path / "s.db", "--json"
    )
    assert done.returncode == 1
    assert json.loads(done.stdout)["status"] == "failed"


def test_run_exits_1_with_one_error_line_when_the_app_cannot_be_opened(tmp_path: Path) -> None:
    done = handrail(tmp_path, "run", "scheduling_app:nope", "hello", "--json")
    assert done.returncode == 1
    assert done.stderr == "error: Module 'scheduling_app' has no attribute 'nope'.\n"
    answer = json.loads(done.stdout)  # --json says it on stdout too
    assert (answer["status"], answer["error"]) == (
        "failed",
        "Module 'scheduling_app' has no attribute 'nope'.",
    )


async def test_sigterm_interrupts_the_run_saves_the_turn_and_exits_1(
    tmp_path: Path, people: Engine
) -> None:
    command = [*CLI, "run", "scheduling_app:app", "wait", "--db", str(tmp_path / "s.db")]
    command += ["--session", "s1", "--json"]
    process = subprocess.Popen(  # noqa: ASYNC220 - started once, read from a thread
        command, cwd=HERE, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        await eventually(lambda: effects(tmp_path) == ["waiting"])  # in the tool
        process.send_signal(signal.SIGTERM)  # a job's deadline
        out, _ = await asyncio.to_thread(process.communicate, timeout=WAIT)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1
    answer = json.loads(out)
    assert answer["status"] == "failed"
    assert answer["error"] == "the turn failed (interrupted): the run was interrupted"
    # The turn was saved and its lease given back: the session takes its next message.
    events = [e.type async for e in people.submit("s1", "hello")]
    assert events[-1] == "run-completed"
    assert app_events(tmp_path) == ["opened", "closed"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["refund F1", "--propose"], "error: --propose needs --headless"),
        (["  "], "error: TEXT is empty"),
        (["hello", "--route", "nope"], "error: --route 'nope': the app has no such route"),
    ],
)
def test_run_refuses_bad_usage_with_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    done = handrail(tmp_path, "run", "scheduling_app:app", *args, "--db", tmp_path / "s.db")
    assert done.returncode == 2
    assert done.stderr.startswith(says)
    assert effects(tmp_path) == []


async def test_a_headless_run_proposes_a_batch_card_that_a_person_approves_and_a_worker_applies(
    tmp_path: Path, people: Engine, workers: list[Worker]
) -> None:
    done = handrail(
        tmp_path, "run", "scheduling_app:app", "refund D1", "--db", tmp_path / "s.db",
        "--headless", "--propose", "--org", "acme", "--user", "cron", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["status"] == "proposed"
    (card_id,) = answer["cards"]
    assert [(a["tool"], a["args"]["order"], a["status"]) for a in answer["actions"]] == [
        ("refund", "D1", "captured")
    ]
    assert effects(tmp_path) == []  # nothing ran

    # The card is in the inbox of a person who may approve refunds.
    (card,) = (await people.pending("acme", ANA)).cards
    assert (card.tool_call_id, card.kind, card.session_id) == (card_id, "batch", answer["session"])

    # Without --json, the card's id is all that stdout says.
    plain = handrail(
        tmp_path, "run", "scheduling_app:app", "refund D2", "--db", tmp_path / "s.db",
        "--headless", "--propose", "--org", "acme", "--user", "cron",
    )  # fmt: skip
    assert plain.returncode == 0
    assert plain.stdout.strip() in {
        c.tool_call_id for c in (await people.pending("acme", ANA)).cards
    }

    # Approved, the batch is applied by a worker.
    worker = Worker(tmp_path, "w1", "--db", tmp_path / "s.db")
    workers.append(worker)
    await people.resolve(answer["session"], card_id, Approve(), decider=ANA)
    await eventually(lambda: "refunded D1" in effects(tmp_path), worker)
    await eventually(lambda: has_status(people.store, answer["session"], "completed"), worker)
    assert effects(tmp_path) == ["started D1", "refunded D1"]  # D2 still waits for a person
    assert await worker.stop() == 0
    assert re.search(r"stopped: .*applied 1\)", worker.output())


# -- several workers over PostgreSQL -----------------------------------------------------------


def _postgres_unavailable() -> str | None:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return 'POSTGRES TESTS SKIPPED: psycopg is not installed (pip install "handrail[postgres]")'
    try:
        socket.create_connection((PG_HOST, PG_PORT), timeout=1).close()
    except OSError:
        return f"POSTGRES TESTS SKIPPED: no server answers at {PG_HOST}:{PG_PORT}"
    return None


@pytest.fixture
def schema() -> Iterator[str]:
    """A PostgreSQL schema of the test's own, dropped at its end."""
    if reason := _postgres_unavailable():
        pytest.skip(reason)
    import psycopg

    name = f"handrail_sched_{os.getpid()}_{secrets.token_hex(3)}"
    yield name
    with psycopg.connect(PG_DSN, autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.mark.postgres
async def test_two_workers_on_postgresql_run_each_decided_session_once(
    tmp_path: Path, schema: str, workers: list[Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    from handrail.store import PostgresStore

    monkeypatch.setenv("SCHEDULING_DIR", str(tmp_path))
    store = PostgresStore(PG_DSN, schema=schema)
    people = Engine(scheduling_app.agent(), store=store)
    try:
        # The sessions wait first, then both workers start and race for them; then more
        # are decided while both run (woken by NOTIFY, found by sweeps).
        orders = [f"P{n}" for n in range(12)]
        for order in orders[:6]:
            await suspend_and_approve(people, f"s-{order}", f"refund {order}")
        for name in ("w1", "w2"):
            workers.append(Worker(tmp_path, name, "--dsn", PG_DSN, "--schema", schema))
        for order in orders[6:]:
            await suspend_and_approve(people, f"s-{order}", f"refund {order}")

        async def all_completed() -> bool:
            found = [await status(store, f"s-{order}") for order in orders]
            return found == ["completed"] * len(orders)

        await eventually(all_completed, *workers)
        refunded = sorted(line for line in effects(tmp_path) if line.startswith("refunded"))
        assert refunded == sorted(f"refunded {order}" for order in orders)  # each once
        assert len(effects(tmp_path)) == 2 * len(orders)  # and started once
        assert [await worker.stop() for worker in workers] == [0, 0]
        moved = [
            int(re.search(r"stopped: .*moved (\d+)", w.output()).group(1))  # type: ignore[union-attr]
            for w in workers
        ]
        assert sum(moved) == len(orders)
    finally:
        await store.close()
