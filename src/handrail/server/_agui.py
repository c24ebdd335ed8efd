"""`agui_operation`: the AG-UI 1.0 endpoint, `POST /agui`, over the same turns and event log.

An AG-UI client (`@ag-ui/client`'s `HttpAgent`) posts a `RunAgentInput` and reads AG-UI events
back as Server-Sent Events. Each thread is a handrail session of the caller's, made on first
use; a suspended turn (an approval, a person's answer, a client-run tool) ends its AG-UI run
with an interrupt outcome, and the next input answers the interrupts (`resume`) to go on.
See `docs/agui.md` for the mapping and what AG-UI cannot say.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Iterator
from typing import TYPE_CHECKING, Any

import pydantic_core
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
)
from ..exceptions import HandrailError, MissingExtraError
from ..messages import ApprovalCardPart
from ..state import RunState
from ..store import SessionStore
from ..suspension import Answer, ClientResult, Decision, Reject, card_state
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
from ._errors import http_message
from ._openapi import Operation
from ._sse import EventStream

try:
    from ag_ui import core as agui
except ImportError as exc:  # pragma: no cover - the server extra brings it
    raise MissingExtraError("The AG-UI endpoint", needs="ag-ui-protocol", extra="server") from exc

if TYPE_CHECKING:
    from ._api import Api

__all__ = ["agui_operation", "thread_session_id"]

_log = logging.getLogger("handrail.server")


def thread_session_id(caller: Caller, thread_id: str, store: SessionStore | None = None) -> str:
    """The handrail session of `caller`'s AG-UI thread `thread_id` (see `chat_session_id`)."""
    return chat_session_id(caller, thread_id, prefix="agui", store=store)


def agui_operation(api: Api, path: str = "/agui") -> Operation:
    """The `POST /agui` operation of the app's `Api` (`create_app` mounts it)."""
    return Operation(
        "POST",
        path,
        _Endpoint(api).run,
        "AG-UI: run or resume the caller's thread; its AG-UI events stream in the answer",
        body=agui.RunAgentInput,
        stream=True,
        foreign_events="AG-UI 1.0 events (docs/agui.md)",
        errors=(403, 409),
    )


class _Endpoint:
    def __init__(self, api: Api) -> None:
        self.api = api

    async def run(self, request: Request) -> Response:
        """`POST /agui`: run (or resume) the caller's thread; its AG-UI events, as SSE."""
        api = self.api
        caller = await api._caller(request)
        body = await api._body(request, agui.RunAgentInput)
        session_id = thread_session_id(caller, body.thread_id, api.store)
        api.limits.check_stream(caller)
        if not body.resume:  # a new message starts a turn: refused here, before the 200
            users = [_text(m) for m in body.messages if m.role == "user"]
            text = users[-1] if users else None
            await api.admit(caller, via="agui", session_id=session_id, text=text)
            api.limits.turn(caller, api.runs.running_for(caller.org_id))
            api.engine.domain.check_context(turn_context(body))  # a bad one: 422, before the 200
        return EventStream(
            self._frames(caller, session_id, body),
            ping=api.ping_interval,
            send_timeout=api.send_timeout,
        )

    async def _frames(
        self, caller: Caller, session_id: str, body: agui.RunAgentInput
    ) -> AsyncGenerator[bytes, None]:
        api = self.api
        api.limits.open_stream(caller)
        out = _Translator(body.thread_id, body.run_id, scratch_agents(api))
        try:
            yield _encode(
                agui.RunStartedEvent(
                    thread_id=body.thread_id,
                    run_id=body.run_id,
                    protocol_version=agui.PROTOCOL_VERSION,
                )
            )
            try:
                after, announced = await self._start(caller, session_id, body)
            except ChatRefusal as refusal:
                yield _encode(agui.RunErrorEvent(message=refusal.message, code=refusal.code))
                return
            except HandrailError as error:
                message = http_message(error, endpoints=False)
                yield _encode(agui.RunErrorEvent(message=message, code=type(error).__name__))
                return
            out.announced.update(announced)
            if after is None:  # decisions recorded, more still pending: nothing ran
                state = await api.engine.session(
                    session_id, org_id=caller.org_id, user_id=caller.user_id
                )
                yield _encode(out.interrupted(state, api))
                return

            async def translate(event: Event) -> bytes:
                if isinstance(event, RunSuspended):
                    out_events = list(out.close())
                    state = await api.engine.session(
                        session_id, org_id=caller.org_id, user_id=caller.user_id
                    )
                    out_events.append(out.interrupted(state, api))
                else:
                    out_events = list(out.translate(event))
                return b"".join(_encode(e) for e in out_events)

            async for chunk in pump(api, caller, session_id, Cursor(after), translate):
                yield chunk
        except Exception as error:
            reference = new_reference()
            log_failure(
                _log, "The AG-UI stream failed", error, reference=reference, session_id=session_id
            )
            yield _encode(
                agui.RunErrorEvent(
                    message=f"The stream failed on the server (reference {reference}).",
                    code="stream_failed",
                )
            )
        finally:
            api.limits.close_stream(caller)

    async def _start(
        self, caller: Caller, session_id: str, body: agui.RunAgentInput
    ) -> tuple[int | None, set[str]]:
        """Start the turn the input asks for.

        Returns:
            The number of the event before its first (None: decisions were recorded, but
            calls are still pending), and the tool calls the client has seen already.
        """
        api = self.api
        client = bool(body.tools)
        state = await chat_state(api, caller, session_id)
        if body.resume:
            if state is None or not state.pending:
                raise ChatRefusal(
                    "nothing_to_resume", "This thread has no pending interrupt to resume."
                )
            decisions = {
                entry.interrupt_id: _decision(state, entry, caller) for entry in body.resume
            }
            after = await start_turn(api, caller, session_id, decisions=decisions, client=client)
            return after, set(decisions)
        if state is not None and state.pending:
            raise ChatRefusal(
                "interrupt_pending",
                "This thread waits for its interrupts: answer them in `resume` "
                f"({', '.join(state.pending)}).",
            )
        text = new_user_text([_text(m) for m in body.messages if m.role == "user"], state)
        context = turn_context(body)
        after = await start_turn(api, caller, session_id, text=text, client=client, context=context)
        return after, set()


