"""`Runtime`: everything a run needs that is not the agent or the session.

The model to fall back on, the application's dependencies, the hooks of the dispatch
pipeline, the permission policy, and the sources of time and ids (injectable, so a test is
deterministic without patching). One runtime serves many concurrent runs.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .tools._workers import WorkerThreads

if TYPE_CHECKING:
    from .messages import ToolCallPart
    from .models import Model
    from .tools import Permission, Tool, ToolResult

__all__ = ["IdFactory", "Runtime", "random_ids", "sequential_ids"]

DepsT = TypeVar("DepsT")
IdFactory = Callable[[str], str]
"""Makes a new id with a prefix: `ids("msg") -> "msg_5f3a..."`."""


DEFAULT_WORKERS = WorkerThreads()
"""The worker threads every runtime shares unless it is given its own."""


def random_ids(prefix: str) -> str:
    """A random id with a prefix (the default id factory)."""
    return f"{prefix}_{os.urandom(8).hex()}"


def sequential_ids() -> IdFactory:
    """An id factory counting from 1 (`msg_1`, `call_2`, ...): deterministic, for tests."""
    counter = itertools.count(1)
    return lambda prefix: f"{prefix}_{next(counter)}"


@dataclass(kw_only=True, slots=True)
class Runtime(Generic[DepsT]):
    """What a run needs besides the agent and the session state."""

    model: Model | None = None
    """The default model, for agents that name none."""
    deps: DepsT | None = None
    """The application's dependencies, handed to tools as `ctx.deps`."""
    clock: Callable[[], float] = time.time
    """Wall time in seconds since the epoch (stamps tool calls and decisions)."""
    ids: IdFactory = random_ids
    """Makes message, run and tool-call ids."""
    workers: WorkerThreads = field(default_factory=lambda: DEFAULT_WORKERS)
    """Where sync tools run (shared by default; give a runtime its own to isolate it)."""
    allowed_permissions: frozenset[Permission] | None = None
    """When set, calls to tools with another permission fail (e.g. a read-only run)."""
    max_approvals_per_turn: int | None = None
    """Past this many calls waiting for approval in one turn, further gated calls get a tool
    error telling the model to stop and summarise (None: no cap)."""
    pending_ttl: float | None = None
    """Seconds a waiting call accepts a decision, unless its tool says otherwise (None:
    forever). An expired call resolves to a tool error the model can recover from."""
    transform_args: Callable[[Tool[Any], dict[str, Any]], dict[str, Any]] | None = None
    """Domain hook: rewrite a call's parsed arguments before binding and validation."""
    on_tool_result: Callable[[ToolCallPart, ToolResult], Awaitable[None] | None] | None = None
    """Observe each result (logging, metrics) before it is stamped on its part."""
    transform_tool_result: Callable[[ToolCallPart, ToolResult], ToolResult] | None = None
    """Rewrite each result before the model sees it (redaction, truncation)."""
