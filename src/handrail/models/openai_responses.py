"""`OpenAIResponsesModel`: OpenAI's Responses API, the one with OpenAI's hosted tools.

```python
model = OpenAIResponsesModel("gpt-5")  # the key from OPENAI_API_KEY
summaries = OpenAIResponsesModel("gpt-5", settings={"reasoning": {"summary": "auto"}})
```

Stateless: every request is `store: false` and sends the whole conversation as input items
(handrail owns the history; `_responses_format` converts it), asking for the reasoning's
`encrypted_content`, which the next request sends back unchanged. Hosted tools (web search,
code interpreter) are declared and read by `_responses_format`: each call is one provider
part, its item kept as received and sent back in place. Text, reasoning summaries
and function-call arguments stream as they come; the answer's parts are read from the
terminal event's response (its `output`, `usage` and status). The client, its key, retries
(`RetryPolicy` alone) and error mapping are the Chat Completions model's
(`_openai_client`).

A streamed answer is whole once a terminal event came: `response.completed` (`stop`, or
`tool_call` when it holds function calls) or `response.incomplete` (`length` for
`max_output_tokens`, `content_filter`, else `other`; never acted on). A stream that ends
without one, cleanly or cut, raises `IncompleteResponseError`; `response.failed` and `error`
events raise `ModelHTTPError` (retried while nothing was streamed and the code may pass:
`server_error`, `rate_limit_exceeded`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from ..exceptions import MissingExtraError, ModelError
from ..messages import ReasoningPart, TextPart, ToolCallPart
from ..tools._hosted import HostedTool, check_hosted
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
from ._openai_format import request_tool_names
from ._responses_format import (
    HOSTED_KINDS,
    PROVIDER,
    readable,
    response_parts,
    responses_request,
    unknown_item,
)
from ._sdk import body_broken, incomplete
from ._wire import ToolNames
from .retry import Failure

try:
    import openai
    from openai.types.responses import (
        Response,
        ResponseCompletedEvent,
        ResponseErrorEvent,
        ResponseFailedEvent,
        ResponseFunctionCallArgumentsDeltaEvent,
        ResponseIncompleteEvent,
        ResponseOutputItemAddedEvent,
        ResponseOutputItemDoneEvent,
        ResponseReasoningSummaryPartAddedEvent,
        ResponseReasoningSummaryTextDeltaEvent,
        ResponseReasoningTextDeltaEvent,
        ResponseRefusalDeltaEvent,
        ResponseStreamEvent,
        ResponseTextDeltaEvent,
        ResponseUsage,
    )

    from ._openai_client import OpenAIClientModel
except ImportError as _error:  # pragma: no cover - exercised without the extra installed
    raise MissingExtraError("OpenAIResponsesModel", needs="openai", extra="openai") from _error

__all__ = ["OpenAIResponsesModel"]

TERMINAL = "terminal event (response.completed or response.incomplete)"
"""What a stream that ended early lacked (`IncompleteResponseError.missing`)."""

_INCOMPLETE: dict[str, FinishReason] = {
    "max_output_tokens": "length",
    "content_filter": "content_filter",
}
_RETRYABLE_CODES = frozenset({"server_error", "rate_limit_exceeded"})
"""Failure codes that may pass when the request is sent again."""


def finish_reason(status: str, reason: str | None, calls: bool) -> FinishReason:
    """A response's end in handrail's vocabulary.

    Args:
        status: `completed` or `incomplete` (any other: `other`).
        reason: `incomplete_details.reason` of an incomplete response.
        calls: whether the response holds function calls.
    """
    if status == "completed":
        return "tool_call" if calls else "stop"
    if status == "incomplete":
        return _INCOMPLETE.get(reason or "", "other")
    return "other"


class OpenAIResponsesModel(OpenAIClientModel):
    """A model served over OpenAI's Responses API (statelessly: `store: false`).

    Pick it over `OpenAIModel` (Chat Completions) for OpenAI's hosted tools and for reasoning
    models whose reasoning should carry from one request to the next; servers that speak only
    Chat Completions need `OpenAIModel`.

    Args:
        model: the model's name (`gpt-5`, `o4-mini`).
        api_key: the API key; by default `OPENAI_API_KEY`. Without either, and with no
            `base_url`, a `ConfigError` says which variable to set.
        base_url: another server that speaks the Responses API.
        client: an `AsyncOpenAI` client of your own (Azure, proxies, custom headers); it is
            used with its retries off, and closing this model leaves it open.
        retry: the retry policy (one policy for every provider).
        timeout: seconds to connect, and to wait for each piece of the response.
        stream: stream the answer (default), or ask for it in one piece.
        settings: more request parameters, sent as they are (`reasoning`,
            `max_output_tokens`, `temperature`, `extra_body`, ...); an `include` list is
            added to the one the model asks for.
        provider: the provider's name in the model name, in errors, and on the reasoning
            parts it produces.
    """

    default_provider = PROVIDER

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Stream the answer to `request`: chunks, then one `ModelResponse`.

        Raises:
            ModelHTTPError: the API failed for good, or the response failed (see
                `RetryPolicy`).
            IncompleteResponseError: the answer did not arrive whole (see `RetryPolicy`).
            ModelError: the stream did not follow the protocol (arguments for a call it never
                opened), or the response holds an item handrail cannot read.
            HostedToolError: a hosted tool the Responses API cannot run (`web_fetch()`), or an
                option its web search does not have (raised before anything is sent).
        """
        check_hosted(
            repr(self),
            request.hosted_tools,
            HOSTED_KINDS,
            "the Responses API has no web fetch; use web_search(), or AnthropicModel for "
            "web_fetch()",
        )
        names = request_tool_names(request.tools, request.messages)
        body = responses_request(request, names, self.provider)
        settings = dict(self.settings)
        include = settings.pop("include", None) or ()
        body.update(settings)
        body["include"] += [i for i in include if i not in body["include"]]
        hosted = list(request.hosted_tools)
        attempt = self._stream if self.streaming else self._complete
        return self.retry.stream(
            self.provider, lambda: attempt(body, names, hosted), self._describe
        )

    def _describe(self, exc: Exception) -> Failure | None:
        if isinstance(exc, _Failed):
            return Failure(
                status=None, message=exc.message, retryable=exc.retryable, request_id=exc.request_id
            )
        return super()._describe(exc)

    async def _stream(
        self, body: dict[str, Any], names: ToolNames, hosted: list[HostedTool]
    ) -> AsyncGenerator[ModelChunk, None]:
        stream = await self.client.responses.create(model=self.model_name, stream=True, **body)
        request_id = stream.response.headers.get("x-request-id")
        reader = _Reader(self.provider, names)
        final: Response | None = None
        try:
            async with stream:
                event: ResponseStreamEvent
                async for event in stream:
                    if isinstance(event, ResponseCompletedEvent | ResponseIncompleteEvent):
                        final = event.response
                        break
                    if isinstance(event, ResponseFailedEvent):
                        error = event.response.error
                        raise _Failed(
                            "the response failed",
                            error.message if error is not None else None,
                            error.code if error is not None else None,
                            request_id,
                        )
                    if isinstance(event, ResponseErrorEvent):
                        raise _Failed("an error event", event.message, event.code, request_id)
                    chunk = reader.read(event)
                    if chunk is not None:
                        yield chunk
        except Exception as exc:
            why = body_broken(exc, connection_error=openai.APIConnectionError)
            if why is None:
                raise
            if final is None:
                raise incomplete(self.provider, TERMINAL, why) from exc
            # The terminal event had come: only the end of the body was lost.
        if final is None:
            # The SDK ends quietly on a body that ends early.
            raise incomplete(self.provider, TERMINAL, "the body ended with no error")
        yield _response(final, names, hosted, self.provider, reader.done)

    async def _complete(
        self, body: dict[str, Any], names: ToolNames, hosted: list[HostedTool]
    ) -> AsyncGenerator[ModelChunk, None]:
        try:
            response = cast(
                Response, await self.client.responses.create(model=self.model_name, **body)
            )
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            # A body that ended early while the transport saw a proper end.
            why = body_broken(exc, connection_error=openai.APIConnectionError)
            raise incomplete(self.provider, "complete JSON body", str(why)) from exc
        if response.status == "failed":
            error = response.error
            raise _Failed(
                "the response failed",
                error.message if error is not None else None,
                error.code if error is not None else None,
                None,
            )
        if response.status not in ("completed", "incomplete"):
            raise incomplete(self.provider, "finished status", f"its status is {response.status!r}")
        whole = _response(response, names, hosted, self.provider, [])
        calls = 0
        for part in whole.parts:
            if isinstance(part, ReasoningPart):
                if part.text:
                    yield ReasoningChunk(text=part.text)
            elif isinstance(part, TextPart):
                yield TextChunk(text=part.text)
            elif part.executor != "provider":  # a hosted call is shown by the loop, not streamed
                yield ToolCallChunk(
                    index=calls, id=part.id, name=part.name, args_delta=part.raw_args or ""
                )
                calls += 1
        yield whole


