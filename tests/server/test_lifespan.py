"""`create_app(lifespan=...)`: the application is opened when the server starts, in its loop.

For those who mount the server themselves: what `handrail serve` opens (`handrail.apps`) is
opened by the app's lifespan, closed at shutdown after the turns stopped; an app mounted in
another, whose lifespan nobody entered, answers 503 saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from handrail import Agent, Engine, Runtime, UserError
from handrail.server import create_app, load_engine
from handrail.store import MemoryStore
from handrail.testing import FunctionModel

from .conftest import ANA, authenticator


def _engine() -> Engine:
    return Engine(Agent("a"), store=MemoryStore(), runtime=Runtime(model=FunctionModel(_hi)))


def _hi(request: object) -> str:
    return "hi"


def test_the_app_is_opened_in_the_servers_loop_and_closed_at_shutdown() -> None:
    seen: list[str] = []

    @contextlib.asynccontextmanager
    async def ops() -> AsyncIterator[Engine]:
        loop = asyncio.get_running_loop()
        seen.append("opened")
        yield _engine()
        assert asyncio.get_running_loop() is loop
        seen.append("closed")

    api = create_app(lifespan=ops, authenticator=authenticator())
    with TestClient(api) as client:
        assert seen == ["opened"]
        created = client.post("/sessions", headers=ANA)
        assert created.status_code == 201
        turn = client.post(f"/sessions/{created.json()['id']}/turns", json={"text": "hello"},
                           headers={**ANA, "Accept": "text/event-stream"})  # fmt: skip
        assert '"type":"run-completed"' in turn.text
    assert seen == ["opened", "closed"]


async def _made() -> Engine:  # a coroutine function: awaited in the server's loop
    await asyncio.sleep(0)
    return _engine()


def test_mounted_without_its_lifespan_the_api_answers_503_saying_why() -> None:
    api = create_app(lifespan=_made, authenticator=authenticator())
    outer = Starlette(routes=[Mount("/agent", app=api)])  # its lifespan is nobody's
    with TestClient(outer) as client:
        refused = client.get("/agent/sessions", headers=ANA)
    assert refused.status_code == 503
    assert refused.json()["error"]["type"] == "not_open"
    assert "enter its lifespan from yours" in refused.json()["error"]["message"]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with api.router.lifespan_context(api):
            yield

    outer = Starlette(routes=[Mount("/agent", app=api)], lifespan=lifespan)
    with TestClient(outer) as client:
        assert client.get("/agent/sessions", headers=ANA).status_code == 200


def test_an_app_that_fails_to_open_stops_the_start() -> None:
    def broken() -> Engine:
        raise RuntimeError("no DSN")

    api = create_app(lifespan=broken, authenticator=authenticator())
    with (
        pytest.raises(UserError, match=r"could not be opened: RuntimeError: no DSN \("),
        TestClient(api),
    ):
        pass
    assert isinstance(api.state.open_error, UserError)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({}, "create_app needs an engine, or lifespan="),
        ({"engine": _engine(), "lifespan": _made}, "and not both"),
        ({"engine": _made}, "create_app's engine is a function, not an Engine: give "),
    ],
)
def test_create_app_takes_an_engine_or_a_lifespan(given: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        create_app(**given, authenticator=authenticator())  # type: ignore[arg-type]


def test_load_engine_is_deprecated_and_refuses_what_needs_a_loop(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys
    from pathlib import Path

    folder = Path(str(tmp_path))
    (folder / "oldapp.py").write_text(
        "from handrail import Agent, Engine\n"
        "engine = Engine(Agent('a'))\n"
        "async def make():\n    return engine\n"
    )
    monkeypatch.chdir(folder)
    try:
        with pytest.warns(DeprecationWarning, match=r"use `async with handrail\.apps\.open_app"):
            assert isinstance(load_engine("oldapp:engine"), Engine)
        with (
            pytest.warns(DeprecationWarning),
            pytest.raises(UserError, match=r"is async: open it with handrail\.apps\.open_app"),
        ):
            load_engine("oldapp:make")
    finally:
        sys.modules.pop("oldapp", None)
