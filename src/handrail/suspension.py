"""Suspension: ONE primitive for approval, elicitation and client-executed tools.

A call that must wait (a gated tool, a `human` tool, a `client` tool, a server tool that
raised `AskPerson` while it ran) gets a *card*
(`ApprovalCardPart`) on its assistant message and an entry in the state's pending map
(`RunState.pending`, tool call id -> card); its `ToolCallPart` is `waiting` with a placeholder
result that says so. The run suspends. Then, for each pending call, somebody decides:

- `Approve` (a gated call; optionally amending the tool's `amendable` arguments, which are
  validated again),
- `Reject` (any card; the tool never runs and the model is told, with the reason),
- `Answer` (a `human` call: validated against the tool's output type; a `question` card: the
  text the tool asked for, and the tool runs again with it in `ctx.answer`),
- `ClientResult` (a `client` call: untrusted, so an invalid result becomes a tool error).

`decide` validates a decision against the pending map, checks that its decider may make it
(`handrail.policy`: roles, four eyes, how many approvals), and records it on the card (who,
when, the original and the amended arguments, and the digest of the exact arguments approved)
before anything runs. A call whose policy needs several approvals collects them on its card
(`approvals`) and stays pending until enough people approved the same arguments: every
approval is of one exact set of arguments (its digest), an amendment is a new proposal whose
approvals start again, and a decision made on arguments that are no longer the current ones
(`digest=`, or the proposal when it names none) raises `ArgumentsChangedError`
(`card_state` says where a card stands, for every surface to show). An unknown, already
decided or expired call raises `StaleResolutionError` and changes nothing, so no decision can
make a tool run twice. Once nothing is pending, the run resumes: the dispatcher
settles the decided calls (an approved call runs only if its arguments still hash to the
approved digest) and the agent's loop goes on.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

import pydantic_core
from pydantic import Field, TypeAdapter

from ._captured import CapturedAction
from ._tool_result import ToolResult
from .events import ApprovalRequired, ClientExecRequired, Event, InputRequired
from .exceptions import (
    ArgumentsChangedError,
    InvalidDecisionError,
    PathError,
    StaleResolutionError,
)
from .messages import ApprovalCardPart, CardApproval, DecisionKind, ToolCallPart
from .policy import Decider, DecisionPolicy, check, policy_for, refusal
from .tools._arguments import ArgumentsError

if TYPE_CHECKING:
    from .state import RunState
    from .tools import Tool

__all__ = [
    "DECISION",
    "ActionChoice",
    "Answer",
    "Approve",
    "ArgChange",
    "CardState",
    "ClientResult",
    "Decision",
    "Reject",
    "approved_by",
    "approved_plan",
    "args_digest",
    "card_event",
    "card_state",
    "changes",
    "current_args",
    "current_digest",
    "decidable",
    "decide",
    "decide_batch",
    "expire",
    "may_decide",
    "placeholder",
    "settle",
]


@dataclass(kw_only=True, slots=True)
class ActionChoice:
    """The decision on one action of a batch card (see `handrail.capture`)."""

    approve: bool = True
    """Apply it (False: skip it)."""
    amended_args: dict[str, Any] | None = None
    """New values for some of its tool's `amendable` arguments."""
    reason: str | None = None
    """Why it is skipped."""


# A decision's first field is positional, as people write it (`Answer("size M")`,
# `Reject("too expensive")`, `Approve({"amount": 40})`, `ClientResult(output)`); the rest are
# keywords (`KW_ONLY`).


@dataclass(slots=True)
class Approve:
    """Run the gated call, with the arguments as proposed or as amended."""

    amended_args: dict[str, Any] | None = None
    """New values for some of the tool's `amendable` arguments (the rest stay as proposed)."""
    _: KW_ONLY
    actions: dict[int, ActionChoice] | None = None
    """For a batch card: decisions per action, by local index (the others are applied as
    proposed)."""
    by: str | None = None
    """Who decided (recorded on the card; with `resolve(decider=...)`, the decider)."""
    via: str | None = None
    """Through which API key or token the decision came (set by the server; audited)."""
    digest: str | None = None
    """The digest of the arguments this decision was made on: the card's `digest` as the
    decider saw it (`PendingCard.digest`, the `digest` of an `approval-required` event).
    A decision on arguments that are no longer the call's current ones is refused
    (`ArgumentsChangedError`). None: the model's proposal, as first shown."""
    decision: Literal["approve"] = "approve"


