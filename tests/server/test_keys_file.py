"""An API keys file is read again when it changes (and on SIGHUP); a bad one never opens up."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from handrail.demo.support_desk import build_scenario
from handrail.exceptions import ConfigError
from handrail.server import authenticator_from, create_app

ANA = "acme:ana:key-ana"
BOB = "id=bob-1,org=globex,user=bob,key=key-bob"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def write(path: Path, *lines: str) -> None:
    """Write the file whole and rename it over the old one, as the docs advise."""
    scratch = path.with_suffix(".new")
    scratch.write_text("".join(f"{line}\n" for line in lines))
    scratch.replace(path)


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    keys = tmp_path / "keys"
    write(keys, "# the team", ANA, "", BOB)
    app = create_app(build_scenario().engine, authenticator=authenticator_from([], keys))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
    ):
        yield client


async def status(client: httpx.AsyncClient, key: str) -> int:
    return (await client.get("/sessions", headers=bearer(key))).status_code


async def test_a_key_removed_from_the_file_is_refused_at_the_next_request(
    client: httpx.AsyncClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = tmp_path / "keys"
    assert [await status(client, "key-ana"), await status(client, "key-bob")] == [200, 200]
    write(keys, BOB)
    assert await status(client, "key-ana") == 401
    assert await status(client, "key-bob") == 200
    assert "reloaded the API keys file" in caplog.text and "(0 added, 1 removed)" in caplog.text
    with keys.open("a") as file:  # written in place, not renamed: read again all the same
        file.write("acme:cy:key-cy\n")
    assert await status(client, "key-cy") == 200


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda keys: write(keys, BOB, "acme:no-key"), id="malformed"),
        pytest.param(lambda keys: write(keys, BOB, "acme:cy:key-bob"), id="key-twice"),
        pytest.param(lambda keys: keys.unlink(), id="removed"),
        pytest.param(lambda keys: keys.write_bytes(b"acme:ana:\xff\n"), id="not-utf8"),
    ],
)
async def test_a_file_that_cannot_be_read_again_keeps_the_keys_in_use_and_says_so(
    client: httpx.AsyncClient,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    spoil: Callable[[Path], None],
) -> None:
    keys = tmp_path / "keys"
    spoil(keys)
    with caplog.at_level(logging.ERROR, logger="handrail.server"):
        assert [await status(client, "key-ana"), await status(client, "key-bob")] == [200, 200]
        assert await status(client, "key-cy") == 401  # nothing of the bad file was taken
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert f"the API keys file {keys} was NOT reloaded" in error.getMessage()
    assert "the 2 keys read before stay in use" in error.getMessage()
    assert "key-bob" not in caplog.text  # never the key itself
    write(keys, ANA, "acme:cy:key-cy")  # fixed: read again
    assert [await status(client, "key-bob"), await status(client, "key-cy")] == [401, 200]


def test_one_key_for_two_callers_refuses_to_start_naming_both_lines(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    write(keys, ANA, "# bob", BOB, "globex:eve:key-ana")
    with pytest.raises(ConfigError) as caught:
        authenticator_from([], keys)
    message = str(caught.value)
    assert message.startswith(f"{keys} line 1 and {keys} line 4 give the same API key")
    assert "acme/ana and to globex/eve" in message
    assert "key-ana" not in message
    write(keys.with_name("other"), BOB)
    with pytest.raises(ConfigError, match=r"HANDRAIL_API_KEYS item 1 and .*other line 1 give"):
        authenticator_from(["acme:bo:key-bob"], keys.with_name("other"))
    with pytest.raises(ConfigError, match="HANDRAIL_API_KEYS item 1 and HANDRAIL_API_KEYS item 2"):
        authenticator_from(["acme:ana:k", "acme:bob:k"])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_handrail_serve_refuses_a_key_given_twice(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    write(keys, ANA, "globex:eve:key-ana")
    handrail = str(Path(sys.executable).with_name("handrail"))
    ran = subprocess.run(
        [handrail, "serve", "handrail.demo.web:engine", "--api-keys-file", str(keys)],
        env={**os.environ, "HANDRAIL_DEMO_DB": str(tmp_path / "web.db")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 1
    assert f"error: {keys} line 1 and {keys} line 2 give the same API key" in ran.stderr


def test_sighup_reads_the_file_again_and_the_server_goes_on(tmp_path: Path) -> None:
    keys, log = tmp_path / "keys", tmp_path / "stderr.log"
    write(keys, ANA)
    port = _free_port()
    command = [str(Path(sys.executable).with_name("handrail")), "serve", "handrail.demo.web:engine"]
    command += ["--port", str(port), "--shutdown-grace", "0.5", "--api-keys-file", str(keys)]
    env = {**os.environ, "HANDRAIL_DEMO_DB": str(tmp_path / "web.db")}
    with log.open("w") as stderr:
        server = subprocess.Popen(command, env=env, stderr=stderr)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            for _ in range(400):
                try:
                    assert client.get("/sessions", headers=bearer("key-ana")).status_code == 200
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            else:
                raise AssertionError("the server did not start")
            server.send_signal(signal.SIGHUP)
            for _ in range(400):  # until the server has handled it (or died of it)
                if server.poll() is not None or "reloaded the API keys" in log.read_text():
                    break
                time.sleep(0.05)
            assert server.poll() is None, "SIGHUP ended the server"
            assert client.get("/sessions", headers=bearer("key-ana")).status_code == 200
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=15)
    stderr_text = log.read_text()
    assert "SIGHUP: reading the API keys files again" in stderr_text
    assert f"reloaded the API keys file {keys}: 1 keys (0 added, 0 removed)" in stderr_text
    assert "Traceback" not in stderr_text, stderr_text
