"""What the commands open: the application (`handrail.apps`) and the store (`Settings.store`).

Every store a command makes is made by `Settings.store`: over the app's own (`opened_app`,
for `worker`, `run` and `chat`), or one the command reads itself (`with_store`, for
`sessions` and `audit`, whose SQLite file must exist).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from ..apps import _ACCEPTED as ACCEPTED_APPS
from ..apps import import_app, open_app
from ..config import Settings
from ..engine import Engine
from ..store import SessionStore
from ..worker import name_worker
from ._common import CliError, err, run

__all__ = ["imported_app", "opened", "opened_app", "over_store", "where", "with_store"]

T = TypeVar("T")


def imported_app(target: str) -> Any:
    """What `target` (MODULE:NAME) names, checked before anything is opened.

    A name that does not import, or names something else than an app, fails here, in one line.
    """
    found = import_app(target)
    if not isinstance(found, Engine) and not callable(found):
        raise CliError(f"{target} is a {type(found).__name__}; it must be {ACCEPTED_APPS}.")
    return found


@contextlib.asynccontextmanager
async def opened_app(
    target: str, settings: Settings, *, named: bool = True
) -> AsyncIterator[Engine]:
    """The app `target` names, open, with the store `settings` name over its own (if any).

    `named`: give it the worker id the settings name (if any), too.
    """
    async with open_app(target) as engine, over_store(engine, settings.store()):
        if named and settings.worker_id:
            name_worker(engine, settings.worker_id)
        yield engine


@contextlib.asynccontextmanager
async def over_store(engine: Engine, store: SessionStore | None) -> AsyncIterator[None]:
    """`store` in place of the app's while this runs, closed after; None: the app's own."""
    if store is None:
        yield
        return
    own, engine.store = engine.store, store
    try:
        yield
    finally:
        engine.store = own  # the app's exit closes its own
        await store.close()


def _store(db: Path, dsn: str | None, schema: str) -> SessionStore:
    """The store of `--db` (a SQLite file that exists) or `--dsn` (PostgreSQL)."""
    if not dsn and not db.exists():
        raise CliError(f"No store at {db}: pass --db PATH (or --dsn for PostgreSQL).")
    store = Settings(db=db, dsn=dsn or None, schema=schema).store()
    assert store is not None  # (a db is always given)
    return store


def with_store(
    db: Path, dsn: str | None, schema: str, work: Callable[[SessionStore], Awaitable[T]]
) -> T:
    """`work` on the store, closed after, with a spinner on stderr while it runs."""
    with err.status("Working on the store…"):
        return run(opened(db, dsn, schema, work))


async def opened(
    db: Path, dsn: str | None, schema: str, work: Callable[[SessionStore], Awaitable[T]]
) -> T:
    """`work` on the store, closed after (no spinner: for a command that writes as it reads)."""
    store = _store(db, dsn, schema)
    try:
        return await work(store)
    finally:
        await store.close()


def where(store: SessionStore) -> str:
    """The store, as a log line names it (a PostgreSQL password masked)."""
    path, dsn = getattr(store, "path", None), getattr(store, "masked_dsn", None)
    if dsn is not None:
        return f"{type(store).__name__}({dsn}, schema {getattr(store, 'schema', '?')})"
    return f"{type(store).__name__}({path})" if path is not None else type(store).__name__
