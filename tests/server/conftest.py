"""An app on the scripted support desk, two tenants' keys, and clients that can stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from handrail import Agent, Domain, Engine, Runtime, by_role, tool
from handrail.demo.support_desk import CUSTOMER_MESSAGE, Scenario, build_scenario
from handrail.models import ModelRequest
from handrail.server import ApiKeyAuthenticator, Caller, create_app
from handrail.testing import FunctionModel, ScriptedModel, call, sequential_ids

ANA = {"Authorization": "Bearer key-ana"}  # acme / ana
BOB = {"Authorization": "Bearer key-bob"}  # globex / bob


def http_scope(
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    *,
    raw_path: bytes | None = None,
    query_string: bytes = b"",
) -> dict[str, Any]:
    """The ASGI scope of an HTTP request, as a server hands it to the app."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "headers": headers,
        "scheme": "http",
        "path": path,
        "raw_path": raw_path if raw_path is not None else path.encode(),
        "query_string": query_string,
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 50000),
        "root_path": "",
    }


def http_receive(body: bytes, gone: asyncio.Event) -> Callable[[], Awaitable[dict[str, Any]]]:
    """An ASGI `receive`: the request with `body`, then `http.disconnect` once `gone` is set."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    return receive


class StreamingTransport(httpx.AsyncBaseTransport):
    """Like `httpx.ASGITransport`, but it streams the response as the app sends it.

    `ASGITransport` returns a response only once the app has finished it, which an endless
    event stream never does; this one hands the body over chunk by chunk, and closing the
    response tells the app that the client went away (`http.disconnect`).
    """

    def __init__(self, app: Starlette) -> None:
        self.app = app

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = b"".join([chunk async for chunk in request.stream])  # type: ignore[union-attr]
        scope = http_scope(
            request.method,
            request.url.path,
            [(k.lower(), v) for k, v in request.headers.raw],
            raw_path=request.url.raw_path.split(b"?")[0],
            query_string=request.url.query,
        )
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        started: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        gone = asyncio.Event()
        receive = http_receive(body, gone)

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                started.set_result(message)
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    chunks.put_nowait(message["body"])
                if not message.get("more_body"):
                    chunks.put_nowait(None)

        task = asyncio.create_task(self.app(scope, receive, send))
        await asyncio.wait([started, task], return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            task.result()  # raises what the app raised
            raise AssertionError("the app ended without a response")
        start = started.result()
        return httpx.Response(
            start["status"], headers=start.get("headers", []), stream=_Body(chunks, task, gone)
        )


class _Body(httpx.AsyncByteStream):
    def __init__(
        self, chunks: asyncio.Queue[bytes | None], task: asyncio.Task[None], gone: asyncio.Event
    ) -> None:
        self.chunks, self.task, self.gone = chunks, task, gone

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            get = asyncio.ensure_future(self.chunks.get())
            await asyncio.wait([get, self.task], return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                self.task.result()
                return
            chunk = get.result()
            if chunk is None:
                return
            yield chunk

    async def aclose(self) -> None:
        self.gone.set()
        async with asyncio.timeout(5):
            await self.task


@dataclass
class Frame:
    """One Server-Sent Event."""

    id: int
    data: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.data["type"])


async def frames(response: httpx.Response) -> AsyncIterator[Frame]:
    """The events of an SSE response (keep-alive comments skipped)."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if not line:
            if "data" in fields:
                yield Frame(id=int(fields["id"]), data=json.loads(fields["data"]))
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


@dataclass
class Server:
    """The app under test, its scenario, and clients."""

    app: Starlette
    scenario: Scenario
    client: httpx.AsyncClient
    """Through `httpx.ASGITransport`: for requests whose response ends."""
    streaming: httpx.AsyncClient
    """Through `StreamingTransport`: for streams followed live, and disconnections."""

    async def new_session(self, headers: dict[str, str] = ANA) -> str:
        response = await self.client.post("/sessions", headers=headers)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    async def submit(self, session_id: str, text: str = CUSTOMER_MESSAGE) -> int:
        response = await self.client.post(
            f"/sessions/{session_id}/turns", json={"text": text}, headers=ANA
        )
        assert response.status_code == 202, response.text
        return int(response.json()["after"])

    async def events(self, session_id: str, after: int = 0, **params: Any) -> list[Frame]:
        """The stream from `after` to its end, read whole."""
        async with self.streaming.stream(
            "GET", f"/sessions/{session_id}/events", params={"after": after, **params}, headers=ANA
        ) as response:
            assert response.status_code == 200, await response.aread()
            return [frame async for frame in frames(response)]

    async def pending(self, session_id: str) -> list[dict[str, Any]]:
        response = await self.client.get(f"/sessions/{session_id}", headers=ANA)
        assert response.status_code == 200, response.text
        return list(response.json()["pending"])

    async def join(self, session_id: str) -> None:
        await self.app.state.runs.join(session_id)


