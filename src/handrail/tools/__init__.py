"""Tools: declarations (`Tool`, `@tool`), their results, and the dispatch pipeline."""

from __future__ import annotations

from .._tool_result import ToolResult
from ._tool import Approval, Permission, Tool, ToolContext, tool

__all__ = ["Approval", "Permission", "Tool", "ToolContext", "ToolResult", "tool"]
