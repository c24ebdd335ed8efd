"""The HTTP server under load: `python -m bench.server [--streams 200] [--store memory|sqlite]`.

A real uvicorn server (uvloop, httptools, as `handrail serve` runs it) on loopback, in its own
process, serves an engine on a scripted model (one agent: a tool call, then a reply of
`WORDS` words, so a turn is ~`WORDS + 9` events). This process is the client (a bare HTTP/1.1
client on uvloop, the cheapest we have: it shares the two cores with the server). Each turn
is a `POST /sessions/{id}/turns` with `Accept: text/event-stream`, its answer read to the
turn's end.

- burst: `--streams` turns posted at the same instant, each on its own connection.
- steady: `--streams` clients, each on a keep-alive connection, each running `STEADY_TURNS`
  turns one after the other with a random pause of up to `THINK` seconds before each, the
  clients starting one by one over `STAGGER` seconds (people do not all press Enter in the
  same millisecond; the burst is that case): about `--streams` streams open at a time.
- Time to first event: from sending the POST of the turn to receiving its first SSE event
  (so it includes parsing the request, starting the run, logging its first event and the
  client's own work on the shared two-core machine): p50 and p99 over the measured turns.
  "In the server alone": the same, from the app's call to its first write.
- floor: the burst against a bare Starlette endpoint that answers one SSE event at once, on
  the same server stack, with the same client, in a `StreamingResponse` (stream) or in one
  response with its length (write): what the stack and the client cost before any of
  handrail's work.
- Server CPU: the CPU time the server used from the burst's start until its last first event
  went out, on its event loop's thread ("main thread") and on all its threads (SQLite's store
  thread too), median of the rounds. A measure of the work a burst's starts cost, which moves
  less with the machine's other load than a p99 does; printed round by round against the
  floor's too.
- Events/s: every event received in a round, over the round's wall time (first POST to the
  last stream's end).
- Memory per open stream: `--streams` streams opened with `?follow=true` on idle sessions
  (so they stay open), then the server's RSS (`/proc/PID/statm`) and Python heap
  (`tracemalloc`, started just before the streams open, so it counts only what they
  allocate and keep) minus before, over the number of streams.

One warm-up round, then `ROUNDS` measured rounds (fresh sessions each); the burst's rounds
take turns with the floors' (floor, handrail, floor...), so that a load that comes and goes on
a shared machine weighs on both alike. The target: at 200 concurrent streams, handrail's p99
time to first event ≤ `TARGET_RATIO` times the floor's (the streamed one) measured in the
same run, on the memory store. On SQLite (`--store sqlite`) the ratio is printed beside the
same bound but the target is retired: SQLite is the one-machine default, and its store
thread's CPU adds to the event loop's under the GIL (about 2.1x where memory meets 1.5x).
(It was p99 ≤ 50 ms, but on a two-core machine whose cores the client shares, the floor
alone measures 33-74 ms.) Also printed round by round (each of handrail's rounds over
the floor's round next to it), to tell a change of the code from the machine's noise: the
same code's ratio has moved from 1.3x to 2.1x between the rounds of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from typing import Any

TARGET_RATIO = 1.5
"""handrail's burst p99 over the streamed floor's, at most (the memory store's target)."""
RETIRED = (
    "target retired for SQLite (the one-machine default; its store thread's CPU adds to the "
    "event loop's under the GIL), the ratio printed to watch it"
)
"""Why the SQLite run's ratio is printed but not judged (issue 35, item 4)."""
WORDS = 40
ROUNDS = 7
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
KEY = "bench-key"
AUTH = f"Authorization: Bearer {KEY}\r\n"
STEADY_TURNS = 5
TWO_REQUESTS = False  # --two-requests: POST the turn (202), then GET its events
THINK = 0.02
STAGGER = 0.5
FLOORS = ("stream", "write")
TERMINAL = (b'"type":"run-completed"', b'"type":"run-suspended"', b'"type":"run-failed"')


# -- the server process -----------------------------------------------------------------------


class _Paced:
    """A model that streams each chunk `pace` seconds after the last, as a provider does."""

    def __init__(self, model: Any, pace: float) -> None:
        self.model, self.pace, self.name = model, pace, model.name

    async def stream(self, request: Any) -> AsyncIterator[Any]:
        async for chunk in self.model.stream(request):
            await asyncio.sleep(self.pace)
            yield chunk


def _engine(store_kind: str, db: str | None, pace: float = 0.0) -> Any:
    from handrail import Agent, Engine, MemoryStore, Runtime, tool
    from handrail.models import ModelRequest
    from handrail.testing import FunctionModel, Step, call

    @tool(name="orders.lookup", permission="read")
    async def lookup(order_id: str) -> dict[str, Any]:
        """Look an order up."""
        return {"order": order_id, "status": "delivered"}

    reply = " ".join(f"word{i}" for i in range(WORDS))

    def answer(request: ModelRequest) -> Step:
        if request.messages[-1].role == "user":
            return call("orders.lookup", order_id="A1042")
        return reply

    store: Any = MemoryStore()
    if store_kind == "sqlite":
        from handrail.store import SqliteStore

        assert db is not None
        store = SqliteStore(db)
    agent = Agent("support", tools=[lookup])
    model: Any = FunctionModel(answer)
    if pace:
        model = _Paced(model, pace)
    return Engine(agent, store=store, runtime=Runtime(model=model))


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_KB


def _with_probe(app: Any) -> Any:
    """`app`, plus `/_bench/memory` (RSS, traced heap, and the times to first event the server
    measured since the last probe) and `/_bench/trace` (start)."""

    firsts: list[float] = []  # ms from the app's call to the first event, turn by turn
    # CPU seconds (this thread, the event loop's; and the process's) at `/_bench/mark`, and
    # when the latest first event went out since.
    marked = [0.0, 0.0]
    last_first = [0.0, 0.0]

    async def probed(scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/_bench/"):
            if not path.endswith("/turns"):
                await app(scope, receive, send)
                return
            called = time.perf_counter()

            async def timed(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.body" and b"data:" in message["body"]:
                    nonlocal called
                    if called:
                        firsts.append((time.perf_counter() - called) * 1000)
                        called = 0.0
                        last_first[:] = time.thread_time(), time.process_time()
                await send(message)

            await app(scope, receive, timed)
            return
        if path == "/_bench/mark":
            marked[:] = last_first[:] = time.thread_time(), time.process_time()
        if path == "/_bench/trace":
            tracemalloc.start()
        traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
        served = []
        if path in ("/_bench/memory", "/_bench/trace"):  # (mark and cpu: within a round)
            served = list(firsts)
            firsts.clear()
        cpu = {"main_ms": (last_first[0] - marked[0]) * 1000}
        cpu["all_ms"] = (last_first[1] - marked[1]) * 1000
        body = json.dumps(
            {"rss_kb": _rss_kb(), "traced": traced, "firsts": served, "cpu": cpu}
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return probed


def _floor_app(streamed: bool) -> Any:
    """A bare Starlette app with the routes the client uses: a turn answers one SSE event,
    `streamed` (Starlette's `StreamingResponse`) or in one response with its length."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    event = b'id: 1\ndata: {"type":"run-completed"}\n\n'

    async def session(request: Request) -> Response:
        return JSONResponse({"id": "floor"}, status_code=201)

    async def turn(request: Request) -> Response:
        await request.body()
        if not streamed:
            return Response(event, media_type="text/event-stream")

        async def events() -> AsyncIterator[bytes]:
            yield event

        return StreamingResponse(events(), media_type="text/event-stream")

    routes = [
        Route("/sessions", session, methods=["POST"]),
        Route("/sessions/{session_id}/turns", turn, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def serve(store_kind: str, db: str | None, pace: float, floor: str | None = None) -> None:
    """Serve the bench engine (or the floor's bare app) on 127.0.0.1 at a free port; print the
    port, then serve."""
    import socket

    import uvicorn

    from handrail.server import (
        ApiKeyAuthenticator,
        Caller,
        Limits,
        create_app,
        server_config,
        tune_gc,
    )

    if floor is not None:
        app = _with_probe(_floor_app(streamed=floor == "stream"))
    else:
        engine = _engine(store_kind, db, pace)
        keys = ApiKeyAuthenticator({KEY: Caller("bench", "bench")})
        # One tenant's burst of 200 turns: the per-tenant limits (429s) are not what is measured.
        unlimited = Limits(rate=None, streams=None, turns=None)
        app = _with_probe(create_app(engine, authenticator=keys, static_dir=None, limits=unlimited))
    # IPPROTO_TCP named, or asyncio leaves Nagle on for the accepted connections (it sets
    # TCP_NODELAY only on sockets whose proto says TCP), and each response waits ~40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    tune_gc()  # as `handrail serve` does
    # As `handrail serve` configures uvicorn (its connection guards included).
    config = server_config(app, log_level="warning", lifespan="on", backlog=4096)
    uvicorn.Server(config).run(sockets=[sock])


# -- the client -------------------------------------------------------------------------------


class _Connection:
    """A bare HTTP/1.1 client on one keep-alive connection: httpx costs the client more CPU
    than the server spends, and on a shared machine that would be measured as latency."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> _Connection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def close(self) -> None:
        self.writer.close()

    def send(self, method: str, path: str, body: bytes = b"", *, stream: bool = False) -> None:
        head = f"{method} {path} HTTP/1.1\r\nHost: bench\r\n{AUTH}Content-Length: {len(body)}\r\n"
        if stream:
            head += "Accept: text/event-stream\r\n"
        if body:
            head += "Content-Type: application/json\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)

    async def head(self) -> tuple[int, dict[str, str]]:
        status = int((await self.reader.readline()).split()[1])
        headers = {}
        while (line := await self.reader.readline()) != b"\r\n":
            name, _, value = line.decode().partition(":")
            headers[name.lower()] = value.strip()
        return status, headers

    async def json(self, method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
        self.send(method, path, body)
        status, headers = await self.head()
        return status, json.loads(await self.reader.readexactly(int(headers["content-length"])))

    async def body(self, headers: dict[str, str]) -> AsyncIterator[bytes]:
        """The body of a response: chunk by chunk if chunked, else whole."""
        if "content-length" in headers:
            yield await self.reader.readexactly(int(headers["content-length"]))
            return
        while size := int((await self.reader.readline()).strip(), 16):
            yield await self.reader.readexactly(size)
            await self.reader.readexactly(2)
        await self.reader.readexactly(2)  # the empty line after the last chunk


async def _turn(
    port: int,
    session_id: str,
    go: asyncio.Event | None = None,
    connection: _Connection | None = None,
) -> tuple[float, int]:
    """Run a turn of `session_id` and read its stream: ms to its first event, and events.

    On `connection` (kept open, read to the end of the answer), else on a new connection.
    """
    kept = connection is not None
    if connection is None:
        connection = await _Connection.open(port)
    try:
        if go is not None:
            await go.wait()
        start = time.perf_counter()
        turn, text = f"/sessions/{session_id}/turns", b'{"text": "Where is A1042?"}'
        if TWO_REQUESTS:
            status, accepted = await connection.json("POST", turn, text)
            assert status == 202, accepted
            connection.send("GET", accepted["events"])
        else:  # the turn's events stream in the answer to its POST
            connection.send("POST", turn, text, stream=True)
        status, headers = await connection.head()
        assert status == 200
        first: float | None = None
        count = 0
        async for chunk in connection.body(headers):
            if b"data:" not in chunk:
                continue  # a keep-alive comment
            count += chunk.count(b"\ndata:") + chunk.startswith(b"data:")
            if first is None:
                first = time.perf_counter()
            if any(t in chunk for t in TERMINAL) and not kept:
                break
        assert first is not None
        return (first - start) * 1000, count
    finally:
        if not kept:
            connection.close()


async def _sessions(port: int, n: int) -> list[str]:
    connection = await _Connection.open(port)
    try:
        return [(await connection.json("POST", "/sessions"))[1]["id"] for _ in range(n)]
    finally:
        connection.close()


async def _burst(port: int, n: int) -> dict[str, Any]:
    """`n` turns started at the same instant."""
    ids = await _sessions(port, n)
    go = asyncio.Event()
    tasks = [asyncio.create_task(_turn(port, i, go)) for i in ids]
    await asyncio.sleep(0.2)  # every connection is open
    await _probe(port, "mark")
    began = time.perf_counter()
    go.set()
    results = await asyncio.gather(*tasks)
    seconds = time.perf_counter() - began
    return {
        "ttfe_ms": [r[0] for r in results],
        "events": sum(r[1] for r in results),
        "seconds": seconds,
        "cpu": (await _probe(port, "cpu"))["cpu"],
    }


async def _steady(port: int, n: int, turns: int) -> dict[str, Any]:
    """`n` clients, each on a connection of its own, running its turns one after the other."""
    ids = await _sessions(port, n)
    ttfe: list[float] = []
    events = 0

    pauses = random.Random(7)

    async def client(session_id: str) -> None:
        nonlocal events
        connection = await _Connection.open(port)
        try:
            await asyncio.sleep(pauses.uniform(0, STAGGER))  # clients come one by one
            for _ in range(turns):
                await asyncio.sleep(pauses.uniform(0, THINK))
                ms, count = await _turn(port, session_id, connection=connection)
                ttfe.append(ms)
                events += count
        finally:
            connection.close()

    began = time.perf_counter()
    await asyncio.gather(*(client(i) for i in ids))
    return {"ttfe_ms": ttfe, "events": events, "seconds": time.perf_counter() - began}


async def _probe(port: int, what: str) -> dict[str, Any]:
    connection = await _Connection.open(port)
    try:
        return dict((await connection.json("GET", f"/_bench/{what}"))[1])
    finally:
        connection.close()


async def _memory(port: int, n: int) -> tuple[float, float]:
    """KB of RSS and of traced Python heap per open stream, with `n` streams open."""
    ids = await _sessions(port, n)
    await asyncio.sleep(0.5)  # let the server settle
    before = await _probe(port, "trace")
    connections = [await _Connection.open(port) for _ in ids]
    try:
        for connection, session_id in zip(connections, ids, strict=True):
            connection.send("GET", f"/sessions/{session_id}/events?follow=true")
        for connection in connections:
            assert (await connection.head())[0] == 200
        await asyncio.sleep(1.5)  # every stream has read its (empty) log and waits
        during = await _probe(port, "memory")
    finally:
        for connection in connections:
            connection.close()
    rss = (during["rss_kb"] - before["rss_kb"]) / n
    traced = (during["traced"] - before["traced"]) / 1024 / n
    return rss, traced


def _percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q`th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    ttfe = [t for r in rounds for t in r["ttfe_ms"]]
    return {
        "p50": statistics.median(ttfe),
        "p99": _percentile(ttfe, 99),
        "max": max(ttfe),
        "events_per_s": sum(r["events"] for r in rounds) / sum(r["seconds"] for r in rounds),
        "events_per_turn": sum(r["events"] for r in rounds) / len(ttfe),
        "round_p99s": [_percentile(r["ttfe_ms"], 99) for r in rounds],
        "round_cpus": [r["cpu"] for r in rounds if "cpu" in r],
    }


async def _measured(ports: dict[str, int], n: int) -> dict[str, dict[str, Any]]:
    """The burst against each server of `ports` (by name): a warm-up each (imports, caches, the
    allocator's arenas), then `ROUNDS` rounds, the servers taking turns within each round."""
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in ports}
    for port in ports.values():
        await _burst(port, n)
        await _probe(port, "memory")  # forget the warm-up's times in the server
    for _ in range(ROUNDS):
        for name, port in ports.items():
            rounds[name].append(await _burst(port, n))
    summaries = {name: _summary(r) for name, r in rounds.items()}
    for name, port in ports.items():
        summaries[name]["served"] = (await _probe(port, "memory"))["firsts"]
    return summaries


async def _bench(ports: dict[str, int], n: int) -> dict[str, Any]:
    result: dict[str, Any] = await _measured(ports, n)
    port = ports["burst"]
    steady = _summary([await _steady(port, n, turns=STEADY_TURNS)])
    steady["served"] = (await _probe(port, "memory"))["firsts"]
    result["steady"] = steady
    result["rss_kb"], result["traced_kb"] = await _memory(port, n)
    return result


async def _wait_up(port: int, process: subprocess.Popen[str]) -> None:
    for _ in range(200):
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}")
        try:
            await _probe(port, "memory")
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise SystemExit("the server did not start")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run(main: Any) -> Any:
    """Run the client on uvloop when it is installed: the cheaper the client, the less of
    its own work (on the same two cores) is measured as the server's latency."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - the server extra installs it
        return asyncio.run(main)
    return uvloop.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.server", description=__doc__)
    parser.add_argument("--streams", type=int, default=200, help="concurrent turns")
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    parser.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="seconds between the model's chunks (0: as fast as it can; 0.02 is a fast LLM)",
    )
    parser.add_argument(
        "--two-requests",
        action="store_true",
        help="POST the turn (202), then GET its events (default: the POST's answer streams)",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--floor", choices=FLOORS, help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global TWO_REQUESTS
    TWO_REQUESTS = args.two_requests
    if args.serve:
        serve(args.store, args.db, args.pace, floor=args.floor)
        return

    import tempfile

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as servers:
        command = [sys.executable, "-m", "bench.server", "--serve", "--store", args.store]
        command += ["--pace", str(args.pace)]
        command += ["--db", os.path.join(tmp, "bench.db")]
        # All three serve at once (the idle ones cost nothing), so that their rounds can
        # take turns: stream floor, handrail, write floor.
        ports, pids = {}, {}
        for name, floor in (
            ("stream", ["--floor", "stream"]),
            ("burst", []),
            ("write", ["--floor", "write"]),
        ):
            ports[name], pids[name] = servers.enter_context(_serving([*command, *floor]))
        result = _run(_bench(ports, args.streams))
        result["server_cpu_s"] = _cpu_seconds(pids["burst"])
        result["client_cpu_s"] = _cpu_seconds(os.getpid())
    _print(result, args.streams, args.store, args.pace)


@contextlib.contextmanager
def _serving(command: list[str]) -> Iterator[tuple[int, int]]:
    """Run the server `command`; its port and process id while it serves."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        asyncio.run(_wait_up(port, process))
        yield port, process.pid
    finally:
        process.terminate()
        process.wait(timeout=10)


def _print(result: dict[str, Any], n: int, store: str, pace: float) -> None:
    burst, steady = result["burst"], result["steady"]
    print(
        f"Server under load: uvicorn on loopback in its own process, scripted model "
        f"({f'a chunk every {pace * 1000:g} ms' if pace else 'unpaced'}), {store} "
        f"store, {burst['events_per_turn']:.0f} events a turn; the client is this process"
    )
    print(f"  burst: {n} turns posted at the same instant ({ROUNDS} rounds after a warm-up)")
    print(
        f"  steady: {n} clients each running {STEADY_TURNS} turns, one after the other, on "
        f"keep-alive connections, a pause of 0-{THINK * 1000:g} ms before each, the clients "
        f"starting over {STAGGER * 1000:g} ms"
    )
    print(
        "  floor: the burst against a bare Starlette endpoint on the same stack, answering "
        "one event in a StreamingResponse (stream) or in one write (write)"
    )
    columns = (burst, steady, result["stream"], result["write"])
    print(f"{'':34} {'burst':>10} {'steady':>10} {'floor:':>10} {'':>10}")
    print(f"{'':34} {'':>10} {'':>10} {'stream':>10} {'write':>10}")
    rows = [
        ("time to first event p50, ms", "p50", "{:.1f}"),
        ("time to first event p99, ms", "p99", "{:.1f}"),
        ("time to first event max, ms", "max", "{:.1f}"),
        ("events/s", "events_per_s", "{:,.0f}"),
    ]
    for label, key, form in rows[:3]:
        values = " ".join(f"{form.format(r[key]):>10}" for r in columns)
        print(f"{label:34} {values}")
    if not TWO_REQUESTS:  # the same, timed inside the server (from the app's call)
        for q in (50, 99):
            values = " ".join(f"{_percentile(r['served'], q):10.1f}" for r in columns)
            print(f"{f'  in the server alone p{q}, ms':34} {values}")
    for label, key in (
        ("  server CPU, main thread, ms", "main_ms"),
        ("  all threads, ms", "all_ms"),
    ):
        cells = [
            f"{statistics.median(c[key] for c in r['round_cpus']):10.1f}" if r["round_cpus"] else ""
            for r in columns
        ]
        print(f"{label:34} {cells[0]:>10} {'':>10} {cells[2]:>10} {cells[3]:>10}")
    label, key, form = rows[3]
    print(f"{label:34} {form.format(burst[key]):>10} {form.format(steady[key]):>10}")
    print(f"{'KB per open stream, RSS':34} {result['rss_kb']:10.1f}")
    print(f"{'KB per open stream, Python heap':34} {result['traced_kb']:10.1f}")
    cpu = f"{result['server_cpu_s']:.1f} / {result['client_cpu_s']:.1f}"
    print(f"{'CPU s, server / client':34} {cpu:>10}")
    floor = result["stream"]["p99"]
    ratio = burst["p99"] / floor
    verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
    if store == "sqlite":  # printed, and judged against nothing: see RETIRED
        verdict = f"{'within' if ratio <= TARGET_RATIO else 'above'} it; {RETIRED}"
    # Round by round (each of handrail's rounds against the floor's next to it): on a shared
    # machine the floor alone moves by 2x from run to run, so the spread tells a change of the
    # code from the machine's weather. The verdict stays on the pooled p99s.
    floors = result["stream"]
    _by_round("burst p99 / floor p99", burst["round_p99s"], floors["round_p99s"])
    # What moves less with the machine than a p99: the server's CPU until the last first event.
    _by_round(
        "server main-thread CPU to the last first event / floor's",
        [c["main_ms"] for c in burst["round_cpus"]],
        [c["main_ms"] for c in floors["round_cpus"]],
    )
    target = "target" if store == "memory" else "retired target (SQLite)"
    print(
        f"{target}, p99 to the first event at {n} concurrent streams ≤ {TARGET_RATIO:g}x the "
        f"streamed floor's: burst {burst['p99']:.1f} ms / floor {floor:.1f} ms = "
        f"{ratio:.2f}x: {verdict} ({store} store)"
    )


def _by_round(what: str, ours: list[float], floors: list[float]) -> None:
    """Print handrail's rounds over the floor's rounds next to them, and their median."""
    ratios = [b / f for b, f in zip(ours, floors, strict=True)]
    spread = ", ".join(f"{r:.2f}" for r in ratios)
    print(f"round by round, {what}: {spread} (median {statistics.median(ratios):.2f}x)")


if __name__ == "__main__":
    main()
