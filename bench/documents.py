"""`python -m bench.documents`: retrieval quality, ingest rate, query latency and memory.

Over the repository's docs/ and the eval set evals/documents/questions.yaml:

1. **Ingest**: docs/ (and with `--corpus DIR` another folder first) into a fresh `Library`
   (MiniLM on the CPU, an embedded Chroma in a temporary folder): chunks a second, loading,
   chunking, embedding and writing included, with the default embedder
   (`all-MiniLM-L6-v2-int8-v2`) and the one before it (`all-MiniLM-L6-v2-int8`), their CPU
   time a chunk (the machine may be shared: CPU time says what 2 idle cores would do), each
   embedder's own rate on the same texts, and how closely their vectors agree (cosine).
2. **Quality**: recall@5, recall@10 and MRR@10 of hybrid retrieval (`Library.retrieve`,
   `min_relevance=0`, no neighbours) against its two halves alone: BM25 (`KeywordIndex`
   over the same chunks) and dense (`Index.query` with the query's embedding). Then what
   the relevance threshold refuses and keeps (unanswerable questions left with no evidence,
   answerable ones that keep a gold passage), for hybrid at several thresholds.
3. **Latency**: `Library.retrieve(question)` (defaults: top_k 5, min_relevance 0.5,
   neighbours; no model) over an index of 10,000 chunks, and with `--large` 100,000: the
   docs' real chunks replicated, text and vectors unchanged, under varied sources
   (`copy-00042/tools.md`), so the index holds real text in real proportions without
   paraphrase. p50/p99 over every question, several rounds, after a warm-up (the first
   query builds the BM25 index and saves it: its time is printed apart), then the first
   query of a new `Library` on the same folder (it loads the saved BM25 index).
4. **Memory**: peak RSS of the process after each part (`getrusage(...).ru_maxrss`; this
   process loads both embedders), and of one child process a model: ingest docs/, then
   10,000 chunks queried through `Library.open` twice (`--memory-only` runs just this).

The 100k part takes 3 to 4 minutes more on 2 cores (mostly Chroma's inserts: 2 minutes),
so it runs only with `--large`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from handrail.documents import Chunk
from handrail.documents._embed import MiniLMEmbedder
from handrail.documents._index import ChromaIndex
from handrail.documents._keyword import KeywordIndex
from handrail.documents._library import Library, _embedding_text, relevance_from_cosine
from handrail.documents._metrics import (
    Question,
    load_questions,
    mean_mrr_at,
    mean_recall_at,
    refusal_at,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "evals" / "documents" / "corpus"  # the snapshot its questions were written on
QUESTIONS = ROOT / "evals" / "documents" / "questions.yaml"
THRESHOLD = 0.5
SWEEP = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
CUTS = (5, 10)

Ranker = Callable[[str, int], Awaitable[list[Chunk]]]


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def own_peak_mib() -> float:
    """This process's peak RSS since it started (VmHWM: unlike ru_maxrss, not inherited
    from the parent that forked it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return peak_mib()  # not Linux


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.1f} chunks/s ({count} chunks in {seconds:.1f} s)"


# -- 1. ingest ---------------------------------------------------------------------------------

OLD_MODEL = "all-MiniLM-L6-v2-int8"
"""handrail's default embedder before all-MiniLM-L6-v2-int8-v2: the same texts, for comparison."""
AGREEMENT = 1000
"""Chunks whose vectors by the old and the new model are compared."""


