"""The audit trail: an append-only, hash-chained record per organisation.

Every decision on a card (who, through which key or token, when, what, the amended fields
before and after, the digest of the arguments approved) and every side-effecting call (its
outcome and latency) is one `AuditEntry`. A store appends them (`SessionStore.append_audit`),
numbering each organisation's entries from 1 and chaining each to the one before: its `hash`
is the SHA-256 of a canonical JSON of the entry, which holds the previous entry's hash
(`prev_hash`; the first entry of an organisation chains from `GENESIS`). Editing an entry
changes its hash; deleting one leaves a gap in the numbers and a `prev_hash` that no longer
matches; `verify` names the first entry where the chain breaks, and how.

The trail is not part of a session: deleting or pruning sessions never touches it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    from ._tool_result import ToolResult
    from .messages import ApprovalCardPart

__all__ = [
    "GENESIS",
    "AuditEntry",
    "AuditKind",
    "AuditProblem",
    "AuditProblemKind",
    "call_entry",
    "chain",
    "decision_entry",
    "entry_hash",
    "verify",
]

AuditKind = Literal["decision", "call"]
"""What an entry records: a decision on a card, or a side-effecting call that ran."""
AUDIT_KINDS: frozenset[str] = frozenset(get_args(AuditKind))

GENESIS = "0" * 64
"""The `prev_hash` of an organisation's first entry."""


@dataclass(kw_only=True, slots=True)
class AuditEntry:
    """One entry of an organisation's audit trail.

    Build one with the facts (the store fills in `seq`, `prev_hash` and `hash` as it appends).
    """

    org_id: str | None = None
    """The organisation whose trail it is in (`None`: sessions without one share a trail)."""
    seq: int = 0
    """Its number in the organisation's trail, from 1 (0 until appended)."""
    at: float = 0.0
    """When it happened (epoch seconds, from the engine's clock)."""
    kind: AuditKind = "decision"
    """`decision` (a card was decided) or `call` (a side-effecting call finished)."""
    session_id: str = ""
    """The session the call belongs to."""
    tool: str = ""
    """The tool's name."""
    tool_call_id: str = ""
    """The call's id (for a call: the tool-call log's id, `call_1~1` for a retry)."""
    who: str | None = None
    """Who decided (a decision), or whose session ran the call (a call)."""
    via: str | None = None
    """Through which key or token the decision came, when the server knows it."""
    decision: str | None = None
    """`approve`, `reject`, `answer`, `client_result` or `expire` (decisions only)."""
    reason: str | None = None
    """Why a call was rejected (or the client's error), as given."""
    amended_before: dict[str, Any] | None = None
    """The amended fields as proposed (only those that changed; `None`: no amendment)."""
    amended_after: dict[str, Any] | None = None
    """The amended fields as approved."""
    args_digest: str | None = None
    """The digest of the exact arguments approved (decision) or called with (call)."""
    outcome: str | None = None
    """A call's outcome: `ok`, or `error: ...` with the tool's error."""
    latency_ms: float | None = None
    """How long the call took, from its log's start to its result (milliseconds)."""
    prev_hash: str = ""
    """The hash of the entry before it in the trail (`GENESIS` for the first)."""
    hash: str = ""
    """The SHA-256 (hex) of the entry's canonical JSON, `prev_hash` included."""

    def to_json(self) -> dict[str, Any]:
        """The entry as a JSON-compatible dict (what `from_json` reads, and exports hold)."""
        return asdict(self)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> AuditEntry:
        """An entry from `to_json`'s dict (unknown keys are refused, so none is lost).

        Raises:
            ValueError: the dict is not an audit entry.
        """
        names = {f.name for f in fields(cls)}
        unknown = set(value) - names
        if unknown:
            raise ValueError(f"not an audit entry: unknown keys {sorted(unknown)}")
        entry = cls(**value)
        if entry.kind not in AUDIT_KINDS:
            raise ValueError(f"not an audit entry: kind {entry.kind!r}")
        return entry


def _canonical(entry: AuditEntry) -> bytes:
    body = entry.to_json()
    del body["hash"]
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def entry_hash(entry: AuditEntry) -> str:
    """The hash `entry` must have: SHA-256 over its canonical JSON without `hash`."""
    return hashlib.sha256(_canonical(entry)).hexdigest()


def chain(entry: AuditEntry, *, seq: int, prev_hash: str) -> AuditEntry:
    """`entry` numbered `seq` after the entry whose hash is `prev_hash`, with its own hash.

    What a store does as it appends (under its lock on the organisation's trail).

    Raises:
        ValueError: the entry holds a value JSON cannot carry (NaN, an object).
    """
    entry.seq = seq
    entry.prev_hash = prev_hash
    entry.hash = entry_hash(entry)
    return entry


