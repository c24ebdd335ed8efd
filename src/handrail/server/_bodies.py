"""The HTTP API's request and response bodies (pydantic: validated in, described in OpenAPI)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, field_validator

from ..audit import AuditEntry, AuditKind, AuditProblem
from ..engine import PendingCard
from ..exceptions import UserError
from ..inbox import read_cursor
from ..messages import ApprovalCardPart, CardKind, Message, ToolCallStatus
from ..store import SessionStatus
from ..suspension import ArgChange, Decision, card_state

__all__ = [
    "MAX_NUMBER",
    "AgentBody",
    "AuditBody",
    "AuditQuery",
    "AuditVerifyBody",
    "CallOutcomeBody",
    "ClientQuery",
    "DecidedBody",
    "DecidedItem",
    "DecidedQuery",
    "DomainBody",
    "ErrorBody",
    "EventsQuery",
    "ListQuery",
    "MeBody",
    "MessagesBody",
    "MessagesQuery",
    "ResolutionBody",
    "ResolveBody",
    "ResolveItem",
    "SessionBody",
    "SessionSummaryBody",
    "SessionsBody",
    "ToolBody",
    "TurnAccepted",
    "TurnBody",
]


MAX_NUMBER = 2**53
"""The largest offset or event number a request may give (exact in JSON, and in every store's
integers): a larger one is refused before it reaches a store."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- requests -------------------------------------------------------------------------------


class TurnBody(_Strict):
    """A user message: the turn it starts runs in the background."""

    text: str = Field(min_length=1, description="The user's message.")
    route: str | None = Field(None, description="The domain's route to take (default: its own).")
    context: dict[str, Any] | None = Field(
        None,
        description="The per-turn context (the page, the record the user is on, the locale): "
        "validated against the domain's context model (422 `invalid_context` naming the "
        "field), stored with the turn, read by tools and bindings, never shown to the model "
        "unless the instructions say so.",
    )


class ResolveItem(_Strict):
    """A decision on one pending call. `by` is always the authenticated user."""

    tool_call_id: str = Field(min_length=1, description="The pending call.")
    decision: Decision = Field(
        description="approve (amending `amendable` arguments), reject, "
        "answer (a human tool) or client_result (a client tool)."
    )


class ResolveBody(RootModel[ResolveItem | Annotated[list[ResolveItem], Field(min_length=1)]]):
    """One decision, or several recorded together (all of them, or none)."""


class ClientQuery(_Strict):
    """Whether the caller can run `client` tools."""

    client: bool = Field(
        False,
        description="The caller runs client tools: their calls wait for it to post the result "
        "(without it they fail at once).",
    )


class ListQuery(_Strict):
    """A page of the caller's sessions."""

    status: SessionStatus | None = Field(None, description="Only sessions in this status.")
    limit: int = Field(50, ge=1, le=500, description="At most this many.")
    offset: int = Field(0, ge=0, le=MAX_NUMBER, description="Skip this many first.")
    to_decide: bool = Field(
        False,
        description="Instead of the caller's sessions: those of others in its organisation "
        "that wait for a decision the caller may make. `limit` and `offset` then page the "
        "organisation's suspended sessions, so a page may hold fewer than `limit`.",
    )


class AuditQuery(_Strict):
    """A page of the caller's organisation's audit trail."""

    after: int = Field(
        0, ge=0, le=MAX_NUMBER, description="Only entries after this one (the last `seq` seen)."
    )
    limit: int = Field(
        100, ge=1, le=1000, description="At most this many (JSON; JSON lines: every entry)."
    )
    session_id: str | None = Field(None, description="Only this session's entries.")
    tool: str | None = Field(None, description="Only this tool's entries.")
    kind: AuditKind | None = Field(None, description="Only decisions, or only calls.")


class DecidedQuery(_Strict):
    """A page of the caller's own decisions, newest first."""

    before: int | None = Field(
        None,
        ge=1,
        le=MAX_NUMBER,
        description="Only decisions older than this one: the `before` of the page before.",
    )
    limit: int = Field(20, ge=1, le=200, description="At most this many.")


