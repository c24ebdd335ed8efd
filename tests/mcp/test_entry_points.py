"""An application whose tools come from an MCP server over stdio, on every entry point.

The application (`opsapp:app`, written next to each test) is an `@asynccontextmanager` that
connects an `MCPToolset` and yields an `Engine`; its model (a `FunctionModel`) calls the
server's `echo` and answers with what it returned. Each test runs the `handrail` command as
a user does, as a real process: `handrail serve` (one process and `--workers 2`), `uvicorn
--factory handrail.server:app_from_env`, `handrail eval` and `handrail chat`, with a turn that
calls the MCP tool and gets its result; then SIGTERM or SIGINT (or the command's end) closes
the MCP session, and the server's child process is gone. The MCP servers are the pinned reference
server (server-everything, Node) and a Python one (tests/mcp/_stdio_server.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

pytest.importorskip(
    "mcp", reason='the MCP entry-point tests need the extra: pip install "handrail[mcp]"'
)

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
EVERYTHING = ROOT / "js" / "node_modules" / ".bin" / "mcp-server-everything"
STDIO_SERVER = Path(__file__).with_name("_stdio_server.py")
KEY = "ops-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
WAIT = 60.0
"""Seconds a step may take at most (a guard, never a measure)."""
STOPPED = (0, -signal.SIGTERM)
"""A server's exit status after SIGTERM: uvicorn ends by raising the signal it caught again."""

APP = '''
"""An operations assistant whose tools come from an MCP server over stdio."""

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from handrail import Agent, Engine, Runtime
from handrail.mcp import MCPToolset
from handrail.store import SqliteStore
from handrail.testing import FunctionModel, call

HERE = Path(__file__).parent


def reply(request):
    """Call fs.echo with the user's words, then say what it returned."""
    last = request.messages[-1]
    done = [p for p in last.tool_calls if p.result is not None]
    if done:  # (a Python server's text comes as structured content: {"result": ...})
        data = done[0].result.data
        return f"The server said: {data['result'] if isinstance(data, dict) else data}"
    return call("fs.echo", message=last.text)


def toolset() -> MCPToolset:
    if os.environ["OPS_MCP"] == "node":
        command, args = os.environ["OPS_EVERYTHING"], ["stdio"]
    else:
        command, args = sys.executable, [os.environ["OPS_SERVER"], str(HERE / "pids")]
    # include= names the server's own tools (no prefix): fs.echo is the server's echo.
    return MCPToolset(command=command, args=args, prefix="fs", include=["echo"])


@asynccontextmanager
async def app() -> AsyncIterator[Engine]:
    async with toolset() as fs:
        store = SqliteStore(HERE / "ops.db")
        model = FunctionModel(reply)
        try:
            yield Engine(Agent("ops", tools=await fs.tools()), store=store,
                         runtime=Runtime(model=model))
        finally:
            await store.close()
    with open(HERE / "closed", "a") as closed:  # after the MCP session closed
        closed.write(f"{os.getpid()}\\n")


def broken():
    raise RuntimeError("OPS_LOG_DIR is not set")
'''

SUITE = """
app: opsapp:app
scenarios:
  - name: echoes-through-mcp
    turns: ["disk full on web-1"]
    mode: capture  # (only gated calls are captured: fs.echo, read-only, runs on the server)
    expect:
      called: [{tool: fs.echo, args: {message: disk full on web-1}}]
      text_contains: "The server said: Echo: disk full on web-1"
"""


# -- helpers ---------------------------------------------------------------------------------


def _node_missing() -> str | None:
    if shutil.which("node") is None:
        return "MCP NODE TESTS SKIPPED: node is not installed (needs Node.js and npm)"
    if not EVERYTHING.exists():
        return (
            f"MCP NODE TESTS SKIPPED: {EVERYTHING.relative_to(ROOT)} is missing; run "
            f"`npm ci --prefix js` (make test does when npm exists)"
        )
    return None


@pytest.fixture(params=["node", "python"])
def mcp_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    if kind == "node" and (missing := _node_missing()):
        pytest.skip(missing)
    return kind


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "opsapp.py").write_text(APP, encoding="utf-8")
    (tmp_path / "suite.yaml").write_text(SUITE, encoding="utf-8")
    return tmp_path


