"""`FunctionModel`: a model whose every answer is computed by a Python function.

The deterministic, offline way to fake a model in tests (PydanticAI's `FunctionModel`): the
function receives the `ModelRequest` and returns a *step*, which is any of

- a `str`: a text answer,
- a tool call made with `call(...)` (or `call_raw(...)` for malformed arguments),
- a `reasoning(...)` part,
- a call the model provider ran, with its result, made with `hosted_call(...)` (a hosted web
  search, code execution or web fetch: the agent shows it and does not run it),
- a list of the above: one answer with several parts (parallel tool calls, text + calls),
- a complete `ModelResponse`, played as it is (its `finish_reason` included: a step can be
  an answer cut by `length`).

The response's `finish_reason` is `tool_call` when the step has calls, else `stop`.

Text is streamed word by word, as a real provider would, so streaming paths are exercised.
"""

from __future__ import annotations

import copy
import inspect
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeAlias

import pydantic_core

from ..messages import ReasoningPart, TextPart, ToolCallPart
from . import ModelChunk, ModelRequest, ModelResponse, ReasoningChunk, TextChunk, Usage

__all__ = ["FunctionModel", "Step", "call", "call_raw", "reasoning"]

StepPart: TypeAlias = str | TextPart | ReasoningPart | ToolCallPart
Step: TypeAlias = StepPart | Sequence[StepPart] | ModelResponse
"""What a scripted or computed model turn may be (see the module docstring)."""

_WORDS = re.compile(r"\s*\S+\s*|\s+")


def call(
    name: str, args: dict[str, Any] | None = None, /, *, id: str | None = None, **kwargs: Any
) -> ToolCallPart:
    """A tool call for a scripted model turn.

    The arguments are sent as a JSON string, as real providers send them, so the dispatch
    pipeline parses them exactly as it would in production.

    Args:
        name: the tool to call.
        args: the arguments as a dict (or give them as keyword arguments).
        id: the tool call id; by default the model numbers its calls `call_1`, `call_2`, ...
            in each session (a new session's first call is `call_1` again)
        **kwargs: the arguments, when `args` is not given.
    """
    payload = {**(args or {}), **kwargs}
    return ToolCallPart(id=id or "", name=name, raw_args=pydantic_core.to_json(payload).decode())


def call_raw(name: str, raw_args: str, /, *, id: str | None = None) -> ToolCallPart:
    """A tool call whose arguments are sent verbatim (for example malformed JSON)."""
    return ToolCallPart(id=id or "", name=name, raw_args=raw_args)


def reasoning(text: str, *, signature: str | None = None) -> ReasoningPart:
    """A reasoning part for a scripted model turn."""
    return ReasoningPart(text=text, signature=signature)


class FunctionModel:
    """A model that answers each request by calling `function(request)`.

    Args:
        function: computes the step for a request; may be sync or async.
        name: a name for logs and usage.

    Attributes:
        calls: every request received, in order (a snapshot of its messages list).
    """

    def __init__(
        self,
        function: Callable[[ModelRequest], Step | Awaitable[Step]],
        *,
        name: str = "function",
    ) -> None:
        self._function = function
        self._name = name
        self._call_ids: dict[str | None, int] = {}  # calls numbered so far, by session
        self.calls: list[ModelRequest] = []

    provider = "handrail.testing"
    """Who runs it, as tracing names it: a test double, whatever its name says."""

    @property
    def name(self) -> str:
        """The model's name."""
        return self._name

    @property
    def model_name(self) -> str:
        """The model's name, as tracing reports it (`gen_ai.request.model`)."""
        return self._name

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Compute the answer, then stream it: reasoning and text in words, then the response."""
        self.calls.append(_snapshot(request))
        step = self._function(request)
        if inspect.isawaitable(step):
            step = await step
        response = self._to_response(step, request.session_id)
        for part in response.parts:
            if isinstance(part, TextPart):
                for word in _WORDS.findall(part.text):
                    yield TextChunk(text=word)
            elif isinstance(part, ReasoningPart):
                for word in _WORDS.findall(part.text):
                    yield ReasoningChunk(text=word)
        yield response

    def _next_id(self, session_id: str | None) -> str:
        """`call_1`, `call_2`, ... within a session: a new session's first call is `call_1`."""
        number = self._call_ids.get(session_id, 0) + 1
        self._call_ids[session_id] = number
        return f"call_{number}"

    def _to_response(self, step: Step, session_id: str | None = None) -> ModelResponse:
        if isinstance(step, ModelResponse):
            return step
        if isinstance(step, str | TextPart | ReasoningPart | ToolCallPart):
            items: Sequence[Any] = [step]
        elif isinstance(step, list | tuple):
            items = step
        else:
            items = [step]  # refused below, naming what a step may be
        parts: list[TextPart | ReasoningPart | ToolCallPart] = []
        for item in items:
            if isinstance(item, str):
                parts.append(TextPart(text=item))
            elif isinstance(item, ToolCallPart) and item.executor == "provider":
                # A call the provider ran (`hosted_call`), result and all: a fresh copy.
                hosted = copy.deepcopy(item)
                if not hosted.id:
                    hosted.id = self._next_id(session_id)
                parts.append(hosted)
            elif isinstance(item, ToolCallPart):
                call_id = item.id or self._next_id(session_id)
                # A fresh part each time: a script may be replayed, parts are mutated by dispatch.
                parts.append(
                    ToolCallPart(
                        id=call_id,
                        name=item.name,
                        args=dict(item.args),
                        raw_args=item.raw_args,
                    )
                )
            elif isinstance(item, TextPart | ReasoningPart):
                parts.append(item)
            else:
                raise TypeError(
                    f"A model step must be a str, call(...), reasoning(...), a list of those or a "
                    f"ModelResponse; got {type(item).__name__}"
                )
        # Calls the provider ran (`hosted_call`) are not calls for handrail to make.
        calls = any(isinstance(p, ToolCallPart) and p.executor != "provider" for p in parts)
        return ModelResponse(
            parts=parts,
            usage=Usage(requests=1),
            stop_reason="tool_use" if calls else "end_turn",
            finish_reason="tool_call" if calls else "stop",
            model_name=self._name,
        )


def _snapshot(request: ModelRequest) -> ModelRequest:
    return ModelRequest(
        agent=request.agent,
        instructions=request.instructions,
        messages=list(request.messages),
        tools=request.tools,
        hosted_tools=request.hosted_tools,
        tool_choice=request.tool_choice,
        output_schema=request.output_schema,
        session_id=request.session_id,
    )
