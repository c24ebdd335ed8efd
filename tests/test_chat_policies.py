"""`handrail chat` decides under the tools' policies like any other decider: the person at the
terminal is `--user` with `--roles`; a refusal is printed as a refusal, and nothing is
recorded; the app's gate is asked before a turn starts."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from handrail.cli import app

runner = CliRunner()

APP = '''
from handrail import Agent, DecisionPolicy, Domain, Engine, Runtime, tool
from handrail.testing import ScriptedModel, call

@tool(permission="write", approval="required",
      decision_policy=DecisionPolicy(roles={"sre"}))
def restart(service: str) -> str:
    """Restart a service."""
    return f"restarted {service}"

@tool(permission="destructive", approval="required",
      decision_policy=DecisionPolicy(roles={"sre"}, four_eyes=True, approvals=2))
def wipe_cache(region: str) -> str:
    """Wipe a region's cache."""
    return f"wiped {region}"

def ops():
    model = ScriptedModel([call("restart", service="api"), "Done."])
    return Engine(Agent("ops", tools=[restart]), runtime=Runtime(model=model))

def wipe():
    model = ScriptedModel([call("wipe_cache", region="eu"), "Done."])
    return Engine(Agent("ops", tools=[wipe_cache]), runtime=Runtime(model=model))

def menu():
    from handrail import by_role
    from handrail.testing import FunctionModel

    def answer(request):
        return "I see: " + ", ".join(t.name for t in request.tools)

    choose = by_role({"sre": ["restart", "wipe_cache"]}, default=[])
    domain = Domain(agents=[Agent("ops", tools=[restart, wipe_cache])], tools_for=choose)
    return Engine(domain, runtime=Runtime(model=FunctionModel(answer)))

def closed():
    engine = ops()
    engine.gate = lambda request: f"{request.org_id} has no plan with the ops assistant."
    return engine
'''


@pytest.fixture
def ops_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "opsapp.py").write_text(APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HANDRAIL_DB", raising=False)
    monkeypatch.delenv("HANDRAIL_DSN", raising=False)
    yield "opsapp"
    sys.modules.pop("opsapp", None)


def chat(*args: str, input: str | None = None) -> Any:
    return runner.invoke(app, ["chat", *args], input=input)


def sessions(db: Path) -> list[dict[str, Any]]:
    listed = runner.invoke(app, ["sessions", "list", "--db", str(db), "--json"])
    assert listed.exit_code == 0, listed.output
    return list(json.loads(listed.stdout))


def pending(db: Path, session: str) -> list[dict[str, Any]]:
    shown = runner.invoke(app, ["sessions", "show", session, "--db", str(db), "--json"])
    assert shown.exit_code == 0, shown.output
    return list(json.loads(shown.stdout)["pending"])


def test_an_approval_the_policy_refuses_is_printed_as_a_refusal_and_nothing_recorded(
    ops_app: str, tmp_path: Path
) -> None:
    db = tmp_path / "ops.db"
    args = ("--session", "s1", "--org", "acme", "--user", "ana", "--db", str(db))
    result = chat(f"{ops_app}:ops", *args, input="restart the api\ny\n")
    assert result.exit_code == 1
    assert (
        "✗ refused: you may not approve restart: restart needs the role sre; ana has none of "
        "them (no role). Nothing was recorded." in " ".join(result.stdout.split())
    )
    assert "approved restart" not in result.output and "rejected" not in result.output
    assert "decider=" not in result.output  # no Python advice at the terminal
    assert "Session 's1' waits for decisions on call_1" in result.stderr
    (card,) = pending(db, "s1")
    assert (card["tool_name"], card["decision"], card["approvals"]) == ("restart", None, None)


def test_the_roles_given_let_the_person_at_the_terminal_decide(
    ops_app: str, tmp_path: Path
) -> None:
    db = tmp_path / "ops.db"
    args = ("--org", "acme", "--user", "ana", "--roles", "sre,oncall", "--db", str(db))
    result = chat(f"{ops_app}:ops", *args, input="restart the api\ny\n")
    assert result.exit_code == 0, result.output
    assert "approved restart" in result.output and "✓ restart → " in result.output
    assert [s["status"] for s in sessions(db)] == ["completed"]


def test_the_requester_withdraws_their_own_call_without_the_role(ops_app: str) -> None:
    result = chat(f"{ops_app}:ops", "--user", "ana", input="restart the api\nn\nnot now\n")
    assert result.exit_code == 0, result.output
    assert "rejected restart" in result.output and "refused" not in result.output


def test_four_eyes_with_two_approvals_is_refused_to_the_requester_naming_three_people(
    ops_app: str, tmp_path: Path
) -> None:
    db = tmp_path / "ops.db"
    args = ("--session", "w1", "--user", "ana", "--roles", "sre", "--db", str(db))
    result = chat(f"{ops_app}:wipe", *args, "--json", "--approve-all", "-m", "wipe eu")
    assert result.exit_code == 1
    assert (
        "refused: wipe_cache (call call_1): wipe_cache needs four eyes: ana requested the "
        "call and may not approve it; two other people must approve it (three people in all, "
        "with the requester)." in result.stderr
    )
    (card,) = pending(db, "w1")
    assert card["decision"] is None and not card["approvals"]


def test_the_apps_gate_refuses_a_turn_before_anything_is_stored(
    ops_app: str, tmp_path: Path
) -> None:
    db = tmp_path / "ops.db"
    db.touch()
    args = ("--org", "acme", "--user", "ana", "--db", str(db))
    result = chat(f"{ops_app}:closed", *args, "-m", "restart the api")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == ["error: acme has no plan with the ops assistant."]
    assert sessions(db) == []


def test_the_roles_given_choose_the_tools_the_turn_sees(ops_app: str) -> None:
    sre = chat(f"{ops_app}:menu", "--roles", "sre", "-m", "what can you do?")
    assert sre.exit_code == 0, sre.output
    assert "I see: restart, wipe_cache" in sre.output
    nobody = chat(f"{ops_app}:menu", "--roles", "support", "-m", "what can you do?")
    assert nobody.exit_code == 0, nobody.output
    assert "I see: " in nobody.output and "restart" not in nobody.output
