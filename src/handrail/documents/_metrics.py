"""Measuring the documents: how well retrieval finds the passages, how honest the answers are.

An eval set is a YAML file of questions (`load_questions`), each answerable from one passage
or from several, or not at all from the documents:

```yaml
questions:
  - id: write-tools-need-approval
    kind: single          # single | multi | unanswerable
    question: Will a person have to approve a tool that changes data?
    gold:
      - {source: tools.md, quote: "`write` and `destructive` default to `required`"}
```

A gold passage names its file (`source`, as ingest names it: the path relative to the
ingested folder) and a quote of five words or more copied from it. A chunk is gold when it
comes from that file and contains the quote, whitespace aside, so the set survives
re-chunking.

Retrieval (over chunks in rank order, best first):

- `recall_at(k, ...)`: the share of a question's gold passages found in its first `k` chunks
  (0 or 1 for a question of one passage);
- `mrr_at(k, ...)`: 1 / the rank of the first gold chunk within the first `k` (0 if none);
- `refusal_at(threshold, ...)`: with the evidence below `threshold` relevance dropped, how
  many unanswerable questions are left with no evidence at all (refused), and how many
  answerable ones still have a gold passage (kept).

Answers (`DocumentAnswer`s, or anything with the same attributes):

- `citation_precision`: verified citations over all the citations the model gave (a dropped
  citation is one whose quote was not in the excerpt it cited);
- `escalation_rate`: the share of answers that escalated to a person (on unanswerable
  questions, higher is better; on answerable ones, lower);
- `cites_gold`: whether an answer cites a gold chunk;
- `gold_citation_precision`: of the questions answered (not escalated), the share whose
  citations hold a gold passage (citation precision against the gold, where
  `citation_precision` is against the excerpts);
- `auroc`: how well a score (an answer's confidence) separates two classes (answerable from
  unanswerable questions), exactly, ties counted half.

The averages (`mean_recall_at`, `mean_mrr_at`) and the answer metrics return None when there
is nothing to measure (no answerable question, no citation), never a made-up number.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..exceptions import ConfigError

__all__ = [
    "Answered",
    "Cited",
    "GoldPassage",
    "Passage",
    "Question",
    "QuestionKind",
    "QuestionSet",
    "Refusal",
    "Run",
    "Scored",
    "auroc",
    "citation_precision",
    "cites_gold",
    "escalation_rate",
    "gold_citation_precision",
    "gold_ranks",
    "is_gold",
    "load_questions",
    "mean_mrr_at",
    "mean_recall_at",
    "mrr_at",
    "recall_at",
    "refusal_at",
]

QuestionKind = Literal["single", "multi", "unanswerable"]
"""One passage answers it; it needs two or more; the documents do not answer it."""

_MIN_QUOTE_WORDS = 5


# -- what the metrics read ---------------------------------------------------------------------


class Passage(Protocol):
    """A retrieved chunk, as far as the metrics care (`Chunk` is one)."""

    @property
    def source(self) -> str:
        """The file it comes from, relative to the ingested folder."""
        ...

    @property
    def text(self) -> str:
        """Its text."""
        ...


class Scored(Protocol):
    """A chunk with its relevance (`Evidence` is one)."""

    @property
    def chunk(self) -> Passage:
        """The chunk."""
        ...

    @property
    def relevance(self) -> float:
        """0 (noise) to 1 (evidence)."""
        ...


class Cited(Protocol):
    """A verified citation (`Citation` is one)."""

    @property
    def chunk_id(self) -> str:
        """The id of the chunk it quotes."""
        ...


class Answered(Protocol):
    """An answer (`DocumentAnswer` is one)."""

    @property
    def citations(self) -> Sequence[Cited]:
        """The citations whose quotes were found in the chunks they cite."""
        ...

    @property
    def dropped_citations(self) -> int:
        """Citations the model gave whose quotes were not found."""
        ...

    @property
    def escalated(self) -> bool:
        """Whether the question was handed to a person."""
        ...


# -- the eval set ------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GoldPassage(_Strict):
    """A passage that answers (part of) a question: a file, and a quote from it."""

    source: str = Field(min_length=1)
    """The file, relative to the ingested folder, with `/` (`tools.md`, `policies/refunds.md`)."""
    quote: str
    """Five words or more, copied from the file (whitespace aside)."""

    @field_validator("quote")
    @classmethod
    def _long_enough(cls, value: str) -> str:
        if len(value.split()) < _MIN_QUOTE_WORDS:
            raise ValueError(
                f"a quote of {_MIN_QUOTE_WORDS} words or more, so that it picks out one "
                f"passage (got {len(value.split())}: {value!r})"
            )
        return value


class Question(_Strict):
    """One question of the eval set, with the passages that answer it."""

    id: str = Field(min_length=1)
    """Names it in reports (unique in its set)."""
    question: str = Field(min_length=1)
    """As a user would ask it."""
    kind: QuestionKind
    """`single`: one passage answers it; `multi`: it needs two or more; `unanswerable`: the
    documents do not answer it."""
    gold: tuple[GoldPassage, ...] = ()
    """The passages it needs: one for `single`, two or more for `multi`, none for
    `unanswerable`."""
    reworded: bool = False
    """The answer's passage says it in other words than the question's (few words in
    common): the case keyword search alone misses. Reports break results down by it."""

    @model_validator(mode="after")
    def _gold_fits_kind(self) -> Question:
        count = len(self.gold)
        if self.kind == "single" and count != 1:
            raise ValueError(f"a single-passage question has exactly 1 gold passage, not {count}")
        if self.kind == "multi" and count < 2:
            raise ValueError(f"a multi-passage question has 2 gold passages or more, not {count}")
        if self.kind == "unanswerable" and count:
            raise ValueError("an unanswerable question has no gold passages")
        return self

    @property
    def answerable(self) -> bool:
        """Whether the documents answer it."""
        return self.kind != "unanswerable"


class QuestionSet(_Strict):
    """An eval set: the file `load_questions` reads."""

    questions: tuple[Question, ...]

    @model_validator(mode="after")
    def _unique(self) -> QuestionSet:
        if not self.questions:
            raise ValueError("questions: the set has no questions")
        seen: set[str] = set()
        for question in self.questions:
            if question.id in seen:
                raise ValueError(f"two questions have the id {question.id!r}")
            seen.add(question.id)
        return self


def load_questions(path: str | os.PathLike[str]) -> list[Question]:
    """The questions of an eval set (YAML), validated.

    Raises:
        ConfigError: the file is missing, not YAML, or malformed; the message names the file,
            the question and the field (`questions.yaml: question 'redis-store': gold: an
            unanswerable question has no gold passages`).
        ImportError: pyyaml is not installed.
    """
    path = Path(path)
    try:
        import yaml
    except ImportError as error:
        raise ImportError(
            f'{path}: reading YAML needs pyyaml: pip install "handrail[evals]"'
        ) from (error)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"{path}: cannot read it ({error.strerror or error}).") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}.") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping with `questions: [...]`.")
    try:
        return list(QuestionSet.model_validate(data).questions)
    except ValidationError as error:
        raise ConfigError(_message(error, data, str(path))) from None


def _message(error: ValidationError, data: Mapping[str, Any], where: str) -> str:
    first = error.errors(include_url=False)[0]
    loc = list(first["loc"])
    if len(loc) >= 2 and loc[0] == "questions" and isinstance(loc[1], int):
        items = data.get("questions")
        item = items[loc[1]] if isinstance(items, list) and loc[1] < len(items) else None
        name = item.get("id") if isinstance(item, Mapping) else None
        where += f": question {name!r}" if name else f": questions[{loc[1]}]"
        loc = loc[2:]
    field = ""
    for part in loc:
        field += f"[{part}]" if isinstance(part, int) else (f".{part}" if field else str(part))
    message = first["msg"].removeprefix("Value error, ")
    more = error.error_count() - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{where}: {field + ': ' if field else ''}{message}{tail}"


# -- retrieval ---------------------------------------------------------------------------------

_SPACE = re.compile(r"\s+")


def _plain(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def is_gold(chunk: Passage, passage: GoldPassage) -> bool:
    """Whether `chunk` comes from the passage's file and contains its quote (whitespace aside)."""
    return chunk.source == passage.source and _plain(passage.quote) in _plain(chunk.text)