class PendingQuery(_Strict):
    """A page of the inbox: the cards of the organisation the caller may decide."""

    tool: str | None = Field(None, max_length=200, description="Only cards of this tool.")
    kind: CardKind | None = Field(None, description="Only cards of this kind.")
    older_than: float | None = Field(
        None, ge=0, le=MAX_NUMBER, description="Only cards raised at least this many seconds ago."
    )
    newer_than: float | None = Field(
        None, ge=0, le=MAX_NUMBER, description="Only cards raised less than this many seconds ago."
    )
    session_id: str | None = Field(
        None, min_length=1, max_length=200, description="Only this session's cards."
    )
    limit: int = Field(50, ge=1, le=500, description="At most this many cards.")
    cursor: str | None = Field(
        None,
        pattern=r"^Wz[A-Za-z0-9_-]{1,400}$",
        description="Where to go on from: the `next` of the page before.",
    )

    @field_validator("cursor")
    @classmethod
    def _a_cursor(cls, value: str | None) -> str | None:
        """A token a page gave, or a 422 (not the engine's 409) for one it did not."""
        try:
            read_cursor(value)
        except UserError as error:
            raise ValueError(str(error)) from None
        return value


class EventsQuery(_Strict):
    """Where a stream of a session's events starts, and whether it ends."""

    after: int | None = Field(
        None,
        ge=0,
        le=MAX_NUMBER,
        description="Start after this event (default: `Last-Event-ID`, else 0).",
    )
    follow: bool = Field(
        False, description="Keep streaming after the turn ends (default: end after it)."
    )


class MessagesQuery(_Strict):
    """A page of a session's history."""

    before: int | None = Field(
        None,
        ge=0,
        le=MAX_NUMBER,
        description="Only messages before this position (default: the newest).",
    )
    limit: int = Field(50, ge=1, le=500, description="At most this many, the latest.")


# -- responses ------------------------------------------------------------------------------


class SessionSummaryBody(BaseModel):
    """A session without its conversation."""

    id: str
    status: SessionStatus = Field(description="active, suspended, completed or failed.")
    running: bool = Field(description="A turn of the session is running on this server.")
    created_at: float
    updated_at: float
    user_id: str | None = Field(
        None, description="Whose session it is: who wrote its user messages (its requester)."
    )
    title: str | None = Field(
        None,
        description="A name for people: the session's first user message, trimmed to 80 "
        "characters (null until it has one).",
    )


class AuditBody(BaseModel):
    """A page of an organisation's audit trail, oldest first."""

    entries: list[AuditEntry] = Field(description="The entries, in the order of their `seq`.")
    after: int | None = Field(
        description="Pass as `after` for the next page (None: this page is the last)."
    )


class AuditVerifyBody(BaseModel):
    """Whether the organisation's trail holds together (`handrail audit verify`'s check)."""

    holds: bool = Field(description="No problem of severity `error` (warnings may remain).")
    count: int = Field(description="The entries checked: the whole trail.")
    keyed: int = Field(description="Of them, those hashed with a key.")
    last: str = Field(description="The anchor of the last entry, `SEQ:HASH` (keep it away).")
    problems: list[AuditProblem] = Field(
        description="Where it does not hold, in the trail's order (`handrail.audit.verify`)."
    )


class DecidedItem(BaseModel):
    """One decision (or approval) the caller made: its audit entry, in short."""

    seq: int = Field(description="The entry's number in the organisation's audit trail.")
    session_id: str
    tool_call_id: str
    tool: str = Field(description="The tool's name (`handrail.apply` for a batch card).")
    decision: str | None = Field(
        description="`approve`, `reject`, `answer` or `client_result` (an approval of a call "
        "that needs several is an `approve`)."
    )
    at: float = Field(description="When it was made (epoch seconds).")
    owner: str | None = Field(
        description="The session's user (null: the session is gone, or has no user)."
    )


