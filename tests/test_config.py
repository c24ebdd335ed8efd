"""One configuration: `handrail serve`, `handrail config` and `app_from_env` read the same
settings the same way (a flag, else its HANDRAIL_* variable, else the default), say where each
came from, mask the secrets, and name a malformed variable in one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from handrail.cli import app
from handrail.config import Settings
from handrail.exceptions import ConfigError

runner = CliRunner()
HANDRAIL = str(Path(sys.executable).with_name("handrail"))


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("HANDRAIL_"):
            monkeypatch.delenv(name)


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "cfgapp.py").write_text(
        "from handrail.demo.support_desk import build_scenario\nengine = build_scenario().engine\n"
    )
    monkeypatch.chdir(tmp_path)
    yield "cfgapp:engine"
    sys.modules.pop("cfgapp", None)


def run(*args: str) -> Any:
    return runner.invoke(app, list(args))


def test_a_flag_wins_over_the_variable_which_wins_over_the_default() -> None:
    env = {"HANDRAIL_SWEEP_INTERVAL": "2.5", "HANDRAIL_RATE": "7", "HANDRAIL_AUDIT_ROLES": "*"}
    settings = Settings.resolve({"sweep_interval": 0.5, "burst": None}, environ=env)
    assert (settings.sweep_interval, settings.source("sweep_interval")) == (
        0.5,
        "--sweep-interval",
    )
    assert (settings.rate, settings.source("rate")) == (7.0, "HANDRAIL_RATE")
    assert (settings.burst, settings.source("burst")) == (100, "default")
    assert (settings.audit_roles, settings.source("audit_roles")) == (None, "HANDRAIL_AUDIT_ROLES")


def test_config_prints_each_value_with_its_source_and_the_secrets_masked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, app_module: str
) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("acme:cy:file-secret\n")
    monkeypatch.setenv("HANDRAIL_API_KEYS", "acme:ana:env-secret id=ops,org=acme,user=bo,key=s2")
    monkeypatch.setenv("HANDRAIL_API_KEYS_FILE", str(keys))
    monkeypatch.setenv("HANDRAIL_DSN", "postgresql://app:pg-secret@127.0.0.1:5432/test")
    monkeypatch.setenv("HANDRAIL_AUDIT_KEY", "2026-11:" + "a" * 43)
    monkeypatch.setenv("HANDRAIL_RATE", "9")
    result = run("config", app_module, "--json", "--sweep-interval", "0.25")
    assert result.exit_code == 0, result.output
    for secret in ("env-secret", "s2", "pg-secret", "a" * 43):
        assert secret not in result.output
    shown = {name: (v["value"], v["source"]) for name, v in json.loads(result.output).items()}
    assert shown["sweep_interval"] == ("0.25", "--sweep-interval")
    assert shown["rate"] == ("9", "HANDRAIL_RATE")
    assert shown["burst"] == ("100", "default")
    assert shown["api_keys"] == (
        "acme:ana:***, id=ops,org=acme,user=bo,key=***",
        "HANDRAIL_API_KEYS",
    )
    assert shown["api_keys_file"] == (str(keys), "HANDRAIL_API_KEYS_FILE")
    assert shown["dsn"] == ("postgresql://app:***@127.0.0.1:5432/test", "HANDRAIL_DSN")
    assert shown["audit_key"] == ("2026-11:***", "HANDRAIL_AUDIT_KEY")
    assert shown["keys in use"][0] == "3"
    assert shown["app store"] == ("PostgresStore (from dsn)", "HANDRAIL_DSN")

    monkeypatch.delenv("HANDRAIL_API_KEYS")
    monkeypatch.delenv("HANDRAIL_API_KEYS_FILE")
    table = run("config")
    assert table.exit_code == 0, table.output
    assert "sweep_interval" in table.output and "default" in table.output
    assert "one-off key" in table.output


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("HANDRAIL_SWEEP_INTERVAL", "soon"),
        ("HANDRAIL_BURST", "0"),
        ("HANDRAIL_RATE", "-1"),
        ("HANDRAIL_LOG_FORMAT", "xml"),
        ("HANDRAIL_AUDIT_ROLES", ","),
    ],
)
def test_a_malformed_variable_is_one_error_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, app_module: str, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    monkeypatch.setattr("handrail.server.serve", lambda app, **options: None)
    for command in (["config"], ["serve", app_module]):
        result = run(*command)
        assert result.exit_code == 1
        lines = result.output.strip().splitlines()
        assert len(lines) == 1, result.output
        assert lines[0].startswith(f"error: {variable}={value!r} is not valid: it takes ")
    monkeypatch.setenv("HANDRAIL_ENGINE", app_module)
    monkeypatch.setenv("HANDRAIL_API_KEYS", "acme:ana:k")
    from handrail.server import app_from_env

    with pytest.raises(ConfigError, match=f"^{variable}="):
        app_from_env()


def test_a_malformed_key_is_named_and_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANDRAIL_API_KEYS", "acme-without-user-secret")
    result = run("config")
    assert result.exit_code == 1
    assert result.output.startswith("error: HANDRAIL_API_KEYS item 1")
    assert len(result.output.strip().splitlines()) == 1


def test_serve_and_app_from_env_build_the_same_app_from_the_same_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, app_module: str
) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("acme:ana:from-the-file\n")
    monkeypatch.setenv("HANDRAIL_API_KEYS_FILE", str(keys))
    monkeypatch.setenv("HANDRAIL_RATE", "3")
    monkeypatch.setenv("HANDRAIL_TURNS", "0")
    monkeypatch.setenv("HANDRAIL_WORKER_ID", "desk-7")
    monkeypatch.setenv("HANDRAIL_AUDIT_ROLES", "compliance,auditor")
    served: dict[str, Any] = {}
    monkeypatch.setattr(
        "handrail.server.serve", lambda app, **options: served.update(app=app, **options)
    )
    result = run("serve", app_module, "--burst", "4")
    assert result.exit_code == 0, result.output
    assert "WARNING" not in result.output and "one-off" not in result.output
    from starlette.testclient import TestClient

    with TestClient(served["app"]):  # the app is opened when the server starts
        assert served["app"].state.runs.engine.worker_id == "desk-7"
    monkeypatch.setenv("HANDRAIL_ENGINE", app_module)
    monkeypatch.setenv("HANDRAIL_BURST", "4")
    from handrail.server import app_from_env

    factory_app = app_from_env()
    for served_app in (served["app"], factory_app):
        limits = served_app.state.limits
        assert (limits.rate, limits.burst, limits.turns) == (3.0, 4, None)
    with TestClient(factory_app):
        assert factory_app.state.runs.engine.worker_id == f"desk-7-{os.getpid()}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _serve(env: dict[str, str], port: int) -> subprocess.Popen[str]:
    command = [HANDRAIL, "serve", "handrail.demo.web:engine", "--port", str(port)]
    command += ["--shutdown-grace", "0.5"]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _stop(server: subprocess.Popen[str]) -> str:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=15)
    finally:
        server.kill()
        server.wait()
    assert server.stdout is not None
    with server.stdout:
        return server.stdout.read()


def _get(port: int, key: str) -> int:
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        for _ in range(300):
            try:
                return client.get(
                    "/sessions", headers={"Authorization": f"Bearer {key}"}
                ).status_code
            except httpx.TransportError:
                time.sleep(0.05)
    raise AssertionError("the server did not start")


def test_serve_takes_its_keys_from_the_keys_file_variable(tmp_path: Path) -> None:
    """A real `handrail serve`: HANDRAIL_API_KEYS_FILE's key is accepted, none is made up."""
    keys = tmp_path / "keys.txt"
    keys.write_text("acme:ana:the-file-key\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDRAIL_")}
    env |= {"HANDRAIL_DEMO_DB": str(tmp_path / "web.db"), "HANDRAIL_API_KEYS_FILE": str(keys)}
    port = _free_port()
    server = _serve(env, port)
    try:
        assert _get(port, "the-file-key") == 200
        assert _get(port, "another-key") == 401
    finally:
        log = _stop(server)
    assert "one-off key" not in log and "Bearer" not in log


def test_serve_without_any_key_source_says_so_loudly_with_the_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDRAIL_")}
    env["HANDRAIL_DEMO_DB"] = str(tmp_path / "web.db")
    port = _free_port()
    server = _serve(env, port)
    try:
        assert _get(port, "a-guess") == 401  # the server is up: its warning is written
    finally:
        log = _stop(server)
    warning = log[log.index("WARNING: no API key is configured") :]
    key = warning.split("Authorization: Bearer ", 1)[1].split()[0]
    assert "HANDRAIL_API_KEYS" in warning and "HANDRAIL_API_KEYS_FILE" in warning
    assert "--api-keys-file" in warning and "handrail config" in warning
    assert len(key) >= 32
