"""`AnthropicModel`: Anthropic's Messages API.

```python
model = AnthropicModel("claude-sonnet-4-6")  # the key from ANTHROPIC_API_KEY
thinking = AnthropicModel(
    "claude-sonnet-4-6",
    max_tokens=16000,
    settings={"thinking": {"type": "enabled", "budget_tokens": 8000}},
)
```

Text, thinking (as reasoning parts carrying their signature, replayed to Anthropic on the next
request as the API requires during tool use) and tool-call arguments stream as they come.
Thinking shown as `display: "omitted"` is a reasoning part with no text and its signature;
a `redacted_thinking` block is one marked `redacted`, its encrypted data in `signature`.
A structured answer arrives as the input of a forced tool and leaves as a text part of JSON,
streamed as text. How messages are converted is `_anthropic_format`; retries are
`RetryPolicy`'s alone (the SDK's own are off).

Hosted tools (`web_search()`, `code_execution()`, `web_fetch()`) are declared in Anthropic's
form; a `server_tool_use` block and its result block become one provider part holding both
blocks as received, replayed unchanged (`_anthropic_format`); `pause_turn` is
`finish_reason="pause"`; a content block handrail does not know refuses the response.

A streamed answer is whole once `message_stop` came: a stream that ends without it, cleanly or
cut, raises `IncompleteResponseError` (the SDK ends quietly on a body that ends early). Event
and delta types handrail does not know are ignored, as Anthropic asks of clients; a tool input
given whole in `content_block_start` (some gateways) is the input unless deltas bring text,
as in the SDK's `MessageStream`.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any, Literal, cast

import pydantic_core

from ..exceptions import ConfigError, MissingExtraError, ModelError
from ..messages import Message, ReasoningPart, TextPart, ToolCallPart
from ..tools._hosted import HostedTool
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
from ._anthropic_format import (
    HOSTED_CALLS,
    PROVIDER,
    SERVER_BLOCKS,
    anthropic_request,
    hosted_parts,
    output_is_wrapped,
)
from ._openai_format import request_tool_names
from ._sdk import SDKModel, body_broken, describe_sdk_error, incomplete
from ._wire import ToolNames
from .retry import Failure, RetryPolicy

try:
    import anthropic
    from anthropic.types import (
        CitationsDelta,
        InputJSONDelta,
        RawContentBlockDeltaEvent,
        RawContentBlockStartEvent,
        RawContentBlockStopEvent,
        RawMessageDeltaEvent,
        RawMessageStartEvent,
        RawMessageStopEvent,
        RawMessageStreamEvent,
        RedactedThinkingBlock,
        SignatureDelta,
        TextBlock,
        TextDelta,
        ThinkingBlock,
        ThinkingDelta,
        ToolUseBlock,
    )
    from anthropic.types import Message as AnthropicMessage
except ImportError as _error:  # pragma: no cover - exercised without the extra installed
    raise MissingExtraError("AnthropicModel", needs="anthropic", extra="anthropic") from _error

__all__ = ["AnthropicModel"]

API_KEY_VARIABLE = "ANTHROPIC_API_KEY"


_FINISH_REASONS: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_call",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
    "pause_turn": "pause",
}


def finish_reason(raw: str | None) -> FinishReason:
    """A Messages API `stop_reason` in handrail's words (`pause_turn`: `pause`; else `other`)."""
    return _FINISH_REASONS.get(raw or "", "other")


