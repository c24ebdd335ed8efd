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

from ._paths import Index, Key, Segment, Wildcard, check_path, format_path, parse_path, walk
from ._store import MISSING, ContextStore

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