@dataclass(slots=True)
class Reject:
    """Do not run the call; the model is told, with the reason, and acknowledges it."""

    reason: str | None = None
    """Why, in words the model can relay to the user."""
    _: KW_ONLY
    by: str | None = None
    """Who decided (with `resolve(decider=...)`, the decider)."""
    via: str | None = None
    """Through which API key or token the decision came (set by the server; audited)."""
    digest: str | None = None
    """The digest of the arguments the decider saw (`PendingCard.digest`). A rejection is
    recorded whatever the arguments are now: it never lets anything run."""
    decision: Literal["reject"] = "reject"


@dataclass(slots=True)
class Answer:
    """A person's answer: validated against the tool's output type.

    For a `question` card (a tool asked with `AskPerson`), the answer is text, and the tool
    runs again with it.

    For a `human` tool's call, the answer itself. For a `recovery` card (a call that may have
    run before a crash), that it did run and what it returned, as someone checked (the payment
    provider's dashboard, say): the model is told the effect happened, and nothing runs again.
    """

    output: Any
    """The answer (or the output of the call that ran)."""
    _: KW_ONLY
    by: str | None = None
    """Who answered (with `resolve(decider=...)`, the decider)."""
    via: str | None = None
    """Through which API key or token the decision came (set by the server; audited)."""
    digest: str | None = None
    """The digest of the arguments this decision was made on: the card's `digest` as the
    decider saw it (`PendingCard.digest`, the `digest` of an `approval-required` event).
    A decision on arguments that are no longer the call's current ones is refused
    (`ArgumentsChangedError`). None: the model's proposal, as first shown."""
    decision: Literal["answer"] = "answer"


@dataclass(slots=True)
class ClientResult:
    """What the client returned for a `client` tool (untrusted: validated, never believed)."""

    output: Any = None
    """The output."""
    _: KW_ONLY
    error: str | None = None
    """Set when the client failed to run the tool: the call fails with this error."""
    by: str | None = None
    """Who (which client) posted it (with `resolve(decider=...)`, the decider)."""
    via: str | None = None
    """Through which API key or token the decision came (set by the server; audited)."""
    digest: str | None = None
    """The digest of the arguments this decision was made on: the card's `digest` as the
    decider saw it (`PendingCard.digest`, the `digest` of an `approval-required` event).
    A decision on arguments that are no longer the call's current ones is refused
    (`ArgumentsChangedError`). None: the model's proposal, as first shown."""
    decision: Literal["client_result"] = "client_result"


Decision: TypeAlias = Annotated[
    Approve | Reject | Answer | ClientResult, Field(discriminator="decision")
]
DECISION: TypeAdapter[Decision] = TypeAdapter(Decision)
"""Validate a decision from JSON (an HTTP body): `DECISION.validate_json(raw)`."""

_ACCEPTS: dict[str, tuple[str, ...]] = {
    "approval": ("approve", "reject"),
    "elicitation": ("answer", "reject"),
    "question": ("answer", "reject"),
    "client_exec": ("client_result", "reject"),
    "recovery": ("approve", "reject", "answer"),
    "batch": ("approve", "reject"),
}
_WAITING = {
    "approval": "waiting for a person to approve it",
    "elicitation": "waiting for a person to answer",
    "question": "waiting for a person to answer its question",
    "client_exec": "waiting for the client to run it",
    "recovery": "waiting for a person to decide whether to retry it",
    "batch": "waiting for a person to approve the batch it belongs to",
}


