"""One server as many processes over one PostgreSQL: real `handrail serve` processes.

Two servers (A and B, each its own process, port and worker id) share one PostgreSQL schema.
Their streams re-read the event log only after an hour of quiet (`--poll-interval 3600`), so
an event that reaches a stream on the other process within the test's bounded waits came by
a notice (LISTEN/NOTIFY), not by polling. A process killed with SIGKILL inside a tool has its
turn finished by the other, within the lease's TTL, with the side effect made once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import frames

HERE = Path(__file__).parent
SRC = HERE.parents[1] / "src"
PG_HOST, PG_PORT = "127.0.0.1", 5432
PG_DSN = f"postgresql://postgres@{PG_HOST}:{PG_PORT}/test"
KEY = "procs-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LEASE_TTL = 2.0
WAIT = 30.0
"""Seconds any one step may take: far under the streams' hour between re-reads."""


def _postgres_unavailable() -> str | None:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return 'POSTGRES TESTS SKIPPED: psycopg is not installed (pip install "handrail[postgres]")'
    try:
        socket.create_connection((PG_HOST, PG_PORT), timeout=1).close()
    except OSError:
        return f"POSTGRES TESTS SKIPPED: no server at {PG_HOST}:{PG_PORT}"
    return None


@pytest.fixture(scope="module")
def schema() -> Iterator[str]:
    """A schema of this module's own, dropped at the end."""
    if reason := _postgres_unavailable():
        pytest.skip(reason)
    import psycopg

    name = f"handrail_procs_{os.getpid()}_{secrets.token_hex(3)}"
    yield name
    with psycopg.connect(PG_DSN, autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _env(schema: str, folder: Path, worker_id: str, lease_ttl: float = LEASE_TTL) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        "HANDRAIL_API_KEYS": f"acme:ana:{KEY}",
        "HANDRAIL_WORKER_ID": worker_id,
        "PROCS_DSN": PG_DSN,
        "PROCS_SCHEMA": schema,
        "PROCS_DIR": str(folder),
        "PROCS_LEASE_TTL": str(lease_ttl),
    }


def _start(
    name: str,
    schema: str,
    folder: Path,
    *args: str,
    target: str = "procs_app:engine",
    lease_ttl: float = LEASE_TTL,
) -> Server:
    port = _free_port()
    log = folder / f"{name}.log"
    command = [sys.executable, "-c", "from handrail.cli import app; app()", "serve", target]
    command += ["--port", str(port), "--sweep-interval", "0.2", "--poll-interval", "3600"]
    process = _popen([*command, *args], _env(schema, folder, name, lease_ttl), log)
    return Server(process, f"http://127.0.0.1:{port}", log)


