"""Who may decide: approval policies and the check every decision goes through.

A `DecisionPolicy` says who may decide the calls of a tool: which roles, whether the person
who requested the call may approve it (four eyes), and how many people must approve it. It is
declared with the tool (`Tool(decision_policy=...)`) or as a domain's default for a permission
(`Domain(policies={"destructive": ...})`); the tool's own wins.

A `Decider` is who decides: a user and their roles, as the server's authenticator established
them (never as a request body claims them). `check` is the one place the rules are applied:
`handrail.suspension.decide` calls it before it records anything, so the library, the HTTP
API and the chat protocols all obey the same policy.

Without a policy a call is decided by the person who requested it (the session's user), as
before policies existed. A library call that names no decider is trusted only where no policy
applies; where one does, it is refused, since the policy has nobody to check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from .exceptions import DecisionNotAllowedError, ToolDefinitionError

Verdict: TypeAlias = Literal["approve", "reject", "answer", "client_result"]
"""The decisions a person (or a client) makes on a card, as a policy judges them."""

__all__ = ["Decider", "DecisionPolicy", "Verdict", "check", "policy_for", "refusal"]


@dataclass(frozen=True, kw_only=True, slots=True)
class DecisionPolicy:
    """Who may decide a tool's calls.

    ```python
    DecisionPolicy(roles={"it-admin"}, four_eyes=True, approvals=2)
    ```
    """

    roles: frozenset[str] = field(default_factory=frozenset)
    """The roles that may decide (a decider needs one of them). Empty: any member of the
    session's organisation."""
    four_eyes: bool = False
    """The person who requested the call may not decide it in any way that lets it produce a
    result: approve or amend it, answer it, or post its client result. They may still
    withdraw it (reject it), as `withdraw` says."""
    approvals: int = 1
    """How many different people must approve the call, with the same arguments, before it
    runs. With `four_eyes`, the requester is not one of them: `four_eyes=True, approvals=2`
    needs three people (the requester and two others). An amendment is a new proposal: the
    approvals of other arguments stop counting. A rejection by anyone allowed to decide
    decides it at once; so does an answer or a client result (each by one person, who must
    meet `roles` and `four_eyes`)."""
    withdraw: bool = True
    """The person who requested the call may reject it (withdraw their own request) without
    holding one of `roles`. False: only someone the policy allows rejects it."""

    def __post_init__(self) -> None:
        roles: Any = self.roles
        if isinstance(roles, str):
            raise ToolDefinitionError(
                f"DecisionPolicy: roles is a set of role names; write roles={{{roles!r}}}."
            )
        object.__setattr__(self, "roles", frozenset(roles))
        if not all(isinstance(role, str) and role for role in self.roles):
            raise ToolDefinitionError("DecisionPolicy: every role is a non-empty string.")
        if isinstance(self.approvals, bool) or not isinstance(self.approvals, int):
            raise ToolDefinitionError("DecisionPolicy: approvals is a whole number (1 or more).")
        if self.approvals < 1:
            raise ToolDefinitionError(
                f"DecisionPolicy: approvals={self.approvals} can never be met; give 1 or more."
            )

    def describe(self) -> str:
        """The policy in words (for errors and UIs)."""
        parts = [f"roles: {', '.join(sorted(self.roles))}" if self.roles else "any member"]
        if self.four_eyes:
            parts.append("four eyes")
        if self.approvals > 1 and self.four_eyes:
            parts.append(
                f"{self.approvals} approvals, not the requester's ({_people(self.approvals)})"
            )
        elif self.approvals > 1:
            parts.append(f"{self.approvals} approvals")
        if not self.withdraw:
            parts.append("no withdrawing")
        return "; ".join(parts)


