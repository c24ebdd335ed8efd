"""An app whose store is a `PartitionedStore` over two SQLite files, for `handrail worker`.

`PARTITIONED_DIR` names the folder of the files (`a.db`: acme's, `b.db`: globex's) and of
`refunds.txt`, a line a refund made (the test reads it to count effects).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from handrail import Agent, Engine, PartitionedStore, Runtime, SqliteStore, tool
from handrail.models import ModelRequest
from handrail.testing import FunctionModel, call

HOMES = {"acme": "a", "globex": "b"}


def folder() -> Path:
    return Path(os.environ["PARTITIONED_DIR"])


@tool(permission="write")
async def refund(order: str) -> str:
    """Refund an order (gated: a person approves it)."""
    with (folder() / "refunds.txt").open("a") as out:
        out.write(f"{order}\n")
    return f"refunded {order}"


def answer(request: ModelRequest) -> Any:
    if request.messages[-1].role == "user":
        return call("refund", order=request.messages[-1].text)
    return "Refunded."


def app() -> Engine:
    parts = {key: SqliteStore(folder() / f"{key}.db") for key in "ab"}
    store = PartitionedStore(parts, HOMES.__getitem__)
    return Engine(
        Agent("desk", tools=[refund]), store=store, runtime=Runtime(model=FunctionModel(answer))
    )
