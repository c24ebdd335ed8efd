"""Turning what the model sent into a tool's validated arguments, leniently.

Models send arguments that are almost right: `"3"` for an integer, one value where a list is
expected, `null` for an argument they mean to leave out, a nested object as a JSON string,
padded strings. Those are repaired; what cannot be repaired becomes ONE error that lists every
bad field, written so the model can send the call again correctly.
"""

from __future__ import annotations

from typing import Any

import pydantic_core
from pydantic import BaseModel, ValidationError

__all__ = ["ArgumentsError", "parse_arguments", "validate_arguments"]

_CONTAINER_TYPES = frozenset(
    {"list_type", "dict_type", "model_type", "model_attributes_type", "tuple_type", "set_type"}
)


class ArgumentsError(Exception):
    """Arguments that cannot be used; `str(error)` is written for the model to act on."""


def parse_arguments(raw: str) -> dict[str, Any]:
    """Parse the JSON arguments of a call into an object.

    An empty string means no arguments (some models send that for a tool without any).

    Raises:
        ArgumentsError: the text is not JSON, or not a JSON object.
    """
    text = raw.strip()
    if not text:
        return {}
    try:
        value = pydantic_core.from_json(text)
    except ValueError as exc:
        raise ArgumentsError(
            f"the arguments are not valid JSON ({exc}); send them as one JSON object, "
            f'like {{"name": "value"}}'
        ) from None
    if not isinstance(value, dict):
        raise ArgumentsError(
            f"the arguments must be a JSON object of named arguments, not a JSON "
            f"{_json_kind(value)}"
        )
    return value


def validate_arguments(model: type[BaseModel], args: dict[str, Any]) -> BaseModel:
    """Validate `args` against a tool's input model, repairing near misses once.

    Raises:
        ArgumentsError: listing every field that is still wrong after repair.
    """
    try:
        return model.__pydantic_validator__.validate_python(args)  # type: ignore[no-any-return]
    except ValidationError as first:
        repaired = _repair(model, args, first)
        if repaired is not None:
            try:
                return model.model_validate(repaired)
            except ValidationError as second:
                raise ArgumentsError(_describe(second)) from None
        raise ArgumentsError(_describe(first)) from None


def _repair(
    model: type[BaseModel], args: dict[str, Any], error: ValidationError
) -> dict[str, Any] | None:
    fixed = dict(args)
    changed = False
    fields = model.model_fields
    for err in error.errors():
        loc = err["loc"]
        if len(loc) < 1 or not isinstance(loc[0], str) or loc[0] not in fixed:
            continue
        name = loc[0]
        value = fixed[name]
        if len(loc) != 1:
            continue
        kind = err["type"]
        if value is None and not fields[name].is_required():
            del fixed[name]
            changed = True
        elif kind in _CONTAINER_TYPES and isinstance(value, str):
            try:
                fixed[name] = pydantic_core.from_json(value)
                changed = True
            except ValueError:
                if kind == "list_type":
                    fixed[name] = [value]
                    changed = True
        elif kind == "list_type" and not isinstance(value, list | dict):
            fixed[name] = [value]
            changed = True
    return fixed if changed else None


def _describe(error: ValidationError) -> str:
    lines = []
    for err in error.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "not an argument of this tool"
        elif err["type"] != "missing":
            message += f" (got {_short(err['input'])})"
        lines.append(f"- {where}: {message}")
    return "invalid arguments:\n" + "\n".join(lines)


def _short(value: Any) -> str:
    text = pydantic_core.to_json(value, fallback=repr).decode()
    return text if len(text) <= 60 else text[:57] + "..."


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return "number"
