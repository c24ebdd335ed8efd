"""docs/tutorial.md, run as a new user runs it: its files written, its commands run for real.

The page's blocks are tagged: a fenced block whose info string names a file
(```` ```python file=helpdesk.py ````) is a file the reader writes; a ```` ```console ```` block
holds commands (`$ ...`), each followed by what it prints. The test writes the files into a
fresh folder and runs the commands there, in order, each as a real `bash` process in that
folder (a variable a command sets is seen by the next ones, as in one terminal). A command
ending with `&` runs in the background (`handrail serve` is waited for until it answers,
`handrail worker` until its log says it started); `kill %N` sends SIGTERM to the N-th one
and waits for it to exit. Each command must exit 0 and print (on stdout) what the page
shows, where `...` stands for anything on one line (ids, keys, timings). The port of the
page (8000) becomes a free one.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "tutorial.md"
BLOCK = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```\n", re.S | re.M)
PORT = "8000"

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("curl", "jq")),
    reason="the tutorial's HTTP part uses curl and jq",
)


@dataclass
class Command:
    line: int
    text: str
    expected: list[str]


def steps(page: str) -> list[tuple[str, Path | Command]]:
    """The page's files (("file", path) with its text) and commands, in the page's order."""
    out: list[tuple[str, Path | Command]] = []
    for match in BLOCK.finditer(page):
        info, body = match["info"].split(), match["body"]
        line = page[: match.start()].count("\n") + 2
        named = [word.removeprefix("file=") for word in info[1:] if word.startswith("file=")]
        if named:
            out.append((body, Path(named[0])))
        elif info[:1] == ["console"]:
            for offset, text in enumerate(body.splitlines()):
                if text.startswith("$ "):
                    out.append(("", Command(line + offset, text[2:], [])))
                else:
                    command = out[-1][1]
                    assert isinstance(command, Command), f"tutorial.md:{line}: output first"
                    command.expected.append(text)
    return out


def matches(expected: list[str], printed: str) -> bool:
    lines = (r".*(?:\n.*)*?" if line == "..." else re.escape(line) for line in expected)
    pattern = "\n".join(lines).replace(re.escape("..."), ".*")
    printed = "\n".join(line.rstrip() for line in printed.rstrip("\n").splitlines())
    return re.fullmatch(pattern, printed) is not None


def free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


class Terminal:
    """One reader's terminal: a folder, the variables set so far, the background jobs."""

    def __init__(self, folder: Path, port: str) -> None:
        self.folder, self.port = folder, port
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HANDRAIL_")}
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"
        self.env["PYTHONPATH"] = str(ROOT / "src")
        self.env.pop("COLUMNS", None)
        self.jobs: list[subprocess.Popen[bytes]] = []

    def run(self, command: Command) -> None:
        text = command.text.replace(PORT, self.port)
        where = f"tutorial.md:{command.line}: {command.text}"
        if kill := re.fullmatch(r"kill %(\d+)", text):
            job = self.jobs[int(kill[1]) - 1]
            job.send_signal(signal.SIGTERM)
            # uvicorn ends by raising the signal again once it has shut down; a worker exits 0
            served = "handrail serve" in str(job.args)
            assert job.wait(timeout=60) in ((0, -signal.SIGTERM) if served else (0,)), where
            return
        if text.endswith("&"):
            self.background(text.removesuffix("&"), where)
            return
        state = self.folder / ".environment"
        script = f"set -a\n{text}\nstatus=$?\nenv -0 > {state}\nexit $status\n"
        done = subprocess.run(
            ["bash", "-c", script], cwd=self.folder, env=self.env, capture_output=True,
            timeout=120, check=False,
        )  # fmt: skip
        printed, errors = done.stdout.decode(), done.stderr.decode()
        assert done.returncode == 0, f"{where}: exit {done.returncode}\n{printed}{errors}"
        assert matches(command.expected, printed), f"{where}: printed\n{printed}{errors}"
        pairs = (item.partition("=") for item in state.read_text().split("\0") if item)
        self.env = {name: value for name, _, value in pairs}

    def background(self, text: str, where: str) -> None:
        job = subprocess.Popen(
            ["bash", "-c", f"exec {text}"], cwd=self.folder, env=self.env,
            stdout=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.jobs.append(job)
        log = re.search(r"> (\S+)", text)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert job.poll() is None, f"{where}: exited {job.returncode}"
            if "handrail serve" in text:
                try:
                    httpx.get(f"http://127.0.0.1:{self.port}/openapi.json", timeout=1)
                    return
                except httpx.TransportError:
                    pass
            elif log and "started on" in self.read(log[1]):
                return
            time.sleep(0.1)
        raise AssertionError(f"{where}: not ready after 60 s")

    def read(self, name: str) -> str:
        path = self.folder / name
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        for job in self.jobs:
            if job.poll() is None:
                job.kill()
                job.wait()


def test_the_page_is_read_as_files_and_commands() -> None:
    kinds = [type(step).__name__ for _, step in steps(PAGE.read_text())]
    assert "PosixPath" in kinds and kinds.count("Command") >= 20
    assert matches(["a ... c", "..."], "a b c\nd\ne")
    assert not matches(["a ... c"], "a b d")


def test_every_command_of_the_tutorial_runs(tmp_path: Path) -> None:
    terminal = Terminal(tmp_path, free_port())
    try:
        for body, step in steps(PAGE.read_text()):
            if isinstance(step, Command):
                terminal.run(step)
            else:
                (tmp_path / step).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / step).write_text(body)
        assert all(job.returncode is not None for job in terminal.jobs), "not stopped"
        closed = (tmp_path / "worker.log").read_text()
        assert (
            "stopped:" in closed
            and "Application shutdown complete" in (tmp_path / "serve.log").read_text()
        )
    finally:
        terminal.close()