def _env(kind: str, **more: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        "OPS_MCP": kind,
        "OPS_EVERYTHING": str(EVERYTHING),
        "OPS_SERVER": str(STDIO_SERVER),
        "HANDRAIL_API_KEYS": f"acme:ana:{KEY}",
        **more,
    }


def _handrail(*args: str) -> list[str]:
    return [sys.executable, "-c", "from handrail.cli import app; app()", *args]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + WAIT
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


Start = Callable[[list[str], dict[str, str], int], Server]


@pytest.fixture
def start(folder: Path) -> Iterator[Start]:
    started: list[Server] = []

    def run(command: list[str], env: dict[str, str], port: int) -> Server:
        log = folder / f"server-{len(started)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        server = Server(process, f"http://127.0.0.1:{port}", log)
        started.append(server)
        deadline = time.monotonic() + WAIT
        with httpx.Client(base_url=server.url, headers=AUTH) as client:
            while True:
                assert process.poll() is None, server.output()
                try:
                    if client.get("/sessions").status_code == 200:
                        return server
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, server.output()
                time.sleep(0.1)

    yield run
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


def _turn(url: str, text: str) -> list[dict[str, object]]:
    """One turn over HTTP (its events streamed in the answer), as a client sends it."""
    with httpx.Client(base_url=url, headers=AUTH, timeout=WAIT) as client:
        session = client.post("/sessions")
        assert session.status_code == 201, session.text
        sid = session.json()["id"]
        headers = {"Accept": "text/event-stream"}
        with client.stream(
            "POST", f"/sessions/{sid}/turns", json={"text": text}, headers=headers
        ) as answer:
            assert answer.status_code == 200
            lines = [line for line in answer.iter_lines() if line.startswith("data:")]
    return [json.loads(line[5:]) for line in lines]


def _echoed(events: list[dict[str, object]], text: str) -> None:
    """The turn called the MCP tool, got its result, and the answer says it."""
    (done,) = [e for e in events if e["type"] == "tool-call-completed"]
    assert (done["name"], done["ok"]) == ("fs.echo", True)
    said = "".join(str(e["delta"]) for e in events if e["type"] == "text-delta")
    assert said == f"The server said: Echo: {text}"
    assert events[-1]["type"] == "run-completed"


# -- handrail serve --------------------------------------------------------------------------


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_served_app_calls_its_mcp_tool_over_http_and_a_signal_closes_the_session(
    mcp_kind: str, folder: Path, start: Start, stop: signal.Signals
) -> None:
    port = _free_port()
    command = _handrail("serve", "opsapp:app", "--port", str(port), "--shutdown-grace", "1")
    server = start(command, _env(mcp_kind), port)
    children = _children(server.process.pid)
    assert len(children) == 1, children  # the MCP server, opened before the first request

    _echoed(_turn(server.url, "disk full on web-1"), "disk full on web-1")

    server.process.send_signal(stop)
    assert server.process.wait(timeout=WAIT) in (0, -stop, 128 + stop), server.output()
    assert _gone(children), f"the MCP server {children} outlived the server"
    assert (folder / "closed").read_text().split() == [str(server.process.pid)]
    assert "Traceback" not in server.output()


def test_each_worker_process_opens_its_own_app(folder: Path, start: Start) -> None:
    port = _free_port()
    command = _handrail("serve", "opsapp:app", "--port", str(port), "--workers", "2")
    command += ["--shutdown-grace", "1"]
    server = start(command, _env("python"), port)
    deadline = time.monotonic() + WAIT
    while len((folder / "pids").read_text().split()) < 2:  # the second may still be opening
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.05)
    mcp_servers = [int(pid) for pid in (folder / "pids").read_text().split()]
    assert len(set(mcp_servers)) == 2  # one MCP session a process
    for n in range(4):  # whichever process takes it, its own session answers
        _echoed(_turn(server.url, f"check {n}"), f"check {n}")

    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=WAIT) in STOPPED, server.output()
    assert _gone(mcp_servers), server.output()
    assert len((folder / "closed").read_text().split()) == 2


