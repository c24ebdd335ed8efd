"""`handrail eval` on documents suites: the docs/ suite with the real embedder, and small ones."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from handrail.cli import app
from handrail.documents._answer import NO_EVIDENCE
from handrail.documents._embed import MiniLMEmbedder
from handrail.evals import (
    DocumentsSuite,
    ModelSpec,
    SuiteError,
    load_documents_suite,
    load_suite,
    run_documents_suite,
)
from handrail.models import ModelRequest

ROOT = Path(__file__).resolve().parents[2]
DOCS_SUITE = ROOT / "evals" / "documents" / "suite.yaml"

runner = CliRunner()


def run(*args: str | Path) -> Any:
    return runner.invoke(app, ["eval", *map(str, args)])


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def embedder() -> Iterator[MiniLMEmbedder]:
    yield MiniLMEmbedder()


def test_the_docs_suite_ingests_docs_and_reports_its_retrieval_numbers(tmp_path: Path) -> None:
    result = run(DOCS_SUITE, "--json", tmp_path / "r.json", "--junit", tmp_path / "r.xml")
    assert result.exit_code == 0, result.output
    for metric in ("recall_at_5", "recall_at_10", "mrr_at_10", "unanswerable_refused"):
        assert re.search(rf"│ {metric} +│ +[01]\.\d{{3}} │", result.stdout), result.stdout
    assert "note: answers: not measured (no model" in result.stdout
    assert "threshold(s) met, 0 missed" in result.stdout

    report = json.loads((tmp_path / "r.json").read_text())
    assert report["format"] == "handrail-eval-documents/1" and report["passed"] is True
    assert report["corpus"]["files"] == len(list((DOCS_SUITE.parent / "corpus").glob("*.md")))
    assert report["corpus"]["chunks"] > 100
    metrics = report["metrics"]
    for name in ("recall_at_5", "recall_at_10", "mrr_at_5", "mrr_at_10"):
        assert 0.0 <= metrics[name] <= 1.0
    assert metrics["recall_at_10"] >= metrics["recall_at_5"]
    assert metrics["citation_precision"] is None  # no model: not measured, not made up
    assert [c["metric"] for c in report["checks"]] == list(
        load_documents_suite(DOCS_SUITE)[0].expect
    )
    assert len(report["questions"]) >= 40 and "timings" not in report
    assert 'failures="0"' in (tmp_path / "r.xml").read_text()


# -- a small corpus -----------------------------------------------------------------------------

REFUNDS = """\
# Refunds

Refunds go back to the card you paid with. The money reaches your card within 5 to 10
business days of the refund.

Store credit never expires and can be spent on anything in the shop.
"""
DAMAGE = """\
# Damaged items

An item that arrives damaged is refunded in full. Send photos of the damage to the support
team within 30 days of delivery.
"""
QUESTIONS = """\
questions:
  - id: refund-delay
    kind: single
    question: How long until a refund shows up on my card?
    gold: [{source: refunds.md, quote: "reaches your card within 5 to 10"}]
  - id: damaged-and-refund-delay
    kind: multi
    question: My parcel arrived broken. Will I get my money back, and how long will it take?
    gold:
      - {source: damage.md, quote: "An item that arrives damaged is refunded in full"}
      - {source: refunds.md, quote: "reaches your card within 5 to 10"}
  - id: volcano
    kind: unanswerable
    question: What is the tallest volcano in the solar system?
