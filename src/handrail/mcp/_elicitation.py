"""An MCP elicitation as a handrail question, and a person's text answer as the server's form.

handrail asks a person with text (`AskPerson`, a `question` card whose answer is a string),
and an MCP server asks with a form: a flat JSON Schema object of primitive fields (string,
number, integer, boolean, a single-select enum, a multi-select enum array). `question` writes
the prompt a person reads; `form_content` turns their text into the form's content.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["UnfitAnswer", "form_content", "question", "url_question"]

_TRUE = frozenset({"true", "yes", "y", "1", "on"})
_FALSE = frozenset({"false", "no", "n", "0", "off"})


class UnfitAnswer(ValueError):
    """A person's answer that does not fill the server's form; the message says why."""


def question(message: str, schema: dict[str, Any]) -> str:
    """The prompt a person reads for a form elicitation: the server's message and its fields."""
    properties = _properties(schema)
    if not properties:
        return message
    target = _text_field(schema)
    lines = [message, ""]
    if target is not None and len(properties) == 1:
        lines.append(f"Answer with {_describe(target, properties[target], schema)}.")
        return "\n".join(lines)
    if target is not None:
        lines.append(
            f"Answer with plain text for {target!r}, or with a JSON object of these fields:"
        )
    else:
        lines.append("Answer with a JSON object of these fields:")
    lines.extend(f"- {_describe(name, field, schema)}" for name, field in properties.items())
    return "\n".join(lines)


def url_question(message: str, url: str) -> str:
    """The prompt for a URL elicitation: the person finishes at `url`, then answers anything."""
    return f"{message}\n\nOpen {url} and finish there; then answer here (any text) to go on."


def form_content(schema: dict[str, Any], answer: str) -> dict[str, Any]:
    """The form's content from a person's text answer.

    A JSON object is taken field by field (each value coerced to its field's type). Plain
    text fills the form's one field, or its one required field when it has several (the
    server's defaults fill the others).

    Raises:
        UnfitAnswer: the text fits no field, or a value does not fit its field.
    """
    properties = _properties(schema)
    text = answer.strip()
    if text.startswith("{"):
        try:
            values = json.loads(text)
        except ValueError:
            values = None
        if isinstance(values, dict):
            unknown = sorted(set(values) - set(properties))
            if unknown:
                raise UnfitAnswer(f"the form has no field {', '.join(map(repr, unknown))}")
            content = {name: _coerce(name, properties[name], v) for name, v in values.items()}
            _check_required(schema, content)
            return content
    target = _text_field(schema)
    if target is None:
        names = ", ".join(properties) or "none"
        raise UnfitAnswer(
            f"the form has several fields ({names}), so the answer must be a JSON object of them"
        )
    return {target: _coerce(target, properties[target], answer)}


def _properties(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    properties = schema.get("properties")
    return dict(properties) if isinstance(properties, dict) else {}


def _text_field(schema: dict[str, Any]) -> str | None:
    """The field plain text fills: the only field, else the only required one."""
    properties = _properties(schema)
    if len(properties) == 1:
        return next(iter(properties))
    required = [name for name in schema.get("required", ()) if name in properties]
    return required[0] if len(required) == 1 else None


def _describe(name: str, field: dict[str, Any], schema: dict[str, Any]) -> str:
    kind = field.get("type", "string")
    choices = _choices(field)
    if choices:
        kind = f"one of {', '.join(choices)}"
    elif kind == "array":
        items = field.get("items", {})
        kind = f"a list of {', '.join(_choices(items)) or 'values'}, comma-separated"
    required = ", required" if name in schema.get("required", ()) else ""
    description = field.get("description") or field.get("title") or ""
    if description.replace(" ", "_").lower() == name.lower():
        description = ""  # pydantic's default title only repeats the name
    return f"{name} ({kind}{required})" + (f": {description}" if description else "")


def _choices(field: dict[str, Any]) -> list[str]:
    """The values a select field allows (`enum`, or the `const`s of `oneOf`/`anyOf`)."""
    if isinstance(field.get("enum"), list):
        return [str(v) for v in field["enum"]]
    options = field.get("oneOf") or field.get("anyOf") or []
    return [str(o["const"]) for o in options if isinstance(o, dict) and "const" in o]


def _titles(field: dict[str, Any]) -> dict[str, str]:
    """Lower-cased option title (or legacy `enumNames` entry) -> its value."""
    titles: dict[str, str] = {}
    for option in field.get("oneOf") or field.get("anyOf") or []:
        if isinstance(option, dict) and "const" in option and "title" in option:
            titles[str(option["title"]).lower()] = str(option["const"])
    names = field.get("enumNames")
    if isinstance(names, list) and isinstance(field.get("enum"), list):
        titles.update({str(n).lower(): str(v) for n, v in zip(names, field["enum"], strict=False)})
    return titles


def _coerce(name: str, field: dict[str, Any], value: Any) -> Any:
    kind = field.get("type", "string")
    if kind == "array":
        items = value if isinstance(value, list) else str(value).split(",")
        return [_choice(name, field.get("items", {}), str(v).strip()) for v in items]
    if not isinstance(value, str):
        return value  # a JSON value: the server validates it against its own schema
    text = value.strip()
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            return float(text)
    except ValueError:
        raise UnfitAnswer(f"{name!r} needs a {kind}, not {text!r}") from None
    if kind == "boolean":
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise UnfitAnswer(f"{name!r} needs yes or no, not {text!r}")
    if _choices(field):
        return _choice(name, field, text)
    return value


def _choice(name: str, field: dict[str, Any], text: str) -> str:
    choices = _choices(field)
    if not choices or text in choices:
        return text
    titled = _titles(field).get(text.lower())
    if titled is not None:
        return titled
    raise UnfitAnswer(f"{name!r} must be one of {', '.join(choices)}, not {text!r}")


def _check_required(schema: dict[str, Any], content: dict[str, Any]) -> None:
    missing = [name for name in schema.get("required", ()) if name not in content]
    if missing:
        raise UnfitAnswer(f"the answer leaves out the required {', '.join(map(repr, missing))}")