def args_digest(tool_name: str, args: dict[str, Any]) -> str:
    """The digest that binds an approval to the exact arguments it approved."""
    canonical = pydantic_core.to_json([tool_name, _sorted(args)])
    return hashlib.sha256(canonical).hexdigest()


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def card_event(card: ApprovalCardPart, tool: Tool[Any] | None) -> Event:
    """The event that announces `card`.

    `input-required` for a person's answer, `client-exec-required` for the client, and
    `approval-required` (with the card's `kind`) for an approval, a recovery card or a batch.

    Args:
        card: the card.
        tool: its tool (for the answer's schema of an elicitation), if the agent has it.
    """
    if card.kind == "question":
        return InputRequired(
            tool_call_id=card.tool_call_id,
            name=card.tool_name,
            args=card.args,
            prompt=card.prompt,
            output_schema={"type": "string"},
        )
    if card.kind == "elicitation":
        adapter = tool.output_adapter if tool is not None else None
        return InputRequired(
            tool_call_id=card.tool_call_id,
            name=card.tool_name,
            args=card.args,
            prompt=card.prompt,
            output_schema=adapter.json_schema() if adapter is not None else None,
        )
    if card.kind == "client_exec":
        return ClientExecRequired(
            tool_call_id=card.tool_call_id, name=card.tool_name, args=card.args
        )
    now = current_args(card)
    return ApprovalRequired(
        tool_call_id=card.tool_call_id,
        name=card.tool_name,
        args=now,
        prompt=card.prompt,
        amendable=list(card.amendable),
        kind=card.kind,
        digest=args_digest(card.tool_name, now),
        agent=card.agent,
    )


def placeholder(card: ApprovalCardPart) -> ToolResult:
    """The result a waiting call carries until its decision: never mistaken for a real one."""
    text = (
        f"No result yet: this call is {_WAITING[card.kind]}. It has not run; its real "
        f"result will replace this text."
    )
    return ToolResult(ok=False, error=text, summary=_WAITING[card.kind], code="pending")


