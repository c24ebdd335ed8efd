"""What the providers' wire formats share: tool names they accept, and the result text of a call.

Pure, with no SDK import, so the token counter can render a request exactly as a provider
would send it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..messages import ToolCallPart

__all__ = ["AWAITING_DECISION", "REUSED", "ToolNames", "result_text"]

AWAITING_DECISION = (
    "This call has not run yet: it is waiting for a decision (a person's approval or answer, "
    "or a client's result). Do not assume an outcome."
)
"""What the model reads for a call that has no result yet."""
REUSED = (
    "[Reused: this call repeats call {call_id} of this turn and was not run again; this is "
    "that call's result.]\n"
)
"""What the model reads before a reused result (the call's `reused_from`)."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 64


class ToolNames:
    """handrail tool names (`orders.lookup`) to names the APIs accept (`orders_lookup`), and back.

    OpenAI and Anthropic accept `[A-Za-z0-9_-]{1,64}`. A name that already fits is kept; any
    other is rewritten, and a clash between two rewritten names is broken with a number, so the
    mapping stays one-to-one for the whole request.

    Args:
        names: every tool name the request mentions (its tools first, then the history's).
    """

    __slots__ = ("_to_handrail", "_to_wire")

    def __init__(self, names: Iterable[str]) -> None:
        self._to_wire: dict[str, str] = {}
        self._to_handrail: dict[str, str] = {}
        for name in names:
            if name in self._to_wire:
                continue
            wire = base = _UNSAFE.sub("_", name)[:_MAX_NAME] or "tool"
            number = 1
            while wire in self._to_handrail:
                number += 1
                suffix = f"_{number}"
                wire = base[: _MAX_NAME - len(suffix)] + suffix
            self._to_wire[name] = wire
            self._to_handrail[wire] = name

    def fresh(self, base: str) -> str:
        """A wire name no tool uses, starting from `base` (for a tool of the adapter's own)."""
        wire, number = base, 1
        while wire in self._to_handrail:
            number += 1
            wire = f"{base}_{number}"
        self._to_handrail[wire] = wire
        return wire

    def wire(self, name: str) -> str:
        """The API's name for a handrail tool name."""
        return self._to_wire.get(name, name)

    def handrail(self, wire: str) -> str:
        """The handrail tool name for a name the model sent (unknown names pass through)."""
        return self._to_handrail.get(wire, wire)


def result_text(part: ToolCallPart) -> tuple[str, bool]:
    """What the model reads as the result of `part`, and whether it is an error.

    A call without a final result (waiting for a person or a client) is never presented as
    if it had run: the model reads `AWAITING_DECISION`. A reused result (an identical read
    earlier this turn, `reused_from`) says so first: the call was not run again.
    """
    result = part.result
    if result is None or part.status in ("pending", "running", "waiting"):
        return AWAITING_DECISION, False
    text = result.model_text()
    if part.reused_from:
        text = REUSED.format(call_id=part.reused_from) + text
    return text, not result.ok
