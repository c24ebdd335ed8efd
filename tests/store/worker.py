"""A separate process sharing a store with the tests: `python worker.py MODE KIND TARGET ...`.

    count KIND TARGET SCHEMA TIMES NAME START   add 1 to session "counter" TIMES times,
                                               loading again after each ConflictError
    lease KIND TARGET SCHEMA OWNER START       try once to take the lease of session "counter"
    audit KIND TARGET SCHEMA TIMES NAME START   append TIMES audit entries to org "acme" at
                                               once, as session NAME

KIND is sqlite (TARGET: the file) or postgres (TARGET: the DSN, in SCHEMA). Every worker
sleeps until the wall-clock time START so that they collide. Prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from handrail import AuditEntry
from handrail.store import ConflictError, PostgresStore, SessionStore, SqliteStore


def open_store(kind: str, target: str, schema: str) -> SessionStore:
    if kind == "sqlite":
        return SqliteStore(target, busy_timeout=30)
    return PostgresStore(target, schema=schema, pool_size=2)


async def count(store: SessionStore, times: int, name: str) -> dict[str, Any]:
    conflicts = 0
    for _ in range(times):
        while True:
            record = await store.load("counter")
            assert record is not None
            record.data["count"] += 1
            record.data["by"].append(name)
            try:
                await store.save(record)
                break
            except ConflictError:
                conflicts += 1
    return {"conflicts": conflicts}


async def main(mode: str, kind: str, target: str, schema: str, *rest: str) -> None:
    store = open_store(kind, target, schema)
    try:
        await store.load("counter")  # open (and migrate) before the start line
        await asyncio.sleep(max(0.0, float(rest[-1]) - time.time()))
        if mode == "count":
            result = await count(store, int(rest[0]), rest[1])
        elif mode == "audit":
            entries = [AuditEntry(org_id="acme", session_id=rest[1]) for _ in range(int(rest[0]))]
            appended = await asyncio.gather(*(store.append_audit(e) for e in entries))
            result = {"seqs": [e.seq for e in appended]}
        else:
            result = {"acquired": await store.acquire_lease("counter", rest[0], ttl=60)}
    finally:
        await store.close()
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
