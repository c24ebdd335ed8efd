"""`handrail.demo.web`: the support desk that `make web` serves, on SQLite."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from handrail import Approve, Engine
from handrail.cli import app
from handrail.demo import web
from handrail.demo.support_desk import CUSTOMER_MESSAGE
from handrail.store import SqliteStore


@pytest.fixture
def demo_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "web.db"
    monkeypatch.setenv(web.DB_ENV, str(path))
    monkeypatch.setattr(web, "_engine", None)
    return path


def test_serve_prints_the_page_url_with_the_key_it_made(
    demo_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: dict[str, Any] = {}
    monkeypatch.setattr(
        "handrail.server.serve", lambda application, **options: served.update(options)
    )
    result = CliRunner().invoke(app, ["serve", "handrail.demo.web:engine", "--port", "8123"])
    assert result.exit_code == 0, result.output
    bearer = re.search(r"Authorization: Bearer (\S+)", result.output)
    url = re.search(r"Open the web page: (http://127\.0\.0\.1:8123/#key=(\S+))", result.output)
    assert bearer is not None and url is not None
    assert url.group(2) == bearer.group(1)
    assert served == {
        "host": "127.0.0.1",
        "port": 8123,
        "log_level": "info",
        "log_format": "text",
        "shutdown_grace": 5.0,
        "header_timeout": 10.0,
        "body_timeout": 30.0,
        "idle_timeout": 5.0,
        "max_connections": 1000,
        "max_client_connections": 250,
    }


def test_the_engine_keeps_its_sessions_in_the_sqlite_file(demo_db: Path) -> None:
    engine = web.engine
    assert isinstance(engine, Engine) and web.engine is engine
    assert isinstance(engine.store, SqliteStore)
    assert engine.store.path == str(demo_db)


async def test_a_refund_waits_across_a_restart_and_is_made_with_the_amended_amount(
    tmp_path: Path,
) -> None:
    path = tmp_path / "desk.db"
    first = web.build_engine(store=SqliteStore(path))
    events = [e.type async for e in first.submit("s1", CUSTOMER_MESSAGE)]
    assert events[-1] == "run-suspended"

    again = web.build_engine(store=SqliteStore(path), pace=0.001)  # a restarted server
    (call_id,) = (await again.session("s1")).pending
    await again.resolve("s1", call_id, Approve(amended_args={"amount": 40}))
    run = again.resume("s1")
    events = [e.type async for e in run]
    assert events[-1] == "run-completed"
    assert "€40.00 has been approved" in run.result.output


def test_an_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        _ = web.nope  # type: ignore[attr-defined]