def decision_entry(
    card: ApprovalCardPart,
    *,
    org_id: str | None,
    session_id: str,
    via: str | None,
    args_digest: str | None,
) -> AuditEntry:
    """The entry of a card's latest decision: who, via what, when, what, the amended fields.

    A call that needs several approvals (`DecisionPolicy(approvals=...)`) gets one entry an
    approval: until the last, the card is still undecided and the entry is its latest
    approval's.
    """
    approval = card.approvals[-1] if card.decision is None and card.approvals else None
    amended = approval.amended_args if approval is not None else card.amended_args
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    if amended is not None and card.kind != "batch":
        changed = sorted(
            name
            for name in card.args.keys() | amended.keys()
            if card.args.get(name) != amended.get(name)
        )
        before = {name: card.args.get(name) for name in changed}
        after = {name: amended.get(name) for name in changed}
    return AuditEntry(
        org_id=org_id,
        at=approval.at if approval is not None else (card.decided_at or 0.0),
        kind="decision",
        session_id=session_id,
        tool=card.tool_name,
        tool_call_id=card.tool_call_id,
        who=approval.by if approval is not None else card.decided_by,
        via=via,
        decision="approve" if approval is not None else card.decision,
        reason=card.reason,
        amended_before=before,
        amended_after=after,
        args_digest=args_digest,
    )


def call_entry(
    result: ToolResult,
    *,
    org_id: str | None,
    session_id: str,
    tool: str,
    tool_call_id: str,
    who: str | None,
    at: float,
    args_digest: str,
    latency_ms: float | None,
) -> AuditEntry:
    """The entry of a side-effecting call that finished: its outcome and latency."""
    return AuditEntry(
        org_id=org_id,
        at=at,
        kind="call",
        session_id=session_id,
        tool=tool,
        tool_call_id=tool_call_id,
        who=who,
        args_digest=args_digest,
        outcome="ok" if result.ok else f"error: {result.error}",
        latency_ms=latency_ms,
    )


AuditProblemKind = Literal["edited", "deleted", "reordered", "relinked"]
"""How a trail does not hold together at an entry (see `AuditProblem.kind`)."""


@dataclass(kw_only=True, slots=True)
class AuditProblem:
    """Where an audit trail does not hold together."""

    seq: int
    """The number of the first entry concerned."""
    kind: AuditProblemKind
    """`edited` (its content no longer hashes to its hash), `deleted` (entries before it are
    missing), `reordered` (it comes out of order, or twice), `relinked` (its `prev_hash` is
    not the hash of the entry before it: that one was replaced)."""
    message: str
    """What is wrong, in words."""


def verify(entries: list[AuditEntry]) -> list[AuditProblem]:
    """Check one organisation's whole trail, in order; the problems, first broken entry first.

    An empty list: every entry hashes to its hash, the numbers run from 1 without a gap, and
    each entry chains to the one before. Deleting the LAST entries cannot be seen from the
    trail alone: keep the last hash somewhere else (an export) and compare.
    """
    problems: list[AuditProblem] = []
    expected, prev = 1, GENESIS
    for entry in entries:
        if entry.seq < expected:
            problems.append(
                AuditProblem(
                    seq=entry.seq,
                    kind="reordered",
                    message=f"entry {entry.seq} comes after entry {expected - 1}: out of order "
                    f"or repeated",
                )
            )
            continue
        if entry.seq > expected:
            missing = (
                f"entry {expected}"
                if entry.seq == expected + 1
                else f"entries {expected} to {entry.seq - 1}"
            )
            problems.append(
                AuditProblem(
                    seq=entry.seq,
                    kind="deleted",
                    message=f"{missing} before entry {entry.seq} "
                    f"{'is' if entry.seq == expected + 1 else 'are'} missing (deleted)",
                )
            )
        elif entry.prev_hash != prev:
            problems.append(
                AuditProblem(
                    seq=entry.seq,
                    kind="relinked",
                    message=f"entry {entry.seq} does not chain to the entry before it "
                    f"(its prev_hash differs): an entry was replaced",
                )
            )
        if entry_hash(entry) != entry.hash:
            problems.append(
                AuditProblem(
                    seq=entry.seq,
                    kind="edited",
                    message=f"entry {entry.seq} was edited: its content does not hash to its hash",
                )
            )
        expected, prev = entry.seq + 1, entry.hash
    return problems
