"""The `handrail` command: sessions in a SQLite store, and `serve` up to uvicorn."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from dirty_equals import IsInt
from starlette.testclient import TestClient
from typer.testing import CliRunner

from handrail import (
    Agent,
    Domain,
    Engine,
    Message,
    Reject,
    RunState,
    Runtime,
    SessionRecord,
    TextPart,
)
from handrail.cli import app
from handrail.demo.support_desk import CUSTOMER_MESSAGE, build_scenario
from handrail.store import SqliteStore
from handrail.testing import ScriptedModel

runner = CliRunner()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A SQLite store holding one support-desk session, suspended on its refund card."""
    path = tmp_path / "handrail.db"

    async def make() -> None:
        async with SqliteStore(path) as store:
            scenario = build_scenario(store=store)
            await scenario.engine.submit(
                "support-1", CUSTOMER_MESSAGE, org_id="acme", user_id="ana"
            ).finish()

    asyncio.run(make())
    return path


def run(*args: str, input: str | None = None) -> Any:
    return runner.invoke(app, list(args), input=input)


def test_sessions_list_prints_a_table_or_json(db: Path) -> None:
    table = run("sessions", "list", "--db", str(db))
    assert table.exit_code == 0, table.output
    assert "support-1" in table.output and "suspended" in table.output
    listed = json.loads(run("sessions", "list", "--db", str(db), "--json").output)
    assert listed == [
        {
            "id": "support-1",
            "org_id": "acme",
            "user_id": "ana",
            "status": "suspended",
            "updated_at": listed[0]["updated_at"],
        }
    ]
    assert json.loads(run("sessions", "list", "--db", str(db), "--org", "x", "--json").output) == []


def test_sessions_show_gives_the_conversation_and_the_waiting_card(db: Path) -> None:
    shown = run("sessions", "show", "support-1", "--db", str(db))
    assert shown.exit_code == 0, shown.output
    assert CUSTOMER_MESSAGE in shown.output
    assert "waiting (approval): orders.refund" in shown.output
    document = json.loads(run("sessions", "show", "support-1", "--db", str(db), "--json").output)
    assert document["status"] == "suspended"
    (card,) = document["pending"]
    assert (card["tool_name"], card["args"]["amount"]) == ("orders.refund", 84.0)


def test_a_session_is_exported_deleted_and_imported_back(db: Path, tmp_path: Path) -> None:
    target = tmp_path / "s.json"
    assert run("sessions", "export", "support-1", "--db", str(db), "-o", str(target)).exit_code == 0
    assert json.loads(target.read_text())["session"]["id"] == "support-1"

    deleted = run("sessions", "delete", "support-1", "--db", str(db), "--yes")
    assert deleted.exit_code == 0
    assert json.loads(run("sessions", "list", "--db", str(db), "--json").output) == []

    imported = run("sessions", "import", str(target), "--db", str(db))
    assert imported.exit_code == 0, imported.output
    again = run("sessions", "import", "-", "--db", str(db), input=target.read_text())
    assert again.exit_code == 1
    assert "already exists" in again.output
    assert run("sessions", "import", "-", "--db", str(db), "--overwrite",
               input=target.read_text()).exit_code == 0  # fmt: skip


def test_deleting_asks_first_unless_told_yes(db: Path) -> None:
    refused = run("sessions", "delete", "support-1", "--db", str(db), input="n\n")
    assert refused.exit_code == 1
    assert json.loads(run("sessions", "list", "--db", str(db), "--json").output) != []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sessions", "show", "nope"], "error: No session 'nope' in this store."),
        (["sessions", "delete", "nope", "--yes"], "error: No session 'nope' in this store."),
        (["sessions", "export", "nope"], "error: Cannot export session 'nope': there is none."),
        (["sessions", "import", "missing.json"], "error: [Errno 2] No such file or directory"),
    ],
)
def test_errors_print_one_line_and_exit_1(db: Path, args: list[str], message: str) -> None:
    result = run(*args, "--db", str(db))
    assert result.exit_code == 1
    assert result.output.startswith(message)
    assert len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_a_missing_store_is_named(tmp_path: Path) -> None:
    result = run("sessions", "list", "--db", str(tmp_path / "none.db"))
    assert result.exit_code == 1
    assert "error: No store at" in result.output and "--db PATH" in result.output


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "deskapp.py").write_text(
        "from handrail.demo.support_desk import build_scenario\n"
        "engine = build_scenario().engine\n"
        "def make():\n    return build_scenario().engine\n"
        "not_an_engine = 42\n"
    )
    monkeypatch.chdir(tmp_path)
    yield "deskapp"
    sys.modules.pop("deskapp", None)


