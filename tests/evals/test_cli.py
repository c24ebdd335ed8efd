"""`handrail eval`: the demo suite through the command, reports, baselines, and errors."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from handrail.cli import app

ROOT = Path(__file__).resolve().parents[2]
DEMO_SUITE = ROOT / "evals" / "support_desk.yaml"

runner = CliRunner()


def run(*args: str | Path) -> Any:
    return runner.invoke(app, ["eval", *map(str, args)])


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


SIMPLE = """\
domain: handrail.demo.support_desk:support_domain
scenarios:
  - name: question
    turns: "Do you refund damaged items?"
    model:
      scripted:
        - output: {route: simple}
        - "Yes, in full."
    expect:
      route: simple
      text_contains: "{wanted}"
"""


def test_the_demo_suite_passes_and_its_reports_are_byte_identical(tmp_path: Path) -> None:
    first = run(DEMO_SUITE, "--json", tmp_path / "a.json", "--junit", tmp_path / "a.xml")
    assert first.exit_code == 0, first.output
    assert "0 failed" in first.stdout
    second = run(DEMO_SUITE, "--json", tmp_path / "b.json", "--junit", tmp_path / "b.xml")
    assert second.exit_code == 0, second.output
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert (tmp_path / "a.xml").read_bytes() == (tmp_path / "b.xml").read_bytes()

    report = json.loads((tmp_path / "a.json").read_text())
    assert report["summary"]["failed"] == 0
    by_name = {s["name"]: s for s in report["scenarios"]}
    assert by_name["refund-waits-for-approval"]["outcome"] == "suspended"
    assert by_name["a-question-then-a-lookup"]["routes"] == ["simple", "search"]
    assert by_name["the-reply-is-judged-kind-and-accurate"]["tokens"] == 300
    assert "latency_s" not in by_name["question-takes-the-simple-route"]
    assert "time=" not in (tmp_path / "a.xml").read_text()


def test_timings_are_opt_in(tmp_path: Path) -> None:
    result = run(
        DEMO_SUITE, "--json", tmp_path / "r.json", "--junit", tmp_path / "r.xml", "--timings"
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert all(s["latency_s"] >= 0 for s in report["scenarios"])
    assert 'time="' in (tmp_path / "r.xml").read_text()


def test_a_failing_assertion_exits_1_with_its_reason(tmp_path: Path) -> None:
    suite = write(tmp_path / "s.yaml", SIMPLE.replace("{wanted}", "within 30 days"))
    result = run(suite, "--junit", tmp_path / "j.xml")
    assert result.exit_code == 1
    assert (
        "FAIL question: text_contains: 'within 30 days' not in the final text \"Yes, in full.\""
        in result.stdout
    )
    assert "0 passed, 1 failed" in result.stdout
    junit = (tmp_path / "j.xml").read_text()
    assert 'failures="1"' in junit and "text_contains: 'within 30 days'" in junit


def test_off_a_terminal_the_table_is_as_wide_as_its_reasons(tmp_path: Path) -> None:
    wanted = "a refund reaches your card within five to ten business days of our approval"
    suite = write(tmp_path / "s.yaml", SIMPLE.replace("{wanted}", wanted))
    result = runner.invoke(app, ["eval", str(suite)], env={"COLUMNS": None})
    assert result.exit_code == 1
    reason = f"text_contains: '{wanted}' not in the final text \"Yes, in full.\""
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("│ question")]
    assert [cell.strip() for cell in row.split("│")[1:-1]][:3] == ["question", "FAIL", reason]
    assert len(row) > 80  # a log's width, not an imagined 80-column terminal
    # At a terminal (as rich detects one), the table fits the window and the reason wraps.
    at_a_terminal = runner.invoke(
        app, ["eval", str(suite)], env={"TTY_COMPATIBLE": "1", "COLUMNS": "60"}
    )
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", at_a_terminal.stdout)
    table = [line for line in plain.splitlines() if line[:1] in "┏┃┡│└"]
    assert len(table) > 5 and max(len(line) for line in table) == 60


def test_a_baseline_lists_regressions_improvements_new_and_missing(tmp_path: Path) -> None:
    passing = write(tmp_path / "s.yaml", SIMPLE.replace("{wanted}", "in full"))
    assert run(passing, "--json", tmp_path / "base.json").exit_code == 0
    baseline = json.loads((tmp_path / "base.json").read_text())
    baseline["scenarios"].append({**baseline["scenarios"][0], "name": "gone", "passed": False})
    (tmp_path / "base.json").write_text(json.dumps(baseline))

    failing = write(tmp_path / "f.yaml", SIMPLE.replace("{wanted}", "partly"))
    result = run(failing, "--baseline", tmp_path / "base.json")
    assert result.exit_code == 1
    assert "1 regression(s), 0 improvement(s), 0 new, 1 missing" in result.stdout
    assert "regression question: passed, now fails (text_contains:" in result.stdout
    assert "missing gone: in the baseline, not in this suite" in result.stdout

    baseline["scenarios"][0]["passed"] = False
    (tmp_path / "base.json").write_text(json.dumps(baseline))
    improved = run(passing, "--baseline", tmp_path / "base.json")
    assert improved.exit_code == 0
    assert "improvement question: failed, now passes" in improved.stdout


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            SIMPLE.replace("text_contains:", "max_model_calls: lots\n      text_contains:"),
            "s.yaml: scenario 'question': expect.max_model_calls: Input should be a valid integer",
        ),
        (
            SIMPLE.replace("route: simple\n      text", "rout: simple\n      text"),
            "s.yaml: scenario 'question': expect.rout: Extra inputs are not permitted",
        ),
        (
            SIMPLE.replace(
                "    turns:", "    mocks:\n      orders.cancel: {output: 1}\n    turns:"
            ),
            "s.yaml: scenario 'question': mocks: no agent has a tool 'orders.cancel' (tools: "
            "orders.lookup, orders.refund, policy.refunds).",
        ),
        (
            SIMPLE.replace("- output: {route: simple}", "- {call: x, output: 1}"),
            "s.yaml: scenario 'question': model.scripted[0][0]: a step part is exactly one of "
            "text, call or output",
        ),
        (
            SIMPLE.replace("route: simple\n      text", "route: urgent\n      text"),
            "s.yaml: scenario 'question': expect.route: no route 'urgent' (routes: simple, "
            "search, action).",
        ),
        (
            SIMPLE.replace("domain: handrail.demo", "domain: nowhere.demo"),
            "s.yaml: domain: cannot import 'nowhere.demo.support_desk' (No module named "
            "'nowhere').",
        ),
        ("scenarios: [\n", "s.yaml: not valid YAML (line 2, column 1)"),
        ("- a list\n", "s.yaml: expected a mapping of settings, got a list."),
    ],
    ids=["type", "typo", "unknown-tool", "step", "route", "import", "yaml", "not-a-mapping"],
)
def test_a_malformed_suite_is_one_line_naming_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    result = run(write(tmp_path / "s.yaml", text))
    assert result.exit_code == 1
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and message in line, line


def test_a_missing_suite_or_baseline_is_named(tmp_path: Path) -> None:
    missing = run(tmp_path / "none.yaml")
    assert missing.exit_code == 1
    assert missing.stderr.strip() == f"error: {tmp_path / 'none.yaml'}: no such suite file."
    suite = write(tmp_path / "s.yaml", SIMPLE.replace("{wanted}", "in full"))
    (tmp_path / "other.json").write_text('{"hello": 1}')
    bad = run(suite, "--baseline", tmp_path / "other.json")
    assert bad.exit_code == 1
    assert "not a handrail eval report" in bad.stderr


def test_compare_runs_two_configurations_side_by_side(tmp_path: Path) -> None:
    suite = write(tmp_path / "s.yaml", SIMPLE.replace("{wanted}", "in full"))
    draft = write(
        tmp_path / "draft.yaml",
        """\
        agents:
          responder:
            instructions: Answer in one word.
            model: {scripted: ["No."]}
        """,
    )
    pinned = write(tmp_path / "pinned.yaml", "name: pinned\n")
    result = run(
        suite,
        "--compare",
        draft,
        pinned,
        "--json",
        tmp_path / "c.json",
        "--junit",
        tmp_path / "c.xml",
    )
    assert result.exit_code == 1
    assert "compare" in result.stdout and "draft" in result.stdout and "pinned" in result.stdout
    assert "FAIL question [draft]: text_contains: 'in full' not in the final text \"No.\"" in (
        result.stdout
    )
    assert "1 passed, 1 failed" in result.stdout
    report = json.loads((tmp_path / "c.json").read_text())
    assert [(r["config"], r["summary"]["failed"]) for r in report["compare"]] == [
        ("draft", 1),
        ("pinned", 0),
    ]
    assert '<testsuite name="s [draft]"' in (tmp_path / "c.xml").read_text()


def test_compare_names_an_unknown_agent_and_refuses_a_baseline(tmp_path: Path) -> None:
    suite = write(tmp_path / "s.yaml", SIMPLE.replace("{wanted}", "in full"))
    other = write(tmp_path / "other.yaml", "agents:\n  writer: {instructions: hi}\n")
    unknown = run(suite, "--compare", other, other)
    assert unknown.exit_code == 1
    assert unknown.stderr.strip() == (
        "error: other: agents: no agent 'writer' in the domain "
        "(agents: executor, responder, supervisor)."
    )
    typo = write(tmp_path / "typo.yaml", "agent: {}\n")
    assert (
        "typo.yaml: agent: Extra inputs are not permitted"
        in run(suite, "--compare", typo, typo).stderr
    )
    both = run(suite, "--compare", other, other, "--baseline", tmp_path / "b.json")
    assert both.exit_code == 1 and "--baseline compares one run" in both.stderr


def test_a_python_suite_file_defines_suite(tmp_path: Path) -> None:
    write(
        tmp_path / "suite.py",
        """\
        from handrail.evals import Scenario, Suite

        suite = Suite(
            domain="handrail.demo.support_desk:support_domain",
            scenarios=[
                Scenario.model_validate({
                    "name": f"question-{n}",
                    "turns": "Do you refund damaged items?",
                    "model": {"scripted": [{"output": {"route": "simple"}}, "Yes."]},
                    "expect": {"route": "simple", "text_contains": "Yes"},
                })
                for n in range(3)
            ],
        )
        """,
    )
    result = run(tmp_path / "suite.py", "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["suite"] == "suite" and report["summary"]["passed"] == 3
    write(tmp_path / "empty.py", "x = 1\n")
    empty = run(tmp_path / "empty.py")
    assert empty.exit_code == 1
    assert "define `suite`, a handrail.evals.Suite" in empty.stderr


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (
            "from handrail.evals import Scenario\nScenario.model_validate({'name': 'x'})\n",
            "broken.py: Scenario: turns: Field required",
        ),
        (
            "raise RuntimeError('no database')\n",
            "broken.py: importing it failed: RuntimeError: no database",
        ),
    ],
)
def test_a_broken_python_suite_is_one_line(tmp_path: Path, code: str, message: str) -> None:
    result = run(write(tmp_path / "broken.py", code))
    assert result.exit_code == 1
    (line,) = result.stderr.splitlines()
    assert line.endswith(message), line


def test_a_judge_that_cannot_be_built_fails_its_assertion_not_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    suite = write(
        tmp_path / "s.yaml",
        SIMPLE.replace("{wanted}", "in full")
        + "      judge: {rubric: polite, model: 'openai:gpt-4o-mini'}\n",
    )
    result = run(suite, "--json", tmp_path / "r.json")
    assert result.exit_code == 1
    (failure,) = json.loads((tmp_path / "r.json").read_text())["scenarios"][0]["failures"]
    assert failure["assertion"] == "judge"
    assert failure["reason"].startswith("ConfigError:") and "OPENAI_API_KEY" in failure["reason"]
