"""`OpenAIModel`: OpenAI's Chat Completions API, and every server that speaks it.

```python
model = OpenAIModel("gpt-4o-mini")  # the key from OPENAI_API_KEY
local = OpenAIModel("qwen2.5", base_url="http://127.0.0.1:8000/v1", api_key="unused")
```

`base_url` points it at any OpenAI-compatible server (vLLM, Ollama, LM Studio, llama.cpp).
Text, reasoning (`reasoning_content` or `reasoning`, which compatible servers stream) and
tool-call arguments stream as they come; usage arrives with the last chunk
(`stream_options.include_usage`). How messages are converted is `_openai_format`; retries
are `RetryPolicy`'s alone (the SDK's own are off).
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, cast

from ..exceptions import ConfigError
from ..messages import ReasoningPart, TextPart, ToolCallPart
from . import (
    ModelChunk,
    ModelRequest,
    ModelResponse,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    Usage,
)
from ._openai_format import openai_request, request_tool_names
from ._sdk import SDKModel, describe_sdk_error
from ._wire import ToolNames
from .retry import Failure, RetryPolicy

try:
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.completion_usage import CompletionUsage
except ImportError as _error:  # pragma: no cover - exercised without the extra installed
    raise ImportError('OpenAIModel needs openai: pip install "handrail[openai]"') from _error

__all__ = ["OpenAIModel"]

API_KEY_VARIABLE = "OPENAI_API_KEY"


class OpenAIModel(SDKModel):
    """A model served over OpenAI's Chat Completions API.

    Args:
        model: the model's name, as the server knows it (`gpt-4o-mini`, `qwen2.5:7b`).
        api_key: the API key; by default `OPENAI_API_KEY`. Without either, and with no
            `base_url`, a `ConfigError` says which variable to set.
        base_url: the server, for OpenAI-compatible ones (`http://127.0.0.1:8000/v1`).
        client: an `AsyncOpenAI` client of your own (Azure, proxies, custom headers); it is
            used with its retries off, and closing this model leaves it open.
        retry: the retry policy (one policy for every provider).
        timeout: seconds to connect, and to wait for each piece of the response.
        stream: stream the answer (default); `False` asks for it in one piece, for servers
            whose streaming of tool calls is unreliable.
        settings: more request parameters, sent as they are (`temperature`, `max_tokens`,
            `reasoning_effort`, `extra_body`, ...).
        provider: the provider's name in the model name and in errors.
    """

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
        provider: str = "openai",
    ) -> None:
        self.model_name = model
        self.provider = provider
        self.retry = retry or RetryPolicy()
        self.streaming = stream
        self.settings = dict(settings or {})
        self._owns_client = client is None
        if client is None:
            api_key = api_key or os.environ.get(API_KEY_VARIABLE)
            if not api_key:
                if base_url is None:
                    raise ConfigError(
                        f"OpenAIModel({model!r}) needs an API key: set the environment variable "
                        f"{API_KEY_VARIABLE}, or pass api_key=."
                    )
                api_key = "unused"  # local OpenAI-compatible servers take any key
            client = openai.AsyncOpenAI(
                api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0
            )
        else:
            client = client.with_options(max_retries=0)
        self.client = client

    def __repr__(self) -> str:
        return f"OpenAIModel({self.model_name!r}, base_url={str(self.client.base_url)!r})"

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Stream the answer to `request`: chunks, then one `ModelResponse`.

        Raises:
            ModelHTTPError: the API failed for good (see `RetryPolicy`).
        """
        names = request_tool_names(request.tools, request.messages)
        body = openai_request(request, names)
        body.update(self.settings)
        attempt = self._stream if self.streaming else self._complete
        return self.retry.stream(self.provider, lambda: attempt(body, names), self._describe)

    def _describe(self, exc: Exception) -> Failure | None:
        return describe_sdk_error(
            exc,
            status_error=openai.APIStatusError,
            connection_error=openai.APIConnectionError,
            api_error=openai.APIError,
            now=self.retry.clock(),
        )

    async def _stream(
        self, body: dict[str, Any], names: ToolNames
    ) -> AsyncGenerator[ModelChunk, None]:
        stream = await self.client.chat.completions.create(
            model=self.model_name,
            stream=True,
            stream_options={"include_usage": True},
            **body,
        )
        text: list[str] = []
        reasoning: list[str] = []
        calls: dict[int, _Call] = {}
        usage: CompletionUsage | None = None
        stop: str | None = None
        model_name: str | None = None
        async with stream:
            chunk: ChatCompletionChunk
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                if not chunk.choices:
                    continue
                model_name = chunk.model
                choice = chunk.choices[0]
                delta = choice.delta
                extra = delta.model_extra
                if extra:
                    thought = extra.get("reasoning_content") or extra.get("reasoning")
                    if isinstance(thought, str) and thought:
                        reasoning.append(thought)
                        yield ReasoningChunk(text=thought)
                content = delta.content or delta.refusal
                if content:
                    text.append(content)
                    yield TextChunk(text=content)
                if delta.tool_calls:
                    for piece in delta.tool_calls:
                        call = calls.get(piece.index)
                        function = piece.function
                        name = function.name if function is not None else None
                        if call is None:
                            call = calls[piece.index] = _Call(piece.id)
                        elif piece.id:
                            call.id = piece.id
                        if name:
                            name = names.handrail(name)
                            call.name = name
                        args = (function.arguments if function is not None else None) or ""
                        if args:
                            call.args.append(args)
                        yield ToolCallChunk(
                            index=piece.index, id=piece.id, name=name, args_delta=args
                        )
                if choice.finish_reason is not None:
                    stop = choice.finish_reason
        parts: list[TextPart | ReasoningPart | ToolCallPart] = []
        if reasoning:
            parts.append(ReasoningPart(text="".join(reasoning), provider=self.provider))
        if text:
            parts.append(TextPart(text="".join(text)))
        parts.extend(
            ToolCallPart(
                id=call.id or f"call_{os.urandom(6).hex()}",
                name=call.name,
                raw_args="".join(call.args),
            )
            for _, call in sorted(calls.items())
        )
        yield ModelResponse(
            parts=parts, usage=_usage(usage), stop_reason=stop, model_name=model_name
        )

    async def _complete(
        self, body: dict[str, Any], names: ToolNames
    ) -> AsyncGenerator[ModelChunk, None]:
        completion = cast(
            ChatCompletion,
            await self.client.chat.completions.create(model=self.model_name, **body),
        )
        response = _response(completion, names, self.provider)
        calls = 0
        for part in response.parts:
            if isinstance(part, ReasoningPart):
                yield ReasoningChunk(text=part.text)
            elif isinstance(part, TextPart):
                yield TextChunk(text=part.text)
            else:
                yield ToolCallChunk(
                    index=calls, id=part.id, name=part.name, args_delta=part.raw_args or ""
                )
                calls += 1
        yield response


