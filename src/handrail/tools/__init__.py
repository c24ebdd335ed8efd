"""Tools: declarations (`Tool`, `@tool`), their results, and the dispatch pipeline."""

from __future__ import annotations

from .._tool_result import ToolErrorCode, ToolResult
from ._hosted import (
    HostedKind,
    HostedTool,
    UserLocation,
    code_execution,
    hosted_call,
    web_fetch,
    web_search,
)
from ._tool import (
    Approval,
    Default,
    Permission,
    Tool,
    ToolContext,
    ToolDecorator,
    ToolOptions,
    tool,
)

__all__ = [
    "Approval",
    "Default",
    "HostedKind",
    "HostedTool",
    "Permission",
    "Tool",
    "ToolContext",
    "ToolDecorator",
    "ToolErrorCode",
    "ToolOptions",
    "ToolResult",
    "UserLocation",
    "code_execution",
    "hosted_call",
    "tool",
    "web_fetch",
    "web_search",
]
