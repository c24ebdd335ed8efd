"""Hosted tools: tools the model provider runs mid-response (web search, code execution, fetch).

`web_search()`, `code_execution()` and `web_fetch()` make a handrail `Tool` with
`executor="provider"` and its `hosted` declaration (`HostedTool`). The agent loop hands these
to the model as `ModelRequest.hosted_tools` (not as function definitions); a provider adapter
declares them in its own form, and a model that cannot run one raises `HostedToolError`
before it sends anything.

The provider runs the call and returns it with its result: the adapter makes ONE
`ToolCallPart` of it (`executor="provider"`, `provider=` its name, the raw blocks in
`provider_blocks`) whose result is handrail's projection, the same for every provider
(`hosted_call`):

- web search: `{"kind": "web_search", "queries": [...], "sources": [{"url", "title"}, ...]}`
- code execution: `{"kind": "code_execution", "code", "stdout", "stderr", "return_code"}`
  (`return_code` None where the provider reports none, as OpenAI's code interpreter)
- web fetch: `{"kind": "web_fetch", "url", "title"}`

A provider-side error is a failed result whose `error` is the provider's error code.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic_core

from .._tool_result import ToolResult
from ..exceptions import HostedToolError, ToolDefinitionError
from ..messages import ToolCallPart
from ._definition import HostedKind, HostedTool, UserLocation
from ._tool import Tool

__all__ = [
    "HostedKind",
    "HostedTool",
    "UserLocation",
    "check_hosted",
    "code_execution",
    "hosted_call",
    "hosted_note",
    "hosted_summary",
    "one_of_each_kind",
    "web_fetch",
    "web_search",
]

_DESCRIPTIONS: dict[HostedKind, str] = {
    "web_search": "Search the web (run by the model provider).",
    "code_execution": "Run code in a sandbox (run by the model provider).",
    "web_fetch": "Fetch a web page (run by the model provider).",
}


def _hosted_tool(name: str, description: str | None, hosted: HostedTool) -> Tool[Any]:
    label = f"Hosted tool {name!r}"
    if hosted.allowed_domains is not None and hosted.blocked_domains is not None:
        raise ToolDefinitionError(
            f"{label}: give allowed_domains= or blocked_domains=, not both (providers refuse "
            f"a request with both)."
        )
    for option, value in (
        ("max_uses", hosted.max_uses),
        ("max_content_tokens", hosted.max_content_tokens),
    ):
        if value is not None and (isinstance(value, bool) or value < 1):
            raise ToolDefinitionError(f"{label}: {option} must be a positive whole number.")
    for option, domains in (
        ("allowed_domains", hosted.allowed_domains),
        ("blocked_domains", hosted.blocked_domains),
    ):
        if isinstance(domains, str):
            raise ToolDefinitionError(
                f"{label}: {option} is a list of domains; write [{domains!r}]."
            )
    return Tool(
        name=name,
        description=description or _DESCRIPTIONS[hosted.kind],
        executor="provider",
        permission="read",
        hosted=hosted,
    )


def _domains(domains: Sequence[str] | None) -> list[str] | None:
    if domains is None or isinstance(domains, str):
        return domains  # type: ignore[return-value]  # a str is refused by `_hosted_tool`
    return list(domains)


def web_search(
    *,
    name: str = "web_search",
    description: str | None = None,
    max_uses: int | None = None,
    allowed_domains: Sequence[str] | None = None,
    blocked_domains: Sequence[str] | None = None,
    user_location: UserLocation | None = None,
) -> Tool[Any]:
    """A web search the model provider runs.

    Args:
        name: the handrail tool's name (its calls' name in history and events).
        description: for people reading the agent (the provider describes the tool itself).
        max_uses: at most this many searches in one response.
        allowed_domains: only results from these domains.
        blocked_domains: never results from these domains.
        user_location: where the user is, for local results.
    """
    hosted = HostedTool(
        kind="web_search",
        max_uses=max_uses,
        allowed_domains=_domains(allowed_domains),
        blocked_domains=_domains(blocked_domains),
        user_location=user_location,
    )
    return _hosted_tool(name, description, hosted)


def code_execution(*, name: str = "code_execution", description: str | None = None) -> Tool[Any]:
    """Code execution in the model provider's sandbox.

    Args:
        name: the handrail tool's name (its calls' name in history and events).
        description: for people reading the agent (the provider describes the tool itself).
    """
    return _hosted_tool(name, description, HostedTool(kind="code_execution"))


def web_fetch(
    *,
    name: str = "web_fetch",
    description: str | None = None,
    max_uses: int | None = None,
    allowed_domains: Sequence[str] | None = None,
    blocked_domains: Sequence[str] | None = None,
    max_content_tokens: int | None = None,
    citations: bool | None = None,
) -> Tool[Any]:
    """A web page fetch the model provider runs.

    Args:
        name: the handrail tool's name (its calls' name in history and events).
        description: for people reading the agent (the provider describes the tool itself).
        max_uses: at most this many fetches in one response.
        allowed_domains: only pages from these domains.
        blocked_domains: never pages from these domains.
        max_content_tokens: the most tokens of a page the model reads.
        citations: let the model cite the fetched pages.
    """
    hosted = HostedTool(
        kind="web_fetch",
        max_uses=max_uses,
        allowed_domains=_domains(allowed_domains),
        blocked_domains=_domains(blocked_domains),
        max_content_tokens=max_content_tokens,
        citations=citations,
    )
    return _hosted_tool(name, description, hosted)


def check_hosted(
    model: str,
    hosted_tools: Sequence[HostedTool],
    supported: Sequence[HostedKind],
    fix: str,
) -> None:
    """Refuse hosted tools a model cannot run, before any request is sent.

    Args:
        model: the model, as the message names it (`OpenAIModel('gpt-4o')`).
        hosted_tools: the request's hosted tools.
        supported: the kinds this model runs.
        fix: what to use instead (`use OpenAIResponsesModel (openai-responses:...)`).

    Raises:
        HostedToolError: naming the tool, the model and the fix.
    """
    for hosted in hosted_tools:
        if hosted.kind not in supported:
            raise HostedToolError(
                f"Tool {hosted.name or hosted.kind!r} is a hosted {hosted.kind} that the model "
                f"provider runs, and {model} cannot run it: {fix}."
            )


def one_of_each_kind(hosted_tools: Sequence[HostedTool], api: str) -> None:
    """Refuse two hosted tools of one kind: providers run one of each kind in a request.

    Args:
        hosted_tools: the request's hosted tools.
        api: the provider's API, as the message names it (`Anthropic`).

    Raises:
        HostedToolError: naming both tools.
    """
    seen: dict[str, str] = {}
    for hosted in hosted_tools:
        if hosted.kind in seen:
            raise HostedToolError(
                f"Tools {seen[hosted.kind]!r} and {hosted.name!r} are both hosted "
                f"{hosted.kind} tools, and {api} runs one of each kind in a request; give "
                f"the agent one."
            )
        seen[hosted.kind] = hosted.name


_VERBS: dict[str, str] = {
    "web_search": "web search",
    "code_execution": "code execution",
    "web_fetch": "web fetch",
}


def hosted_summary(data: Mapping[str, Any], error: str | None = None) -> str:
    """The line a person reads for a hosted call: "searched the web: 3 sources", ..."""
    kind = str(data.get("kind", ""))
    if error is not None:
        return f"{_VERBS.get(kind, kind or 'hosted tool')} failed: {error}"
    if kind == "web_search":
        count = len(data.get("sources") or [])
        return f"searched the web: {count} source{'' if count == 1 else 's'}"
    if kind == "code_execution":
        code = data.get("return_code")
        return "ran code" if code is None else f"ran code (exit {code})"  # None: not reported
    if kind == "web_fetch":
        return f"fetched {data.get('url')}"
    return f"ran {kind or 'a hosted tool'} at the model provider"


def hosted_call(
    name: str,
    data: Mapping[str, Any],
    *,
    args: Mapping[str, Any] | None = None,
    id: str = "",
    error: str | None = None,
    provider: str | None = None,
    blocks: Sequence[Mapping[str, Any]] | None = None,
) -> ToolCallPart:
    """A call the model provider ran, with its result: the one way such a part is made.

    Provider adapters make their parts with it; in a test, a `FunctionModel` or
    `ScriptedModel` step may return one, so an agent with hosted tools runs offline.

    Args:
        name: the handrail tool's name (`web_search`).
        data: the projection (`{"kind": "web_search", "queries": [...], "sources": [...]}`).
        args: the call's input as the provider reported it.
        id: the provider's id for the call (empty: the model numbers it).
        error: the provider's error code, when the call failed there.
        provider: the provider that ran it (None in a test double: replayed to none).
        blocks: the provider's raw blocks for the call and its result.
    """
    projection = dict(data)
    summary = hosted_summary(projection, error)
    result = ToolResult(ok=error is None, data=projection, summary=summary, error=error, code=error)
    return ToolCallPart(
        id=id,
        name=name,
        args=dict(args or {}),
        status="completed" if error is None else "failed",
        result=result,
        digest=copy.deepcopy(projection),
        executor="provider",
        provider=provider,
        provider_blocks=[dict(b) for b in blocks] if blocks is not None else None,
    )


def hosted_note(part: ToolCallPart) -> str:
    """What a model other than the one that ran a hosted call reads of it: a short note."""
    who = part.provider or "the model provider"
    result = part.result
    if result is None:
        return f"(The tool {part.name!r} was started at {who}; it has no result here.)"
    data = pydantic_core.to_json(result.data).decode()
    return f"(The tool {part.name!r} ran at {who}: {result.summary}. Its result: {data})"
