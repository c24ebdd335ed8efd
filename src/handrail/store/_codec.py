"""JSON in and out of the stores, argument checks, and the export document.

Every store keeps documents as JSON text made here, so the three stores accept and refuse the
same values and give back equal ones.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

from ..audit import AUDIT_KINDS, GENESIS, AuditEntry, AuditKey, chain
from ..exceptions import SessionCorruptError, StoreError, UnsettledSaveError
from ._base import SESSION_STATUSES, SessionRecord, SessionSummary, ToolLogEntry

EXPORT_SCHEMA_VERSION = 3
"""The version of the `export` document. One line a bump:

1: `{"schema_version", "kind", "session": {metadata..., "data"}, "tool_log": [entries...]}`.
2: adds `"events": [{"seq", "event"}...]`, the event log (a version 1 document has none).
3: adds `"messages": [...]`, the whole history in order, and the session's `"window"` (in
   versions 1 and 2 the messages are inside `data`, a session state of schema 1).
"""

INCARNATION = 12
"""How many characters an engine's lease owner adds to its worker id: `#` and 11 hex digits,
its incarnation (`SessionStore.adopt_leases` matches the worker id and exactly this many)."""


def incarnation_of(holder: str, previous: str) -> bool:
    """Whether lease owner `holder` is an incarnation of the worker named `previous`."""
    return len(holder) == len(previous) + INCARNATION and holder.startswith(previous + "#")


LoggedEvents = list[tuple[int, dict[str, Any]]]
"""A page of a session's event log: `(number, event)` pairs in order."""
EXPORT_KIND = "handrail.session"

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_ascii_encoder = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))
_decoder = json.JSONDecoder()


def encode(session_id: str, value: dict[str, Any], *, what: str = "data") -> str:
    """`value` as compact JSON text; a `StoreError` naming the session if it is not JSON."""
    if not isinstance(value, dict):
        raise StoreError(
            f"Session {session_id!r}: {what} must be a dict, not {type(value).__name__}.",
            session_id=session_id,
        )
    try:
        text = _encoder.encode(value)
        # A lone surrogate cannot be stored as UTF-8; the ASCII form escapes it losslessly.
        text.encode()
    except UnicodeEncodeError:
        text = _ascii_encoder.encode(value)
    except (TypeError, ValueError) as error:
        raise StoreError(
            f"Session {session_id!r}: {what} is not JSON-compatible ({error}). Store only dicts "
            f"with string keys, lists, strings, finite numbers, booleans and None.",
            session_id=session_id,
        ) from error
    return text


def decode(session_id: str, text: str | bytes, *, what: str = "data") -> dict[str, Any]:
    """Stored JSON text back as a dict; a `StoreError` naming the session if it is corrupt."""
    try:
        if isinstance(text, bytes):
            text = text.decode()
        value = _decoder.decode(text)
    except (ValueError, TypeError) as error:  # JSONDecodeError and UnicodeDecodeError
        raise SessionCorruptError(
            f"Session {session_id!r}: the stored {what} is not valid JSON ({error}). The row is "
            f"corrupt and was left as it is: restore it from a backup or an export, or delete "
            f"the session.",
            session_id=session_id,
        ) from error
    if not isinstance(value, dict):
        raise SessionCorruptError(
            f"Session {session_id!r}: the stored {what} is a JSON {type(value).__name__}, not an "
            f"object. The row is corrupt and was left as it is: restore it from a backup or an "
            f"export, or delete the session.",
            session_id=session_id,
        )
    return value


UNREADABLE_EVENT = "event-unreadable"
"""The type of what `SessionStore.events` gives in place of a logged event it cannot read."""

_log = logging.getLogger("handrail.store")


