"""A Python MCP server over stdio, for the entry-point tests (tests/mcp/test_entry_points.py).

Run as `python tests/mcp/_stdio_server.py PIDS`: it appends its process id to the file PIDS
(so a test can check that the process is gone once the application closed its session),
then serves `echo` on stdin and stdout until its client closes them.
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("ops-fs")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def echo(message: str) -> str:
    """Echo the message back."""
    return f"Echo: {message}"


if __name__ == "__main__":
    with open(sys.argv[1], "a", encoding="utf-8") as pids:
        pids.write(f"{os.getpid()}\n")
    server.run()  # stdio
