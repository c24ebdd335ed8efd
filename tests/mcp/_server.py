"""A Python MCP server for the MCP toolset tests, over streamable HTTP.

Run as `python tests/mcp/_server.py PORT`. Its tools cover the annotation variants, an error,
an in-call elicitation (`ctx.elicit`) and a multi-round one (`Resolve` + `Elicit`, which a
2026-07-28 connection carries as an `InputRequiredResult`).
"""

from __future__ import annotations

import sys
from typing import Annotated

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp.types import ToolAnnotations
from pydantic import BaseModel

server = MCPServer("handrail-test")
calls: list[str] = []


class Reason(BaseModel):
    reason: str


class Size(BaseModel):
    size: str


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup(order_id: str) -> dict[str, str]:
    """Look an order up."""
    return {"id": order_id, "status": "delivered"}


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
def add_note(order_id: str, note: str) -> str:
    """Add a note to an order."""
    calls.append(f"add_note {order_id}")
    return f"noted on {order_id}: {note}"


@server.tool()
def purge(order_id: str) -> str:
    """Delete an order for good (no annotations: MCP's defaults say destructive)."""
    return f"purged {order_id}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def broken(order_id: str) -> str:
    """Always fails."""
    raise ValueError(f"order {order_id} is locked")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def cancel_order(order_id: str, ctx: Context) -> str:
    """Cancel an order, asking why (an in-call elicitation)."""
    answer = await ctx.elicit(f"Why cancel {order_id}?", Reason)
    if answer.action != "accept":
        return f"not cancelled ({answer.action})"
    return f"cancelled {order_id}: {answer.data.reason}"


def ask_size(order_id: str) -> Elicit[Size]:
    return Elicit(f"Which size for {order_id}?", Size)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def exchange(order_id: str, size: Annotated[Size, Resolve(ask_size)]) -> str:
    """Exchange an order for another size (asks which, through a resolver)."""
    return f"exchanged {order_id} for size {size.size}"


if __name__ == "__main__":
    app = server.streamable_http_app()
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
