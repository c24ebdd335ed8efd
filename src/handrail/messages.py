"""Messages and their parts: the conversation as handrail stores it.

A tool call and its result live in ONE part (`ToolCallPart.result`), so they can never be
separated: not by compaction, not by a crash, not by a provider conversion. The provider
adapters expand a part into the call and the result message their API wants.

Every type here is a `@dataclass(kw_only=True, slots=True)` with a literal `type`
discriminator; `MESSAGES` is the one `TypeAdapter` for JSON in and out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import Field, TypeAdapter

from ._tool_result import ToolResult

__all__ = [
    "MESSAGES",
    "ApprovalCardPart",
    "CardApproval",
    "CardKind",
    "DecisionKind",
    "Executor",
    "Message",
    "Part",
    "ReasoningPart",
    "Role",
    "TextPart",
    "ToolCallPart",
    "ToolCallStatus",
    "ToolResult",
]

Role: TypeAlias = Literal["system", "user", "assistant"]
Executor: TypeAlias = Literal["server", "human", "client", "provider"]
ToolCallStatus: TypeAlias = Literal[
    "pending", "running", "waiting", "completed", "failed", "rejected", "interrupted"
]
"""`pending`: not dispatched yet; `running`: executing; `waiting`: suspended for a human or
a client (the result is a placeholder until the decision comes); `completed`/`failed`: the
result is final; `rejected`: a human refused the call, which never ran; `interrupted`: the
run was cancelled before the call produced a result (the result says so)."""
CardKind: TypeAlias = Literal[
    "approval", "elicitation", "question", "client_exec", "recovery", "batch"
]
"""What a card asks: approve a call, answer for a person (`human` tool), run it in the client,
decide about a call that may have run before a crash, or approve a captured run's actions as
one batch (`handrail.capture`)."""
DecisionKind: TypeAlias = Literal["approve", "reject", "answer", "client_result", "skip", "expire"]
"""How a card was decided (`expire`: nobody decided before its deadline)."""


@dataclass(kw_only=True, slots=True)
class TextPart:
    """Text written by the user, the model, or the engine."""

    text: str
    """The text."""
    synthetic: bool = False
    """Written by the engine, not by a person or the model (e.g. the `min_tool_calls` nudge)."""
    citations: list[dict[str, Any]] | None = None
    """The provider's citations of this text, as received (Anthropic's
    `web_search_result_location` has `url`, `title` and `cited_text`), for a UI to show the
    sources; the text is sent back without them."""
    type: Literal["text"] = "text"


@dataclass(kw_only=True, slots=True)
class ReasoningPart:
    """The model's reasoning ("thinking"), kept where the provider accepts it back."""

    text: str
    """The reasoning text (may be empty when the provider only returns a signature)."""
    signature: str | None = None
    """The provider's opaque signature, needed to send the reasoning back."""
    provider: str | None = None
    """Which provider produced it: reasoning is only replayed to that provider."""
    redacted: bool | None = None
    """The block was Anthropic's `redacted_thinking`; `signature` then holds its encrypted
    `data` (and `text` is empty). Thinking whose text was omitted is not redacted. None: a
    part stored before handrail told the two apart, read as it was then (no text: redacted)."""
    provider_blocks: list[dict[str, Any]] | None = None
    """The provider's own items for this reasoning, exactly as received, for a provider that
    wants them back unchanged: OpenAI Responses' `reasoning` item (its `id`, `summary` and
    `encrypted_content`). Sent back only to the provider that produced them."""
    type: Literal["reasoning"] = "reasoning"


@dataclass(kw_only=True, slots=True)
class ToolCallPart:
    """One tool call and, once it has one, its result.

    The arguments the model sent are kept verbatim in `raw_args`, so nothing the model said is
    lost and the model is shown its own call as it made it; `args` holds the validated
    arguments once validation passed (or the parsed ones when it did not).
    """

    id: str
    """The tool call id (the provider's, or one the engine made)."""
    name: str
    """The tool's name as the model called it."""
    args: dict[str, Any] = field(default_factory=dict)
    """The arguments (validated, once the pipeline got that far; the bound ones are in
    `bound`)."""
    raw_args: str | None = None
    """The arguments exactly as the model sent them (JSON text, valid or not); None for a call
    the engine made itself (a batch apply) or that a provider gave as an object."""
    bound: dict[str, Any] | None = None
    """The bound arguments (`Tool(bindings=...)`) as the dispatch read them from the context:
    never shown to the model. A captured call is applied with these; an approved call binds
    again from the context of its resumption (a binding that no longer resolves refuses it)."""
    status: ToolCallStatus = "pending"
    """Where the call is in its life."""
    result: ToolResult | None = None
    """The result, once there is one."""
    digest: Any = None
    """A small UI projection of the output (the tool's `digest`)."""
    executor: Executor = "server"
    """Who runs the tool."""
    provider: str | None = None
    """For a call the model provider ran (`executor="provider"`: a hosted web search, code
    execution, web fetch): which provider ran it (`"anthropic"`, `"openai-responses"`). Its
    `provider_blocks` are sent back only to that provider; any other reads a short note."""
    provider_blocks: list[dict[str, Any]] | None = None
    """For a call the model provider ran: the provider's own blocks (or items) for the call
    and its result, as received (JSON), sent back unchanged on the next request to the same
    provider. `result` and `digest` hold handrail's projection of them."""
    reused_from: str | None = None
    """Set when the result was reused from an identical call earlier this turn (its id); the
    model reads a "[Reused: ...]" line before the result."""
    cached: bool = False
    """The result came from the idempotent-tool cache."""
    started_at: float | None = None
    """When dispatch started (seconds since the epoch, from the runtime's clock)."""
    duration_ms: float | None = None
    """How long dispatch took."""
    captured: int | None = None
    """Set in capture mode (`handrail.capture`): the call's local index. It did not run; its
    result is the tool's `mint` prediction, and `apply` runs it later."""
    type: Literal["tool-call"] = "tool-call"