@dataclass(frozen=True, kw_only=True, slots=True)
class Decider:
    """Who makes a decision: a user and their roles, as authenticated.

    The server makes one from its caller; a library call passes one to
    `Engine.resolve(decider=...)` to have the policies checked.
    """

    user_id: str
    """The person (recorded as the decision's `by`)."""
    roles: frozenset[str] = field(default_factory=frozenset)
    """Their roles."""
    org_id: str | None = None
    """Their organisation: a decider reaches the sessions of this organisation only."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", frozenset(self.roles))


def policy_for(
    own: DecisionPolicy | None, permission: str, defaults: Mapping[str, DecisionPolicy]
) -> DecisionPolicy | None:
    """The policy a tool's calls are decided under: its own, else the domain's default.

    None: only the requester decides.

    Args:
        own: the tool's `decision_policy`.
        permission: the tool's permission.
        defaults: the domain's policies, by permission.
    """
    return own if own is not None else defaults.get(permission)


def refusal(
    tool_name: str,
    policy: DecisionPolicy | None,
    decider: Decider | None,
    requester: str | None,
    *,
    decision: Verdict,
    approved_by: Sequence[str] = (),
) -> str | None:
    """Why `decider` may not make this decision, in words naming the rule; None if they may.

    The policy governs every decision that lets a call produce a result (`approve`,
    `answer`, `client_result`); a `reject` is the one the requester may make without the
    policy's roles, to withdraw their own request (unless the policy says `withdraw=False`).

    Args:
        tool_name: the tool whose call is decided.
        policy: its policy (None: only the requester decides).
        decider: who decides (None: a trusted library call naming nobody).
        requester: who requested the call (the session's user).
        decision: the kind of decision (`approve`, `reject`, `answer`, `client_result`).
        approved_by: who already approved the arguments this approval approves.
    """
    if decider is None:
        if policy is None:
            return None
        return (
            f"{tool_name} has a decision policy ({policy.describe()}), so its calls are "
            f"decided by someone it can check: pass decider=Decider(user_id=..., roles=...)."
        )
    who = decider.user_id
    if policy is None:
        if requester is None or who == requester:
            return None
        return (
            f"{tool_name} has no decision policy, so only {requester}, who requested the call, "
            f"decides it; {who} may not. Give the tool a decision_policy= (or the domain "
            f"policies=) to let others decide."
        )
    withdrawing = decision == "reject" and who == requester
    if withdrawing and policy.withdraw:
        return None  # the requester may withdraw their own request
    if policy.roles and not (decider.roles & policy.roles):
        held = ", ".join(sorted(decider.roles)) or "no role"
        return (
            f"{tool_name} needs the role {' or '.join(sorted(policy.roles))}; {who} has none "
            f"of them ({held})"
            + ("." if decision == "approve" else f" to {_VERB[decision]} its calls.")
        )
    if policy.four_eyes and who == requester and not withdrawing:
        others = (
            f"{_WORDS.get(policy.approvals, str(policy.approvals))} other people must approve "
            f"it ({_people(policy.approvals)} in all, with the requester)"
            if decision == "approve" and policy.approvals > 1
            else "someone else must"
        )
        return (
            f"{tool_name} needs four eyes: {who} requested the call and may not "
            f"{_VERB[decision]} it; {others}."
        )
    if decision == "approve" and who in approved_by:
        besides = (
            f", none of them the requester ({_people(policy.approvals)} in all)"
            if policy.four_eyes
            else ""
        )
        return (
            f"{tool_name} needs {policy.approvals} approvals from different people{besides}; "
            f"{who} already approved it ({len(approved_by)} of {policy.approvals}), with these "
            f"arguments."
        )
    return None


_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def _people(approvals: int) -> str:
    """How many people a four-eyes policy of `approvals` needs: the approvers and the requester."""
    return f"{_WORDS.get(approvals + 1, str(approvals + 1))} people"


_VERB: dict[Verdict, str] = {
    "approve": "approve",
    "reject": "reject",
    "answer": "answer",
    "client_result": "post the result of",
}


def check(
    rules: Iterable[tuple[str, DecisionPolicy | None]],
    decider: Decider | None,
    requester: str | None,
    *,
    decision: Verdict,
    approved_by: Sequence[str] = (),
) -> None:
    """Raise unless `decider` may make this decision under every one of `rules`.

    Args:
        rules: (tool name, its policy) for each tool the decision concerns (one, or a batch's).
        decider: who decides.
        requester: who requested the call.
        decision: the kind of decision.
        approved_by: who already approved the arguments this approval approves.

    Raises:
        DecisionNotAllowedError: the first rule broken, named.
    """
    for tool_name, policy in rules:
        why = refusal(
            tool_name, policy, decider, requester, decision=decision, approved_by=approved_by
        )
        if why is not None:
            raise DecisionNotAllowedError(why, tool_name=tool_name)
