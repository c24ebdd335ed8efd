"""The retrieval and answer metrics on hand-made inputs, and the docs/ eval set itself."""

from __future__ import annotations

import re
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from handrail.documents import Chunk
from handrail.documents._chunker import chunk
from handrail.documents._loaders import load
from handrail.documents._metrics import (
    GoldPassage,
    Question,
    auroc,
    citation_precision,
    cites_gold,
    escalation_rate,
    gold_citation_precision,
    gold_ranks,
    is_gold,
    load_questions,
    mean_mrr_at,
    mean_recall_at,
    mrr_at,
    recall_at,
    refusal_at,
)
from handrail.exceptions import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "evals" / "documents" / "corpus"  # the snapshot of docs/ the set was written on
QUESTIONS = ROOT / "evals" / "documents" / "questions.yaml"


def piece(source: str, text: str, index: int = 0) -> Chunk:
    return Chunk(id=f"{source}:{index}", source=source, text=text, index=index, start=0, end=0)


REFUND = GoldPassage(source="refunds.md", quote="within 5 to 10 business days")
DAMAGE = GoldPassage(source="damage.md", quote="photos of the damage are required")

HIT = piece("refunds.md", "Refunds reach your card\nwithin 5  to 10 business days.")
OTHER = piece("refunds.md", "Store credit never expires.", 1)
ELSEWHERE = piece("faq.md", "Refunds arrive within 5 to 10 business days, usually.")
PHOTOS = piece("damage.md", "For a damaged item, photos of the damage are required.")


@dataclass
class Scored:
    chunk: Chunk
    relevance: float


@dataclass
class Cite:
    chunk_id: str


@dataclass
class Reply:
    citations: list[Cite] = field(default_factory=list)
    dropped_citations: int = 0
    escalated: bool = False


# -- gold ---------------------------------------------------------------------------------------


def test_a_chunk_is_gold_when_its_file_holds_the_quote_whitespace_aside() -> None:
    assert is_gold(HIT, REFUND)
    assert not is_gold(OTHER, REFUND)
    assert not is_gold(ELSEWHERE, REFUND)  # the same words in another file are not the passage


def test_gold_ranks_give_each_passage_its_first_rank() -> None:
    assert gold_ranks([OTHER, ELSEWHERE, HIT, HIT, PHOTOS], [REFUND, DAMAGE]) == [3, 5]
    assert gold_ranks([OTHER], [REFUND, DAMAGE]) == [None, None]


# -- recall and MRR -----------------------------------------------------------------------------


def test_recall_counts_the_gold_passages_within_the_cut_off() -> None:
    ranked = [OTHER, HIT, ELSEWHERE, PHOTOS]
    assert recall_at(1, ranked, [REFUND]) == 0.0
    assert recall_at(2, ranked, [REFUND]) == 1.0
    assert recall_at(3, ranked, [REFUND, DAMAGE]) == 0.5
    assert recall_at(4, ranked, [REFUND, DAMAGE]) == 1.0
    assert recall_at(10, [], [REFUND]) == 0.0


def test_mrr_is_the_reciprocal_rank_of_the_first_gold_chunk_within_the_cut_off() -> None:
    ranked = [OTHER, ELSEWHERE, PHOTOS, HIT]
    assert mrr_at(10, ranked, [REFUND]) == 0.25
    assert mrr_at(10, ranked, [REFUND, DAMAGE]) == pytest.approx(1 / 3)
    assert mrr_at(3, ranked, [REFUND]) == 0.0
    assert mrr_at(1, [HIT], [REFUND]) == 1.0


def test_recall_and_mrr_refuse_a_question_without_gold_and_a_cut_off_below_1() -> None:
    with pytest.raises(ValueError, match="answerable questions"):
        recall_at(5, [HIT], [])
    with pytest.raises(ValueError, match="start at 1"):
        mrr_at(0, [HIT], [REFUND])


def test_the_means_skip_unanswerable_questions_and_are_none_without_answerable_ones() -> None:
    runs = [([HIT], [REFUND]), ([OTHER, PHOTOS], [REFUND, DAMAGE]), ([OTHER], [])]
    assert mean_recall_at(5, runs) == 0.75  # (1 + 0.5) / 2
    assert mean_mrr_at(5, runs) == 0.75  # (1/1 + 1/2) / 2
    assert mean_recall_at(5, [([OTHER], [])]) is None
    assert mean_mrr_at(5, []) is None


# -- refusal ------------------------------------------------------------------------------------