class _Failed(Exception):
    """A response the API reported as failed (`response.failed`, an `error` event)."""

    def __init__(
        self, what: str, message: str | None, code: str | None, request_id: str | None
    ) -> None:
        said = message or what
        self.message = f"{said} ({code})" if code else said
        self.retryable = code is None or code in _RETRYABLE_CODES
        self.request_id = request_id
        super().__init__(self.message)


class _Reader:
    """Turns a response's stream events into chunks, and keeps its finished items.

    Function calls are numbered in the order they start (`ToolCallChunk.index`); each one's
    argument deltas name its `output_index`. A delta for an output that is not an open
    function call is a `ModelError`: it cannot be placed without guessing; so is an item of a
    type handrail cannot read, as soon as it is announced. Hosted calls stream nothing: the
    loop shows them once the response is whole.
    """

    __slots__ = ("_calls", "_names", "_provider", "done")

    def __init__(self, provider: str, names: ToolNames) -> None:
        self._provider = provider
        self._names = names
        self._calls: dict[int, int] = {}
        self.done: list[tuple[int, dict[str, Any]]] = []
        """The items of `response.output_item.done`, with their output index."""

    def read(self, event: ResponseStreamEvent) -> ModelChunk | None:
        """What to stream for one event (None: nothing)."""
        if isinstance(event, ResponseTextDeltaEvent | ResponseRefusalDeltaEvent):
            return TextChunk(text=event.delta) if event.delta else None
        if isinstance(
            event, ResponseReasoningSummaryTextDeltaEvent | ResponseReasoningTextDeltaEvent
        ):
            return ReasoningChunk(text=event.delta) if event.delta else None
        if isinstance(event, ResponseReasoningSummaryPartAddedEvent):
            # The parts of a summary are joined by a blank line in the reasoning part.
            return ReasoningChunk(text="\n\n") if event.summary_index > 0 else None
        if isinstance(event, ResponseFunctionCallArgumentsDeltaEvent):
            number = self._calls.get(event.output_index)
            if number is None:
                raise ModelError(
                    f"{self._provider}: function-call arguments came for output "
                    f"{event.output_index}, where no function call was opened; the response "
                    f"was refused rather than guessed at."
                )
            return ToolCallChunk(index=number, args_delta=event.delta) if event.delta else None
        if isinstance(event, ResponseOutputItemAddedEvent):
            item = event.item
            if not readable(item.type):
                raise unknown_item(item.type, self._provider)  # before anything after it streams
            if item.type == "function_call":
                number = self._calls[event.output_index] = len(self._calls)
                return ToolCallChunk(
                    index=number,
                    id=item.call_id,
                    name=self._names.handrail(item.name),
                    args_delta=item.arguments or "",
                )
            return None
        if isinstance(event, ResponseOutputItemDoneEvent):
            self.done.append((event.output_index, event.item.to_dict(mode="json")))
        return None