class DecidedBody(BaseModel):
    """A page of the caller's own decisions, newest first (`GET /me/decided`)."""

    decisions: list[DecidedItem]
    before: int | None = Field(
        description="Pass as `before` for the next, older page (None: this page is the last)."
    )


class MeBody(BaseModel):
    """The caller, as the server knows it."""

    org_id: str
    user_id: str
    roles: list[str]
    audit: bool = Field(description="It may read the organisation's audit trail (`GET /audit`).")


class CallOutcomeBody(BaseModel):
    """What came of a decided call, for whoever decided it (and the session's owner)."""

    tool_call_id: str
    tool_name: str
    kind: CardKind
    decision: str | None = Field(description="The decision, once made (null: still waiting).")
    decided_by: list[str] = Field(
        description="Who decided: every approver of the arguments that ran, when several did."
    )
    approved_by: list[str] = Field(
        description="While it waits: who approved its current arguments so far."
    )
    status: ToolCallStatus | None = Field(
        description="The call's status (null for a batch card: see `output`)."
    )
    args: dict[str, Any] | None = Field(
        None,
        description="The arguments it runs with (or ran with): the proposal as approvers "
        "amended it (null for a batch card: see `output`).",
    )
    changes: dict[str, ArgChange] = Field(
        default_factory=dict,
        description="What `args` change from the model's proposal, by name.",
    )
    summary: str | None = Field(None, description="Its result's summary, once it ran.")
    error: str | None = Field(None, description="Why it failed, when it did.")
    digest: Any = Field(None, description="Its result's digest, once it ran.")
    output: Any = Field(
        None, description="A batch card's report once applied, or the answer given."
    )
    session_status: SessionStatus
    running: bool = Field(description="A turn of the session runs on this server now.")
    done: bool = Field(
        description="Decided, and nothing more will change: the call ran, failed or was "
        "rejected (or the turn ended without running it)."
    )


class SessionsBody(BaseModel):
    """A page of the caller's sessions, most recently updated first."""

    sessions: list[SessionSummaryBody]


class PendingBody(BaseModel):
    """A page of the inbox: full unless it is the last one (`next` is then null)."""

    cards: list[PendingCard] = Field(
        description="Cards the caller may decide, of the most recently updated sessions first."
    )
    next: str | None = Field(
        description="The `cursor` of the next page, or null: there is nothing more."
    )


@dataclass(kw_only=True, slots=True)
class PendingCardPart(ApprovalCardPart):
    """A waiting card as the API shows it: the stored card and where it stands now."""

    current_args: dict[str, Any]
    """The arguments the call runs with if it is approved now (`args` as approvers amended
    them so far)."""
    digest: str
    """The digest of `current_args`: a decision names it (`digest`) to decide on exactly
    these; one made on other arguments is refused (409 `arguments_changed`)."""
    approved_by: list[str]
    """Who approved exactly `current_args` so far."""
    changes: dict[str, ArgChange]
    """What `current_args` change from the model's proposal (`args`), by name."""

    @classmethod
    def of(cls, card: ApprovalCardPart) -> PendingCardPart:
        """`card` with where it stands (`handrail.suspension.card_state`)."""
        stands = card_state(card)
        stored = {f.name: getattr(card, f.name) for f in fields(ApprovalCardPart)}
        return cls(
            **stored,
            current_args=stands.args,
            digest=stands.digest,
            approved_by=stands.approved_by,
            changes=stands.changes,
        )


