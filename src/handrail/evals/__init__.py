"""Evals: run the real agent on scripted or real models with mocked tools, and assert.

A suite (YAML, or Python building the same pydantic objects) lists scenarios: the user's
turns, mocked tool outputs, the model, and what must happen (route, tool calls, captured
actions, approvals, final text, structured output, model calls, tokens, an LLM judge).
`handrail eval suite.yaml` runs it; see docs/evals.md.

```python
import asyncio
from handrail.evals import load_suite, run_suite

result = asyncio.run(run_suite(load_suite("evals/support_desk.yaml")))
assert result.passed
```
"""

from __future__ import annotations

from ._check import Call, Transcript, TurnRecord
from ._config import AgentConfig, AgentOverride, configure, load_config
from ._judge import Verdict
from ._load import SuiteError, load_suite
from ._match import matches, mismatch
from ._models import CountingModel, Tally
from ._report import BaselineDiff, diff_baseline, read_report, to_json, to_junit
from ._result import Failure, ScenarioResult, SuiteResult
from ._runner import run_suite
from ._suite import (
    CapturedExpectation,
    Expect,
    Judge,
    Mock,
    ModelSpec,
    Scenario,
    StepPart,
    Suite,
    ToolCallExpectation,
    Turn,
    UsageSpec,
)

__all__ = [
    "AgentConfig",
    "AgentOverride",
    "BaselineDiff",
    "Call",
    "CapturedExpectation",
    "CountingModel",
    "Expect",
    "Failure",
    "Judge",
    "Mock",
    "ModelSpec",
    "Scenario",
    "ScenarioResult",
    "StepPart",
    "Suite",
    "SuiteError",
    "SuiteResult",
    "Tally",
    "ToolCallExpectation",
    "Transcript",
    "Turn",
    "TurnRecord",
    "UsageSpec",
    "Verdict",
    "configure",
    "diff_baseline",
    "load_config",
    "load_suite",
    "matches",
    "mismatch",
    "read_report",
    "run_suite",
    "to_json",
    "to_junit",
]