def test_refusal_counts_what_a_threshold_refuses_and_keeps() -> None:
    runs = [
        ([Scored(HIT, 0.9), Scored(OTHER, 0.6)], [REFUND]),  # kept
        ([Scored(OTHER, 0.8), Scored(HIT, 0.4)], [REFUND]),  # evidence, but its gold is cut
        ([Scored(PHOTOS, 0.3)], [DAMAGE]),  # left with nothing
        ([Scored(ELSEWHERE, 0.2)], []),  # refused
        ([Scored(OTHER, 0.55)], []),  # not refused
        ([], []),  # refused
    ]
    refusal = refusal_at(0.5, runs)
    assert (refusal.unanswerable, refusal.refused, refusal.answerable) == (3, 2, 3)
    assert (refusal.kept, refusal.emptied) == (1, 1)
    assert refusal.refused_rate == pytest.approx(2 / 3)
    assert refusal.kept_rate == pytest.approx(1 / 3)
    # A lower threshold keeps more and refuses less.
    lower = refusal_at(0.2, runs)
    assert (lower.refused, lower.kept, lower.emptied) == (1, 3, 0)
    empty = refusal_at(0.5, [])
    assert empty.refused_rate is None and empty.kept_rate is None


# -- answers ------------------------------------------------------------------------------------


def test_citation_precision_is_verified_over_all_given() -> None:
    answers = [
        Reply(citations=[Cite("a"), Cite("b")], dropped_citations=1),
        Reply(citations=[Cite("c")]),
        Reply(dropped_citations=2),
        Reply(escalated=True),
    ]
    assert citation_precision(answers) == 0.5  # 3 verified of 6 given
    assert citation_precision([Reply(), Reply(escalated=True)]) is None


def test_escalation_rate_is_the_share_of_escalated_answers() -> None:
    assert escalation_rate([Reply(escalated=True), Reply(), Reply(), Reply(escalated=True)]) == 0.5
    assert escalation_rate([]) is None


def test_an_answer_cites_gold_when_a_cited_chunk_holds_a_gold_passage() -> None:
    chunks = {c.id: c for c in (HIT, OTHER, PHOTOS)}
    assert cites_gold(Reply(citations=[Cite(OTHER.id), Cite(HIT.id)]), [REFUND], chunks)
    assert not cites_gold(Reply(citations=[Cite(OTHER.id)]), [REFUND], chunks)
    assert not cites_gold(Reply(citations=[Cite("unknown:0")]), [REFUND], chunks)


def test_gold_citation_precision_is_over_the_questions_answered() -> None:
    chunks = {c.id: c for c in (HIT, OTHER, PHOTOS)}
    answered = [
        (Reply(citations=[Cite(HIT.id)]), [REFUND]),  # answered, cites gold
        (Reply(citations=[Cite(OTHER.id)]), [REFUND]),  # answered, cites the wrong chunk
        (Reply(citations=[Cite(PHOTOS.id)]), []),  # answered what the documents do not answer
        (Reply(citations=[Cite(HIT.id)], escalated=True), [REFUND]),  # not answered
    ]
    assert gold_citation_precision(answered, chunks) == pytest.approx(1 / 3)
    assert gold_citation_precision([(Reply(escalated=True), [REFUND])], chunks) is None


def test_auroc_counts_the_pairs_a_positive_wins_and_ties_as_half() -> None:
    assert auroc([(0.9, True), (0.8, True), (0.1, False)]) == 1.0
    assert auroc([(0.1, True), (0.9, False)]) == 0.0
    assert auroc([(0.5, True), (0.5, False)]) == 0.5
    # positives 0.9, 0.4; negatives 0.4, 0.2: 2 wins + 1 win + 1 tie (0.5) of 4 pairs
    assert auroc([(0.9, True), (0.4, True), (0.4, False), (0.2, False)]) == 0.875
    assert auroc([(0.9, True)]) is None and auroc([(0.1, False)]) is None and auroc([]) is None


@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]) | st.floats(0, 1), st.booleans()),
        max_size=40,
    )
)
def test_auroc_is_the_pairwise_count(scored: list[tuple[float, bool]]) -> None:
    positives = [score for score, positive in scored if positive]
    negatives = [score for score, positive in scored if not positive]
    if not positives or not negatives:
        assert auroc(scored) is None
        return
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    assert auroc(scored) == pytest.approx(wins / (len(positives) * len(negatives)), abs=1e-12)