class SessionBody(SessionSummaryBody):
    """A session: its conversation and the calls waiting for a decision."""

    messages: list[Message] = Field(
        description="The conversation as a turn reads it: the whole history, or, when a "
        "compaction summary covers its start, the messages after it (from position `first`)."
    )
    first: int = Field(
        0,
        description="The position in the history of `messages[0]`: earlier messages are read "
        "with `GET /sessions/{id}/messages?before=<first>`.",
    )
    pending: list[PendingCardPart] = Field(
        description="The cards waiting for a decision, each with where it stands: the "
        "arguments that run if it is approved now (`current_args`), their `digest` (a "
        "decision names it), who approved them so far, and what they change."
    )
    scratch: dict[str, list[Message]] = Field(
        default_factory=dict,
        description="The turn in progress's messages kept out of the conversation, by agent "
        "(the supervisor's, and those of agents with `scratch=True`): their tool calls and "
        "notes. When the turn ends they move into `messages`, marked `scratch`, in the order "
        "things happened; a suspended turn keeps them here until it ends.",
    )
    context: dict[str, Any] | None = Field(
        None,
        description="The per-turn context of the session's latest turn (the one running or "
        "suspended, else the last one), as validated against the domain's `context_model`: "
        "the page, the record the user was on. Null when that turn carried none.",
    )


class MessagesBody(BaseModel):
    """A page of a session's history, oldest first."""

    messages: list[Message]
    first: int = Field(
        description="The position in the history of `messages[0]` (0 for an empty page): the "
        "page before this one is `?before=<first>`, and there is none before 0."
    )


class DecisionPolicyBody(BaseModel):
    """Who may decide a tool's calls (`handrail.policy.DecisionPolicy`)."""

    roles: list[str] = Field(description="A decider needs one of these (empty: anyone of the org).")
    four_eyes: bool = Field(
        description="The requester may not approve, answer or post the result of their own call."
    )
    approvals: int = Field(
        description="How many different people must approve a call, with the same arguments."
    )
    withdraw: bool = Field(
        True, description="The requester may reject (withdraw) their own call without a role."
    )


class ToolBody(BaseModel):
    """A tool, as a UI needs it: to show its calls and build the forms of their cards."""

    name: str
    description: str
    parameters: dict[str, Any] = Field(description="JSON Schema of the arguments.")
    output_schema: dict[str, Any] | None = Field(
        None, description="JSON Schema of the output (a `human` tool's answer), if declared."
    )
    permission: str = Field(description="read, draft, write or destructive.")
    executor: str = Field(description="server, human, client or provider.")
    gated: bool = Field(description="A person approves each call before it runs.")
    amendable: list[str] = Field(description="The arguments a person may change when approving.")
    decision_policy: DecisionPolicyBody | None = Field(
        None, description="Who may decide its calls (null: the person who requested them)."
    )


class AgentBody(BaseModel):
    """An agent of the domain."""

    name: str
    scratch: bool = Field(description="Its messages stay out of the conversation.")
    supervisor: bool = Field(description="It routes each turn (its text is the route).")


class DomainBody(BaseModel):
    """The engine's agents and tools."""

    agents: list[AgentBody]
    tools: list[ToolBody]


class TurnAccepted(BaseModel):
    """A turn started: stream its events from `after`."""

    session_id: str
    after: int = Field(description="The number of the event before the turn's first.")
    events: str = Field(description="The URL of the stream of the turn's events.")


class ResolutionBody(BaseModel):
    """What a resolution decided, and whether the turn resumed."""

    decided: list[str]
    pending: list[str]
    resumed: bool = Field(description="Nothing was left pending, and the turn resumed.")
    after: int | None = Field(
        None, description="When resumed: the number of the event before the resumption's first."
    )
    events: str | None = Field(
        None,
        description="When resumed and the caller owns the session: the URL of its stream (a "
        "colleague who decided cannot read it).",
    )


class _Error(BaseModel):
    type: str = Field(description="A stable name: not_found, stale_resolution, ...")
    message: str = Field(description="What went wrong, for a person.")
    details: list[dict[str, Any]] | None = Field(
        None, description="For invalid_request: each problem, with where it is (`loc`)."
    )
    request_id: str = Field(description="The request's id (its X-Request-ID), as logged.")


class ErrorBody(BaseModel):
    """Every error answers this."""

    error: _Error


class InterruptBody(BaseModel):
    """The turn was asked to stop; its stream ends with `run-failed` (interrupted)."""

    interrupted: Literal[True] = True
