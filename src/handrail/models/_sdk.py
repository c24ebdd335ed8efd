"""What the `openai` and `anthropic` models share: a name, a client, how their errors read.

Both SDKs are generated from one template over `httpx2`: a status error carries the response
and the provider's error object, a connection error wraps the transport's. A stream cut
midway may also surface as a bare `httpx2` transport error.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

import httpx2

from .retry import Failure, is_retryable_status, parse_retry_after

__all__ = ["SDKModel", "describe_sdk_error"]


class SDKModel:
    """The part of a provider model that is not about the wire: its name and its client."""

    provider: str
    """The provider's name, in the model's name and in errors."""
    model_name: str
    """The provider's model name."""
    client: Any
    """The SDK's async client."""
    _owns_client: bool

    @property
    def name(self) -> str:
        """`provider:model`, e.g. `openai:gpt-4o-mini`."""
        return f"{self.provider}:{self.model_name}"

    async def aclose(self) -> None:
        """Close the HTTP client (unless it was handed in)."""
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


def describe_sdk_error(
    exc: Exception,
    *,
    status_error: type[Any],
    connection_error: type[Any],
    api_error: type[Any],
    now: float,
) -> Failure | None:
    """Describe an exception raised by one SDK call or stream (None: not a request failure).

    Args:
        exc: what was raised.
        status_error: the SDK's `APIStatusError`.
        connection_error: the SDK's `APIConnectionError` (its timeout error is one).
        api_error: the SDK's `APIError`, the base of both (an error event inside a stream).
        now: wall time, for a `Retry-After` date.
    """
    if isinstance(exc, status_error):
        status: int = exc.status_code
        message = _message(exc)
        if status < 400:  # an error event inside a stream that had started with 200
            return Failure(status=None, message=message, retryable=True, request_id=exc.request_id)
        return Failure(
            status=status,
            message=message,
            retryable=is_retryable_status(status),
            request_id=exc.request_id,
            retry_after=parse_retry_after(exc.response.headers, now),
        )
    if isinstance(exc, connection_error):
        cause = exc.__cause__
        detail = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        return Failure(status=None, message=f"{exc}{detail}", retryable=True)
    if isinstance(exc, api_error):
        return Failure(status=None, message=_message(exc), retryable=True)
    if isinstance(exc, httpx2.TransportError):
        return Failure(status=None, message=f"{type(exc).__name__}: {exc}", retryable=True)
    return None


def _message(exc: Any) -> str:
    """The provider's own message, from its error object when it sent one."""
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
    return str(exc.message)
