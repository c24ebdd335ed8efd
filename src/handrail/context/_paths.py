"""The path language of the context store: ONE parser and ONE walker.

`parse_path` turns a path tail (`items[0].sku`, `["odd key"]`, `[*]`, `.first`, `.last`) into
segments, `walk` follows them through mappings, sequences, pydantic models, dataclasses and
objects, and `_parse_ref` splits a whole namespaced path (`tool:orders.lookup.items[0]`). Errors
are `PathError`s that name the failing segment and what was found there.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterable, Mapping, MutableMapping, MutableSequence, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, TypeAlias

from pydantic import BaseModel

from ..exceptions import PathError

__all__ = ["Index", "Key", "Segment", "Wildcard", "check_path", "format_path", "parse_path", "walk"]

# -- segments ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Key:
    """A key of a mapping or an attribute of an object: `.name`, or `["odd name"]`.

    On a list, the keys `first` and `last` mean `[0]` and `[-1]`; on a mapping that has a real
    key named `first` or `last`, the real key wins.
    """

    name: str
    """The key or attribute name."""


@dataclass(frozen=True, slots=True)
class Index:
    """A position in a list: `[0]`, or `[-1]` counting from the end."""

    index: int
    """The position; a negative one counts from the end."""


@dataclass(frozen=True, slots=True)
class Wildcard:
    """A fan-out, `[*]`: the rest of the path applies to every element of a list."""


Segment: TypeAlias = Key | Index | Wildcard
"""One step of a path."""

_WILDCARD: Final = Wildcard()
_BARE: Final = re.compile(r"[\w-]+")
_INDEX: Final = re.compile(r"-?[0-9]+")
_MAX_INDEX_DIGITS: Final = 18
_CALL_ID: Final = re.compile(r"[A-Za-z0-9_-]+")
_NAMESPACES: Final = "var:, tool:, call:, sys:"
_LIST_LIMIT: Final = 20
_LEAVES: Final = (str, bytes, bytearray, int, float, complex, type(None))
_TEXTS: Final = (str, bytes, bytearray)


# -- parsing ----------------------------------------------------------------------------------


class _BadSyntax(Exception):
    """A syntax error at `pos` of the text being parsed (converted to `PathError` by callers)."""

    def __init__(self, pos: int, expected: str) -> None:
        self.pos = pos
        self.expected = expected

    def error(self, path: str, text: str, offset: int) -> PathError:
        found = repr(text[self.pos]) if self.pos < len(text) else "end of path"
        return PathError(
            f'"{path}": syntax error at position {self.pos + offset}: unexpected {found};'
            f" {self.expected}",
            path=path,
        )


def parse_path(path: str) -> tuple[Segment, ...]:
    """Parse the tail of a path (what follows a namespace and a name) into segments.

    Args:
        path: e.g. `items[0].sku`, `.items[*]["odd key"]`, or `""` (the value itself).

    Returns:
        The segments, e.g. `(Key("items"), Index(0), Key("sku"))`. Parses are cached.

    Raises:
        PathError: the path does not parse; the message names the position (0-based) and the
            unexpected character.
    """
    return _parse_tail(path, path, 0)


def check_path(path: str) -> None:
    """Check that a context path is well-formed, without reading it.

    For checks at definition time, e.g. of a tool's `bindings`. A `tool:` path is checked
    against every way to split it into a tool name and a tail; at least one must parse.

    Raises:
        PathError: the path does not parse, or names an unknown namespace.
    """
    _parse_ref(path)


def format_path(segments: Iterable[Segment]) -> str:
    r"""Write segments back as a path tail: `parse_path(format_path(s)) == s`.

    Keys that are not made of word characters and `-` are quoted (`["a b"]`), escaping `\\`
    and `"` with a backslash.
    """
    return _format(segments, dotted=False)


def _parse_tail(path: str, text: str, offset: int) -> tuple[Segment, ...]:
    try:
        return _parse(text)
    except _BadSyntax as bad:
        raise bad.error(path, text, offset) from None


@lru_cache(maxsize=4096)
def _parse(text: str) -> tuple[Segment, ...]:
    segments: list[Segment] = []
    end = len(text)
    pos = 0
    if end and text[0] not in ".[":
        pos = _bare_key(text, 0, segments, 'expected a key, "." or "["')
    while pos < end:
        char = text[pos]
        if char == ".":
            pos = _bare_key(text, pos + 1, segments, 'expected a key after "."')
        elif char == "[":
            pos = _bracket(text, pos + 1, segments)
        else:
            raise _BadSyntax(pos, 'expected "." or "[" after a segment')
    return tuple(segments)


def _bare_key(text: str, pos: int, segments: list[Segment], expected: str) -> int:
    match = _BARE.match(text, pos)
    if match is None:
        raise _BadSyntax(pos, expected)
    segments.append(Key(match.group()))
    return match.end()


def _bracket(text: str, pos: int, segments: list[Segment]) -> int:
    char = text[pos : pos + 1]
    if char == "*":
        segments.append(_WILDCARD)
        pos += 1
    elif char in ('"', "'"):
        name, pos = _quoted(text, pos)
        segments.append(Key(name))
    else:
        match = _INDEX.match(text, pos)
        if match is None:
            raise _BadSyntax(pos, 'expected an index, "*" or a quoted key after "["')
        digits = match.end() - match.start() - (char == "-")
        if digits > _MAX_INDEX_DIGITS:
            raise _BadSyntax(
                match.end() - digits + _MAX_INDEX_DIGITS,
                f"an index has at most {_MAX_INDEX_DIGITS} digits",
            )
        segments.append(Index(int(match.group())))
        pos = match.end()
    if text[pos : pos + 1] != "]":
        raise _BadSyntax(pos, 'expected "]"')
    return pos + 1


def _quoted(text: str, pos: int) -> tuple[str, int]:
    quote = text[pos]
    chars: list[str] = []
    pos += 1
    while pos < len(text):
        char = text[pos]
        if char == quote:
            return "".join(chars), pos + 1
        if char == "\\":
            escaped = text[pos + 1 : pos + 2]
            if escaped not in ("\\", '"', "'"):
                raise _BadSyntax(pos + 1, "only \\\\, \\\" and \\' are escapes in a quoted key")
            chars.append(escaped)
            pos += 2
        else:
            chars.append(char)
            pos += 1
    raise _BadSyntax(pos, f"expected {quote!r} to close the quoted key")


def _format(segments: Iterable[Segment], *, dotted: bool) -> str:
    parts: list[str] = []
    for segment in segments:
        if isinstance(segment, Key):
            name = segment.name
            if not _BARE.fullmatch(name):
                escaped = name.replace("\\", "\\\\").replace('"', '\\"')
                parts.append(f'["{escaped}"]')
            elif parts or dotted:
                parts.append(f".{name}")
            else:
                parts.append(name)
        elif isinstance(segment, Index):
            parts.append(f"[{segment.index}]")
        else:
            parts.append("[*]")
    return "".join(parts)


# -- namespaced paths -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ToolSplit:
    """One way to split `tool:<rest>` into a tool name and a tail."""

    name: str
    every: bool
    """`[]` follows the name: all outputs of the tool this turn."""
    segments: tuple[Segment, ...]
    prefix: str
    """What the segments follow, for error messages: `tool:name` or `tool:name[]`."""


@dataclass(frozen=True, slots=True)
class _Ref:
    namespace: str
    head: str = ""
    """var/sys: the name (also `segments[0]`); call: the tool call id."""
    segments: tuple[Segment, ...] = ()
    prefix: str = ""
    """What the segments follow, for error messages: `var:`, `sys:`, `call:<id>`."""
    splits: tuple[_ToolSplit, ...] = ()
    """tool: the possible splits, longest tool name first."""


@lru_cache(maxsize=4096)
def _parse_ref(path: str) -> _Ref:
    namespace, colon, rest = path.partition(":")
    if not colon:
        raise PathError(
            f'"{path}": a context path starts with a namespace, one of: {_NAMESPACES}', path=path
        )
    offset = len(namespace) + 1
    if namespace == "tool":
        return _Ref("tool", splits=_tool_splits(path, rest, offset))
    if namespace == "call":
        match = _CALL_ID.match(rest)
        if match is None:
            raise _BadSyntax(0, 'expected a tool call id after "call:"').error(path, rest, offset)
        tail = rest[match.end() :]
        try:
            segments = _parse_after_name(tail)
        except _BadSyntax as bad:
            raise bad.error(path, tail, offset + match.end()) from None
        return _Ref("call", match.group(), segments, prefix=f"call:{match.group()}")
    if namespace in ("var", "sys"):
        segments = _parse_tail(path, rest, offset)
        first = segments[0] if segments else None
        if not isinstance(first, Key) or rest.startswith("."):
            what = "variable name" if namespace == "var" else "sys key"
            raise _BadSyntax(0, f'expected a {what} after "{namespace}:"').error(path, rest, offset)
        return _Ref(namespace, first.name, segments, prefix=f"{namespace}:")
    raise PathError(
        f'"{path}": unknown namespace "{namespace}:"; valid namespaces: {_NAMESPACES}', path=path
    )


def _parse_after_name(tail: str) -> tuple[Segment, ...]:
    """Parse what follows a tool name, `[]` or a call id: it starts with `.` or `[`, if at all."""
    if tail[:1] not in ("", ".", "["):
        raise _BadSyntax(0, 'expected "." or "[" after the name')
    return _parse(tail)


def _tool_splits(path: str, rest: str, offset: int) -> tuple[_ToolSplit, ...]:
    bracket = rest.find("[")
    dotted_name = rest if bracket < 0 else rest[:bracket]
    if not dotted_name or dotted_name.startswith("."):
        raise _BadSyntax(0, 'expected a tool name after "tool:"').error(path, rest, offset)
    _parse_tail(path, dotted_name, offset)  # a tool name is dotted words: reject anything else
    # A split whose tail does not parse cannot be meant (`tool:a.b[]` is not tool `a`, key
    # `b`, then `[]`), so it is left out; the path is a syntax error only if none parses.
    splits: list[_ToolSplit] = []
    errors: list[PathError] = []
    end = len(dotted_name)
    while end > 0:
        after = rest[end:]
        every = after.startswith("[]")
        tail = after[2:] if every else after
        try:
            segments = _parse_after_name(tail)
            prefix = f"tool:{rest[:end]}{'[]' if every else ''}"
            splits.append(_ToolSplit(rest[:end], every, segments, prefix))
        except _BadSyntax as bad:
            errors.append(bad.error(path, tail, offset + len(rest) - len(tail)))
        end = dotted_name.rfind(".", 0, end)
    if not splits:
        raise errors[0]  # the longest split's
    return tuple(splits)


# -- walking ----------------------------------------------------------------------------------


class _Miss(Exception):
    """A well-formed path that does not resolve: `get` may fall back to its default."""

    def __init__(self, reason: str, at: int = -1, segment: str | None = None) -> None:
        self.reason = reason
        self.at = at  # the failing segment's index; -1: the name itself did not resolve
        self.segment = segment
        self.trail: list[int] = []  # element indexes of the enclosing fan-outs, innermost first
        self.segments: tuple[Segment, ...] = ()
        self.prefix = ""
        self.dotted = False

    def locate(self, segments: tuple[Segment, ...], prefix: str, *, dotted: bool) -> _Miss:
        self.segments = segments
        self.prefix = prefix
        self.dotted = dotted
        return self

    def error(self, path: str) -> PathError:
        if self.at < 0:
            return PathError(f'"{path}": {self.reason}', path=path, segment=self.segment)
        segment = _format((self.segments[self.at],), dotted=True)
        where = ""
        if self.trail:
            indexes = reversed(self.trail)
            concrete = [
                Index(next(indexes)) if isinstance(s, Wildcard) else s
                for s in self.segments[: self.at]
            ]
            where = f" in {self.prefix}{_format(concrete, dotted=self.dotted)}"
        return PathError(
            f'"{path}": at "{segment}"{where}: {self.reason}', path=path, segment=segment
        )


def walk(value: Any, path: str) -> Any:
    """Return the part of `value` that `path` reaches.

    Mappings are walked by key, pydantic models, dataclasses and other objects by (public)
    attribute, sequences other than `str`/`bytes` by index. A `[*]` applies the rest of the
    path to every element and gives a list; each further `[*]` flattens one more level, so the
    result of a path with any number of `[*]` is one flat list (JSONPath style):
    `walk(v, "orders[*].items[*].sku")` is `[i["sku"] for o in v["orders"] for i in o["items"]]`.

    Args:
        value: any value (a tool output, a variable, a dict).
        path: a path tail, e.g. `items[0].sku`; `""` returns `value` itself.

    Returns:
        The value reached. It is the stored object, not a copy.

    Raises:
        PathError: the path does not parse, or does not resolve; the message names the failing
            segment and what was found there, e.g. `"items[5]": at "[5]": index 5 is out of
            range for a list of 3 items`.
    """
    segments = parse_path(path)
    try:
        return _walk(value, segments, 0)
    except _Miss as miss:
        raise miss.locate(segments, "", dotted=False).error(path) from None


def _walk(value: Any, segments: tuple[Segment, ...], start: int) -> Any:
    for at in range(start, len(segments)):
        segment = segments[at]
        if isinstance(segment, Key):
            value = _step_key(value, segment, at)
        elif isinstance(segment, Index):
            value = _step_index(value, segment, at)
        else:
            return _fan_out(value, segments, at)
    return value


def _step_key(value: Any, segment: Key, at: int) -> Any:
    name = segment.name
    if type(value) is dict:
        try:
            return value[name]
        except KeyError:
            raise _Miss(_no_key(name, value), at) from None
    if isinstance(value, Mapping):
        if name in value:
            return value[name]
        raise _Miss(_no_key(name, value), at)
    if _is_list(value):
        return value[_position(value, segment, at)]
    if isinstance(value, _LEAVES):
        raise _Miss(f'cannot read key "{name}" of {_describe(value)}', at)
    if name.startswith("_"):
        raise _Miss(f'attribute "{name}" is private: a path reads public attributes only', at)
    try:
        return getattr(value, name)
    except AttributeError:
        raise _Miss(f'no attribute "{name}" on {_describe(value)}', at) from None


def _step_index(value: Any, segment: Index, at: int) -> Any:
    if type(value) is list:
        try:
            return value[segment.index]
        except IndexError:
            raise _Miss(_out_of_range(segment.index, value), at) from None
    if _is_list(value):
        return value[_position(value, segment, at)]
    raise _Miss(_cannot_index(value, segment), at)


def _cannot_index(value: Any, segment: Index) -> str:
    hint = '; use a key, as .name or ["name"]' if isinstance(value, Mapping) else ""
    return f"cannot index {_describe(value)}: [{segment.index}] needs a list{hint}"


def _fan_out(value: Any, segments: tuple[Segment, ...], at: int) -> list[Any]:
    if not _is_list(value):
        raise _Miss(f"cannot fan out over {_describe(value)}: [*] needs a list", at)
    nested = any(isinstance(segment, Wildcard) for segment in segments[at + 1 :])
    results: list[Any] = []
    for number, item in enumerate(value):
        try:
            result = _walk(item, segments, at + 1)
        except _Miss as miss:
            miss.trail.append(number)
            raise
        if nested:
            results.extend(result)
        else:
            results.append(result)
    return results


def _position(items: Sequence[Any], segment: Key | Index, at: int) -> int:
    """The non-negative position in `items` that `segment` (`[i]`, `.first`, `.last`) names."""
    size = len(items)
    if isinstance(segment, Key):
        if segment.name not in ("first", "last"):
            raise _Miss(
                f'cannot read key "{segment.name}" of {_describe(items)}: use an index such as'
                " [0], or .first / .last",
                at,
            )
        if not size:
            raise _Miss(f".{segment.name} of an empty list", at)
        return 0 if segment.name == "first" else size - 1
    position = segment.index + size if segment.index < 0 else segment.index
    if not 0 <= position < size:
        raise _Miss(_out_of_range(segment.index, items), at)
    return position


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, _TEXTS)


def _no_key(name: str, mapping: Mapping[Any, Any]) -> str:
    return f'no key "{name}" in {_describe(mapping)}'


def _out_of_range(index: int, items: Sequence[Any]) -> str:
    return f"index {index} is out of range for {_describe(items)}"


def _describe(value: Any) -> str:
    """Say what a value is, for an error message: `a list of 3 items`, `an object with keys: …`."""
    if isinstance(value, Mapping):
        return f"an object with keys: {_names(value)}" if value else "an empty object"
    if value is None:
        return "None"
    kind = type(value).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    if _is_list(value):
        kind = "list" if isinstance(value, list) else kind
        size = len(value)
        return f"a {kind} of {size} item{'' if size == 1 else 's'}" if size else f"an empty {kind}"
    if isinstance(value, _LEAVES):
        text = repr(value)
        return f"{article} {kind} ({text if len(text) <= 40 else text[:39] + '…'})"
    fields = _fields(value)
    return f"{article} {kind} with fields: {_names(fields)}" if fields else f"{article} {kind}"


def _fields(value: Any) -> list[str] | None:
    if isinstance(value, BaseModel):
        return [*type(value).model_fields, *(value.model_extra or ())]
    if dataclasses.is_dataclass(value):
        return [field.name for field in dataclasses.fields(value)]
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        return [name for name in attributes if not str(name).startswith("_")]
    return None


def _names(names: Iterable[Any]) -> str:
    """Sorted, each shortened, at most `_LIST_LIMIT` of them."""
    ordered = sorted(str(name) if len(str(name)) <= 40 else str(name)[:39] + "…" for name in names)
    if not ordered:
        return "none"
    shown = ", ".join(ordered[:_LIST_LIMIT])
    more = len(ordered) - _LIST_LIMIT
    return f"{shown}, … and {more} more" if more > 0 else shown


def _assign(container: Any, segments: tuple[Segment, ...], at: int, value: Any) -> Any:
    """A copy of `container` with `value` written at `segments[at:]` (copy on write)."""
    segment = segments[at]
    last = at == len(segments) - 1
    if isinstance(segment, Wildcard):
        raise _Miss("cannot write through [*]: a write goes to one place", at)
    if isinstance(container, MutableMapping):
        if isinstance(segment, Index):
            raise _Miss(_cannot_index(container, segment), at)
        name = segment.name
        updated = copy.copy(container)
        child = container.get(name, {})
        updated[name] = value if last else _assign(child, segments, at + 1, value)
        return updated
    if isinstance(container, MutableSequence) and not isinstance(container, bytearray):
        position = _position(container, segment, at)
        copied = copy.copy(container)
        copied[position] = value if last else _assign(container[position], segments, at + 1, value)
        return copied
    raise _Miss(
        f"cannot write into {_describe(container)}: only dicts and lists can be written into;"
        " set the whole variable instead",
        at,
    )
