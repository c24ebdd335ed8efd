"""`ToolResult`: the model-visible contract of one tool call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pydantic_core

__all__ = ["ToolResult"]


@dataclass(kw_only=True, slots=True)
class ToolResult:
    """What a tool call produced, as the model and the UI see it.

    Errors are data: a failed call is a `ToolResult` with `ok=False` that goes back to the
    model, which can recover; the dispatcher never raises for a tool's failure.
    """

    ok: bool = True
    """Whether the call succeeded."""
    data: Any = None
    """The output, JSON-compatible (a tool's pydantic output is dumped in JSON mode)."""
    summary: str | None = None
    """One line for the UI ("Order A1: shipped")."""
    markdown: str | None = None
    """The prompt form the model reads; when unset, `data` itself if it is a `str`, else its
    compact JSON."""
    error: str | None = None
    """What went wrong, written for the model to act on; set when `ok` is false."""

    @classmethod
    def failure(cls, error: str, *, data: Any = None) -> ToolResult:
        """A failed result carrying `error` (and optionally partial `data`)."""
        return cls(ok=False, error=error, data=data, summary=error)

    def model_text(self) -> str:
        """The text the model reads for this result."""
        if not self.ok:
            return f"Error: {self.error}"
        if self.markdown is not None:
            return self.markdown
        if isinstance(self.data, str):
            return self.data
        return pydantic_core.to_json(self.data).decode()
