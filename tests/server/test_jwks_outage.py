"""A JWKS that is slow or down: known keys go on at once, unknown ones get 503, no flood."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from handrail import Agent, Engine, Runtime
from handrail.server import JwtAuthenticator, create_app
from handrail.store import MemoryStore
from handrail.testing import ScriptedModel

from .test_jwt import AUDIENCE, EC_KEY, ISSUER, JWKS, token


@dataclass
class Provider:
    """The identity provider's JWKS endpoint, which the test makes slow or takes down."""

    url: str = ""
    down: bool = False
    fetched: int = 0
    held: threading.Event = field(default_factory=threading.Event)
    """Set: every fetch waits until `release` (a provider that hangs)."""
    arrived: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.held.clear()
        self.go.set()


@pytest.fixture
def provider() -> Iterator[Provider]:
    state = Provider()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.fetched += 1
            state.arrived.set()
            if state.held.is_set():
                state.go.wait(10)
            body = json.dumps(JWKS).encode()
            self.send_response(503 if state.down else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/.well-known/jwks.json"
    try:
        yield state
    finally:
        state.release()
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
async def client_for(provider: Provider) -> AsyncIterator[Any]:
    clients: list[httpx.AsyncClient] = []

    async def make(**options: Any) -> httpx.AsyncClient:
        auth = JwtAuthenticator(
            jwks_url=provider.url, issuer=ISSUER, audience=AUDIENCE, timeout=5, **options
        )
        engine = Engine(
            Agent("desk"), store=MemoryStore(), runtime=Runtime(model=ScriptedModel([]))
        )
        app = create_app(engine, authenticator=auth)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test")
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


async def get(client: httpx.AsyncClient, bearer: str) -> httpx.Response:
    return await client.get("/sessions", headers={"Authorization": f"Bearer {bearer}"})


@pytest.mark.parametrize(
    "options",
    [{"cache_seconds": 0.1}, {"cache_seconds": 0.1, "cooldown": 0.0}],
    ids=["cache-expired", "no-cooldown"],
)
async def test_a_token_whose_key_is_cached_never_waits_for_a_fetch(
    provider: Provider, client_for: Any, options: dict[str, Any]
) -> None:
    client = await client_for(**options)
    assert (await get(client, token())).status_code == 200  # the keys are fetched
    provider.held.set()  # from now on the provider hangs
    provider.arrived.clear()
    await asyncio.sleep(0.15)  # the cached set expires
    unknown = asyncio.create_task(get(client, token(kid="rsa-9")))
    # Either the made-up kid sets off a fetch (which hangs), or it is cooling down (401).
    arrival = asyncio.create_task(asyncio.to_thread(provider.arrived.wait, 5))
    await asyncio.wait([unknown, arrival], return_when=asyncio.FIRST_COMPLETED)
    async with asyncio.timeout(5):  # a guard: it used to wait for the hanging fetch
        known = [await get(client, token()), await get(client, token(EC_KEY, "ec-1", "ES256"))]
    assert [r.status_code for r in known] == [200, 200]
    provider.release()
    assert (await unknown).status_code == 401  # the fetch brought no such kid
    provider.arrived.set()
    await arrival


async def test_with_the_jwks_down_an_unknown_kid_is_503_naming_it_and_sets_off_no_flood(
    provider: Provider, client_for: Any
) -> None:
    provider.down = True
    client = await client_for()
    answer = await get(client, token())  # nothing fetched yet: its key is unknown
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert error["type"] == "jwks_unavailable"
    assert f"the JWKS at {provider.url}" in error["message"]
    assert answer.headers["retry-after"] == "30"
    assert "WWW-Authenticate" not in answer.headers  # not a missing credential
    fetched = provider.fetched
    for kid in ("rsa-1", "rsa-9", "rsa-10"):  # within the cooldown: no fetch, the same answer
        assert (await get(client, token(kid=kid))).status_code == 503
    assert provider.fetched == fetched


async def test_after_a_failed_fetch_the_cooldown_passes_and_the_keys_come_back(
    provider: Provider, client_for: Any
) -> None:
    client = await client_for(cooldown=0.1, cache_seconds=0.1)
    assert (await get(client, token())).status_code == 200
    provider.down = True
    await asyncio.sleep(0.15)  # the set expires: the next token tries to fetch it, and fails
    assert (await get(client, token())).status_code == 200  # with the key in hand
    assert (await get(client, token(kid="rsa-9"))).status_code == 503
    provider.down = False
    await asyncio.sleep(0.15)  # the cooldown passes
    assert (await get(client, token(kid="rsa-9"))).status_code == 401  # fetched: no such key
    assert (await get(client, token(EC_KEY, "ec-1", "ES256"))).status_code == 200
