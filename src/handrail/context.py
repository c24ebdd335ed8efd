"""The context store: typed paths that tool arguments bind from and tool outputs land in.

A path is `<namespace>:<name><tail>`:

- `var:cart.total`: session-scoped variables, read and write; they persist across turns.
- `tool:orders.lookup`: the last output of a tool this turn; `tool:orders.lookup[]` is the list
  of all its outputs this turn, in recording order.
- `call:<tool_call_id>`: the output of one tool call this turn.
- `sys:user_id`: read-only values set when the store is built (`org_id`, `user_id`,
  `session_id`, `now`).

The tail is walked by ONE walker, `walk`, that also serves any caller that holds a value:
`.key` (or a leading `key`), `["odd key"]`, `[0]`, `[-1]`, `[*]`, `.first`, `.last`. See
`docs/context.md` for the whole syntax.

The store is pure: no I/O, no clock (time comes in through `sys`), no global state beyond the
cache of parsed paths.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import re
from collections import deque
from collections.abc import Iterable, Mapping, MutableMapping, MutableSequence, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, TypeAlias

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import to_json, to_jsonable_python
from typing_extensions import TypedDict

from handrail.exceptions import ConfigError, ContextFullError, PathError, UserError

__all__ = [
    "MISSING",
    "ContextStore",
    "Index",
    "Key",
    "Segment",
    "Wildcard",
    "check_path",
    "format_path",
    "parse_path",
    "walk",
]

_SCHEMA_VERSION: Final = 1
"""Version of `ContextStore.dump`. 1: vars, turn (outputs in recording order), dropped."""


class _Missing(enum.Enum):
    MISSING = "MISSING"

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing.MISSING
"""Default of `ContextStore.get`'s `default`: a path that does not resolve raises."""


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


# -- the store --------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Output:
    tool: str
    call_id: str
    output: Any
    size: int


class _TurnEntry(TypedDict):
    tool: str
    call_id: str
    output: Any


class _Dump(TypedDict):
    schema_version: int
    vars: dict[str, Any]
    turn: list[_TurnEntry]
    dropped: dict[str, str]


_DUMP: Final = TypeAdapter(_Dump)


def _var_size(value: Any, path: str) -> int:
    try:
        return len(to_json(value))
    except ValueError as error:
        raise PathError(
            f'"{path}": the value cannot be stored: {error}. Variables are persisted with the'
            " session, so they must serialise to JSON",
            path=path,
        ) from None


