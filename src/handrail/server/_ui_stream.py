"""`ui_stream_operations`: the AI SDK's UI message stream (`POST /chat`), over the same turns.

A front end built on the Vercel AI SDK (`useChat`, `DefaultChatTransport`) posts its chat's
whole history and reads the answer as a UI message stream (Server-Sent Events of
`uiMessageChunkSchema`, header `x-vercel-ai-ui-message-stream: v1`). Each chat is a handrail
session of the caller's, made on first use. A gated call asks for an approval
(`tool-approval-request`), a person's question and a client-run tool wait for the client's
`addToolOutput`; the next request carries the answers in its tool parts, and handrail's
amendments in the `handrail` field of the body. `GET /chat/{id}/stream` replays the running
or suspended turn. See `docs/ai-sdk.md` for the mapping and what the protocol cannot say.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Iterator
from typing import TYPE_CHECKING, Any, Literal

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response

from .._redact import log_failure, new_reference
from ..events import (
    ApprovalRequired,
    ClientExecRequired,
    Event,
    InputRequired,
    ReasoningDelta,
    RunCompleted,
    RunFailed,
    RunSuspended,
    TextDelta,
    ToolCallCompleted,
    ToolCallStarted,
    UsageEvent,
)
from ..exceptions import ArgumentsChangedError, HandrailError
from ..messages import ApprovalCardPart
from ..state import RunState
from ..store import SessionStore
from ..suspension import Answer, Approve, ClientResult, Decision, Reject, args_digest
from ._auth import Caller
from ._chats import (
    ChatRefusal,
    Cursor,
    chat_approval,
    chat_session_id,
    chat_state,
    new_user_text,
    pump,
    scratch_agents,
    start_turn,
)
from ._errors import ApiError, http_message
from ._openapi import Operation
from ._sse import EventStream

if TYPE_CHECKING:
    from ._api import Api

__all__ = ["ChatRequest", "chat_session", "ui_stream_operations"]

_log = logging.getLogger("handrail.server")

HEADER = {"x-vercel-ai-ui-message-stream": "v1"}
"""What tells the AI SDK's transport that the answer is a UI message stream."""

_CHAT_ID = r"^[^\x00-\x1f\x7f-\x9f]{1,256}$"
_ANSWERED = frozenset({"approval-responded", "output-available", "output-error"})
_DONE = b"data: [DONE]\n\n"


class UIMessageBody(BaseModel):
    """A message of the chat, as `useChat` holds it (`UIMessage`)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(max_length=256, description="The message's id (the client's).")
    role: Literal["system", "user", "assistant"]
    parts: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Its parts: `text`, tool parts (`tool-<name>` / `dynamic-tool`), ...",
    )


class HandrailExtension(BaseModel):
    """What handrail takes that the UI message protocol cannot carry."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    edits: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Tool call id -> its arguments in full, as approved: the fields that "
        "differ from the proposed ones are the amendment (only `amendable` ones may).",
    )
    digests: dict[str, str] = Field(
        default_factory=dict,
        description="Tool call id -> the digest of the arguments the approver was shown (the "
        "card's `digest`): the decision is made on those, and refused if they changed since.",
    )
    client_tools: bool = Field(
        False,
        alias="clientTools",
        description="This client runs handrail's client tools (answering with addToolOutput); "
        "without it a client tool fails fast.",
    )


class ChatRequest(BaseModel):
    """What the AI SDK's `DefaultChatTransport` posts: the chat's id and whole history."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    id: str = Field(pattern=_CHAT_ID, description="The chat's id (the client's).")
    messages: list[UIMessageBody] = Field(min_length=1, description="The whole chat.")
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    message_id: str | None = Field(None, alias="messageId")
    handrail: HandrailExtension = Field(default_factory=HandrailExtension)
    context: dict[str, Any] | None = Field(
        None,
        description="The per-turn context (the page, the record the user is on), as "
        "`sendMessage(message, {body: {context}})` sends it: validated against the domain's "
        "context model (422 `invalid_context`), never shown to the model.",
    )


def chat_session(caller: Caller, chat_id: str, store: SessionStore | None = None) -> str:
    """The handrail session of `caller`'s AI SDK chat `chat_id` (see `chat_session_id`)."""
    return chat_session_id(caller, chat_id, prefix="chat", store=store)


