"""The support desk behind the web page: `handrail serve handrail.demo.web:engine` (`make web`).

The same domain and scripted model as `python -m handrail.demo`, offline, on a SQLite store
(`handrail-demo-web.db`, or the path in `HANDRAIL_DEMO_DB`) so sessions and their pending
cards survive a restart of the server. The model writes a word every `HANDRAIL_DEMO_PACE`
seconds (0.03 by default; 0 for none), so the reply visibly streams.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from handrail import Engine, Runtime, SessionStore
from handrail.demo.support_desk import Desk, script, support_domain
from handrail.models import Model, ModelChunk, ModelRequest, ModelResponse
from handrail.store import SqliteStore
from handrail.testing import FunctionModel

__all__ = ["Paced", "build_engine", "engine"]

DB_ENV = "HANDRAIL_DEMO_DB"
"""The environment variable naming the demo's SQLite file."""
PACE_ENV = "HANDRAIL_DEMO_PACE"
"""The environment variable with the seconds between streamed words."""


class Paced:
    """A model that hands on another model's chunks with a pause before each streamed one.

    Args:
        model: the model whose answer is streamed.
        pace: seconds to wait before each chunk but the final response.
    """

    def __init__(self, model: Model, *, pace: float) -> None:
        self.model = model
        self.pace = pace

    @property
    def name(self) -> str:
        """The wrapped model's name."""
        return self.model.name

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """The wrapped model's chunks, paced."""
        async for chunk in self.model.stream(request):
            if self.pace and not isinstance(chunk, ModelResponse):
                await asyncio.sleep(self.pace)
            yield chunk


def build_engine(
    *, store: SessionStore | None = None, pace: float = 0.0, latency: float = 0.0
) -> Engine:
    """The support desk on the scripted model, for the web page.

    Args:
        store: where sessions live (default: SQLite at `HANDRAIL_DEMO_DB`, else
            `handrail-demo-web.db`).
        pace: seconds between streamed words.
        latency: seconds each tool call takes.
    """
    model: Model = FunctionModel(script, name="scripted")
    if pace:
        model = Paced(model, pace=pace)
    if store is None:
        store = SqliteStore(os.environ.get(DB_ENV) or "handrail-demo-web.db")
    runtime = Runtime(model=model, deps=Desk(latency=latency))
    return Engine(support_domain, store=store, runtime=runtime)


def _pace() -> float:
    try:
        return max(0.0, float(os.environ.get(PACE_ENV, "0.03")))
    except ValueError:
        return 0.03


engine: Engine
"""The engine `handrail serve handrail.demo.web:engine` serves (built on first use)."""
_engine: Engine | None = None


def __getattr__(name: str) -> Engine:
    # `engine` is built on first use, so that importing `build_engine` opens no database.
    global _engine
    if name != "engine":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _engine is None:
        _engine = build_engine(pace=_pace(), latency=0.2)
    return _engine
