"""What every endpoint of the server shares: the engine, who calls, the body, the limits.

`create_app` makes one API object: the REST endpoints (`_app.py`) are a subclass of `Api`,
and the protocol adapters (`_agui.py`, `_ui_stream.py`, `_chats.py`) are handed it and need
no more than what is here.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import AsyncGenerator
from typing import Any, TypeVar

import pydantic_core
from pydantic import BaseModel
from starlette.requests import Request

from ..engine import Engine
from ..gate import TurnRequest
from ..store import SessionStore
from ._auth import Authenticator, Caller
from ._errors import ApiError
from ._limits import Limits
from ._runs import Runs

__all__ = ["AUTHENTICATED", "Api"]

AUTHENTICATED = "handrail.authenticated"
"""The scope extension (`scope["extensions"][AUTHENTICATED]`, a callable) the app calls once a
request of the connection showed a valid credential: `serve`'s protocol (`_connections`) then
counts the connection among those that may use the slots kept for callers."""

M = TypeVar("M", bound=BaseModel)


class Api:
    """The engine and the runs behind the endpoints, and the checks each request passes."""

    def __init__(
        self,
        engine: Engine | None,
        runs: Runs | None,
        authenticator: Authenticator,
        max_body_size: int,
        ping_interval: float,
        send_timeout: float | None,
        limits: Limits,
    ) -> None:
        self.limits = limits
        self._engine, self._runs = engine, runs
        self.authenticator = authenticator
        self.max_body_size = max_body_size
        self.ping_interval = ping_interval
        self.send_timeout = send_timeout

    def open(self, engine: Engine | None, runs: Runs | None) -> None:
        """Serve `engine` and `runs` from now on (None: none, until opened again)."""
        self._engine, self._runs = engine, runs

    @property
    def engine(self) -> Engine:
        """The engine the endpoints serve (503 while the app is not open)."""
        if self._engine is None:
            raise _not_open()
        return self._engine

    @property
    def store(self) -> SessionStore:
        """The engine's store."""
        return self.engine.store

    @property
    def runs(self) -> Runs:
        """The turns this server runs (503 while the app is not open)."""
        if self._runs is None:
            raise _not_open()
        return self._runs

    # -- plumbing -------------------------------------------------------------------------

    async def _caller(self, request: Request) -> Caller:
        caller = await self.authenticator.authenticate(request)
        if caller is None:
            raise ApiError(
                401,
                "unauthorized",
                "Send an API key: `Authorization: Bearer <key>`.",
                headers={"WWW-Authenticate": "Bearer"},
            )
        authenticated = request.scope.get("extensions", {}).get(AUTHENTICATED)
        if authenticated is not None:
            authenticated()
        self.limits.request(caller)
        request.state.caller = caller
        return caller

    async def admit(
        self, caller: Caller, *, via: str, session_id: str | None, text: str | None
    ) -> None:
        """Ask the engine's gate whether `caller` may start a turn, before anything is stored.

        Raises:
            TurnRefusedError: the gate refused (answered 403 `turn_refused`, its reason).
        """
        await self.engine.admit(
            TurnRequest(
                org_id=caller.org_id,
                user_id=caller.user_id,
                roles=caller.roles,
                session_id=session_id,
                text=text,
                via=via,
                credential=caller.credential,
            )
        )

    async def _body(self, request: Request, model: type[M]) -> M:
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise ApiError(
                415,
                "unsupported_media_type",
                f"The body must be JSON (Content-Type: application/json), not {media[:60]!r}.",
            )
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_size:
            raise self._too_large()
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body_size:
                raise self._too_large()
        _check_finite(bytes(body))
        return model.model_validate_json(bytes(body))

    def _too_large(self) -> ApiError:
        return ApiError(
            413, "body_too_large", f"The request body is over {self.max_body_size} bytes."
        )

    async def _within_bandwidth(self, caller: Caller) -> AsyncGenerator[bytes, None]:
        """Before a stream writes: past its organisation's bandwidth, wait until within.

        Yields `b""` while it waits, so that the stream still sends its keep-alives. (A write
        is counted after it is made: the last write of a stream never waits.)
        """
        wait = self.limits.stream_wait(caller)
        while wait > 0:
            await asyncio.sleep(min(wait, self.ping_interval))
            yield b""
            wait = self.limits.stream_wait(caller)


def _not_open() -> ApiError:
    return ApiError(
        503,
        "not_open",
        "The application is not open: the server's lifespan has not run (an app of "
        "create_app(lifespan=...) mounted in another app: enter its lifespan from yours), or "
        "it has ended.",
    )


_BIG = re.compile(rb"\d[eE][+-]?\d{3}")
"""An exponent of three digits or more: the only way a JSON number overflows a float."""


def _check_finite(body: bytes) -> None:
    """Refuse a body with a number that is not finite.

    `NaN`, `Infinity` or a number past the float range (`1e400`) would reach a tool as nothing
    it can use (and be stored as null). A body that is not JSON at all is left to the model's
    validation to name.
    """
    if b"NaN" not in body and b"Infinity" not in body and not _BIG.search(body):
        return  # nothing that could be one: no second parse
    try:
        value = pydantic_core.from_json(body)  # NaN and Infinity read, to be named below
    except ValueError:
        return
    where = _infinite(value, "body")
    if where is not None:
        raise ApiError(
            422,
            "invalid_request",
            f"{where}: numbers must be finite (not NaN, not Infinity, not past ±1.8e308).",
        )


def _infinite(value: Any, where: str) -> str | None:
    """Where in `value` a number is not finite, or None."""
    if isinstance(value, float):
        return where if not math.isfinite(value) else None
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _infinite(item, f"{where}.{key}" if isinstance(key, str) else f"{where}[{key}]")
        if found is not None:
            return found
    return None
