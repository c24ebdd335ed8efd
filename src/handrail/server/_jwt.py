"""`JwtAuthenticator`: bearer JWTs verified against a JWKS (PyJWT), claims mapped to a caller."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from ..exceptions import ConfigError, MissingExtraError
from ._auth import Caller

if TYPE_CHECKING:
    import jwt

__all__ = ["JwtAuthenticator"]

_log = logging.getLogger("handrail.server")

_ASYMMETRIC = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384"})
_ASYMMETRIC |= {"ES512", "EdDSA"}


class JwtAuthenticator:
    """Bearer JWTs (`Authorization: Bearer <token>`) from an identity provider.

    A token is accepted only if its signature verifies with a key of the provider's JWKS
    (found by the token's `kid`; for a `kid` it lacks the set is fetched again, but not sooner
    than 30 seconds after the last fetch, so made-up kids cannot flood the provider), with one
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
        cache_seconds: how long a fetched JWKS is used before it is fetched again.
        timeout: seconds a JWKS fetch may take.

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
        self._keys: jwt.PyJWKClient = jwt.PyJWKClient(
            jwks_url, cache_jwk_set=True, lifespan=cache_seconds, timeout=timeout
        )

    async def authenticate(self, request: Request) -> Caller | None:
        """The caller a valid token names, or `None`."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        claims = await asyncio.to_thread(self.verify, token)
        return None if claims is None else self.caller(claims)

    def verify(self, token: str) -> dict[str, Any] | None:
        """The claims of `token` if it verifies, else None (blocking: it may fetch the JWKS)."""
        jwt = self._jwt
        try:
            header = jwt.get_unverified_header(token)
            if header.get("alg") not in self.algorithms:
                return None  # before any key is looked up: `none` never gets that far
            key = self._keys.get_signing_key_from_jwt(token)
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=self.algorithms,
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWKClientConnectionError as error:
            _log.warning("handrail: the JWKS could not be fetched: %s", error)
            return None
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


def _claim(claims: Mapping[str, Any], name: str) -> Any:
    if name in claims:  # a namespaced claim (`https://example.com/org`) has dots of its own
        return claims[name]
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value
