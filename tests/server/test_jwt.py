"""`JwtAuthenticator` against a real JWKS endpoint served here, with keys made by cryptography."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from handrail import Agent, ConfigError, DecisionPolicy, Domain, Engine, Runtime, tool
from handrail.server import Caller, JwtAuthenticator, create_app
from handrail.store import MemoryStore
from handrail.testing import ScriptedModel, call

ISSUER = "https://idp.example.test/"
AUDIENCE = "handrail-api"

RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
STRANGER = rsa.generate_private_key(public_exponent=65537, key_size=2048)  # not in the JWKS


def _jwk(key: Any, kid: str, algorithm: Any) -> dict[str, Any]:
    jwk: dict[str, Any] = json.loads(algorithm.to_jwk(key.public_key()))
    return {**jwk, "kid": kid, "use": "sig"}


JWKS = {
    "keys": [
        _jwk(RSA_KEY, "rsa-1", RSAAlgorithm(RSAAlgorithm.SHA256)),
        _jwk(EC_KEY, "ec-1", ECAlgorithm(ECAlgorithm.SHA256)),
    ]
}


class _Jwks(BaseHTTPRequestHandler):
    fetched = 0

    def do_GET(self) -> None:
        type(self).fetched += 1
        body = json.dumps(JWKS).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def jwks_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Jwks)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/.well-known/jwks.json"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def token(key: Any = RSA_KEY, kid: str = "rsa-1", algorithm: str = "RS256", **claims: Any) -> str:
    now = int(time.time())
    payload = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "auth0|bo",
        "org_id": "acme",
        "roles": ["it-admin"],
        "iat": now,
        "exp": now + 600,
        **claims,
    }
    payload = {k: v for k, v in payload.items() if v is not None}
    return jwt.encode(payload, key, algorithm=algorithm, headers={"kid": kid})


def unsigned(**claims: Any) -> str:
    """A token with `alg: none` (and no signature), as an attacker would send it."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    good = jwt.decode(token(**claims), options={"verify_signature": False})
    return f"{part({'alg': 'none', 'typ': 'JWT', 'kid': 'rsa-1'})}.{part(good)}."


@pytest.fixture
async def client(jwks_url: str) -> AsyncIterator[httpx.AsyncClient]:
    auth = JwtAuthenticator(jwks_url=jwks_url, issuer=ISSUER, audience=AUDIENCE)
    engine = Engine(Agent("desk"), store=MemoryStore(), runtime=Runtime(model=ScriptedModel([])))
    app = create_app(engine, authenticator=auth)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as http,
    ):
        yield http


async def status(client: httpx.AsyncClient, bearer: str) -> int:
    response = await client.get("/sessions", headers={"Authorization": f"Bearer {bearer}"})
    return response.status_code


async def test_a_valid_token_of_either_key_authenticates(client: httpx.AsyncClient) -> None:
    assert await status(client, token()) == 200
    assert await status(client, token(EC_KEY, "ec-1", "ES256")) == 200


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (lambda: token(exp=int(time.time()) - 3600, iat=int(time.time()) - 7200), "expired"),
        (lambda: token(aud="another-api"), "wrong audience"),
        (lambda: token(iss="https://evil.example.test/"), "wrong issuer"),
        (lambda: token(kid="rsa-9"), "unknown kid"),
        (lambda: token(STRANGER), "signed by a key not in the JWKS, under a kid that is"),
        (lambda: token(exp=None), "no expiry"),
        (lambda: token(org_id=None), "no organisation"),
        (unsigned, "alg none"),
        (lambda: token(b"a-shared-secret-of-32-bytes-long!", algorithm="HS256"), "HS256"),
        (lambda: "not.a.token", "garbage"),
    ],
)
async def test_a_token_that_does_not_verify_is_401(
    client: httpx.AsyncClient, bad: Any, why: str
) -> None:
    assert await status(client, bad()) == 401, why