def _response(
    response: Response,
    names: ToolNames,
    hosted: list[HostedTool],
    provider: str,
    done: list[tuple[int, dict[str, Any]]],
) -> ModelResponse:
    """The `ModelResponse` of a finished response: its output (else the items streamed done)."""
    items = [item.to_dict(mode="json") for item in response.output]
    if not items:
        items = [item for _, item in sorted(done, key=lambda pair: pair[0])]
    parts = response_parts(items, names, hosted, provider)
    status = response.status or "completed"
    details = response.incomplete_details
    reason = details.reason if details is not None else None
    # Hosted calls ran at OpenAI: a response with only those is an answer.
    calls = any(isinstance(p, ToolCallPart) and p.executor != "provider" for p in parts)
    return ModelResponse(
        parts=parts,
        usage=_usage(response.usage),
        stop_reason=reason if status == "incomplete" and reason else status,
        finish_reason=finish_reason(status, reason, calls),
        model_name=response.model,
    )


def _usage(usage: ResponseUsage | None) -> Usage:
    if usage is None:
        return Usage(requests=1)
    cached = usage.input_tokens_details
    output = usage.output_tokens_details
    return Usage(
        requests=1,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cached_tokens=(cached.cached_tokens or 0) if cached is not None else 0,
        reasoning_tokens=(output.reasoning_tokens or 0) if output is not None else 0,
    )