def decide(
    state: RunState,
    tools: Mapping[str, Tool[Any]],
    tool_call_id: str,
    decision: Decision,
    *,
    now: float,
    decider: Decider | None = None,
    policies: Mapping[str, DecisionPolicy] | None = None,
) -> ApprovalCardPart:
    """Check `decision` against the pending map and the policy, and record it on the card.

    Nothing changes unless every check passes. The card leaves the pending map (unless it
    still needs approvals from others); the call itself is settled when the run resumes
    (`settle`).

    Args:
        state: the suspended session state.
        tools: the suspended agent's tools, by name.
        tool_call_id: the call being decided.
        decision: what was decided.
        now: the time of the decision (seconds since the epoch).
        decider: who decides (their user id becomes the decision's `by`); None: a trusted
            caller naming nobody, allowed only where no policy applies.
        policies: the domain's default policies, by tool permission.

    Raises:
        StaleResolutionError: the call is unknown, already decided, or expired.
        InvalidDecisionError: the decision does not fit the card (a kind it does not accept,
            an argument that is not amendable, amended arguments or an answer that do not
            validate).
        ArgumentsChangedError: the decision was made on arguments that are no longer the
            call's current ones (another approver amended them since).
        DecisionNotAllowedError: the policy does not let `decider` make this decision.
    """
    if decider is not None:
        decision = dataclasses.replace(decision, by=decider.user_id)
    card = state.pending.get(tool_call_id)
    if card is None:
        raise StaleResolutionError(_why_stale(state, tool_call_id), tool_call_id=tool_call_id)
    if card.expires_at is not None and now >= card.expires_at:
        raise StaleResolutionError(
            f"The decision on call {tool_call_id} ({card.tool_name}) expired at "
            f"{card.expires_at:.0f}: it becomes an 'expired' tool error, and the run goes on "
            f"without it when expired decisions are next swept.",
            tool_call_id=tool_call_id,
        )
    kind = decision.decision
    if kind not in _ACCEPTS[card.kind]:
        raise InvalidDecisionError(
            f"Call {tool_call_id} ({card.tool_name}) waits for a decision on its {card.kind} "
            f"card, which is one of {', '.join(_ACCEPTS[card.kind])}; got {kind!r}."
        )
    rules = _rules(card, tools, policies or {})
    check(rules, decider, state.user_id, decision=kind)
    stale = None if isinstance(decision, Reject) else _stale(card, decision.digest)
    if stale is not None and (decision.digest is not None or not isinstance(decision, Approve)):
        raise stale  # an approval naming no digest may still name exactly the current args
    needed = max((p.approvals for _, p in rules if p is not None), default=1)
    # What an approval amends: the arguments its digest names (they are the current ones), or
    # the model's proposal when it names none.
    base = card.args if decision.digest is None else current_args(card)
    if card.kind == "batch":
        if isinstance(decision, Approve) and needed > 1:
            plan = base
            if decision.actions:
                plan = decide_batch(state, tools, card, decision, base) or base
            if stale is not None and plan != current_args(card):
                raise stale
            if not _approval(card, decision, now, plan, rules, decider, state.user_id, needed):
                return card
            return _record(state, card, decision, now, _unless_proposed(card, plan), None)
        amended_plan = decide_batch(state, tools, card, decision)
        return _record(state, card, decision, now, amended_plan, None)
    if isinstance(decision, Approve) and decision.actions is not None:
        raise InvalidDecisionError(
            f"Call {tool_call_id} ({card.tool_name}) is one call, not a batch: approve it "
            f"with amended_args, not actions."
        )
    tool = tools.get(card.tool_name)
    if tool is None and not isinstance(decision, Reject):
        raise InvalidDecisionError(
            f"Call {tool_call_id} is for tool {card.tool_name!r}, which the agent no longer "
            f"has: reject it, or deploy the tool again."
        )
    amended: dict[str, Any] | None = None
    output: Any = None
    if isinstance(decision, Approve):
        assert tool is not None
        amended = _amend(state, tool, card, base, decision.amended_args)
        approved = amended if amended is not None else base
        if stale is not None and approved != current_args(card):
            raise stale
        if needed > 1:
            if not _approval(card, decision, now, approved, rules, decider, state.user_id, needed):
                return card
            amended = _unless_proposed(card, approved)
        elif amended is None and approved != card.args:
            amended = approved  # amended by an approver while its policy needed more
    elif isinstance(decision, Answer) and card.kind == "question":
        if not isinstance(decision.output, str) or not decision.output.strip():
            raise InvalidDecisionError(
                f"Call {tool_call_id} ({card.tool_name}) asked a question: answer it with "
                f"text (an answer whose output is a string), not "
                f"{type(decision.output).__name__} {str(decision.output)[:40]!r}."
            )
        output = decision.output
    elif isinstance(decision, Answer):  # a person's answer, or what a call that ran returned
        assert tool is not None
        output = _answer(tool, card, decision.output)
    elif isinstance(decision, ClientResult):
        output = decision.output if decision.error is None else {"error": decision.error}
    return _record(state, card, decision, now, amended, output)


def current_args(card: ApprovalCardPart) -> dict[str, Any]:
    """The arguments the call runs with if it is approved now.

    The model's proposal, or the latest amendment an approver made of it (a call that needs
    several approvals), or, once decided, the arguments that were approved.
    """
    if card.decision is not None:
        return card.amended_args if card.amended_args is not None else card.args
    if card.approvals:
        last = card.approvals[-1].amended_args
        return last if last is not None else card.args
    return card.args


def current_digest(card: ApprovalCardPart) -> str:
    """The digest of `current_args`: what a decision names to decide on them (`digest=`)."""
    return args_digest(card.tool_name, current_args(card))


def approved_by(card: ApprovalCardPart, digest: str | None = None) -> list[str]:
    """Who approved the arguments whose digest is `digest` (default: the current ones).

    Only these approvals count toward the call's policy: an approval of other arguments (an
    earlier proposal) does not.
    """
    digest = digest or current_digest(card)
    return [a.by or "" for a in card.approvals or () if _approval_digest(card, a) == digest]


