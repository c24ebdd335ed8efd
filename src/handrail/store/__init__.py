"""Session stores: where sessions live between turns, restarts and workers.

`SessionStore` is the protocol; `MemoryStore` is for tests, `SqliteStore` the embedded
default, `PostgresStore` the store for many workers (it needs the `postgres` extra), and
`PartitionedStore` spreads organisations over several of them (past one primary). The
store is deliberately ignorant of what a session contains: it keeps an opaque JSON document
with the metadata it indexes, a tool-call log for crash recovery, leases and wake-ups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..exceptions import ConflictError, RoutingError, StoreError
from ._base import (
    Clock,
    SessionRecord,
    SessionStatus,
    SessionStore,
    SessionSummary,
    ToolCallStatus,
    ToolLogEntry,
    WaitingCard,
    WaitingRow,
)
from ._codec import EXPORT_SCHEMA_VERSION
from .memory import MemoryStore
from .partitioned import PartitionedStore, PartitionRoute, session_id_for

if TYPE_CHECKING:
    from .postgres import PostgresStore
    from .sqlite import SqliteStore

__all__ = [
    "EXPORT_SCHEMA_VERSION",
    "Clock",
    "ConflictError",
    "MemoryStore",
    "PartitionRoute",
    "PartitionedStore",
    "PostgresStore",
    "RoutingError",
    "SessionRecord",
    "SessionStatus",
    "SessionStore",
    "SessionSummary",
    "SqliteStore",
    "StoreError",
    "ToolCallStatus",
    "ToolLogEntry",
    "WaitingCard",
    "WaitingRow",
    "session_id_for",
]

_LAZY = {"SqliteStore": ".sqlite", "PostgresStore": ".postgres"}


def __getattr__(name: str) -> Any:
    # Loaded on first use: PostgresStore needs the `postgres` extra, and neither is needed
    # by a program that does not store sessions.
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
