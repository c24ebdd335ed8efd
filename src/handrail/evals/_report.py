"""Reports of a suite run: JSON, JUnit XML, and the difference from a baseline.

Both files are deterministic: scenarios in the suite's order, keys in a fixed order, and no
wall-clock time unless `timings=True` asks for it, so a scripted suite run twice writes the
same bytes and a report can be committed and diffed.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._load import SuiteError
from ._result import ScenarioResult, SuiteResult

__all__ = [
    "FORMAT",
    "BaselineDiff",
    "diff_baseline",
    "read_report",
    "report_data",
    "to_json",
    "to_junit",
]

FORMAT = "handrail-eval/1"
"""The JSON report's format tag (a baseline must carry it)."""


def report_data(result: SuiteResult, *, timings: bool = False) -> dict[str, Any]:
    """The JSON report as data (see `to_json`)."""
    return {
        "format": FORMAT,
        "suite": result.suite,
        "config": result.config,
        "summary": {
            "scenarios": len(result.scenarios),
            "passed": len(result.scenarios) - len(result.failed),
            "failed": len(result.failed),
        },
        "scenarios": [_scenario(s, timings) for s in result.scenarios],
    }


def _scenario(result: ScenarioResult, timings: bool) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": result.name,
        "passed": result.passed,
        "outcome": result.outcome,
        "routes": result.routes,
        "model_calls": result.model_calls,
        "tokens": result.tokens,
        "failures": [{"assertion": f.assertion, "reason": f.reason} for f in result.failures],
        "judge": result.judge,
    }
    if timings:
        data["latency_s"] = round(result.latency, 4)
    return data


def to_json(result: SuiteResult | list[SuiteResult], *, timings: bool = False) -> str:
    """The JSON report: one suite run, or (for `--compare`) the runs side by side."""
    if isinstance(result, list):
        data: dict[str, Any] = {
            "format": FORMAT,
            "compare": [report_data(r, timings=timings) for r in result],
        }
    else:
        data = report_data(result, timings=timings)
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def to_junit(results: SuiteResult | list[SuiteResult], *, timings: bool = False) -> str:
    """The JUnit XML report: a `testsuite` a run, a `testcase` a scenario."""
    runs = results if isinstance(results, list) else [results]
    root = ET.Element("testsuites", name="handrail eval")
    total = failed = 0
    for run in runs:
        name = run.suite if run.config is None else f"{run.suite} [{run.config}]"
        suite = ET.SubElement(
            root,
            "testsuite",
            name=name,
            tests=str(len(run.scenarios)),
            failures=str(len(run.failed)),
            errors="0",
            skipped="0",
        )
        if timings:
            suite.set("time", f"{sum(s.latency for s in run.scenarios):.4f}")
        for scenario in run.scenarios:
            case = ET.SubElement(suite, "testcase", classname=name, name=scenario.name)
            if timings:
                case.set("time", f"{scenario.latency:.4f}")
            if scenario.failures:
                first = scenario.failures[0]
                failure = ET.SubElement(
                    case, "failure", message=f"{first.assertion}: {first.reason}", type="eval"
                )
                failure.text = "\n".join(f"{f.assertion}: {f.reason}" for f in scenario.failures)
        total += len(run.scenarios)
        failed += len(run.failed)
    root.set("tests", str(total))
    root.set("failures", str(failed))
    root.set("errors", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, "unicode") + "\n"


@dataclass(kw_only=True, slots=True)
class BaselineDiff:
    """How a run differs from a saved report, scenario by scenario (matched by name)."""

    regressions: list[ScenarioResult] = field(default_factory=list)
    """Passed in the baseline, failed now."""
    improvements: list[ScenarioResult] = field(default_factory=list)
    """Failed in the baseline, passed now."""
    new: list[ScenarioResult] = field(default_factory=list)
    """Not in the baseline."""
    missing: list[str] = field(default_factory=list)
    """In the baseline, not in this run."""

    @property
    def changed(self) -> bool:
        """Whether anything differs."""
        return bool(self.regressions or self.improvements or self.new or self.missing)


def read_report(path: str | Path) -> dict[str, bool]:
    """A saved JSON report's scenarios: name -> passed, in its order.

    Raises:
        SuiteError: the file is missing, not JSON, or not a handrail eval report.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SuiteError(f"{path}: cannot read the baseline ({exc.strerror or exc}).") from None
    except ValueError as exc:
        raise SuiteError(f"{path}: the baseline is not JSON ({exc}).") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or "scenarios" not in data:
        raise SuiteError(
            f"{path}: not a handrail eval report (write one with `handrail eval SUITE --json "
            f"FILE`; a --compare report cannot be a baseline)."
        )
    try:
        return {str(s["name"]): bool(s["passed"]) for s in data["scenarios"]}
    except (KeyError, TypeError):
        raise SuiteError(f"{path}: a scenario of the baseline lacks its name or passed.") from None


def diff_baseline(baseline: dict[str, bool], result: SuiteResult) -> BaselineDiff:
    """Regressions, improvements, new and missing scenarios against `baseline`."""
    diff = BaselineDiff()
    for scenario in result.scenarios:
        before = baseline.get(scenario.name)
        if before is None:
            diff.new.append(scenario)
        elif before and not scenario.passed:
            diff.regressions.append(scenario)
        elif not before and scenario.passed:
            diff.improvements.append(scenario)
    names = {s.name for s in result.scenarios}
    diff.missing = [name for name in baseline if name not in names]
    return diff
