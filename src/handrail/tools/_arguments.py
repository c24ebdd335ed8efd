"""Turning what the model sent into a tool's validated arguments, leniently.

Models send arguments that are almost right. The text may not quite be JSON: wrapped in a
code fence or in prose, with trailing commas, single quotes, Python's `True`/`False`/`None`
or bare keys. `parse_arguments` repairs that (valid JSON is never touched). Text cut off
midway is never completed: closing it would be a guess at what the model meant (a cut string
is not the string it was writing), so it is an error the model reads. The values may not
quite fit: `"3"` for an integer, one value where a list is expected, `null` for an argument
they mean to leave out, a nested object as a JSON string. `validate_arguments` repairs those,
and only those values that fail validation: a value that validates reaches the tool as sent
(whitespace and all). What cannot be repaired becomes ONE error that names the problem (every
bad field), written so the model can send the call again correctly.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

import pydantic_core
from pydantic import BaseModel, ValidationError

__all__ = [
    "NOT_FINITE",
    "ArgumentsError",
    "not_finite",
    "parse_arguments",
    "repair_json",
    "validate_arguments",
]

_CONTAINER_TYPES = frozenset(
    {"list_type", "dict_type", "model_type", "model_attributes_type", "tuple_type", "set_type"}
)


class ArgumentsError(Exception):
    """Arguments that cannot be used; `str(error)` is written for the model to act on."""


def parse_arguments(raw: str) -> dict[str, Any]:
    """Parse the JSON arguments of a call into an object, repairing near-JSON.

    An empty string means no arguments (some models send that for a tool without any). Text
    that is not valid JSON goes through `repair_json` before it is given up on.

    Raises:
        ArgumentsError: the text is not JSON even after repair, or not a JSON object.
    """
    text = raw.strip()
    if not text:
        return {}
    try:
        value = pydantic_core.from_json(text)
    except ValueError as exc:
        value = _repaired(text)
        if value is None:
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


_FENCE = re.compile(r"^```[\w-]*[ \t]*\n?(.*?)\n?```$", re.S)
_PYTHON_WORDS = {"True": "true", "False": "false", "None": "null"}


def _repaired(text: str) -> Any:
    """The value of near-JSON `text` after `repair_json`, or None when even that fails."""
    try:
        return pydantic_core.from_json(repair_json(text))
    except ValueError:
        return None


def repair_json(text: str) -> str:
    """Rewrite near-JSON as JSON, as far as a model's usual slips go.

    Unwraps a Markdown code fence (or prose around the first `{` and the last `}`), turns
    single-quoted strings into double-quoted ones, Python's `True`/`False`/`None` into JSON's,
    quotes bare keys, escapes raw control characters in strings and drops trailing commas.
    Inside strings nothing but the quotes changes. A text cut off midway is left open (and
    so still fails to parse): nothing is invented to close it.
    """
    text = text.strip()
    fence = _FENCE.match(text)
    if fence:
        text = fence.group(1).strip()
    if not text.startswith(("{", "[")) and "{" in text:
        end = text.rfind("}")
        text = text[text.index("{") : end + 1 if end > text.index("{") else len(text)]
    out: list[str] = []
    quote = ""  # the quote of the string being read, if any
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if quote:
            if char == "\\" and i + 1 < n:
                escaped = text[i + 1]
                # \' is legal in a single-quoted string, not in JSON; \" needs its backslash.
                out.append(escaped if escaped == "'" else char + escaped)
                i += 2
                continue
            if char == quote:
                out.append('"')
                quote = ""
            elif char == '"':
                out.append('\\"')
            elif char < " ":
                out.append(f"\\u{ord(char):04x}")
            else:
                out.append(char)
            i += 1
            continue
        if char in "\"'":
            quote = char
            out.append('"')
        elif char in "}]":
            _drop_trailing_comma(out)
            out.append(char)
        elif char.isalpha() or char == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            k = j
            while k < n and text[k] in " \t":
                k += 1
            if k < n and text[k] == ":":  # an unquoted key
                out.append(f'"{word}"')
            else:
                out.append(_PYTHON_WORDS.get(word, word))
            i = j
            continue
        else:
            out.append(char)
        i += 1
    return "".join(out)


def _drop_trailing_comma(out: list[str]) -> None:
    """Remove a comma (and the blanks after it) at the end of `out`."""
    end = len(out)
    while end and out[end - 1] in (" ", "\t", "\r", "\n"):
        end -= 1
    if end and out[end - 1] == ",":
        del out[end - 1 :]


def validate_arguments(model: type[BaseModel], args: dict[str, Any]) -> BaseModel:
    """Validate `args` against a tool's input model, repairing near misses once.

    Raises:
        ArgumentsError: listing every field that is still wrong after repair.
    """
    try:
        validated: BaseModel = model.__pydantic_validator__.validate_python(args)
    except ValidationError as first:
        repaired = _repair(model, args, first)
        if repaired is None:
            raise ArgumentsError(_describe(first)) from None
        try:
            validated = model.model_validate(repaired)
        except ValidationError as second:
            raise ArgumentsError(_describe(second)) from None
    _check_finite(validated)
    return validated


def _check_finite(validated: BaseModel) -> None:
    """Refuse a number that is not finite anywhere in validated arguments.

    The tools' input models refuse one in their own fields (`allow_inf_nan=False`), but a
    nested model of the tool's author, or an `Any`, takes `"inf"`, `"nan"`, `"1e999"` or a
    JSON `Infinity`: such a value means nothing to a tool, and stored arguments and the audit
    trail cannot hold it.
    """
    path = not_finite(validated.model_dump(warnings=False))
    if path is not None:
        raise ArgumentsError(f"invalid arguments:\n- {path}: {NOT_FINITE}")


NOT_FINITE = "Input should be a finite number (not NaN, not Infinity, not past ±1.8e308)"


def not_finite(value: Any) -> str | None:
    """The dotted path to a number in `value` that is not finite, or None if there is none."""
    where = _not_finite(value, ())
    return None if where is None else ".".join(str(p) for p in where) or "(the value)"


def _not_finite(value: Any, where: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The path to a number in `value` that is not finite, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else where
    if isinstance(value, Decimal):
        return None if value.is_finite() else where
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list | tuple | set | frozenset):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _not_finite(item, (*where, key))
        if found is not None:
            return found
    return None


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