async def ingest(folder: Path, embedder: MiniLMEmbedder, corpus: Path) -> tuple[Library, float]:
    library = Library.open(folder, embedder=embedder)
    report = await library.ingest(corpus)
    assert report.chunks_written, f"nothing ingested from {corpus}: {report.skipped[:3]}"
    return library, report.seconds


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def part_ingest(
    work: Path, corpus: Path, model: str | None = None
) -> tuple[Library, MiniLMEmbedder]:
    """Ingest `corpus` with the old and the new default; return the library of `model`'s."""
    print(f"## Ingest {corpus} (load, chunk, embed, write)")
    print(f"  load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    embedder = MiniLMEmbedder()
    embedder.embed_sync(["warm up: the model loads once"])
    old = MiniLMEmbedder(model=OLD_MODEL)
    old.embed_sync(["warm up"])
    rates: dict[str, float] = {}
    library: Library | None = None
    for name, which in ((OLD_MODEL, old), (embedder.name, embedder)):
        cpu = cpu_seconds()
        lib, seconds = await ingest(work / name, which, corpus)
        cpu = cpu_seconds() - cpu
        count = await lib.index.count()
        rates[name] = count / seconds
        print(
            f"  {name:26} {rate(count, seconds)}, CPU {1000 * cpu / count:.1f} ms a chunk "
            f"(on 2 idle cores at most {2 * count / cpu:,.0f} chunks/s)"
        )
        if which.name == (model or embedder.name):
            library = lib
        else:
            await lib.close()
    assert library is not None
    print(
        f"  ingest, default embedder: {rates[embedder.name]:,.1f} chunks/s; target ≥ 100: "
        f"{'met' if rates[embedder.name] >= 100 else 'MISSED'} (old default "
        f"{rates[OLD_MODEL]:,.1f}, x{rates[embedder.name] / rates[OLD_MODEL]:.2f})"
    )
    chunks = await library.index.chunks()
    texts = [_embedding_text(chunk) for chunk in chunks]
    tokens = embedder._load().tokenizer.encode_batch(texts)
    mean_tokens = statistics.mean(len(t.ids) for t in tokens)
    for which in (old, embedder):
        cpu, began = cpu_seconds(), time.perf_counter()
        which.embed_sync(texts)
        alone, cpu = time.perf_counter() - began, cpu_seconds() - cpu
        print(
            f"  the embedder alone, {which.name} (mean {mean_tokens:.0f} word pieces): "
            f"{rate(len(texts), alone)}, CPU {1000 * cpu / len(texts):.1f} ms a chunk"
        )
    sample = texts[:: max(1, len(texts) // AGREEMENT)][:AGREEMENT]
    cosines = (old.embed_sync(sample) * embedder.embed_sync(sample)).sum(axis=1)
    print(
        f"  agreement of {embedder.name} with {OLD_MODEL} over {len(sample)} chunks: cosine "
        f"min {cosines.min():.4f}, mean {cosines.mean():.4f}; target ≥ 0.99: "
        f"{'met' if cosines.min() >= 0.99 else 'MISSED'}"
    )
    print(f"  load average after: {os.getloadavg()[0]:.1f}")
    print(f"  peak RSS: {peak_mib():.0f} MiB")
    chosen = old if model == OLD_MODEL else embedder
    print(f"  (the parts below use {chosen.name})")
    return library, chosen


# -- 2. quality --------------------------------------------------------------------------------


async def scores(rank: Ranker, questions: Sequence[Question]) -> dict[str, float | None]:
    ranked = {k: [await rank(q.question, k) for q in questions] for k in CUTS}
    gold = [q.gold for q in questions]
    out: dict[str, float | None] = {}
    for k in CUTS:
        out[f"recall@{k}"] = mean_recall_at(k, list(zip(ranked[k], gold, strict=True)))
    out["MRR@10"] = mean_mrr_at(10, list(zip(ranked[10], gold, strict=True)))
    return out


async def part_quality(
    library: Library, embedder: MiniLMEmbedder, questions: Sequence[Question]
) -> None:
    print(f"\n## Retrieval quality: {len(questions)} questions over docs/")
    chunks = await library.index.chunks()
    by_id = {chunk.id: chunk for chunk in chunks}
    keywords = KeywordIndex.build(chunks)

    async def hybrid(query: str, k: int) -> list[Chunk]:
        found = await library.retrieve(query, top_k=k, min_relevance=0.0)
        return [item.chunk for item in found]

    async def bm25(query: str, k: int) -> list[Chunk]:
        return [by_id[id_] for id_, _ in keywords.search(query, k)]

    async def dense(query: str, k: int) -> list[Chunk]:
        vector = (await embedder.embed([query]))[0]
        return [chunk for chunk, _ in await library.index.query(vector, k)]

    rows = {
        "hybrid": await scores(hybrid, questions),
        "BM25 alone": await scores(bm25, questions),
        "dense alone": await scores(dense, questions),
    }
    print(f"  {'':12} {'recall@5':>9} {'recall@10':>10} {'MRR@10':>7}")
    for name, row in rows.items():
        cells = [f"{row[m] or 0:.3f}" for m in ("recall@5", "recall@10", "MRR@10")]
        print(f"  {name:12} {cells[0]:>9} {cells[1]:>10} {cells[2]:>7}")
    for metric in ("recall@5", "MRR@10"):
        mine = rows["hybrid"][metric] or 0.0
        others = [rows[n][metric] or 0.0 for n in ("BM25 alone", "dense alone")]
        verdict = "beats both" if all(mine > o for o in others) else "does NOT beat both"
        print(f"  hybrid {metric}: {verdict} ({mine:.3f} vs {max(others):.3f} for the best half)")

    print("\n## Refusal at min_relevance (top_k 5): unanswerable refused, answerable kept")
    evidence = [
        await library.retrieve(q.question, top_k=5, min_relevance=THRESHOLD) for q in questions
    ]
    gold = [q.gold for q in questions]
    real = refusal_at(THRESHOLD, list(zip(evidence, gold, strict=True)))
    print(
        f"  hybrid, retrieve(min_relevance={THRESHOLD}): refused {real.refused}/"
        f"{real.unanswerable} ({real.refused_rate or 0:.2f}), kept {real.kept}/"
        f"{real.answerable} ({real.kept_rate or 0:.2f}), emptied {real.emptied}"
    )
    dense_scored = []
    for q in questions:
        vector = (await embedder.embed([q.question]))[0]
        dense_scored.append(
            [_Scored(c, relevance_from_cosine(s)) for c, s in await library.index.query(vector, 5)]
        )
    cut = refusal_at(THRESHOLD, list(zip(dense_scored, gold, strict=True)))
    print(
        f"  dense alone, top 5 at relevance ≥ {THRESHOLD}: refused {cut.refused}/"
        f"{cut.unanswerable}, kept {cut.kept}/{cut.answerable}"
    )
    hits = [keywords.search(q.question, 5) for q in questions]
    no_hit = sum(not h for h, q in zip(hits, questions, strict=True) if not q.gold)
    print(
        f"  BM25 alone has no relevance scale: {no_hit}/{real.unanswerable} unanswerable "
        f"questions share no word with the docs"
    )
    wide = [await library.retrieve(q.question, top_k=5, min_relevance=0.0) for q in questions]
    print("  hybrid sweep (top 5 retrieved at 0, then cut; neighbours boosted):")
    for threshold in SWEEP:
        swept = refusal_at(threshold, list(zip(wide, gold, strict=True)))
        print(
            f"    ≥ {threshold:.1f}: refused {swept.refused:2}/{swept.unanswerable} "
            f"({swept.refused_rate or 0:.2f})  kept {swept.kept:2}/{swept.answerable} "
            f"({swept.kept_rate or 0:.2f})  emptied {swept.emptied}"
        )
    best_noise = sorted(
        max((item.relevance for item in found), default=0.0)
        for found, q in zip(wide, questions, strict=True)
        if not q.gold
    )
    print(f"  best relevance of each unanswerable question: {[round(x, 2) for x in best_noise]}")
    print(f"  peak RSS: {peak_mib():.0f} MiB")


@dataclasses.dataclass
class _Scored:
    chunk: Chunk
    relevance: float


# -- 3. latency --------------------------------------------------------------------------------


def replicate(chunks: Sequence[Chunk], count: int) -> list[Chunk]:
    """`count` chunks: whole copies of the documents, each copy under its own sources."""
    out: list[Chunk] = []
    copy = 0
    while len(out) < count:
        prefix = f"copy-{copy:05d}"
        ids = {c.id: f"{prefix}-{c.id}" for c in chunks}
        for chunk in chunks:
            out.append(
                dataclasses.replace(
                    chunk,
                    id=ids[chunk.id],
                    source=f"{prefix}/{chunk.source}",
                    prev_id=ids.get(chunk.prev_id or ""),
                    next_id=ids.get(chunk.next_id or ""),
                )
            )
        copy += 1
    return out[:count]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def part_latency(
    size: int,
    work: Path,
    library: Library,
    embedder: MiniLMEmbedder,
    questions: Sequence[Question],
    rounds: int,
) -> None:
    print(f"\n## Query latency at {size:,} chunks (Library.retrieve defaults, no model)")
    real = await library.index.chunks()
    vectors = await embedder.embed([_embedding_text(c) for c in real])
    row = {c.id: i for i, c in enumerate(real)}
    synthetic = replicate(real, size)
    index = ChromaIndex.persistent(work / f"n{size}", embedder=embedder)
    began = time.perf_counter()
    step = 5000
    for start in range(0, len(synthetic), step):
        part = synthetic[start : start + step]
        rows = [row[c.id.split("-", 2)[2]] for c in part]
        await index.upsert(part, vectors[rows])
    written = time.perf_counter() - began
    print(f"  index written (vectors reused, not re-embedded): {rate(size, written)}")
    keywords_at = work / f"n{size}" / "handrail-keywords" / "handrail"  # as Library.open
    big = Library(index, embedder=embedder, keyword_folder=keywords_at)
    began = time.perf_counter()
    await big.retrieve(questions[0].question)
    print(
        f"  first query (reads every chunk, builds BM25 and saves it): "
        f"{time.perf_counter() - began:.2f} s"
    )
    for q in questions[:5]:  # warm-up
        await big.retrieve(q.question)
    total: list[float] = []
    parts: dict[str, list[float]] = {"embed": [], "dense": [], "bm25": []}
    keywords = await big._keyword_index()
    for _ in range(rounds):
        for q in questions:
            began = time.perf_counter()
            await big.retrieve(q.question)
            total.append(time.perf_counter() - began)
            t0 = time.perf_counter()
            vector = embedder.embed_sync([q.question])[0]
            t1 = time.perf_counter()
            await index.query(vector, 20)
            t2 = time.perf_counter()
            keywords.index.search(q.question, 20)
            t3 = time.perf_counter()
            parts["embed"].append(t1 - t0)
            parts["dense"].append(t2 - t1)
            parts["bm25"].append(t3 - t2)
    ms = [t * 1000 for t in total]
    p50, p99 = percentile(ms, 50), percentile(ms, 99)
    target = "" if size != 10_000 else f"; target p50 ≤ 20 ms: {'met' if p50 <= 20 else 'MISSED'}"
    print(f"  retrieve: p50 {p50:.1f} ms, p99 {p99:.1f} ms over {len(ms)} queries{target}")
    shares = ", ".join(
        f"{name} {statistics.median(values) * 1000:.1f} ms" for name, values in parts.items()
    )
    print(f"  its parts alone (p50): {shares} (the rest: fusion, cosines of BM25-only hits)")
    await big.close()
    reopened = Library(
        ChromaIndex.persistent(work / f"n{size}", embedder=embedder),
        embedder=embedder,
        keyword_folder=keywords_at,
    )
    began = time.perf_counter()
    await reopened.retrieve(questions[1].question)
    first = time.perf_counter() - began
    again = []
    for q in questions[2:12]:
        began = time.perf_counter()
        await reopened.retrieve(q.question)
        again.append((time.perf_counter() - began) * 1000)
    print(
        f"  reopened (a new Library on the same folder): first query {first * 1000:.0f} ms "
        f"(loads the saved BM25 index; Chroma opens too), the next 10: p50 "
        f"{percentile(again, 50):.1f} ms"
    )
    await reopened.close()
    print(f"  peak RSS: {peak_mib():.0f} MiB")


# -- 4. memory ------------------------------------------------------------------------------------

MEMORY_SIZE = 10_000


async def memory_child(model: str) -> None:
    """In its own process: what one Library of `model` peaks at, ingesting, then at 10k chunks.

    Ingests docs/ into a fresh `Library.open` folder, then writes 10,000 chunks (the docs'
    replicated, their vectors reused) into another, opens it as a user would and asks every
    question once (the first query builds and saves BM25), then opens it again in a new
    Library and asks again (BM25 loaded). Prints peak RSS after each phase.
    """
    questions = load_questions(QUESTIONS)
    embedder = MiniLMEmbedder(model=model)
    with tempfile.TemporaryDirectory(prefix="bench-documents-memory-") as folder:
        work = Path(folder)
        library = Library.open(work / "docs", embedder=embedder)
        await library.ingest(DOCS)
        real = await library.index.chunks()
        vectors = await library.index.vectors([c.id for c in real])
        await library.close()
        ingested = own_peak_mib()
        index = ChromaIndex.persistent(work / "big", embedder=embedder)
        synthetic = replicate(real, MEMORY_SIZE)
        for start in range(0, len(synthetic), 5000):
            part = synthetic[start : start + 5000]
            await index.upsert(part, np.stack([vectors[c.id.split("-", 2)[2]] for c in part]))
        await index.close()
        del synthetic
        for _ in range(2):
            async with Library.open(work / "big", embedder=embedder) as big:
                for q in questions:
                    await big.retrieve(q.question)
        print(f"{ingested:.0f} {own_peak_mib():.0f}")


def part_memory() -> None:
    print(f"\n## Peak RSS of one process: ingest docs/, then {MEMORY_SIZE:,} chunks queried")
    for model in (OLD_MODEL, MiniLMEmbedder().name):
        done = subprocess.run(
            [sys.executable, "-m", "bench.documents", "--memory-child", model],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        ingested, queried = done.stdout.split()[-2:]
        print(
            f"  {model:26} after ingest {ingested} MiB, after {MEMORY_SIZE:,} chunks "
            f"queried (BM25 built, then loaded) {queried} MiB"
        )


# -- main --------------------------------------------------------------------------------------


async def main(large: bool, rounds: int, corpus: Path | None, model: str | None) -> None:
    questions = load_questions(QUESTIONS)
    with tempfile.TemporaryDirectory(prefix="bench-documents-") as folder:
        work = Path(folder)
        if corpus is not None:  # ingest speed on another corpus; quality needs docs/
            other, _ = await part_ingest(work / "corpus", corpus)
            await other.close()
            print()
        library, embedder = await part_ingest(work, DOCS, model)
        await part_quality(library, embedder, questions)
        await part_latency(10_000, work, library, embedder, questions, rounds)
        if large:
            await part_latency(100_000, work, library, embedder, questions, max(1, rounds // 2))
        else:
            print("\n(100,000 chunks: run with --large, 3 to 4 minutes more)")
        await library.close()
    part_memory()
    print(f"\npeak RSS of the whole run (both embedders loaded): {peak_mib():.0f} MiB")


def cli(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.documents", description=__doc__)
    parser.add_argument("--large", action="store_true", help="also measure 100,000 chunks")
    parser.add_argument("--rounds", type=int, default=4, help="query rounds over the questions")
    parser.add_argument(
        "--corpus",
        type=Path,
        help="also measure ingest on this folder (the Debian git manual, say: apt-get "
        "download git-doc; dpkg-deb -x git-doc_*.deb x; x/usr/share/doc/git-doc)",
    )
    parser.add_argument(
        "--model",
        choices=[OLD_MODEL, MiniLMEmbedder().name],
        help="the embedder of the quality and latency parts (default: the default embedder)",
    )
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    parser.add_argument("--memory-only", action="store_true", help="only the memory part")
    args: Any = parser.parse_args(argv)
    if args.memory_child:
        asyncio.run(memory_child(args.memory_child))
    elif args.memory_only:
        part_memory()
    else:
        asyncio.run(main(args.large, args.rounds, args.corpus, args.model))


if __name__ == "__main__":
    cli()