def ui_stream_operations(api: Api, path: str = "/chat") -> list[Operation]:
    """`POST /chat` and `GET /chat/{chat_id}/stream` of the app's `Api`."""
    endpoint = _Endpoint(api)
    events = "the AI SDK's UI message stream, v1 (docs/ai-sdk.md)"
    return [
        Operation(
            "POST",
            path,
            endpoint.chat,
            "AI SDK chat: send a message or the answers to pending calls; the UI message "
            "stream of the turn in the answer",
            body=ChatRequest,
            stream=True,
            foreign_events=events,
            errors=(403,),
        ),
        Operation(
            "GET",
            f"{path}/{{chat_id}}/stream",
            endpoint.chat_stream,
            "AI SDK chat: the running or suspended turn's UI message stream from its start "
            "(204: none)",
            stream=True,
            foreign_events=events,
            no_content="No turn of this chat is running or waiting",
        ),
    ]


class _Endpoint:
    def __init__(self, api: Api) -> None:
        self.api = api

    async def chat(self, request: Request) -> Response:
        """`POST /chat`: a new message, or the answers to pending calls; a UI message stream."""
        api = self.api
        caller = await api._caller(request)
        body = await api._body(request, ChatRequest)
        session_id = chat_session(caller, body.id, api.store)
        api.limits.check_stream(caller)
        if body.messages and body.messages[-1].role != "assistant":
            # A new message starts a turn: refused here, before the 200.
            text = _text(body.messages[-1])
            await api.admit(caller, via="ui-stream", session_id=session_id, text=text)
            api.limits.turn(caller, api.runs.running_for(caller.org_id))
            api.engine.domain.check_context(body.context)  # a bad one: 422, before the 200
        return EventStream(
            self._frames(caller, session_id, body),
            ping=api.ping_interval,
            send_timeout=api.send_timeout,
            headers=HEADER,
        )

    async def chat_stream(self, request: Request) -> Response:
        """`GET /chat/{chat_id}/stream`: the current turn's stream from its start, or 204."""
        api = self.api
        caller = await api._caller(request)
        chat_id: str = request.path_params["chat_id"]
        if len(chat_id) > 256 or any(ch < " " or "\x7f" <= ch <= "\x9f" for ch in chat_id):
            raise ApiError(422, "invalid_request", f"Not a chat id: {chat_id[:40]!r}.")
        session_id = chat_session(caller, chat_id, api.store)
        start = await self._turn_start(caller, session_id)
        if start is None:
            return Response(status_code=204)
        api.limits.check_stream(caller)
        return EventStream(
            self._replay(caller, session_id, start),
            ping=api.ping_interval,
            send_timeout=api.send_timeout,
            headers=HEADER,
        )

    async def _turn_start(self, caller: Caller, session_id: str) -> int | None:
        """The number of the event before the current turn's first; None: no current turn."""
        found = await self.api.store.summary(session_id)
        if found is None or (found.org_id, found.user_id) != caller.who:
            return None
        return await self.api.runs.current_turn(session_id)

    async def _replay(
        self, caller: Caller, session_id: str, start: int
    ) -> AsyncGenerator[bytes, None]:
        api = self.api
        api.limits.open_stream(caller)
        out = _Chunks(scratch_agents(api), _Held())
        cursor = Cursor(start)
        try:
            yield _encode({"type": "start", "messageId": _turn_message_id(start)})
            while True:
                async for chunk in pump(api, caller, session_id, cursor, out.frames):
                    yield chunk
                if cursor.last != "run-suspended":
                    break
                # Suspended: the stream goes on only if the turn was resumed since.
                more = await api.store.events(session_id, after=cursor.after, limit=1)
                if not more and not api.runs.running(session_id):
                    break
            yield _DONE
        except Exception as error:
            reference = _stream_failed(error, session_id)
            yield _encode(
                {
                    "type": "error",
                    "errorText": f"The stream failed on the server (reference {reference}).",
                }
            )
        finally:
            api.limits.close_stream(caller)

    async def _frames(
        self, caller: Caller, session_id: str, body: ChatRequest
    ) -> AsyncGenerator[bytes, None]:
        api = self.api
        api.limits.open_stream(caller)
        try:
            try:
                after, message_id, known = await self._start(caller, session_id, body)
            except ChatRefusal as refusal:
                yield _encode(_error(f"{refusal.code}: {refusal.message}")) + _DONE
                return
            except HandrailError as error:
                message = http_message(error, endpoints=False)
                if isinstance(error, ArgumentsChangedError):
                    yield _changed(error, body)
                yield _encode(_error(f"{type(error).__name__}: {message}")) + _DONE
                return
            out = _Chunks(scratch_agents(api), known)
            yield _encode({"type": "start", "messageId": message_id})
            if after is None:  # decisions recorded, more still pending: nothing ran
                state = await api.engine.session(
                    session_id, org_id=caller.org_id, user_id=caller.user_id
                )
                yield _encode(_suspended(list(state.pending))) + _DONE
                return
            async for chunk in pump(api, caller, session_id, Cursor(after), out.frames):
                yield chunk
            yield _DONE
        except Exception as error:
            reference = _stream_failed(error, session_id)
            yield _encode(_error(f"The stream failed on the server (reference {reference})."))
        finally:
            api.limits.close_stream(caller)

    async def _start(
        self, caller: Caller, session_id: str, body: ChatRequest
    ) -> tuple[int | None, str, _Held]:
        """Start what the request asks for.

        Returns:
            The number of the event before the turn's first (None: decisions were recorded,
            calls are still pending), the id of the assistant message the stream writes,
            and the tool calls (their inputs and cards) the client holds already.
        """
        api = self.api
        if body.trigger == "regenerate-message":
            raise ChatRefusal(
                "regenerate_unsupported",
                "handrail does not regenerate a turn (its tools may have acted): "
                "send a new message instead.",
            )
        state = await chat_state(api, caller, session_id)
        known = _held(body.messages)
        client = body.handrail.client_tools
        last = body.messages[-1]
        if last.role == "assistant":
            decisions = _decisions(state, last, body.handrail.edits, body.handrail.digests, caller)
            after = await start_turn(api, caller, session_id, decisions=decisions, client=client)
            return after, last.id, known
        if state is not None and state.pending:
            raise ChatRefusal(
                "interrupt_pending",
                "This chat waits for answers to its pending calls "
                f"({', '.join(state.pending)}): answer them (addToolApprovalResponse, "
                "addToolOutput) and send, before a new message.",
            )
        users = [_text(m) for m in body.messages if m.role == "user"]
        text = new_user_text(users, state)
        after = await start_turn(
            api, caller, session_id, text=text, client=client, context=body.context
        )
        assert after is not None
        return after, _turn_message_id(after), known


