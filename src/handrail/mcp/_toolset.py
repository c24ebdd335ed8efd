"""`MCPToolset`: the tools of an MCP server, as handrail tools."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Collection, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TextIO

from ..exceptions import AskPerson, ConfigError, MissingExtraError, ModelRetry, ToolDefinitionError
from ..tools import Permission, Tool, ToolContext
from ._elicitation import UnfitAnswer, form_content, question, url_question

try:
    import anyio
    import httpx2
    import mcp.types as mcp_types
    from mcp.client import Client, ClientRequestContext
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise MissingExtraError("MCPToolset", needs=f"mcp ({exc})", extra="mcp") from exc

__all__ = ["MCPToolset", "hint_permission"]

_ORDER: tuple[Permission, ...] = ("read", "draft", "write", "destructive")
# More rounds than any honest server needs; a server that keeps asking is stopped here.
_MAX_INPUT_ROUNDS = 10


def hint_permission(annotations: mcp_types.ToolAnnotations | None) -> Permission:
    """The permission an MCP tool's annotations claim, with MCP's defaults for missing hints.

    `readOnlyHint: true` is `read`; otherwise `destructiveHint: false` is `write`; otherwise
    (MCP's defaults: not read-only, destructive) `destructive`.
    """
    if annotations is not None and annotations.read_only_hint is True:
        return "read"
    if annotations is not None and annotations.destructive_hint is False:
        return "write"
    return "destructive"


def _stricter(a: Permission, b: Permission) -> Permission:
    return a if _ORDER.index(a) >= _ORDER.index(b) else b


@dataclass(kw_only=True, slots=True)
class _Call:
    """What the elicitation handling knows about the call in flight."""

    answer: str | None
    """The person's answer to this call's question, on the run after they answered."""
    scope: anyio.CancelScope | None = None
    question: str | None = None
    """Set when the server asked and nobody has answered yet: the call asks a person."""
    used: bool = False
    """The answer was sent (a second question in the same call is declined)."""
    unfit: str | None = None
    """Why the answer could not be sent (it does not fill the server's form)."""


class MCPToolset:
    """The tools of one MCP server, as handrail `Tool`s that call it.

    Connect with `async with toolset:`, then `await toolset.tools()`; a call of one of those
    tools is a `tools/call` on the server. Give either `command` (a server run as a
    subprocess, over stdio) or `url` (a server over streamable HTTP).

    ```python
    async with MCPToolset(command="npx", args=["@modelcontextprotocol/server-everything"],
                          prefix="everything") as everything:
        agent = Agent("helper", tools=await everything.tools())
    ```

    Permissions come from the tools' annotations unless the application says otherwise (see
    `docs/mcp.md`): a per-tool `permissions` entry always wins; else `permission` is a floor
    that an untrusted server's hints can only tighten (`trust_hints=True`: the hints decide,
    and `permission` is what an unannotated tool gets); else the hints decide.

    Calls to one server are made one at a time, so that an elicitation the server sends
    during a call is known to belong to that call.

    Args:
        command: the server's executable (stdio).
        args: its arguments.
        env: its environment; default: MCP's safe defaults (`PATH`, `HOME`, ...), not this
            process's environment.
        cwd: its working directory.
        errlog: where the server's stderr goes (default `sys.stderr`).
        url: the server's streamable HTTP endpoint.
        headers: HTTP headers sent with every request (`Authorization`, ...).
        prefix: a name part put before each tool's name: `prefix="everything"` names the
            server's `echo` `everything.echo`.
        include: the server tools to offer (their MCP names); default: all.
        permission: the server-wide permission (see above).
        permissions: MCP tool name -> permission, winning over everything else.
        trust_hints: let the server's annotations loosen `permission` (default: they may only
            tighten it).
        timeout: seconds before a call fails with a timeout error the model reads.
        protocol: `auto` (negotiate), `legacy` (the initialize handshake, 2025-11-25 and
            older) or a modern protocol version such as `2026-07-28`.
    """

    def __init__(
        self,
        *,
        command: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        errlog: TextIO | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        prefix: str | None = None,
        include: Collection[str] | None = None,
        permission: Permission | None = None,
        permissions: Mapping[str, Permission] | None = None,
        trust_hints: bool = False,
        timeout: float | None = None,
        protocol: str = "auto",
    ) -> None:
        if (command is None) == (url is None):
            raise ConfigError(
                "MCPToolset needs exactly one of command= (a server over stdio) or url= (a "
                "server over streamable HTTP)."
            )
        if url is None and headers:
            raise ConfigError("MCPToolset: headers= is for url=; a stdio server takes env=.")
        if command is None and (args or env or cwd):
            raise ConfigError("MCPToolset: args=, env= and cwd= are for command=, not url=.")
        for where, value in [("permission", permission), *(permissions or {}).items()]:
            if value is not None and value not in _ORDER:
                raise ConfigError(f"MCPToolset: {where} must be one of {_ORDER}, not {value!r}.")
        self.command = command
        self.args = list(args)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.errlog = errlog
        self.url = url
        self.headers = dict(headers or {})
        self.prefix = prefix
        self.include = set(include) if include is not None else None
        self.permission = permission
        self.permissions = dict(permissions or {})
        self.trust_hints = trust_hints
        self.timeout = timeout
        self.protocol = protocol
        self._client: Client | None = None
        self._stack: AsyncExitStack | None = None
        self._lock = asyncio.Lock()
        self._call: _Call | None = None

    @property
    def label(self) -> str:
        """How messages name this server: its prefix, else its command or URL."""
        return self.prefix or self.command or self.url or "?"

    async def __aenter__(self) -> MCPToolset:
        if self._stack is not None:
            raise ConfigError(f"MCPToolset {self.label!r} is already connected.")
        async with AsyncExitStack() as stack:
            client = Client(
                await self._transport(stack),
                elicitation_callback=self._on_elicit,
                mode=self.protocol,  # checked by Client itself
            )
            self._client = await stack.enter_async_context(client)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.__aexit__(exc_type, exc, tb)

    async def _transport(self, stack: AsyncExitStack) -> Any:
        if self.url is not None:
            # MCP's own timeouts: a server may hold a response stream open for minutes.
            timeout = httpx2.Timeout(30.0, read=300.0)
            http = httpx2.AsyncClient(headers=self.headers, timeout=timeout)
            await stack.enter_async_context(http)  # a client we pass in is ours to close
            return streamable_http_client(self.url, http_client=http)
        assert self.command is not None
        server = StdioServerParameters(
            command=self.command, args=self.args, env=self.env, cwd=self.cwd
        )
        return stdio_client(server, errlog=self.errlog or sys.stderr)

    def _connected(self) -> Client:
        if self._client is None:
            raise ConfigError(
                f"MCPToolset {self.label!r} is not connected: use its tools inside "
                f"`async with toolset:`."
            )
        return self._client

    async def tools(self) -> list[Tool[Any]]:
        """The server's tools (those in `include`), as handrail tools that call it."""
        client = self._connected()
        listed: list[mcp_types.Tool] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return [self._tool(t) for t in listed if self.include is None or t.name in self.include]

    def permission_of(self, name: str, annotations: mcp_types.ToolAnnotations | None) -> Permission:
        """The handrail permission of the server's tool `name` (see the class docstring)."""
        if name in self.permissions:
            return self.permissions[name]
        hinted = hint_permission(annotations)
        if self.permission is None:
            return hinted
        if not self.trust_hints:
            return _stricter(self.permission, hinted)
        if annotations is None:
            return self.permission
        return hinted

    def _tool(self, listed: mcp_types.Tool) -> Tool[Any]:
        mcp_name = listed.name
        name = f"{self.prefix}.{mcp_name}" if self.prefix else mcp_name

        async def call_mcp_tool(ctx: ToolContext[Any], **arguments: Any) -> Any:
            return await self._call_tool(mcp_name, ctx, arguments)

        schema = dict(listed.input_schema or {"type": "object"})
        schema.setdefault("type", "object")
        try:
            return Tool(
                call_mcp_tool,
                name=name,
                description=listed.description or listed.title or mcp_name,
                parameters=schema,
                permission=self.permission_of(mcp_name, listed.annotations),
                timeout=self.timeout,
            )
        except ToolDefinitionError as exc:
            raise ToolDefinitionError(
                f"MCP server {self.label!r}, tool {mcp_name!r}: {exc} Leave it out with "
                f"include=, or give the toolset another prefix=."
            ) from None

    async def _call_tool(self, name: str, ctx: ToolContext[Any], arguments: dict[str, Any]) -> Any:
        client = self._connected()
        answer = None if ctx.answer is None else str(ctx.answer)
        async with self._lock:
            call = self._call = _Call(answer=answer)
            try:
                result = await self._send(client, name, arguments, call)
            except MCPError as exc:  # the server refused the request itself
                raise ModelRetry(f"The MCP server failed the call: {exc}") from None
            finally:
                self._call = None
        if call.question is not None:
            raise AskPerson(call.question)
        if call.unfit is not None:
            raise ModelRetry(
                f"The person's answer could not be sent to the MCP server ({call.unfit}), so "
                f"the call was declined. Call the tool again so that they can answer again."
            )
        if result is None:  # pragma: no cover - only a cancellation we did not cause
            raise ModelRetry(f"The MCP tool {name!r} was cancelled.")
        if result.is_error:
            raise ModelRetry(_text(result) or f"The MCP tool {name!r} failed.")
        if result.structured_content is not None:
            return result.structured_content
        return _text(result)

    async def _send(
        self, client: Client, name: str, arguments: dict[str, Any], call: _Call
    ) -> mcp_types.CallToolResult | None:
        result: mcp_types.CallToolResult | mcp_types.InputRequiredResult | None = None
        with anyio.CancelScope() as scope:
            call.scope = scope
            result = await client.session.call_tool(name, arguments, allow_input_required=True)
            for _ in range(_MAX_INPUT_ROUNDS):
                if not isinstance(result, mcp_types.InputRequiredResult):
                    return result
                responses = self._inputs(result.input_requests or {}, call)
                if call.question is not None:
                    return None  # a person has to answer first: the call asks them
                result = await client.session.call_tool(
                    name,
                    arguments,
                    input_responses=responses,
                    request_state=result.request_state,
                    allow_input_required=True,
                )
            raise ModelRetry(
                f"The MCP tool {name!r} kept asking for input after {_MAX_INPUT_ROUNDS} rounds."
            )
        # Reached when a legacy (in-call) elicitation cancelled the call to ask a person.
        return None

    def _inputs(
        self, requests: Mapping[str, mcp_types.InputRequest], call: _Call
    ) -> mcp_types.InputResponses:
        """Answers to a multi-round (`InputRequiredResult`) round's requests."""
        responses: mcp_types.InputResponses = {}
        for key, request in requests.items():
            if isinstance(request, mcp_types.ElicitRequest):
                responses[key] = self._respond(call, request.params)
            elif isinstance(request, mcp_types.ListRootsRequest):
                responses[key] = mcp_types.ListRootsResult(roots=[])
            else:
                raise ModelRetry(
                    "The MCP server asked the client for sampling (an LLM completion), which "
                    "handrail's MCPToolset does not provide."
                )
        return responses

    async def _on_elicit(
        self, context: ClientRequestContext, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        """A legacy (in-call) `elicitation/create` request from the server."""
        call = self._call
        if call is None:  # not during a call: nobody to ask
            return mcp_types.ElicitResult(action="decline")
        response = self._respond(call, params)
        if call.question is not None and call.scope is not None:
            # The person answers later, in another run: abandon this call (the server is
            # told it was cancelled); it is made again, with the answer, when they have.
            call.scope.cancel()
        return response

    def _respond(
        self, call: _Call, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult:
        if call.used:  # one question per call: see docs/mcp.md
            return mcp_types.ElicitResult(action="decline")
        if isinstance(params, mcp_types.ElicitRequestURLParams):
            if call.answer is None:
                call.question = url_question(params.message, params.url)
                return mcp_types.ElicitResult(action="cancel")
            call.used = True
            return mcp_types.ElicitResult(action="accept")
        schema = dict(params.requested_schema)
        if call.answer is None:
            call.question = question(params.message, schema)
            return mcp_types.ElicitResult(action="cancel")
        call.used = True
        try:
            content = form_content(schema, call.answer)
        except UnfitAnswer as exc:
            call.unfit = str(exc)
            return mcp_types.ElicitResult(action="decline")
        return mcp_types.ElicitResult(action="accept", content=content)

    def __repr__(self) -> str:
        state = "connected" if self._client is not None else "not connected"
        return f"MCPToolset({self.label!r}, {state})"


def _text(result: mcp_types.CallToolResult) -> str:
    """A result's content as text (non-text content is named, not inlined)."""
    parts: list[str] = []
    for item in result.content:
        if isinstance(item, mcp_types.TextContent):
            parts.append(item.text)
        else:
            mime = getattr(item, "mime_type", None) or getattr(item, "uri", None) or ""
            parts.append(f"[{item.type} content{': ' + str(mime) if mime else ''}]")
    return "\n".join(parts)