def turn_context(body: agui.RunAgentInput) -> Any:
    """The per-turn context a run carries: `forwardedProps.context` (a JSON object).

    AG-UI's own `context` list is text for the agent's model; handrail's per-turn context is
    the application's, never shown to the model, so it travels in `forwardedProps`.
    """
    props = body.forwarded_props
    return props.get("context") if isinstance(props, dict) else None


def _text(message: Any) -> str:
    """A user message's text (the text parts of a multi-part message, joined)."""
    content: Any = message.content
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") for part in content)


def _decision(state: RunState, entry: agui.ResumeEntry, caller: Caller) -> Decision:
    """The handrail decision a resume entry stands for, checked against its card."""
    card = state.pending.get(entry.interrupt_id)
    if card is None:
        raise ChatRefusal(
            "unknown_interrupt",
            f"No pending interrupt {entry.interrupt_id!r} in this thread "
            f"(pending: {', '.join(state.pending) or 'none'}).",
        )
    by = caller.user_id
    if entry.status == "cancelled":
        return Reject(reason="The interrupt was cancelled.", by=by)
    payload = entry.payload if entry.payload is not None else {}
    if not isinstance(payload, dict):
        raise ChatRefusal(
            "invalid_payload", f"Interrupt {card.tool_call_id}: the payload must be an object."
        )
    if card.kind in ("elicitation", "question"):
        if payload.get("approved") is False:
            return Reject(reason=payload.get("reason"), by=by)
        if "answer" not in payload:
            raise ChatRefusal(
                "invalid_payload", f"Interrupt {card.tool_call_id}: send {{answer: ...}}."
            )
        return Answer(output=payload["answer"], by=by)
    if card.kind == "client_exec":
        if payload.get("approved") is False:
            return Reject(reason=payload.get("reason"), by=by)
        return ClientResult(output=payload.get("output"), error=payload.get("error"), by=by)
    approved = payload.get("approved")
    if not isinstance(approved, bool):
        raise ChatRefusal(
            "invalid_payload",
            f"Interrupt {card.tool_call_id}: send {{approved: true|false, editedArgs?}}.",
        )
    if not approved:
        return Reject(reason=payload.get("reason"), by=by)
    return chat_approval(
        card, payload.get("editedArgs"), payload.get("digest"), field="editedArgs", by=by
    )


def _encode(event: agui.BaseEvent) -> bytes:
    r"""One SSE frame (`data:` and the event's JSON, lines ending in a bare `\n`)."""
    return b"data: %b\n\n" % event.model_dump_json(by_alias=True, exclude_none=True).encode()