class _Held:
    """What the client holds of the turn's tool calls: each one's input, and its card."""

    def __init__(self) -> None:
        self.inputs: dict[str, Any] = {}  # tool call id -> the input its part shows
        self.cards: dict[str, dict[str, Any]] = {}  # tool call id -> its data-handrail-card


def _held(messages: list[UIMessageBody]) -> _Held:
    """The tool calls the client's messages hold (their tool parts and handrail cards)."""
    held = _Held()
    for message in messages:
        for part in message.parts:
            call_id = part.get("toolCallId")
            if _is_tool(part) and isinstance(call_id, str):
                held.inputs[call_id] = part.get("input")
            card = part.get("data")
            if part.get("type") == "data-handrail-card" and isinstance(card, dict):
                held.cards[str(part.get("id"))] = card
    return held


def _turn_message_id(after: int) -> str:
    """The id of the assistant message of the turn whose first event follows `after`."""
    return f"turn-{after + 1}"


def _text(message: UIMessageBody) -> str:
    """A user message's text: its text parts, joined."""
    return "".join(
        p["text"]
        for p in message.parts
        if p.get("type") == "text" and isinstance(p.get("text"), str)
    )


def _is_tool(part: dict[str, Any]) -> bool:
    kind = part.get("type")
    return isinstance(kind, str) and (kind.startswith("tool-") or kind == "dynamic-tool")