class _Call:
    """A tool call being streamed."""

    __slots__ = ("args", "id", "name")

    def __init__(self, id: str | None) -> None:
        self.id = id
        self.name = ""
        self.args: list[str] = []


def _response(completion: ChatCompletion, names: ToolNames, provider: str) -> ModelResponse:
    """A complete (non-streamed) answer as a `ModelResponse`."""
    parts: list[TextPart | ReasoningPart | ToolCallPart] = []
    stop: str | None = None
    if completion.choices:
        choice = completion.choices[0]
        stop = choice.finish_reason
        message = choice.message
        extra = message.model_extra or {}
        thought = extra.get("reasoning_content") or extra.get("reasoning")
        if isinstance(thought, str) and thought:
            parts.append(ReasoningPart(text=thought, provider=provider))
        content = message.content or message.refusal
        if content:
            parts.append(TextPart(text=content))
        for call in message.tool_calls or ():
            function = getattr(call, "function", None)
            if function is None:  # a custom (non-function) tool call: not handrail's
                continue
            parts.append(
                ToolCallPart(
                    id=call.id, name=names.handrail(function.name), raw_args=function.arguments
                )
            )
    return ModelResponse(
        parts=parts,
        usage=_usage(completion.usage),
        stop_reason=stop,
        model_name=completion.model,
    )


def _usage(usage: CompletionUsage | None) -> Usage:
    if usage is None:
        return Usage(requests=1)
    details = usage.prompt_tokens_details
    return Usage(
        requests=1,
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        cached_tokens=(details.cached_tokens or 0) if details is not None else 0,
    )
