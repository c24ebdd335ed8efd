"""Reports of a documents suite run: JSON numbers, and JUnit XML (a test case a threshold).

Both are deterministic unless `timings=True`: metrics rounded to 4 places, questions in the
eval set's order, no wall-clock time. The retrieval numbers come from a deterministic
embedder and index, so they repeat from run to run on one machine.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

from ._documents import DocumentsResult, QuestionOutcome

__all__ = ["DOCUMENTS_FORMAT", "documents_data", "documents_json", "documents_junit"]

DOCUMENTS_FORMAT = "handrail-eval-documents/1"
"""The JSON report's format tag."""


def documents_data(result: DocumentsResult, *, timings: bool = False) -> dict[str, Any]:
    """The JSON report as data (see `documents_json`)."""
    data: dict[str, Any] = {
        "format": DOCUMENTS_FORMAT,
        "suite": result.suite,
        "passed": result.passed,
        "corpus": {
            "files": result.files,
            "chunks": result.chunks,
            "skipped": [{"source": s, "reason": r} for s, r in result.skipped],
        },
        "metrics": {name: _round(value) for name, value in result.metrics.items()},
        "counts": dict(result.counts),
        "checks": [
            {
                "metric": check.metric,
                "threshold": check.threshold,
                "value": _round(check.value),
                "passed": check.passed,
                "reason": check.reason,
            }
            for check in result.checks
        ],
        "notes": list(result.notes),
        "usage": {
            "input_tokens": result.input_tokens,
            "output_tokens": result.output_tokens,
            "cost_usd": None if result.cost_usd is None else round(result.cost_usd, 6),
        },
        "questions": [_question(q) for q in result.questions],
    }
    if timings:
        data["timings"] = {
            "ingest_s": round(result.ingest_seconds, 4),
            "chunks_per_s": round(result.chunks / result.ingest_seconds, 1)
            if result.ingest_seconds
            else None,
            "retrieve_ms_p50": round(result.retrieval_ms_p50, 2),
        }
    return data


def _question(outcome: QuestionOutcome) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": outcome.id,
        "kind": outcome.kind,
        "gold_ranks": outcome.gold_ranks,
        "best_relevance": _round(outcome.best_relevance),
        "evidence": outcome.evidence,
    }
    if outcome.recall:
        data["recall"] = {str(k): _round(v) for k, v in outcome.recall.items()}
        data["mrr"] = {str(k): _round(v) for k, v in outcome.mrr.items()}
        data["kept"] = outcome.kept
    if outcome.escalated is not None:
        data["answer"] = {
            "text": outcome.answer,
            "escalated": outcome.escalated,
            "citations": outcome.citations,
            "dropped_citations": outcome.dropped_citations,
            "cited_gold": outcome.cited_gold,
            "faithful": outcome.faithful,
            "confidence": _round(outcome.confidence),
            "cost_usd": None if outcome.cost_usd is None else round(outcome.cost_usd, 8),
        }
    return data


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def documents_json(result: DocumentsResult, *, timings: bool = False) -> str:
    """The JSON report: the metrics, the checks, notes, and each question's ranks and answer."""
    return json.dumps(documents_data(result, timings=timings), indent=2, ensure_ascii=False) + "\n"


def documents_junit(result: DocumentsResult, *, timings: bool = False) -> str:
    """JUnit XML: one `testcase` a threshold, failed when the number does not meet it."""
    root = ET.Element("testsuites", name="handrail eval")
    suite = ET.SubElement(
        root,
        "testsuite",
        name=result.suite,
        tests=str(len(result.checks)),
        failures=str(len(result.failed)),
        errors="0",
        skipped="0",
    )
    if timings:
        suite.set("time", f"{result.ingest_seconds:.4f}")
    for check in result.checks:
        case = ET.SubElement(suite, "testcase", classname=result.suite, name=check.metric)
        if not check.passed:
            failure = ET.SubElement(
                case, "failure", message=f"{check.metric}: {check.reason}", type="eval"
            )
            failure.text = f"{check.metric} {check.threshold}: {check.reason}"
    for key, value in (("tests", len(result.checks)), ("failures", len(result.failed))):
        root.set(key, str(value))
    root.set("errors", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, "unicode") + "\n"
