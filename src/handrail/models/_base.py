"""The `Model` protocol and what flows through it (public from `handrail.models`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from ..messages import Message, ReasoningPart, TextPart, ToolCallPart
from ..tools._definition import HostedTool, ToolDefinition

__all__ = [
    "FinishReason",
    "Model",
    "ModelChunk",
    "ModelRequest",
    "ModelResponse",
    "ReasoningChunk",
    "TextChunk",
    "ToolCallChunk",
    "Usage",
]


@dataclass(kw_only=True, slots=True)
class Usage:
    """Tokens and requests, added up over a run."""

    requests: int = 0
    """Model calls made."""
    input_tokens: int = 0
    """Prompt tokens."""
    output_tokens: int = 0
    """Completion tokens."""
    cached_tokens: int = 0
    """Prompt tokens served from the provider's cache."""
    reasoning_tokens: int = 0
    """Output tokens the model spent reasoning (counted in `output_tokens` too), where the
    provider says: OpenAI's `reasoning_tokens` in both APIs."""
    tool_calls: int = 0
    """Tool calls dispatched."""
    invalid_tool_calls: int = 0
    """Tool calls whose arguments were not JSON even after repair (sent back as tool errors)."""

    def add(self, other: Usage) -> None:
        """Add `other` into this usage, in place."""
        self.requests += other.requests
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cached_tokens += other.cached_tokens
        self.reasoning_tokens += other.reasoning_tokens
        self.tool_calls += other.tool_calls
        self.invalid_tool_calls += other.invalid_tool_calls


@dataclass(kw_only=True, slots=True)
class ModelRequest:
    """One call to a model."""

    agent: str
    """The agent making the call."""
    instructions: str | None
    """The system prompt."""
    messages: list[Message]
    """The conversation so far (tool results ride inside their call parts)."""
    tools: list[ToolDefinition] = field(default_factory=list)
    """The tools the model may call (function tools: handrail runs them)."""
    hosted_tools: list[HostedTool] = field(default_factory=list)
    """The tools the model provider runs itself mid-response (`web_search()`, ...). A model
    that cannot run one raises `HostedToolError` before sending anything."""
    tool_choice: Literal["auto", "none", "required"] = "auto"
    """`none` asks for a final answer without tool calls."""
    output_schema: dict[str, Any] | None = None
    """JSON Schema the final answer must follow (structured output), if any."""
    session_id: str | None = None
    """The session the call is made for, when there is one (not sent to a provider: the
    test models number their calls per session with it)."""


@dataclass(kw_only=True, slots=True)
class TextChunk:
    """A piece of streamed answer text."""

    text: str


@dataclass(kw_only=True, slots=True)
class ReasoningChunk:
    """A piece of streamed reasoning."""

    text: str


@dataclass(kw_only=True, slots=True)
class ToolCallChunk:
    """A piece of a streamed tool call (its arguments arrive in pieces)."""

    index: int
    """Which call of the response this piece belongs to."""
    id: str | None = None
    """The call id, on the first piece."""
    name: str | None = None
    """The tool name, on the first piece."""
    args_delta: str = ""
    """More of the JSON arguments."""


FinishReason: TypeAlias = Literal["stop", "tool_call", "length", "content_filter", "pause", "other"]
"""Why a model stopped, whatever the provider: `stop` (it finished its answer), `tool_call`
(it stopped to have tools called), `length` (cut by the output token limit: OpenAI's `length`,
Anthropic's `max_tokens`), `content_filter` (cut by the provider's filter or a refusal),
`pause` (the provider paused a long turn of its own hosted tools, Anthropic's `pause_turn`:
the loop sends the conversation back as it is, and the model continues) and `other` (a reason
the adapter does not know; treated as unfinished)."""


@dataclass(kw_only=True, slots=True)
class ModelResponse:
    """The complete answer of one model call: the last item of every stream."""

    parts: list[TextPart | ReasoningPart | ToolCallPart]
    """What the model said, in order."""
    usage: Usage = field(default_factory=lambda: Usage(requests=1))
    """What the call cost."""
    stop_reason: str | None = None
    """Why the model stopped (`end_turn`, `tool_calls`, `max_tokens`, ...), as the provider
    says it."""
    finish_reason: FinishReason | None = None
    """Why the model stopped, in one vocabulary for every provider (see `FinishReason`).

    The agent loop runs the tool calls of a response only when it is `stop` or `tool_call`
    (or None: a model of your own that does not say); a response cut by `length`,
    `content_filter` or for an `other` reason is never acted on."""
    model_name: str | None = None
    """The model that answered."""
    provider_details: dict[str, Any] | None = None
    """What else the provider said of the response, as it said it, when it said something:
    Azure OpenAI's content-filter verdicts (`prompt_filter_results`, and the answer's
    `content_filter_results` in the order they came)."""


ModelChunk: TypeAlias = TextChunk | ReasoningChunk | ToolCallChunk | ModelResponse


@runtime_checkable
class Model(Protocol):
    """Anything that can answer a `ModelRequest` as a stream.

    `stream` yields any number of chunks and then exactly one `ModelResponse`.
    """

    @property
    def name(self) -> str:
        """A name for logs and usage (`openai:gpt-4o-mini`, `scripted`)."""
        ...

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Stream the answer to `request`."""
        ...
