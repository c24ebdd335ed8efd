"""handrail's messages as OpenAI Responses API input items: pure functions, no SDK import.

The model is stateless (`store: false`): nothing is kept at OpenAI, so every request sends
the whole conversation as input items and handrail's history is the only copy.

- The instructions are the request's `instructions`; a stored `system` message stays a
  `system` message item.
- User text (the engine's `synthetic` nudges included) is a `user` message item.
- An assistant message becomes its items in the order of its parts: reasoning items, an
  `assistant` message item for each text, one `function_call` item a call (its `call_id`, the
  API's name for the tool, the arguments as the model sent them), then one
  `function_call_output` item a call, in the calls' order. A call still waiting for a
  decision reads `AWAITING_DECISION`; a failed one reads its error.
- Reasoning goes back only when this model's provider produced it (`ReasoningPart.provider`,
  `openai-responses` unless the model was given another name) and the part kept its item
  (`provider_blocks`): the item exactly as it came, `id`, `summary` and the
  `encrypted_content` asked for with `include`, which is what lets a stateless request carry
  the model's reasoning into the next. Other providers' reasoning is not sent.
- Message and function-call items go back without the ids OpenAI gave them: with
  `store: false` such an id names an item OpenAI did not keep.
- Approval cards are the UI's business; the model reads their outcome in the call's result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..messages import Message, ReasoningPart, TextPart, ToolCallPart
from . import ModelRequest, ToolDefinition
from ._openai_format import output_format, tool_arguments
from ._wire import ToolNames, result_text

__all__ = [
    "PROVIDER",
    "REASONING_INCLUDE",
    "responses_input",
    "responses_request",
    "responses_tools",
]

PROVIDER = "openai-responses"
"""The provider of the Responses model, and the `ReasoningPart.provider` of its reasoning."""
REASONING_INCLUDE = "reasoning.encrypted_content"
"""What a request asks to be included so that its reasoning can be sent back."""


def responses_input(
    messages: Sequence[Message], names: ToolNames, provider: str = PROVIDER
) -> list[dict[str, Any]]:
    """The Responses API `input` items for a conversation (the instructions are apart).

    Args:
        messages: the conversation.
        names: the request's tool-name mapping.
        provider: the model's provider name: only reasoning it produced is sent back.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role != "assistant":
            texts = [p.text for p in message.parts if isinstance(p, TextPart) and p.text]
            if texts:
                out.append({"role": message.role, "content": _content(texts)})
            continue
        outputs: list[dict[str, Any]] = []
        for part in message.parts:
            if isinstance(part, TextPart):
                if part.text:
                    out.append({"role": "assistant", "content": part.text})
            elif isinstance(part, ReasoningPart):
                if part.provider == provider and part.provider_blocks:
                    out.extend(part.provider_blocks)
            elif isinstance(part, ToolCallPart):
                out.append(
                    {
                        "type": "function_call",
                        "call_id": part.id,
                        "name": names.wire(part.name),
                        "arguments": tool_arguments(part),
                    }
                )
                text, _ = result_text(part)
                outputs.append({"type": "function_call_output", "call_id": part.id, "output": text})
        out.extend(outputs)
    return out


def _content(texts: list[str]) -> str | list[dict[str, str]]:
    if len(texts) == 1:
        return texts[0]
    return [{"type": "input_text", "text": text} for text in texts]


def responses_tools(tools: Sequence[ToolDefinition], names: ToolNames) -> list[dict[str, Any]]:
    """The Responses API `tools` for a request's tool definitions.

    `strict` is sent as `false`: the Responses API makes functions strict unless told, and its
    strict mode accepts only a subset of JSON Schema (every field required, no defaults) that
    most tools' arguments are not. The dispatch pipeline validates the arguments instead.
    """
    return [
        {
            "type": "function",
            "name": names.wire(t.name),
            "description": t.description,
            "parameters": t.parameters,
            "strict": False,
        }
        for t in tools
    ]


def responses_request(
    request: ModelRequest, names: ToolNames, provider: str = PROVIDER
) -> dict[str, Any]:
    """The body of a Responses API request for a `ModelRequest` (but `model` and `stream`)."""
    body: dict[str, Any] = {
        "input": responses_input(request.messages, names, provider),
        "store": False,
        "include": [REASONING_INCLUDE],
    }
    if request.instructions:
        body["instructions"] = request.instructions
    if request.tools:
        body["tools"] = responses_tools(request.tools, names)
        body["tool_choice"] = request.tool_choice
    if request.output_schema is not None:
        body["text"] = {"format": {"type": "json_schema", **output_format(request.output_schema)}}
    return body
