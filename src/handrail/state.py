"""`RunState`: a session's conversation and everything a run carries between steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ._tool_result import ToolResult
from .context import ContextStore
from .messages import Message, ToolCallPart
from .models import Usage

__all__ = ["RunState"]


@dataclass(kw_only=True, slots=True)
class RunState:
    """The state a run reads and changes: what a session stores between turns.

    `run_agent` changes it in place and hands it back in its result.
    """

    messages: list[Message] = field(default_factory=list)
    """The conversation."""
    context: ContextStore = field(default_factory=ContextStore)
    """The context store (`var:` persists across turns; `tool:`/`call:` is this turn's)."""
    usage: Usage = field(default_factory=Usage)
    """What the session's model calls have cost."""
    session_id: str | None = None
    """The session, when there is one."""
    org_id: str | None = None
    """The caller's organisation: scope comes from the session, never from the model."""
    user_id: str | None = None
    """The caller."""
    run_id: str = ""
    """The current run."""
    turn: int = 0
    """How many user turns the session has had."""
    turn_iterations: int = 0
    """Model calls made this turn, across agents (the per-turn cap counts these)."""
    turn_calls: dict[str, ToolCallPart] = field(default_factory=dict)
    """This turn's calls by canonical (name, arguments): duplicates reuse their result."""
    tool_cache: dict[str, tuple[float, ToolResult]] = field(default_factory=dict)
    """Idempotent tools' results by canonical call, with their expiry time."""

    def sys_values(self, now: float) -> dict[str, Any]:
        """The `sys:` values of the context store for a run starting at `now` (epoch seconds).

        Only the scope that is set is included, so values given to the `ContextStore`
        directly are kept when the state has none.
        """
        scope = {"org_id": self.org_id, "user_id": self.user_id, "session_id": self.session_id}
        values: dict[str, Any] = {k: v for k, v in scope.items() if v is not None}
        values["now"] = datetime.fromtimestamp(now, tz=UTC).isoformat()
        return values

    def new_turn(self) -> None:
        """Start a user turn: clear what is turn-scoped."""
        self.turn += 1
        self.turn_iterations = 0
        self.turn_calls.clear()
        self.context.new_turn()
