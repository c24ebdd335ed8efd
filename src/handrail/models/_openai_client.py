"""What the two OpenAI models share: the client, its key and base URL, and how its errors read.

`OpenAIModel` (Chat Completions) and `OpenAIResponsesModel` (the Responses API) are built
the same way over the same `openai` SDK: one `AsyncOpenAI` client with the SDK's retries off
(`RetryPolicy` alone decides), the key from `OPENAI_API_KEY` unless given, any key for a
local server at a `base_url`, and the SDK's errors described to the retry policy the same way.
Imported only by those two modules, after they checked that `openai` is installed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import openai

from ..exceptions import ConfigError
from ._sdk import SDKModel, describe_sdk_error
from .retry import Failure, RetryPolicy

__all__ = ["API_KEY_VARIABLE", "OpenAIClientModel"]

API_KEY_VARIABLE = "OPENAI_API_KEY"


class OpenAIClientModel(SDKModel):
    """A model served over one of OpenAI's APIs through the `openai` SDK (see the subclasses)."""

    retry: RetryPolicy
    """The retry policy."""
    streaming: bool
    """Whether the answer is streamed."""
    settings: dict[str, Any]
    """More request parameters, sent as they are."""

    default_provider: str = "openai"
    """The provider's name when `provider=` is not given (each subclass says its own)."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: openai.AsyncOpenAI | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = 600.0,
        stream: bool = True,
        settings: Mapping[str, Any] | None = None,
        provider: str | None = None,
    ) -> None:
        self.model_name = model
        self.provider = provider or self.default_provider
        self.retry = retry or RetryPolicy()
        self.streaming = stream
        self.settings = dict(settings or {})
        self._owns_client = client is None
        if client is None:
            api_key = api_key or os.environ.get(API_KEY_VARIABLE)
            if not api_key:
                if base_url is None:
                    raise ConfigError(
                        f"{type(self).__name__}({model!r}) needs an API key: set the environment "
                        f"variable {API_KEY_VARIABLE}, or pass api_key=."
                    )
                api_key = "unused"  # local OpenAI-compatible servers take any key
            client = openai.AsyncOpenAI(
                api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0
            )
        else:
            client = client.with_options(max_retries=0)
        self.client = client

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model_name!r}, base_url={str(self.client.base_url)!r})"

    def _describe(self, exc: Exception) -> Failure | None:
        """An exception of one attempt, for the retry policy (None: not about the request)."""
        return describe_sdk_error(
            exc,
            status_error=openai.APIStatusError,
            connection_error=openai.APIConnectionError,
            api_error=openai.APIError,
            now=self.retry.clock(),
        )