def _popen(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`command` run from this directory, its output (both streams) written to `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(command, cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT)


async def _ready(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as client:
        async with asyncio.timeout(WAIT):
            while True:
                assert server.process.poll() is None, server.output()
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/domain")).status_code == 200:
                        return
                await asyncio.sleep(0.1)


def _stop(server: Server) -> None:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
    try:
        server.process.wait(timeout=WAIT)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@contextlib.asynccontextmanager
async def two_servers(schema: str, folder: Path) -> AsyncIterator[tuple[Server, Server]]:
    """Servers A and B on one schema, up and answering."""
    await _empty(schema)
    a = _start("A", schema, folder)
    await _ready(a)  # A makes the tables first
    b = _start("B", schema, folder)
    try:
        await _ready(b)
        yield a, b
    finally:
        for server in (a, b):
            _stop(server)


async def _empty(schema: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
        exists = await connection.execute(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = %s", (schema,)
        )
        if await exists.fetchone():
            await connection.execute(
                f'TRUNCATE "{schema}".handrail_sessions, "{schema}".handrail_tool_log, '
                f'"{schema}".handrail_events, "{schema}".handrail_leases'
            )


async def _rows(schema: str, query: str) -> list[tuple[Any, ...]]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
        cursor = await connection.execute(query.format(s=f'"{schema}"'))
        return await cursor.fetchall()


async def _events(server: Server, session_id: str, after: int) -> list[dict[str, Any]]:
    """The session's events after `after` streamed by `server`, up to the turn's end."""
    async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=WAIT) as client:
        url = f"/sessions/{session_id}/events?after={after}"
        async with client.stream("GET", url) as response:
            assert response.status_code == 200
            return [{"id": f.id, **f.data} async for f in frames(response)]


async def _session(client: httpx.AsyncClient) -> str:
    response = await client.post("/sessions")
    assert response.status_code == 201
    session_id: str = response.json()["id"]
    return session_id


def _effects(folder: Path) -> list[str]:
    path = folder / "effects.txt"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.postgres
async def test_a_stream_on_one_process_follows_a_turn_submitted_on_another(
    schema: str, tmp_path: Path
) -> None:
    async with (
        two_servers(schema, tmp_path) as (a, b),
        httpx.AsyncClient(base_url=a.url, headers=AUTH, timeout=WAIT) as on_a,
    ):
        session_id = await _session(on_a)
        # B's stream opens on an empty log and waits; only a notice can bring it the turn.
        following = asyncio.create_task(_events(b, session_id, 0))
        await asyncio.sleep(0.3)
        accepted = await on_a.post(f"/sessions/{session_id}/turns", json={"text": "ship o1"})
        assert accepted.status_code == 202
        async with asyncio.timeout(WAIT):
            streamed = await following
        # Reconnecting to B with Last-Event-ID replays exactly what comes after it.
        async with httpx.AsyncClient(base_url=b.url, headers=AUTH, timeout=WAIT) as on_b:
            again = await on_b.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "2"})
    assert streamed[0]["type"] == "run-started"
    assert streamed[-1]["type"] == "run-completed"
    assert [e["id"] for e in streamed] == list(range(1, len(streamed) + 1))
    ids = [int(line[4:]) for line in again.text.splitlines() if line.startswith("id: ")]
    assert ids == list(range(3, len(streamed) + 1))
    assert [line.split()[:2] for line in _effects(tmp_path)] == [["ship", "o1"]]


@pytest.mark.postgres
async def test_a_decision_on_one_process_resumes_a_turn_suspended_on_another(
    schema: str, tmp_path: Path
) -> None:
    async with (
        two_servers(schema, tmp_path) as (a, b),
        httpx.AsyncClient(base_url=a.url, headers=AUTH, timeout=WAIT) as on_a,
        httpx.AsyncClient(base_url=b.url, headers=AUTH, timeout=WAIT) as on_b,
    ):
        session_id = await _session(on_a)
        async with on_a.stream(
            "POST",
            f"/sessions/{session_id}/turns",
            json={"text": "charge o2"},
            headers={"Accept": "text/event-stream"},
        ) as response:
            suspended = [f async for f in frames(response)]
        assert suspended[-1].type == "run-suspended"
        assert _effects(tmp_path) == []
        # A stream on A waits for the resumption, which B runs.
        following = asyncio.create_task(_events(a, session_id, suspended[-1].id))
        (card,) = (await on_b.get(f"/sessions/{session_id}")).json()["pending"]
        resolved = await on_b.post(
            f"/sessions/{session_id}/resolve",
            json={"tool_call_id": card["tool_call_id"], "decision": {"decision": "approve"}},
        )
        assert resolved.json()["resumed"] is True
        # Deciding again, on either process, is refused: the turn resumed exactly once.
        again = await on_a.post(
            f"/sessions/{session_id}/resolve",
            json={"tool_call_id": card["tool_call_id"], "decision": {"decision": "approve"}},
        )
        assert again.status_code == 409
        async with asyncio.timeout(WAIT):
            resumed = await following
        status = (await on_a.get(f"/sessions/{session_id}")).json()["status"]
    assert resumed[-1]["type"] == "run-completed"
    assert resumed[0]["id"] == suspended[-1].id + 1
    assert _effects(tmp_path) == ["charge o2"]
    assert status == "completed"


@pytest.mark.postgres
async def test_a_process_killed_mid_turn_has_its_turn_finished_by_another(
    schema: str, tmp_path: Path
) -> None:
    async with (
        two_servers(schema, tmp_path) as (a, b),
        httpx.AsyncClient(base_url=a.url, headers=AUTH, timeout=WAIT) as on_a,
    ):
        session_id = await _session(on_a)
        following = asyncio.create_task(_events(b, session_id, 0))
        await asyncio.sleep(0.3)
        accepted = await on_a.post(f"/sessions/{session_id}/turns", json={"text": "hold o3"})
        assert accepted.status_code == 202
        marker = tmp_path / "holding-o3"
        async with asyncio.timeout(WAIT):
            while not marker.exists():  # noqa: ASYNC110 - the tool says so in a file
                await asyncio.sleep(0.02)
        assert int(marker.read_text()) == a.process.pid  # A is inside the tool, after its effect
        a.process.send_signal(signal.SIGKILL)
        a.process.wait()
        # B's sweeps find the turn once A's lease lapses, and recover it; B's stream sees it end.
        async with asyncio.timeout(WAIT):
            streamed = await following
        async with httpx.AsyncClient(base_url=b.url, headers=AUTH) as on_b:
            status = (await on_b.get(f"/sessions/{session_id}")).json()["status"]
    assert a.process.returncode == -signal.SIGKILL
    assert streamed[-1]["type"] == "run-completed"
    assert status == "completed"
    (ship,) = _effects(tmp_path)  # run again with the same idempotency key: one shipment
    assert ship.startswith("ship o3 ")
    assert await _rows(schema, "SELECT * FROM {s}.handrail_leases") == []
    assert f"recovering session {session_id!r}, whose turn was cut off" in b.output()


@pytest.mark.postgres
async def test_serve_with_workers_runs_processes_that_each_take_their_own_leases(
    schema: str, tmp_path: Path
) -> None:
    await _empty(schema)
    server = _start("W", schema, tmp_path, "--workers", "2")
    try:
        await _ready(server)
        async with asyncio.timeout(WAIT):  # both processes serve
            while server.output().count("Application startup complete") < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=WAIT) as client:
            sessions = [await _session(client) for _ in range(4)]
            for n, session_id in enumerate(sessions):
                await client.post(f"/sessions/{session_id}/turns", json={"text": f"hold w{n}"})
            async with asyncio.timeout(WAIT):  # every turn holds, inside its tool
                while len(list(tmp_path.glob("holding-w*"))) < len(sessions):  # noqa: ASYNC110, ASYNC240
                    await asyncio.sleep(0.05)
            owners = await _rows(schema, "SELECT owner FROM {s}.handrail_leases")
        pids = {int((tmp_path / f"holding-w{n}").read_text()) for n in range(len(sessions))}
        server.process.send_signal(signal.SIGTERM)  # stop: the turns are interrupted, saved
        server.process.wait(timeout=WAIT)
    finally:
        _stop(server)
    assert server.process.returncode == 0, server.output()
    assert {owner.split("#")[0] for (owner,) in owners} <= {"W-0", "W-1"}
    assert len(pids) <= 2 and len(owners) == len(sessions)
    # Shut down in order, the processes gave their leases back.
    assert await _rows(schema, "SELECT * FROM {s}.handrail_leases") == []
    assert server.output().count("Started server process") == 2


def test_serve_refuses_workers_with_a_memory_store(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "from handrail.cli import app; app()", "serve"]
    done = subprocess.run(
        [*command, "procs_app:memory_engine", "--workers", "2"],
        cwd=HERE,
        env=_env("unused", tmp_path, "M"),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 1
    assert "MemoryStore" in done.stderr and "PostgresStore" in done.stderr


@pytest.mark.postgres
async def test_a_server_that_loses_its_notices_listens_again_and_misses_nothing(
    schema: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import psycopg

    from handrail.server import ApiKeyAuthenticator, Caller, create_app
    from handrail.store import PostgresStore

    from .conftest import StreamingTransport
    from .procs_app import build

    await _empty(schema)
    async with (
        PostgresStore(PG_DSN, schema=schema) as here,
        PostgresStore(PG_DSN, schema=schema) as elsewhere,  # as another process's
    ):
        engine, other = build(here, tmp_path, 30.0), build(elsewhere, tmp_path, 30.0)
        keys = ApiKeyAuthenticator({KEY: Caller("acme", "ana")})
        app = create_app(engine, authenticator=keys, poll_interval=3600)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=StreamingTransport(app), base_url="http://test", headers=AUTH
            ) as client,
        ):
            session_id = await _session(client)
            url = f"/sessions/{session_id}/events?follow=true"
            async with client.stream("GET", url) as response, asyncio.timeout(WAIT):
                stream = frames(response)
                await other.log_events(session_id, [{"type": "run-started"}])
                assert (await anext(stream)).id == 1  # the stream listens now
                async with await psycopg.AsyncConnection.connect(PG_DSN) as admin:
                    await admin.execute(  # this server's connection for notices is lost
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = %s",
                        (f'LISTEN "{here.events_channel}"',),
                    )
                while "Lost the store's event notices" not in caplog.text:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                await other.log_events(session_id, [{"type": "run-completed"}])
                # Listening again, the server has its streams read the log: nothing missed.
                assert (await anext(stream)).id == 2


@pytest.mark.postgres
async def test_uvicorn_workers_serve_the_app_factory(schema: str, tmp_path: Path) -> None:
    await _empty(schema)
    port = _free_port()
    log = tmp_path / "uvicorn.log"
    env = {**_env(schema, tmp_path, "U"), "HANDRAIL_ENGINE": "procs_app:engine"}
    command = [sys.executable, "-m", "uvicorn", "--factory", "handrail.server:app_from_env"]
    command += ["--workers", "2", "--port", str(port), "--timeout-graceful-shutdown", "5"]
    server = Server(_popen(command, env, log), f"http://127.0.0.1:{port}", log)
    try:
        await _ready(server)
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=WAIT) as client:
            session_id = await _session(client)
            following = asyncio.create_task(_events(server, session_id, 0))
            await client.post(f"/sessions/{session_id}/turns", json={"text": "ship u1"})
            async with asyncio.timeout(WAIT):
                streamed = await following
            held = await _session(client)
            await client.post(f"/sessions/{held}/turns", json={"text": "hold u2"})
            marker = tmp_path / "holding-u2"
            async with asyncio.timeout(WAIT):
                while not marker.exists():  # noqa: ASYNC110 - the tool says so in a file
                    await asyncio.sleep(0.02)
            ((owner,),) = await _rows(schema, "SELECT owner FROM {s}.handrail_leases")
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=WAIT)
    finally:
        _stop(server)
    assert streamed[-1]["type"] == "run-completed"
    assert owner.startswith(f"U-{int(marker.read_text())}#")  # the process's own worker id
    assert await _rows(schema, "SELECT * FROM {s}.handrail_leases") == []  # given back


@pytest.mark.postgres
async def test_a_worker_killed_is_started_again_and_takes_its_turn_back_at_once(
    schema: str, tmp_path: Path
) -> None:
    await _empty(schema)
    # Leases last an hour: only the new process taking its predecessor's back can finish
    # the turn within the test's wait.
    server = _start("R", schema, tmp_path, "--workers", "2", lease_ttl=3600)
    try:
        await _ready(server)
        async with asyncio.timeout(WAIT):  # both processes serve
            while server.output().count("Application startup complete") < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=WAIT) as client:
            session_id = await _session(client)
            await client.post(f"/sessions/{session_id}/turns", json={"text": "hold r1"})
            marker = tmp_path / "holding-r1"
            async with asyncio.timeout(WAIT):
                while not marker.exists():  # noqa: ASYNC110 - the tool says so in a file
                    await asyncio.sleep(0.02)
            os.kill(int(marker.read_text()), signal.SIGKILL)
            async with asyncio.timeout(WAIT):
                while True:
                    with contextlib.suppress(httpx.TransportError):
                        view = (await client.get(f"/sessions/{session_id}")).json()
                        if view["status"] == "completed":
                            break
                    await asyncio.sleep(0.1)
    finally:
        _stop(server)
    output = server.output()
    assert "died (exit code -9); starting it again" in output
    assert output.count("Started server process") == 3
    assert f"recovering session {session_id!r}, whose turn was cut off" in output
    (ship,) = _effects(tmp_path)
    assert ship.startswith("ship r1 ")