def decode_event(session_id: str, seq: int, text: str | bytes) -> dict[str, Any]:
    """A logged event back as a dict; an `event-unreadable` event if its row is corrupt.

    One bad row must not stop every reader at the same place forever (a client reconnecting
    with `Last-Event-ID` would fail there again and again): the row is left as it is, logged
    as an error, and its number is passed with an event that says what happened.
    """
    try:
        return decode(session_id, text, what=f"event {seq}")
    except SessionCorruptError as error:
        _log.error("%s", error)
        return {"type": UNREADABLE_EVENT, "seq": seq, "error": str(error)}


def check_record(record: SessionRecord) -> None:
    """Refuse a record no store could keep, before touching the store."""
    if not isinstance(record.id, str) or not record.id:
        raise ValueError(f"a session id must be a non-empty string, not {record.id!r}")
    if record.status not in SESSION_STATUSES:
        raise ValueError(
            f"Session {record.id!r}: status must be one of {sorted(SESSION_STATUSES)}, "
            f"not {record.status!r}"
        )
    if isinstance(record.version, bool) or not isinstance(record.version, int):
        raise ValueError(f"Session {record.id!r}: version must be an int, not {record.version!r}")
    if record.version < 0:
        raise ValueError(f"Session {record.id!r}: version must be 0 or more")
    if record.expires_at is not None and not math.isfinite(record.expires_at):
        raise ValueError(f"Session {record.id!r}: expires_at must be a finite number or None")
    check_messages(record)


def check_save(record: SessionRecord) -> None:
    """Refuse, before touching the store, a record that no store keeps: every save's checks.

    Besides `check_record`'s: a session saved `completed` or `failed` while one of its cards
    is undecided would strand that call (a finished session is never driven again), so the
    save is refused with an `UnsettledSaveError` naming the session and the calls.

    The cards are looked for where a save writes them: the messages it writes (an engine
    writes every message that holds a waiting card, `RunState.changed_from`) and the scratch
    in its document.
    """
    check_record(record)
    if record.status in ("completed", "failed"):
        pending = _undecided(record)
        if pending:
            raise UnsettledSaveError(record.id, status=record.status, pending=tuple(pending))


def _undecided(record: SessionRecord) -> list[str]:
    """The tool call ids of the undecided cards among what `record` writes (as `RunState`)."""
    messages: list[Any] = list(record.messages)
    data = record.data
    if isinstance(data, dict):
        if isinstance(data.get("messages"), list):  # a state that keeps them inline
            messages += data["messages"]
        scratch = data.get("scratch")
        if isinstance(scratch, dict):
            messages += [m for kept in scratch.values() if isinstance(kept, list) for m in kept]
    pending: dict[str, None] = {}
    for message in messages:
        parts = message.get("parts") if isinstance(message, dict) else None
        for part in parts if isinstance(parts, list) else ():
            if isinstance(part, dict) and part.get("type") == "approval":
                call = str(part.get("tool_call_id"))
                if part.get("decision") is None:
                    pending[call] = None
                else:
                    pending.pop(call, None)
    return list(pending)


def check_messages(record: SessionRecord, stored: int | None = None) -> None:
    """Refuse messages no store could keep in place: a gap after the stored ones, a bad window.

    Args:
        record: the record to save.
        stored: how many messages the store holds for the session (None: not known yet).
    """
    start, window = record.messages_from, record.window
    for name, value in (("messages_from", start), ("window", window)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"Session {record.id!r}: {name} must be an int, 0 or more")
    if not isinstance(record.messages, list):
        raise ValueError(f"Session {record.id!r}: messages must be a list of dicts")
    if stored is not None and start > stored:
        raise ValueError(
            f"Session {record.id!r}: messages_from={start} would leave a gap after the "
            f"{stored} stored message(s); save from position {stored} or earlier."
        )
    if window > start + len(record.messages):
        raise ValueError(
            f"Session {record.id!r}: window={window} is past the last message saved "
            f"({start + len(record.messages)})."
        )


