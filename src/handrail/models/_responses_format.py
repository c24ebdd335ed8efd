"""handrail's messages as OpenAI Responses API input items, and its output items as parts.

Pure functions, no SDK import.

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
  the model's reasoning into the next. Other providers' reasoning is not sent, nor is an item
  without its `encrypted_content` (the API would look its id up and find nothing), nor one
  that no other item of its message follows (the API refuses a reasoning item without its
  following item: an answer cut while the model reasoned).
- Message and function-call items go back without the ids OpenAI gave them: with
  `store: false` such an id names an item OpenAI did not keep.
- Hosted tools (`ModelRequest.hosted_tools`) are declared in OpenAI's form: a web search as
  `{"type": "web_search"}` (its `allowed_domains` as `filters`, its `user_location`), code
  execution as `code_interpreter` in an automatic container; the request then also asks for
  `web_search_call.action.sources` and `code_interpreter_call.outputs`. OpenAI has no web
  fetch, and its web search no `max_uses` or `blocked_domains`: those are a
  `HostedToolError` before anything is sent, never silently dropped.
- A `web_search_call` or `code_interpreter_call` item is ONE `ToolCallPart`
  (`executor="provider"`) holding the item as received in `provider_blocks`, sent back
  unchanged and in place to this provider (no output item: OpenAI ran it); another provider's
  hosted call (or a test double's) is a short note in an `assistant` message in its place.
- Approval cards are the UI's business; the model reads their outcome in the call's result.
- Not kept: an assistant message's `phase` (`commentary`, `final_answer`), which OpenAI asks
  newer codex models to get back; the text goes back without it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..exceptions import HostedToolError, ModelError
from ..messages import Message, ReasoningPart, TextPart, ToolCallPart
from ..tools._hosted import hosted_call, hosted_note, one_of_each_kind
from . import ModelRequest, ToolDefinition
from ._openai_format import object_arguments, output_format
from ._wire import ToolNames, result_text

if TYPE_CHECKING:
    from ..tools._hosted import HostedKind, HostedTool

__all__ = [
    "HOSTED_KINDS",
    "PROVIDER",
    "REASONING_INCLUDE",
    "readable",
    "response_parts",
    "responses_hosted_tools",
    "responses_input",
    "responses_request",
    "responses_tools",
    "unknown_item",
]

PROVIDER = "openai-responses"
"""The provider of the Responses model, and the `ReasoningPart.provider` of its reasoning."""
REASONING_INCLUDE = "reasoning.encrypted_content"
"""What a request asks to be included so that its reasoning can be sent back."""
HOSTED_KINDS: tuple[HostedKind, ...] = ("web_search", "code_execution")
"""The hosted tools the Responses API runs (it has no web fetch)."""
_HOSTED_INCLUDE: dict[str, str] = {
    "web_search": "web_search_call.action.sources",
    "code_execution": "code_interpreter_call.outputs",
}
"""What a request with each hosted tool asks to be included: the sources and the outputs."""
_HOSTED_ITEMS: dict[str, HostedKind] = {
    "web_search_call": "web_search",
    "code_interpreter_call": "code_execution",
}
"""The output items of hosted calls, and their kind."""


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
        items: list[dict[str, Any]] = []
        outputs: list[dict[str, Any]] = []
        reasoning: list[dict[str, Any]] = []  # waiting for the item that follows them
        for part in message.parts:
            if isinstance(part, ReasoningPart):
                if part.provider == provider and part.provider_blocks:
                    reasoning += [b for b in part.provider_blocks if _replayable(b)]
                continue
            before = len(items)
            if isinstance(part, TextPart):
                if part.text:
                    items.append({"role": "assistant", "content": part.text})
            elif isinstance(part, ToolCallPart) and part.executor == "provider":
                if part.provider == provider and part.provider_blocks:
                    items.extend(copy.deepcopy(part.provider_blocks))
                else:
                    items.append({"role": "assistant", "content": hosted_note(part)})
            elif isinstance(part, ToolCallPart):
                items.append(
                    {
                        "type": "function_call",
                        "call_id": part.id,
                        "name": names.wire(part.name),
                        "arguments": object_arguments(part),
                    }
                )
                text, _ = result_text(part)
                outputs.append({"type": "function_call_output", "call_id": part.id, "output": text})
            if reasoning and len(items) > before:
                items[before:before] = copy.deepcopy(reasoning)
                reasoning = []
        # Reasoning that nothing followed (an answer cut while the model reasoned) is left
        # out: the API refuses a reasoning item without its following item.
        out.extend(items)
        out.extend(outputs)
    return out


def _replayable(item: dict[str, Any]) -> bool:
    """Whether a reasoning item can go back to a request that stores nothing.

    Without its `encrypted_content` the API would look its id up, and find nothing.
    """
    return item.get("type") != "reasoning" or bool(item.get("encrypted_content"))


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


def responses_hosted_tools(hosted_tools: Sequence[HostedTool]) -> list[dict[str, Any]]:
    """The Responses API `tools` entries of a request's hosted tools (web search, code).

    Raises:
        HostedToolError: an option OpenAI's tool does not have (`max_uses`,
            `blocked_domains`), or two hosted tools of one kind.
    """
    out: list[dict[str, Any]] = []
    one_of_each_kind(hosted_tools, "the Responses API")
    for hosted in hosted_tools:
        if hosted.kind == "code_execution":
            out.append({"type": "code_interpreter", "container": {"type": "auto"}})
            continue
        for option, value in (
            ("max_uses", hosted.max_uses),
            ("blocked_domains", hosted.blocked_domains),
        ):
            if value is not None:
                raise HostedToolError(
                    f"Tool {hosted.name!r}: OpenAI's web search has no {option}, so the search "
                    f"cannot be held to it. Drop {option}= (allowed_domains= is supported), or "
                    f"use AnthropicModel."
                )
        entry: dict[str, Any] = {"type": "web_search"}
        if hosted.allowed_domains is not None:
            entry["filters"] = {"allowed_domains": list(hosted.allowed_domains)}
        if hosted.user_location is not None:
            entry["user_location"] = {"type": "approximate", **hosted.user_location}
        out.append(entry)
    return out


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
    tools = responses_tools(request.tools, names)
    tools += responses_hosted_tools(request.hosted_tools)
    if tools:
        body["tools"] = tools
        body["tool_choice"] = request.tool_choice
    body["include"] += [_HOSTED_INCLUDE[h.kind] for h in request.hosted_tools]
    if request.output_schema is not None:
        body["text"] = {"format": {"type": "json_schema", **output_format(request.output_schema)}}
    return body


def response_parts(
    items: Iterable[dict[str, Any]],
    names: ToolNames,
    hosted_tools: Sequence[HostedTool],
    provider: str = PROVIDER,
) -> list[TextPart | ReasoningPart | ToolCallPart]:
    """A response's output items (as received, JSON) as handrail parts, in order.

    Reasoning keeps its item (`provider_blocks`); a message is a text part (a refusal's text
    included); a function call is a call for handrail to run; a web search or code
    interpreter call is one provider part with its projection (`hosted_call`), a web search's
    sources titled from the `url_citation` annotations of the answer (a cited page that no
    search listed joins the last search's sources).

    Raises:
        ModelError: an item of a type handrail cannot read or send back (refused rather than
            dropped: the next request would lose it).
    """
    items = list(items)
    tool_names = {h.kind: h.name for h in hosted_tools}
    cited: dict[str, str | None] = {}
    for item in items:
        if item.get("type") == "message":
            for content in item.get("content") or ():
                for note in content.get("annotations") or ():
                    if note.get("type") == "url_citation" and note.get("url"):
                        cited.setdefault(note["url"], note.get("title"))
    searches = [i for i, item in enumerate(items) if item.get("type") == "web_search_call"]
    parts: list[TextPart | ReasoningPart | ToolCallPart] = []
    for index, item in enumerate(items):
        kind = item.get("type")
        if kind == "reasoning":
            texts = [s.get("text", "") for s in item.get("summary") or ()]
            if not texts:
                texts = [c.get("text", "") for c in item.get("content") or ()]
            parts.append(
                ReasoningPart(text="\n\n".join(texts), provider=provider, provider_blocks=[item])
            )
        elif kind == "message":
            texts = []
            for content in item.get("content") or ():
                if content.get("type") == "output_text":
                    texts.append(content.get("text", ""))
                elif content.get("type") == "refusal":
                    texts.append(content.get("refusal", ""))
            if any(texts):
                parts.append(TextPart(text="".join(texts)))
        elif kind == "function_call":
            parts.append(
                ToolCallPart(
                    id=item["call_id"],
                    name=names.handrail(item["name"]),
                    raw_args=item.get("arguments", ""),
                )
            )
        elif kind in _HOSTED_ITEMS:
            hosted = _HOSTED_ITEMS[str(kind)]
            last = bool(searches) and index == searches[-1]
            parts.append(
                _hosted_part(item, tool_names.get(hosted, hosted), hosted, provider, cited, last)
            )
        else:
            raise unknown_item(kind, provider)
    return parts


def readable(kind: object) -> bool:
    """Whether handrail reads (and can send back) an output item of type `kind`."""
    return kind in ("reasoning", "message", "function_call") or kind in _HOSTED_ITEMS


def unknown_item(kind: object, provider: str) -> ModelError:
    """The refusal of a response holding an item handrail cannot read.

    Such an item is never dropped (the next request would lose it) nor acted on.
    """
    return ModelError(
        f"{provider}: the response has an output item of type {kind!r}, which handrail "
        f"cannot read or send back; the response was refused rather than dropped in part. "
        f"Remove the tool that produces it, or upgrade handrail."
    )


def _hosted_part(
    item: dict[str, Any],
    name: str,
    kind: HostedKind,
    provider: str,
    cited: dict[str, str | None],
    last_search: bool,
) -> ToolCallPart:
    """One hosted call's item as a provider part (the projection `hosted_call` keeps)."""
    status = item.get("status")
    error = None if status == "completed" else str(status or "unknown")
    data: dict[str, Any]
    if kind == "web_search":
        action: dict[str, Any] = item.get("action") or {}
        args = {k: v for k, v in action.items() if k != "sources"}
        queries = list(action.get("queries") or ())
        if not queries and isinstance(action.get("query"), str):
            queries = [action["query"]]
        urls = [s.get("url") for s in action.get("sources") or () if s.get("url")]
        if action.get("type") != "search" and isinstance(action.get("url"), str):
            urls.append(action["url"])  # a page opened or searched within
        if last_search:
            urls += [url for url in cited if url not in urls]
        data = {
            "kind": kind,
            "queries": queries,
            "sources": [{"url": url, "title": cited.get(url)} for url in dict.fromkeys(urls)],
        }
    else:
        code = item.get("code") or ""
        args = {"code": code}
        logs = [o.get("logs", "") for o in item.get("outputs") or () if o.get("type") == "logs"]
        # OpenAI reports the logs (stdout and stderr together) and no exit status.
        data = {
            "kind": kind,
            "code": code,
            "stdout": "".join(logs),
            "stderr": "",
            "return_code": None,
        }
    return hosted_call(
        name,
        data,
        args=args,
        id=str(item.get("id", "")),
        error=error,
        provider=provider,
        blocks=[item],
    )
