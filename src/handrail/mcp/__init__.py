"""MCP: the tools of a Model Context Protocol server, as handrail tools (`MCPToolset`).

Needs the `mcp` extra (`pip install "handrail[mcp]"`); importing this package does not, the
first use of `MCPToolset` does. See `docs/mcp.md`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._toolset import MCPToolset, hint_permission

__all__ = ["MCPToolset", "hint_permission"]


def __getattr__(name: str) -> Any:
    # Loaded on first use, so that `import handrail.mcp` works without the extra.
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import _toolset

    value = getattr(_toolset, name)
    globals()[name] = value  # once loaded, a plain attribute
    return value
