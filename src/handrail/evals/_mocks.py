"""Scenario mocks as the engine's `wrap_tools`: one output, outputs in order, or an error.

A mock with `ask` raises `AskPerson` on a call's first run, so the call waits on a question
card; the run after the answer gives the output.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any

from ..exceptions import AskPerson, ModelRetry
from ._suite import Mock

__all__ = ["wrap_tools"]


def wrap_tools(mocks: Mapping[str, Mock]) -> dict[str, Callable[[dict[str, Any]], Any]]:
    """`tool name -> function of the arguments` for `Engine(wrap_tools=...)`.

    Each scenario gets its own functions, so a list of outputs is consumed by that scenario
    alone.
    """
    return {name: _asking(mock.ask, _mocked(name, mock)) for name, mock in mocks.items()}


def _asking(
    question: str | None, then: Callable[[dict[str, Any]], Any]
) -> Callable[[dict[str, Any]], Any]:
    """`then`, asked for `question` first: each call (by its arguments) asks once."""
    if question is None:
        return then
    asked: set[str] = set()

    def asking(args: dict[str, Any]) -> Any:
        key = json.dumps(args, sort_keys=True, default=str)
        if key not in asked:
            asked.add(key)
            raise AskPerson(question)
        return then(args)

    return asking


def _mocked(name: str, mock: Mock) -> Callable[[dict[str, Any]], Any]:
    if mock.error is not None:
        message, code = mock.error, mock.code

        def failing(args: dict[str, Any]) -> Any:
            raise ModelRetry(message, code=code)

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