def test_serve_hands_the_engines_app_to_uvicorn(
    app_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: dict[str, Any] = {}
    monkeypatch.setattr(
        "handrail.server.serve", lambda app, **options: served.update(app=app, **options)
    )
    for target in (f"{app_module}:engine", f"{app_module}:make"):
        monkeypatch.setenv("HANDRAIL_API_KEYS", "acme:ana:k:with:colons")
        result = run("serve", target, "--port", "8123")
        assert result.exit_code == 0, result.output
        assert (served["host"], served["port"]) == ("127.0.0.1", 8123)
        with TestClient(served["app"]):  # the app is opened as the server starts
            assert isinstance(served["app"].state.runs.engine, Engine)


def test_serve_takes_the_limits_and_timeouts_from_its_flags(
    app_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: dict[str, Any] = {}
    monkeypatch.setattr(
        "handrail.server.serve", lambda app, **options: served.update(app=app, **options)
    )
    flags = ["--rate", "5", "--burst", "7", "--streams", "0", "--turns", "3"]
    flags += ["--stream-bytes", "1000", "--header-timeout", "2", "--body-timeout", "4"]
    flags += ["--idle-timeout", "1.5", "--max-connections", "0"]
    result = run("serve", f"{app_module}:engine", *flags)
    assert result.exit_code == 0, result.output
    limits = served["app"].state.limits
    assert (limits.rate, limits.burst, limits.streams, limits.turns) == (5.0, 7, None, 3)
    assert limits.stream_bytes == 1000.0
    timeouts = ("header_timeout", "body_timeout", "idle_timeout", "max_connections")
    assert [served[name] for name in timeouts] == [2.0, 4.0, 1.5, None]


def test_serve_without_a_key_makes_one_for_the_run(
    app_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("handrail.server.serve", lambda app, **options: None)
    result = run("serve", f"{app_module}:engine")
    assert result.exit_code == 0
    assert "WARNING: no API key is configured (HANDRAIL_API_KEYS, HANDRAIL_API_KEYS_FILE " in (
        result.output
    )


def test_serve_shuts_down_with_a_stream_open(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) stops the server at once, although a followed stream (which never ends
    by itself) is open: the server ends the stream, and exits cleanly."""
    import os
    import signal
    import socket
    import subprocess
    import time

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [str(Path(sys.executable).with_name("handrail")), "serve", "handrail.demo.web:engine"]
    command += ["--port", str(port), "--shutdown-grace", "0.5"]
    env = {**os.environ, "HANDRAIL_DEMO_DB": str(tmp_path / "web.db")}
    env["HANDRAIL_API_KEYS"] = "acme:ana:k"
    server = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        url, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer k"}
        with httpx.Client(base_url=url, headers=auth) as client:
            session_id = None
            for _ in range(200):
                try:
                    session_id = client.post("/sessions").json()["id"]
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            assert session_id is not None, "the server did not start"
            path = f"/sessions/{session_id}/events?follow=true"
            with client.stream("GET", path, timeout=httpx.Timeout(20.0)) as stream:
                assert stream.status_code == 200
                server.send_signal(signal.SIGINT)
                began = time.monotonic()
                for _ in stream.iter_bytes():  # the server ends the stream
                    pass
                # uvicorn ends as the signal would have ended it (130), once it has stopped
                assert server.wait(timeout=15) in (0, 130, -signal.SIGINT)
                assert time.monotonic() - began < 5
    finally:
        server.kill()
        server.wait()
        assert server.stderr is not None
        with server.stderr:
            stderr = server.stderr.read()
    assert "Traceback" not in stderr, stderr
    assert "Application shutdown complete" in stderr


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("deskapp", "'deskapp' is not MODULE:NAME"),
        ("nomodule:engine", "Cannot import 'nomodule'"),
        ("deskapp:missing", "Module 'deskapp' has no attribute 'missing'"),
        ("deskapp:not_an_engine", "deskapp:not_an_engine is a int; it must be an Engine, "),
    ],
)
def test_serve_names_what_is_wrong_with_the_target(
    app_module: str, target: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HANDRAIL_API_KEYS", "a:b:c")
    result = run("serve", target)
    assert result.exit_code == 1
    assert result.output.strip() == f"error: {message}" or message in result.output
    assert "Traceback" not in result.output


def test_a_malformed_api_key_is_refused_without_showing_it(
    app_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HANDRAIL_API_KEYS", "just-a-key")
    result = run("serve", f"{app_module}:engine")
    assert result.exit_code == 1
    assert "ORG:USER:KEY" in result.output and "just-a-key" not in result.output
    monkeypatch.setenv("HANDRAIL_API_KEYS", "id=k1,org=acme,user=bo,expires=soon,key=s3cret")
    result = run("serve", f"{app_module}:engine")
    assert result.exit_code == 1
    assert "expires='soon'" in result.output and "s3cret" not in result.output


def test_serve_takes_no_key_on_the_command_line(app_module: str) -> None:
    result = run("serve", f"{app_module}:engine", "--api-key", "acme:ana:k")
    assert result.exit_code == 2  # no such option: a key never goes in the process's argv
    assert "No such option: --api-key" in result.output


# -- chat ------------------------------------------------------------------------------------


@pytest.fixture
def chat_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """`chatapp:desk`, the support desk; `chatapp:sizes`, an agent that asks a person."""
    (tmp_path / "chatapp.py").write_text(
        "from pydantic import BaseModel\n"
        "from handrail import Agent, Engine, Runtime, tool\n"
        "from handrail.demo.support_desk import build_scenario\n"
        "from handrail.testing import ScriptedModel, call\n"
        "desk = build_scenario().engine\n"
        "class Size(BaseModel):\n"
        "    size: str\n"
        "    count: int\n"
        "@tool(executor='human', prompt='Which size, and how many?')\n"
        "def ask_size(question: str) -> Size:\n"
        "    '''Ask the customer.'''\n"
        "    raise AssertionError('a person answers')\n"
        "model = ScriptedModel([call('ask_size', question='S or M?'), 'Noted.'])\n"
        "sizes = Engine(Agent('shop', tools=[ask_size]), runtime=Runtime(model=model))\n"
        "@tool\n"
        "def stock(sku: str) -> str:\n"
        "    '''Stock of an item.'''\n"
        "    return '3 left'\n"
        "again = ScriptedModel([call('stock', sku='M1'), call('stock', sku='M1'), 'Three.'])\n"
        "reads = Engine(Agent('shop', tools=[stock]), runtime=Runtime(model=again))\n"
    )
    monkeypatch.chdir(tmp_path)
    yield "chatapp"
    sys.modules.pop("chatapp", None)


def chat(*args: str, input: str | None = None) -> Any:
    return runner.invoke(app, ["chat", *args], input=input)


def test_chat_marks_a_reused_read_as_not_run_again(chat_module: str) -> None:
    result = chat("chatapp:reads", input="How many M1?\n")
    assert result.exit_code == 0, result.output
    lines = [line[line.index("✓") :] for line in result.output.splitlines() if "stock →" in line]
    assert lines == ["✓ stock → 3 left", "✓ stock → 3 left (reused, not run again)"]


def test_chat_streams_the_reply_and_amends_the_card_field_by_field(chat_module: str) -> None:
    result = chat("chatapp:desk", "--user", "ana", input=f"{CUSTOMER_MESSAGE}\na\n40\n\n")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "↳ route action: a refund must be proposed" in out
    assert "✓ orders.lookup → order A1042 · status delivered · total €84.00" in out
    assert "Approval required · orders.refund" in out and "✎ amendable" in out
    assert "amount [84.0]:" in out
    assert 'approved orders.refund, amended: {"amount": 40.0}' in out
    assert "✓ orders.refund → refund R0001 · order A1042 · amount €40.00" in out
    assert "responder: Good news, Dana: your refund R0001 of €40.00 has been approved" in out


def test_chat_takes_the_one_amendable_field_typed_at_the_first_question(chat_module: str) -> None:
    result = chat("chatapp:desk", input=f"{CUSTOMER_MESSAGE}\nlots\n25\n/quit\n")
    assert result.exit_code == 0, result.output
    assert "amount €25.00" in result.output  # "lots" is not an amount: asked again


def test_chat_rejects_with_the_reason_the_agent_is_told(chat_module: str) -> None:
    result = chat("chatapp:desk", "--user", "ana", input=f"{CUSTOMER_MESSAGE}\nn\nneed photos\n")
    assert result.exit_code == 0, result.output
    assert "✗ orders.refund → rejected by ana: need photos" in result.output
    assert "did not approve the refund this time (need photos)" in result.output


def test_chat_answers_a_human_tool_field_by_field(chat_module: str) -> None:
    result = chat("chatapp:sizes", input="I need shirts\nM\nnot a number\n3\n")
    assert result.exit_code == 0, result.output
    assert "Answer required · ask_size" in result.output
    assert "Size (string): Count (integer): Count (integer):" in result.output  # asked again
    assert "shop: Noted." in result.output


def test_chat_continues_a_stored_session_that_waits_for_a_decision(
    chat_module: str, db: Path
) -> None:
    args = ("--session", "support-1", "--org", "acme", "--user", "ana", "--db", str(db))
    result = chat("chatapp:desk", *args, input="y\n")
    assert result.exit_code == 0, result.output
    assert "Approval required · orders.refund" in result.output
    assert "✓ orders.refund → refund R0001 · order A1042 · amount €84.00" in result.output
    shown = json.loads(run("sessions", "show", "support-1", "--db", str(db), "--json").stdout)
    assert (shown["status"], shown["pending"]) == ("completed", [])


def test_chat_json_writes_the_events_as_json_lines(chat_module: str) -> None:
    result = chat("chatapp:desk", "--json", "--approve-all", "-m", CUSTOMER_MESSAGE)
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.stdout.splitlines()]
    types = [e["type"] for e in events]
    assert types[0] == "run-started" and types.count("run-started") == 2  # turn, resumption
    assert "approval-required" in types and types[-1] == "run-completed"
    assert "€84.00 has been approved" in events[-1]["output"]
    rejected = chat("chatapp:desk", "--json", "--reject-all", input=f"{CUSTOMER_MESSAGE}\n")
    assert rejected.exit_code == 0, rejected.output
    assert json.loads(rejected.stdout.splitlines()[-1])["type"] == "run-completed"


def test_chat_json_with_nobody_to_decide_fails_in_one_line(chat_module: str) -> None:
    result = chat("chatapp:desk", "--json", "-m", CUSTOMER_MESSAGE)
    assert result.exit_code == 1
    assert json.loads(result.stdout.splitlines()[-1])["type"] == "run-suspended"
    assert result.stderr.strip().splitlines() == [
        "error: The turn waits for a decision on orders.refund (call call_3) and nobody is "
        "asked: pass --approve-all or --reject-all."
    ]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            "nomodule:engine",
            "error: Cannot import 'nomodule': no such module (run from the folder that holds "
            "it, or install it).",
        ),
        ("chatapp", "error: 'chatapp' is not MODULE:NAME (e.g. myapp:engine or myapp:app)."),
    ],
)
def test_chat_with_a_bad_target_prints_one_line_and_exits_1(
    chat_module: str, target: str, message: str
) -> None:
    result = chat(target, input="hello\n")
    assert result.exit_code == 1
    assert result.stderr.strip() == message
    assert "Traceback" not in result.output


def test_every_sessions_command_speaks_json(db: Path, tmp_path: Path) -> None:
    target = tmp_path / "s.json"
    exported = run("sessions", "export", "support-1", "--db", str(db), "-o", str(target), "--json")
    assert json.loads(exported.stdout) == {"exported": "support-1", "path": str(target)}
    refused = run("sessions", "delete", "support-1", "--db", str(db), "--json")
    assert (refused.exit_code, refused.stderr.strip()) == (
        1,
        "error: --json asks nobody: pass --yes to delete.",
    )
    deleted = run("sessions", "delete", "support-1", "--db", str(db), "--yes", "--json")
    assert json.loads(deleted.stdout) == {"deleted": "support-1"}
    imported = run("sessions", "import", str(target), "--db", str(db), "--json")
    assert json.loads(imported.stdout) == {"imported": "support-1", "version": IsInt()}


def test_serve_tunes_the_garbage_collector_for_a_long_run(
    app_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[uvicorn.Server] = []

    def run_server(self: uvicorn.Server, sockets: Any = None) -> None:
        ran.append(self)
        self.started = True

    monkeypatch.setattr("uvicorn.Server.run", run_server)
    monkeypatch.setenv("HANDRAIL_API_KEYS", "o:u:k")
    result = run("serve", f"{app_module}:engine", "--port", "8124")
    assert result.exit_code == 0, result.output
    assert (ran[0].config.port, ran[0].config.timeout_graceful_shutdown) == (8124, 5.0)
    assert gc.get_threshold()[0] == 5_000 and gc.get_freeze_count() > 0


def test_serve_reads_keys_from_a_file_and_the_environment(
    app_module: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    served: dict[str, Any] = {}
    monkeypatch.setattr(
        "handrail.server.serve", lambda app, **options: served.update(app=app, **options)
    )
    keys = tmp_path / "keys.txt"
    keys.write_text(
        "# the desk's keys\nacme:ana:k1\n\nid=ops,org=acme,user=bo,roles=it-admin,key=k2\n"
    )
    filed = run("serve", f"{app_module}:engine", "--api-keys-file", str(keys))
    assert filed.exit_code == 0, filed.output
    assert "Warning" not in filed.output and "No API key configured" not in filed.output
    monkeypatch.setenv("HANDRAIL_API_KEYS", "acme:ana:k3")
    from_env = run("serve", f"{app_module}:engine")
    assert from_env.exit_code == 0 and "Warning" not in from_env.output


def test_the_access_log_never_shows_a_key_nor_a_raw_control_character(tmp_path: Path) -> None:
    import os
    import socket
    import subprocess
    import time

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [str(Path(sys.executable).with_name("handrail")), "serve", "handrail.demo.web:engine"]
    command += ["--port", str(port), "--shutdown-grace", "0.5"]
    env = {
        **os.environ,
        "HANDRAIL_DEMO_DB": str(tmp_path / "web.db"),
        "HANDRAIL_API_KEYS": "acme:ana:k",
    }
    server = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            for _ in range(200):
                try:
                    client.get("/?key=s3cr3t-key&x=1")
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            client.get("/sessions?token=t0ken", headers={"Authorization": "Bearer k"})
    finally:
        server.terminate()
        server.wait(timeout=15)
        assert server.stdout is not None
        with server.stdout:
            log = server.stdout.read()
    assert "s3cr3t-key" not in log and "t0ken" not in log
    assert "/?key=***&x=1" in log and "/sessions?token=***" in log


@pytest.fixture
def sqlite_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "sqliteapp.py").write_text(
        "from handrail import Agent, Engine\n"
        "from handrail.store import SqliteStore\n"
        "def make():\n"
        "    return Engine(Agent('a'), store=SqliteStore('shared.db'), worker_id='fixed')\n"
    )
    monkeypatch.chdir(tmp_path)
    yield "sqliteapp:make"
    sys.modules.pop("sqliteapp", None)


def test_serve_with_workers_gives_each_process_its_own_worker_id(
    sqlite_app: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    started: dict[str, Any] = {}
    monkeypatch.setattr(
        "handrail.server.serve_workers",
        lambda factory, workers, **options: started.update(factory=factory, workers=workers),
    )
    monkeypatch.setenv("HANDRAIL_WORKER_ID", "box")
    monkeypatch.setenv("HANDRAIL_API_KEYS", "acme:ana:k")
    flags = ["--workers", "3", "--poll-interval", "7"]
    result = run("serve", sqlite_app, *flags)
    assert result.exit_code == 0, result.output
    assert started["workers"] == 3
    # Each process's app: its own engine, opened as it starts, named by its index (over the
    # engine's worker_id).
    apps = [started["factory"](index) for index in range(3)]
    engines = []
    for app_ in apps:
        with TestClient(app_):
            engines.append(app_.state.runs.engine)
    # What SQLite shared by processes can do is said (by the first).
    assert caplog.text.count("3 processes share the SQLite file") == 1
    assert "by polling" in caplog.text
    assert [e.worker_id for e in engines] == ["box-0", "box-1", "box-2"]
    assert [e.lease_owner.split("#")[0] for e in engines] == ["box-0", "box-1", "box-2"]
    assert len({id(e) for e in engines}) == 3
    assert apps[0].state.runs.poll_interval == 7.0


def test_serve_refuses_workers_over_a_memory_store(
    app_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("handrail.server.serve_workers", lambda *a, **k: None)
    monkeypatch.setenv("HANDRAIL_API_KEYS", "a:b:c")
    result = run("serve", f"{app_module}:engine", "--workers", "2")
    assert result.exit_code == 1
    assert result.output.startswith("error: --workers 2 needs a store the processes share")
    assert "MemoryStore" in result.output


def test_sessions_show_pages_back_through_the_history(tmp_path: Path) -> None:
    db = tmp_path / "long.db"
    state = RunState(session_id="long")
    state.messages = [
        Message(id=f"m{n}", role="user", parts=[TextPart(text=f"message {n}")]) for n in range(5)
    ]

    async def store_it() -> None:
        async with SqliteStore(db) as store:
            await store.save(
                SessionRecord(
                    id="long",
                    data=state.dump(messages=False),
                    messages=state.dump_messages(),
                )
            )

    asyncio.run(store_it())
    show = ("sessions", "show", "long", "--db", str(db))
    whole = json.loads(run(*show, "--json").output)
    assert [m["id"] for m in whole["messages"]] == ["m0", "m1", "m2", "m3", "m4"]
    assert (whole["first"], whole["earlier"]) == (0, None)
    latest = json.loads(run(*show, "--json", "--limit", "2").output)
    assert [m["id"] for m in latest["messages"]] == ["m3", "m4"]
    assert latest["first"] == latest["earlier"] == 3
    older = json.loads(run(*show, "--json", "--before", "3", "--limit", "2").output)
    assert [m["id"] for m in older["messages"]] == ["m1", "m2"] and older["earlier"] == 1
    shown = run(*show, "--limit", "2")
    assert "… 3 earlier message(s): --before 3 shows them" in shown.output
    assert "message 4" in shown.output and "message 2" not in shown.output


def test_chat_on_a_turn_cut_off_says_what_recovers_it_in_one_line(
    chat_module: str, db: Path
) -> None:
    async def cut_off() -> None:  # as a process killed mid-turn leaves the session
        async with SqliteStore(db) as store:
            engine = build_scenario(store=store).engine
            who = {"org_id": "acme", "user_id": "ana"}
            call_id = next(iter((await engine.session("support-1", **who)).pending))
            await engine.resolve("support-1", call_id, Reject("no"), **who)
            await engine.resume("support-1", **who).finish()
            record = await store.load("support-1")
            assert record is not None and record.data["progress"] is None
            record.data["progress"] = {"status": "running", "agent": "responder"}
            await store.save(record)

    asyncio.run(cut_off())
    args = ("--session", "support-1", "--org", "acme", "--user", "ana", "--db", str(db))
    result = chat("chatapp:desk", *args, "-m", "hello?")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: Session 'support-1': the previous turn was cut off while it ran (a crash, or "
        "a worker that stopped). `handrail serve` recovers it by itself (as does any Worker on "
        "the same store); then chat again."
    )


def test_serve_lets_only_the_audit_roles_read_the_trail(
    app_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: dict[str, Any] = {}
    monkeypatch.setattr("handrail.server.serve", lambda app, **options: served.update(app=app))

    def statuses(*keys: str) -> list[int]:
        with TestClient(served["app"]) as client:
            return [
                client.get("/audit", headers={"Authorization": f"Bearer {k}"}).status_code
                for k in keys
            ]

    monkeypatch.delenv("HANDRAIL_API_KEYS", raising=False)
    made = run("serve", f"{app_module}:engine")
    assert made.exit_code == 0, made.output
    assert "(org 'local', user 'local', roles auditor)" in made.output
    key = made.output.split("Bearer ", 1)[1].split()[0]
    assert statuses(key) == [200]  # the run's own key is its operator's: an auditor

    keys = (
        "id=a,org=acme,user=ana,roles=auditor,key=ka id=c,org=acme,user=cy,roles=compliance,key=kc"
    )
    monkeypatch.setenv("HANDRAIL_API_KEYS", f"{keys} acme:bo:kb")
    assert run("serve", f"{app_module}:engine").exit_code == 0
    assert statuses("ka", "kc", "kb") == [200, 403, 403]  # auditors, by default
    assert run("serve", f"{app_module}:engine", "--audit-roles", "compliance,legal").exit_code == 0
    assert statuses("ka", "kc", "kb") == [403, 200, 403]
    assert run("serve", f"{app_module}:engine", "--audit-roles", "*").exit_code == 0
    assert statuses("ka", "kc", "kb") == [200, 200, 200]
    refused = run("serve", f"{app_module}:engine", "--audit-roles", " , ")
    assert refused.exit_code == 1 and "--audit-roles ' , ' is not valid" in refused.output


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_no_help_line_shows_a_type_tag() -> None:
    """`--json` is a flag and `--port` takes a number without `<bool>`/`<int>` saying so; a
    choice shows its values, and an explicit metavar stays."""
    import re

    import typer.main

    tags = re.compile(r"<(?:str|bool|int|float|path|list\[str\]|[a-z|]+)>")
    paths = list(_commands(typer.main.get_command(app)))
    assert ("serve",) in paths and ("audit", "list") in paths and ("eval",) in paths
    for path in paths:
        shown = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0, (path, shown.output)
        assert not tags.search(shown.output), (path, tags.findall(shown.output))
    kinds = runner.invoke(app, ["audit", "list", "--help"], env={"COLUMNS": "200"}).output
    assert re.search(r"--kind\s+decision\|call\s+Only decisions", kinds)
    compare = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "200"}).output
    assert re.search(r"--compare\s+DRAFT PINNED", compare)
    served = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    assert re.search(r"Usage: .*serve \[OPTIONS\] \{?APP\}?", served)


def test_serve_with_workers_stops_when_a_process_cannot_open_the_app(tmp_path: Path) -> None:
    """Each process opens the app; one that cannot (here: a MemoryStore, which processes
    cannot share) says why in the log, the others are stopped, and the command exits 1."""
    import os
    import socket
    import subprocess

    (tmp_path / "memapp.py").write_text(
        "from handrail import Agent, Engine\nasync def make():\n    return Engine(Agent('a'))\n"
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "HANDRAIL_API_KEYS": "a:b:c", "PYTHONPATH": src}
    command = [sys.executable, "-c", "from handrail.cli import app; app()", "serve"]
    command += ["memapp:make", "--workers", "2", "--port", str(port)]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "The application could not be opened: 2 server processes need a store they " in (
        done.stderr
    )
    assert done.stderr.strip().splitlines()[-1].startswith("error: Worker process ")


def test_sessions_show_gives_the_latest_turns_context(tmp_path: Path) -> None:
    db = tmp_path / "ctx.db"

    async def make() -> None:
        async with SqliteStore(db) as store:
            engine = Engine(
                Domain(agents=[Agent("desk")]),
                runtime=Runtime(model=ScriptedModel(["One.", "Two."])),
                store=store,
            )
            await engine.submit("s1", "hi", context={"page": "orders", "record_id": 42}).finish()
            await engine.submit("s2", "hi").finish()

    asyncio.run(make())
    shown = run("sessions", "show", "s1", "--db", str(db))
    assert shown.exit_code == 0, shown.output
    assert 'context: {"page": "orders", "record_id": 42}' in shown.output
    document = json.loads(run("sessions", "show", "s1", "--db", str(db), "--json").output)
    assert document["context"] == {"page": "orders", "record_id": 42}
    without = run("sessions", "show", "s2", "--db", str(db))
    assert "context:" not in without.output
    assert (
        json.loads(run("sessions", "show", "s2", "--db", str(db), "--json").output)["context"]
        is None
    )
