"""Errors as JSON: `{"error": {"type": ..., "message": ...}}`, with the status each deserves."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .._logs import escape as _escape
from .._redact import log_failure
from ..exceptions import (
    ArgumentsChangedError,
    DecisionNotAllowedError,
    InvalidContextError,
    InvalidDecisionError,
    SessionBusyError,
    SessionCorruptError,
    SessionNotFoundError,
    StaleResolutionError,
    StoreError,
    TurnCutOffError,
    TurnRefusedError,
    TurnSuspendedError,
    UserError,
)
from ._headers import request_id, security_headers
from ._runs import TurnInProgressError

__all__ = ["EXCEPTION_HANDLERS", "ApiError", "App", "http_message"]

_log = logging.getLogger("handrail.server")


class ApiError(Exception):
    """An error the API answers with `status` and a JSON body."""

    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.headers = headers


def error_response(
    request: Request,
    status: int,
    kind: str,
    message: str,
    details: list[dict[str, object]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The JSON body every error answers: `{"error": {"type", "message", "request_id"}}`."""
    error: dict[str, object] = {
        "type": kind,
        "message": message,
        "request_id": request_id(request.scope),
    }
    if details is not None:
        error["details"] = details
    return JSONResponse({"error": error}, status_code=status, headers=headers)


# A handrail error -> (status, type). Looked up along the exception's classes, most specific
# first, as Starlette does.
_STATUS: dict[type[Exception], tuple[int, str]] = {
    SessionNotFoundError: (404, "not_found"),
    ArgumentsChangedError: (409, "arguments_changed"),
    StaleResolutionError: (409, "stale_resolution"),
    DecisionNotAllowedError: (403, "decision_not_allowed"),
    SessionBusyError: (409, "session_busy"),
    TurnInProgressError: (409, "turn_in_progress"),
    InvalidContextError: (422, "invalid_context"),
    InvalidDecisionError: (422, "invalid_decision"),
    TurnRefusedError: (403, "turn_refused"),  # the app's gate: its reason is the message
    UserError: (409, "conflict"),  # what the engine refuses in this state (e.g. suspended)
}


def http_message(exc: Exception, *, endpoints: bool = True) -> str:
    """What an HTTP client reads for `exc`: what to do, in the API's terms.

    An exception's own message speaks to a Python caller (`engine.resume(...)`); the ones an
    HTTP client can act on differently are worded here, from the facts they carry.

    Args:
        exc: the error.
        endpoints: name this API's endpoints (False for a chat protocol's client, which
            talks to its own endpoint only).
    """
    if isinstance(exc, SessionNotFoundError):
        # The library's message names the scope it looked in and how a session is found; a
        # client learns only that its caller has no such session, never whether another has.
        session = f"session {exc.session_id!r}" if exc.session_id is not None else "such session"
        return f"No {session} for this caller."
    if isinstance(exc, TurnSuspendedError | TurnCutOffError):
        session = f"Session {exc.session_id!r}"
        events = f" (its events: GET /sessions/{exc.session_id}/events)" if endpoints else ""
        if isinstance(exc, TurnCutOffError):
            return (
                f"{session}: the previous turn was cut off while it ran (a server stopped), "
                f"and the server recovers it by itself; wait for it to end{events}, then send "
                f"the message again."
            )
        if not exc.pending:
            return (
                f"{session} is resuming its suspended turn: wait for it to end{events}, then "
                f"send the message again."
            )
        where = f"POST them to /sessions/{exc.session_id}/resolve" if endpoints else "send them"
        return (
            f"{session} is waiting on decisions for {', '.join(exc.pending)}: {where} (the "
            f"turn resumes once none is left), then send the message again."
        )
    return str(exc)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(request, exc.status, exc.kind, exc.message, headers=exc.headers)


async def _handrail_error(request: Request, exc: Exception) -> Response:
    status, kind = next(_STATUS[k] for k in type(exc).__mro__ if k in _STATUS)
    details: list[dict[str, object]] | None = None
    if isinstance(exc, ArgumentsChangedError):  # what to decide on now
        details = [
            {"tool_call_id": exc.tool_call_id, "digest": exc.digest, "args": exc.current_args}
        ]
    return error_response(request, status, kind, http_message(exc), details)


async def _corrupt(request: Request, exc: Exception) -> Response:
    _log.error("request %s: %s", request_id(request.scope), exc)
    return error_response(
        request,
        500,
        "session_corrupt",
        f"{exc} (The row is kept for a person to look at: DELETE the session to remove it.)",
    )


async def _store_error(request: Request, exc: Exception) -> Response:
    _log.error(
        "request %s: the session store failed on %s %r: %s",
        request_id(request.scope),
        request.method,
        request.url.path,
        exc,
    )
    return error_response(
        request, 503, "store_unavailable", "The session store failed; try again later."
    )


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ValidationError)
    # No `input`: a rejected value may be a secret.
    details = exc.errors(include_url=False, include_input=False, include_context=False)
    first = details[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
    return error_response(
        request,
        422,
        "invalid_request",
        f"{where}: {first['msg']}{more}",
        details=list(map(dict, details)),
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    names = {404: "not_found", 405: "method_not_allowed"}
    return error_response(
        request,
        exc.status_code,
        names.get(exc.status_code, "http_error"),
        exc.detail,
        headers=exc.headers,
    )


async def _unexpected(request: Request, exc: Exception) -> Response:
    """A failure nobody foresaw: JSON all the same, and the detail only in the log.

    Logged once, here, with its traceback, under the request id the answer names (its
    `reference`); Starlette raises it again for the server to log, which `App` stops.
    """
    rid = request_id(request.scope)
    session_id = request.path_params.get("session_id")
    log_failure(
        _log,
        f"request {rid}: {request.method} {_escape(request.url.path)!r} failed unexpectedly",
        exc,
        reference=rid,
        request_id=rid,
        session_id=session_id if isinstance(session_id, str) else None,
    )
    request.scope[_ANSWERED] = exc
    return error_response(
        request,
        500,
        "internal_error",
        f"The server failed on this request (request id {rid}); it is in the server's log.",
        # Answered by Starlette's outermost middleware, past the one that adds these.
        headers=security_headers(request.scope),
    )


_ANSWERED = "handrail.answered"
"""The scope key under which `_unexpected` leaves the exception it logged and answered."""


class App(Starlette):
    """The API's Starlette app: a failure it has answered (500, logged) is not raised again.

    Starlette's outermost middleware answers an unexpected exception with the app's handler
    and then raises it again, for the server to log: it would be in the log twice, the
    second time without the request id. Here the raise stops once the handler has logged it.
    """

    def build_middleware_stack(self) -> ASGIApp:
        """Starlette's stack, under a layer that drops what the handler answered."""
        stack = super().build_middleware_stack()

        async def answered(scope: Scope, receive: Receive, send: Send) -> None:
            try:
                await stack(scope, receive, send)
            except Exception as exc:
                if scope.get(_ANSWERED) is not exc:
                    raise

        return answered


EXCEPTION_HANDLERS = {
    ApiError: _api_error,
    StoreError: _store_error,
    SessionCorruptError: _corrupt,
    ValidationError: _validation_error,
    HTTPException: _http_error,
    **dict.fromkeys(_STATUS, _handrail_error),
    Exception: _unexpected,
}
"""Starlette's `exception_handlers`: every error the API answers, as JSON."""
