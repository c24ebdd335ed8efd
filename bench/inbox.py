"""`python -m bench.inbox`: an inbox page at a million sessions, off the index (SQLite, PostgreSQL).

The store holds 1,000,000 sessions of 100 organisations, 100,000 of them waiting (1,000 an
organisation) with 110,000 cards: wipes (it-admin decides, four eyes), refunds (finance
decides) and mails (the requester's). The rows are cloned from sessions a real engine made
(`template`): each waiting session's document, messages and index rows are those the engine
wrote for its template, with its own id, times and organisation; the others are a completed
session's document. They are bulk-loaded (`executemany` on SQLite, `COPY` on PostgreSQL).

Then, through a real `Engine` over the store, timed one after the other for organisations
drawn at random (sequential round trips, `time.perf_counter`):

- `first page`: `Engine.pending(org, bo)`, bo an it-admin: the first 50 cards he may decide.
- `filtered by tool`: the same with `tool="orders.refund"` (a refund is not his to decide, so
  the query narrows to his own requests of it: few or none).
- `filtered by role`: `Engine.pending(org, fay)`, fay of finance: refunds only.
- `to decide`: `Inbox.sessions(org, bo, own=False)` (`GET /sessions?to_decide=true`).

Target: p99 <= 20 ms for each (CPU ms: the process's CPU time a page, its threads' included,
which other processes sharing the machine do not inflate as they do the wall-clock p99).
Memory: the process's RSS before and after the timed pages (flat: a page reads 50-odd rows
whatever the count). Baseline: the scan the inbox made before the index (each suspended
session of the organisation loaded, the rule applied to it), timed on a store of 1,000
waiting sessions in one organisation. `--quick`: 100,000 sessions, 10,000 waiting.
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
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from handrail import Agent, Decider, DecisionPolicy, Domain, Engine, Runtime, tool
from handrail.models import ModelRequest
from handrail.store import MemoryStore, SessionStore, SqliteStore
from handrail.store._waiting import COLUMNS, card_text, waiting_cards
from handrail.testing import FunctionModel, call

PG_DSN = os.environ.get("HANDRAIL_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
TARGET_MS = 20.0
ORGS = 100
BO = "bo"  # it-admin of every organisation
FAY = "fay"  # finance
REQUESTERS = ["ana", "al", "di", "eve"]


@tool(name="laptops.wipe", permission="destructive")
def wipe(laptop: str) -> str:
    """Wipe a laptop."""
    return f"wiped {laptop}"


@tool(
    name="orders.refund",
    permission="write",
    decision_policy=DecisionPolicy(roles={"finance"}),
)
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    return f"refunded {amount}"


@tool(name="mail.send", permission="write")
def send(to: str) -> str:
    """Send a mail."""
    return f"sent to {to}"


def answer(request: ModelRequest) -> Any:
    last = request.messages[-1]
    if last.role != "user":
        return "Done."
    verb, _, what = last.text.partition(" ")
    if verb == "wipe":
        return call("laptops.wipe", laptop=what)
    if verb == "refund":
        return call("orders.refund", order_id=what, amount=84.0)
    if verb == "both":
        return [call("laptops.wipe", laptop=what), call("mail.send", to=what)]
    if verb == "hello":
        return "Hello."
    return call("mail.send", to=what)


def make_engine(store: SessionStore) -> Engine:
    return Engine(
        Domain(
            agents=[Agent("desk", tools=[wipe, refund, send])],
            policies={"destructive": DecisionPolicy(roles={"it-admin"}, four_eyes=True)},
        ),
        store=store,
        runtime=Runtime(model=FunctionModel(answer)),
    )


async def ask(engine: Engine, session: str, text: str, org: str, user: str) -> None:
    async for _ in engine.submit(session, text, org_id=org, user_id=user):
        pass


# -- the template sessions, made by a real engine -------------------------------------------


class Template:
    """A session as the engine stored it: its row's fields, messages and index rows."""

    def __init__(
        self, status: str, data: str, messages: list[str], cards: list[tuple[Any, str]]
    ) -> None:
        self.status = status
        self.data = data
        self.messages = messages
        self.cards = cards  # (WaitingCard, its JSON text)


