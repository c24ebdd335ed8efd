"""Documents suites: how well retrieval, and answers, do on a folder and its eval questions.

A suite file with `kind: documents` names a folder of documents (the corpus), an eval set of
questions (see `handrail.documents._metrics`), and thresholds the numbers must meet:

```yaml
kind: documents
name: docs
corpus: ../../docs            # relative to this file
questions: questions.yaml     # relative to this file
top_k: 5                      # evidence a question gets (recall@top_k is always measured)
min_relevance: 0.5            # the refusal threshold
model: {function: "myapp.testing:answer"}   # optional: the answering model
judge_model: openai:gpt-4o-mini             # optional: faithfulness (default: model, if real)
expect:
  recall_at_5: ">= 0.8"
  mrr_at_10: ">= 0.6"
  unanswerable_refused: ">= 0.7"
```

`run_documents_suite` ingests the corpus into a fresh index in a temporary folder (MiniLM
embeddings, an embedded Chroma), then for each question:

- ranks: `Library.retrieve(question, top_k=k, min_relevance=0)` for each
  cut-off k (the suite's `top_k`, 10, and any `recall_at_K`/`mrr_at_K` expected), scored by
  recall@k and MRR@k;
- refusal: `Library.retrieve(question, top_k=top_k, min_relevance=min_relevance)`, as an
  answering agent would call it: an unanswerable question with no evidence is refused, an
  answerable one whose evidence holds a gold passage is kept;
- with a `model`: `Answerer(library, model).answer(question)` (a fresh model a question, as
  eval scenarios get): citation precision, escalations, whether it cites a gold chunk, and,
  with a judge model, faithfulness (the evals' LLM judge reads the answer beside the chunks
  it cites).

Metrics (`expect` keys): `recall_at_K`, `mrr_at_K`, `unanswerable_refused`, `answerable_kept`,
`answerable_emptied`, `citation_precision`, `escalated_unanswerable`, `escalated_answerable`,
`cited_gold`, `faithfulness`. A threshold is `">= 0.8"` (or `>`, `<=`, `<`, `==`). A metric
that was not measured (no model, no judge) fails its threshold, saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from ..documents._metrics import (
    Question,
    citation_precision,
    cites_gold,
    escalation_rate,
    gold_ranks,
    is_gold,
    load_questions,
    mean_mrr_at,
    mean_recall_at,
    mrr_at,
    recall_at,
    refusal_at,
)
from ._judge import judge
from ._load import SuiteError, read_yaml, validate
from ._models import Tally, build_model, close
from ._suite import ModelSpec, _Strict

if TYPE_CHECKING:
    from ..documents._answer import DocumentAnswer
    from ..documents._embed import Embedder
    from ..documents._library import Evidence, IngestProgress, Library
    from ..documents._types import Chunk

__all__ = [
    "DocumentsResult",
    "DocumentsSuite",
    "MetricCheck",
    "QuestionOutcome",
    "load_documents_suite",
    "run_documents_suite",
]

_FIXED_METRICS = (
    "unanswerable_refused",
    "answerable_kept",
    "answerable_emptied",
    "citation_precision",
    "escalated_unanswerable",
    "escalated_answerable",
    "cited_gold",
    "faithfulness",
)
_RANKED = re.compile(r"^(recall|mrr)_at_([1-9][0-9]?)$")
_THRESHOLD = re.compile(r"^\s*(>=|<=|==|>|<)\s*(-?[0-9]*\.?[0-9]+)\s*$")
_ALWAYS_RANKED = 10
"""Recall and MRR are always measured at 10 (and at the suite's top_k)."""
FAITHFUL = (
    "Judge faithfulness only. The agent answered from a company's documents; the chunks it "
    "cited are shown after its answer. Pass when every claim of the answer is stated in the "
    "cited chunks; fail when the answer adds, changes or contradicts a fact they state. Do not "
    "judge completeness or style."
)
"""The rubric of the faithfulness judge."""

Stage = Literal["ingest", "retrieve", "answer", "judge"]
"""What `run_documents_suite` is doing, for a progress bar."""


class DocumentsSuite(_Strict):
    """A documents suite: a corpus, its eval questions, and the thresholds to meet."""

    kind: Literal["documents"]
    """Marks the file as a documents suite (agent suites have no `kind`)."""
    name: str | None = None
    """The suite's name in reports (default: the file's stem)."""
    corpus: Path
    """The folder of documents, relative to the suite file (ingested whole)."""
    questions: Path
    """The eval set (YAML), relative to the suite file."""
    top_k: int = Field(default=5, ge=1, le=50)
    """Evidence a question gets: the cut-off of the refusal check and of the answers."""
    min_relevance: float = Field(default=0.5, ge=0.0, le=1.0)
    """Evidence below this relevance is dropped (the refusal threshold)."""
    target_tokens: int = Field(default=200, ge=1)
    """The chunker's target size."""
    overlap: int = Field(default=200, ge=0)
    """Characters each chunk repeats from the one before."""
    model: ModelSpec | None = None
    """The answering model; without one, answers are not measured."""
    judge_model: ModelSpec | None = None
    """The faithfulness judge (default: `model`, when it is a real model)."""
    concurrency: int = Field(default=4, ge=1)
    """Questions answered at once."""
    expect: dict[str, str] = Field(default_factory=dict)
    """Metric -> threshold (`">= 0.8"`); each is one check."""

    @field_validator("expect", mode="before")
    @classmethod
    def _thresholds(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value  # pydantic says what is wrong
        for metric, threshold in value.items():
            if metric not in _FIXED_METRICS and not _RANKED.match(metric):
                known = ", ".join(["recall_at_K", "mrr_at_K", *_FIXED_METRICS])
                raise ValueError(f"{metric}: no such metric (known: {known}; K from 1 to 99)")
            if not isinstance(threshold, str) or not _THRESHOLD.match(threshold):
                raise ValueError(
                    f'{metric}: {threshold!r} is not a threshold; write it as ">= 0.8" '
                    f"(or >, <=, <, ==)"
                )
        return value

    def cutoffs(self) -> list[int]:
        """The rank cut-offs measured: top_k, 10, and those `expect` names."""
        found = {self.top_k, _ALWAYS_RANKED}
        for metric in self.expect:
            if match := _RANKED.match(metric):
                found.add(int(match.group(2)))
        return sorted(found)


def load_documents_suite(path: str | Path) -> tuple[DocumentsSuite, list[Question]]:
    """A documents suite and its questions, with `corpus` and `questions` made absolute.

    Raises:
        SuiteError: the file is missing or malformed, or its corpus is not a folder.
        ConfigError: the questions file is missing or malformed (names the question).
    """
    path = Path(path)
    if not path.exists():
        raise SuiteError(f"{path}: no such suite file.")
    suite = validate(DocumentsSuite, read_yaml(path), str(path))
    base = path.parent
    suite = suite.model_copy(
        update={
            "name": suite.name or path.stem,
            "corpus": (base / suite.corpus).resolve(),
            "questions": (base / suite.questions).resolve(),
        }
    )
    if not suite.corpus.is_dir():
        raise SuiteError(f"{path}: corpus: {suite.corpus} is not a folder of documents.")
    return suite, load_questions(suite.questions)


# -- results -----------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class QuestionOutcome:
    """What happened to one question."""

    id: str
    kind: str
    gold_ranks: list[int | None]
    """Each gold passage's rank in the deepest ranking (None: not in it)."""
    recall: dict[int, float] = field(default_factory=dict)
    """Cut-off -> recall (answerable questions only)."""
    mrr: dict[int, float] = field(default_factory=dict)
    """Cut-off -> reciprocal rank (answerable questions only)."""
    best_relevance: float | None = None
    """The highest relevance among the deepest ranking's chunks."""
    evidence: int = 0
    """Evidence items at the refusal threshold (0: refused)."""
    kept: bool | None = None
    """A gold passage is among that evidence (answerable questions only)."""
    escalated: bool | None = None
    """The answer escalated (None: no answer was asked for)."""
    citations: int | None = None
    dropped_citations: int | None = None
    cited_gold: bool | None = None
    faithful: bool | None = None
    """The judge's verdict (None: not judged)."""
    answer: str | None = None


@dataclass(kw_only=True, slots=True)
class MetricCheck:
    """One `expect` threshold and whether the measured value meets it."""

    metric: str
    threshold: str
    value: float | None
    passed: bool
    reason: str
    """Why it failed (or `0.83 >= 0.8` when it passed)."""


@dataclass(kw_only=True, slots=True)
class DocumentsResult:
    """The numbers of a documents suite run."""

    suite: str
    corpus: str
    files: int
    chunks: int
    questions: list[QuestionOutcome]
    metrics: dict[str, float | None]
    """Metric -> value (None: not measured), in report order."""
    counts: dict[str, str] = field(default_factory=dict)
    """Metric -> the counts behind it (`9/14`), where it is a share."""
    checks: list[MetricCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What was skipped and why, and gold passages no chunk holds."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """Files ingest could not read, with the reason."""
    ingest_seconds: float = 0.0
    retrieval_ms_p50: float = 0.0
    """Median latency of one `Library.retrieve` call."""

    @property
    def passed(self) -> bool:
        """Whether every threshold was met."""
        return all(check.passed for check in self.checks)

    @property
    def failed(self) -> list[MetricCheck]:
        """The thresholds that were not met."""
        return [check for check in self.checks if not check.passed]


# -- running -----------------------------------------------------------------------------------


async def run_documents_suite(
    suite: DocumentsSuite,
    questions: Sequence[Question],
    *,
    embedder: Embedder | None = None,
    concurrency: int | None = None,
    on_progress: Callable[[Stage, int, int], None] | None = None,
) -> DocumentsResult:
    """Ingest the suite's corpus into a temporary index, measure, and check the thresholds.

    Args:
        suite: the suite (from `load_documents_suite`: its paths absolute).
        questions: its questions.
        embedder: the embedder (default: a new `MiniLMEmbedder`).
        concurrency: questions answered at once (default: the suite's).
        on_progress: called with (stage, done, total) as the run goes.

    Raises:
        ConfigError: the suite's model cannot be made (a missing key or extra).
        DocumentIndexError: the embedder or the index failed.
    """
    from ..documents._embed import MiniLMEmbedder
    from ..documents._library import Library

    tell = on_progress or _quiet
    where = str(suite.name)
    embedder = embedder if embedder is not None else MiniLMEmbedder()
    with tempfile.TemporaryDirectory(prefix="handrail-eval-") as folder:
        library = Library.open(
            folder,
            embedder=embedder,
            target_tokens=suite.target_tokens,
            overlap=suite.overlap,
        )
        async with library:

            def ingested(progress: IngestProgress) -> None:
                tell("ingest", progress.done, progress.total)

            report = await library.ingest(suite.corpus, progress=ingested)
            chunks = await library.index.chunks()
            result = DocumentsResult(
                suite=where,
                corpus=str(suite.corpus),
                files=report.files,
                chunks=len(chunks),
                questions=[],
                metrics={},
                skipped=list(report.skipped),
                ingest_seconds=report.seconds,
            )
            result.notes += _unfindable(questions, chunks)
            retrieved = await _retrieval(suite, questions, library, result, tell)
            answers = await _answers(suite, questions, library, result, concurrency, tell, where)
    _score(suite, questions, result, retrieved, answers)
    result.checks = [_check(metric, text, result) for metric, text in suite.expect.items()]
    return result


def _quiet(stage: Stage, done: int, total: int) -> None:
    pass


def _unfindable(questions: Sequence[Question], chunks: Sequence[Chunk]) -> list[str]:
    """Notes for gold passages that no chunk holds whole (they can never be retrieved)."""
    notes = []
    for question in questions:
        for passage in question.gold:
            if not any(is_gold(chunk, passage) for chunk in chunks):
                notes.append(
                    f"question {question.id!r}: no chunk of {passage.source} holds the quote "
                    f"{passage.quote!r} whole (it counts as not found)"
                )
    return notes


@dataclass(slots=True)
class _Retrieved:
    rankings: dict[int, list[list[Chunk]]]
    """Cut-off k -> each question's chunks from `retrieve(top_k=k, min_relevance=0)`."""
    evidence: list[list[Evidence]]
    """Each question's evidence at the refusal threshold."""


async def _retrieval(
    suite: DocumentsSuite,
    questions: Sequence[Question],
    library: Library,
    result: DocumentsResult,
    tell: Callable[[Stage, int, int], None],
) -> _Retrieved:
    """Rank and retrieve for each question, filling in its outcome."""
    cutoffs = suite.cutoffs()
    deepest = cutoffs[-1]
    latencies: list[float] = []
    retrieved = _Retrieved({k: [] for k in cutoffs}, [])
    for done, question in enumerate(questions, 1):
        ranked: dict[int, list[Evidence]] = {}
        for k in cutoffs:
            began = time.perf_counter()
            ranked[k] = await library.retrieve(
                question.question, top_k=k, min_relevance=0.0
            )
            latencies.append(time.perf_counter() - began)
        began = time.perf_counter()
        evidence = await library.retrieve(
            question.question, top_k=suite.top_k, min_relevance=suite.min_relevance
        )
        latencies.append(time.perf_counter() - began)
        retrieved.evidence.append(evidence)
        for k in cutoffs:
            retrieved.rankings[k].append([item.chunk for item in ranked[k]])
        deep = retrieved.rankings[deepest][-1]
        outcome = QuestionOutcome(
            id=question.id,
            kind=question.kind,
            gold_ranks=gold_ranks(deep, question.gold),
            best_relevance=max((item.relevance for item in ranked[deepest]), default=None),
            evidence=len(evidence),
        )
        if question.gold:
            for k in cutoffs:
                chunks = retrieved.rankings[k][-1]
                outcome.recall[k] = recall_at(k, chunks, question.gold)
                outcome.mrr[k] = mrr_at(k, chunks, question.gold)
            outcome.kept = any(
                rank is not None
                for rank in gold_ranks([item.chunk for item in evidence], question.gold)
            )
        result.questions.append(outcome)
        tell("retrieve", done, len(questions))
    result.retrieval_ms_p50 = statistics.median(latencies) * 1000 if latencies else 0.0
    return retrieved


@dataclass(slots=True)
class _Answers:
    answers: list[DocumentAnswer | None]
    """One a question (None: answering raised)."""
    chunks: dict[str, Chunk]
    """The cited chunks, by id."""
    judged: bool


async def _answers(
    suite: DocumentsSuite,
    questions: Sequence[Question],
    library: Library,
    result: DocumentsResult,
    concurrency: int | None,
    tell: Callable[[Stage, int, int], None],
    where: str,
) -> _Answers | None:
    if suite.model is None:
        result.notes.append("answers: not measured (no model: set `model:` in the suite)")
        return None
    from ..documents._answer import Answerer

    spec = suite.model
    await close(build_model(spec, Tally(), where))  # a model that cannot be made fails here
    limit = asyncio.Semaphore(concurrency or suite.concurrency)
    answers: list[DocumentAnswer | None] = [None] * len(questions)
    failures: list[str | None] = [None] * len(questions)
    done = 0

    async def one(index: int, question: Question) -> None:
        nonlocal done
        async with limit:
            model = build_model(spec, Tally(), f"{where}: question {question.id!r}")
            try:
                answers[index] = await Answerer(
                    library, model, top_k=suite.top_k, min_relevance=suite.min_relevance
                ).answer(question.question)
            except Exception as error:  # one question's failure is reported, not fatal
                failures[index] = (
                    f"question {question.id!r}: answering failed: {type(error).__name__}: {error}"
                )
            finally:
                with contextlib.suppress(Exception):
                    await close(model)
        done += 1
        tell("answer", done, len(questions))

    async with asyncio.TaskGroup() as group:
        for index, question in enumerate(questions):
            group.create_task(one(index, question))
    result.notes += [failure for failure in failures if failure is not None]
    ids = sorted({c.chunk_id for a in answers if a is not None for c in a.citations})
    chunks = {chunk.id: chunk for chunk in await library.index.get(ids)}
    judged = await _faithfulness(suite, questions, answers, chunks, result, limit, tell, where)
    return _Answers(answers, chunks, judged)


async def _faithfulness(
    suite: DocumentsSuite,
    questions: Sequence[Question],
    answers: list[DocumentAnswer | None],
    chunks: Mapping[str, Chunk],
    result: DocumentsResult,
    limit: asyncio.Semaphore,
    tell: Callable[[Stage, int, int], None],
    where: str,
) -> bool:
    """Ask the judge about each answer that cites something; whether a judge was there."""
    spec = suite.judge_model
    if spec is None and suite.model is not None and suite.model.name is not None:
        spec = suite.model
    if spec is None:
        result.notes.append(
            "faithfulness: not measured (no judge: set `judge_model:`, or a real `model:`)"
        )
        return False
    judge_spec = spec
    await close(build_model(judge_spec, Tally(), where))  # fails here if it cannot be made
    todo = [
        (index, answer)
        for index, answer in enumerate(answers)
        if answer is not None and not answer.escalated and answer.citations
    ]
    done = 0

    async def one(index: int, answer: DocumentAnswer) -> None:
        nonlocal done
        question = questions[index]
        cited = [chunks[c.chunk_id] for c in answer.citations if c.chunk_id in chunks]
        shown = "\n\n".join(f"[{chunk.source}]\n{chunk.text}" for chunk in cited)
        text = f"{answer.answer}\n\nCited chunks:\n\n{shown}"
        async with limit:
            model = build_model(judge_spec, Tally(), f"{where}: judge of {question.id!r}")
            try:
                verdict = await judge(FAITHFUL, [(question.question, text)], [], model)
            finally:
                with contextlib.suppress(Exception):
                    await close(model)
        result.questions[index].faithful = verdict.passed
        done += 1
        tell("judge", done, len(todo))

    async with asyncio.TaskGroup() as group:
        for index, answer in todo:
            group.create_task(one(index, answer))
    return True


# -- scoring -----------------------------------------------------------------------------------


def _score(
    suite: DocumentsSuite,
    questions: Sequence[Question],
    result: DocumentsResult,
    retrieved: _Retrieved,
    answered: _Answers | None,
) -> None:
    outcomes = result.questions
    metrics = result.metrics
    for k, ranked in retrieved.rankings.items():
        runs = list(zip(ranked, (q.gold for q in questions), strict=True))
        metrics[f"recall_at_{k}"] = mean_recall_at(k, runs)
        metrics[f"mrr_at_{k}"] = mean_mrr_at(k, runs)
    refusal = refusal_at(
        suite.min_relevance,
        [(evidence, q.gold) for evidence, q in zip(retrieved.evidence, questions, strict=True)],
    )
    metrics["unanswerable_refused"] = refusal.refused_rate
    result.counts["unanswerable_refused"] = f"{refusal.refused}/{refusal.unanswerable}"
    metrics["answerable_kept"] = refusal.kept_rate
    result.counts["answerable_kept"] = f"{refusal.kept}/{refusal.answerable}"
    metrics["answerable_emptied"] = (
        refusal.emptied / refusal.answerable if refusal.answerable else None
    )
    result.counts["answerable_emptied"] = f"{refusal.emptied}/{refusal.answerable}"
    if answered is None:
        for name in _FIXED_METRICS[3:]:
            metrics[name] = None
        return
    pairs = [
        (a, q, o)
        for a, q, o in zip(answered.answers, questions, outcomes, strict=True)
        if a is not None
    ]
    for answer, question, outcome in pairs:
        outcome.escalated = answer.escalated
        outcome.citations = len(answer.citations)
        outcome.dropped_citations = answer.dropped_citations
        outcome.answer = answer.answer
        if question.gold:
            outcome.cited_gold = cites_gold(answer, question.gold, answered.chunks)
    metrics["citation_precision"] = citation_precision(a for a, _, _ in pairs)
    verified = sum(len(a.citations) for a, _, _ in pairs)
    given = verified + sum(a.dropped_citations for a, _, _ in pairs)
    result.counts["citation_precision"] = f"{verified}/{given}"
    for name, answerable in (("escalated_unanswerable", False), ("escalated_answerable", True)):
        chosen = [a for a, q, _ in pairs if q.answerable == answerable]
        metrics[name] = escalation_rate(chosen)
        result.counts[name] = f"{sum(a.escalated for a in chosen)}/{len(chosen)}"
    flags = [o.cited_gold for _, q, o in pairs if q.answerable and o.cited_gold is not None]
    metrics["cited_gold"] = sum(flags) / len(flags) if flags else None
    result.counts["cited_gold"] = f"{sum(flags)}/{len(flags)}"
    verdicts = [o.faithful for o in outcomes if o.faithful is not None]
    metrics["faithfulness"] = sum(verdicts) / len(verdicts) if verdicts else None
    if answered.judged:
        result.counts["faithfulness"] = f"{sum(verdicts)}/{len(verdicts)}"


def _check(metric: str, threshold: str, result: DocumentsResult) -> MetricCheck:
    value = result.metrics.get(metric)
    if value is None:
        why = next((n for n in result.notes if n.startswith(_topic(metric))), "not measured")
        return MetricCheck(metric=metric, threshold=threshold, value=None, passed=False, reason=why)
    match = _THRESHOLD.match(threshold)
    assert match is not None  # checked when the suite was loaded
    op, limit = match.group(1), float(match.group(2))
    passed = {
        ">=": value >= limit,
        "<=": value <= limit,
        "==": value == limit,
        ">": value > limit,
        "<": value < limit,
    }[op]
    shown = f"{value:.4g} {op} {limit:g}"
    reason = shown if passed else f"{value:.4g} is not {op} {limit:g}"
    return MetricCheck(
        metric=metric, threshold=threshold, value=value, passed=passed, reason=reason
    )


def _topic(metric: str) -> str:
    return "faithfulness" if metric == "faithfulness" else "answers"