@dataclass(frozen=True, slots=True)
class ArgChange:
    """One argument an approver changed: the model's value and the one that will run."""

    proposed: Any
    """As the model proposed it (None: it had no such argument)."""
    now: Any
    """As it stands now."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CardState:
    """Where a waiting card stands: what every surface shows a decider (`card_state`)."""

    args: dict[str, Any]
    """The arguments the call runs with if it is approved now."""
    digest: str
    """Their digest: a decision names it (`digest=`) to decide on exactly these."""
    approved_by: list[str]
    """Who approved exactly these arguments so far (a call that needs several approvals)."""
    changes: dict[str, ArgChange]
    """What they change from the model's proposal, by argument name."""


def card_state(card: ApprovalCardPart) -> CardState:
    """Where `card` stands: its current arguments, their digest, who approved, what changed."""
    now = current_args(card)
    return CardState(
        args=now,
        digest=args_digest(card.tool_name, now),
        approved_by=approved_by(card),
        changes=changes(card),
    )


def changes(card: ApprovalCardPart) -> dict[str, ArgChange]:
    """What the current arguments change from the model's proposal, by argument name."""
    now = current_args(card)
    return {
        name: ArgChange(card.args.get(name), now.get(name))
        for name in sorted(card.args.keys() | now.keys())
        if card.args.get(name) != now.get(name)
    }


def _approval_digest(card: ApprovalCardPart, approval: CardApproval) -> str:
    if approval.args_digest is not None:
        return approval.args_digest
    args = approval.amended_args if approval.amended_args is not None else card.args
    return args_digest(card.tool_name, args)  # stored by a handrail before digests


def _stale(card: ApprovalCardPart, seen: str | None) -> ArgumentsChangedError | None:
    """The error for a decision made on arguments that are no longer the card's current ones.

    `seen` is the digest the decision names; None stands for the model's proposal. An
    approval whose arguments come out exactly as the current ones is not stale: it approves
    what will run.
    """
    current = current_digest(card)
    if seen == current or (seen is None and current_args(card) == card.args):
        return None
    label = f"Call {card.tool_call_id} ({card.tool_name})"
    amenders = [a.by or "someone" for a in card.approvals or () if a.amended_args is not None]
    by = f" by {amenders[-1]}" if amenders else ""
    diff = "; ".join(
        f"{k}: {_short(c.proposed)} -> {_short(c.now)}" for k, c in changes(card).items()
    )
    since = "the arguments this decision names" if seen is not None else "the model's proposal"
    so_far = ", ".join(approved_by(card, current)) or "nobody yet"
    return ArgumentsChangedError(
        f"{label} was amended{by}: its arguments are no longer {since}, and nothing was "
        f"recorded. They are now {_short(current_args(card))} ({diff or 'as proposed'}; "
        f"digest {current}, approved by {so_far}). Look at the card again and decide on what "
        f"it shows now, naming its current digest.",
        tool_call_id=card.tool_call_id,
        digest=current,
        current_args=current_args(card),
    )


def _short(value: Any) -> str:
    text = pydantic_core.to_json(value).decode()
    return text if len(text) <= 80 else text[:77] + "..."


def decidable(
    state: RunState,
    tools: Mapping[str, Tool[Any]],
    decider: Decider,
    policies: Mapping[str, DecisionPolicy] | None = None,
) -> list[str]:
    """The pending calls `decider` may decide (reject, at least), by the same rules as `decide`."""
    return [
        tool_call_id
        for tool_call_id, card in state.pending.items()
        if may_decide(card, tools, decider, state.user_id, policies)
    ]


def may_decide(
    card: ApprovalCardPart,
    tools: Mapping[str, Tool[Any]],
    decider: Decider,
    requester: str | None,
    policies: Mapping[str, DecisionPolicy] | None = None,
) -> bool:
    """Whether `decider` may decide (reject, at least) a waiting `card` of `requester`'s."""
    return all(
        refusal(name, policy, decider, requester, decision="reject") is None
        for name, policy in _rules(card, tools, policies or {})
    )


