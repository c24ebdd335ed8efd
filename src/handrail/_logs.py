"""How handrail's processes write their logs: `configure_logging`, the one setup of them all.

Two formats. `text` (the default) is the lines uvicorn writes, with control characters
escaped so that nothing a client or a provider sent can forge a line (`ControlEscaper`).
`json` is for log shippers: one JSON object a line on stderr, for every logger (handrail's,
uvicorn's, the application's), with `time`, `level`, `logger`, `message`, the fields a
record carries (`reference`, `session_id`, `call_id`, `tool`, `run_id`, `request_id`, ...)
and, for a failure, `error_type` and `traceback`.

A failure handrail logs (a tool that raised, a turn that failed, a request the server failed
on) is logged once, with its traceback and a short `reference` that the model, the user or
the HTTP client is shown too (`handrail._redact.log_failure`).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import traceback
from datetime import UTC, datetime
from typing import Any, Literal, TypeAlias

__all__ = [
    "LOG_FORMATS",
    "ControlEscaper",
    "JsonFormatter",
    "LogFormat",
    "configure_logging",
    "escape",
    "escaped_traceback",
]

LogFormat: TypeAlias = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_UVICORN = ("uvicorn", "uvicorn.error", "uvicorn.access")
_STANDARD = frozenset(
    [*logging.LogRecord("", 0, "", 0, "", (), None).__dict__, "message", "asctime"]
)
"""The attributes every record has: what is not one of them is a field the code gave."""
_LEFT_OUT = frozenset({"color_message"})
"""Fields not written: uvicorn's message again, with terminal colours."""


def escape(text: str) -> str:
    r"""`text` with its control characters escaped (`\n` as `\x0a`)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def escaped_traceback(error: BaseException) -> list[str]:
    """`error`'s traceback, as `logging` writes it, with its messages escaped.

    The frames' lines are the server's own code and keep their lines; what an exception says
    (which may quote a client or a provider) is escaped, in every chained exception too.
    """
    lines: list[str] = []
    cause, context = error.__cause__, error.__context__
    if cause is not None:
        lines += [*escaped_traceback(cause), "\nThe above exception was the direct cause of "
                  "the following exception:\n\n"]  # fmt: skip
    elif context is not None and not error.__suppress_context__:
        lines += [*escaped_traceback(context), "\nDuring handling of the above exception, "
                  "another exception occurred:\n\n"]  # fmt: skip
    summary = traceback.TracebackException.from_exception(error, limit=None)
    if summary.stack:
        lines += ["Traceback (most recent call last):\n", *summary.stack.format()]
    lines += [escape(line.rstrip("\n")) + "\n" for line in summary.format_exception_only()]
    return lines


class ControlEscaper(logging.Filter):
    r"""Escapes control characters in every log line (`\n` as `\x0a`): no forged lines.

    A message can carry what a client or a provider sent (an error's text, a header), and a
    newline in it would start a line that looks like the server's own. The message is
    formatted, escaped and kept with no arguments; a traceback keeps its lines, each escaped.
    uvicorn's access log is left to `AccessLogScrubber`, whose formatter needs its arguments.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Escape the record's message (and traceback); never drops a record."""
        if record.name == "uvicorn.access":
            return True
        message = record.getMessage()
        if _CONTROL.search(message):
            record.msg, record.args = escape(message), None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = "".join(escaped_traceback(record.exc_info[1])).rstrip("\n")
        return True


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object a line.

    Its fields: `time` (UTC, ISO 8601), `level`, `logger`, `message`, the record's own fields
    (`reference`, `session_id`, `call_id`, ...), and for a failure `error_type` and
    `traceback`.
    """

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        stamp = datetime.fromtimestamp(record.created, tz=UTC)
        document: dict[str, Any] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key in _STANDARD or key in _LEFT_OUT or key.startswith("_"):
                continue
            if key not in document:
                document[key] = value
        if record.exc_info and record.exc_info[1] is not None:
            document["error_type"] = type(record.exc_info[1]).__name__
            document["traceback"] = record.exc_text or self.formatException(record.exc_info)
        elif record.exc_text:
            document["traceback"] = record.exc_text
        if record.stack_info:
            document["stack"] = record.stack_info
        return json.dumps(document, ensure_ascii=False, default=str)


def configure_logging(log_format: LogFormat = "text", *, level: int | str | None = None) -> None:
    """Set up the logs of a handrail process (`handrail serve`, its workers, other commands).

    Call it after uvicorn's own configuration (`uvicorn.Config` sets up its loggers): it
    rewires them. Calling it again is harmless.

    Args:
        log_format: `text`: uvicorn's lines, with control characters escaped in every line
            (uvicorn's loggers' handlers and the root logger's get `ControlEscaper`), and,
            when nothing would show `handrail`'s own lines (no handler on their way up), a
            handler that writes them to stderr as uvicorn writes its own. `json`: one JSON
            object a line on stderr (`JsonFormatter`) for every logger: the root logger gets
            the one handler, and uvicorn's and handrail's loggers hand their records to it.
        level: the level of `handrail`'s loggers (default: INFO unless set already).

    Raises:
        ValueError: an unknown format.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: the formats are {', '.join(LOG_FORMATS)}")
    handrail = logging.getLogger("handrail")
    if level is not None:
        handrail.setLevel(level)
    if log_format == "json":
        root = logging.getLogger()
        for handler in list(root.handlers):
            if getattr(handler, "_handrail", False):
                root.removeHandler(handler)
        ours = logging.StreamHandler(sys.stderr)
        ours.setFormatter(JsonFormatter())
        ours._handrail = True  # type: ignore[attr-defined]
        root.addHandler(ours)
        if root.level > logging.INFO:
            root.setLevel(logging.INFO)
        for logger in [handrail, *map(logging.getLogger, _UVICORN)]:
            for handler in list(logger.handlers):  # uvicorn's own: one line a record, at root
                logger.removeHandler(handler)
            logger.propagate = True
        if handrail.level == logging.NOTSET:
            handrail.setLevel(logging.INFO)
        return
    escaper = ControlEscaper()
    loggers = [*map(logging.getLogger, _UVICORN), logging.getLogger()]
    if not handrail.hasHandlers():
        ours = logging.StreamHandler()
        ours.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        handrail.addHandler(ours)
        if handrail.level == logging.NOTSET:
            handrail.setLevel(logging.INFO)
        loggers.append(handrail)
    for logger in loggers:
        for handler in logger.handlers:
            if not any(isinstance(f, ControlEscaper) for f in handler.filters):
                handler.addFilter(escaper)