class ContextStore:
    """Session variables, this turn's tool outputs and read-only sys values, read by path.

    Args:
        vars: the session-scoped variables to start with (e.g. loaded with the session);
            copied, and each must serialise to JSON.
        sys: read-only values: `org_id`, `user_id`, `session_id`, and `now` (an ISO string from
            the engine's injected clock). Any other keys are allowed.
        max_bytes: cap on what the store holds, measured as the length of each value's JSON,
            computed once when it is stored. Over it, the oldest tool outputs of the turn are
            dropped; variables are never dropped.

    Raises:
        ConfigError: `max_bytes` is not positive.
        ContextFullError: `vars` alone exceed `max_bytes`.
        PathError: a variable does not serialise to JSON.

    Values are stored and returned as they are, not copied: treat what `get` returns as
    read-only. The store is not thread-safe; the dispatcher records from the event loop.
    """

    __slots__ = (
        "_by_tool",
        "_calls",
        "_dropped",
        "_max_bytes",
        "_order",
        "_sys",
        "_turn_bytes",
        "_var_sizes",
        "_vars",
        "_vars_bytes",
    )

    def __init__(
        self,
        *,
        vars: dict[str, Any] | None = None,
        sys: Mapping[str, Any] | None = None,
        max_bytes: int = 1_000_000,
    ) -> None:
        if max_bytes <= 0:
            raise ConfigError(f"ContextStore(max_bytes={max_bytes}): max_bytes must be positive")
        self._max_bytes = max_bytes
        self._sys: dict[str, Any] = dict(sys or {})
        self._vars: dict[str, Any] = {}
        self._var_sizes: dict[str, int] = {}
        self._vars_bytes = 0
        # This turn's outputs, three views kept consistent: in recording order (the oldest
        # first), by call id, and by tool name (each in recording order).
        self._order: deque[_Output] = deque()
        self._calls: dict[str, _Output] = {}
        self._by_tool: dict[str, deque[_Output]] = {}
        # call id -> tool name of the outputs dropped this turn to stay under the cap, so a
        # read says "dropped" rather than "never recorded".
        self._dropped: dict[str, str] = {}
        self._turn_bytes = 0
        for name, value in (vars or {}).items():
            size = _var_size(value, f"var:{_format((Key(name),), dotted=False)}")
            self._vars[name] = value
            self._var_sizes[name] = size
            self._vars_bytes += size
        if self._vars_bytes > max_bytes:
            largest = max(self._var_sizes, key=self._var_sizes.__getitem__)
            path = f"var:{_format((Key(largest),), dotted=False)}"
            raise ContextFullError(
                f'"{path}": the variables take {self._vars_bytes:,} bytes, over the context'
                f' store\'s cap of max_bytes={max_bytes:,}; the largest is "{largest}"'
                f" ({self._var_sizes[largest]:,} bytes). Keep less in variables or raise"
                " max_bytes",
                path=path,
                segment=largest,
            )

    @property
    def vars(self) -> dict[str, Any]:
        """The session-scoped variables (a shallow copy), to persist with the session."""
        return dict(self._vars)

    @property
    def nbytes(self) -> int:
        """Approximate bytes held: the JSON length of every variable and output of the turn."""
        return self._vars_bytes + self._turn_bytes

    def get(self, path: str, default: Any = MISSING) -> Any:
        """Read the value at `path`.

        Args:
            path: e.g. `var:cart.total`, `tool:orders.lookup.items[0].sku`,
                `tool:search[][-1]`, `call:call_1.id`, `sys:user_id`.
            default: returned when the path is well-formed but does not resolve (no such
                variable, no output of that tool this turn, index out of range, …). Without
                it, such a path raises.

        Returns:
            The value reached: the stored object itself, not a copy (`tool:<name>[]` builds a
            new list of the stored outputs).

        Raises:
            PathError: the path does not parse or names an unknown namespace (whatever the
                default), or it does not resolve and no default was given.
        """
        ref = _parse_ref(path)
        try:
            return self._resolve(ref)
        except _Miss as miss:
            if default is not MISSING:
                return default
            raise miss.error(path) from None

    def _resolve(self, ref: _Ref) -> Any:
        namespace = ref.namespace
        if namespace == "tool":
            split, outputs = self._find_tool(ref)
            value = [o.output for o in outputs] if split.every else outputs[-1].output
            segments, start, prefix = split.segments, 0, split.prefix
        elif namespace == "var":
            value = self._vars.get(ref.head, MISSING)
            if value is MISSING:
                raise _Miss(
                    f'no variable "{ref.head}" is set; variables set: {_names(self._vars)}',
                    segment=ref.head,
                )
            segments, start, prefix = ref.segments, 1, ref.prefix
        elif namespace == "call":
            output = self._calls.get(ref.head)
            if output is None:
                raise _Miss(self._no_call(ref.head), segment=ref.head)
            segments, start, prefix, value = ref.segments, 0, ref.prefix, output.output
        else:
            value = self._sys.get(ref.head, MISSING)
            if value is MISSING:
                raise _Miss(
                    f'no sys key "{ref.head}"; sys keys: {_names(self._sys)}', segment=ref.head
                )
            segments, start, prefix = ref.segments, 1, ref.prefix
        try:
            return _walk(value, segments, start)
        except _Miss as miss:
            raise miss.locate(segments, prefix, dotted=namespace in ("tool", "call")) from None

    def _find_tool(self, ref: _Ref) -> tuple[_ToolSplit, deque[_Output]]:
        for split in ref.splits:
            outputs = self._by_tool.get(split.name)
            if outputs is not None:
                return split, outputs
        names = [split.name for split in ref.splits]
        dropped = set(self._dropped.values())
        tried = f'"{names[0]}"'
        if len(names) > 1:
            tried += " (nor " + ", ".join(f'"{name}"' for name in names[1:]) + ")"
        reason = (
            f"no output of tool {tried} was recorded this turn; tools recorded this turn:"
            f" {_names(self._by_tool)}"
        )
        for name in names:
            if name in dropped:
                reason = (
                    f'the outputs of tool "{name}" recorded this turn were dropped to keep the'
                    f" context store under max_bytes={self._max_bytes:,}"
                )
                break
        raise _Miss(reason, segment=names[0])

    def _no_call(self, call_id: str) -> str:
        if call_id in self._dropped:
            return (
                f'the output of tool call "{call_id}" (tool "{self._dropped[call_id]}") was'
                f" dropped to keep the context store under max_bytes={self._max_bytes:,}"
            )
        return (
            f'no output of tool call "{call_id}" was recorded this turn; calls recorded this'
            f" turn: {_names(self._calls)}"
        )

    def update_sys(self, values: Mapping[str, Any]) -> None:
        """Set read-only `sys:` values; the engine calls this at the start of each turn.

        Paths and tools can read these values but never write them: scope (`org_id`,
        `user_id`) comes from the session, never from the model.
        """
        self._sys.update(values)

    def set(self, path: str, value: Any) -> None:
        """Write a session-scoped variable, or a part of one.

        `set("var:cart", {...})` replaces the variable; `set("var:cart.total", 3)` writes into
        the dicts and lists along the path, creating dicts for missing keys (a missing variable
        starts as `{}`). The containers along the path are copied, not mutated, so an earlier
        `get` result does not change under its holder, and a refused write leaves the store
        unchanged.

        Args:
            path: a `var:` path; it may not contain `[*]`.
            value: the value; it must serialise to JSON (it is persisted with the session).

        Raises:
            PathError: the path does not parse, is not a `var:` path, does not lead to a dict
                or list, or the value does not serialise to JSON.
            ContextFullError: the variables would exceed `max_bytes`; the message names the
                variable, its size and the cap. The store is unchanged.
        """
        ref = _parse_ref(path)
        if ref.namespace == "sys":
            raise PathError(
                f'"{path}": sys is read-only: its values are set when the ContextStore is built'
                " (sys=...)",
                path=path,
            )
        if ref.namespace != "var":
            raise PathError(
                f'"{path}": {ref.namespace}: paths are read-only: the dispatcher records tool'
                " outputs with record(); only var: paths can be set",
                path=path,
            )
        name = ref.head
        if len(ref.segments) > 1:
            root = self._vars.get(name, {})
            try:
                value = _assign(root, ref.segments, 1, value)
            except _Miss as miss:
                raise miss.locate(ref.segments, "var:", dotted=False).error(path) from None
        size = _var_size(value, path)
        total = self._vars_bytes - self._var_sizes.get(name, 0) + size
        if total > self._max_bytes:
            raise ContextFullError(
                f'"{path}": variable "{name}" would take {size:,} bytes, bringing the'
                f" variables to {total:,} bytes, over the context store's cap of"
                f" max_bytes={self._max_bytes:,}. Keep less in variables or raise max_bytes",
                path=path,
                segment=name,
            )
        self._vars[name] = value
        self._var_sizes[name] = size
        self._vars_bytes = total
        if total + self._turn_bytes > self._max_bytes:
            self._evict()

    def record(self, tool_name: str, call_id: str, output: Any) -> None:
        """Capture a tool call's output: it becomes `tool:<name>`, `tool:<name>[]`, `call:<id>`.

        Called by the dispatcher after each tool call. Recording a call id again replaces its
        output (and makes it the newest). If the store goes over `max_bytes`, the oldest
        outputs of the turn are dropped until it fits, possibly this one.

        Args:
            tool_name: the tool's name, e.g. `orders.lookup`.
            call_id: the tool call id, e.g. `call_1`.
            output: the output; a value that JSON cannot represent is sized (and dumped) as its
                `str()`.

        Raises:
            PathError: the output cannot be serialised (e.g. a model's serializer raises).
        """
        try:
            size = len(to_json(output, serialize_unknown=True))
        except ValueError as error:
            path = f"call:{call_id}"
            raise PathError(
                f'"{path}": the output of tool "{tool_name}" cannot be stored: {error}', path=path
            ) from None
        entry = _Output(tool_name, call_id, output, size)
        previous = self._calls.get(call_id)
        if previous is not None:
            self._forget(previous)
        self._calls[call_id] = entry
        self._order.append(entry)
        outputs = self._by_tool.get(tool_name)
        if outputs is None:
            self._by_tool[tool_name] = deque((entry,))
        else:
            outputs.append(entry)
        self._turn_bytes += size
        if self._dropped:
            self._dropped.pop(call_id, None)
        if self._vars_bytes + self._turn_bytes > self._max_bytes:
            self._evict()

    def _forget(self, entry: _Output, *, oldest: bool = False) -> None:
        del self._calls[entry.call_id]
        outputs = self._by_tool[entry.tool]
        if oldest:  # the oldest output of the turn is also the first of its tool's
            self._order.popleft()
            outputs.popleft()
        else:
            self._order.remove(entry)
            outputs.remove(entry)
        if not outputs:
            del self._by_tool[entry.tool]
        self._turn_bytes -= entry.size

    def _evict(self) -> None:
        order = self._order
        while order and self._vars_bytes + self._turn_bytes > self._max_bytes:
            oldest = order[0]
            self._forget(oldest, oldest=True)
            self._dropped[oldest.call_id] = oldest.tool

    def new_turn(self) -> None:
        """Start a turn: forget the turn-scoped outputs (`tool:`, `call:`); keep the variables."""
        self._order.clear()
        self._calls.clear()
        self._by_tool.clear()
        self._dropped.clear()
        self._turn_bytes = 0

    def dump(self) -> dict[str, Any]:
        """The state as JSON-able data: the variables and this turn's outputs.

        A suspended turn reloaded with `load` resumes with its captured outputs. Values go
        through pydantic's JSON mode: models and dataclasses become dicts, so a reloaded store
        holds plain JSON values (paths into them read the same).
        """
        return {
            "schema_version": _SCHEMA_VERSION,
            "vars": to_jsonable_python(self._vars),
            "turn": [
                {
                    "tool": entry.tool,
                    "call_id": entry.call_id,
                    "output": to_jsonable_python(entry.output, serialize_unknown=True),
                }
                for entry in self._order
            ],
            "dropped": dict(self._dropped),
        }

    @classmethod
    def load(
        cls,
        data: Mapping[str, Any],
        *,
        sys: Mapping[str, Any] | None = None,
        max_bytes: int = 1_000_000,
    ) -> ContextStore:
        """Rebuild a store from `dump()` output.

        Args:
            data: what `dump` returned (after a JSON round trip, if any).
            sys: the read-only values, as for the constructor (they are not dumped: they come
                from the session and the clock of the resuming run).
            max_bytes: the cap, as for the constructor.

        Raises:
            UserError: `data` is not a dump, or was written by a newer handrail.
            ContextFullError: the variables exceed `max_bytes`.
        """
        version = data.get("schema_version") if isinstance(data, Mapping) else None
        if version != _SCHEMA_VERSION:
            newer = isinstance(version, int) and version > _SCHEMA_VERSION
            raise UserError(
                f"cannot load a context store dump with schema_version={version!r}: this"
                f" handrail reads version {_SCHEMA_VERSION}"
                + ("; upgrade handrail to read it" if newer else "")
            )
        try:
            state = _DUMP.validate_python(data)
        except ValidationError as error:
            raise UserError(f"not a context store dump: {error}") from None
        store = cls(vars=state["vars"], sys=sys, max_bytes=max_bytes)
        for entry in state["turn"]:
            store.record(entry["tool"], entry["call_id"], entry["output"])
        store._dropped.update(state["dropped"])
        return store
