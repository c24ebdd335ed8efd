"""What a run's failure tells the people it runs for, and what only the operator's log keeps.

A turn that fails with an error (a provider's API refused it, a store failed) ends with
`run-failed`, whose `error` names what went wrong in detail: the provider's own message,
which may echo a request header (a key), name internal hosts, or quote the system prompt.
That detail is for the operator. Every `run-failed` written to a session's event log (what
clients stream, what exports hold) carries instead the error's class and a reference id, and
the detail goes to the `handrail.runs` log under that reference, with secrets scrubbed.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from ._random import token_hex

__all__ = ["public_event", "scrub"]

_log = logging.getLogger("handrail.runs")

_KEYWORDS = r"bearer|basic|authorization|x-api-key|api[-_]?key|token|password|secret"
_NOT_A_KEYWORD = rf"(?!(?:{_KEYWORDS})\b)"
"""A credential's value never starts with another credential's label (`Bearer Bearer k`)."""
_SECRETS = [
    (
        re.compile(rf"(?i)\b(bearer|basic)\s+{_NOT_A_KEYWORD}[A-Za-z0-9._~+/=-]{{6,}}"),
        r"\1 ***",
    ),
    (
        re.compile(
            rf"(?i)\b(authorization|x-api-key|api[-_]?key|token|password|secret)(\W{{1,3}})"
            rf"{_NOT_A_KEYWORD}\S+"
        ),
        r"\1\2***",
    ),
    (re.compile(r"\b(sk|pk|rk)-[A-Za-z0-9_-]{8,}"), r"\1-***"),
]
_CLASS = re.compile(r"^([A-Z][A-Za-z0-9_]*)(?::|$)")


def scrub(text: str) -> str:
    """`text` with what looks like a credential replaced by `***` (keys, tokens, headers)."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def public_event(session_id: str, event: dict[str, Any]) -> dict[str, Any]:
    """`event` as a session's event log may hold it: a failure's detail replaced by a reference.

    Only `run-failed` with `reason="error"` changes; its detail is logged (scrubbed) under a
    new reference id, which the event names. Every other event is returned as it is.
    """
    if event.get("type") != "run-failed" or event.get("reason") != "error":
        return event
    detail = str(event.get("error") or "")
    match = _CLASS.match(detail)
    kind = match.group(1) if match else "Error"
    reference = token_hex(6)
    _log.error(
        "session %r: the turn failed (reference %s): %s", session_id, reference, scrub(detail)
    )
    public = (
        f"{kind}: the turn failed (reference {reference}; the details are in the server's log)."
    )
    return {**event, "error": public}
