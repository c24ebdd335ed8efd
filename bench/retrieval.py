"""`python -m bench.retrieval`: one table per corpus, in one run, for the documents agent.

Corpora (see bench/corpora.py): `git` (the Git manual: the tuning corpus, where the relevance
scale was fitted), `python` (the Python 3.11 manual: reporting only) and `docs` (this
repository's docs/ snapshot, evals/documents/corpus: reporting only). Each has frozen
questions (evals/documents/<name>/questions.yaml; docs/: evals/documents/questions.yaml).

For each corpus, over the same ingested index:

- **Retrieval**: recall@5, recall@10 and MRR@10 of handrail (`Library.retrieve`,
  `min_relevance=0`) against plain BM25 (bm25s, stemmed, over the chunks' text alone), plain
  dense (the same MiniLM vectors, nearest first) and plain hybrid (reciprocal-rank fusion,
  k=60, of the two), and handrail's recall on the `reworded` questions alone.
- **Refusal at the default** (`retrieve(question)`: top_k 5, min_relevance 0.5): unanswerable
  questions left with no evidence, answerable ones that keep a gold passage; and the AUROC of
  the best relevance, answerable against unanswerable.
- **Answers** with the offline answering model (`extractive_model`): unanswerable questions
  escalated, answerable ones escalated, answered questions citing a gold passage, and the
  AUROC of the confidence, answerable against unanswerable.

`--corpus NAME` (repeatable) limits the run; `--index-cache DIR` keeps each corpus's index
between runs (keyed by corpus and embedder), which a tuning loop wants and a report does not.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from handrail.documents import Answerer, Chunk, Library
from handrail.documents._keyword import KeywordIndex
from handrail.documents._library import _embedding_text
from handrail.documents._metrics import (
    Question,
    cites_gold,
    load_questions,
    mrr_at,
    recall_at,
)
from handrail.documents.testing import extractive_model

from .corpora import CORPORA, ROOT, corpus_path

THRESHOLD = 0.5
TUNED_ON = "git"


def folder_and_questions(name: str) -> tuple[Path, Path]:
    if name == "docs":
        return ROOT / "evals/documents/corpus", ROOT / "evals/documents/questions.yaml"
    return corpus_path(name), CORPORA[name].questions


def auroc(positives: Sequence[float], negatives: Sequence[float]) -> float | None:
    """P(a positive scores above a negative), ties counted half; None without both."""
    if not positives or not negatives:
        return None
    pos = np.asarray(positives)[:, None]
    neg = np.asarray(negatives)[None, :]
    return float(((pos > neg).sum() + 0.5 * (pos == neg).sum()) / (pos.size * neg.size))


def fmt(value: float | None) -> str:
    return "  -  " if value is None else f"{value:.2f}"


async def table(name: str, work: Path) -> None:
    folder, questions_file = folder_and_questions(name)
    questions = load_questions(questions_file)
    answerable = [q for q in questions if q.answerable]
    unanswerable = [q for q in questions if not q.answerable]
    role = "tuning corpus" if name == TUNED_ON else "reported only: nothing fitted on it"
    async with Library.open(work) as library:
        started = time.perf_counter()
        report = await library.ingest(folder)
        seconds = time.perf_counter() - started
        chunks = await library.index.chunks()
        by_id = {c.id: c for c in chunks}
        plain_bm25 = KeywordIndex.build(chunks)
        context_bm25 = KeywordIndex.build(chunks, _embedding_text)
        print(
            f"\n## {name} ({role}): {len(chunks)} chunks from {report.ingested + report.unchanged}"
            f" files; {len(answerable)} answerable questions ({sum(q.reworded for q in answerable)}"
            f" reworded), {len(unanswerable)} unanswerable"
        )
        if report.ingested:
            print(f"  ingest: {report.chunks_written / seconds:.1f} chunks/s ({seconds:.0f} s)")

        async def handrail(q: Question) -> list[Chunk]:
            found = await library.retrieve(q.question, top_k=10, min_relevance=0.0)
            return [item.chunk for item in found]

        async def bm25(q: Question) -> list[Chunk]:
            return [by_id[id_] for id_, _ in plain_bm25.search(q.question, 10)]

        async def dense(q: Question) -> list[Chunk]:
            vector = (await library.embedder.embed([q.question]))[0]
            return [c for c, _ in await library.index.query(vector, 10)]

        async def rrf(q: Question, keywords: KeywordIndex) -> list[Chunk]:
            vector = (await library.embedder.embed([q.question]))[0]
            near = [c for c, _ in await library.index.query(vector, 50)]
            keyword = [by_id[id_] for id_, _ in keywords.search(q.question, 50)]
            fused: dict[str, float] = {}
            for ranking in (near, keyword):
                for rank, chunk in enumerate(ranking, 1):
                    fused[chunk.id] = fused.get(chunk.id, 0.0) + 1.0 / (60 + rank)
            return [by_id[i] for i in sorted(fused, key=lambda i: -fused[i])[:10]]

        async def hybrid(q: Question) -> list[Chunk]:
            return await rrf(q, plain_bm25)

        async def hybrid_context(q: Question) -> list[Chunk]:
            return await rrf(q, context_bm25)

        async def per_page(q: Question) -> list[Chunk]:
            # Diversity for two-passage questions: at most 3 chunks a page before the rest.
            found = await library.retrieve(q.question, top_k=40, min_relevance=0.0)
            seen: dict[str, int] = {}
            first: list[Chunk] = []
            rest: list[Chunk] = []
            for item in found:
                count = seen.get(item.chunk.source, 0)
                (first if count < 3 else rest).append(item.chunk)
                seen[item.chunk.source] = count + 1
            return (first + rest)[:10]

        print(
            f"  {'':26} {'recall@5':>8} {'recall@10':>9} {'MRR@10':>7}  reworded r@10  multi r@10"
        )
        for label, ranker in (
            ("handrail", handrail),
            ("plain BM25", bm25),
            ("plain dense", dense),
            ("plain hybrid RRF", hybrid),
            ("RRF + title/headings BM25", hybrid_context),
            ("handrail, 3 a page first", per_page),
        ):
            ranked = [await ranker(q) for q in answerable]
            r5 = statistics.fmean(
                recall_at(5, r, q.gold) for r, q in zip(ranked, answerable, strict=True)
            )
            r10 = [recall_at(10, r, q.gold) for r, q in zip(ranked, answerable, strict=True)]
            mrr = statistics.fmean(
                mrr_at(10, r, q.gold) for r, q in zip(ranked, answerable, strict=True)
            )
            reworded = [x for x, q in zip(r10, answerable, strict=True) if q.reworded]
            multi = [x for x, q in zip(r10, answerable, strict=True) if q.kind == "multi"]
            print(
                f"  {label:26} {r5:8.2f} {statistics.fmean(r10):9.2f} {mrr:7.2f}"
                f"  {fmt(statistics.fmean(reworded) if reworded else None):>13}"
                f"  {fmt(statistics.fmean(multi) if multi else None):>10}"
            )

        default = {q.id: await library.retrieve(q.question) for q in questions}
        refused = sum(not default[q.id] for q in unanswerable)
        kept = sum(
            any(recall_at(5, [item.chunk], [g]) for item in default[q.id] for g in q.gold)
            for q in answerable
        )
        best = {q.id: max((i.relevance for i in default[q.id]), default=0.0) for q in questions}
        wide = {
            q.id: await library.retrieve(q.question, top_k=1, min_relevance=0.0) for q in questions
        }
        top = {q.id: wide[q.id][0].relevance if wide[q.id] else 0.0 for q in questions}
        print(
            f"  at the default (top_k 5, min_relevance {THRESHOLD}): unanswerable refused "
            f"{refused}/{len(unanswerable)}, answerable keeping a gold passage "
            f"{kept}/{len(answerable)}; relevance AUROC (best passage, answerable vs not) "
            f"{fmt(auroc([top[q.id] for q in answerable], [top[q.id] for q in unanswerable]))}"
        )
        del best

        answerer = Answerer(library, extractive_model())
        replies = {q.id: await answerer.answer(q.question) for q in questions}
        escalated_u = sum(replies[q.id].escalated for q in unanswerable)
        escalated_a = sum(replies[q.id].escalated for q in answerable)
        answered = [q for q in answerable if not replies[q.id].escalated]
        chunk_of = {c.id: c for c in chunks}
        citing = sum(cites_gold(replies[q.id], q.gold, chunk_of) for q in answered)
        confidence = auroc(
            [replies[q.id].confidence for q in answerable],
            [replies[q.id].confidence for q in unanswerable],
        )
        print(
            f"  answers (offline model): unanswerable escalated {escalated_u}/{len(unanswerable)}"
            f", answerable escalated {escalated_a}/{len(answerable)}, answered citing a gold "
            f"passage {citing}/{len(answered)}; confidence AUROC {fmt(confidence)}"
        )


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.retrieval", description=__doc__)
    parser.add_argument("--corpus", action="append", choices=["git", "python", "docs"])
    parser.add_argument("--index-cache", type=Path)
    args = parser.parse_args(argv)
    names = args.corpus or ["git", "python", "docs"]
    with tempfile.TemporaryDirectory() as scratch:
        for name in names:
            base = args.index_cache or Path(scratch)
            await table(name, base / name)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