class AnthropicModel(SDKModel):
    """A Claude model over Anthropic's Messages API.

    Args:
        model: the model's name (`claude-sonnet-4-6`).
        api_key: the API key; by default `ANTHROPIC_API_KEY`. Without either, a
            `ConfigError` says which variable to set.
        base_url: another endpoint (a proxy or gateway that speaks the Messages API).
        client: an `AsyncAnthropic` client of your own; it is used with its retries off, and
            closing this model leaves it open.
        retry: the retry policy (one policy for every provider).
        timeout: seconds to connect, and to wait for each piece of the response.
        max_tokens: the most tokens the answer may have (the API requires a bound).
        stream: stream the answer (default), or ask for it in one piece.
        settings: more request parameters, sent as they are (`thinking`, `temperature`,
            `metadata`, `extra_headers`, ...).
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: anthropic.AsyncAnthropic | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = 600.0,
        max_tokens: int = 4096,
        stream: bool = True,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self.model_name = model
        self.provider = PROVIDER
        self.retry = retry or RetryPolicy()
        self.max_tokens = max_tokens
        self.streaming = stream
        self.settings = dict(settings or {})
        self._owns_client = client is None
        if client is None:
            api_key = api_key or os.environ.get(API_KEY_VARIABLE)
            if not api_key:
                raise ConfigError(
                    f"AnthropicModel({model!r}) needs an API key: set the environment variable "
                    f"{API_KEY_VARIABLE}, or pass api_key=."
                )
            client = anthropic.AsyncAnthropic(
                api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0
            )
        else:
            client = client.with_options(max_retries=0)
        self.client = client

    def __repr__(self) -> str:
        return f"AnthropicModel({self.model_name!r})"

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Stream the answer to `request`: chunks, then one `ModelResponse`.

        Raises:
            ModelHTTPError: the API failed for good (see `RetryPolicy`).
            IncompleteResponseError: the answer did not arrive whole (see `RetryPolicy`).
        """
        names = request_tool_names(request.tools, request.messages)
        body = anthropic_request(request, names)
        body.setdefault("max_tokens", self.max_tokens)
        body.update(self.settings)
        output = _Output(body, request.output_schema)
        hosted = _Hosted(request.hosted_tools, request.messages)
        attempt = self._stream if self.streaming else self._complete
        return self.retry.stream(
            self.provider, lambda: attempt(body, names, output, hosted), self._describe
        )

    def _describe(self, exc: Exception) -> Failure | None:
        return describe_sdk_error(
            exc,
            status_error=anthropic.APIStatusError,
            connection_error=anthropic.APIConnectionError,
            api_error=anthropic.APIError,
            now=self.retry.clock(),
        )

    async def _stream(
        self, body: dict[str, Any], names: ToolNames, output: _Output, hosted: _Hosted
    ) -> AsyncGenerator[ModelChunk, None]:
        stream = await self.client.messages.create(model=self.model_name, stream=True, **body)
        blocks: dict[int, _Block] = {}
        usage = Usage(requests=1)
        stop: str | None = None
        model_name: str | None = None
        calls = 0
        stopped = False
        try:
            async with stream:
                event: RawMessageStreamEvent
                async for event in stream:
                    if event.type not in _EVENTS:
                        # Anthropic may add event types, and clients must ignore those they
                        # do not know; the SDK builds one as the first type of its union.
                        continue
                    if isinstance(event, RawContentBlockDeltaEvent):
                        block = _open_block(blocks, event.index)
                        delta = event.delta
                        if delta.type not in _DELTAS:  # a new kind of delta: ignored, as above
                            continue
                        _check_delta(block, delta, event.index)
                        if block.kind == "server":  # a hosted call's input: not handrail's call
                            if isinstance(delta, InputJSONDelta):
                                block.pieces.append(delta.partial_json)
                            continue
                        if isinstance(delta, TextDelta):
                            block.pieces.append(delta.text)
                            yield TextChunk(text=delta.text)
                        elif isinstance(delta, InputJSONDelta):
                            block.pieces.append(delta.partial_json)
                            if block.kind == "call":
                                yield ToolCallChunk(index=block.call, args_delta=delta.partial_json)
                            elif not output.wrapped and delta.partial_json:
                                yield TextChunk(text=delta.partial_json)
                        elif isinstance(delta, ThinkingDelta):
                            block.pieces.append(delta.thinking)
                            yield ReasoningChunk(text=delta.thinking)
                        elif isinstance(delta, SignatureDelta):
                            block.signature = (block.signature or "") + delta.signature
                        elif isinstance(delta, CitationsDelta):
                            block.citations.append(delta.citation.to_dict(mode="json"))
                    elif isinstance(event, RawContentBlockStartEvent):
                        if event.index in blocks:
                            raise _stream_error(
                                f"content block {event.index} started twice; the first one "
                                f"would be lost"
                            )
                        content = event.content_block
                        if isinstance(content, TextBlock):
                            block = blocks[event.index] = _Block("text")
                            block.citations.extend(_citations(content))
                            if content.text:
                                block.pieces.append(content.text)
                                yield TextChunk(text=content.text)
                        elif isinstance(content, ThinkingBlock):
                            block = blocks[event.index] = _Block(
                                "thinking", content.signature or None
                            )
                            if content.thinking:
                                block.pieces.append(content.thinking)
                                yield ReasoningChunk(text=content.thinking)
                        elif isinstance(content, RedactedThinkingBlock):
                            blocks[event.index] = _Block("redacted", content.data)
                        elif isinstance(content, ToolUseBlock) and content.name == output.name:
                            blocks[event.index] = _Block("output", whole=_whole(content.input))
                        elif isinstance(content, ToolUseBlock):
                            name = names.handrail(content.name)
                            blocks[event.index] = _Block(
                                "call",
                                id=content.id,
                                name=name,
                                call=calls,
                                whole=_whole(content.input),
                            )
                            yield ToolCallChunk(index=calls, id=content.id, name=name)
                            calls += 1
                        else:  # a hosted call or its result: kept as received
                            blocks[event.index] = _Block("server", raw=_server_block(content))
                    elif isinstance(event, RawContentBlockStopEvent):
                        block = _open_block(blocks, event.index)
                        whole = block.adopt_whole()
                        if whole and block.kind == "call":
                            yield ToolCallChunk(index=block.call, args_delta=whole)
                        elif whole and block.kind == "output" and not output.wrapped:
                            yield TextChunk(text=whole)
                        if block.kind == "output" and output.wrapped:
                            yield TextChunk(text=output.text(block.text))
                    elif isinstance(event, RawMessageStartEvent):
                        model_name = event.message.model
                        _count(usage, event.message.usage)
                    elif isinstance(event, RawMessageDeltaEvent):
                        stop = event.delta.stop_reason or stop
                        _count(usage, event.usage)
                    elif isinstance(event, RawMessageStopEvent):
                        stopped = True
        except Exception as exc:
            why = body_broken(exc, connection_error=anthropic.APIConnectionError)
            if why is None:
                raise
            if not stopped:
                raise incomplete(PROVIDER, "message_stop", why) from exc
            # Cut after the last event: nothing of the answer was lost.
        if not stopped:
            # The SDK ends quietly on a body that ends early.
            raise incomplete(PROVIDER, "message_stop", "the body ended with no error")
        parts: list[TextPart | ReasoningPart | ToolCallPart | dict[str, Any]] = []
        for index, block in sorted(blocks.items()):
            block.adopt_whole()  # a block whose content_block_stop never came
            if block.kind == "server":
                parts.append(_server_input(block, index))
            elif block.kind == "text":
                parts.append(TextPart(text=block.text, citations=block.citations or None))
            elif block.kind in ("thinking", "redacted"):
                parts.append(
                    ReasoningPart(
                        text=block.text,
                        signature=block.signature,
                        provider=PROVIDER,
                        redacted=block.kind == "redacted",
                    )
                )
            elif block.kind == "output":
                parts.append(TextPart(text=output.text(block.text)))
            elif block.kind == "call":
                parts.append(ToolCallPart(id=block.id, name=block.name, raw_args=block.text))
        yield ModelResponse(
            parts=hosted_parts(parts, hosted.tools, hosted.history),
            usage=usage,
            stop_reason=stop,
            finish_reason=finish_reason(stop),
            model_name=model_name,
        )

    async def _complete(
        self, body: dict[str, Any], names: ToolNames, output: _Output, hosted: _Hosted
    ) -> AsyncGenerator[ModelChunk, None]:
        try:
            message = cast(
                AnthropicMessage,
                await self.client.messages.create(model=self.model_name, **body),
            )
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            # A body that ended early while the transport saw a proper end (a body delimited
            # by closing the connection, or a server's bug): the SDK fails to parse it.
            why = body_broken(exc, connection_error=anthropic.APIConnectionError)
            raise incomplete(PROVIDER, "complete JSON body", str(why)) from exc
        usage = Usage(requests=1)
        _count(usage, message.usage)
        parts: list[TextPart | ReasoningPart | ToolCallPart | dict[str, Any]] = []
        calls = 0
        for content in message.content:
            if isinstance(content, TextBlock):
                parts.append(TextPart(text=content.text, citations=_citations(content) or None))
                yield TextChunk(text=content.text)
            elif isinstance(content, ThinkingBlock):
                parts.append(
                    ReasoningPart(
                        text=content.thinking,
                        signature=content.signature,
                        provider=PROVIDER,
                        redacted=False,
                    )
                )
                if content.thinking:
                    yield ReasoningChunk(text=content.thinking)
            elif isinstance(content, RedactedThinkingBlock):
                parts.append(
                    ReasoningPart(text="", signature=content.data, provider=PROVIDER, redacted=True)
                )
            elif isinstance(content, ToolUseBlock) and content.name == output.name:
                text = output.text(pydantic_core.to_json(content.input).decode())
                parts.append(TextPart(text=text))
                yield TextChunk(text=text)
            elif isinstance(content, ToolUseBlock):
                name = names.handrail(content.name)
                # Kept as the model's own text: later requests show it the input it sent.
                raw = pydantic_core.to_json(cast(dict[str, Any], content.input)).decode()
                parts.append(ToolCallPart(id=content.id, name=name, raw_args=raw))
                yield ToolCallChunk(index=calls, id=content.id, name=name, args_delta=raw)
                calls += 1
            else:  # a hosted call or its result: kept as received
                parts.append(_server_block(content))
        yield ModelResponse(
            parts=hosted_parts(parts, hosted.tools, hosted.history),
            usage=usage,
            stop_reason=message.stop_reason,
            finish_reason=finish_reason(message.stop_reason),
            model_name=message.model,
        )


