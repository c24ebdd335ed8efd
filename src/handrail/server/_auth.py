"""Who is calling: an `Authenticator` turns a request into the caller's org, user and roles.

Every session belongs to the org and user that created it, so the caller is all the server
needs to scope a request; another tenant's session answers 404, as if it did not exist. The
caller's roles say which calls of other people's sessions of its org it may decide
(`handrail.policy`); they come from the authenticator, never from a request body.
"""

from __future__ import annotations

import datetime
import hmac
import logging
import os
import secrets
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol, runtime_checkable

from starlette.requests import Request

from ..exceptions import ConfigError
from ..policy import Decider

__all__ = [
    "ApiKeyAuthenticator",
    "ApiKeyFileAuthenticator",
    "ApiKeySpec",
    "Authenticator",
    "Caller",
    "reload_key_files",
]

_log = logging.getLogger("handrail.server")


class Caller(NamedTuple):
    """The authenticated caller: every session it touches is scoped to this org and user.

    Compare callers by `who`: two requests of one person may come through different keys.
    """

    org_id: str
    """The caller's organisation."""
    user_id: str
    """The caller (recorded as `by` on the decisions it makes)."""
    roles: frozenset[str] = frozenset()
    """The caller's roles, for the decision policies (`DecisionPolicy(roles=...)`)."""
    credential: str | None = None
    """What it authenticated with, for an audit trail: an API key's id (`key:<id>`) or a
    token's issuer and subject (`jwt:<iss>#<sub>`). Never the secret itself."""

    @property
    def who(self) -> tuple[str, str]:
        """(org, user): whose sessions these are."""
        return self.org_id, self.user_id

    def decider(self) -> Decider:
        """The caller as the decider of a decision (`handrail.policy`)."""
        return Decider(user_id=self.user_id, roles=self.roles, org_id=self.org_id)


@runtime_checkable
class Authenticator(Protocol):
    """Turns a request into its caller, or `None` to answer 401.

    Implement it to plug in your own identity (a session cookie, a JWT, a proxy's header).
    Never log what the request carries to prove who it is.
    """

    async def authenticate(self, request: Request) -> Caller | None:
        """The caller, or `None` if the request does not prove who it is."""
        ...