"""


def small_suite(folder: Path, expect: str, extra: str = "") -> Path:
    write(folder / "corpus" / "refunds.md", REFUNDS)
    write(folder / "corpus" / "damage.md", DAMAGE)
    write(folder / "questions.yaml", QUESTIONS)
    return write(
        folder / "suite.yaml",
        f"kind: documents\ncorpus: corpus\nquestions: questions.yaml\ntop_k: 2\n{extra}"
        f"expect:\n{textwrap.indent(textwrap.dedent(expect), '  ')}",
    )


def test_a_missed_threshold_exits_1_and_says_which(tmp_path: Path) -> None:
    suite = small_suite(
        tmp_path,
        """\
        recall_at_10: ">= 0.5"
        mrr_at_3: "> 1"
        citation_precision: ">= 0.9"
        """,
    )
    result = run(suite, "--junit", tmp_path / "j.xml", "--json", tmp_path / "r.json", "--timings")
    assert result.exit_code == 1, result.output
    assert re.search(r"│ mrr_at_3 +│ +1\.000 │ +│ > 1 +│ FAIL", result.stdout), result.stdout
    assert "FAIL mrr_at_3: 1 is not > 1" in result.stdout
    assert "FAIL citation_precision: answers: not measured (no model" in result.stdout
    assert "1 threshold(s) met, 2 missed" in result.stdout
    junit = (tmp_path / "j.xml").read_text()
    assert 'tests="3" failures="2"' in junit and 'name="recall_at_10"' in junit
    report = json.loads((tmp_path / "r.json").read_text())
    assert [c["passed"] for c in report["checks"]] == [True, False, False]
    assert report["timings"]["ingest_s"] > 0 and report["timings"]["retrieve_ms_p50"] > 0


@pytest.mark.parametrize(
    ("expect", "message"),
    [
        ('recal_at_5: ">= 0.8"', "expect: recal_at_5: no such metric (known: recall_at_K"),
        ("recall_at_5: 0.8", "expect: recall_at_5: 0.8 is not a threshold; write it as"),
    ],
)
def test_a_bad_expectation_is_one_error_naming_it(
    tmp_path: Path, expect: str, message: str
) -> None:
    suite = small_suite(tmp_path, expect)
    result = run(suite)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {suite}: {message}"), result.stderr


def test_documents_suites_and_scenario_suites_are_told_apart(tmp_path: Path) -> None:
    suite = small_suite(tmp_path, 'recall_at_5: ">= 0.5"')
    with pytest.raises(SuiteError, match=r"a documents suite \(kind: documents\): run it with"):
        load_suite(suite)
    result = run(suite, "--baseline", tmp_path / "b.json")
    assert result.exit_code == 1
    assert "--baseline and --compare are for suites of scenarios" in result.stderr
    odd = write(tmp_path / "odd.yaml", "kind: document\n")
    result = run(odd)
    assert result.exit_code == 1
    assert "kind: 'document' is not a kind of suite" in result.stderr
    nowhere = write(tmp_path / "nowhere.yaml", "kind: documents\ncorpus: nope\nquestions: q\n")
    result = run(nowhere)
    assert result.exit_code == 1
    assert "corpus: " in result.stderr and "is not a folder of documents" in result.stderr


# -- answers ------------------------------------------------------------------------------------

_EXCERPT = re.compile(r"^\[(\d+)\] [^\n]*\n<excerpt>\n(.*?)\n</excerpt>", re.M | re.S)


def cite_first_sentence(request: ModelRequest) -> str:
    """An answering model: cites the first sentence of excerpt 1, plus one quote it made up."""
    prompt = request.messages[-1].text
    if NO_EVIDENCE in prompt:
        return json.dumps({"answer": "The documents do not say.", "answerable": False})
    number, text = _EXCERPT.findall(prompt)[0]
    body = text.split("\n\n")[-1]
    sentence = body.split(". ")[0].replace("\n", " ")
    return json.dumps(
        {
            "answer": sentence,
            "citations": [
                {"excerpt": int(number), "quote": sentence},
                {"excerpt": int(number), "quote": "words that are in no excerpt at all"},
            ],
            "answerable": True,
        }
    )


async def test_answers_are_measured_with_a_model_and_judged_with_a_judge(
    tmp_path: Path, embedder: MiniLMEmbedder
) -> None:
    path = small_suite(tmp_path, 'citation_precision: "== 0.5"\nfaithfulness: ">= 1"')
    loaded, questions = load_documents_suite(path)
    suite = loaded.model_copy(
        update={
            "model": ModelSpec(function=cite_first_sentence),
            "judge_model": ModelSpec.model_validate(
                {"scripted": [{"output": {"passed": True, "reason": "it says what it cites"}}]}
            ),
        }
    )
    assert isinstance(suite, DocumentsSuite)
    result = await run_documents_suite(suite, questions, embedder=embedder)

    assert result.passed, result.checks
    metrics = result.metrics
    assert metrics["citation_precision"] == 0.5  # one verified, one made up, each answer
    assert metrics["escalated_unanswerable"] == 1.0  # no evidence: "the documents do not say"
    assert result.counts["citation_precision"] == "2/4"
    assert result.counts["faithfulness"] == "2/2"  # both answered questions were judged
    volcano = result.questions[2]
    assert (volcano.id, volcano.evidence, volcano.escalated) == ("volcano", 0, True)
    assert volcano.faithful is None  # an escalated answer is not judged
    assert all(q.citations == 1 and q.dropped_citations == 1 for q in result.questions[:2])
    # Confidence: both answerable questions above the unanswerable one (escalated at 0).
    assert metrics["confidence_auroc"] == 1.0 and result.counts["confidence_auroc"] == "2 vs 1"
    assert volcano.confidence == 0.0
    assert result.cost_usd is None  # a function model has no price: none made up


async def test_without_a_judge_faithfulness_is_not_measured(
    tmp_path: Path, embedder: MiniLMEmbedder
) -> None:
    path = small_suite(tmp_path, 'faithfulness: ">= 0.5"', "model: {function: x.y:z}\n")
    loaded, questions = load_documents_suite(path)
    suite = loaded.model_copy(update={"model": ModelSpec(function=cite_first_sentence)})
    result = await run_documents_suite(suite, questions, embedder=embedder)
    (check,) = result.checks
    assert not check.passed and check.value is None
    assert check.reason.startswith("faithfulness: not measured (no judge")


def test_the_offline_extractive_model_can_be_named_in_a_suite(tmp_path: Path) -> None:
    model = 'model: {function: "handrail.documents.testing:extractive_reply"}\n'
    suite = small_suite(
        tmp_path,
        """\
        citation_precision: "== 1"
        escalated_unanswerable: "== 1"
        """,
        extra=model,
    )
    result = run(suite, "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    metrics = report["metrics"]
    assert metrics["citation_precision"] == 1.0  # every quote it gives is in its excerpt
    assert metrics["escalated_unanswerable"] == 1.0  # nothing on volcanoes: it says so
    # What it answers, it answers from a gold passage.
    assert metrics["gold_citation_precision"] == 1.0
    refund, broken, volcano = (q["answer"] for q in report["questions"])
    assert refund["cited_gold"] is True and refund["confidence"] > 0
    # "Arrived broken" is worded unlike "arrives damaged": it knows no synonyms, and says the
    # documents do not answer, at confidence 0, tied with the volcano: the tie counts half.
    assert broken["escalated"] and broken["confidence"] == volcano["confidence"] == 0.0
    assert metrics["confidence_auroc"] == 0.75
    assert report["usage"] == {"input_tokens": 0, "output_tokens": 0, "cost_usd": None}
