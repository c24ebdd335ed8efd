"""Evals: run the real agent on scripted or real models with mocked tools, and assert.

A suite (YAML, or Python building the same pydantic objects) lists scenarios: the user's
turns and a person's decisions on waiting calls, mocked tool outputs, the model, and what
must happen (route, tool calls, proposed calls and their decisions, captured actions,
approvals, final text, structured output, model calls, tokens, an LLM judge).
`handrail eval suite.yaml` runs it; see docs/evals.md. A suite with `kind: documents` measures
retrieval (and answers) over a folder of documents and its eval questions instead.

```python
import asyncio
from handrail.evals import load_suite, run_suite

result = asyncio.run(run_suite(load_suite("evals/support_desk.yaml")))
assert result.passed
```
"""

from __future__ import annotations

from ._check import Call, Proposal, Transcript, TurnRecord
from ._config import AgentConfig, AgentOverride, configure, load_config
from ._documents import (
    DocumentsResult,
    DocumentsSuite,
    MetricCheck,
    QuestionOutcome,
    load_documents_suite,
    run_documents_suite,
)
from ._documents_report import documents_json, documents_junit
from ._judge import Verdict
from ._load import SuiteError, load_suite
from ._match import matches, mismatch
from ._models import CountingModel, Tally
from ._report import BaselineDiff, diff_baseline, read_report, to_json, to_junit
from ._result import Failure, ScenarioResult, SuiteResult
from ._runner import run_suite
from ._suite import (
    CapturedExpectation,
    DeciderSpec,
    DecisionSpec,
    Expect,
    Judge,
    Mock,
    ModelSpec,
    ProposalExpectation,
    Scenario,
    StepPart,
    Suite,
    ToolCallExpectation,
    ToolErrorExpectation,
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
    "DeciderSpec",
    "DecisionSpec",
    "DocumentsResult",
    "DocumentsSuite",
    "Expect",
    "Failure",
    "Judge",
    "MetricCheck",
    "Mock",
    "ModelSpec",
    "Proposal",
    "ProposalExpectation",
    "QuestionOutcome",
    "Scenario",
    "ScenarioResult",
    "StepPart",
    "Suite",
    "SuiteError",
    "SuiteResult",
    "Tally",
    "ToolCallExpectation",
    "ToolErrorExpectation",
    "Transcript",
    "Turn",
    "TurnRecord",
    "UsageSpec",
    "Verdict",
    "configure",
    "diff_baseline",
    "documents_json",
    "documents_junit",
    "load_config",
    "load_documents_suite",
    "load_suite",
    "matches",
    "mismatch",
    "read_report",
    "run_documents_suite",
    "run_suite",
    "to_json",
    "to_junit",
]
