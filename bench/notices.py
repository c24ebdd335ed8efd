"""Event-log notices on PostgreSQL: how soon another process hears of an append, and what
they cost: `python -m bench.notices [--dsn DSN]`.

Two stores on one schema stand for two processes. Printed:

- latency: one store appends an event (every 5 ms, 300 times); the other's `listen_events`
  hears of it. p50 and p99 of the append alone, and of the append until the notice is heard.
- batching: 8 sessions append 250 events each at once; how many NOTIFY statements carried
  their 2,000 notices (a commit that notifies takes a lock all such commits wait for).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import time
from typing import Any

from handrail.store import PostgresStore


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


async def _latency(dsn: str, schema: str) -> None:
    async with (
        PostgresStore(dsn, schema=schema) as writer,
        PostgresStore(dsn, schema=schema) as reader,
        reader.listen_events() as notices,
    ):
        appends: list[float] = []
        heard: list[float] = []
        for _ in range(300):
            start = time.perf_counter()
            last = await writer.append_events("latency", [{"type": "text-delta"}])
            appends.append(time.perf_counter() - start)
            while (await anext(notices))[1] < last:
                pass
            heard.append(time.perf_counter() - start)
            await asyncio.sleep(0.005)
    print(
        f"append: p50 {_quantile(appends, 0.5) * 1e3:.2f} ms, p99 "
        f"{_quantile(appends, 0.99) * 1e3:.2f} ms; append until heard by another store: p50 "
        f"{_quantile(heard, 0.5) * 1e3:.2f} ms, p99 {_quantile(heard, 0.99) * 1e3:.2f} ms"
    )


async def _batching(dsn: str, schema: str) -> None:
    async with PostgresStore(dsn, schema=schema, pool_size=8) as store:
        statements = 0
        fetch = store._fetch

        async def counting(
            query: str, params: dict[str, Any], session_id: str | None
        ) -> list[tuple[Any, ...]]:
            nonlocal statements
            statements += "pg_notify" in query
            return await fetch(query, params, session_id)

        store._fetch = counting  # type: ignore[method-assign]

        async def session(n: int) -> None:
            for _ in range(250):
                await store.append_events(f"batching-{n}", [{"type": "text-delta"}])

        await asyncio.gather(*(session(n) for n in range(8)))
    print(f"2,000 appends from 8 sessions at once: {statements} NOTIFY statements")


async def main(dsn: str) -> None:
    schema = f"bench_notices_{secrets.token_hex(3)}"
    try:
        await _latency(dsn, schema)
        await _batching(dsn, schema)
    finally:
        import psycopg

        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
            await connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    asyncio.run(main(parser.parse_args().dsn))
