"""What a run's failure tells the people it runs for, and what only the operator's log keeps.

Every failure is logged once, with its traceback, where it is caught (`log_failure`): a
tool that raised (the model reads its class, message and reference), a turn that failed, a
request the server failed on. The log record carries the reference it was given, which the
model, the user or the HTTP client is shown too, and the ids it concerns (`session_id`,
`call_id`, `tool`, `run_id`, `request_id`) as fields, which `--log-format json` writes out.

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
import sys
from typing import Any

from ._logs import escaped_traceback
from ._random import token_hex

__all__ = ["log_failure", "new_reference", "public_event", "scrub"]

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


def new_reference() -> str:
    """A short reference for one failure: what a person quotes to find it in the log."""
    return token_hex(6)


def log_failure(
    log: logging.Logger,
    what: str,
    error: BaseException,
    *,
    reference: str,
    **fields: Any,
) -> None:
    """Log `error` at ERROR, once, with its traceback, its `reference` and `fields`.

    The message names the reference and the session and call it concerns (a text log line
    shows them); the record carries them as fields (`reference`, `session_id`, `call_id`,
    ...), for `--log-format json`. What the error says is scrubbed of secrets, in the message
    and in the traceback, whose messages are escaped too (no forged lines).

    Args:
        log: the logger.
        what: what failed ("Tool 'orders.lookup' raised").
        error: the exception.
        reference: the reference the user is shown.
        fields: the ids it concerns: `session_id`, `call_id`, `tool`, `run_id`, ...; None
            values are left out.
    """
    if not log.isEnabledFor(logging.ERROR):
        return
    extra = {k: v for k, v in fields.items() if v is not None}
    where = f", session {extra['session_id']!r}" if "session_id" in extra else ""
    where += f", call {extra['call_id']}" if "call_id" in extra else ""
    message = f"{what} (reference {reference}{where}): {type(error).__name__}: {error}"
    frame = sys._getframe(1)
    record = log.makeRecord(
        log.name,
        logging.ERROR,
        frame.f_code.co_filename,
        frame.f_lineno,
        scrub(message),
        (),
        (type(error), error, error.__traceback__),
        frame.f_code.co_name,
        {"reference": reference, **extra},
    )
    record.exc_text = scrub("".join(escaped_traceback(error)).rstrip("\n"))
    log.handle(record)


def public_event(session_id: str, event: dict[str, Any]) -> dict[str, Any]:
    """`event` as a session's event log may hold it: a failure's detail replaced by a reference.

    Only `run-failed` with `reason="error"` changes. One that names its `reference` was
    logged where it failed (with its traceback): only its text changes. One that does not
    (an older engine's) has its detail logged (scrubbed) under a new reference. Every other
    event is returned as it is.
    """
    if event.get("type") != "run-failed" or event.get("reason") != "error":
        return event
    detail = str(event.get("error") or "")
    match = _CLASS.match(detail)
    kind = match.group(1) if match else "Error"
    reference = event.get("reference")
    if not isinstance(reference, str) or not reference:
        reference = new_reference()
        _log.error(
            "session %r: the turn failed (reference %s): %s",
            session_id,
            reference,
            scrub(detail),
            extra={"reference": reference, "session_id": session_id},
        )
        event = {**event, "reference": reference}
    public = (
        f"{kind}: the turn failed (reference {reference}; the details are in the server's log)."
    )
    return {**event, "error": public}