def check_messages_page(before: int | None, limit: int) -> None:
    """Refuse a negative position or page size."""
    if (before is not None and before < 0) or limit < 0:
        raise ValueError(f"before and limit must be 0 or more, not {before} and {limit}")


def encode_messages(session_id: str, messages: list[dict[str, Any]]) -> list[str]:
    """Each message as JSON text; a `StoreError` before anything is stored if one is not JSON."""
    return [encode(session_id, message, what="message") for message in messages]


def decode_message(session_id: str, position: int, text: str | bytes) -> dict[str, Any]:
    """A stored message back as a dict; a `StoreError` naming the session if it is corrupt."""
    return decode(session_id, text, what=f"message {position}")


def check_page(limit: int, offset: int) -> None:
    """Refuse a negative page."""
    if limit < 0 or offset < 0:
        raise ValueError(f"limit and offset must be 0 or more, not {limit} and {offset}")


def check_status(status: str | None) -> None:
    """Refuse a status filter that no session can have (a typo would silently match nothing)."""
    if status is not None and status not in SESSION_STATUSES:
        raise ValueError(f"status must be one of {sorted(SESSION_STATUSES)}, not {status!r}")


def check_events_page(after: int, limit: int) -> None:
    """Refuse a negative event number or page size."""
    if after < 0 or limit < 0:
        raise ValueError(f"after and limit must be 0 or more, not {after} and {limit}")


def encode_events(session_id: str, events: list[dict[str, Any]]) -> list[str]:
    """Each event as JSON text; a `StoreError` before anything is stored if one is not JSON."""
    return [encode(session_id, event, what="event") for event in events]


def check_ttl(ttl: float) -> None:
    """Refuse a lease that would be expired the moment it is taken."""
    if not ttl > 0 or not math.isfinite(ttl):
        raise ValueError(f"a lease ttl must be a positive number of seconds, not {ttl!r}")


def check_calls(calls: Collection[str] | None) -> list[str] | None:
    """`tool_log`'s `calls`: its ids, each once, in a list (None: the whole log).

    A lone string is refused: it is a collection of its characters, and would read no call.
    """
    if calls is None:
        return None
    if isinstance(calls, str):
        raise TypeError(
            f"calls must be a collection of tool-call ids, not the string {calls!r}: "
            f"pass calls=[{calls!r}] for that one call"
        )
    return list(dict.fromkeys(calls))


def exists_error(session_id: str, version: int) -> StoreError:
    """`import_` of a session that exists, without `overwrite=True`."""
    return StoreError(
        f"Cannot import session {session_id!r}: it already exists (version {version}). Pass "
        f"overwrite=True to replace it and its tool-call log.",
        session_id=session_id,
    )


def not_started_error(session_id: str, tool_call_id: str) -> StoreError:
    """`log_finished` for a call the log does not have."""
    return StoreError(
        f"Session {session_id!r}: no tool call {tool_call_id!r} in the log. Record "
        f"log_started before the call runs, then log_finished.",
        session_id=session_id,
    )


def export_document(
    record: SessionRecord,
    log: list[ToolLogEntry],
    events: LoggedEvents,
    messages: list[dict[str, Any]],
) -> str:
    """The `export` document of a session, its whole history, its tool-call and event logs."""
    session: dict[str, Any] = {
        "id": record.id,
        "org_id": record.org_id,
        "user_id": record.user_id,
        "status": record.status,
        "version": record.version,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "expires_at": record.expires_at,
        "window": record.window,
        "data": record.data,
    }
    entries = [
        {
            "tool_call_id": e.tool_call_id,
            "key": e.key,
            "tool": e.tool,
            "args": e.args,
            "status": e.status,
            "result": e.result,
            "started_at": e.started_at,
            "finished_at": e.finished_at,
        }
        for e in log
    ]
    document = {
        "schema_version": EXPORT_SCHEMA_VERSION,
        "kind": EXPORT_KIND,
        "session": session,
        "messages": messages,
        "tool_log": entries,
        "events": [{"seq": seq, "event": event} for seq, event in events],
    }
    return encode(record.id, document, what="export")


