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
- Hosted tools (`ModelRequest.hosted_tools`) are declared in Anthropic's own form
  (`web_search_20250305`, `code_execution_20250825`, `web_fetch_20250910`; GA in the Messages
  API, no beta header). A call Anthropic ran is one `ToolCallPart` (`executor="provider"`)
  holding Anthropic's raw blocks (`server_tool_use` and its result block) in `provider_blocks`:
  it is sent back as those blocks, unchanged and in place (no `tool_result`: Anthropic ran it).
  A hosted call another provider ran (or a test double made) is a short text note in its
  place (`hosted_note`), as Anthropic cannot read another provider's blocks.
- Structured output is a tool the model is made to call (`OUTPUT_NAME`); its input is the
  answer, which the adapter turns back into a text part of JSON. A schema that is not an
  object is wrapped in `{"response": ...}`, as tool inputs must be objects.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pydantic_core

from ..messages import Message, ReasoningPart, TextPart, ToolCallPart
from ..tools._hosted import hosted_call, hosted_note, one_of_each_kind
from . import ModelRequest, ToolDefinition
from ._wire import ToolNames, result_text

if TYPE_CHECKING:
    from ..tools._hosted import HostedKind, HostedTool

__all__ = [
    "HOSTED_CALLS",
    "OUTPUT_DESCRIPTION",
    "OUTPUT_NAME",
    "PROVIDER",
    "SERVER_BLOCKS",
    "anthropic_hosted_tools",
    "anthropic_messages",
    "anthropic_request",
    "anthropic_tools",
    "hosted_parts",
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
            elif isinstance(part, ToolCallPart) and part.executor == "provider":
                if part.provider == PROVIDER and part.provider_blocks:
                    blocks.extend(copy.deepcopy(part.provider_blocks))
                else:
                    blocks.append(_text(hosted_note(part)))
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


_HOSTED_TYPES: dict[str, str] = {
    "web_search": "web_search_20250305",
    "code_execution": "code_execution_20250825",
    "web_fetch": "web_fetch_20250910",
}
"""Each hosted kind as the Messages API declares it (the tool's `type`; its name is the kind)."""


def anthropic_hosted_tools(hosted_tools: Sequence[HostedTool]) -> list[dict[str, Any]]:
    """The Messages API `tools` entries of a request's hosted tools.

    Raises:
        HostedToolError: two hosted tools of one kind (Anthropic names each by its kind).
    """
    out: list[dict[str, Any]] = []
    one_of_each_kind(hosted_tools, "Anthropic")
    for hosted in hosted_tools:
        entry: dict[str, Any] = {"type": _HOSTED_TYPES[hosted.kind], "name": hosted.kind}
        if hosted.kind != "code_execution":
            if hosted.max_uses is not None:
                entry["max_uses"] = hosted.max_uses
            if hosted.allowed_domains is not None:
                entry["allowed_domains"] = list(hosted.allowed_domains)
            if hosted.blocked_domains is not None:
                entry["blocked_domains"] = list(hosted.blocked_domains)
        if hosted.kind == "web_search" and hosted.user_location is not None:
            entry["user_location"] = {"type": "approximate", **hosted.user_location}
        if hosted.kind == "web_fetch":
            if hosted.max_content_tokens is not None:
                entry["max_content_tokens"] = hosted.max_content_tokens
            if hosted.citations is not None:
                entry["citations"] = {"enabled": hosted.citations}
        out.append(entry)
    return out


_RESULT_KINDS: dict[str, HostedKind] = {
    "web_search_tool_result": "web_search",
    "web_fetch_tool_result": "web_fetch",
    "code_execution_tool_result": "code_execution",
    "bash_code_execution_tool_result": "code_execution",
    "text_editor_code_execution_tool_result": "code_execution",
}
"""The result blocks of Anthropic's server tools handrail reads, and what each projects to."""
HOSTED_CALLS: dict[str, HostedKind] = {
    "web_search": "web_search",
    "web_fetch": "web_fetch",
    "code_execution": "code_execution",
    "bash_code_execution": "code_execution",
    "text_editor_code_execution": "code_execution",
}
"""The names of `server_tool_use` blocks handrail reads, and their kind."""
SERVER_BLOCKS = frozenset({"server_tool_use", *_RESULT_KINDS})
"""The content block types of hosted calls (anything else unknown is refused)."""


def hosted_parts(
    items: Sequence[TextPart | ReasoningPart | ToolCallPart | dict[str, Any]],
    hosted_tools: Sequence[HostedTool],
    history: Sequence[Message] = (),
) -> list[TextPart | ReasoningPart | ToolCallPart]:
    """A response's parts, its raw server-tool blocks (dicts) made into hosted-call parts.

    A `server_tool_use` and the result block that names it (`tool_use_id`) become ONE part, in
    the call's place, holding both blocks as received; a call whose result is not in this
    response (Anthropic runs it after a client tool's result) is a part with no result yet;
    a result whose call was in an earlier response (found in `history`) is a part of its own
    with that call's id, name and input, holding the result block (the loop settles the
    earlier part with it).
    """
    earlier = {
        p.id: p
        for m in history
        for p in m.tool_calls
        if p.executor == "provider" and p.provider == PROVIDER
    }
    names = {h.kind: h.name for h in hosted_tools}
    calls: dict[str, dict[str, Any]] = {}
    results: dict[str, dict[str, Any]] = {}
    for item in items:
        if isinstance(item, dict) and item.get("type") == "server_tool_use":
            calls[str(item.get("id"))] = item
        elif isinstance(item, dict):
            results[str(item.get("tool_use_id"))] = item
    out: list[TextPart | ReasoningPart | ToolCallPart] = []
    for item in items:
        if not isinstance(item, dict):
            out.append(item)
            continue
        if item.get("type") == "server_tool_use":
            call_id = str(item.get("id"))
            kind = HOSTED_CALLS[str(item.get("name"))]
            out.append(
                _hosted_part(names.get(kind, kind), kind, call_id, item, results.get(call_id))
            )
        else:
            call_id = str(item.get("tool_use_id"))
            if call_id in calls:
                continue  # with its call
            kind = _RESULT_KINDS[str(item.get("type"))]
            before = earlier.get(call_id)
            call = before.provider_blocks[0] if before and before.provider_blocks else None
            name = before.name if before is not None else names.get(kind, kind)
            out.append(_hosted_part(name, kind, call_id, call, item, carried=call is not None))
    return out


def _hosted_part(
    name: str,
    kind: HostedKind,
    call_id: str,
    call: dict[str, Any] | None,
    result: dict[str, Any] | None,
    *,
    carried: bool = False,
) -> ToolCallPart:
    """One hosted call's part; `carried`: `call` is an earlier response's (not kept here)."""
    args: dict[str, Any] = dict(call.get("input") or {}) if call is not None else {}
    blocks = [b for b in (None if carried else call, result) if b is not None]
    if result is None:
        return ToolCallPart(
            id=call_id,
            name=name,
            args=args,
            status="running",
            executor="provider",
            provider=PROVIDER,
            provider_blocks=blocks,
        )
    content = result.get("content")
    error: str | None = None
    if isinstance(content, dict) and str(content.get("type", "")).endswith("_error"):
        error = str(content.get("error_code") or "unknown_error")
    data: dict[str, Any]
    if kind == "web_search":
        query = args.get("query")
        items = content if isinstance(content, list) else []
        data = {
            "kind": kind,
            "queries": [query] if isinstance(query, str) else [],
            "sources": [
                {"url": i.get("url"), "title": i.get("title")}
                for i in items
                if isinstance(i, dict) and i.get("type") == "web_search_result"
            ],
        }
    elif kind == "web_fetch":
        page = content if isinstance(content, dict) and error is None else {}
        inner = page.get("content")
        document: dict[str, Any] = inner if isinstance(inner, dict) else {}
        data = {
            "kind": kind,
            "url": page.get("url") or args.get("url"),
            "title": document.get("title"),
        }
    else:
        ran = content if isinstance(content, dict) and error is None else {}
        code = args.get("code") or args.get("command") or ""
        if call is not None and call.get("name") == "text_editor_code_execution":
            code = " ".join(str(args[k]) for k in ("command", "path") if args.get(k))
        data = {
            "kind": kind,
            "code": code,
            "stdout": ran.get("stdout", ""),
            "stderr": ran.get("stderr", ""),
            "return_code": ran.get("return_code", 0 if error is None else None),
        }
    return hosted_call(
        name, data, args=args, id=call_id, error=error, provider=PROVIDER, blocks=blocks
    )


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
    tools.extend(anthropic_hosted_tools(request.hosted_tools))
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
        if (request.tools or request.hosted_tools) and choice != "none":
            body["tool_choice"] = {"type": "any"}
        else:
            body["tool_choice"] = {"type": "tool", "name": output}
    elif tools:
        body["tool_choice"] = {"type": {"auto": "auto", "required": "any", "none": "none"}[choice]}
    if tools:
        body["tools"] = tools
    return body
