"""handrail's messages as Anthropic Messages API content: pure functions, no SDK import.

- The instructions, and any stored `system` message, make the top-level `system` prompt.
- User text (the engine's `synthetic` nudges included) is a `text` block of a `user` turn.
- An assistant message becomes an `assistant` turn of `thinking`, `text` and `tool_use`
  blocks in their order, and its calls' results become `tool_result` blocks that open the
  next `user` turn, in the calls' order. Consecutive turns of one role are merged, as the
  API wants strictly alternating turns with the tool results first.
- Reasoning is replayed only when Anthropic produced it (`ReasoningPart.provider`) and has a
  signature: as a `thinking` block with its text and signature (the text is empty when the
  request asked for `display: "omitted"`), or, for a part marked `redacted`, as a
  `redacted_thinking` block whose encrypted `data` the part keeps in `signature`.
- Structured output is a tool the model is made to call (`OUTPUT_NAME`); its input is the
  answer, which the adapter turns back into a text part of JSON. A schema that is not an
  object is wrapped in `{"response": ...}`, as tool inputs must be objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pydantic_core

from ..messages import Message, ReasoningPart, TextPart, ToolCallPart
from . import ModelRequest, ToolDefinition
from ._wire import ToolNames, result_text

__all__ = [
    "OUTPUT_DESCRIPTION",
    "OUTPUT_NAME",
    "PROVIDER",
    "anthropic_messages",
    "anthropic_request",
    "anthropic_tools",
    "output_is_wrapped",
    "tool_input",
]

PROVIDER = "anthropic"
"""The `ReasoningPart.provider` of Anthropic's thinking."""
OUTPUT_NAME = "final_output"
"""The name of the tool that carries a structured answer (made unique per request)."""
OUTPUT_DESCRIPTION = "Give your final answer. Call this only when you have the answer."


def tool_input(part: ToolCallPart) -> dict[str, Any]:
    """The input of a call as the model sent it, as an object (the API wants one).

    The model's own text when it is a JSON object; else what the pipeline made of near-JSON
    it repaired; else the text, wrapped (`{"invalid_json": ...}`).
    """
    raw = part.raw_args
    if raw is None or not raw.strip():
        return part.args
    try:
        value = pydantic_core.from_json(raw)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    if part.args:
        return part.args
    return {"invalid_json": raw}


def anthropic_messages(
    instructions: str | None, messages: Sequence[Message], names: ToolNames
) -> tuple[str | None, list[dict[str, Any]]]:
    """The `system` prompt and the `messages` for a conversation."""
    system = [instructions] if instructions else []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for message in messages:
        if message.role == "system":
            if message.text:
                system.append(message.text)
            continue
        if message.role == "user":
            add(
                "user", [_text(p.text) for p in message.parts if isinstance(p, TextPart) and p.text]
            )
            continue
        blocks: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        said = False  # the API refuses an assistant turn of thinking alone
        for part in message.parts:
            if isinstance(part, TextPart):
                if part.text:
                    blocks.append(_text(part.text))
                    said = True
            elif isinstance(part, ToolCallPart):
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": part.id,
                        "name": names.wire(part.name),
                        "input": tool_input(part),
                    }
                )
                said = True
                text, is_error = result_text(part)
                result: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": part.id,
                    "content": text,
                }
                if is_error:
                    result["is_error"] = True
                results.append(result)
            elif isinstance(part, ReasoningPart) and part.provider == PROVIDER and part.signature:
                blocks.append(_thinking(part, part.signature))
        if said:
            add("assistant", blocks)
        add("user", results)
    return ("\n\n".join(system) or None), out


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _thinking(part: ReasoningPart, signature: str) -> dict[str, Any]:
    # Thinking shown as `omitted` has no text but a real signature: it must go back as
    # `thinking` (empty), since only a redacted block's data may be sent as `redacted_thinking`.
    redacted = part.redacted if part.redacted is not None else not part.text
    if redacted:
        return {"type": "redacted_thinking", "data": signature}
    return {"type": "thinking", "thinking": part.text, "signature": signature}


def anthropic_tools(tools: Sequence[ToolDefinition], names: ToolNames) -> list[dict[str, Any]]:
    """The Messages API `tools` for a request's tool definitions."""
    return [
        {"name": names.wire(t.name), "description": t.description, "input_schema": t.parameters}
        for t in tools
    ]


def output_is_wrapped(schema: dict[str, Any]) -> bool:
    """Whether a structured-output schema is wrapped in `{"response": ...}` (not an object)."""
    return schema.get("type") != "object"


def anthropic_request(request: ModelRequest, names: ToolNames) -> dict[str, Any]:
    """The body of a Messages request for a `ModelRequest` (but `model`, `max_tokens`, `stream`).

    The structured-output tool, when there is one, is the last of `tools`.
    """
    system, messages = anthropic_messages(request.instructions, request.messages, names)
    body: dict[str, Any] = {"messages": messages}
    if system is not None:
        body["system"] = system
    tools = anthropic_tools(request.tools, names)
    choice = request.tool_choice
    if request.output_schema is not None:
        schema = request.output_schema
        if output_is_wrapped(schema):
            schema = {
                "type": "object",
                "properties": {"response": schema},
                "required": ["response"],
            }
        output = names.fresh(OUTPUT_NAME)
        tools.append({"name": output, "description": OUTPUT_DESCRIPTION, "input_schema": schema})
        # The answer must come through the output tool: with other tools the model may call
        # them first (`any`), and without any (or when asked for no more calls) it must answer.
        if request.tools and choice != "none":
            body["tool_choice"] = {"type": "any"}
        else:
            body["tool_choice"] = {"type": "tool", "name": output}
    elif tools:
        body["tool_choice"] = {"type": {"auto": "auto", "required": "any", "none": "none"}[choice]}
    if tools:
        body["tools"] = tools
    return body