def parse_export(document: str) -> tuple[SessionRecord, list[ToolLogEntry], LoggedEvents]:
    """The session and logs in an `export` document, or a `StoreError` saying what is wrong."""
    try:
        parsed = json.loads(document)
    except ValueError as error:
        raise StoreError(f"Not a handrail session export: invalid JSON ({error}).") from error
    if not isinstance(parsed, dict) or parsed.get("kind") != EXPORT_KIND:
        raise StoreError(
            f"Not a handrail session export: expected a JSON object with "
            f'"kind": "{EXPORT_KIND}" (made by SessionStore.export).'
        )
    version = parsed.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise StoreError(f"Session export has an unknown schema_version {version!r}.")
    if version > EXPORT_SCHEMA_VERSION:
        raise StoreError(
            f"Session export has schema_version {version}, newer than this handrail reads "
            f"(up to {EXPORT_SCHEMA_VERSION}): upgrade handrail to import it."
        )
    try:
        record, log = _session(parsed["session"]), [_entry(e) for e in parsed["tool_log"]]
        if version >= 3:
            record.messages = [_message(m) for m in parsed["messages"]]
            record.window = _typed(parsed["session"], "window", int)
            check_messages(record, 0)
        if len({e.tool_call_id for e in log}) != len(log):
            raise ValueError("a tool_call_id appears twice in tool_log")
        events = [_event(e) for e in parsed["events"]] if version >= 2 else []
        if any(a[0] >= b[0] for a, b in itertools.pairwise(events)):
            raise ValueError("the events' seq numbers do not increase")
        return record, log, events
    except (KeyError, TypeError, ValueError) as error:
        session = parsed.get("session")
        name = session.get("id") if isinstance(session, dict) else None
        raise StoreError(
            f"Session export{f' of {name!r}' if name else ''} is malformed: {error!r}.",
            session_id=name if isinstance(name, str) else None,
        ) from error


def _session(fields: dict[str, Any]) -> SessionRecord:
    record = SessionRecord(
        id=_typed(fields, "id", str),
        org_id=_typed(fields, "org_id", str, optional=True),
        user_id=_typed(fields, "user_id", str, optional=True),
        status=fields["status"],
        version=_typed(fields, "version", int),
        created_at=float(_typed(fields, "created_at", (int, float))),
        updated_at=float(_typed(fields, "updated_at", (int, float))),
        expires_at=_float_or_none(_typed(fields, "expires_at", (int, float), optional=True)),
        data=_typed(fields, "data", dict),
    )
    check_record(record)
    if record.version < 1:
        raise ValueError("an exported session has a version of 1 or more")
    return record


def _entry(fields: dict[str, Any]) -> ToolLogEntry:
    status = fields["status"]
    if status not in ("started", "finished"):
        raise ValueError(f"tool log status {status!r}")
    return ToolLogEntry(
        tool_call_id=_typed(fields, "tool_call_id", str),
        key=_typed(fields, "key", str),
        tool=_typed(fields, "tool", str),
        args=_typed(fields, "args", dict),
        status=status,
        result=_typed(fields, "result", dict, optional=True),
        started_at=float(_typed(fields, "started_at", (int, float))),
        finished_at=_float_or_none(_typed(fields, "finished_at", (int, float), optional=True)),
    )


def _message(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"a message is {value!r}")
    return value


def _event(fields: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    seq = _typed(fields, "seq", int)
    if seq < 1:
        raise ValueError(f"event seq {seq} (they start at 1)")
    return seq, _typed(fields, "event", dict)


def _typed(fields: dict[str, Any], name: str, kind: Any, *, optional: bool = False) -> Any:
    value = fields[name]
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} is {value!r}")
    return value


def _float_or_none(value: float | None) -> float | None:
    return None if value is None else float(value)


