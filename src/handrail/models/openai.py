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

A streamed answer is whole once a chunk carried its `finish_reason`: a stream that ends
without one, cleanly or cut, raises `IncompleteResponseError` (the SDK ends quietly on a body
that lacks `[DONE]`, so the adapter checks); one cut after it has lost only the usage chunk and
`[DONE]`, and is kept. Parallel calls are told apart by their `id` as well as their `index`
(see `_Calls`). Azure's content filter adds chunks with no choices, or whose choice has no
delta, only a verdict: the verdicts are kept on `ModelResponse.provider_details`, and one that
filtered the answer makes it `content_filter` (see `_Filters`). A legacy `function_call`
(from servers older than `tools`) is read as one tool call.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from .._random import token_hex
from ..exceptions import MissingExtraError, ModelError
from ..messages import ReasoningPart, TextPart, ToolCallPart
from ..tools._hosted import check_hosted
from . import (
    FinishReason,
    ModelChunk,
    ModelRequest,
    ModelResponse,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    Usage,
)
from ._openai_format import openai_request, request_tool_names
from ._sdk import body_broken, incomplete
from ._wire import ToolNames

try:
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.chat.chat_completion_chunk import ChoiceDelta
    from openai.types.completion_usage import CompletionUsage

    from ._openai_client import OpenAIClientModel
except ImportError as _error:  # pragma: no cover - exercised without the extra installed
    raise MissingExtraError("OpenAIModel", needs="openai", extra="openai") from _error

__all__ = ["OpenAIModel"]

_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "tool_call",
    "function_call": "tool_call",
    "length": "length",
    "content_filter": "content_filter",
    # What OpenAI-compatible servers send instead (llama.cpp, TGI, gateways to other APIs).
    "eos": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "model_length": "length",
    "max_tokens": "length",
}


def finish_reason(raw: str | None) -> FinishReason:
    """A Chat Completions `finish_reason` in handrail's vocabulary (`other` when unknown)."""
    return _FINISH_REASONS.get(raw or "", "other")


