"""What a model is told of a tool: a function's `ToolDefinition`, or a `HostedTool`.

Both `handrail.tools` (a `Tool` makes its definition) and `handrail.models` (a request carries
them) import this module, which imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from typing_extensions import TypedDict

__all__ = ["HostedKind", "HostedTool", "ToolDefinition", "UserLocation"]


@dataclass(kw_only=True, slots=True)
class ToolDefinition:
    """What the model is told about one tool."""

    name: str
    """The tool's name."""
    description: str
    """What it does, for the model."""
    parameters: dict[str, Any]
    """JSON Schema of the arguments the model may send (bound arguments are left out)."""


HostedKind: TypeAlias = Literal["web_search", "code_execution", "web_fetch"]
"""What a hosted tool does."""


class UserLocation(TypedDict, total=False):
    """Where the user is, so a web search can rank local results first."""

    city: str
    region: str
    country: str
    """Two-letter ISO country code."""
    timezone: str
    """IANA time zone (`Europe/Paris`)."""


@dataclass(kw_only=True, slots=True)
class HostedTool:
    """What a provider is asked to run for one hosted tool (`Tool.hosted`)."""

    kind: HostedKind
    """Which hosted tool."""
    name: str = ""
    """The handrail tool's name (its calls' `ToolCallPart.name`); set by `Tool`."""
    max_uses: int | None = None
    """At most this many calls in one response (web search, web fetch)."""
    allowed_domains: list[str] | None = None
    """Only these domains (web search, web fetch)."""
    blocked_domains: list[str] | None = None
    """Never these domains (web search, web fetch)."""
    user_location: UserLocation | None = None
    """Where the user is (web search)."""
    max_content_tokens: int | None = None
    """The most tokens of a fetched page the model reads (web fetch)."""
    citations: bool | None = None
    """Whether the model may cite fetched pages (web fetch)."""
