"""`ContextStore`: session variables, this turn's tool outputs and read-only sys values."""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import TypeAdapter, ValidationError
from pydantic_core import to_json, to_jsonable_python
from typing_extensions import TypedDict

from ..exceptions import ConfigError, ContextFullError, PathError, UserError
from ._paths import Key, _assign, _format, _Miss, _names, _parse_ref, _Ref, _ToolSplit, _walk

__all__ = ["MISSING", "ContextStore"]

_SCHEMA_VERSION: Final = 1
"""Version of `ContextStore.dump`. 1: vars, turn (outputs in recording order), dropped."""


class _Missing(enum.Enum):
    MISSING = "MISSING"

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing.MISSING
"""Default of `ContextStore.get`'s `default`: a path that does not resolve raises."""


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