async def test_claims_map_to_org_user_roles_and_the_credential(jwks_url: str) -> None:
    auth = JwtAuthenticator(
        jwks_url=jwks_url,
        issuer=ISSUER,
        audience=AUDIENCE,
        org_claim="https://handrail.test/org",
        user_claim="email",
        roles_claim="realm_access.roles",
    )
    claims = auth.verify(
        token(
            **{"https://handrail.test/org": "acme", "email": "bo@acme.test"},
            realm_access={"roles": ["it-admin", "helpdesk"]},
        )
    )
    assert claims is not None
    assert auth.caller(claims) == Caller(
        "acme",
        "bo@acme.test",
        frozenset({"it-admin", "helpdesk"}),
        f"jwt:{ISSUER}#auth0|bo",
    )
    space_separated = auth.caller({**claims, "realm_access": {"roles": "a b"}})
    assert space_separated is not None and space_separated.roles == {"a", "b"}


async def test_the_jwks_is_fetched_once_and_made_up_kids_do_not_flood_it(jwks_url: str) -> None:
    auth = JwtAuthenticator(jwks_url=jwks_url, issuer=ISSUER, audience=AUDIENCE)
    before = _Jwks.fetched
    assert auth.verify(token()) is not None
    assert auth.verify(token(EC_KEY, "ec-1", "ES256")) is not None
    assert _Jwks.fetched == before + 1  # cached
    for kid in ("rsa-9", "rsa-10", "rsa-11"):
        assert auth.verify(token(kid=kid)) is None
    # PyJWT looks again for a kid it lacks only after a cooldown since its last fetch
    assert _Jwks.fetched == before + 1


def test_algorithms_that_a_jwks_cannot_verify_are_refused_at_configuration() -> None:
    for algorithms in (["none"], ["HS256"], ["RS256", "HS512"], []):
        with pytest.raises(ConfigError, match="never none or HS"):
            JwtAuthenticator(
                jwks_url="http://x", issuer=ISSUER, audience=AUDIENCE, algorithms=algorithms
            )


wiped: list[str] = []


@tool(name="laptops.wipe", permission="destructive")
def wipe(laptop: str) -> str:
    """Wipe a laptop."""
    wiped.append(laptop)
    return f"wiped {laptop}"


async def test_a_token_with_the_role_approves_and_one_without_is_refused(jwks_url: str) -> None:
    """The roles in a token are what a decision policy checks."""
    model = ScriptedModel([[call("laptops.wipe", laptop="L-7")], "Wiped."])
    policy = DecisionPolicy(roles={"it-admin"}, four_eyes=True)
    engine = Engine(
        Domain(agents=[Agent("desk", tools=[wipe])], policies={"destructive": policy}),
        store=MemoryStore(),
        runtime=Runtime(model=model),
    )
    auth = JwtAuthenticator(jwks_url=jwks_url, issuer=ISSUER, audience=AUDIENCE)
    app = create_app(engine, authenticator=auth)
    ana = {"Authorization": f"Bearer {token(sub='ana', roles=['it-admin'])}"}
    di = {"Authorization": f"Bearer {token(sub='di', roles='sales')}"}
    bo = {"Authorization": f"Bearer {token(sub='bo')}"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as http,
    ):
        session = (await http.post("/sessions", headers=ana)).json()["id"]
        await http.post(f"/sessions/{session}/turns", json={"text": "wipe"}, headers=ana)
        await app.state.runs.join(session)
        [card] = (await http.get(f"/sessions/{session}", headers=ana)).json()["pending"]
        body = {"tool_call_id": card["tool_call_id"], "decision": {"decision": "approve"}}
        path = f"/sessions/{session}/resolve"
        own = await http.post(path, json=body, headers=ana)
        assert own.status_code == 403 and "needs four eyes" in own.json()["error"]["message"]
        assert (await http.post(path, json=body, headers=di)).status_code == 404
        approved = await http.post(path, json=body, headers=bo)
        assert approved.status_code == 200 and approved.json()["resumed"] is True
        await app.state.runs.join(session)
    assert wiped == ["L-7"]
