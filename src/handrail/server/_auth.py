"""Who is calling: an `Authenticator` turns a request into the caller's org and user.

Every session belongs to the org and user that created it, so the caller is all the server
needs to scope a request; another tenant's session answers 404, as if it did not exist.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping
from typing import NamedTuple, Protocol, runtime_checkable

from starlette.requests import Request

__all__ = ["ApiKeyAuthenticator", "Authenticator", "Caller"]


class Caller(NamedTuple):
    """The authenticated caller: every session it touches is scoped to this org and user."""

    org_id: str
    """The caller's organisation."""
    user_id: str
    """The caller (recorded as `by` on the decisions it makes)."""


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

    Args:
        keys: API key -> the caller it authenticates.
        salt: the HMAC key (default: random, for keys added in plain in this process).
    """

    def __init__(
        self, keys: Mapping[str, Caller] | None = None, *, salt: bytes | None = None
    ) -> None:
        self.salt = salt if salt is not None else secrets.token_bytes(16)
        self._callers: dict[str, Caller] = {}
        for key, caller in (keys or {}).items():
            self.add(key, caller)

    @staticmethod
    def generate_key() -> str:
        """A new random API key (256 bits, URL-safe)."""
        return secrets.token_urlsafe(32)

    def digest(self, key: str) -> str:
        """The salted hash of `key`, as kept (hex)."""
        return hmac.digest(self.salt, key.encode(), "sha256").hex()

    def add(self, key: str, caller: Caller) -> None:
        """Accept `key` for `caller` (only its hash is kept)."""
        if not key or key != key.strip():
            raise ValueError("an API key must be non-empty, without surrounding whitespace")
        self.add_digest(self.digest(key), caller)

    def add_digest(self, digest: str, caller: Caller) -> None:
        """Accept the key whose `digest` (with this salt) is given, for `caller`."""
        self._callers[digest] = Caller(*caller)

    async def authenticate(self, request: Request) -> Caller | None:
        """The caller of a valid bearer key, or `None`."""
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key:
            return None
        # Looked up by its HMAC: a caller cannot steer the hash, so timing tells nothing.
        return self._callers.get(self.digest(key.strip()))
