"""`python -m bench.audit_export [--entries 20000]`: the memory one audit export takes.

A trail of `--entries` decisions (about 1 KB of JSON each: a reason and amended values) in a
SQLite file, exported as JSON lines through the server (`GET /audit` with
`Accept: application/x-ndjson`, the app driven in-process, its body counted and dropped as
it is sent) and through `handrail audit export` (its output dropped). Measured: the peak of
the Python heap during the export (`tracemalloc`, started once the trail is written), beside
the same export built whole before it is sent, as both did before they streamed (the pages
read into one list of lines). A benchmark, not a test: it prints numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import tempfile
import tracemalloc
from collections.abc import Awaitable, Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pydantic_core

from handrail.audit import AuditEntry, AuditKey
from handrail.demo.support_desk import build_scenario
from handrail.server import ApiKeyAuthenticator, Caller, create_app
from handrail.store import SqliteStore

KEY = AuditKey("bench", b"b" * 32)
MIB = 1024 * 1024


async def fill(store: SqliteStore, entries: int) -> int:
    """`entries` decisions in acme's trail; the bytes of their JSON."""
    size = 0
    for n in range(entries):
        entry = await store.append_audit(
            AuditEntry(
                org_id="acme", at=1.7e9 + n, session_id=f"s-{n % 500}", tool="orders.refund",
                tool_call_id=f"call_{n}", who="ana", via="key:ana", decision="approve",
                reason="checked against the order history and the courier's report " * 12,
                amended_before={"amount": 84.0, "note": "x" * 40},
                amended_after={"amount": 40.0, "note": "y" * 40}, args_digest="d" * 64,
            )
        )  # fmt: skip
        size += len(json.dumps(entry.to_json())) + 1
    return size


async def peak(work: Callable[[], Awaitable[int]]) -> tuple[int, float]:
    """What `work` returns (the bytes it exported), and the heap's peak meanwhile (MiB)."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        sent = await work()
        return sent, tracemalloc.get_traced_memory()[1] / MIB
    finally:
        tracemalloc.stop()


def server(store: SqliteStore) -> Any:
    """The app over `store`, whose one key is an auditor of acme's."""
    keys = ApiKeyAuthenticator({"k": Caller("acme", "ana", frozenset({"auditor"}))})
    return create_app(build_scenario(store=store).engine, authenticator=keys, static_dir=None)


async def through_the_server(app: Any) -> int:
    """`GET /audit` as JSON lines, through the app; the body's bytes (dropped as sent)."""
    headers = [(b"authorization", b"Bearer k"), (b"accept", b"application/x-ndjson")]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": "/audit", "raw_path": b"/audit", "query_string": b"",
        "headers": headers, "server": ("bench", 80), "client": ("127.0.0.1", 1), "root_path": "",
    }  # fmt: skip
    sent = 0
    asked = False

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        nonlocal sent
        if message["type"] == "http.response.start":
            assert message["status"] == 200, message
        else:
            sent += len(message.get("body", b""))

    await app(scope, receive, send)
    return sent


async def built_whole(store: SqliteStore) -> int:
    """The export as it was built before it streamed: every page read into lines, then sent."""
    lines: list[bytes] = []
    after = 0
    while page := await store.audit("acme", after=after, limit=1000):
        lines += [pydantic_core.to_json(e.to_json()) + b"\n" for e in page]
        after = page[-1].seq
    return sum(len(line) for line in lines)


async def through_the_cli(path: str) -> int:
    """`handrail audit export --org acme`, its output dropped; the bytes it wrote."""
    from handrail.cli._audit import export_audit

    out = _Counter()
    with redirect_stdout(out):
        await asyncio.to_thread(export_audit, "acme", db=Path(path), dsn=None, schema="public")
    return out.count


async def cli_whole(store: SqliteStore) -> int:
    """`handrail audit export` as it was before it streamed: the whole trail read, then written."""
    from handrail.cli._audit import audit_all

    found = await audit_all(store, "acme")
    return sum(len(json.dumps(e.to_json(), ensure_ascii=False)) + 1 for e in found)


class _Counter(io.TextIOBase):
    """A stdout that counts what is written and keeps none of it."""

    count = 0

    def write(self, text: str) -> int:
        self.count += len(text.encode())
        return len(text)


async def main(entries: int) -> None:
    os.environ.pop("HANDRAIL_AUDIT_KEY", None)
    with tempfile.TemporaryDirectory() as directory:
        path = str(Path(directory) / "audit.db")
        async with SqliteStore(path, audit_key=KEY) as store:
            size = await fill(store, entries)
            print(f"trail: {entries} entries, {size / MIB:.1f} MiB of JSON lines")
            app = server(store)
            results = [
                ("server, built whole (before)", await peak(lambda: built_whole(store))),
                ("server, streamed (now)", await peak(lambda: through_the_server(app))),
                ("CLI, read whole (before)", await peak(lambda: cli_whole(store))),
            ]
        results.append(("CLI, streamed (now)", await peak(lambda: through_the_cli(path))))
    for label, (sent, mib) in results:
        print(f"{label:30} peak heap {mib:7.1f} MiB   ({sent / MIB:.1f} MiB exported)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=20_000)
    asyncio.run(main(parser.parse_args().entries))