_EVENTS = frozenset(
    {
        "message_start",
        "message_delta",
        "message_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    }
)
"""The stream events handrail reads (`ping` and `error` the SDK handles); others are ignored."""

_DELTAS: dict[str, tuple[str, ...]] = {
    "text_delta": ("text",),
    "input_json_delta": ("call", "output", "server"),
    "thinking_delta": ("thinking",),
    "signature_delta": ("thinking",),
    "citations_delta": ("text",),
}
"""Which blocks each type of delta may extend (a hosted call's input streams as JSON; its
result block comes whole); a delta type not listed is ignored (the SDK builds one as a
`TextDelta`, so the type, not the class, says what it is)."""


def _citations(block: TextBlock) -> list[dict[str, Any]]:
    """A text block's citations, as received."""
    return [c.to_dict(mode="json") for c in block.citations or []]


def _server_block(content: Any) -> dict[str, Any]:
    """A hosted call's block (or its result's) as received, or a refusal of an unknown block.

    An unknown block is never dropped (the next request would lose it) nor acted on: the
    response is refused, naming the block.
    """
    kind = getattr(content, "type", None)
    known = kind in SERVER_BLOCKS and (
        kind != "server_tool_use" or getattr(content, "name", None) in HOSTED_CALLS
    )
    if not known:
        what = f"{kind!r}" + (
            f" (a server tool named {getattr(content, 'name', None)!r})"
            if kind == "server_tool_use"
            else ""
        )
        raise ModelError(
            f"{PROVIDER}: the response has a content block of type {what}, which handrail "
            f"cannot read or send back; the response was refused rather than dropped in part. "
            f"Remove the tool that produces it, or upgrade handrail."
        )
    raw: dict[str, Any] = content.to_dict(mode="json")
    return raw


def _server_input(block: _Block, index: int) -> dict[str, Any]:
    """A streamed hosted block, its input made whole from the pieces it came in."""
    raw = block.raw
    assert raw is not None
    if raw.get("type") != "server_tool_use" or not block.pieces:
        return raw
    try:
        value = json.loads(block.text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise _stream_error(f"the input of server tool call {index} is not a JSON object")
    return {**raw, "input": value}


def _stream_error(what: str) -> ModelError:
    return ModelError(
        f"{PROVIDER}: the streamed message cannot be read without guessing: {what}. The "
        f"response was refused rather than guessed at."
    )


def _open_block(blocks: dict[int, _Block], index: int) -> _Block:
    block = blocks.get(index)
    if block is None:
        raise _stream_error(f"an event for content block {index}, which never started")
    return block


def _check_delta(block: _Block, delta: Any, index: int) -> None:
    """Refuse a delta that does not belong to its block (text into a call's input, say)."""
    kinds = _DELTAS.get(delta.type)
    if kinds is not None and block.kind not in kinds:
        raise _stream_error(
            f"{getattr(delta, 'type', type(delta).__name__)} for content block {index}, which "
            f"is a {block.kind} block"
        )


def _whole(value: object) -> str:
    """A tool's input as `content_block_start` gave it: JSON text, or "" when it is empty.

    Anthropic starts a `tool_use` block with `input: {}` and streams the input after it; some
    gateways (LiteLLM, Bedrock and Vertex proxies) give it whole here instead.
    """
    return pydantic_core.to_json(value).decode() if value else ""


class _Block:
    """A content block being streamed.

    A tool's input is what its `input_json_delta` pieces say, and when they say nothing, the
    input its `content_block_start` gave whole (`whole`): the SDK's `MessageStream` does the
    same (it starts from the block's input and replaces it with the deltas' JSON once a delta
    brings any text).
    """

    __slots__ = (
        "call",
        "citations",
        "id",
        "kind",
        "name",
        "pieces",
        "raw",
        "signature",
        "whole",
    )

    def __init__(
        self,
        kind: Literal["text", "thinking", "redacted", "call", "output", "server"],
        signature: str | None = None,
        *,
        id: str = "",
        name: str = "",
        call: int = 0,
        raw: dict[str, Any] | None = None,
        whole: str = "",
    ) -> None:
        self.raw = raw
        self.whole = whole
        self.citations: list[dict[str, Any]] = []
        self.kind = kind
        self.signature = signature
        self.id = id
        self.name = name
        self.call = call
        self.pieces: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def adopt_whole(self) -> str:
        """Take the input given whole when no delta brought any text; what was taken, or ""."""
        whole, self.whole = self.whole, ""
        if not whole or any(self.pieces):
            return ""
        self.pieces = [whole]
        return whole


class _Hosted:
    """A request's hosted tools, and its history (where a late result's call is)."""

    __slots__ = ("history", "tools")

    def __init__(self, tools: Sequence[HostedTool], history: Sequence[Message]) -> None:
        self.tools = list(tools)
        self.history = history


class _Output:
    """The structured-output tool of a request, if it has one."""

    __slots__ = ("name", "wrapped")

    def __init__(self, body: dict[str, Any], schema: dict[str, Any] | None) -> None:
        # `anthropic_request` appends the output tool last.
        self.name: str | None = body["tools"][-1]["name"] if schema is not None else None
        self.wrapped = schema is not None and output_is_wrapped(schema)

    def text(self, arguments: str) -> str:
        """The answer as JSON text, from the output tool's arguments."""
        if not self.wrapped:
            return arguments
        try:
            value = pydantic_core.from_json(arguments or "{}")
        except ValueError:
            return arguments
        if not isinstance(value, dict) or "response" not in value:
            return arguments
        return pydantic_core.to_json(value["response"]).decode()


def _count(usage: Usage, reported: Any) -> None:
    """Fold Anthropic's (cumulative) usage into `usage`.

    Anthropic counts cache reads and writes apart from `input_tokens`; handrail's
    `input_tokens` is every prompt token, of which `cached_tokens` were read from the cache.
    """
    output = reported.output_tokens
    if output is not None:
        usage.output_tokens = output
    fresh = reported.input_tokens
    if fresh is None:
        return
    read = reported.cache_read_input_tokens or 0
    written = reported.cache_creation_input_tokens or 0
    usage.input_tokens = fresh + read + written
    usage.cached_tokens = read