class OpenAIModel(OpenAIClientModel):
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

    default_provider = "openai"

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Stream the answer to `request`: chunks, then one `ModelResponse`.

        Raises:
            ModelHTTPError: the API failed for good (see `RetryPolicy`).
            IncompleteResponseError: the answer did not arrive whole (see `RetryPolicy`).
            ModelError: the server streamed tool calls that cannot be told apart.
            HostedToolError: the request has hosted tools (`web_search()`, ...), which Chat
                Completions cannot run (raised before anything is sent).
        """
        check_hosted(
            repr(self),
            request.hosted_tools,
            (),
            "Chat Completions has no hosted tools; use OpenAIResponsesModel "
            "(openai-responses:...), or AnthropicModel",
        )
        names = request_tool_names(request.tools, request.messages)
        body = openai_request(request, names)
        body.update(self.settings)
        attempt = self._stream if self.streaming else self._complete
        return self.retry.stream(self.provider, lambda: attempt(body, names), self._describe)

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
        calls = _Calls(self.provider, names)
        filters = _Filters()
        usage: CompletionUsage | None = None
        stop: str | None = None
        model_name: str | None = None
        try:
            async with stream:
                chunk: ChatCompletionChunk
                async for chunk in stream:
                    if chunk.usage is not None:
                        usage = chunk.usage
                    filters.prompt(chunk.model_extra)
                    # The answer is choice 0 (a request with `n` > 1 interleaves the others).
                    choice = next((c for c in chunk.choices if c.index == 0), None)
                    if choice is None:
                        continue
                    if chunk.model:  # Azure's filter annotations name no model
                        model_name = chunk.model
                    filters.answer(choice.model_extra)
                    if choice.finish_reason:
                        stop = choice.finish_reason
                    # A choice may come without a delta: Azure's content-filter annotations
                    # (and its blocked-content finish) carry only the filter's verdict.
                    delta: ChoiceDelta | None = getattr(choice, "delta", None)
                    if delta is None:
                        continue
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
                    for piece in delta.tool_calls or ():
                        function = piece.function
                        out = calls.add(
                            piece.index,
                            piece.id,
                            function.name if function is not None else None,
                            (function.arguments if function is not None else None) or "",
                        )
                        if out is not None:
                            yield out
                    legacy = delta.function_call  # the deprecated single call, from old servers
                    if legacy is not None:
                        out = calls.add(0, None, legacy.name, legacy.arguments or "")
                        if out is not None:
                            yield out
        except Exception as exc:
            why = body_broken(exc, connection_error=openai.APIConnectionError)
            if why is None:
                raise
            if stop is None:
                raise incomplete(self.provider, "finish_reason", why) from exc
            # The answer had finished: only the usage chunk and `[DONE]` were lost.
        if stop is None:
            # The SDK ends quietly on a body that ends early, `[DONE]` or not.
            raise incomplete(self.provider, "finish_reason", "the body ended with no error")
        parts: list[TextPart | ReasoningPart | ToolCallPart] = []
        if reasoning:
            parts.append(ReasoningPart(text="".join(reasoning), provider=self.provider))
        if text:
            parts.append(TextPart(text="".join(text)))
        parts.extend(
            ToolCallPart(
                id=call.id or f"call_{token_hex(6)}",
                name=call.name,
                raw_args="".join(call.args),
            )
            for call in calls.calls
        )
        yield ModelResponse(
            parts=parts,
            usage=_usage(usage),
            stop_reason=stop,
            finish_reason=filters.finish(stop),
            model_name=model_name,
            provider_details=filters.details(),
        )

    async def _complete(
        self, body: dict[str, Any], names: ToolNames
    ) -> AsyncGenerator[ModelChunk, None]:
        try:
            completion = cast(
                ChatCompletion,
                await self.client.chat.completions.create(model=self.model_name, **body),
            )
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            # A body that ended early while the transport saw a proper end (a body delimited
            # by closing the connection, or a server's bug): the SDK fails to parse it.
            why = body_broken(exc, connection_error=openai.APIConnectionError)
            raise incomplete(self.provider, "complete JSON body", str(why)) from exc
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

    __slots__ = ("args", "id", "json", "name", "number")

    def __init__(self, number: int, id: str | None) -> None:
        self.number = number
        self.id = id
        self.name = ""
        self.args: list[str] = []
        self.json = _JsonEnd()

    def label(self) -> str:
        """How an error names the call."""
        return f"{self.id!r} ({self.name or 'no name yet'})" if self.id else f"#{self.number}"


class _Calls:
    """The tool calls of a streamed answer, assembled from their deltas.

    OpenAI numbers parallel calls by `index`, but some compatible servers (Ollama 0.20, some
    gateways) give every call `index: 0` and tell them apart by `id` alone. So a delta whose
    `id` differs from the call open at its index starts a new call, and calls are numbered in
    the order they start (the `ToolCallChunk.index` handrail yields), whatever the server's
    index. A delta that cannot be placed without guessing is a `ModelError`, never two calls
    merged into one: one that names no call at an index with none open, a call id that comes
    back after another call took its index, another tool's name with no new id, or more
    arguments after the call's arguments already made one complete JSON value.
    """

    __slots__ = ("_ids", "_names", "_open", "_provider", "calls")

    def __init__(self, provider: str, names: ToolNames) -> None:
        self._provider = provider
        self._names = names
        self.calls: list[_Call] = []
        self._open: dict[int, _Call] = {}
        self._ids: set[str] = set()

    def add(self, index: int, id: str | None, name: str | None, args: str) -> ToolCallChunk | None:
        """Take one delta; what to stream for it (None: nothing new)."""
        call = self._open.get(index)
        new_id = None
        if id and (call is None or (call.id is not None and call.id != id)):
            if id in self._ids:
                where = f", where call {call.label()} is open" if call is not None else ""
                raise self._error(f"call id {id!r} came again at index {index}{where}")
            call = self._start(index, id)
            new_id = id
        elif id and call is not None and call.id is None:
            if id in self._ids:
                raise self._error(f"call id {id!r} came again at index {index}, for a second call")
            call.id = new_id = id
            self._ids.add(id)
        elif call is None:
            if not name:
                raise self._error(
                    f"a delta at index {index} names no call (no id, no tool name) and no call "
                    f"is open there"
                )
            call = self._start(index, None)
        new_name = None
        if name:
            name = self._names.handrail(name)
            if call.name and call.name != name:
                raise self._error(
                    f"call {call.label()} at index {index} is named {name!r} with no new id"
                )
            if not call.name:
                call.name = new_name = name
        if args:
            if call.json.feed(args):
                raise self._error(
                    f"call {call.label()} at index {index} got more arguments ({args!r}) after "
                    f"a complete JSON value, with no new id; two calls would run as one"
                )
            call.args.append(args)
        if new_id is None and new_name is None and not args:
            return None
        return ToolCallChunk(index=call.number, id=new_id, name=new_name, args_delta=args)

    def _start(self, index: int, id: str | None) -> _Call:
        call = self._open[index] = _Call(len(self.calls), id)
        self.calls.append(call)
        if id:
            self._ids.add(id)
        return call

    def _error(self, what: str) -> ModelError:
        return ModelError(
            f"{self._provider}: the streamed tool calls cannot be told apart: {what}. The "
            f"response was refused rather than guessed at; if the server numbers parallel calls "
            f"oddly, try OpenAIModel(..., stream=False)."
        )


class _JsonEnd:
    """Whether the arguments streamed so far already hold one complete JSON object or array.

    A small scanner over the pieces as they come (strings and escapes included), so each piece
    is read once. Arguments that do not start as an object or array are not judged: repairing
    or refusing them is the dispatch pipeline's business.
    """

    __slots__ = ("_depth", "_escape", "_string", "done", "judged")

    def __init__(self) -> None:
        self._depth = 0
        self._string = False
        self._escape = False
        self.done = False
        self.judged = True

    def feed(self, text: str) -> bool:
        """Read `text`; True when something other than whitespace follows a complete value."""
        if not self.judged:
            return False
        for char in text:
            if self.done:
                if not char.isspace():
                    return True
            elif self._string:
                if self._escape:
                    self._escape = False
                elif char == "\\":
                    self._escape = True
                elif char == '"':
                    self._string = False
            elif char == '"':
                if self._depth == 0:
                    self.judged = False
                    return False
                self._string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth <= 0:
                    self.done = self._depth == 0
                    self.judged = self.done
                    if not self.judged:
                        return False
            elif self._depth == 0 and not char.isspace():
                self.judged = False
                return False
        return False


def _response(completion: ChatCompletion, names: ToolNames, provider: str) -> ModelResponse:
    """A complete (non-streamed) answer as a `ModelResponse`."""
    parts: list[TextPart | ReasoningPart | ToolCallPart] = []
    stop: str | None = None
    filters = _Filters()
    filters.prompt(completion.model_extra)
    if completion.choices:
        choice = completion.choices[0]
        stop = choice.finish_reason
        filters.answer(choice.model_extra)
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
        legacy = message.function_call  # the deprecated single call, from old servers
        if legacy is not None and not message.tool_calls:
            parts.append(
                ToolCallPart(
                    id=f"call_{token_hex(6)}",
                    name=names.handrail(legacy.name),
                    raw_args=legacy.arguments,
                )
            )
    return ModelResponse(
        parts=parts,
        usage=_usage(completion.usage),
        stop_reason=stop,
        finish_reason=filters.finish(stop),
        model_name=completion.model,
        provider_details=filters.details(),
    )


class _Filters:
    """Azure OpenAI's content-filter verdicts on a response, as received.

    Azure reports on the prompt (`prompt_filter_results`, once `prompt_annotations`, in a first
    chunk with no choices) and on the answer (`content_filter_results` on its choices, and in
    annotation chunks whose choice has no delta). A verdict that filtered the answer makes it
    `content_filter` even when it came after the model's own `stop`, as Azure's asynchronous
    filter does: the answer was blocked, so nothing of it is acted on.
    """

    __slots__ = ("_answer", "_blocked", "_prompt")

    def __init__(self) -> None:
        self._prompt: list[Any] = []
        self._answer: list[Any] = []
        self._blocked = False

    def prompt(self, extra: dict[str, Any] | None) -> None:
        """Read a chunk's (or a completion's) extra fields."""
        if not extra:
            return
        results = extra.get("prompt_filter_results") or extra.get("prompt_annotations")
        if isinstance(results, list):
            self._prompt.extend(results)

    def answer(self, extra: dict[str, Any] | None) -> None:
        """Read a choice's extra fields."""
        results = (extra or {}).get("content_filter_results")
        # Every chunk of a vetted segment repeats its verdict: it is kept once.
        if not results or (self._answer and self._answer[-1] == results):
            return
        self._answer.append(results)
        self._blocked = self._blocked or _filtered(results)

    def finish(self, stop: str | None) -> FinishReason:
        """The response's finish reason, a filtered answer's being `content_filter`."""
        return "content_filter" if self._blocked and stop is not None else finish_reason(stop)

    def details(self) -> dict[str, Any] | None:
        """The verdicts for `ModelResponse.provider_details`, if any came."""
        details: dict[str, Any] = {}
        if self._prompt:
            details["prompt_filter_results"] = self._prompt
        if self._answer:
            details["content_filter_results"] = self._answer
        return details or None


def _filtered(value: Any) -> bool:
    """Whether a verdict (nested categories, blocklists) says `filtered: true` anywhere."""
    if isinstance(value, dict):
        return value.get("filtered") is True or any(_filtered(v) for v in value.values())
    if isinstance(value, list):
        return any(_filtered(v) for v in value)
    return False


def _usage(usage: CompletionUsage | None) -> Usage:
    if usage is None:
        return Usage(requests=1)
    details = usage.prompt_tokens_details
    completion = usage.completion_tokens_details
    return Usage(
        requests=1,
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        cached_tokens=(details.cached_tokens or 0) if details is not None else 0,
        reasoning_tokens=(completion.reasoning_tokens or 0) if completion is not None else 0,
    )
