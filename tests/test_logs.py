"""Failures you can trace: each logged once, with its traceback and the reference people see.

`handrail serve --log-format json` writes one JSON object a line; `handrail sessions show`
shows a failed turn's error and reference.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from handrail import Agent, Engine, Runtime
from handrail.cli import app
from handrail.models import ModelRequest
from handrail.store import SqliteStore
from handrail.testing import FunctionModel

SRC = Path(__file__).resolve().parents[1] / "src"

APP = '''
from typing import Any

from handrail import Agent, Engine, Runtime, tool
from handrail.models import ModelRequest
from handrail.testing import FunctionModel, call


@tool
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    return a / b


def answer(request: ModelRequest) -> Any:
    calls = [p for m in request.messages for p in m.tool_calls]
    if not calls:
        return call("divide", a=1, b=0)
    return f"It failed: {calls[0].result.error}"


engine = Engine(Agent("calc", tools=[divide]), runtime=Runtime(model=FunctionModel(answer)))
'''


def broken_model(request: ModelRequest) -> Any:
    raise RuntimeError("the model's gateway is down")


def test_a_failed_turn_is_logged_once_with_its_traceback_and_sessions_show_shows_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "handrail.db"

    async def fail() -> list[Any]:
        async with SqliteStore(db) as store:
            runtime = Runtime(model=FunctionModel(broken_model))
            engine = Engine(Agent("desk"), store=store, runtime=runtime)
            return [e async for e in engine.submit("s1", "hello", org_id="acme", user_id="ana")]

    with caplog.at_level(logging.DEBUG, logger="handrail"):
        events = asyncio.run(fail())
    failed = events[-1]
    assert (failed.type, failed.reason) == ("run-failed", "error")
    assert failed.error == "RuntimeError: the model's gateway is down"
    reference = failed.reference
    assert reference
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert (record.name, record.reference, record.session_id) == (  # type: ignore[attr-defined]
        "handrail.runs",
        reference,
        "s1",
    )
    assert record.getMessage() == (
        f"The turn failed (reference {reference}, session 's1'): "
        f"RuntimeError: the model's gateway is down"
    )
    assert "in broken_model\n    raise RuntimeError" in caplog.text  # the traceback

    shown = CliRunner().invoke(app, ["sessions", "show", "s1", "--db", str(db)])
    assert shown.exit_code == 0, shown.output
    assert f"the last turn failed: RuntimeError · reference {reference}" in shown.output
    document = json.loads(
        CliRunner().invoke(app, ["sessions", "show", "s1", "--db", str(db), "--json"]).output
    )
    assert document["status"] == "failed"
    assert document["failure"] | {"at": None} == {
        "error_type": "RuntimeError",
        "reference": reference,
        "at": None,
    }


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_serve_log_format_json_writes_a_tool_failure_as_one_object_a_line(tmp_path: Path) -> None:
    (tmp_path / "failing_app.py").write_text(APP)
    port = _port()
    command = [sys.executable, "-c", "from handrail.cli import app; app()", "serve"]
    command += ["failing_app:engine", "--port", str(port), "--log-format", "json"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), str(tmp_path)]),
        "HANDRAIL_API_KEYS": "acme:ana:k",
    }
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=out)
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": "Bearer k"}
        ) as client:
            for _ in range(300):
                assert server.poll() is None, log.read_text()
                try:
                    session = client.post("/sessions").json()["id"]
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            assert client.post(f"/sessions/{session}/turns", json={"text": "1/0"}).is_success
            for _ in range(300):
                view = client.get(f"/sessions/{session}").json()
                if view["status"] == "completed":
                    break
                time.sleep(0.05)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=15)
    answer = view["messages"][-1]["parts"][0]["text"]
    assert answer.startswith("It failed: ZeroDivisionError: float division by zero (reference ")
    reference = answer.removesuffix(")").rsplit(" ", 1)[1]

    lines = log.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert {"time", "level", "logger", "message"} <= set(records[0])
    assert any(r["logger"] == "uvicorn.access" for r in records)
    (failure,) = [r for r in records if r["level"] == "ERROR"]
    assert failure | {"time": None, "run_id": None, "traceback": None} == {
        "time": None,
        "level": "ERROR",
        "logger": "handrail.tools",
        "message": f"Tool 'divide' raised (reference {reference}, session {session!r}, "
        f"call call_1): ZeroDivisionError: float division by zero",
        "reference": reference,
        "session_id": session,
        "call_id": "call_1",
        "tool": "divide",
        "agent": "calc",
        "run_id": None,
        "error_type": "ZeroDivisionError",
        "traceback": None,
    }
    assert failure["traceback"].startswith("Traceback (most recent call last):\n")
    assert 'failing_app.py", line 12, in divide\n    return a / b' in failure["traceback"]