def authenticator() -> ApiKeyAuthenticator:
    return ApiKeyAuthenticator(
        {"key-ana": Caller("acme", "ana"), "key-bob": Caller("globex", "bob")}
    )


@dataclass
class RolesApp:
    """An app whose turns' tools follow the caller's roles, for a protocol's client to drive.

    `key-ana` (acme/ana, role `sre`) gets `hosts.status` and `hosts.restart`; `key-bo`
    (acme/bo, role `support`) gets only `hosts.status`. The model answers "ok" to everything.
    """

    app: Starlette
    seen: list[list[str]]
    """The names of the tools of each model request, in order."""


def roles_app() -> RolesApp:
    """A fresh `RolesApp` (its `seen` empty)."""

    @tool(name="hosts.status")
    def status(host: str) -> str:
        """Read a host's status."""
        return "up"

    @tool(name="hosts.restart", permission="write")
    def restart(host: str) -> str:
        """Restart a host."""
        return "restarted"

    seen: list[list[str]] = []

    def answer(request: ModelRequest) -> str:
        seen.append([t.name for t in request.tools])
        return "ok"

    engine = Engine(
        Domain(
            agents=[Agent("ops", tools=[status, restart])],
            tools_for=by_role({"sre": ["hosts.status", "hosts.restart"]}, default=["hosts.status"]),
        ),
        runtime=Runtime(model=FunctionModel(answer), ids=sequential_ids()),
    )
    keys = ApiKeyAuthenticator(
        {
            "key-ana": Caller("acme", "ana", frozenset({"sre"})),
            "key-bo": Caller("acme", "bo", frozenset({"support"})),
        }
    )
    return RolesApp(app=create_app(engine, authenticator=keys, static_dir=None), seen=seen)


@dataclass
class ReuseApp:
    """An app whose one turn reads an order twice, then writes a note on it, for a protocol's
    client to drive: the second read reuses the first's result (`reused_from` = `call_1`),
    and the write after it runs. The model answers "Noted."; any caller of `authenticator()`.
    """

    app: Starlette
    notes: list[str]
    """The orders noted: the write ran once for each."""


def reuse_app() -> ReuseApp:
    """A fresh `ReuseApp` (its `notes` empty)."""
    notes: list[str] = []

    @tool(name="orders.get")
    def get_order(order_id: str) -> str:
        """Look an order up."""
        return f"{order_id}: pending"

    @tool(name="orders.note", permission="write", approval="auto")
    def note(order_id: str) -> str:
        """Note an order."""
        notes.append(order_id)
        return "noted"

    model = ScriptedModel(
        [
            [call("orders.get", order_id="A1")],
            [call("orders.get", order_id="A1")],
            [call("orders.note", order_id="A1")],
            "Noted.",
        ]
    )
    engine = Engine(
        Agent("clerk", tools=[get_order, note]), runtime=Runtime(model=model, ids=sequential_ids())
    )
    return ReuseApp(
        app=create_app(engine, authenticator=authenticator(), static_dir=None), notes=notes
    )


@pytest.fixture
def latency() -> float:
    """Seconds each support-desk tool takes (override to watch a run mid-way)."""
    return 0.0


@pytest.fixture
def app_options() -> dict[str, Any]:
    return {}


@pytest.fixture
async def server(latency: float, app_options: dict[str, Any]) -> AsyncIterator[Server]:
    scenario = build_scenario(latency=latency)
    options = {"poll_interval": 0.2, **app_options}
    app = create_app(scenario.engine, authenticator=authenticator(), **options)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
        httpx.AsyncClient(transport=StreamingTransport(app), base_url="http://test") as streaming,
    ):
        yield Server(app=app, scenario=scenario, client=client, streaming=streaming)