def stamped(
    record: SessionRecord, *, version: int, created_at: float, updated_at: float
) -> SessionRecord:
    """A shallow copy of `record` as saved (the caller's record is left as it was).

    Without the audit entries the save appended: saving the copy again appends nothing
    (nor does it say it appended events: `last_event` is the store's to set).
    """
    return replace(
        record,
        version=version,
        created_at=created_at,
        updated_at=updated_at,
        audit=[],
        last_event=0,
    )


_SUMMARY_COLUMNS = (
    "id",
    "org_id",
    "user_id",
    "status",
    "version",
    "created_at",
    "updated_at",
    "expires_at",
)
"""The columns both SQL stores select for a summary, in their order."""


def summary_from_row(row: Sequence[Any]) -> SessionSummary:
    """A summary from a row of the `_SUMMARY_COLUMNS`."""
    return SessionSummary(**dict(zip(_SUMMARY_COLUMNS, row, strict=False)))


def record_from_row(row: Sequence[Any]) -> SessionRecord:
    """A record from the summary's columns, the document's JSON text and the window."""
    fields = dict(zip(_SUMMARY_COLUMNS, row, strict=False))
    return SessionRecord(**fields, data=decode(row[0], row[8]), window=row[9], messages_from=row[9])


def log_entry_from_row(session_id: str, row: Sequence[Any]) -> ToolLogEntry:
    """A log entry from a row of the tool-log columns both SQL stores select, in their order.

    The columns: `tool_call_id, key, tool, args, status, result, started_at, finished_at`,
    with `args` and `result` as JSON text.
    """
    return ToolLogEntry(
        tool_call_id=row[0],
        key=row[1],
        tool=row[2],
        args=decode(session_id, row[3], what="tool-call arguments"),
        status=row[4],
        result=None if row[5] is None else decode(session_id, row[5], what="tool-call result"),
        started_at=row[6],
        finished_at=row[7],
    )


def chain_audit(
    entry: AuditEntry, tail: tuple[int, str] | None, key: AuditKey | None = None
) -> tuple[AuditEntry, str]:
    """`entry` chained after the trail's `tail` (its last seq and hash), and its JSON text.

    Args:
        entry: the entry to append (numbered and hashed in place).
        tail: the seq and hash of the trail's last entry; None: the trail is empty.
        key: the store's audit key, the entry's hash an HMAC under it; None: unkeyed.

    Raises:
        StoreError: the entry holds a value JSON cannot carry.
    """
    seq, prev = tail if tail is not None else (0, GENESIS)
    try:
        chain(entry, seq=seq + 1, prev_hash=prev, key=key)
        text = json.dumps(entry.to_json(), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(
            f"Cannot append to the audit trail of organisation {entry.org_id!r}: {exc} "
            f"(an entry holds JSON-compatible values only)."
        ) from None
    return entry, text


def decode_audit(org_id: str | None, seq: int, text: str | bytes) -> AuditEntry:
    """A stored audit entry; a `StoreError` naming it if it is not one."""
    try:
        return AuditEntry.from_json(json.loads(text))
    except (TypeError, ValueError) as exc:
        raise StoreError(
            f"Audit entry {seq} of organisation {org_id!r} cannot be read: {exc}. The trail "
            f"was edited outside handrail: run `handrail audit verify`."
        ) from None


def check_audit_page(after: int, limit: int, kind: str | None, before: int | None = None) -> None:
    """Refuse a negative entry number or page size, or an unknown kind."""
    if after < 0 or limit < 0:
        raise ValueError(f"after and limit must be 0 or more, not {after} and {limit}")
    if before is not None and before < 0:
        raise ValueError(f"before must be 0 or more (or None), not {before}")
    if kind is not None and kind not in AUDIT_KINDS:
        raise ValueError(f"kind must be one of {sorted(AUDIT_KINDS)}, not {kind!r}")
