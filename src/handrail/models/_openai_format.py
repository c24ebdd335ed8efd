"""handrail's messages as OpenAI Chat Completions messages: pure functions, no SDK import.

- The instructions become the first `system` message; a stored `system` message stays one.
- User text (the engine's `synthetic` nudges included) is plain `user` content.
- A call's arguments go back as the model wrote them when they are a JSON object, else as an
  object (`object_arguments`): strict servers refuse any other `arguments` in the history.
- An assistant message becomes one `assistant` message (its text, its `tool_calls`), followed
  by one `tool` message per call, in the calls' order: a call and its result are one part in
  handrail, two messages here. A call still waiting for a decision reads `AWAITING_DECISION`.
- Reasoning is not sent back: Chat Completions has no field for it (and OpenAI-compatible
  servers that stream `reasoning_content` ask not to receive it again).
- A call the model provider ran (a hosted tool, `executor="provider"`) is not a function call
  here: the assistant's content carries a short note of it in its place (`hosted_note`).
- Approval cards are the UI's business; the model reads their outcome in the call's result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pydantic_core

from ..messages import Message, TextPart, ToolCallPart
from ..tools._arguments import ArgumentsError, parse_arguments
from ..tools._hosted import hosted_note
from . import ModelRequest, ToolDefinition
from ._wire import ToolNames, result_text

__all__ = [
    "OUTPUT_NAME",
    "object_arguments",
    "openai_messages",
    "openai_request",
    "openai_tools",
    "output_format",
    "request_tool_names",
    "tool_arguments",
]

OUTPUT_NAME = "final_output"
"""The name given to a structured-output schema (OpenAI's `json_schema.name`)."""


def request_tool_names(tools: Sequence[ToolDefinition], messages: Sequence[Message]) -> ToolNames:
    """The tool-name mapping of one request: its tools first, then the names in its history."""
    names = [t.name for t in tools]
    for message in messages:
        names.extend(p.name for p in message.parts if isinstance(p, ToolCallPart))
    return ToolNames(names)


def tool_arguments(part: ToolCallPart) -> str:
    """The arguments of a call as the model sent them (verbatim when they did not parse)."""
    if part.raw_args is not None:
        return part.raw_args
    return pydantic_core.to_json(part.args).decode()


def object_arguments(part: ToolCallPart) -> str:
    """The arguments of a call as the model sent them, as the APIs take them back: an object.

    Byte for byte the model's text when that is a JSON object. Other text goes back as the
    object the pipeline read from it (`""` for no arguments is `{}`; near-JSON it repaired is
    that object, compact), and text that is no object at all (not JSON, cut off by the token
    limit, a JSON array) as `{}`: that call never ran, and its result says why. Servers that
    render the history through a chat template (vLLM, SGLang, llama-server, several gateways)
    answer 400 to every later request of the session when a call's arguments are not an
    object.
    """
    raw = part.raw_args
    if raw is None:
        return pydantic_core.to_json(part.args).decode()
    try:
        value = pydantic_core.from_json(raw)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return raw
    try:
        return pydantic_core.to_json(parse_arguments(raw)).decode()
    except ArgumentsError:
        return "{}"


def openai_messages(
    instructions: str | None, messages: Sequence[Message], names: ToolNames
) -> list[dict[str, Any]]:
    """The Chat Completions `messages` for a conversation."""
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    for message in messages:
        if message.role != "assistant":
            texts = [p.text for p in message.parts if isinstance(p, TextPart) and p.text]
            if texts:
                out.append({"role": message.role, "content": _content(texts)})
            continue
        texts = []
        calls: list[ToolCallPart] = []
        for part in message.parts:
            if isinstance(part, TextPart) and part.text:
                texts.append(part.text)
            elif isinstance(part, ToolCallPart) and part.executor == "provider":
                texts.append(hosted_note(part))  # Chat Completions has no hosted tools
            elif isinstance(part, ToolCallPart):
                calls.append(part)
        if not texts and not calls:
            continue  # reasoning or an approval card only: nothing the API takes back
        assistant: dict[str, Any] = {"role": "assistant", "content": _content(texts)}
        if calls:
            assistant["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": names.wire(call.name),
                        "arguments": object_arguments(call),
                    },
                }
                for call in calls
            ]
        out.append(assistant)
        for call in calls:
            text, _ = result_text(call)
            out.append({"role": "tool", "tool_call_id": call.id, "content": text})
    return out


def _content(texts: list[str]) -> str | list[dict[str, str]] | None:
    if not texts:
        return None
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": text} for text in texts]


def openai_tools(tools: Sequence[ToolDefinition], names: ToolNames) -> list[dict[str, Any]]:
    """The Chat Completions `tools` for a request's tool definitions."""
    return [
        {
            "type": "function",
            "function": {
                "name": names.wire(t.name),
                "description": t.description,
                "parameters": t.parameters,
            },
        }
        for t in tools
    ]


def openai_request(request: ModelRequest, names: ToolNames) -> dict[str, Any]:
    """The body of a Chat Completions request for a `ModelRequest` (but `model` and `stream`)."""
    body: dict[str, Any] = {
        "messages": openai_messages(request.instructions, request.messages, names)
    }
    if request.tools:
        body["tools"] = openai_tools(request.tools, names)
        body["tool_choice"] = request.tool_choice
    if request.output_schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": output_format(request.output_schema),
        }
    return body


def output_format(schema: dict[str, Any]) -> dict[str, Any]:
    """A structured-output schema as both OpenAI APIs name it (`name` and `schema`).

    Not `strict`: OpenAI's strict mode accepts only a subset of JSON Schema (every field
    required, no defaults), which most pydantic models are not. The loop validates the answer
    and asks again once when it does not fit.
    """
    return {"name": OUTPUT_NAME, "schema": schema}
