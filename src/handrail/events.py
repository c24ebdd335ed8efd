"""Events: everything a run reports, as it happens.

One discriminated union on the `type` field; every event is JSON-serialisable through
`EVENTS` (the server writes them as Server-Sent Events). A turn ends with exactly one of
`run-completed`, `run-suspended` or `run-failed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import Field, TypeAdapter

from .messages import CardKind, Executor

__all__ = [
    "EVENT",
    "EVENTS",
    "AgentCompleted",
    "AgentStarted",
    "ApprovalRequired",
    "ClientExecRequired",
    "Event",
    "InputRequired",
    "ReasoningDelta",
    "RunCompleted",
    "RunFailed",
    "RunStarted",
    "RunSuspended",
    "TextDelta",
    "ToolCallCompleted",
    "ToolCallDelta",
    "ToolCallStarted",
    "ToolProgress",
    "UsageEvent",
]


@dataclass(kw_only=True, slots=True)
class RunStarted:
    """A run (one user turn, or its resumption) started."""

    run_id: str
    """Identifies the run."""
    session_id: str | None = None
    """The session, when the run belongs to one."""
    type: Literal["run-started"] = "run-started"


@dataclass(kw_only=True, slots=True)
class AgentStarted:
    """An agent started its loop."""

    agent: str
    """The agent's name."""
    type: Literal["agent-started"] = "agent-started"


@dataclass(kw_only=True, slots=True)
class TextDelta:
    """A piece of the assistant's text, as it streams."""

    agent: str
    """The agent writing."""
    message_id: str
    """The assistant message it belongs to."""
    delta: str
    """The new text."""
    type: Literal["text-delta"] = "text-delta"


@dataclass(kw_only=True, slots=True)
class ReasoningDelta:
    """A piece of the model's reasoning, as it streams."""

    agent: str
    """The agent reasoning."""
    message_id: str
    """The assistant message it belongs to."""
    delta: str
    """The new text."""
    type: Literal["reasoning-delta"] = "reasoning-delta"


@dataclass(kw_only=True, slots=True)
class ToolCallDelta:
    """A piece of a tool call the model is still writing (its arguments arrive in pieces)."""

    agent: str
    """The agent whose model is writing the call."""
    message_id: str
    """The assistant message the call will belong to."""
    index: int
    """Which call of the response this piece belongs to."""
    tool_call_id: str | None = None
    """The call's id, on the first piece (when the provider gives it)."""
    name: str | None = None
    """The tool's name, on the first piece."""
    args_delta: str = ""
    """More of the JSON arguments."""
    type: Literal["tool-call-delta"] = "tool-call-delta"


@dataclass(kw_only=True, slots=True)
class ToolCallStarted:
    """A tool call is dispatched: once a call, never twice.

    At once for a call that needs no decision (whether it then runs, is reused, is captured
    or fails validation); for a gated call, only when it runs after its approval. A call that
    never runs here (rejected, answered by a person, run by the client, or refused because
    the response it came in was unfinished) has no `tool-call-started`, only its
    `tool-call-completed`.
    """

    agent: str
    """The agent that called it."""
    tool_call_id: str
    """The call's id."""
    name: str
    """The tool's name."""
    args: dict[str, Any] | None
    """The arguments as parsed (None when they did not parse)."""
    executor: Executor = "server"
    """Who runs it: `provider` for a call the model provider ran (a hosted web search), which
    arrives with its result (its `tool-call-completed` follows at once)."""
    type: Literal["tool-call-started"] = "tool-call-started"


@dataclass(kw_only=True, slots=True)
class ToolProgress:
    """A progress update from a streaming (async generator) tool."""

    tool_call_id: str
    """The call reporting progress."""
    progress: Any
    """What the tool yielded (JSON-compatible)."""
    type: Literal["tool-progress"] = "tool-progress"


@dataclass(kw_only=True, slots=True)
class ToolCallCompleted:
    """A tool call has its result."""

    tool_call_id: str
    """The call's id."""
    name: str
    """The tool's name."""
    ok: bool
    """Whether it succeeded."""
    status: str
    """The part's final status (`completed`, `failed`, `interrupted`)."""
    summary: str | None = None
    """The UI line."""
    digest: Any = None
    """The UI projection of the output."""
    error: str | None = None
    """The error, when it failed."""
    code: str | None = None
    """Why it failed, for programs (a `ToolErrorCode`, or the tool's own code)."""
    reused_from: str | None = None
    """Set when an identical earlier call's result was reused."""
    duration_ms: float | None = None
    """How long dispatch took."""
    executor: Executor = "server"
    """Who ran it (`provider`: the model provider, e.g. a hosted web search)."""
    type: Literal["tool-call-completed"] = "tool-call-completed"