def _rules(
    card: ApprovalCardPart, tools: Mapping[str, Tool[Any]], policies: Mapping[str, DecisionPolicy]
) -> list[tuple[str, DecisionPolicy | None]]:
    """(tool name, its policy) for each tool the card's decision concerns."""
    if card.kind == "client_exec":
        # The call runs in the requester's own client, after the policy's approvers approved
        # it (a gated client tool): its result comes from the requester alone.
        return [(card.tool_name, None)]
    names = [card.tool_name]
    if card.kind == "batch":
        names = sorted({str(a["tool"]) for a in card.args.get("actions", ())})
    rules: list[tuple[str, DecisionPolicy | None]] = []
    for name in names:
        tool = tools.get(name)
        policy = None
        if tool is not None:
            policy = policy_for(tool.decision_policy, tool.permission, policies)
        rules.append((name, policy))
    return rules


def _approval(
    card: ApprovalCardPart,
    decision: Approve,
    now: float,
    approved: dict[str, Any],
    rules: list[tuple[str, DecisionPolicy | None]],
    decider: Decider | None,
    requester: str | None,
    needed: int,
) -> bool:
    """Add one approval of `approved` (the exact arguments) to a call that needs `needed`.

    An approval of other arguments than the current ones (an amendment) is a new proposal:
    the approvals of the earlier ones stop counting. True once enough people approved the
    current arguments.
    """
    digest = args_digest(card.tool_name, approved)
    so_far = approved_by(card, digest)
    check(rules, decider, requester, decision="approve", approved_by=so_far)
    amended = _unless_proposed(card, approved)
    approval = CardApproval(by=decision.by, at=now, amended_args=amended, args_digest=digest)
    card.approvals = [*(card.approvals or []), approval]
    return len(so_far) + 1 >= needed


def _unless_proposed(card: ApprovalCardPart, args: dict[str, Any]) -> dict[str, Any] | None:
    """`args`, or None when they are the model's proposal."""
    return None if args == card.args else args


def _record(
    state: RunState,
    card: ApprovalCardPart,
    decision: Decision,
    now: float,
    amended: dict[str, Any] | None,
    output: Any,
) -> ApprovalCardPart:
    card.decision = decision.decision
    card.decided_by = decision.by
    card.decided_at = now
    if isinstance(decision, Reject):
        card.reason = decision.reason
    elif isinstance(decision, ClientResult) and decision.error is not None:
        card.reason = decision.error
    card.output = output
    if amended is not None:
        card.amended_args = amended
    if isinstance(decision, Approve):
        card.args_digest = args_digest(card.tool_name, amended or card.args)
    del state.pending[card.tool_call_id]
    return card


def expire(state: RunState, now: float) -> list[str]:
    """Decide every pending card past its deadline as `expire`; return their call ids."""
    due = [
        card
        for card in state.pending.values()
        if card.expires_at is not None and now >= card.expires_at
    ]
    for card in due:
        card.decision = "expire"
        card.decided_at = now
        del state.pending[card.tool_call_id]
    return [card.tool_call_id for card in due]


def _why_stale(state: RunState, tool_call_id: str) -> str:
    for message in reversed(list(state.all_messages())):
        for part in message.parts:
            if (
                isinstance(part, ApprovalCardPart)
                and part.tool_call_id == tool_call_id
                and part.decision is not None
            ):
                who = f" by {part.decided_by}" if part.decided_by else ""
                return (
                    f"Call {tool_call_id} ({part.tool_name}) was already decided "
                    f"({part.decision}{who}); a call is never decided or run twice."
                )
    waiting = ", ".join(state.pending) or "none"
    return f"No pending call {tool_call_id!r} in this session (pending: {waiting})."