def gold_ranks(retrieved: Sequence[Passage], gold: Sequence[GoldPassage]) -> list[int | None]:
    """For each gold passage, the rank (1 = first) of the first chunk that holds it, or None."""
    texts = [(chunk.source, _plain(chunk.text)) for chunk in retrieved]
    ranks: list[int | None] = []
    for passage in gold:
        quote = _plain(passage.quote)
        found = (
            rank
            for rank, (source, text) in enumerate(texts, 1)
            if source == passage.source and quote in text
        )
        ranks.append(next(found, None))
    return ranks


def recall_at(k: int, retrieved: Sequence[Passage], gold: Sequence[GoldPassage]) -> float:
    """The share of the gold passages found among the first `k` chunks (0 to 1).

    Raises:
        ValueError: `k` is below 1, or there is no gold (an unanswerable question has no
            recall).
    """
    _check(k, gold)
    ranks = gold_ranks(retrieved[:k], gold)
    return sum(rank is not None for rank in ranks) / len(gold)


def mrr_at(k: int, retrieved: Sequence[Passage], gold: Sequence[GoldPassage]) -> float:
    """The reciprocal rank of the first gold chunk among the first `k` (0 when none is there).

    Raises:
        ValueError: `k` is below 1, or there is no gold.
    """
    _check(k, gold)
    found = [rank for rank in gold_ranks(retrieved[:k], gold) if rank is not None]
    return 1.0 / min(found) if found else 0.0


