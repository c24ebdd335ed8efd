"""What the `openai` and `anthropic` models share: a name, a client, how their errors read.

Both SDKs are generated from one template over `httpx2`: a status error carries the response
and the provider's error object, a connection error wraps the transport's. How they end a
body that did not arrive whole (measured with `openai` 3.54 and `anthropic` 2.12):

- A body that ends cleanly (its last HTTP chunk came) ends the SDK's stream quietly, whatever
  it lacked: OpenAI's `[DONE]`, Anthropic's `message_stop`, or the rest of a line (a partial
  last line is dropped). Only the adapter can tell, from the protocol's own end marker.
- A body whose connection closes midway raises the SDK's `APIConnectionError` (OpenAI, which
  wraps the transport's error) or a bare `httpx2.RemoteProtocolError` (Anthropic).
- A body that ends cleanly inside a multi-byte UTF-8 character raises a bare
  `UnicodeDecodeError` from the SDK's SSE decoder, which decodes each line as it completes
  (or the partial last one when the body ends); a non-streamed body that ends early raises a
  bare `json.JSONDecodeError` or `UnicodeDecodeError`.

`body_broken` names all three, and `incomplete` turns them into `IncompleteResponseError`.
"""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any, Self

import httpx2

from ..exceptions import IncompleteResponseError
from .retry import Failure, is_retryable_status, parse_retry_after

__all__ = ["SDKModel", "body_broken", "describe_sdk_error", "incomplete"]


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


def body_broken(exc: Exception, *, connection_error: type[Any]) -> str | None:
    """Why a response body being read did not arrive whole, in words; None: `exc` is not that.

    Args:
        exc: what reading the body raised.
        connection_error: the SDK's `APIConnectionError` (its timeout error is one).
    """
    if isinstance(exc, UnicodeDecodeError):
        return "the body ended inside a UTF-8 character"
    if isinstance(exc, json.JSONDecodeError):
        return f"the body is not whole JSON ({exc})"
    if isinstance(exc, connection_error):
        cause = exc.__cause__
        detail = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        return f"{exc}{detail}"
    if isinstance(exc, httpx2.TransportError):
        return f"{type(exc).__name__}: {exc}"
    return None


def incomplete(provider: str, missing: str, why: str) -> IncompleteResponseError:
    """The error for a response that ended before `missing` arrived, because of `why`."""
    return IncompleteResponseError(
        f"{provider}: the response ended without its {missing}: {why}",
        provider=provider,
        missing=missing,
    )