def _amend(
    state: RunState,
    tool: Tool[Any],
    card: ApprovalCardPart,
    base: dict[str, Any],
    changes: dict[str, Any] | None,
) -> dict[str, Any] | None:
    if not changes:
        return None
    label = f"Call {card.tool_call_id} ({card.tool_name})"
    return amend(state, tool, base, changes, card.amendable, label)


def amend(
    state: RunState,
    tool: Tool[Any],
    args: dict[str, Any],
    changes: dict[str, Any],
    amendable: list[str] | tuple[str, ...],
    label: str,
    bound: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`args` with a person's `changes` to its `amendable` fields, validated again.

    The bound arguments are read from the session's context, as a first dispatch reads them,
    unless `bound` gives them (a captured action binds what it was captured with).

    Raises:
        InvalidDecisionError: a change to a field that is not amendable, or arguments that no
            longer validate (`label` names the call in the message).
    """
    forbidden = sorted(set(changes) - set(amendable))
    if forbidden:
        allowed = ", ".join(amendable) or "none"
        raise InvalidDecisionError(
            f"{label}: {', '.join(forbidden)} cannot be amended (amendable: {allowed})."
        )
    try:
        validated = tool.validate(
            {**args, **changes}, state.context, bound, turn_context=state.turn_context
        )
    except (ArgumentsError, PathError) as exc:
        raise InvalidDecisionError(f"{label}: the amended arguments are not valid: {exc}") from None
    return tool.stored_args(validated)


def _answer(tool: Tool[Any], card: ApprovalCardPart, output: Any) -> Any:
    result = tool.to_result(output)
    if not result.ok:
        raise InvalidDecisionError(
            f"Call {card.tool_call_id} ({card.tool_name}): the answer is not valid: {result.error}"
        )
    return result.data


def settle(tool: Tool[Any] | None, part: ToolCallPart, card: ApprovalCardPart) -> ToolResult | None:
    """The final result of a decided call that does not run here, or None if it must run.

    A rejection, an expiry, an answer and a client result settle the call; an approval
    returns None (the dispatcher runs it, after checking its digest), and so does the answer
    to a `question` (the tool runs again, with it). `tool` is None when
    the agent no longer has it (a deploy removed it while the call waited).
    """
    if tool is None and card.decision not in ("reject", "expire"):
        return ToolResult.failure(
            f"Tool {part.name!r} no longer exists, so the {card.decision} decision on this "
            f"call cannot be carried out; it did not run.",
            code="not_available",
        )
    decision: DecisionKind | None = card.decision
    if decision == "reject" and card.kind == "recovery":
        return ToolResult.failure(
            "This call may have run before a crash, and a person chose not to retry it, so "
            "its effect is unknown. Tell the user to check whether it happened.",
            code="rejected",
        )
    if decision == "reject" and card.kind == "question":
        who = f" ({card.decided_by})" if card.decided_by else ""
        why = f": {card.reason.rstrip('.')}" if card.reason else ""
        return ToolResult(
            ok=False,
            error=(
                f"The tool asked a person{who} a question ({card.prompt}), who declined to "
                f"answer{why}. The call did not finish; tell the user."
            ),
            summary=f"declined{who}" + (f": {card.reason}" if card.reason else ""),
            code="rejected",
        )
    if decision == "answer" and card.kind == "question":
        return None  # the tool runs again, with the answer
    if decision == "reject":
        # A person asked for an answer declines (the card's button says "Decline").
        verb = "declined" if card.kind == "elicitation" else "rejected"
        who = f" by {card.decided_by}" if card.decided_by else ""
        why = f" Reason: {card.reason.rstrip('.')}." if card.reason else ""
        return ToolResult(
            ok=False,
            error=(
                f"The call was {verb}{who} and did not run.{why} Do not call it again "
                f"unless the user asks; tell the user what was not done."
            ),
            summary=f"{verb}{who}" + (f": {card.reason}" if card.reason else ""),
            code="rejected",
        )
    if decision == "expire" and card.kind == "client_exec":
        return ToolResult.failure(
            f"The app was closed before it could run {part.name!r} (no client answered "
            f"before the deadline), so it did not run. Tell the user it is still to be done: "
            f"it needs the app open, or another way.",
            code="expired",
        )
    if decision == "expire":
        return ToolResult.failure(
            "Nobody decided on this call before its deadline, so it did not run. Tell the "
            "user it is still to be done, or ask again.",
            code="expired",
        )
    if decision == "answer" and card.kind == "recovery":
        who = f" by {card.decided_by}" if card.decided_by else ""
        return ToolResult(data=card.output, summary=f"it ran before a crash (confirmed{who})")
    if decision == "answer":
        return ToolResult(data=card.output)
    if decision == "client_result":
        if card.reason is not None:
            return ToolResult.failure(
                f"The client could not run {part.name!r}: {card.reason}", code="tool_error"
            )
        assert tool is not None
        return tool.to_result(card.output)
    return None


# -- batch cards (`handrail.capture`) -----------------------------------------------------


def decide_batch(
    state: RunState,
    tools: Mapping[str, Tool[Any]],
    card: ApprovalCardPart,
    decision: Decision,
    base: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Check a decision on a batch card; return the plan it approves (None: nothing runs).

    The plan is the card's actions (or `base`, the plan an earlier approver amended) with
    per-action amendments made and rejections marked `skipped`; its digest binds the
    approval, as for a single call.

    Raises:
        InvalidDecisionError: an unknown action index, a change to a field its tool does
            not let a person amend, or amended arguments that do not validate.
    """
    if not isinstance(decision, Approve):
        return None
    if decision.amended_args:
        raise InvalidDecisionError(
            f"Batch {card.tool_call_id} holds several actions: amend them one by one, in "
            f"actions (by each action's index), each with its own amended_args."
        )
    plan = base if base is not None else card.args
    actions = [CapturedAction.model_validate(a) for a in plan["actions"]]
    choices = decision.actions or {}
    known = {a.local_index for a in actions}
    unknown = sorted(set(choices) - known)
    if unknown:
        raise InvalidDecisionError(
            f"Batch {card.tool_call_id} has no action {', '.join(map(str, unknown))} "
            f"(actions: {', '.join(map(str, sorted(known)))})."
        )
    for action in actions:
        choice = choices.get(action.local_index)
        if choice is None:
            continue
        if not choice.approve:
            action.status = "skipped"
            action.error = choice.reason or "a person chose not to apply it"
        elif choice.amended_args:
            tool = tools.get(action.tool)
            if tool is None:
                raise InvalidDecisionError(
                    f"Action {action.local_index} is for tool {action.tool!r}, which no agent "
                    f"has any more: skip it, or deploy the tool again."
                )
            label = f"Action {action.local_index} ({action.tool})"
            action.args = amend(
                state, tool, action.args, choice.amended_args, tool.amendable, label, action.bound
            )
    return {"actions": [a.model_dump(mode="json") for a in actions]}


def approved_plan(card: ApprovalCardPart) -> list[CapturedAction]:
    """The actions a decided batch card says to apply (all skipped when it was rejected).

    Raises:
        InvalidDecisionError: the recorded plan does not match the digest that was approved.
    """
    if card.output is not None:  # applied before (partly, perhaps): go on from there
        return [CapturedAction.model_validate(a) for a in card.output["actions"]]
    if card.decision != "approve":
        reason = card.reason or (
            "nobody approved it in time" if card.decision == "expire" else "rejected"
        )
        actions = [CapturedAction.model_validate(a) for a in card.args["actions"]]
        for action in actions:
            action.status, action.error = "skipped", reason
        return actions
    plan = card.amended_args if card.amended_args is not None else card.args
    if card.args_digest != args_digest(card.tool_name, plan):
        raise InvalidDecisionError(
            f"Batch {card.tool_call_id}: the actions are not the ones that were approved "
            f"(the digest does not match); nothing was applied. Ask for approval again."
        )
    return [CapturedAction.model_validate(a) for a in plan["actions"]]
