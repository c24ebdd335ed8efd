"""Tracing: OpenTelemetry spans for turns, routing, agents, model calls, tools and suspensions.

Off unless a runtime is given one (`Runtime(tracing=Tracing())`, behind the `otel` extra), so
a run without it pays one `is None` check per step. Spans follow the OpenTelemetry GenAI
semantic conventions; the turn, the route decision and a suspension use `handrail.*` names.

- `handrail.turn`, a root span: `gen_ai.conversation.id` (the session id),
  `handrail.session.id`, `handrail.run.id`, `handrail.outcome`, `handrail.resumed`. A resumed
  turn links to the turn that suspended and has one `handrail.decision` event per decision
  it acts on (`gen_ai.tool.call.id`, `gen_ai.tool.name`, `handrail.decision`,
  `handrail.decision.kind`, `handrail.decision.by`, `handrail.decision.amended`: the names of
  the amended arguments).
- `invoke_agent {agent}` (INTERNAL): `gen_ai.operation.name`, `gen_ai.agent.name`,
  `gen_ai.provider.name`, `gen_ai.request.model`, `gen_ai.conversation.id`.
- `chat {model}` (CLIENT): the same but the agent's name, and `gen_ai.usage.input_tokens`,
  `gen_ai.usage.output_tokens`, `gen_ai.usage.cache_read.input_tokens`,
  `gen_ai.usage.reasoning.output_tokens`, `gen_ai.response.finish_reasons`,
  `gen_ai.response.model`. Calls the provider ran itself (hosted tools) ran inside the chat
  call, so they have no `execute_tool` span; their events say what they did.
- `execute_tool {tool}` (INTERNAL): `gen_ai.operation.name`, `gen_ai.tool.name`,
  `gen_ai.tool.call.id`, `gen_ai.tool.description`, `gen_ai.tool.type` (`function`),
  `gen_ai.conversation.id`, `handrail.tool.status`.
- `handrail.route` and `handrail.suspension` (INTERNAL), under the turn.

`gen_ai.provider.name` is the model's `provider` (`openai`, `anthropic`, or the `provider=`
given to a compatible endpoint; `openai` for `OpenAIResponsesModel`, whose own name is
`openai-responses`), else the `provider:` prefix of its name;
`handrail.testing` for the test doubles (`ScriptedModel`, `FunctionModel`, which say so
with their `provider`) and `_OTHER` for a model that says neither. `gen_ai.request.model`
is the model's name without that prefix (`gpt-4o-mini`).

A failed span has an error status and `error.type`: the exception's class name
(`ModelError`), `tool_error` for a tool call whose result is an error, `max_iterations` or
`interrupted` for a turn that stopped there. A tool that raised also has an `exception` event
on its `execute_tool` span (`exception.type`, `exception.message`, `exception.stacktrace`)
with `handrail.error.reference`, the reference the model read and the log names.

Messages, instructions, tool definitions, tool arguments and results and a reviewer's
amendments are recorded only with `Tracing(capture_content=True)` (`gen_ai.input.messages`,
`gen_ai.output.messages`, `gen_ai.system_instructions`, `gen_ai.tool.definitions`,
`gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`, as JSON).

The spans of the code that handrail calls are current: a span opened by a tool (or by an
instrumented HTTP client inside it or inside a model) nests under `execute_tool` or `chat`.
The turn and agent spans are parents given explicitly: a run's steps are async generators
that resume in their consumer's context, where a span made current inside them would leak.

```python
from opentelemetry.sdk.trace import TracerProvider

runtime = Runtime(model=model, tracing=Tracing(TracerProvider()))
```
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pydantic_core

from .exceptions import MissingExtraError
from .messages import Message, ReasoningPart, TextPart, ToolCallPart

if TYPE_CHECKING:
    from opentelemetry.trace import Link, Span, SpanKind, Tracer

    from .messages import ApprovalCardPart
    from .models import Model, ModelRequest, ModelResponse, ToolDefinition

__all__ = ["Tracing"]

_SEMCONV_PROVIDERS = {"openai-responses": "openai"}
"""handrail's provider names that are not the GenAI conventions' (both APIs are OpenAI's)."""

AttributeValue = str | bool | int | float | Sequence[str]
T = TypeVar("T")


class Tracing:
    """Makes handrail's spans with an OpenTelemetry tracer.

    Args:
        provider: the `TracerProvider` to use (default: the global one, as configured by
            the application or an OpenTelemetry distro).
        capture_content: record what was said: messages, instructions, tool definitions,
            tool arguments and results, amended arguments (default: off, as the GenAI
            conventions ask, since they may hold personal data).

    Raises:
        MissingExtraError: OpenTelemetry is not installed (`pip install "handrail[otel]"`).
    """

    __slots__ = ("_context", "_trace", "_tracer", "capture_content")

    def __init__(self, provider: Any = None, *, capture_content: bool = False) -> None:
        try:
            from opentelemetry import context, trace
        except ImportError as exc:  # pragma: no cover - the dev extra installs it
            raise MissingExtraError("Tracing", needs="OpenTelemetry", extra="otel") from exc
        self._tracer: Tracer = trace.get_tracer("handrail", tracer_provider=provider)
        self._trace = trace
        self._context = context
        self.capture_content = capture_content
        """Whether message and argument content is recorded (see `Tracing`)."""

    def start(
        self,
        name: str,
        parent: Span | None,
        attributes: Mapping[str, AttributeValue],
        *,
        client: bool = False,
        links: Sequence[Link] = (),
    ) -> Span:
        """Start a span under `parent` (a root span when None), without making it current.

        Args:
            name: the span's name.
            parent: its parent.
            attributes: its attributes.
            client: a CLIENT span (a call to a model), not an INTERNAL one.
            links: spans it is linked to (`resumed_from`).
        """
        trace = self._trace
        context = trace.set_span_in_context(parent) if parent is not None else None
        kind: SpanKind = trace.SpanKind.CLIENT if client else trace.SpanKind.INTERNAL
        return self._tracer.start_span(
            name, context=context, kind=kind, attributes=attributes, links=links
        )

    def fail(self, span: Span, error: str, error_type: str) -> None:
        """Mark `span` as failed.

        Args:
            span: the span.
            error: the status description.
            error_type: its `error.type`: an exception's class name, or one of the values
                listed in the module's docstring.
        """
        trace = self._trace
        span.set_status(trace.Status(trace.StatusCode.ERROR, error))
        span.set_attribute("error.type", error_type)

    def exception(self, span: Span, error: BaseException, reference: str) -> None:
        """Record what a tool raised on its span, as an `exception` event.

        The event has the exception's type, message and stack trace, and the
        `handrail.error.reference` that the model read and the log names.
        """
        span.record_exception(error, attributes={"handrail.error.reference": reference})

    def current(self, span: Span) -> Any:
        """A context manager that makes `span` current (and does not end it).

        For code that runs within one task, never across a `yield`.
        """
        return self._trace.use_span(
            span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        )

    async def within(self, span: Span, stream: AsyncIterator[T]) -> AsyncGenerator[T, None]:
        """Iterate `stream` with `span` current while each item is made.

        Not while it is consumed: the generator this runs in yields to a consumer whose
        context must not change.
        """
        context = self._trace.set_span_in_context(span)
        attach, detach = self._context.attach, self._context.detach
        iterator = aiter(stream)
        try:
            while True:
                token = attach(context)
                try:
                    item = await anext(iterator)
                except StopAsyncIteration:
                    return
                finally:
                    detach(token)
                yield item
        finally:
            close = getattr(iterator, "aclose", None)
            if close is not None:
                token = attach(context)
                try:
                    await close()
                finally:
                    detach(token)

    # -- attributes ------------------------------------------------------------------------

    def model_attributes(self, model: Model, session_id: str | None) -> dict[str, AttributeValue]:
        """`gen_ai.provider.name`, `gen_ai.request.model` and `gen_ai.conversation.id`."""
        name = model.name
        provider = getattr(model, "provider", None)
        model_name = getattr(model, "model_name", None)
        if not isinstance(provider, str) or not isinstance(model_name, str):
            prefix, colon, rest = name.partition(":")
            if colon:
                provider, model_name = prefix, rest
            else:
                provider, model_name = "_OTHER", name
        attributes: dict[str, AttributeValue] = {
            "gen_ai.provider.name": _SEMCONV_PROVIDERS.get(provider, provider),
            "gen_ai.request.model": model_name,
        }
        if session_id:
            attributes["gen_ai.conversation.id"] = session_id
        return attributes

    def request_content(self, span: Span, request: ModelRequest) -> None:
        """Record a chat request's instructions, messages and tools (content capture only)."""
        attributes: dict[str, AttributeValue] = {
            "gen_ai.input.messages": _json(_messages(request.messages))
        }
        if request.instructions:
            attributes["gen_ai.system_instructions"] = _json(
                [{"type": "text", "content": request.instructions}]
            )
        if request.tools:
            attributes["gen_ai.tool.definitions"] = _json(_tools(request.tools))
        span.set_attributes(attributes)

    def response(self, span: Span, response: ModelResponse) -> None:
        """Record a chat response's usage and finish reason (and its content, if captured)."""
        usage = response.usage
        attributes: dict[str, AttributeValue] = {
            "gen_ai.usage.input_tokens": usage.input_tokens,
            "gen_ai.usage.output_tokens": usage.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,
            "gen_ai.usage.reasoning.output_tokens": usage.reasoning_tokens,
            "gen_ai.response.finish_reasons": [
                response.finish_reason or response.stop_reason or ""
            ],
        }
        if response.model_name:
            attributes["gen_ai.response.model"] = response.model_name
        if self.capture_content:
            message = Message(id="", role="assistant", parts=list(response.parts))
            output = _messages([message])
            for item in output:
                item["finish_reason"] = response.finish_reason or "stop"
            attributes["gen_ai.output.messages"] = _json(output)
        span.set_attributes(attributes)

    # -- a suspended turn and its resumption -----------------------------------------------

    @staticmethod
    def traceparent(span: Span) -> str:
        """`span`'s context as a W3C `traceparent` (stored with a suspended turn)."""
        context = span.get_span_context()
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"

    def resumed_from(self, traceparent: str) -> list[Link]:
        """A link to the span of a stored `traceparent` (none if it is empty or malformed)."""
        parts = traceparent.split("-")
        if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
            return []
        try:
            trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
        except ValueError:
            return []
        trace = self._trace
        context = trace.SpanContext(
            trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags)
        )
        if not context.is_valid:
            return []
        return [trace.Link(context, {"handrail.link": "resumes"})]

    def decisions(self, span: Span, cards: Iterable[ApprovalCardPart]) -> None:
        """Record each decision a resumed turn acts on as a `handrail.decision` event."""
        for card in cards:
            proposed = card.args
            amended = {  # the card holds all the arguments as approved
                k: v
                for k, v in (card.amended_args or {}).items()
                if k not in proposed or proposed[k] != v
            }
            attributes: dict[str, AttributeValue] = {
                "gen_ai.tool.call.id": card.tool_call_id,
                "gen_ai.tool.name": card.tool_name,
                "handrail.decision": card.decision or "",
                "handrail.decision.kind": card.kind,
                "handrail.decision.by": card.decided_by or "",
                "handrail.decision.amended": sorted(amended),
            }
            if self.capture_content:
                if amended:
                    attributes["handrail.decision.amended_args"] = _json(amended)
                if card.reason:
                    attributes["handrail.decision.reason"] = card.reason
            span.add_event("handrail.decision", attributes)


def _messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Messages in the GenAI conventions' shape: a tool call's result is a `tool` message."""
    out: list[dict[str, Any]] = []
    for message in messages:
        parts: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for part in message.parts:
            if isinstance(part, TextPart):
                parts.append({"type": "text", "content": part.text})
            elif isinstance(part, ReasoningPart):
                parts.append({"type": "reasoning", "content": part.text})
            elif isinstance(part, ToolCallPart):
                parts.append(
                    {"type": "tool_call", "id": part.id, "name": part.name, "arguments": part.args}
                )
                if part.result is not None:
                    result = part.result
                    response = result.data if result.ok else result.error
                    results.append(
                        {"type": "tool_call_response", "id": part.id, "response": response}
                    )
        if parts:
            out.append({"role": message.role, "parts": parts})
        if results:
            out.append({"role": "tool", "parts": results})
    return out


def _tools(tools: Iterable[ToolDefinition]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
        }
        for t in tools
    ]


def _json(value: Any) -> str:
    return pydantic_core.to_json(value, fallback=str).decode()