# -- the questions file -------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_a_bad_questions_file_names_the_file_the_question_and_the_field(tmp_path: Path) -> None:
    bad = write(
        tmp_path / "q.yaml",
        """\
        questions:
          - id: redis
            kind: unanswerable
            question: Is Redis supported?
            gold: [{source: stores.md, quote: "three stores behind one protocol"}]
        """,
    )
    with pytest.raises(ConfigError) as raised:
        load_questions(bad)
    assert str(raised.value) == (
        f"{bad}: question 'redis': an unanswerable question has no gold passages"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("questions: []", "q.yaml: questions: the set has no questions"),
        (
            "questions: [{id: a, kind: single, question: q, gold: [{source: a.md, quote: short}]}]",
            "question 'a': gold[0].quote: a quote of 5 words or more",
        ),
        ("questions: [{id: a, kind: maybe, question: q}]", "question 'a': kind: Input should be"),
        ("questions: [{kind: multi, question: q}]", "questions[0]: id: Field required"),
        (
            "questions: [{id: a, kind: unanswerable, question: q},"
            " {id: a, kind: unanswerable, question: r}]",
            "two questions have the id 'a'",
        ),
        ("questions: [", "not valid YAML (line 2, column 1)"),
        ("- a list", "expected a mapping with `questions: [...]`"),
    ],
)
def test_malformed_question_files_are_one_clear_error(
    tmp_path: Path, body: str, message: str
) -> None:
    path = write(tmp_path / "q.yaml", body + "\n")
    with pytest.raises(ConfigError) as raised:
        load_questions(path)
    assert str(raised.value).startswith(str(path)), raised.value
    assert message in str(raised.value)


def test_a_missing_questions_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load_questions(tmp_path / "nowhere.yaml")


# -- the docs/ eval set -------------------------------------------------------------------------


def plain(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def questions() -> list[Question]:
    return load_questions(QUESTIONS)


def test_the_eval_set_has_the_kinds_it_promises(questions: list[Question]) -> None:
    kinds = Counter(question.kind for question in questions)
    assert len(questions) >= 40
    assert kinds["single"] >= 25 and kinds["multi"] >= 6 and kinds["unanswerable"] >= 10


def test_every_gold_quote_occurs_verbatim_in_its_docs_file(questions: list[Question]) -> None:
    missing = [
        (question.id, passage.source, passage.quote)
        for question in questions
        for passage in question.gold
        if not (DOCS / passage.source).is_file()
        or plain(passage.quote) not in plain((DOCS / passage.source).read_text(encoding="utf-8"))
    ]
    assert missing == []


def test_every_gold_quote_lies_whole_within_a_chunk_of_the_default_chunker(
    questions: list[Question],
) -> None:
    sources = {passage.source for question in questions for passage in question.gold}
    chunks = [c for source in sorted(sources) for c in chunk(load(DOCS / source, source=source))]
    unfindable = [
        (question.id, passage.quote)
        for question in questions
        for passage in question.gold
        if not any(is_gold(c, passage) for c in chunks)
    ]
    assert unfindable == []


def test_every_unanswerable_question_is_marked_and_has_no_gold(
    questions: list[Question],
) -> None:
    for question in questions:
        assert question.answerable == (question.kind != "unanswerable")
        assert bool(question.gold) == question.answerable, question.id
    multi = [q for q in questions if q.kind == "multi"]
    assert all(len(q.gold) >= 2 for q in multi)


def test_unanswerable_questions_name_nothing_the_docs_mention(questions: list[Question]) -> None:
    # The topic word of each unanswerable question appears nowhere in the corpus.
    corpus = " ".join(p.read_text(encoding="utf-8") for p in DOCS.glob("*.md")).lower()
    topics = {
        "redis-store": "redis",
        "mongodb-store": "mongo",
        "gemini-models": "gemini",
        "single-sign-on": "single sign-on",
        "helm-chart": "helm",
        "dark-mode": "dark mode",
        "subscription-price": "pricing",
        "phone-calls": "speech",
        "fine-tuning": "fine-tun",
        "images-for-the-model": "image",
        "python-38": "3.8",
        "translate-the-page": "french",
        "encryption-at-rest": "encrypted at rest",
        "most-tools-per-agent": "number of tools",
    }
    unanswerable = {q.id for q in questions if q.kind == "unanswerable"}
    assert unanswerable <= set(topics)
    assert [topic for topic in topics.values() if topic in corpus] == []


def test_questions_paraphrase_rather_than_copy_their_passages(questions: list[Question]) -> None:
    def runs(text: str, n: int = 4) -> set[tuple[str, ...]]:
        words = re.findall(r"[a-z0-9_]+", text.lower())
        return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}

    copied = [
        (question.id, passage.quote)
        for question in questions
        for passage in question.gold
        if runs(question.question) & runs(passage.quote)
    ]
    assert copied == []