@dataclass(kw_only=True, slots=True)
class ApprovalRequired:
    """A gated call waits for a human's approval."""

    tool_call_id: str
    """The waiting call."""
    name: str
    """The tool's name."""
    args: dict[str, Any]
    """The proposed arguments."""
    prompt: str | None = None
    """What to ask."""
    amendable: list[str] = field(default_factory=list)
    """The argument names the human may change."""
    kind: CardKind = "approval"
    """What the card asks: `approval` (run this call?), `recovery` (this call may have run
    before a crash: retry, skip, or say it ran), `batch` (apply a headless run's actions); a
    recovered turn may also announce `elicitation` and `client_exec` cards this way."""
    digest: str | None = None
    """The digest of `args`: an approval names it (`Approve(digest=...)`) to approve
    exactly these arguments."""
    agent: str | None = None
    """The agent that proposed the call (on a batch card, the agent that proposed its
    actions, or the agents, comma-separated in order, when several did)."""
    type: Literal["approval-required"] = "approval-required"


@dataclass(kw_only=True, slots=True)
class InputRequired:
    """A human-executed call waits for a person's answer (elicitation)."""

    tool_call_id: str
    """The waiting call."""
    name: str
    """The tool's name."""
    args: dict[str, Any]
    """The arguments (the question)."""
    prompt: str | None = None
    """What to ask."""
    output_schema: dict[str, Any] | None = None
    """JSON Schema of the expected answer."""
    type: Literal["input-required"] = "input-required"


@dataclass(kw_only=True, slots=True)
class ClientExecRequired:
    """A client-executed call waits for the client to run it and post the result."""

    tool_call_id: str
    """The waiting call."""
    name: str
    """The tool's name."""
    args: dict[str, Any]
    """The arguments."""
    type: Literal["client-exec-required"] = "client-exec-required"


@dataclass(kw_only=True, slots=True)
class RunSuspended:
    """The run stopped to wait; it resumes when every pending call is resolved."""

    pending: list[str]
    """The ids of the waiting calls."""
    type: Literal["run-suspended"] = "run-suspended"


@dataclass(kw_only=True, slots=True)
class AgentCompleted:
    """An agent finished its loop."""

    agent: str
    """The agent's name."""
    output: Any = None
    """Its final output (text, or the structured output as JSON-compatible data)."""
    type: Literal["agent-completed"] = "agent-completed"


@dataclass(kw_only=True, slots=True)
class UsageEvent:
    """Token and request usage of one model call."""

    agent: str
    """The agent that made the call."""
    input_tokens: int = 0
    """Prompt tokens."""
    output_tokens: int = 0
    """Completion tokens."""
    cached_tokens: int = 0
    """Prompt tokens served from the provider's cache."""
    reasoning_tokens: int = 0
    """Output tokens spent on reasoning (part of `output_tokens`; where the provider says)."""
    finish_reason: str | None = None
    """Why the model stopped this response (`stop`, `tool_call`, `length`, `content_filter`,
    `pause`, `other`; see `handrail.models.FinishReason`); tool calls of a response that is not
    `stop` or `tool_call` are never run."""
    type: Literal["usage"] = "usage"


@dataclass(kw_only=True, slots=True)
class RunCompleted:
    """The run finished."""

    output: Any = None
    """The final output (text, or structured output as JSON-compatible data)."""
    stop_reason: str | None = None
    """Why: `answer`, `ends-turn` (a tool ended the turn), or `cut`: the answer is
    incomplete, the provider stopped it (`finish_reason` says why)."""
    finish_reason: str | None = None
    """Why the model stopped its last response (`stop`, `length`, ...; see `UsageEvent`)."""
    type: Literal["run-completed"] = "run-completed"


@dataclass(kw_only=True, slots=True)
class RunFailed:
    """The run ended without finishing."""

    reason: Literal["interrupted", "error", "max-iterations", "cut-off"]
    """Why: `interrupted`, `error` (the model or a hook failed; `error` says how),
    `max-iterations` (an iteration cap was reached before the agents finished: the turn's
    last message says so to the user) or `cut-off` (the store stopped answering mid-turn: the
    turn is left where it was, as a crash leaves it, and a worker finishes it once the store
    is back; nothing is lost)."""
    error: str | None = None
    """What went wrong, for a person."""
    reference: str | None = None
    """For `error`: the short reference the failure is logged under, with its traceback (a
    person quotes it to the operator; `handrail sessions show` shows it too)."""
    type: Literal["run-failed"] = "run-failed"


Event: TypeAlias = Annotated[
    RunStarted
    | AgentStarted
    | TextDelta
    | ReasoningDelta
    | ToolCallDelta
    | ToolCallStarted
    | ToolProgress
    | ToolCallCompleted
    | ApprovalRequired
    | InputRequired
    | ClientExecRequired
    | RunSuspended
    | AgentCompleted
    | UsageEvent
    | RunCompleted
    | RunFailed,
    Field(discriminator="type"),
]

EVENT: TypeAdapter[Event] = TypeAdapter(Event)
"""Validate and serialise one event: `EVENT.dump_json(ev)`, `EVENT.validate_json(raw)`."""
EVENTS: TypeAdapter[list[Event]] = TypeAdapter(list[Event])
"""Validate and serialise a list of events."""