def test_app_from_env_under_uvicorn_factory_opens_the_app_in_its_loop(
    folder: Path, start: Start
) -> None:
    port = _free_port()
    command = [sys.executable, "-m", "uvicorn", "--factory", "handrail.server:app_from_env"]
    command += ["--port", str(port)]
    env = _env("python", HANDRAIL_ENGINE="opsapp:app")
    server = start(command, env, port)
    (mcp_server,) = [int(pid) for pid in (folder / "pids").read_text().split()]

    _echoed(_turn(server.url, "restart nginx"), "restart nginx")

    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=WAIT)
    assert _gone([mcp_server]), server.output()
    assert (folder / "closed").exists()


def test_a_factory_that_fails_stops_serve_with_its_error(folder: Path) -> None:
    port = str(_free_port())
    done = subprocess.run(
        _handrail("serve", "opsapp:broken", "--port", port),
        cwd=folder,
        env=_env("python"),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: opsapp:broken could not be opened: RuntimeError: OPS_LOG_DIR is not set ("
    )
    assert "opsapp.py, line" in last
    # The log says it with the traceback of what raised, one frame a line (not escaped).
    assert "handrail.server: The application could not be opened: opsapp:broken" in done.stderr
    assert 'raise RuntimeError("OPS_LOG_DIR is not set")\n' in done.stderr
    assert "\\x0a" not in done.stderr


# -- handrail eval, handrail chat ------------------------------------------------------------


def test_eval_opens_the_suites_app_once_and_closes_it_after_the_last_scenario(
    mcp_kind: str, folder: Path
) -> None:
    report = folder / "report.json"
    done = subprocess.run(
        _handrail("eval", "suite.yaml", "--json", str(report)),
        cwd=folder,
        env=_env(mcp_kind),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 0 failed" in done.stdout
    assert json.loads(report.read_text())["scenarios"][0]["passed"] is True
    assert len((folder / "closed").read_text().split()) == 1  # opened once, closed once
    if mcp_kind == "python":
        (mcp_server,) = [int(p) for p in (folder / "pids").read_text().split()]
        assert _gone([mcp_server])


def test_chat_opens_the_app_and_closes_it_when_done(mcp_kind: str, folder: Path) -> None:
    done = subprocess.run(
        _handrail("chat", "opsapp:app", "-m", "rotate the logs", "--json"),
        cwd=folder,
        env=_env(mcp_kind),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    _echoed(events, "rotate the logs")
    assert (folder / "closed").exists()
    if mcp_kind == "python":
        assert _gone([int(p) for p in (folder / "pids").read_text().split()])


@pytest.mark.parametrize(
    ("app", "told"),
    [
        (
            "def app():\n    raise RuntimeError('OPS_LOG_DIR is not set')\n",
            "error: suite: app: brokenapp:app could not be opened: RuntimeError: OPS_LOG_DIR "
            "is not set ({folder}/brokenapp.py, line 2)",
        ),
        (
            "import asyncio\n\nasync def make():\n    pass\n\ndef app():\n"
            "    return asyncio.run(make())\n",
            "error: suite: app: brokenapp:app could not be opened: RuntimeError: asyncio.run() "
            "cannot be called from a running event loop ({folder}/brokenapp.py, line 7). An "
            "application is opened inside the entry point's event loop: make its factory "
            "`async def` (or an @asynccontextmanager) and await what it needs, instead of "
            "asyncio.run",
        ),
        (
            "import os\n\nimport no_such_dependency\n",
            "error: suite.yaml: app: Importing 'brokenapp' failed: ModuleNotFoundError: No "
            "module named 'no_such_dependency' ({folder}/brokenapp.py, line 3)",
        ),
        (
            "def app(:\n",
            "error: suite.yaml: app: Importing 'brokenapp' failed: SyntaxError: invalid syntax "
            "({folder}/brokenapp.py, line 1)",
        ),
    ],
)
def test_a_broken_app_under_eval_is_one_error_line_saying_where(
    folder: Path, app: str, told: str
) -> None:
    (folder / "brokenapp.py").write_text(app, encoding="utf-8")
    (folder / "suite.yaml").write_text(
        "name: suite\n" + SUITE.replace("opsapp:app", "brokenapp:app"), encoding="utf-8"
    )
    done = subprocess.run(
        _handrail("eval", "suite.yaml"),
        cwd=folder,
        env=_env("python"),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert (done.returncode, done.stdout) == (1, "")
    # (Python's own warning about the coroutine asyncio.run refused comes at its exit.)
    lines = [line for line in done.stderr.splitlines() if "RuntimeWarning" not in line]
    assert lines == [told.format(folder=folder)]