@dataclass(kw_only=True, slots=True)
class CardApproval:
    """One approval of a call that needs several (`DecisionPolicy(approvals=...)`)."""

    by: str | None
    """Who approved."""
    at: float
    """When (seconds since the epoch)."""
    amended_args: dict[str, Any] | None = None
    """The arguments this approval approved, in full, when they differ from the model's
    proposal (None: the proposal itself)."""
    args_digest: str | None = None
    """The digest of the exact arguments approved (`handrail.suspension.args_digest`). Only
    the approvals of the card's current arguments count toward it; None on an approval
    stored by an older handrail (its digest is then computed from `amended_args`)."""


@dataclass(kw_only=True, slots=True)
class ApprovalCardPart:
    """A request for a human decision about a tool call, and the decision once made."""

    tool_call_id: str
    """The call this card is about."""
    tool_name: str
    """The tool's name."""
    args: dict[str, Any]
    """The arguments as proposed."""
    prompt: str | None = None
    """What to ask the human."""
    amendable: list[str] = field(default_factory=list)
    """The argument names the human may change (a UI rebuilt from history needs them)."""
    kind: CardKind = "approval"
    """What is being asked."""
    executor: Executor = "server"
    """Who runs the tool (a gated `client` tool is asked twice: approval, then its result)."""
    agent: str | None = None
    """The agent that proposed the call (on a batch card, the agent that proposed its
    actions, or the agents, comma-separated in order, when several did; None on a card stored
    before cards named it)."""
    decision: DecisionKind | None = None
    """The decision, once made."""
    decided_by: str | None = None
    """Who decided."""
    decided_at: float | None = None
    """When (seconds since the epoch)."""
    amended_args: dict[str, Any] | None = None
    """The arguments the human changed, when they did."""
    reason: str | None = None
    """Why (e.g. a rejection reason)."""
    args_digest: str | None = None
    """Digest of the exact arguments that were approved: the call runs only with these."""
    output: Any = None
    """The answer (`answer`) or the client's result (`client_result`), as given."""
    created_at: float | None = None
    """When the card was raised (seconds since the epoch)."""
    expires_at: float | None = None
    """When it stops accepting a decision, if ever."""
    approvals: list[CardApproval] | None = None
    """The approvals given so far, for a call whose policy needs several (None otherwise):
    the card is decided when there are enough."""
    type: Literal["approval"] = "approval"


Part: TypeAlias = Annotated[
    TextPart | ReasoningPart | ToolCallPart | ApprovalCardPart, Field(discriminator="type")
]


@dataclass(kw_only=True, slots=True)
class Message:
    """One message of the conversation."""

    id: str
    """Unique within the session."""
    role: Role
    """Who wrote it."""
    parts: list[Part] = field(default_factory=list)
    """What it holds, in order."""
    agent: str | None = None
    """The agent that wrote it (assistant messages)."""
    scratch: bool = False
    """A message an agent kept out of the conversation (`Agent(scratch=True)`, the
    supervisor): its turn's scratch, kept in the history once the turn is over so that people
    see what was done. Never shown to a model again."""

    @property
    def text(self) -> str:
        """The concatenated text parts."""
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def tool_calls(self) -> list[ToolCallPart]:
        """The tool-call parts, in order."""
        return [p for p in self.parts if isinstance(p, ToolCallPart)]


MESSAGES: TypeAdapter[list[Message]] = TypeAdapter(list[Message])
"""Validate and serialise a list of messages: `MESSAGES.dump_json(msgs)`,
`MESSAGES.validate_json(raw)`."""
