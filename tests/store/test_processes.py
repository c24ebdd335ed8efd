"""Compare-and-swap and leases hold between real processes sharing one SQLite file or one
PostgreSQL schema."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from handrail.audit import verify
from handrail.store import SessionRecord, SessionStore, SqliteStore

from .conftest import PG_DSN, empty_pg_schema

WORKER = Path(__file__).with_name("worker.py")
PROCESSES, TIMES = 4, 25
Shared = tuple[str, str, str, SessionStore]  # kind, target, schema, this process's store


async def run_workers(args: list[list[str]]) -> list[dict[str, Any]]:
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), *a, stdout=asyncio.subprocess.PIPE
        )
        for a in args
    ]
    outputs = await asyncio.gather(*(p.communicate() for p in procs))
    assert [p.returncode for p in procs] == [0] * len(procs)
    return [json.loads(out) for out, _ in outputs]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def shared(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Shared]:
    """(kind, target, schema, a store of this process on the same database)."""
    if request.param == "sqlite":
        path = str(tmp_path / "shared.db")
        async with SqliteStore(path) as store:
            yield "sqlite", path, "-", store
        return
    from handrail.store import PostgresStore

    schema = request.getfixturevalue("pg_schema")
    async with PostgresStore(PG_DSN, schema=schema) as store:
        await empty_pg_schema(schema)
        yield "postgres", PG_DSN, schema, store


async def test_processes_incrementing_one_session_lose_no_update(shared: Shared) -> None:
    kind, target, schema, store = shared
    await store.save(SessionRecord(id="counter", data={"count": 0, "by": []}))
    start = str(time.time() + 1.0)
    results = await run_workers(
        [["count", kind, target, schema, str(TIMES), f"p{n}", start] for n in range(PROCESSES)]
    )
    final = await store.load("counter")
    assert final is not None
    assert final.data["count"] == PROCESSES * TIMES
    assert final.version == PROCESSES * TIMES + 1
    assert sorted(final.data["by"]) == sorted(
        f"p{n}" for n in range(PROCESSES) for _ in range(TIMES)
    )
    print(f"{kind}: {sum(r['conflicts'] for r in results)} conflicts retried")


async def test_of_processes_racing_for_a_lease_exactly_one_wins(shared: Shared) -> None:
    kind, target, schema, store = shared
    await store.save(SessionRecord(id="counter", data={"count": 0, "by": []}))
    start = str(time.time() + 1.0)
    results = await run_workers(
        [["lease", kind, target, schema, f"w{n}", start] for n in range(PROCESSES)]
    )
    assert [r["acquired"] for r in results].count(True) == 1


async def test_processes_appending_to_one_audit_trail_keep_one_chain(shared: Shared) -> None:
    kind, target, schema, store = shared
    start = str(time.time() + 1.0)
    results = await run_workers(
        [["audit", kind, target, schema, str(TIMES), f"p{n}", start] for n in range(PROCESSES)]
    )
    trail = await store.audit("acme", limit=1000)
    assert [e.seq for e in trail] == list(range(1, PROCESSES * TIMES + 1))
    assert verify(trail) == []  # one chain: no seq twice, no entry chained to a stale tail
    assert sorted(seq for r in results for seq in r["seqs"]) == [e.seq for e in trail]
    for n in range(PROCESSES):
        assert sum(e.session_id == f"p{n}" for e in trail) == TIMES