def _decisions(
    state: RunState | None,
    message: UIMessageBody,
    edits: dict[str, dict[str, Any]],
    digests: dict[str, str],
    caller: Caller,
) -> dict[str, Decision]:
    """The decisions the tool parts of the client's last assistant message carry."""
    pending = state.pending if state is not None else {}
    decisions: dict[str, Decision] = {}
    for part in message.parts:
        call_id, status = part.get("toolCallId"), part.get("state")
        if not (_is_tool(part) and isinstance(call_id, str) and isinstance(status, str)):
            continue
        if status not in _ANSWERED:
            continue
        card = pending.get(call_id)
        if card is not None:
            digest = digests.get(call_id)
            decisions[call_id] = _decision(card, part, edits.get(call_id), digest, caller)
        elif status == "approval-responded" and not (pending and _recorded(state, part)):
            raise ChatRefusal(
                "not_pending",
                f"Tool call {call_id!r} does not wait for a decision (unknown, or decided "
                "already): nothing was done.",
            )
        # else: an output the chat already holds, or a decision recorded by an earlier
        # request while other calls of the turn still wait.
    # Edits of calls that no longer wait are left over from an earlier approval: passed over.
    approved = {k for k, d in decisions.items() if isinstance(d, Approve)}
    stray = sorted((set(edits) & set(pending)) - approved)
    if stray:
        raise ChatRefusal(
            "invalid_payload",
            f"handrail.edits amends {', '.join(stray)}, which this request does not approve; "
            "nothing was decided.",
        )
    if decisions:
        return decisions
    if pending:
        raise ChatRefusal(
            "interrupt_pending",
            f"This chat waits for answers to {', '.join(pending)}: answer them "
            "(addToolApprovalResponse, addToolOutput), then send.",
        )
    raise ChatRefusal(
        "no_new_message", "The request carries no new user message and no answer to a call."
    )


def _recorded(state: RunState | None, part: dict[str, Any]) -> bool:
    """Whether the part's approval is the decision already recorded for its call."""
    approval = part.get("approval")
    if state is None or not isinstance(approval, dict):
        return False
    verdict = "approve" if approval.get("approved") is True else "reject"
    return any(
        isinstance(p, ApprovalCardPart)
        and p.tool_call_id == part.get("toolCallId")
        and p.decision == verdict
        for m in state.messages
        for p in m.parts
    )


def _decision(
    card: ApprovalCardPart, part: dict[str, Any], edited: Any, digest: Any, caller: Caller
) -> Decision:
    """The handrail decision a tool part stands for, checked against the call's card."""
    by, status, call = caller.user_id, part.get("state"), card.tool_call_id
    error = part.get("errorText")
    reason = error if isinstance(error, str) else None
    if card.kind in ("elicitation", "question"):
        if status == "output-available":
            return Answer(output=part.get("output"), by=by)
        if status == "output-error":
            return Reject(reason=reason, by=by)
        raise ChatRefusal(
            "invalid_payload",
            f"Tool call {call} asks a person: answer it with addToolOutput (output: the answer).",
        )
    if card.kind == "client_exec":
        if status == "output-available":
            return ClientResult(output=part.get("output"), by=by)
        if status == "output-error":
            return ClientResult(error=reason or "The client tool failed.", by=by)
        raise ChatRefusal(
            "invalid_payload",
            f"Tool call {call} runs in the client: answer it with addToolOutput.",
        )
    approval = part.get("approval")
    if status != "approval-responded" or not isinstance(approval, dict):
        raise ChatRefusal(
            "invalid_payload",
            f"Tool call {call} waits for an approval: answer it with addToolApprovalResponse.",
        )
    if approval.get("id") != call:
        raise ChatRefusal(
            "not_pending",
            f"Tool call {call}: approval {approval.get('id')!r} is not the one asked for "
            f"({call!r}); nothing was done.",
        )
    approved = approval.get("approved")
    if not isinstance(approved, bool):
        raise ChatRefusal("invalid_payload", f"Tool call {call}: approval.approved is missing.")
    if not approved:
        given = approval.get("reason")
        return Reject(reason=given if isinstance(given, str) else None, by=by)
    return chat_approval(card, edited, digest, field=f"handrail.edits[{call!r}]", by=by)


def _changed(error: ArgumentsChangedError, body: ChatRequest) -> bytes:
    """The call's card as it stands now, in the message the client sent its answer in.

    Sent before the error chunk of an approval made on arguments another approver changed
    since: the client shows the current `args` and sends them back with their `digest`.
    The tool part is left as it is (`approval-responded`), so sending again retries.
    """
    call_id = error.tool_call_id
    card = _held(body.messages).cards.get(call_id, {"toolCallId": call_id})
    card = {**card, "args": error.current_args, "digest": error.digest}
    start = {"type": "start", "messageId": body.messages[-1].id}
    return _encode(start) + _encode({"type": "data-handrail-card", "id": call_id, "data": card})


def _encode(chunk: dict[str, Any]) -> bytes:
    r"""One SSE frame (`data:` and the chunk's JSON, ending in a bare `\n\n`)."""
    return b"data: %b\n\n" % pydantic_core.to_json(chunk)


def _error(text: str) -> dict[str, Any]:
    return {"type": "error", "errorText": text}


