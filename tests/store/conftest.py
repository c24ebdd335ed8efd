"""Fixtures for the store tests: the three stores, a clock the test moves, and PostgreSQL.

The PostgreSQL tests run for real against the server at 127.0.0.1:5432, in a schema of their
own that is dropped at the end; when no server answers they are skipped, and the run says so
in capitals at the end.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from handrail.store import MemoryStore, SessionStore

PG_HOST, PG_PORT = "127.0.0.1", 5432
PG_DSN = f"postgresql://postgres@{PG_HOST}:{PG_PORT}/test"
PG_SKIPPED = f"POSTGRES TESTS SKIPPED: no server at {PG_HOST}:{PG_PORT}"
_skipped: list[str] = []


class Clock:
    """A wall clock that moves only when the test says so."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@cache
def postgres_unavailable() -> str | None:
    """Why the PostgreSQL tests cannot run here, or None if they can."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return 'POSTGRES TESTS SKIPPED: psycopg is not installed (pip install "handrail[postgres]")'
    try:
        socket.create_connection((PG_HOST, PG_PORT), timeout=1).close()
    except OSError:
        return PG_SKIPPED
    return None


def skip_without_postgres() -> None:
    if reason := postgres_unavailable():
        _skipped.append(reason)
        pytest.skip(reason)


def pytest_unconfigure(config: pytest.Config) -> None:
    # After the summary line, so that nobody misses it.
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for reason in sorted(set(_skipped)):
        if reporter is not None:
            reporter.write_sep("!", reason, red=True, bold=True)


@pytest.fixture(scope="session")
def pg_schema() -> Iterator[str]:
    """A schema of this test session's own, dropped at the end."""
    skip_without_postgres()
    import psycopg

    schema = f"handrail_test_{os.getpid()}_{secrets.token_hex(3)}"
    yield schema
    with psycopg.connect(PG_DSN, autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def empty_pg_schema(schema: str) -> None:
    """Delete every row in the schema's tables (the schema is shared by the session)."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as connection:
        await connection.execute(
            f'TRUNCATE "{schema}".handrail_sessions, "{schema}".handrail_tool_log, '
            f'"{schema}".handrail_events, "{schema}".handrail_messages, '
            f'"{schema}".handrail_leases, "{schema}".handrail_audit, "{schema}".handrail_cards'
        )


@pytest.fixture
def clock() -> Clock:
    return Clock()


StoreFactory = Callable[..., Awaitable[SessionStore]]


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def make_store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: Clock
) -> AsyncIterator[StoreFactory]:
    """Makes stores of one kind sharing one database (for MemoryStore: one store); all closed
    at the end of the test."""
    kind: str = request.param
    made: list[SessionStore] = []
    memory: list[MemoryStore] = []
    schema = request.getfixturevalue("pg_schema") if kind == "postgres" else ""
    emptied = False

    async def make(**options: Any) -> SessionStore:
        nonlocal emptied
        options.setdefault("clock", clock)
        store: SessionStore
        if kind == "memory":
            if not memory:
                memory.append(MemoryStore(**options))
            return memory[0]
        if kind == "sqlite":
            from handrail.store import SqliteStore

            options.setdefault("poll_interval", 0.01)
            store = SqliteStore(tmp_path / "handrail.db", **options)
        else:
            from handrail.store import PostgresStore

            store = await PostgresStore.connect(PG_DSN, schema=schema, pool_size=4, **options)
            if not emptied:
                await empty_pg_schema(schema)
                emptied = True
        made.append(store)
        return store

    yield make
    for store in [*made, *memory]:
        await store.close()


@pytest.fixture
async def store(make_store: StoreFactory) -> SessionStore:
    """One store of each kind (the contract tests run once per kind)."""
    return await make_store()
