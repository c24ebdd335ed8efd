"""`python -m bench.stores`: how long a session takes to save and load, in each store.

A session of 20 messages (about 8 KB of JSON; and one of 200, about 78 KB) is saved and
loaded back, one after the other,
as the engine does at a pause (save) and a resume (load). Medians and 95th percentiles in
microseconds of sequential round trips after a warm-up, timed with `time.perf_counter_ns`.
SQLite is a file in a temporary directory, once with `synchronous=FULL` (the default: every
commit synced to disk) and once with `NORMAL`. PostgreSQL runs when a server answers at
$HANDRAIL_BENCH_PG_DSN (default postgresql://postgres@127.0.0.1:5432/test), in a schema of its
own that is dropped afterwards.

Target: a pause/resume on SQLite in at most 3 ms overall, so a save + load well under 1 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from handrail import MemoryStore, SessionRecord, SessionStore
from handrail.store import SqliteStore

PG_DSN = os.environ.get("HANDRAIL_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
TARGET_US = 1000.0


def session_document(messages: int = 20) -> dict[str, Any]:
    """A conversation like the engine's: user turns, tool calls with results, replies."""
    conversation: list[dict[str, Any]] = []
    for n in range(messages):
        if n % 4 == 0:
            part = {
                "type": "text",
                "text": f"Customer message {n}: my order A10{n} is late, please help. " * 6,
            }
            conversation.append({"id": f"msg_{n}", "role": "user", "parts": [part]})
        elif n % 4 == 1:
            call = {
                "type": "tool-call", "id": f"call_{n}", "name": "orders.lookup",
                "status": "completed", "args": {"order_id": f"A10{n}"},
                "result": {"ok": True, "summary": f"Order A10{n}: shipped",
                           "data": {"id": f"A10{n}", "status": "shipped", "total": 84.5,
                                    "items": [{"sku": "B-2", "qty": 1}, {"sku": "C-3", "qty": 2}]}},
            }  # fmt: skip
            conversation.append({"id": f"msg_{n}", "role": "assistant", "parts": [call]})
        else:
            part = {
                "type": "text",
                "text": f"Reply {n}: your order is on its way, sorry for the wait. " * 6,
            }
            conversation.append({"id": f"msg_{n}", "role": "assistant", "parts": [part]})
    return {
        "messages": conversation,
        "context": {"vars": {"cart": {"total": 31.5, "items": ["A-1", "B-2"]}}},
        "usage": {"input_tokens": 5120, "output_tokens": 812, "requests": 9},
        "turn": 5,
    }


async def round_trips(
    store: SessionStore, messages: int, repeat: int, warmup: int
) -> dict[str, float]:
    record = await store.save(
        SessionRecord(id=f"bench-{messages}", data=session_document(messages))
    )
    saves: list[float] = []
    loads: list[float] = []
    for n in range(warmup + repeat):
        record.data["turn"] = n
        started = time.perf_counter_ns()
        record = await store.save(record)
        saved = time.perf_counter_ns()
        loaded = await store.load(record.id)
        done = time.perf_counter_ns()
        assert loaded is not None and loaded.version == record.version
        record = loaded
        if n >= warmup:
            saves.append((saved - started) / 1000)
            loads.append((done - saved) / 1000)
    trips = [s + lo for s, lo in zip(saves, loads, strict=True)]
    return {
        "messages": messages,
        "save_us": statistics.median(saves),
        "load_us": statistics.median(loads),
        "round_trip_us": statistics.median(trips),
        "round_trip_p95_us": statistics.quantiles(trips, n=20)[-1],
        "document_bytes": len(json.dumps(record.data, separators=(",", ":"))),
    }


@asynccontextmanager
async def postgres() -> AsyncIterator[SessionStore | str]:
    """A PostgresStore in a schema of its own, or why there is none."""
    try:
        import psycopg

        from handrail.store import PostgresStore
    except ImportError:
        yield 'skipped: pip install "handrail[postgres]"'
        return
    schema = f"handrail_bench_{os.getpid()}"
    try:
        store = await PostgresStore.connect(PG_DSN, schema=schema, pool_size=2, connect_timeout=3)
    except Exception as error:
        yield f"skipped: {str(error).split('. ')[0]}"
        return
    try:
        yield store
    finally:
        await store.close()
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
            await connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def main(quick: bool) -> list[dict[str, Any]]:
    repeat, warmup = (200, 20) if quick else (2000, 200)
    results: list[dict[str, Any]] = []

    async def measure(name: str, store: SessionStore) -> None:
        for messages in (20, 200):
            numbers = await round_trips(store, messages, repeat // (messages // 20), warmup)
            results.append({"store": name, **numbers})

    with tempfile.TemporaryDirectory() as directory:
        for name, store in [
            ("memory", MemoryStore()),
            ("sqlite FULL", SqliteStore(Path(directory) / "full.db")),
            ("sqlite NORMAL", SqliteStore(Path(directory) / "normal.db", synchronous="NORMAL")),
        ]:
            async with store:
                await measure(name, store)
    async with postgres() as store:
        if isinstance(store, str):
            results.append({"store": "postgres", "skipped": store})
        else:
            await measure("postgres", store)
    return results


def show(results: list[dict[str, Any]], quick: bool) -> None:
    columns = ["messages", "save µs", "load µs", "save+load µs", "p95 µs", "doc bytes"]
    print(f"{'store':<15}" + "".join(f"{c:>14}" for c in columns) + "  target (20 messages)")
    for r in results:
        if "skipped" in r:
            print(f"{r['store']:<15}{r['skipped']}")
            continue
        values = [r["save_us"], r["load_us"], r["round_trip_us"], r["round_trip_p95_us"]]
        target = ""
        if r["messages"] == 20:
            target = "✓ ≤ 1 ms" if r["round_trip_us"] <= TARGET_US else "✗ > 1 ms"
        print(
            f"{r['store']:<15}{r['messages']:>14}"
            + "".join(f"{v:>14,.1f}" for v in values)
            + f"{r['document_bytes']:>14,}  {target}"
        )
    runs = "200 (--quick)" if quick else "2,000"
    print(f"medians of {runs} sequential save+load round trips (a tenth of that for 200 messages)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.stores", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer round trips")
    parser.add_argument("--json", metavar="FILE", help="write the numbers to FILE")
    args = parser.parse_args()
    numbers = asyncio.run(main(args.quick))
    show(numbers, args.quick)
    if args.json:
        Path(args.json).write_text(json.dumps(numbers, indent=2))
