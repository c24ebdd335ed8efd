"""`ScriptedModel`: a model that plays a fixed list of turns, in order."""

from __future__ import annotations

from collections.abc import Iterable

from ..exceptions import ModelError
from . import ModelRequest
from .function import FunctionModel, Step

__all__ = ["ScriptedModel"]


class ScriptedModel(FunctionModel):
    """Answers each request with the next scripted step (see `FunctionModel` for steps).

    ```python
    model = ScriptedModel([
        [call("orders.lookup", order_id="A1"), call("policy.refunds")],
        "Your order shipped yesterday.",
    ])
    ```

    Running out of steps raises `ModelError`; `assert_complete()` checks that every step was
    used, so a test notices an agent that stopped early.
    """

    def __init__(self, steps: Iterable[Step], *, name: str = "scripted") -> None:
        self._steps = list(steps)
        self._next = 0
        super().__init__(self._play, name=name)

    @property
    def remaining(self) -> int:
        """How many steps have not been played yet."""
        return len(self._steps) - self._next

    def assert_complete(self) -> None:
        """Fail (`AssertionError`) unless every scripted step was played."""
        if self.remaining:
            raise AssertionError(
                f"ScriptedModel played {self._next} of {len(self._steps)} steps; "
                f"{self.remaining} left unplayed (the agent stopped early?)"
            )

    def _play(self, request: ModelRequest) -> Step:
        if self._next >= len(self._steps):
            raise ModelError(
                f"ScriptedModel ran out of steps: it had {len(self._steps)} and agent "
                f"{request.agent!r} asked for one more. Add a step to the script (the last "
                f"message was {request.messages[-1].role if request.messages else 'none'!r})."
            )
        step = self._steps[self._next]
        self._next += 1
        return step
