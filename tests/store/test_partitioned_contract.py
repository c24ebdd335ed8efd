"""The `SessionStore` contract, run against a `PartitionedStore` of two stores of each kind.

Every test of `test_contract.py` runs here again, its `make_store` giving a PartitionedStore
over two memory stores, two SQLite files, or two PostgreSQL schemas. The contract's ids name
no partition, so they are the `default` partition's (as a store's own sessions are once it
becomes one partition of several); the other partition is asked by every fleet-wide call
(`list`, `due`, `claim`, `listen`...) and must change none of their answers. Sessions in
both partitions at once are tested in `test_partitioned.py`.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from handrail.store import MemoryStore, PartitionedStore, SessionStore

from .conftest import PG_DSN, Clock, StoreFactory, empty_pg_schema, skip_without_postgres
from .test_contract import *  # noqa: F403 - the contract's tests, collected again here


def _home(org_id: str | None) -> str:
    return "a"


@pytest.fixture(scope="module")
def pg_schemas() -> Iterator[tuple[str, str]]:
    """Two schemas of this module's own (the partitions), dropped at the end."""
    skip_without_postgres()
    import psycopg

    base = f"handrail_part_{os.getpid()}_{secrets.token_hex(3)}"
    schemas = (f"{base}_a", f"{base}_b")
    yield schemas
    with psycopg.connect(PG_DSN, autocommit=True) as connection:
        for schema in schemas:
            connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def make_store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: Clock
) -> AsyncIterator[StoreFactory]:
    """Makes PartitionedStores of two stores of one kind, every one over the same two
    databases (for MemoryStore: one PartitionedStore); all closed at the end of the test."""
    kind: str = request.param
    made: list[SessionStore] = []
    memory: list[PartitionedStore] = []
    schemas = request.getfixturevalue("pg_schemas") if kind == "postgres" else ("", "")
    emptied = False

    async def make(**options: Any) -> SessionStore:
        nonlocal emptied
        options.setdefault("clock", clock)
        parts: dict[str, SessionStore] = {}
        if kind == "memory":
            if not memory:
                parts = {key: MemoryStore(**options) for key in "ab"}
                memory.append(PartitionedStore(parts, _home, default="a"))
            return memory[0]
        if kind == "sqlite":
            from handrail.store import SqliteStore

            options.setdefault("poll_interval", 0.01)
            parts = {key: SqliteStore(tmp_path / f"{key}.db", **options) for key in "ab"}
        else:
            from handrail.store import PostgresStore

            for key, schema in zip("ab", schemas, strict=True):
                parts[key] = await PostgresStore.connect(
                    PG_DSN, schema=schema, pool_size=4, **options
                )
            if not emptied:
                for schema in schemas:
                    await empty_pg_schema(schema)
                emptied = True
        store = PartitionedStore(parts, _home, default="a")
        made.append(store)
        return store

    yield make
    for store in [*made, *memory]:
        await store.close()
