"""`python -m bench.decided`: one person's latest decisions in a long audit trail (SQLite, PG).

One organisation's trail of 500,000 entries (`--quick`: 50,000): 200 people, half of the
entries decisions (`who` the decider), half calls (`who` the session's user), bulk-loaded
(`executemany` on SQLite, `COPY` on PostgreSQL) as schema 6 stores them. The entries are not
chained (reads never check the chain).

Timed, one after the other for people drawn at random (`time.perf_counter`, sequential):

- `who index`: `store.audit(org, who=p, kind="decision", newest_first=True, limit=20)`, what
  `GET /me/decided` reads: p50 and p99 over 200 reads.
- `baseline`: what finding them cost before `who=`: the organisation's decisions read a page
  of 1,000 at a time (`kind="decision"`, oldest first), kept if `who` is the person, to the
  end (the newest are last): over 3 reads.

PostgreSQL runs when a server answers at $HANDRAIL_BENCH_PG_DSN (default
postgresql://postgres@127.0.0.1:5432/test), in a schema of its own dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import statistics
import tempfile
import time
from pathlib import Path

from handrail.audit import AuditEntry
from handrail.store import SessionStore, SqliteStore

PG_DSN = os.environ.get("HANDRAIL_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
PEOPLE = [f"user-{n:03d}" for n in range(200)]
ORG = "acme"


def rows(count: int) -> list[tuple[object, ...]]:
    """The trail's rows: (org_id, seq, kind, session_id, tool, hash, entry, who)."""
    rng = random.Random(7)
    out: list[tuple[object, ...]] = []
    for seq in range(1, count + 1):
        kind = "decision" if seq % 2 else "call"
        who = rng.choice(PEOPLE)
        entry = AuditEntry(
            org_id=ORG, seq=seq, at=1.7e9 + seq, kind=kind, session_id=f"s-{seq // 4}",
            tool="orders.refund", tool_call_id=f"call_{seq}", who=who,
            decision="approve" if kind == "decision" else None,
            outcome="ok" if kind == "call" else None, prev_hash="0" * 64, hash=f"{seq:064x}",
        )  # fmt: skip
        text = json.dumps(entry.to_json())
        out.append((ORG, seq, kind, entry.session_id, entry.tool, entry.hash, text, who))
    return out


async def timed(store: SessionStore, name: str) -> None:
    rng = random.Random(11)
    indexed: list[float] = []
    for _ in range(200):
        who = rng.choice(PEOPLE)
        start = time.perf_counter()
        found = await store.audit(ORG, who=who, kind="decision", newest_first=True, limit=20)
        indexed.append((time.perf_counter() - start) * 1000)
        assert len(found) == 20 and all(e.who == who for e in found)
    scans: list[float] = []
    for _ in range(3):
        who = rng.choice(PEOPLE)
        start = time.perf_counter()
        mine: list[AuditEntry] = []
        after = 0
        while page := await store.audit(ORG, after=after, limit=1000, kind="decision"):
            mine += [e for e in page if e.who == who]
            after = page[-1].seq
        scans.append((time.perf_counter() - start) * 1000)
    p99 = statistics.quantiles(indexed, n=100)[98]
    print(
        f"{name:<10} who index: p50 {statistics.median(indexed):7.2f} ms  p99 {p99:7.2f} ms   "
        f"baseline (scan the decisions): median {statistics.median(scans):9.1f} ms"
    )


async def sqlite(trail: list[tuple[object, ...]]) -> None:
    import sqlite3

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "bench.db"
        async with SqliteStore(path) as made:
            await made.audit(ORG)  # the schema, made on first use
        with sqlite3.connect(path) as db:
            db.executemany(
                "INSERT INTO handrail_audit (org_id, seq, kind, session_id, tool, hash, entry, "
                "who) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                trail,
            )
        db.close()
        async with SqliteStore(path) as store:
            await timed(store, "SQLite")


async def postgres(trail: list[tuple[object, ...]]) -> None:
    try:
        import psycopg

        from handrail.store import PostgresStore

        store = await PostgresStore.connect(PG_DSN, schema=f"bench_{secrets.token_hex(4)}")
    except Exception as error:  # no server: say so, skip
        print(f"PostgreSQL skipped: {error}")
        return
    s = f'"{store.schema}"'
    try:
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as db:
            async with db.cursor().copy(
                f"COPY {s}.handrail_audit (org_id, seq, kind, session_id, tool, hash, entry, "
                "who) FROM STDIN"
            ) as copy:
                for row in trail:
                    await copy.write_row(row)
            await db.execute(f"ANALYZE {s}.handrail_audit")
        await timed(store, "PostgreSQL")
    finally:
        await store.close()
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as db:
            await db.execute(f"DROP SCHEMA {s} CASCADE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50,000 entries, not 500,000")
    count = 50_000 if parser.parse_args().quick else 500_000
    trail = rows(count)
    print(f"one organisation's trail of {count:,} entries, {len(PEOPLE)} people")
    asyncio.run(sqlite(trail))
    asyncio.run(postgres(trail))


if __name__ == "__main__":
    main()