def _check(k: int, gold: Sequence[GoldPassage]) -> None:
    if k < 1:
        raise ValueError(f"k={k}: rank cut-offs start at 1")
    if not gold:
        raise ValueError("no gold passages: recall and MRR are for answerable questions")


Run = tuple[Sequence[Passage], Sequence[GoldPassage]]
"""One question's retrieved chunks (best first) and its gold passages."""


def mean_recall_at(k: int, runs: Iterable[Run]) -> float | None:
    """`recall_at(k)` averaged over the answerable questions (runs with gold); None if none."""
    values = [recall_at(k, retrieved, gold) for retrieved, gold in runs if gold]
    return sum(values) / len(values) if values else None


def mean_mrr_at(k: int, runs: Iterable[Run]) -> float | None:
    """`mrr_at(k)` averaged over the answerable questions (runs with gold); None if none."""
    values = [mrr_at(k, retrieved, gold) for retrieved, gold in runs if gold]
    return sum(values) / len(values) if values else None


@dataclass(frozen=True, kw_only=True, slots=True)
class Refusal:
    """How a relevance threshold splits the questions (see `refusal_at`)."""

    threshold: float
    """Evidence below this relevance was dropped."""
    unanswerable: int
    """Unanswerable questions seen."""
    refused: int
    """Unanswerable questions left with no evidence: retrieval itself says "not in the
    documents"."""
    answerable: int
    """Answerable questions seen."""
    kept: int
    """Answerable questions that still have a gold passage among their evidence."""
    emptied: int
    """Answerable questions left with no evidence at all (wrongly refused)."""

    @property
    def refused_rate(self) -> float | None:
        """`refused / unanswerable`, or None without unanswerable questions."""
        return self.refused / self.unanswerable if self.unanswerable else None

    @property
    def kept_rate(self) -> float | None:
        """`kept / answerable`, or None without answerable questions."""
        return self.kept / self.answerable if self.answerable else None


