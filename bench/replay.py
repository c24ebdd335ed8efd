"""One tenant replaying a long event log many times at once: `python -m bench.replay`.

A real uvicorn server (as `handrail serve` runs it) in its own process, on SQLite, holds a
session of tenant A with a `--events`-event log (40,000 by default: text deltas, with a tool
call every 50 events, ending with `run-completed`). Tenant A opens `--replays` streams of
that whole log at once (300 by default, each on its own connection, read as fast as the
client can); meanwhile tenant B sends `GET /sessions` every 20 ms. Printed, for
`--seconds` seconds (10 by default) of that:

- B's request latency: p50, p99 and max (idle, before A starts: p50 and p99).
- A's streams: how many opened (200) and how many were refused (429), the bytes they got.
- The server's CPU seconds over the window.

Twice: with the server's default limits (`Limits()`: 100 streams and 4 MB/s an
organisation), and with none (only the streams' taking turns to read the log keeps B served).
Target (issue 17): B's p99 stays within a few ms of idle (before: 0.8 s under 300 replays).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from bench.server import _Connection, _cpu_seconds, _run, _serving

KEYS = {"key-a": ("a", "a"), "key-b": ("b", "b")}
SESSION = "replayed"


def _populate(db: str, events: int) -> None:
    from handrail.store import SessionRecord, SqliteStore

    async def fill() -> None:
        async with SqliteStore(db) as store:
            await store.save(SessionRecord(id=SESSION, org_id="a", user_id="a"))
            await store.save(SessionRecord(id="b-1", org_id="b", user_id="b"))
            page: list[dict[str, Any]] = []
            for i in range(events - 1):
                if i % 50 == 49:
                    event = {
                        "type": "tool-call-completed",
                        "tool_call_id": f"call_{i}",
                        "name": "orders.lookup",
                        "ok": True,
                        "output": {"order": "A1042", "status": "delivered", "items": [1, 2, 3]},
                        "agent": "support",
                    }
                else:
                    event = {
                        "type": "text-delta",
                        "message_id": f"msg_{i // 50}",
                        "delta": f"word{i} ",
                        "agent": "support",
                    }
                page.append(event)
                if len(page) == 1000:
                    await store.append_events(SESSION, page)
                    page = []
            page.append({"type": "run-completed", "output": "done", "agent": "support"})
            await store.append_events(SESSION, page)

    asyncio.run(fill())


def serve(db: str, limited: bool) -> None:
    import socket

    import uvicorn

    from handrail import Agent, Engine, Runtime
    from handrail.server import (
        ApiKeyAuthenticator,
        Caller,
        Limits,
        create_app,
        server_config,
        tune_gc,
    )
    from handrail.store import SqliteStore
    from handrail.testing import FunctionModel

    engine = Engine(
        Agent("support"), store=SqliteStore(db), runtime=Runtime(model=FunctionModel(lambda _: ""))
    )
    keys = ApiKeyAuthenticator({k: Caller(*who) for k, who in KEYS.items()})
    limits = Limits() if limited else Limits(rate=None, streams=None, stream_bytes=None)
    app = create_app(engine, authenticator=keys, static_dir=None, limits=limits)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    tune_gc()
    # As `handrail serve` configures uvicorn (its connection guards included).
    config = server_config(app, log_level="warning", lifespan="on", backlog=4096)
    uvicorn.Server(config).run(sockets=[sock])


async def _replay(port: int, stop: asyncio.Event, got: dict[str, int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"GET /sessions/{SESSION}/events HTTP/1.1\r\nHost: bench\r\n"
            f"Authorization: Bearer key-a\r\n\r\n".encode()
        )
        status = int((await reader.readline()).split()[1])
        got[str(status)] = got.get(str(status), 0) + 1
        while not stop.is_set():
            data = await reader.read(65_536)
            if not data:
                return
            got["bytes"] = got.get("bytes", 0) + len(data)
    finally:
        writer.close()


async def _probe_b(port: int, stop: asyncio.Event, latencies: list[float]) -> None:
    connection = await _Connection.open(port)
    try:
        while not stop.is_set():
            started = time.perf_counter()
            head = "GET /sessions HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer key-b\r\n\r\n"
            connection.writer.write(head.encode())
            status, headers = await connection.head()
            await connection.reader.readexactly(int(headers["content-length"]))
            assert status == 200, status
            latencies.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(0.02)
    finally:
        connection.close()


async def _bench(port: int, pid: int, replays: int, seconds: float) -> dict[str, Any]:
    idle: list[float] = []
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe_b(port, stop, idle))
    await asyncio.sleep(1.0)
    stop.set()
    await probe
    stop = asyncio.Event()
    loaded: list[float] = []
    got: dict[str, int] = {}
    cpu = _cpu_seconds(pid)
    tasks = [asyncio.create_task(_replay(port, stop, got)) for _ in range(replays)]
    probe = asyncio.create_task(_probe_b(port, stop, loaded))
    await asyncio.sleep(seconds)
    stop.set()
    await probe
    cpu = _cpu_seconds(pid) - cpu
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"idle": idle, "loaded": loaded, "got": got, "cpu": cpu}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__)
    parser.add_argument("--events", type=int, default=40_000)
    parser.add_argument("--replays", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--unlimited", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.db, limited=not args.unlimited)
        return
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "replay.db")
        _populate(db, args.events)
        print(f"{args.replays} replays of a {args.events:,}-event log, for {args.seconds:g} s")
        for limited in (True, False):
            command = [sys.executable, "-m", "bench.replay", "--serve", "--db", db]
            if not limited:
                command.append("--unlimited")
            with _serving(command) as (port, pid):
                r = _run(_bench(port, pid, args.replays, args.seconds))
            name = "default limits" if limited else "no limits (turns only)"
            idle, loaded, got = r["idle"], r["loaded"], r["got"]
            print(
                f"  {name:24} B idle p50 {statistics.median(idle):.2f} ms, "
                f"p99 {_pct(idle, 0.99):.2f} ms | under replays p50 "
                f"{statistics.median(loaded):.2f} ms, p99 {_pct(loaded, 0.99):.2f} ms, "
                f"max {max(loaded):.1f} ms ({len(loaded)} requests) | A: "
                f"{got.get('200', 0)} streams, {got.get('429', 0)} refused, "
                f"{got.get('bytes', 0) / 1e6:.1f} MB | server CPU {r['cpu']:.1f} s"
            )


if __name__ == "__main__":
    main()
