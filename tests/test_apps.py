"""The one app contract: every form `MODULE:NAME` may name opens the same way, in the loop."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from handrail import Agent, Engine
from handrail.apps import import_app, open_app
from handrail.exceptions import UserError

APP = textwrap.dedent(
    """
    import asyncio
    from contextlib import asynccontextmanager
    from handrail import Agent, Engine

    EVENTS = []

    def make():
        return Engine(Agent("a"))

    engine = make()

    async def built():
        await asyncio.sleep(0)
        EVENTS.append(("built", id(asyncio.get_running_loop())))
        return make()

    @asynccontextmanager
    async def owned():
        EVENTS.append(("open", id(asyncio.get_running_loop())))
        try:
            yield make()
        finally:
            EVENTS.append(("close", id(asyncio.get_running_loop())))

    async def undecorated():
        EVENTS.append(("open",))
        yield make()
        EVENTS.append(("close",))

    def nothing():
        return 42

    @asynccontextmanager
    async def yields_nothing():
        yield "not an engine"

    class Holder:
        engine = make()

    number = 7
    """
)


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"app_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


@pytest.mark.parametrize(
    "attribute", ["engine", "make", "built", "owned", "undecorated", "Holder.engine"]
)
async def test_every_form_opens_to_an_engine(app_module: str, attribute: str) -> None:
    async with open_app(f"{app_module}:{attribute}") as engine:
        assert isinstance(engine, Engine)


async def test_an_owned_app_opens_and_closes_in_the_running_loop(app_module: str) -> None:
    events = import_app(f"{app_module}:EVENTS")
    loop = id(asyncio.get_running_loop())
    async with open_app(f"{app_module}:owned"):
        assert events == [("open", loop)]
    assert events == [("open", loop), ("close", loop)]


async def test_the_close_runs_when_the_body_fails(app_module: str) -> None:
    events = import_app(f"{app_module}:EVENTS")
    with pytest.raises(RuntimeError, match="boom"):
        async with open_app(f"{app_module}:owned"):
            raise RuntimeError("boom")
    assert [e[0] for e in events] == ["open", "close"]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("nocolon", "is not MODULE:NAME"),
        ("no_such_module_xyz:app", "no such module"),
        ("{m}:missing", "has no attribute 'missing'"),
        ("{m}:number", "is a int; it must be an Engine"),
        ("{m}:nothing", "returned a int, not a handrail Engine"),
        ("{m}:yields_nothing", "yielded a str, not a handrail Engine"),
    ],
)
async def test_what_is_not_an_app_is_told_plainly(
    app_module: str, target: str, message: str
) -> None:
    with pytest.raises(UserError, match=message):
        async with open_app(target.format(m=app_module)):
            pass


async def test_an_object_is_opened_as_it_is() -> None:
    engine = Engine(Agent("a"))

    @asynccontextmanager
    async def app() -> AsyncIterator[Engine]:
        yield engine

    async with open_app(engine) as opened:
        assert opened is engine
    async with open_app(app) as opened:
        assert opened is engine