def _suspended(pending: list[str]) -> dict[str, Any]:
    return {
        "type": "finish",
        "finishReason": "tool-calls",
        "messageMetadata": {"handrail": {"status": "suspended", "pending": pending}},
    }


class _Chunks:
    """Turns handrail events into UI message chunks, keeping which parts and steps are open."""

    def __init__(self, scratch: set[str], held: _Held) -> None:
        self.scratch = scratch  # agents whose text is working, not the reply: reasoning
        self.held = held  # the tool calls the client holds (their inputs and cards)
        self.text: str | None = None  # the open text part
        self.reasoning: str | None = None  # the open reasoning part
        self.step: Literal["none", "open", "closed"] = "none"
        self.usage: dict[str, int] = {"inputTokens": 0, "outputTokens": 0, "cachedTokens": 0}

    async def frames(self, event: Event) -> bytes:
        """The SSE frames of one handrail event (`pump`'s translation)."""
        return b"".join(_encode(chunk) for chunk in self.translate(event))

    def close(self) -> Iterator[dict[str, Any]]:
        """End the open text and reasoning parts."""
        if self.text is not None:
            yield {"type": "text-end", "id": self.text}
            self.text = None
        if self.reasoning is not None:
            yield {"type": "reasoning-end", "id": self.reasoning}
            self.reasoning = None

    def _open_step(self) -> Iterator[dict[str, Any]]:
        if self.step != "open":
            yield {"type": "start-step"}
            self.step = "open"

    def translate(self, event: Event) -> Iterator[dict[str, Any]]:
        """The chunks for one handrail event (none for those the protocol has no word for)."""
        if isinstance(event, TextDelta) and event.agent in self.scratch:
            event = ReasoningDelta(
                agent=event.agent, message_id=event.message_id, delta=event.delta
            )
        if isinstance(event, TextDelta):
            if not event.delta:
                return
            yield from self._open_step()
            if self.text != event.message_id:
                yield from self.close()
                self.text = event.message_id
                yield {"type": "text-start", "id": event.message_id}
            yield {"type": "text-delta", "id": event.message_id, "delta": event.delta}
        elif isinstance(event, ReasoningDelta):
            if not event.delta:
                return
            yield from self._open_step()
            reasoning_id = f"{event.message_id}-reasoning"
            if self.reasoning != reasoning_id:
                yield from self.close()
                self.reasoning = reasoning_id
                yield {"type": "reasoning-start", "id": reasoning_id}
            yield {"type": "reasoning-delta", "id": reasoning_id, "delta": event.delta}
        elif isinstance(event, ToolCallStarted):
            yield from self.close()
            yield from self._announce(event.tool_call_id, event.name, event.args, event)
            yield from self._amended(event)
        elif isinstance(event, ApprovalRequired | InputRequired | ClientExecRequired):
            yield from self.close()
            yield from self._announce(event.tool_call_id, event.name, event.args, event)
            yield from self._card(event)
        elif isinstance(event, ToolCallCompleted):
            yield from self.close()
            yield from self._announce(event.tool_call_id, event.name, None, event)
            yield self._result(event)
            yield from _sources(event)
        elif isinstance(event, UsageEvent):
            yield from self.close()
            yield from self._open_step()
            yield {"type": "finish-step"}
            self.step = "closed"  # the calls of this response still belong to its step
            self.usage["inputTokens"] += event.input_tokens
            self.usage["outputTokens"] += event.output_tokens
            self.usage["cachedTokens"] += event.cached_tokens
            yield {"type": "data-handrail-usage", "id": "usage", "data": dict(self.usage)}
        elif isinstance(event, RunCompleted):
            yield from self.close()
            yield {
                "type": "finish",
                "finishReason": "stop",
                "messageMetadata": {"handrail": {"status": "completed", "pending": []}},
            }
        elif isinstance(event, RunSuspended):
            yield from self.close()
            yield _suspended(event.pending)
        elif isinstance(event, RunFailed):
            yield from self.close()
            yield _error(f"{event.reason}: {event.error or 'The run failed.'}")
            yield {"type": "finish", "finishReason": "error"}

    def _announce(
        self, tool_call_id: str, name: str, args: Any, event: Event
    ) -> Iterator[dict[str, Any]]:
        if tool_call_id in self.held.inputs:
            return
        self.held.inputs[tool_call_id] = args
        if self.step == "none":
            yield from self._open_step()
        common: dict[str, Any] = {"toolCallId": tool_call_id, "toolName": name}
        if getattr(event, "executor", None) == "provider":  # a hosted search, say
            common["providerExecuted"] = True
        yield {"type": "tool-input-start", **common}
        if args is not None:
            text = pydantic_core.to_json(args).decode()
            yield {"type": "tool-input-delta", "toolCallId": tool_call_id, "inputTextDelta": text}
        yield {"type": "tool-input-available", **common, "input": args}

    def _amended(self, event: ToolCallStarted) -> Iterator[dict[str, Any]]:
        """The input that runs, when it is not the one the client's part shows (amended).

        A second `tool-input-available` for the call updates its part in place (`useChat`
        finds it in the current step: no `start-step` comes before it), and the call's card
        follows with the arguments and their digest.
        """
        call_id, args = event.tool_call_id, event.args
        if args is None or self.held.inputs.get(call_id) == args:
            return
        self.held.inputs[call_id] = args
        common: dict[str, Any] = {"toolCallId": call_id, "toolName": event.name}
        if event.executor == "provider":
            common["providerExecuted"] = True
        yield {"type": "tool-input-available", **common, "input": args}
        card = self.held.cards.get(call_id)
        if card is not None:
            card = {**card, "args": args, "digest": args_digest(event.name, args)}
            self.held.cards[call_id] = card
            yield {"type": "data-handrail-card", "id": call_id, "data": card}

    def _card(
        self, event: ApprovalRequired | InputRequired | ClientExecRequired
    ) -> Iterator[dict[str, Any]]:
        card: dict[str, Any] = {"toolCallId": event.tool_call_id, "tool": event.name}
        if isinstance(event, ApprovalRequired):
            yield {
                "type": "tool-approval-request",
                "approvalId": event.tool_call_id,
                "toolCallId": event.tool_call_id,
            }
            card |= {
                "kind": event.kind,
                "prompt": event.prompt,
                "args": event.args,
                "digest": event.digest,
                "amendable": event.amendable,
                "agent": event.agent,
            }
        elif isinstance(event, InputRequired):
            card |= {"kind": "input", "prompt": event.prompt, "args": event.args}
            card["outputSchema"] = event.output_schema
        else:
            card |= {"kind": "client_exec", "args": event.args}
        self.held.cards[event.tool_call_id] = card
        yield {"type": "data-handrail-card", "id": event.tool_call_id, "data": card}

    def _result(self, event: ToolCallCompleted) -> dict[str, Any]:
        """The tool part's output chunk: available, error or denied."""
        common: dict[str, Any] = {"toolCallId": event.tool_call_id}
        if event.executor == "provider":
            common["providerExecuted"] = True
        if event.status == "rejected":
            return {"type": "tool-output-denied", "toolCallId": event.tool_call_id}
        if not event.ok:
            text = event.error or event.summary or f"The call {event.status}."
            chunk = {"type": "tool-output-error", **common, "errorText": text}
            if event.code is not None:  # `useChat` keeps it on the part (`toolMetadata`)
                chunk["toolMetadata"] = {"code": event.code}
            return chunk
        output = {"status": event.status, "summary": event.summary, "digest": event.digest}
        if event.reused_from:  # not run again: the result of that earlier, identical call
            output["reused_from"] = event.reused_from
        return {"type": "tool-output-available", **common, "output": output}


def _sources(event: ToolCallCompleted) -> Iterator[dict[str, Any]]:
    """`source-url` chunks for the pages a provider's web search found.

    `useChat` lists them as the message's sources; only http(s) addresses, each once.
    """
    digest = event.digest
    if event.executor != "provider" or not event.ok or not isinstance(digest, dict):
        return
    seen: set[str] = set()
    for number, source in enumerate(digest.get("sources") or []):
        url = source.get("url") if isinstance(source, dict) else None
        if not isinstance(url, str) or not url.startswith(("https://", "http://")) or url in seen:
            continue
        seen.add(url)
        chunk: dict[str, Any] = {
            "type": "source-url",
            "sourceId": f"{event.tool_call_id}-{number}",
            "url": url,
        }
        if isinstance(source.get("title"), str):
            chunk["title"] = source["title"]
        yield chunk


def _stream_failed(error: Exception, session_id: str) -> str:
    """Log a UI message stream's failure, once; the reference its client is shown."""
    reference = new_reference()
    log_failure(
        _log,
        "The UI message stream failed",
        error,
        reference=reference,
        session_id=session_id,
    )
    return reference
