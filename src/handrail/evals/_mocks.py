"""Scenario mocks as the engine's `wrap_tools`: one output, outputs in order, or an error."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from ..exceptions import ModelRetry
from ._suite import Mock

__all__ = ["wrap_tools"]


def wrap_tools(mocks: Mapping[str, Mock]) -> dict[str, Callable[[dict[str, Any]], Any]]:
    """`tool name -> function of the arguments` for `Engine(wrap_tools=...)`.

    Each scenario gets its own functions, so a list of outputs is consumed by that scenario
    alone.
    """
    return {name: _mocked(name, mock) for name, mock in mocks.items()}


def _mocked(name: str, mock: Mock) -> Callable[[dict[str, Any]], Any]:
    if mock.error is not None:
        message = mock.error

        def failing(args: dict[str, Any]) -> Any:
            raise ModelRetry(message)

        return failing
    if mock.outputs is not None:
        outputs = list(mock.outputs)
        made = 0

        def next_output(args: dict[str, Any]) -> Any:
            nonlocal made
            if made >= len(outputs):
                raise ModelRetry(
                    f"Tool {name!r} was called {made + 1} times, but its mock has "
                    f"{len(outputs)} output(s)."
                )
            made += 1
            return copy.deepcopy(outputs[made - 1])

        return next_output
    output = mock.output
    return lambda args: copy.deepcopy(output)
