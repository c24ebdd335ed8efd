"""Partial matching of tool-call arguments: what an expectation gives must be there.

- a mapping matches a mapping that has every expected key with a matching value (more keys
  are fine), however deeply nested;
- a list matches a list of the same length whose items match in order;
- numbers match by value (`84` matches `84.0`), but a bool is not a number;
- anything else matches an equal value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["matches", "mismatch"]


def matches(expected: Any, actual: Any) -> bool:
    """Whether `actual` includes `expected` (see the module docstring)."""
    return mismatch(expected, actual) is None


def mismatch(expected: Any, actual: Any, where: str = "") -> str | None:
    """Where `actual` first fails to include `expected`, or None when it does."""
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            return f"{where or 'value'} is {_show(actual)}, not a mapping"
        for key, value in expected.items():
            at = f"{where}.{key}" if where else str(key)
            if key not in actual:
                return f"{at} is missing"
            found = mismatch(value, actual[key], at)
            if found is not None:
                return found
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return f"{where or 'value'} is {_show(actual)}, not {_show(expected)}"
        for index, (item, real) in enumerate(zip(expected, actual, strict=True)):
            found = mismatch(item, real, f"{where}[{index}]")
            if found is not None:
                return found
        return None
    if _number(expected) and _number(actual):
        if expected == actual:
            return None
        return f"{where or 'value'} is {_show(actual)}, not {_show(expected)}"
    if type(expected) is not type(actual) or expected != actual:
        return f"{where or 'value'} is {_show(actual)}, not {_show(expected)}"
    return None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
