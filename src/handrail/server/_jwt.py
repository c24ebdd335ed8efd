"""`JwtAuthenticator`: bearer JWTs verified against a JWKS (PyJWT), claims mapped to a caller."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from starlette.requests import Request

from ..exceptions import ConfigError, MissingExtraError
from ._auth import Caller
from ._errors import ApiError

__all__ = ["JwtAuthenticator"]

_log = logging.getLogger("handrail.server")

_ASYMMETRIC = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384"})
_ASYMMETRIC |= {"ES512", "EdDSA"}


class JwtAuthenticator:
    """Bearer JWTs (`Authorization: Bearer <token>`) from an identity provider.

    A token is accepted only if its signature verifies with a key of the provider's JWKS
    (found by the token's `kid`; for a `kid` it lacks the set is fetched again, but not sooner
    than `cooldown` seconds after the last attempt, failed or not, so made-up kids cannot
    flood the provider nor make requests queue behind fetches; a token whose key is known
    never waits for a fetch), with one
    of `algorithms` (asymmetric only: `none` and shared-secret `HS*` are refused, whatever the
    token's header says), and its `exp`, `iss` and `aud` check out. Its claims then give the
    caller: the organisation, the user and the roles, each read from a claim you name (a claim
    of that exact name, such as Auth0's `https://example.com/org`, else a dotted name reads a
    nested claim, such as Keycloak's `realm_access.roles`; roles are a list or a
    space-separated string). A token without an organisation or a user authenticates nobody.

    Args:
        jwks_url: the provider's JWKS (e.g. `https://idp.example.com/.well-known/jwks.json`).
        issuer: the `iss` a token must have.
        audience: the `aud` a token must have (this API's identifier at the provider).
        org_claim: the claim holding the caller's organisation.
        user_claim: the claim holding the caller (recorded as `by` on decisions).
        roles_claim: the claim holding the caller's roles (missing: no role).
        algorithms: the signature algorithms accepted.
        leeway: seconds of clock skew allowed on `exp`, `nbf` and `iat`.
        cache_seconds: how long a fetched JWKS is used before it is fetched again (if that
            fetch fails, the keys in hand stay in use, and it is tried again after `cooldown`).
        timeout: seconds a JWKS fetch may take.
        cooldown: seconds after a fetch (failed or not) before a token of an unknown `kid` may
            set off another. While the last one failed, such a token is answered 503
            (`jwks_unavailable`, with `Retry-After`), not 401: it may be valid.

    Raises:
        ConfigError: PyJWT is missing (`MissingExtraError`: `pip install "handrail[server]"`),
            or an algorithm is not an asymmetric one.
    """

    def __init__(
        self,
        *,
        jwks_url: str,
        issuer: str,
        audience: str,
        org_claim: str = "org_id",
        user_claim: str = "sub",
        roles_claim: str = "roles",
        algorithms: Sequence[str] = ("RS256", "ES256"),
        leeway: float = 30.0,
        cache_seconds: float = 300.0,
        timeout: float = 10.0,
        cooldown: float = 30.0,
    ) -> None:
        try:
            import jwt
        except ImportError:  # pragma: no cover - exercised only without the extra
            raise MissingExtraError("JwtAuthenticator", needs="PyJWT", extra="server") from None
        refused = sorted(set(algorithms) - _ASYMMETRIC)
        if refused or not algorithms:
            raise ConfigError(
                f"JwtAuthenticator: algorithms={list(algorithms)!r}: give asymmetric ones "
                f"verified by the JWKS ({', '.join(sorted(_ASYMMETRIC))}); never none or HS*."
            )
        self._jwt = jwt
        self.issuer = issuer
        self.audience = audience
        self.org_claim = org_claim
        self.user_claim = user_claim
        self.roles_claim = roles_claim
        self.algorithms = list(algorithms)
        self.leeway = leeway
        self._keys = _Keys(jwks_url, lifespan=cache_seconds, timeout=timeout, cooldown=cooldown)

    async def authenticate(self, request: Request) -> Caller | None:
        """The caller a valid token names, or `None`."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        claims = await asyncio.to_thread(self.verify, token)
        return None if claims is None else self.caller(claims)

    def verify(self, token: str) -> dict[str, Any] | None:
        """The claims of `token` if it verifies, else None (blocking: it may fetch the JWKS).

        Raises:
            ApiError: 503 (`jwks_unavailable`): the token's key is not known and the JWKS
                could not be fetched (a 401 would tell a valid token it is not).
        """
        jwt = self._jwt
        try:
            header = jwt.get_unverified_header(token)
            if header.get("alg") not in self.algorithms:
                return None  # before any key is looked up: `none` never gets that far
            kid = header.get("kid")
            key = self._keys.get(kid) if isinstance(kid, str) and kid else None
            if key is None:
                return None
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=self.algorithms,
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError:
            return None
        return claims

    def caller(self, claims: Mapping[str, Any]) -> Caller | None:
        """The caller that verified `claims` name (None: no organisation or user in them)."""
        org_id, user_id = _claim(claims, self.org_claim), _claim(claims, self.user_claim)
        if not (isinstance(org_id, str) and org_id and isinstance(user_id, str) and user_id):
            return None
        roles = _claim(claims, self.roles_claim)
        if isinstance(roles, str):
            roles = roles.split()
        if not isinstance(roles, list):
            roles = []
        subject = claims.get("sub", user_id)
        return Caller(
            org_id,
            user_id,
            frozenset(r for r in roles if isinstance(r, str) and r),
            f"jwt:{claims.get('iss')}#{subject}",
        )


class _Keys:
    """A JWKS's signing keys by `kid`: looked up without a lock, fetched one fetch at a time.

    PyJWT's `PyJWKClient` holds one lock across a fetch, so while a fetch for a made-up `kid`
    waits on a slow or dead provider every token queues behind it, and a failed fetch starts
    no cooldown, so the next made-up `kid` sets off another. Here a token of a known `kid`
    takes its key from the last set fetched and never waits; an unknown `kid` sets off a fetch
    only `cooldown` seconds after the last attempt, whatever its outcome.
    """

    def __init__(
        self,
        url: str,
        *,
        lifespan: float,
        timeout: float,
        cooldown: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        import jwt

        if not (math.isfinite(cooldown) and cooldown >= 0):
            raise ConfigError(f"JwtAuthenticator: cooldown={cooldown!r}: give seconds, 0 or more.")
        self.url, self.lifespan, self.cooldown, self.clock = url, lifespan, cooldown, clock
        # Used for its fetch alone (its URL checks, no redirects, its errors); no cache of its.
        self._client = jwt.PyJWKClient(url, cache_jwk_set=False, timeout=timeout)
        self._keys: dict[str, Any] = {}  # kid -> PyJWK; replaced whole, never changed
        self._fetched_at: float | None = None  # the last fetch that succeeded
        self._tried_at: float | None = None  # the last attempt, failed or not
        self._failure: str | None = None  # why the last attempt failed
        self._fetching = threading.Lock()

    def get(self, kid: str) -> Any:
        """The key of `kid` (a `PyJWK`), or None if the JWKS has none.

        Raises:
            ApiError: 503, `kid` is unknown and the JWKS could not be fetched.
        """
        key = self._keys.get(kid)
        if key is not None:
            stale = self._fetched_at is None or self.clock() - self._fetched_at >= self.lifespan
            if stale and not self._cooling() and self._fetching.acquire(blocking=False):
                try:  # this token refreshes the set; the others use the keys in hand meanwhile
                    self._fetch()
                finally:
                    self._fetching.release()
                key = self._keys.get(kid)  # gone from the new set: no longer valid
            return key
        with self._fetching:  # an unknown kid waits for a fetch under way: it may bring it
            key = self._keys.get(kid)
            if key is None and not self._cooling():
                self._fetch()
                key = self._keys.get(kid)
        if key is None and self._failure is not None:
            seconds = max(1, math.ceil(self.cooldown))
            raise ApiError(
                503,
                "jwks_unavailable",
                f"The identity provider's keys (the JWKS at {self.url}) could not be fetched, "
                f"so the token cannot be checked: try again in {seconds} s.",
                headers={"Retry-After": str(seconds)},
            )
        return key

    def _cooling(self) -> bool:
        return self._tried_at is not None and self.clock() - self._tried_at < self.cooldown

    def _fetch(self) -> None:
        """Fetch the set (with `_fetching` held); on failure keep the keys in hand."""
        import jwt

        try:
            found = self._client.get_signing_keys(refresh=True)
        except (jwt.PyJWKClientError, jwt.PyJWKSetError) as error:
            self._tried_at, self._failure = self.clock(), str(error)
            _log.warning(
                "handrail: the JWKS at %s could not be fetched (%s); the %d keys in hand stay "
                "in use, and a token of another key gets 503 for %g s",
                self.url,
                error,
                len(self._keys),
                self.cooldown,
            )
            return
        self._keys = {key.key_id: key for key in found if key.key_id is not None}
        self._tried_at = self._fetched_at = self.clock()
        self._failure = None


def _claim(claims: Mapping[str, Any], name: str) -> Any:
    if name in claims:  # a namespaced claim (`https://example.com/org`) has dots of its own
        return claims[name]
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value
