"""The audit trail: an append-only, keyed hash chain per organisation.

Every decision on a card (who, through which key or token, when, what, the amended fields
before and after, the digest of the arguments approved) and every side-effecting call (its
outcome and latency) is one `AuditEntry`. A store appends them (`SessionStore.append_audit`),
numbering each organisation's entries from 1 and chaining each to the one before: its `hash`
is the HMAC-SHA256, under the store's `AuditKey`, of a canonical JSON of the entry, which
holds the previous entry's hash (`prev_hash`; the first entry of an organisation chains from
`GENESIS`) and the key's id (`key_id`). The key is the application's, never the database's:
whoever can write the database but does not hold the key can neither edit an entry (and
recompute the chain after it) nor append one that `verify` accepts. Deleting the last entries
leaves no trace in the trail itself: an `AuditAnchor` (the last entry's number and hash, kept
elsewhere) finds it.

A store without a key (none given, `HANDRAIL_AUDIT_KEY` unset) chains with plain SHA-256, as
handrail did before keys: such entries (`key_id` None) still verify, as unkeyed, and `verify`
says so; they prove nothing against someone who can write the database.

The trail is not part of a session: deleting or pruning sessions never touches it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

from .exceptions import ConfigError

if TYPE_CHECKING:
    from ._tool_result import ToolResult
    from .messages import ApprovalCardPart

__all__ = [
    "AUDIT_KEY_ENV",
    "AUDIT_OLD_KEYS_ENV",
    "FROM_ENVIRONMENT",
    "GENESIS",
    "AuditAnchor",
    "AuditEntry",
    "AuditKey",
    "AuditKeyOption",
    "AuditKind",
    "AuditProblem",
    "AuditProblemKind",
    "AuditVerifier",
    "Keyring",
    "call_entry",
    "chain",
    "decision_entry",
    "entry_hash",
    "keyring_from_env",
    "signing_key",
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
    card: str | None = None
    """The kind of card decided (`approval`, `recovery`, `batch`...; decisions only), which
    says what a decision meant: a `reject` on a `recovery` card skips its retry (the call may
    have run). None on calls, and on decisions recorded before it was."""
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
    key_id: str | None = None
    """The id of the `AuditKey` its hash was made with (`None`: unkeyed, plain SHA-256)."""
    prev_hash: str = ""
    """The hash of the entry before it in the trail (`GENESIS` for the first)."""
    hash: str = ""
    """The HMAC-SHA256 (hex) of the entry's canonical JSON, `prev_hash` and `key_id`
    included, under the key `key_id` names; unkeyed, its plain SHA-256."""

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
    if body["key_id"] is None:
        del body["key_id"]  # an unkeyed entry hashes as entries did before keys
    if body["card"] is None:
        del body["card"]  # entries without one (calls, older decisions) hash as they did
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def entry_hash(entry: AuditEntry, secret: bytes | None = None) -> str:
    """The hash `entry` must have: over its canonical JSON without `hash`.

    Args:
        entry: the entry (its `key_id` and `prev_hash` are part of what is hashed).
        secret: the secret of the key `entry.key_id` names: an HMAC-SHA256 under it. None:
            the plain SHA-256 of an unkeyed entry.
    """
    if secret is None:
        return hashlib.sha256(_canonical(entry)).hexdigest()
    return hmac.new(secret, _canonical(entry), hashlib.sha256).hexdigest()


def chain(
    entry: AuditEntry, *, seq: int, prev_hash: str, key: AuditKey | None = None
) -> AuditEntry:
    """`entry` numbered `seq` after the entry whose hash is `prev_hash`, with its own hash.

    What a store does as it appends (under its lock on the organisation's trail).

    Args:
        entry: the entry to chain (changed in place, and returned).
        seq: its number.
        prev_hash: the hash of the entry before it (`GENESIS` for the first).
        key: the key to make its hash with (its id is recorded in `key_id`); None: unkeyed.

    Raises:
        ValueError: the entry holds a value JSON cannot carry (NaN, an object).
    """
    entry.seq = seq
    entry.prev_hash = prev_hash
    entry.key_id = None if key is None else key.id
    entry.hash = entry_hash(entry, None if key is None else key.secret)
    return entry


# -- keys ------------------------------------------------------------------------------------

AUDIT_KEY_ENV: Final = "HANDRAIL_AUDIT_KEY"
"""The environment variable of the key new entries are made with: `ID:SECRET`."""
AUDIT_OLD_KEYS_ENV: Final = "HANDRAIL_AUDIT_OLD_KEYS"
"""The environment variable of earlier keys, kept to verify the entries made with them:
`ID:SECRET` specs, space-separated."""
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MIN_SECRET = 32
"""Bytes a key's secret has at least: as many as the HMAC's SHA-256 output (RFC 2104)."""

_log = logging.getLogger("handrail.audit")


@dataclass(frozen=True, slots=True)
class AuditKey:
    """A key the audit trail's hashes are made with (HMAC-SHA256), and its id.

    The application holds it (the environment, a secret manager), never the database: the
    entries record only its id (`AuditEntry.key_id`), so that `verify` can pick the key of
    each entry from a keyring and keys can be rotated.

    Raises:
        ConfigError: the id is not 1 to 64 letters, digits, `.`, `_` or `-`, or the secret
            is shorter than 32 bytes.
    """

    id: str
    """Its name, recorded in every entry made with it (`2026-11`, say)."""
    secret: bytes = field(repr=False)
    """The secret (32 bytes or more; `handrail audit keygen` makes one). Never printed."""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _KEY_ID.fullmatch(self.id):
            raise ConfigError(
                f"An audit key's id is 1 to 64 letters, digits, '.', '_' or '-', not {self.id!r}."
            )
        if not isinstance(self.secret, bytes) or len(self.secret) < _MIN_SECRET:
            raise ConfigError(
                f"Audit key {self.id!r}: its secret must be at least {_MIN_SECRET} bytes "
                f"(make one with `handrail audit keygen`)."
            )

    @classmethod
    def parse(cls, spec: str, *, where: str = "An audit key") -> AuditKey:
        """A key from its `ID:SECRET` form (the secret is the text after the first colon).

        Args:
            spec: `ID:SECRET`.
            where: what the spec came from, for the error (an environment variable).

        Raises:
            ConfigError: the spec is not `ID:SECRET`, or the id or secret is not valid (the
                message never shows the secret).
        """
        key_id, colon, secret = spec.strip().partition(":")
        if not colon or not key_id or not secret:
            raise ConfigError(
                f"{where} is ID:SECRET (an id, a colon, then the secret): make one with "
                f"`handrail audit keygen --id ID`."
            )
        try:
            # surrogateescape: the bytes of a variable that is not UTF-8, as given
            return cls(key_id, secret.encode(errors="surrogateescape"))
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from None

    @classmethod
    def generate(cls, key_id: str) -> AuditKey:
        """A new key named `key_id` with a random secret of 64 hex digits (256 bits)."""
        return cls(key_id, secrets.token_hex(32).encode())

    def spec(self) -> str:
        """The key as `ID:SECRET` (what `HANDRAIL_AUDIT_KEY` holds): the secret in clear."""
        return f"{self.id}:{self.secret.decode(errors='surrogateescape')}"


class _FromEnvironment:
    """The type of `FROM_ENVIRONMENT`."""

    def __repr__(self) -> str:
        return "FROM_ENVIRONMENT"


FROM_ENVIRONMENT: Final = _FromEnvironment()
"""A store's default `audit_key`: the key in `HANDRAIL_AUDIT_KEY`, if it is set."""

AuditKeyOption = AuditKey | None | _FromEnvironment
"""What a store's `audit_key=` takes: a key, None (unkeyed), or `FROM_ENVIRONMENT`."""


def signing_key(option: AuditKeyOption) -> AuditKey | None:
    """The key a store makes its entries' hashes with, from its `audit_key=` argument.

    `FROM_ENVIRONMENT` reads `HANDRAIL_AUDIT_KEY` (`ID:SECRET`): unset or empty, None.

    Raises:
        ConfigError: `HANDRAIL_AUDIT_KEY` is set but malformed, or `option` is not a key.
    """
    if isinstance(option, _FromEnvironment):
        spec = os.environ.get(AUDIT_KEY_ENV, "")
        return AuditKey.parse(spec, where=AUDIT_KEY_ENV) if spec.strip() else None
    if option is not None and not isinstance(option, AuditKey):
        raise ConfigError(
            f"audit_key must be an AuditKey (or None, or FROM_ENVIRONMENT), not "
            f"{type(option).__name__}: AuditKey(id, secret)."
        )
    return option


def keyring_from_env(environ: Mapping[str, str] | None = None) -> dict[str, bytes]:
    """The keyring to verify with: `HANDRAIL_AUDIT_KEY`'s key and `HANDRAIL_AUDIT_OLD_KEYS`'.

    Args:
        environ: where to read the variables (default: `os.environ`).

    Raises:
        ConfigError: a spec is malformed, or two keys have one id but different secrets.
    """
    environ = os.environ if environ is None else environ
    keys: list[AuditKey] = []
    current = environ.get(AUDIT_KEY_ENV, "")
    if current.strip():
        keys.append(AuditKey.parse(current, where=AUDIT_KEY_ENV))
    keys += [
        AuditKey.parse(spec, where=AUDIT_OLD_KEYS_ENV)
        for spec in environ.get(AUDIT_OLD_KEYS_ENV, "").split()
    ]
    return _keyring(keys)


Keyring = Mapping[str, bytes | str] | Iterable[AuditKey]
"""Keys to verify with: id -> secret, or `AuditKey`s."""


def _keyring(keys: Keyring) -> dict[str, bytes]:
    if isinstance(keys, Mapping):
        keys = [
            AuditKey(key_id, secret.encode() if isinstance(secret, str) else secret)
            for key_id, secret in keys.items()
        ]
    ring: dict[str, bytes] = {}
    for key in keys:
        if ring.get(key.id, key.secret) != key.secret:
            raise ConfigError(
                f"Two audit keys are named {key.id!r} with different secrets: give each key "
                f"an id of its own (the entries record only the id)."
            )
        ring[key.id] = key.secret
    return ring


def warn_unkeyed(store: str) -> None:
    """Say loudly that a store chains its audit trail without a key (once a store)."""
    _log.warning(
        "%s chains the audit trail WITHOUT A KEY (no audit_key, and %s unset): anyone who "
        "can write the database can rewrite the trail undetected, and `handrail audit verify` "
        "reports it as unkeyed. Set %s=ID:SECRET (make one with `handrail audit keygen`) "
        "wherever the store is used, or pass audit_key=AuditKey(...). See docs/audit.md.",
        store,
        AUDIT_KEY_ENV,
        AUDIT_KEY_ENV,
    )


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
        card=card.kind,
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


@dataclass(frozen=True, slots=True)
class AuditAnchor:
    """An entry's number and hash, kept away from the trail (`handrail audit anchor`).

    Whoever can write the database can delete the trail's last entries, and nothing left in
    the trail shows it. Given the anchor taken earlier, `verify` finds it: the anchored entry
    must still be there, with the same hash (which, keyed, nobody without the key can forge).
    """

    seq: int
    """The entry's number (0: the empty trail, whose hash is `GENESIS`)."""
    hash: str
    """Its hash."""

    @classmethod
    def parse(cls, text: str) -> AuditAnchor:
        """An anchor from its `SEQ:HASH` form (what `str(anchor)` gives).

        Raises:
            ValueError: not `SEQ:HASH` with a number and 64 hex digits.
        """
        seq, colon, digest = text.strip().partition(":")
        if not (colon and seq.isascii() and seq.isdigit() and _HEX64.fullmatch(digest)):
            raise ValueError(
                f"An audit anchor is SEQ:HASH (an entry's number, a colon and its 64 hex "
                f"digits, as `handrail audit anchor` prints it), not {text[:80]!r}."
            )
        return cls(int(seq), digest)

    @classmethod
    def of(cls, entry: AuditEntry | None) -> AuditAnchor:
        """The anchor of `entry` (None: of the empty trail)."""
        return cls(0, GENESIS) if entry is None else cls(entry.seq, entry.hash)

    def __str__(self) -> str:
        return f"{self.seq}:{self.hash}"


AuditProblemKind = Literal[
    "edited",
    "deleted",
    "reordered",
    "relinked",
    "unknown_key",
    "downgraded",
    "truncated",
    "rewritten",
    "unkeyed",
]
"""How a trail does not hold together at an entry (see `AuditProblem.kind`)."""


@dataclass(kw_only=True, slots=True)
class AuditProblem:
    """Where an audit trail does not hold together, or cannot be proven."""

    seq: int
    """The number of the first entry concerned."""
    kind: AuditProblemKind
    """`edited`: its hash is not the HMAC of its content under its key (it was edited or
    forged, or the keyring's key of that id is not the one it was made with; unkeyed: not
    its SHA-256). `deleted`: entries before it are missing. `reordered`: it comes out of
    order, or twice. `relinked`: its `prev_hash` is not the hash of the entry before it
    (that one was replaced). `unknown_key`: its key is not in the keyring, so it cannot be
    checked. `downgraded`: it is unkeyed although an entry before it is keyed (keys are
    never dropped: it was forged, or the store lost its key). `truncated`: the anchor's
    entry is missing (the trail was cut after it). `rewritten`: the anchor's entry has
    another hash. `unkeyed` (a warning): the entries written without a key, before the first
    keyed one; their chain holds, but it proves nothing against someone who can write the
    database."""
    message: str
    """What is wrong, in words."""
    severity: Literal["error", "warning"] = "error"
    """`warning` for `unkeyed` entries (what a store written before keys holds), which
    `handrail audit verify` reports and passes (`--strict` fails them); `error` otherwise."""


def verify(
    entries: Iterable[AuditEntry],
    *,
    keys: Keyring | None = None,
    anchor: AuditAnchor | None = None,
) -> list[AuditProblem]:
    """Check one organisation's whole trail, in order; the problems, first broken entry first.

    Args:
        entries: the trail, oldest first (the whole of it: a missing head is `deleted`).
        keys: the keyring (id -> secret, or `AuditKey`s): every key the trail was written
            with. A keyed entry whose key is missing is `unknown_key`; with a keyring, the
            unkeyed entries are reported too (`unkeyed`, a warning). None: only the chain of
            the unkeyed entries is checked, which proves nothing against someone who can
            write the database.
        anchor: an anchor taken earlier (`AuditAnchor`): its entry must be there, unchanged.

    An empty list: every entry authenticates under its key, the numbers run from 1 without
    a gap, each entry chains to the one before, and the anchor's entry is there. Deleting
    the LAST entries is seen only with an anchor taken after them: anchor often.

    Raises:
        ConfigError: a key of `keys` is not valid.
    """
    verifier = AuditVerifier(keys=keys, anchor=anchor)
    verifier.feed(entries)
    return verifier.problems()


class AuditVerifier:
    """`verify`, fed a page at a time: a trail of any length in the memory of one page.

    Args:
        keys: the keyring, as `verify`'s.
        anchor: an anchor taken earlier, as `verify`'s.

    Raises:
        ConfigError: a key of `keys` is not valid.
    """

    def __init__(self, *, keys: Keyring | None = None, anchor: AuditAnchor | None = None) -> None:
        self.keys = None if keys is None else _keyring(keys)
        self.anchor = anchor
        self.count = 0
        """Entries fed so far."""
        self.keyed = 0
        """Entries fed so far that were keyed."""
        self.last: AuditAnchor = AuditAnchor.of(None)
        """The anchor of the last entry fed (of the empty trail before any)."""
        # Each problem with the position in the trail of the entry it is found at: the
        # problems come in the trail's order (a reordered entry's too), runs at their first.
        self._found: list[tuple[int, AuditProblem]] = []
        self._expected = 1
        self._first_keyed: int | None = None
        # Runs of entries: (first seq, last seq, position of the first).
        self._unkeyed: tuple[int, int, int] | None = None  # the unkeyed before any keyed
        self._unknown: dict[str, tuple[int, int, int]] = {}  # key id -> its entries
        self._edited: tuple[int, int, int] | None = None  # hashes that do not hold...
        self._edited_key: str | None = None  # ...under this key
        self._downgraded: tuple[int, int, int] | None = None  # unkeyed after keyed
        self._anchored = anchor is None
        self._position = 0  # of the entry being checked
        if anchor is not None and anchor.seq == 0:
            self._anchored = True  # the empty trail's: nothing to find
            if anchor.hash != GENESIS:
                self._add(0, "rewritten", f"an anchor of entry 0 (the empty trail) has the "
                          f"hash GENESIS ({GENESIS[:12]}…): this anchor is not one")  # fmt: skip

    def feed(self, entries: Iterable[AuditEntry]) -> None:
        """Check the next entries of the trail (the first call: from its first entry)."""
        for entry in entries:
            self._check(entry)

    def problems(self) -> list[AuditProblem]:
        """The problems of the entries fed so far, as if they were the whole trail."""
        found = list(self._found)
        if self._edited is not None:  # a run still open (more entries may continue it)
            found.append((self._edited[2], _edited(*self._edited[:2], self._edited_key)))
        if self._downgraded is not None:
            found.append((self._downgraded[2], self._downgraded_problem(*self._downgraded[:2])))
        for key_id, (first, last, position) in self._unknown.items():
            which = f"entry {first} was" if first == last else f"entries {first} to {last} were"
            fix = (
                f"no key was given (set {AUDIT_KEY_ENV}, or pass keys=)"
                if not self.keys
                else f"it is not in the keyring (add it to {AUDIT_OLD_KEYS_ENV}, or keys=)"
            )
            found.append(
                (
                    position,
                    AuditProblem(
                        seq=first,
                        kind="unknown_key",
                        message=f"{which} made with key {key_id!r} and cannot be checked: {fix}",
                    ),
                )
            )
        anchor = self.anchor
        if anchor is not None and not self._anchored:
            cut = anchor.seq >= self._expected
            message = (
                f"the trail ends at entry {self._expected - 1} but the anchor is entry "
                f"{anchor.seq}: entries {self._expected} to {anchor.seq} (at least) were deleted"
                if cut
                else f"the anchor's entry {anchor.seq} is missing (deleted)"
            )
            found.append(
                (self.count, AuditProblem(seq=anchor.seq, kind="truncated", message=message))
            )
        if self._unkeyed is not None and self.keys is not None:
            first, last, position = self._unkeyed
            which = f"entry {first} is" if first == last else f"entries {first} to {last} are"
            message = (
                f"{which} unkeyed (written before the store had a key, or without "
                f"{AUDIT_KEY_ENV}): the chain holds, but proves nothing against someone who "
                f"can write the database"
            )
            found.append(
                (
                    position,
                    AuditProblem(seq=first, kind="unkeyed", message=message, severity="warning"),
                )
            )
        found.sort(key=lambda item: item[0])  # stable: an entry's own problems keep their order
        return [problem for _, problem in found]

    def _check(self, entry: AuditEntry) -> None:
        seq, expected = entry.seq, self._expected
        self._position = self.count
        self.count += 1
        if seq < expected:
            self._add(seq, "reordered", f"entry {seq} comes after entry {expected - 1}: out of "
                      f"order or repeated")  # fmt: skip
            return
        if seq > expected:
            several = seq > expected + 1
            missing = f"entries {expected} to {seq - 1}" if several else f"entry {expected}"
            self._add(seq, "deleted", f"{missing} before entry {seq} "
                      f"{'are' if several else 'is'} missing (deleted)")  # fmt: skip
        elif entry.prev_hash != self.last.hash:
            self._add(seq, "relinked", f"entry {seq} does not chain to the entry before it "
                      f"(its prev_hash differs): an entry was replaced")  # fmt: skip
        self._authenticate(entry)
        if self.anchor is not None and seq == self.anchor.seq:
            self._anchored = True
            if entry.hash != self.anchor.hash:
                self._add(seq, "rewritten", f"entry {seq} is not the anchored one (its hash "
                          f"is {entry.hash[:12]}…, the anchor's {self.anchor.hash[:12]}…): the "
                          f"trail was rewritten up to it since the anchor was taken")  # fmt: skip
        self._expected, self.last = seq + 1, AuditAnchor.of(entry)

    def _authenticate(self, entry: AuditEntry) -> None:
        seq, key_id = entry.seq, entry.key_id
        secret: bytes | None = None
        if key_id is None:
            if self._first_keyed is not None:
                run = self._downgraded
                if run is None or run[1] != seq - 1:
                    self._close_downgraded()
                    run = (seq, seq, self._position)
                self._downgraded = (run[0], seq, run[2])
            elif self._unkeyed is None:
                self._unkeyed = (seq, seq, self._position)
            else:
                self._unkeyed = (self._unkeyed[0], seq, self._unkeyed[2])
        else:
            self._close_downgraded()
            self.keyed += 1
            if self._first_keyed is None:
                self._first_keyed = seq
            secret = None if self.keys is None else self.keys.get(key_id)
            if secret is None:  # cannot tell: reported once, at the end
                first, _, position = self._unknown.get(key_id, (seq, seq, self._position))
                self._unknown[key_id] = (first, seq, position)
                self._close_edited()
                return
        if hmac.compare_digest(entry_hash(entry, secret), entry.hash):
            self._close_edited()
            return
        edited = self._edited
        if edited is not None and edited[1] == seq - 1 and self._edited_key == key_id:
            self._edited = (edited[0], seq, edited[2])  # one problem a run: a rechained tail
        else:
            self._close_edited()
            self._edited, self._edited_key = (seq, seq, self._position), key_id

    def _close_downgraded(self) -> None:
        if self._downgraded is not None:
            first, last, position = self._downgraded
            self._found.append((position, self._downgraded_problem(first, last)))
            self._downgraded = None

    def _downgraded_problem(self, first: int, last: int) -> AuditProblem:
        which = f"entry {first} is" if first == last else f"entries {first} to {last} are"
        return AuditProblem(
            seq=first,
            kind="downgraded",
            message=f"{which} unkeyed, after keyed entries (from entry {self._first_keyed}): "
            f"forged, or the store lost its key ({AUDIT_KEY_ENV})",
        )

    def _close_edited(self) -> None:
        if self._edited is not None:
            first, last, position = self._edited
            self._found.append((position, _edited(first, last, self._edited_key)))
            self._edited = None

    def _add(self, seq: int, kind: AuditProblemKind, message: str) -> None:
        self._found.append((self._position, AuditProblem(seq=seq, kind=kind, message=message)))


def _edited(first: int, last: int, key_id: str | None) -> AuditProblem:
    """The problem of entries `first` to `last` whose hashes do not hold."""
    if key_id is None:
        message = (
            f"entry {first} was edited: its content does not hash to its hash"
            if first == last
            else f"entries {first} to {last} were edited: their contents do not hash to "
            f"their hashes"
        )
    else:
        which = f"entry {first} does" if first == last else f"entries {first} to {last} do"
        message = (
            f"{which} not authenticate under key {key_id!r}: edited or forged (or the "
            f"keyring's key {key_id!r} is not the one the trail was written with)"
        )
    return AuditProblem(seq=first, kind="edited", message=message)