class _Translator:
    """Turns handrail events into AG-UI events, keeping which messages and calls are open."""

    def __init__(self, thread_id: str, run_id: str, scratch: set[str]) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.scratch = scratch  # agents whose text is working, not the reply: reasoning
        self.text: str | None = None  # the open text message
        self.reasoning: str | None = None  # the open reasoning message
        self.announced: set[str] = set()  # tool calls the client has been shown

    def close(self) -> Iterator[agui.BaseEvent]:
        """End the open text and reasoning messages."""
        if self.text is not None:
            yield agui.TextMessageEndEvent(message_id=self.text)
            self.text = None
        if self.reasoning is not None:
            yield agui.ReasoningMessageEndEvent(message_id=self.reasoning)
            yield agui.ReasoningEndEvent(message_id=self.reasoning)
            self.reasoning = None

    def translate(self, event: Event) -> Iterator[agui.BaseEvent]:
        """The AG-UI events for one handrail event (none for those AG-UI has no word for)."""
        if isinstance(event, TextDelta) and event.agent in self.scratch:
            event = ReasoningDelta(
                agent=event.agent, message_id=event.message_id, delta=event.delta
            )
        if isinstance(event, TextDelta):
            if not event.delta:
                return
            if self.text != event.message_id:
                yield from self.close()
                self.text = event.message_id
                yield agui.TextMessageStartEvent(
                    message_id=event.message_id, role="assistant", name=event.agent
                )
            yield agui.TextMessageContentEvent(message_id=event.message_id, delta=event.delta)
        elif isinstance(event, ReasoningDelta):
            reasoning_id = f"{event.message_id}-reasoning"
            if self.reasoning != reasoning_id:
                yield from self.close()
                self.reasoning = reasoning_id
                yield agui.ReasoningStartEvent(message_id=reasoning_id)
                yield agui.ReasoningMessageStartEvent(message_id=reasoning_id)
            yield agui.ReasoningMessageContentEvent(message_id=reasoning_id, delta=event.delta)
        elif isinstance(
            event, ToolCallStarted | ApprovalRequired | InputRequired | ClientExecRequired
        ):
            yield from self.close()
            yield from self._announce(event.tool_call_id, event.name, event.args)
        elif isinstance(event, ToolCallCompleted):
            yield from self.close()
            yield from self._announce(event.tool_call_id, event.name, None)
            content = {
                "ok": event.ok,
                "status": event.status,
                "summary": event.summary,
                "digest": event.digest,
                "error": event.error,
                "code": event.code,
                "executor": event.executor,  # `provider`: the model provider ran it
                "reused_from": event.reused_from,  # not run again: that call's result
            }
            yield agui.ToolCallResultEvent(
                message_id=f"{event.tool_call_id}-result",
                tool_call_id=event.tool_call_id,
                content=pydantic_core.to_json(content).decode(),
                role="tool",
            )
        elif isinstance(event, RunCompleted):
            yield from self.close()
            yield agui.RunFinishedEvent(
                thread_id=self.thread_id, run_id=self.run_id, result=event.output
            )
        elif isinstance(event, RunFailed):
            yield from self.close()
            yield agui.RunErrorEvent(
                message=event.error or f"The run failed ({event.reason}).", code=event.reason
            )

    def _announce(self, tool_call_id: str, name: str, args: Any) -> Iterator[agui.BaseEvent]:
        if tool_call_id in self.announced:
            return
        self.announced.add(tool_call_id)
        yield agui.ToolCallStartEvent(tool_call_id=tool_call_id, tool_call_name=name)
        if args is not None:
            yield agui.ToolCallArgsEvent(
                tool_call_id=tool_call_id, delta=pydantic_core.to_json(args).decode()
            )
        yield agui.ToolCallEndEvent(tool_call_id=tool_call_id)

    def interrupted(self, state: RunState, api: Api) -> agui.BaseEvent:
        """`RUN_FINISHED` with the interrupt outcome: one interrupt per pending card."""
        interrupts = [_interrupt(card, api) for card in state.pending.values()]
        return agui.RunFinishedEvent(
            thread_id=self.thread_id,
            run_id=self.run_id,
            outcome=agui.RunFinishedInterruptOutcome(interrupts=interrupts),
        )


def _interrupt(card: ApprovalCardPart, api: Api) -> agui.Interrupt:
    stands = card_state(card)
    tool = next(
        (a.tools[card.tool_name] for a in api.engine.domain.agents if card.tool_name in a.tools),
        None,
    )
    schema: dict[str, Any]
    if card.kind in ("elicitation", "question"):
        answer: dict[str, Any] = {"type": "string"}
        if card.kind == "elicitation" and tool is not None and tool.output_adapter is not None:
            answer = tool.output_adapter.json_schema()
        schema = {"type": "object", "properties": {"answer": answer}, "required": ["answer"]}
        reason = "input_required"
    elif card.kind == "client_exec":
        schema = {
            "type": "object",
            "properties": {"output": {}, "error": {"type": "string"}},
        }
        reason = "client_tool"
    else:
        properties = tool.definition.parameters.get("properties", {}) if tool else {}
        edited = {name: properties.get(name, {}) for name in card.amendable}
        schema = {
            "type": "object",
            "properties": {
                "approved": {"type": "boolean"},
                "editedArgs": {
                    "type": "object",
                    "description": "The arguments in full (those that run now, in metadata); "
                    "only these fields may differ from them.",
                    "properties": edited,
                },
                "digest": {
                    "type": "string",
                    "description": "The digest in metadata: the arguments this decision is "
                    "made on. A decision on arguments that changed since is refused.",
                },
            },
            "required": ["approved"],
        }
        reason = "approval" if card.kind == "approval" else card.kind
    return agui.Interrupt(
        id=card.tool_call_id,
        reason=reason,
        message=card.prompt,
        tool_call_id=card.tool_call_id,
        response_schema=schema,
        metadata={
            "handrail": {
                "kind": card.kind,
                "tool": card.tool_name,
                "agent": card.agent,
                "args": stands.args,
                "digest": stands.digest,
                "proposedArgs": card.args,
                "changes": {
                    name: {"proposed": c.proposed, "now": c.now}
                    for name, c in stands.changes.items()
                },
                "approvedBy": stands.approved_by,
                "amendable": list(card.amendable),
            }
        },
    )