async def templates() -> tuple[list[Template], Template]:
    """The waiting shapes (wipe, refund, mail, wipe + mail) and a completed session."""
    store = MemoryStore()
    engine = make_engine(store)
    made: list[Template] = []
    for n, text in enumerate(["wipe L-1", "refund A-1", "mail x@acme", "both L-2", "hello"]):
        session = f"t{n}"
        await ask(engine, session, text, "acme", "ana")
        record = await store.load(session)
        assert record is not None
        state = await engine.session(session, org_id="acme", user_id="ana")
        cards = waiting_cards(state) if record.status == "suspended" else []
        messages = [json.dumps(m) for _, m in await store.messages(session, limit=1000)]
        made.append(
            Template(
                record.status,
                json.dumps(record.data),
                messages,
                [(c, card_text(session, c)) for c in cards],
            )
        )
    return made[:4], made[4]


class Plan:
    """Which session is which: ids, organisations, users, times (deterministic)."""

    def __init__(self, sessions: int, waiting: int, seed: int = 7) -> None:
        self.sessions, self.waiting = sessions, waiting
        self.every = sessions // waiting  # one in `every` waits
        self.rng = random.Random(seed)
        self.base = time.time() - 30 * 86400

    def rows(self, shapes: list[Template], done: Template) -> Any:
        """(id, org, user, status, template, created_at, updated_at) for every session."""
        for n in range(self.sessions):
            org = f"org{n % ORGS:03}"
            k = n // ORGS  # the session's place in its organisation
            j = k // self.every  # and among its waiting ones
            user = REQUESTERS[(j // len(shapes)) % len(REQUESTERS)]
            updated = self.base + n * (30 * 86400 / self.sessions)
            shape = shapes[j % len(shapes)] if k % self.every == 0 else done
            yield f"s{n:08}", org, user, shape, updated - 60, updated


def card_row(
    session: str,
    org: str,
    user: str,
    created: float,
    updated: float,
    position: int,
    card: Any,
    text: str,
) -> tuple[Any, ...]:
    raised = updated - 1.0
    cloned = json.loads(text)
    cloned["created_at"], cloned["expires_at"] = raised, raised + 86400
    return (
        session, org, user, 3, created, updated, raised + 86400, position, card.tool_call_id,
        card.tool, card.kind, card.agent, raised, json.dumps(cloned, separators=(",", ":")),
    )  # fmt: skip


# -- loading -----------------------------------------------------------------------------------


async def load_sqlite(path: Path, plan: Plan, shapes: list[Template], done: Template) -> float:
    started = time.perf_counter()
    async with SqliteStore(path) as store:  # the schema
        await store.summary("none")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA synchronous=OFF")
    db.execute("BEGIN")
    sessions: list[tuple[Any, ...]] = []
    messages: list[tuple[Any, ...]] = []
    cards: list[tuple[Any, ...]] = []

    def flush() -> None:
        db.executemany(
            "INSERT INTO handrail_sessions (id, org_id, user_id, status, version, created_at, "
            "updated_at, expires_at, data, window_start) VALUES (?, ?, ?, ?, 3, ?, ?, ?, ?, 0)",
            sessions,
        )
        db.executemany("INSERT INTO handrail_messages VALUES (?, ?, ?)", messages)
        db.executemany(
            f"INSERT INTO handrail_cards ({COLUMNS}) VALUES ({','.join('?' * 14)})", cards
        )
        sessions.clear(), messages.clear(), cards.clear()

    for session, org, user, shape, created, updated in plan.rows(shapes, done):
        waits = shape.status == "suspended"
        expires = updated - 1.0 + 86400 if waits else None
        sessions.append((session, org, user, shape.status, created, updated, expires, shape.data))
        if waits:
            messages += [(session, i, m) for i, m in enumerate(shape.messages)]
            cards += [
                card_row(session, org, user, created, updated, i, c, t)
                for i, (c, t) in enumerate(shape.cards)
            ]
        if len(sessions) >= 20_000:
            flush()
    flush()
    db.execute("COMMIT")
    db.execute("ANALYZE")
    db.close()
    return time.perf_counter() - started


async def load_postgres(schema: str, plan: Plan, shapes: list[Template], done: Template) -> float:
    import psycopg

    from handrail.store import PostgresStore

    started = time.perf_counter()
    store = await PostgresStore.connect(PG_DSN, schema=schema)  # the schema
    await store.close()
    s = f'"{schema}"'
    async with await psycopg.AsyncConnection.connect(PG_DSN) as connection:
        async with connection.cursor() as cursor:
            copies = {
                "sessions": f"COPY {s}.handrail_sessions (id, org_id, user_id, status, version, "
                "created_at, updated_at, expires_at, data, window_start) FROM STDIN",
                "messages": f"COPY {s}.handrail_messages FROM STDIN",
                "cards": f"COPY {s}.handrail_cards ({COLUMNS}) FROM STDIN",
            }
            for kind in ("sessions", "messages", "cards"):
                async with cursor.copy(copies[kind]) as copy:
                    for session, org, user, shape, created, updated in plan.rows(shapes, done):
                        waits = shape.status == "suspended"
                        if kind == "sessions":
                            expires = updated - 1.0 + 86400 if waits else None
                            await copy.write_row(
                                (
                                    session,
                                    org,
                                    user,
                                    shape.status,
                                    3,
                                    created,
                                    updated,
                                    expires,
                                    shape.data,
                                    0,
                                )
                            )
                        elif waits and kind == "messages":
                            for i, m in enumerate(shape.messages):
                                await copy.write_row((session, i, m))
                        elif waits:
                            for i, (c, t) in enumerate(shape.cards):
                                await copy.write_row(
                                    card_row(session, org, user, created, updated, i, c, t)
                                )
        await connection.commit()
        await connection.execute(f"ANALYZE {s}.handrail_sessions")
        await connection.execute(f"ANALYZE {s}.handrail_cards")
        await connection.commit()
    return time.perf_counter() - started


# -- timing ------------------------------------------------------------------------------------


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def timed(
    repeat: int, page: Callable[[str], Awaitable[int]], orgs: int, warmup: int = 10
) -> dict[str, float]:
    rng = random.Random(3)
    for _ in range(warmup):
        await page(f"org{rng.randrange(orgs):03}")
    samples: list[float] = []
    sizes: list[int] = []
    cpu = time.process_time()
    for _ in range(repeat):
        org = f"org{rng.randrange(orgs):03}"
        started = time.perf_counter()
        sizes.append(await page(org))
        samples.append((time.perf_counter() - started) * 1000)
    cpu = time.process_time() - cpu
    samples.sort()
    return {
        "p50": statistics.median(samples),
        "p99": samples[min(len(samples) - 1, int(len(samples) * 0.99))],
        "cpu": cpu * 1000 / repeat,
        "cards": statistics.mean(sizes),
    }


def pages(engine: Engine) -> dict[str, Callable[[str], Awaitable[int]]]:
    def bo(org: str) -> Decider:
        return Decider(user_id=BO, roles={"it-admin"}, org_id=org)

    async def first(org: str) -> int:
        return len((await engine.pending(org, bo(org))).cards)

    async def by_tool(org: str) -> int:
        return len((await engine.pending(org, bo(org), tool="orders.refund")).cards)

    async def by_role(org: str) -> int:
        fay = Decider(user_id=FAY, roles={"finance"}, org_id=org)
        return len((await engine.pending(org, fay)).cards)

    async def to_decide(org: str) -> int:
        return len(await engine.inbox.sessions(org, bo(org), own=False))

    return {
        "first page": first,
        "filtered by tool": by_tool,
        "filtered by role": by_role,
        "to decide": to_decide,
    }


async def scan_page(engine: Engine, org: str, decider: Decider, tool: str | None) -> int:
    """The inbox before the index: each suspended session loaded, the rule applied to it."""
    cards = 0
    offset = 0
    while cards < 50 and offset < 1000:
        page = await engine.store.list(org_id=org, status="suspended", limit=100, offset=offset)
        if not page:
            break
        for summary in page:
            state = await engine.session(summary.id, org_id=org, user_id=summary.user_id)
            for call_id in engine.decidable(state, decider):
                if tool is None or state.pending[call_id].tool_name == tool:
                    cards += 1
        offset += len(page)
    return cards


async def baseline(store: SessionStore, waiting: int, repeat: int) -> dict[str, dict[str, float]]:
    """The scan and the index, on `waiting` waiting sessions of one organisation."""
    engine = make_engine(store)
    texts = ["wipe L", "refund A", "mail x", "both L"]
    for n in range(waiting):
        await ask(engine, f"b{n:05}", texts[n % 4], "org000", REQUESTERS[n % 4])
    bo = Decider(user_id=BO, roles={"it-admin"}, org_id="org000")

    async def scan_first(org: str) -> int:
        return await scan_page(engine, org, bo, None)

    async def scan_tool(org: str) -> int:
        return await scan_page(engine, org, bo, "orders.refund")

    index = pages(engine)
    return {
        "scan: first page": await timed(repeat, scan_first, 1, warmup=2),
        "scan: filtered by tool": await timed(max(repeat // 5, 5), scan_tool, 1, warmup=1),
        "index: first page": await timed(repeat, index["first page"], 1),
        "index: filtered by tool": await timed(repeat, index["filtered by tool"], 1),
    }


def report(title: str, results: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    print(
        f"  {'page':<26}{'p50 ms':>9}{'p99 ms':>9}{'CPU ms':>9}{'cards':>7}"
        f"   target p99 <= {TARGET_MS:g} ms"
    )
    for name, r in results.items():
        mark = "" if name.startswith("scan") else ("✓" if r["p99"] <= TARGET_MS else "✗")
        print(
            f"  {name:<26}{r['p50']:>9.2f}{r['p99']:>9.2f}{r['cpu']:>9.2f}{r['cards']:>7.1f}"
            f"   {mark}"
        )
    print(f"  (load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


async def run_store(
    name: str, store: SessionStore, repeat: int, load_s: float, sessions: int, waiting: int
) -> None:
    engine = make_engine(store)
    before = rss_mib()
    results = {label: await timed(repeat, page, ORGS) for label, page in pages(engine).items()}
    after = rss_mib()
    report(
        f"{name}: {sessions:,} sessions, {waiting:,} waiting, {ORGS} organisations "
        f"(loaded in {load_s:.0f} s)",
        results,
    )
    print(f"  RSS {before:.0f} MiB before the pages, {after:.0f} MiB after {repeat * 4} of them")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100,000 sessions, 10,000 waiting")
    parser.add_argument("--repeat", type=int, default=500, help="pages timed per kind")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--baseline", type=int, default=1000, help="waiting sessions, scan")
    args = parser.parse_args()
    sessions, waiting = (100_000, 10_000) if args.quick else (1_000_000, 100_000)
    plan = Plan(sessions, waiting)
    shapes, done = await templates()
    print(f"RSS at start: {rss_mib():.0f} MiB")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "inbox.db"
        load_s = await load_sqlite(path, plan, shapes, done)
        async with SqliteStore(path) as store:
            await run_store("SQLite", store, args.repeat, load_s, sessions, waiting)
        async with SqliteStore(Path(folder) / "baseline.db") as small:
            report(
                f"SQLite baseline: {args.baseline:,} waiting sessions in one organisation",
                await baseline(small, args.baseline, max(args.repeat // 10, 20)),
            )
    if args.no_postgres:
        return
    try:
        import psycopg

        psycopg.connect(PG_DSN, connect_timeout=2).close()
    except Exception as error:
        print(f"\nPostgreSQL skipped: {error}")
        return
    from handrail.store import PostgresStore

    schema = f"bench_inbox_{secrets.token_hex(3)}"
    small_schema = f"{schema}_b"
    try:
        load_s = await load_postgres(schema, plan, shapes, done)
        store = await PostgresStore.connect(PG_DSN, schema=schema, pool_size=4)
        try:
            await run_store("PostgreSQL", store, args.repeat, load_s, sessions, waiting)
        finally:
            await store.close()
        small = await PostgresStore.connect(PG_DSN, schema=small_schema, pool_size=4)
        try:
            report(
                f"PostgreSQL baseline: {args.baseline:,} waiting sessions in one organisation",
                await baseline(small, args.baseline, max(args.repeat // 10, 20)),
            )
        finally:
            await small.close()
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as connection:
            for name in (schema, small_schema):
                connection.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


if __name__ == "__main__":
    asyncio.run(main())