def refusal_at(
    threshold: float, runs: Iterable[tuple[Sequence[Scored], Sequence[GoldPassage]]]
) -> Refusal:
    """What a relevance threshold refuses and keeps.

    Args:
        threshold: evidence below this relevance (0-1) counts as not found.
        runs: each question's evidence (with relevances) and gold passages (none: the
            question is unanswerable). Evidence retrieved at a lower `min_relevance` can be
            re-cut at several thresholds.

    Returns:
        The counts: unanswerable questions refused (no evidence left), answerable ones whose
        evidence still holds a gold passage (kept), and answerable ones left with nothing.
    """
    unanswerable = refused = answerable = kept = emptied = 0
    for evidence, gold in runs:
        chunks = [item.chunk for item in evidence if item.relevance >= threshold]
        if not gold:
            unanswerable += 1
            refused += not chunks
            continue
        answerable += 1
        emptied += not chunks
        kept += any(rank is not None for rank in gold_ranks(chunks, gold))
    return Refusal(
        threshold=threshold,
        unanswerable=unanswerable,
        refused=refused,
        answerable=answerable,
        kept=kept,
        emptied=emptied,
    )


# -- answers -----------------------------------------------------------------------------------


def citation_precision(answers: Iterable[Answered]) -> float | None:
    """Verified citations over all the citations the model gave (verified + dropped).

    None when the answers give no citation at all.
    """
    verified = given = 0
    for answer in answers:
        verified += len(answer.citations)
        given += len(answer.citations) + answer.dropped_citations
    return verified / given if given else None


def escalation_rate(answers: Iterable[Answered]) -> float | None:
    """The share of the answers that escalated to a person; None for no answers.

    On unanswerable questions it is the rate of honest refusals (higher is better); on
    answerable ones, of needless escalations (lower is better).
    """
    flags = [answer.escalated for answer in answers]
    return sum(flags) / len(flags) if flags else None


def cites_gold(
    answer: Answered, gold: Sequence[GoldPassage], chunks: Mapping[str, Passage]
) -> bool:
    """Whether one of the answer's verified citations is of a gold chunk.

    Args:
        answer: the answer.
        gold: the question's gold passages.
        chunks: chunk id -> chunk, for the cited chunks (a citation names its chunk's id).
    """
    cited = [chunks[c.chunk_id] for c in answer.citations if c.chunk_id in chunks]
    return any(rank is not None for rank in gold_ranks(cited, gold))


def gold_citation_precision(
    answered: Iterable[tuple[Answered, Sequence[GoldPassage]]], chunks: Mapping[str, Passage]
) -> float | None:
    """Of the questions answered (not escalated), the share whose citations hold a gold passage.

    An answer to an unanswerable question (no gold) counts against it: it cites nothing that
    answers. None when no question was answered.

    Args:
        answered: each answer with its question's gold passages.
        chunks: chunk id -> chunk, for the cited chunks.
    """
    flags = [
        bool(gold) and cites_gold(answer, gold, chunks)
        for answer, gold in answered
        if not answer.escalated
    ]
    return sum(flags) / len(flags) if flags else None


def auroc(scored: Iterable[tuple[float, bool]]) -> float | None:
    """The area under the ROC curve of `scored` (score, is positive), exactly; ties count half.

    The probability that a positive drawn at random scores above a negative drawn at random
    (a tie counting one half): the Mann-Whitney U over (positives x negatives), from the
    scores' average ranks. 1 separates them perfectly, 0.5 is chance. None when either class is
    empty.
    """
    items = sorted(scored, key=lambda item: item[0])
    positives = sum(1 for _, positive in items if positive)
    negatives = len(items) - positives
    if not positives or not negatives:
        return None
    rank_sum = 0.0  # the positives' ranks, from 1, a tie's ranks averaged
    start = 0
    while start < len(items):
        end = start
        while end < len(items) and items[end][0] == items[start][0]:
            end += 1
        average = (start + 1 + end) / 2  # ranks start+1 .. end
        rank_sum += average * sum(1 for _, positive in items[start:end] if positive)
        start = end
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)
