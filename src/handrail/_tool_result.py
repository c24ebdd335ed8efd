"""`ToolResult`: the model-visible contract of one tool call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import pydantic_core

__all__ = ["ToolErrorCode", "ToolResult", "derive_summary"]

ToolErrorCode: TypeAlias = Literal[
    "unknown_tool",
    "not_available",
    "invalid_arguments",
    "permission_denied",
    "policy_denied",
    "rejected",
    "expired",
    "timed_out",
    "interrupted",
    "tools_not_allowed",
    "incomplete_response",
    "tool_error",
    "pending",
]
"""The machine-readable reason of a failure handrail produced (stable snake_case strings).

- `unknown_tool`: the model called a tool the agent does not have.
- `not_available`: the tool exists but cannot run here (no client connected, a headless run
  with nobody to ask, a provider tool called as a function, a tool removed while it waited).
- `invalid_arguments`: the arguments did not parse, bind or validate (also an approved call
  whose arguments no longer hold).
- `permission_denied`: the tool's permission is not among the run's allowed permissions.
- `policy_denied`: a policy refused it (too many approvals waiting this turn, arguments that
  are not the approved ones).
- `rejected`: a person refused the call, or declined the tool's question.
- `expired`: nobody decided (or no client answered) before the deadline.
- `timed_out`: the tool ran past its `timeout`.
- `interrupted`: the run was cancelled while the call was running.
- `tools_not_allowed`: the request did not allow tool calls (`tool_choice="none"`), so the
  call was never run.
- `incomplete_response`: the response holding the call was cut off (token limit, content
  filter), so the call was never run.
- `tool_error`: the tool's own failure (it raised, returned a failed result or output that
  does not match its output type).
- `pending`: not a failure yet: the placeholder of a call waiting for a decision or a client,
  replaced by its real result.

A tool may set its own code on a failure (`ToolResult.failure("...", code="out_of_stock")`,
`raise ModelRetry("...", code="out_of_stock")`): any snake_case string.
"""

_SUMMARY_MAX = 120


def derive_summary(text: str) -> str:
    """One line for the UI from `text`: its first non-empty line, cut to 120 characters."""
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    if len(line) > _SUMMARY_MAX:
        line = line[: _SUMMARY_MAX - 1].rstrip() + "…"
    return line


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
    """One line for the UI ("Order A1: shipped"); when the tool gives none, the dispatcher
    stores one derived from the result or the error (`display_summary()`) before the result
    reaches the history, so events, the stored history and the UI show the same line."""
    markdown: str | None = None
    """The prompt form the model reads; when unset, `data` itself if it is a `str`, else its
    compact JSON."""
    error: str | None = None
    """What went wrong, written for the model to act on; set when `ok` is false."""
    code: str | None = None
    """Why it failed, for programs: a `ToolErrorCode` for a failure handrail produced, or the
    tool's own code. Set when `ok` is false (a result stored before codes existed has none)."""
    warnings: list[str] | None = None
    """Notes for the model about the result (from the tool's `normalize`), appended to the
    text it reads."""

    @classmethod
    def failure(
        cls, error: str, *, data: Any = None, code: str | None = "tool_error"
    ) -> ToolResult:
        """A failed result carrying `error` (and optionally partial `data`) and its `code`."""
        return cls(ok=False, error=error, data=data, summary=derive_summary(error), code=code)

    def display_summary(self) -> str:
        """The UI line: `summary`, else derived from the error or the text the model reads."""
        if self.summary:
            return self.summary
        if not self.ok:
            return derive_summary(self.error or "failed")
        return derive_summary(self.model_text()) or "done"

    def model_text(self) -> str:
        """The text the model reads for this result."""
        if not self.ok:
            text = f"Error: {self.error}"
        elif self.markdown is not None:
            text = self.markdown
        elif isinstance(self.data, str):
            text = self.data
        else:
            text = pydantic_core.to_json(self.data).decode()
        if self.warnings:
            text += "\n\nWarnings:\n" + "\n".join(f"- {w}" for w in self.warnings)
        return text