class ApiKeyAuthenticator:
    """API keys sent as `Authorization: Bearer <key>`, kept only as salted hashes.

    A key is hashed (HMAC-SHA256 with the salt) as soon as it is added, and only the hash is
    kept, so a memory dump or a config file of hashes gives no key away. Give a fixed `salt`
    to configure keys by their `digest` (made once, with the same salt) instead of in plain.
    A key may expire: past its `expires_at` it authenticates nobody (401).

    Args:
        keys: API key -> the caller it authenticates.
        salt: the HMAC key (default: random, for keys added in plain in this process).
        clock: the time (seconds since the epoch), for expiries.
    """

    def __init__(
        self,
        keys: Mapping[str, Caller] | None = None,
        *,
        salt: bytes | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.salt = salt if salt is not None else secrets.token_bytes(16)
        self.clock = clock
        self._callers: dict[str, tuple[Caller, float | None]] = {}
        for key, caller in (keys or {}).items():
            self.add(key, caller)

    @staticmethod
    def generate_key() -> str:
        """A new random API key (256 bits, URL-safe)."""
        return secrets.token_urlsafe(32)

    def digest(self, key: str) -> str:
        """The salted hash of `key`, as kept (hex)."""
        return hmac.digest(self.salt, key.encode(), "sha256").hex()

    def add(
        self,
        key: str,
        caller: Caller,
        *,
        key_id: str | None = None,
        expires_at: float | None = None,
    ) -> None:
        """Accept `key` for `caller` (only its hash is kept).

        Args:
            key: the key.
            caller: who it authenticates (org, user, roles).
            key_id: its name in the audit trail (`Caller.credential` is `key:<key_id>`);
                default: the start of its salted hash.
            expires_at: when it stops working (seconds since the epoch); None: never.
        """
        if not key or key != key.strip():
            raise ValueError("an API key must be non-empty, without surrounding whitespace")
        self.add_digest(self.digest(key), caller, key_id=key_id, expires_at=expires_at)

    def add_digest(
        self,
        digest: str,
        caller: Caller,
        *,
        key_id: str | None = None,
        expires_at: float | None = None,
    ) -> None:
        """Accept the key whose `digest` (with this salt) is given, for `caller` (as `add`)."""
        caller = Caller(*caller)
        if caller.credential is None:
            caller = caller._replace(credential=f"key:{key_id or digest[:12]}")
        self._callers[digest] = (caller, expires_at)

    def add_spec(self, spec: str) -> None:
        """Accept the key of a spec (`ApiKeySpec.parse`): `ORG:USER:KEY`, or with `id=`, ..."""
        parsed = ApiKeySpec.parse(spec)
        self.add(
            parsed.key,
            Caller(parsed.org_id, parsed.user_id, parsed.roles),
            key_id=parsed.key_id,
            expires_at=parsed.expires_at,
        )

    def add_specs(self, specs: Iterable[tuple[str, str]]) -> None:
        """Accept the keys of specs, each with where it was written, all or none.

        Args:
            specs: (where, spec) pairs: where names the spec in an error (`keys line 3`).

        Raises:
            ConfigError: a spec is malformed, or one key is given twice (both places named,
                never the key): the last would silently win.
        """
        self._callers = {**self._callers, **self._read_specs(specs)}

    def __len__(self) -> int:
        """How many keys it accepts."""
        return len(self._callers)

    def _read_specs(
        self, specs: Iterable[tuple[str, str]]
    ) -> dict[str, tuple[Caller, float | None]]:
        """The callers of `specs`, by digest, as `add_specs` takes them (nothing is added)."""
        scratch = ApiKeyAuthenticator(salt=self.salt, clock=self.clock)
        seen: dict[str, str] = {}
        for where, spec in specs:
            try:
                parsed = ApiKeySpec.parse(spec)
            except ValueError as error:
                raise ConfigError(f"{where}: {error}") from None
            digest = self.digest(parsed.key)
            if digest in seen or digest in self._callers:
                first = seen.get(digest, "a key added before")
                caller, _ = scratch._callers.get(digest) or self._callers[digest]
                raise ConfigError(
                    f"{first} and {where} give the same API key (to {caller.org_id}/"
                    f"{caller.user_id} and to {parsed.org_id}/{parsed.user_id}): a key "
                    f"authenticates one caller. Remove one, or give each caller a key of its "
                    f"own (`ApiKeyAuthenticator.generate_key()`)."
                )
            seen[digest] = where
            scratch.add(
                parsed.key,
                Caller(parsed.org_id, parsed.user_id, parsed.roles),
                key_id=parsed.key_id,
                expires_at=parsed.expires_at,
            )
        return scratch._callers

    async def authenticate(self, request: Request) -> Caller | None:
        """The caller of a valid, unexpired bearer key, or `None`."""
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key:
            return None
        # Looked up by its HMAC: a caller cannot steer the hash, so timing tells nothing.
        found = self._callers.get(self.digest(key.strip()))
        if found is None:
            return None
        caller, expires_at = found
        if expires_at is not None and self.clock() >= expires_at:
            return None
        return caller


_files: weakref.WeakSet[ApiKeyFileAuthenticator] = weakref.WeakSet()


class ApiKeyFileAuthenticator(ApiKeyAuthenticator):
    """API keys of a file, one spec a line (`ApiKeySpec`), read again when the file changes.

    Before each request the file's status is looked at (one `stat`, no read): once it changed
    (written, replaced, touched), the file is read again, so a key removed from it answers
    401 from the next request on, with no restart. `reload_key_files` (what `serve` does on
    SIGHUP) reads it at once. A file that cannot be read or holds an invalid spec at a reload
    keeps the keys in use, and says so in the log as an error until it is fixed: it never
    falls open, nor silently drops to no key. Write the file whole and rename it over the old
    one (`mv`), so that a reload never reads half of it. Keys given with `add` are dropped at
    the next reload: give them as `specs`.

    Args:
        path: the file; blank lines and lines starting with `#` are skipped.
        specs: more specs, fixed (`HANDRAIL_API_KEYS`'s), as (where, spec) pairs.
        salt: as `ApiKeyAuthenticator`'s.
        clock: as `ApiKeyAuthenticator`'s.

    Raises:
        ConfigError: the file cannot be read, a spec is malformed, or one key is given twice
            (both lines named).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        specs: Iterable[tuple[str, str]] = (),
        *,
        salt: bytes | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(salt=salt, clock=clock)
        self.path = Path(path)
        self.specs = list(specs)
        self._stamp, self._callers = self._read()
        _files.add(self)

    def reload(self) -> bool:
        """Read the file again now; True if its keys are in use, False if the old ones stay."""
        try:
            stamp, callers = self._read()
        except ConfigError as error:
            self._stamp = _stamp(self.path)  # the same broken file: not read again
            _log.error(
                "handrail: the API keys file %s was NOT reloaded, the %d keys read before stay "
                "in use until it is fixed: %s",
                self.path,
                len(self._callers),
                error,
            )
            return False
        added, removed = callers.keys() - self._callers.keys(), self._callers.keys() - callers
        self._stamp, self._callers = stamp, callers
        _log.warning(
            "handrail: reloaded the API keys file %s: %d keys (%d added, %d removed)",
            self.path,
            len(callers),
            len(added),
            len(removed),
        )
        if not callers:
            _log.warning("handrail: no API key is configured any more: every request gets 401")
        return True

    def _read(self) -> tuple[object, dict[str, tuple[Caller, float | None]]]:
        stamp = _stamp(self.path)  # before the read: a change while reading is read again
        try:
            lines = self.path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"The API keys file {self.path} cannot be read: {error}.") from None
        specs = [
            (f"{self.path} line {number}", line.strip())
            for number, line in enumerate(lines, 1)
            if line.strip() and not line.strip().startswith("#")
        ]
        # Read as a whole into a new map, swapped in at once: a request never sees half.
        return stamp, ApiKeyAuthenticator(salt=self.salt)._read_specs([*self.specs, *specs])

    async def authenticate(self, request: Request) -> Caller | None:
        """As `ApiKeyAuthenticator.authenticate`, with the file read again if it changed."""
        # One stat a request (a microsecond or two): a revoked key stops at the next request.
        if _stamp(self.path) != self._stamp:
            self.reload()
        return await super().authenticate(request)


def _stamp(path: Path) -> object:
    """What changes when the file is written, replaced or removed."""
    try:
        status = path.stat()
    except OSError as error:
        return type(error).__name__
    return (status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


def reload_key_files() -> int:
    """Read every `ApiKeyFileAuthenticator`'s file again now (`serve` does on SIGHUP).

    Returns:
        How many files were read without error (their keys are in use now).
    """
    return sum(keys.reload() for keys in list(_files))


_FIELDS = ("id", "org", "user", "roles", "expires", "key")


@dataclass(frozen=True, slots=True)
class ApiKeySpec:
    """One configured API key: who it authenticates, its id, roles and expiry.

    Written in one of two forms (in `HANDRAIL_API_KEYS`, space-separated, or a keys file, one
    a line):

    - `ORG:USER:KEY`: no roles, never expires (the key itself may contain colons);
    - `id=ops-1,org=acme,user=bo,roles=it-admin+helpdesk,expires=2027-01-31,key=KEY`: fields
      in any order, `key=` last (the key may then contain anything); `roles` joined with `+`,
      `expires` an ISO 8601 date or date and time (UTC unless it says otherwise); only `org`,
      `user` and `key` are required.
    """

    org_id: str
    user_id: str
    key: str
    key_id: str | None = None
    roles: frozenset[str] = frozenset()
    expires_at: float | None = None

    @classmethod
    def parse(cls, spec: str) -> ApiKeySpec:
        """Read a spec (see the class).

        Raises:
            ValueError: the spec is malformed (the message shows the forms, never the key).
        """
        if not spec.startswith(tuple(f"{name}=" for name in _FIELDS)):
            org_id, user_id, key = [*spec.split(":", 2), "", ""][:3]
            if not (org_id and user_id and key):
                raise ValueError(
                    "An API key is ORG:USER:KEY, or id=ID,org=ORG,user=USER,roles=R1+R2,"
                    "expires=2027-01-31,key=KEY (the key last)."
                )
            return cls(org_id, user_id, key)
        head, found, key = spec.partition("key=")
        fields: dict[str, str] = {}
        for item in filter(None, head.split(",")):
            name, equals, value = item.partition("=")
            if not equals or name not in _FIELDS or name in fields:
                raise ValueError(
                    f"API key field {name!r}: fields are {', '.join(_FIELDS)}, each once, "
                    f"as name=value, key= last."
                )
            fields[name] = value
        if not (found and key and fields.get("org") and fields.get("user")):
            raise ValueError(f"An API key {fields.get('id', '')!r} needs org=, user= and key=.")
        roles = frozenset(r for r in fields.get("roles", "").split("+") if r)
        expires = fields.get("expires")
        return cls(
            fields["org"],
            fields["user"],
            key,
            fields.get("id") or None,
            roles,
            _timestamp(expires) if expires else None,
        )


def _timestamp(text: str) -> float:
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"API key expires={text!r}: give an ISO 8601 date (2027-01-31) or date and time."
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()
