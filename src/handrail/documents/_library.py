"""The library: the documents a team asks questions of, ingested, indexed and retrieved.

```python
async with Library.open(".handrail/documents") as library:
    report = await library.ingest("policies/")  # only new and changed files are embedded
    evidence = await library.retrieve("How long do refunds take?")
    for item in evidence:
        print(item.relevance, item.chunk.source, item.chunk.text)
```

**Ingest** walks a folder (recursively, in sorted order, skipping hidden files and folders);
a file's `source` is its path relative to the folder, with `/`. A file whose bytes hash to
what the index holds for its source is left alone; a new or changed one is loaded, chunked
and embedded (batched across files), and replaces its old chunks. Sources that left the
folder are deleted from the index. A file that cannot be ingested (unsupported suffix,
unreadable, no text) is skipped with its reason and the rest go on; if an earlier version of
it was indexed, that version's chunks are removed, so the index never answers from a file
that is no longer there as it was. One collection mirrors one folder: ingesting another
folder into it deletes the first folder's files.

**Notes** (`add_note`) are people's answers, kept as chunks under the source
`note:<author>`. Ingest never deletes them (so a file whose path starts with `note:` is
skipped).

**Retrieve** is hybrid: the nearest chunks by embedding and the best BM25 matches are fused
by reciprocal rank (k=60) into one order; each chunk's `relevance` (0-1) comes from its
cosine similarity to the query through `relevance_from_cosine`, and chunks below
`min_relevance` are never returned. Neighbours of a strong hit are boosted and kept next to
it, in document order (see `Library.retrieve`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, TypeAlias

import numpy as np

from ..exceptions import ConfigError, DocumentLoadError
from ..models import Model
from ._chunker import chunk as chunk_document
from ._decompose import DecompositionCache, decompose
from ._embed import Embedder, MiniLMEmbedder, Vectors
from ._index import ChromaIndex, Index
from ._keyword import KeywordIndex
from ._loaders import SUPPORTED_SUFFIXES, load_bytes
from ._types import Chunk, Document

__all__ = [
    "NOTE_PREFIX",
    "Evidence",
    "IngestOutcome",
    "IngestProgress",
    "IngestReport",
    "Library",
    "relevance_from_cosine",
]

_log = logging.getLogger(__name__)

NOTE_PREFIX = "note:"
"""Sources that start with this are notes (`Library.add_note`), which ingest never deletes."""

# -- relevance ---------------------------------------------------------------------------------

COSINE_AT_HALF = 0.35
"""The cosine similarity that maps to relevance 0.5: the evidence/noise boundary of
all-MiniLM-L6-v2 (see `relevance_from_cosine`)."""
COSINE_SPAN = 0.50
"""The cosines over which relevance goes from 0 to 1 (0.10 to 0.60), linearly."""

_RRF_K = 60
_BOOST = 0.15
"""Relevance added to a neighbour of a strong hit."""
_STRONG = 0.7
"""A hit above this relevance (cosine 0.45) has its neighbours boosted."""
_EMBED_BATCH = 128
"""Chunks embedded together during ingest: small files share an embedder call, and MiniLM
spreads its model calls (about 5 chunks each) over the cores, so a batch keeps them busy to
its end; the next batch is read and chunked meanwhile."""
_KEYWORDS = "handrail-keywords"
"""The folder, inside `Library.open`'s, of the saved BM25 indexes (one a collection)."""
_VECTOR_CACHE = 4096
"""Recomputed chunk vectors kept for the next query."""


def relevance_from_cosine(cosine: float) -> float:
    """A query-chunk cosine similarity as a relevance from 0 (noise) to 1 (evidence).

    A clipped linear map, `0.5 + (cosine - 0.35) / 0.50` within [0, 1]: cosine 0.10 or less
    is 0, 0.35 is 0.5, 0.60 or more is 1. It is monotone, so it never reorders; 0.5 is the
    evidence/noise boundary of the default embedder, all-MiniLM-L6-v2 (int8), with chunks
    embedded as ingest embeds them (heading path first).

    Calibrated on handrail's own `docs/` (15 pages, 271 chunks of 200 tokens) with 18
    questions that docs/ answers, in other words than its own, and 12 it cannot answer:

    - the cosine of the chunk holding the answer: 0.39 to 0.73 (median 0.52; 0.393, 0.418,
      0.421, 0.460, 0.469 the lowest);
    - the cosine of the best chunk for an unanswerable question: 0.12 to 0.30 for the 10
      off-topic ones (vacation days, Kubernetes, LoRA, SSO with Okta: 0.304 the highest),
      0.44 and 0.58 for 2 near the docs' topics ("the company's refund policy" meets an
      eval suite about refunds; "sessions in Redis or MongoDB?" meets the page listing the
      stores, which does bear on it).

    So 0.35 lies between the noise (at most 0.30) and the weakest answer (0.39): at 0.5
    relevance all 18 answers are kept and 10 of the 12 unanswerable questions get no
    evidence at all. On 12 held-out questions (written after the choice), 6 of 6 answers
    were kept (cosines 0.42 to 0.57) and 5 of 6 unanswerable ones refused (0.17 to 0.32;
    the sixth, 0.47, near the docs' topics). An embedder other than MiniLM has its own
    scale: calibrate `min_relevance` for it the same way.
    """
    value = 0.5 + (cosine - COSINE_AT_HALF) / COSINE_SPAN
    return min(1.0, max(0.0, value))


# -- results -----------------------------------------------------------------------------------

IngestOutcome: TypeAlias = Literal["ingested", "unchanged", "deleted", "skipped"]
"""What ingest did with a source: embedded it (new or changed), left it (same bytes),
removed it (it left the folder), or skipped it (the reason says why)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class IngestProgress:
    """One source handled by `Library.ingest`, for a progress bar."""

    source: str
    """The file's path relative to the folder (or a deleted source's name)."""
    outcome: IngestOutcome
    done: int
    """Sources handled so far, this one included."""
    total: int
    """Sources to handle: the folder's files and the sources that left it."""
    chunks: int = 0
    """Chunks written for it (ingested only)."""
    reason: str | None = None
    """Why it was skipped (skipped only)."""


@dataclass(kw_only=True, slots=True)
class IngestReport:
    """What `Library.ingest` did."""

    files: int = 0
    """Files seen in the folder (hidden ones aside), supported or not."""
    ingested: int = 0
    """New or changed files that were loaded, chunked, embedded and written."""
    unchanged: int = 0
    """Files whose bytes the index already held: not embedded again."""
    deleted: int = 0
    """Sources removed from the index because their file left the folder."""
    chunks_written: int = 0
    """Chunks embedded and written by this ingest."""
    chunks_total: int = 0
    """Chunks in the index afterwards (notes included)."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """`(source, reason)` for each file that could not be ingested."""
    seconds: float = 0.0
    """How long it took, loading, embedding and writing included."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Evidence:
    """A chunk found for a query, with how relevant it is and how it was found."""

    chunk: Chunk
    relevance: float
    """0 (noise) to 1 (evidence): `relevance_from_cosine(cosine)`, plus the neighbour boost
    when `boosted`. Never below the `min_relevance` it was retrieved with."""
    cosine: float
    """The cosine similarity of the chunk's embedding to the query's."""
    keyword_rank: int | None
    """Its place (1 = best) among the BM25 matches, or None when BM25 did not find it."""
    dense_rank: int | None
    """Its place (1 = nearest) among the embedding neighbours, or None when not among them."""
    fused_rank: int | None
    """Its place (1 = first) in the fused order of both rankings; None for a neighbour that
    neither ranking found (it was brought in by the boost)."""
    boosted: bool = False
    """It neighbours a strong hit (relevance above 0.7) and got +0.15 relevance for it."""


@dataclass(slots=True)
class _Keywords:
    version: str
    index: KeywordIndex
    chunks: dict[str, Chunk]


@dataclass(slots=True)
class _Loaded:
    source: str
    chunks: list[Chunk]
    replaces: bool
    """The index holds an older version of the source, to delete first."""


@dataclass(slots=True)
class _Skipped:
    source: str
    reason: str
    replaces: bool


_Unchanged = Literal["unchanged"]


# -- the library -------------------------------------------------------------------------------


class Library:
    """The documents a team asks questions of.

    An index, the embedder of its vectors, and the chunking that makes them.

    Build it with `Library.open(path)` (an index in a folder on this machine),
    `Library.connect(host, port)` (a shared Chroma server), or around any `Index`. Use it as
    an async context manager, or call `close()`.

    Args:
        index: where the chunks and their vectors are kept.
        embedder: the embedder of the index's vectors; `MiniLMEmbedder()` by default (offline).
        target_tokens: the chunker's target size (see `handrail.documents._chunker.chunk`).
        overlap: characters each chunk repeats from the one before.
        clock: seconds for `IngestReport.seconds` (injectable for tests).
        keyword_folder: where the BM25 index is saved with the index's version, so that the
            next process to open the index loads it instead of rebuilding it (`open` puts it
            in the index's folder); None keeps it in memory only (`connect`: see there).

    Raises:
        ConfigError: `target_tokens` or `overlap` is out of range, or the index holds the
            vectors of another embedder.
    """

    def __init__(
        self,
        index: Index,
        *,
        embedder: Embedder | None = None,
        target_tokens: int = 200,
        overlap: int = 200,
        clock: Callable[[], float] = time.perf_counter,
        keyword_folder: str | os.PathLike[str] | None = None,
    ) -> None:
        embedder = embedder if embedder is not None else MiniLMEmbedder()
        held = getattr(index, "embedder_name", None)
        if held is not None and held != embedder.name:
            raise ConfigError(
                f"Library({index!r}, embedder={embedder!r}): the index was opened for the "
                f"embedder {held!r}, not {embedder.name!r}. Pass the same embedder to both."
            )
        # The chunker checks its settings before it reads anything: fail here, not mid-ingest.
        chunk_document(_EMPTY, target_tokens=target_tokens, overlap=overlap)
        self.index = index
        self.embedder = embedder
        self.target_tokens = target_tokens
        self.overlap = overlap
        self._clock = clock
        self._keywords: _Keywords | None = None
        self._keywords_lock = asyncio.Lock()
        self._keyword_folder = None if keyword_folder is None else Path(keyword_folder)
        self._vectors: OrderedDict[str, Vectors] = OrderedDict()
        self._decompositions = DecompositionCache()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        embedder: Embedder | None = None,
        collection: str = "handrail",
        target_tokens: int = 200,
        overlap: int = 200,
    ) -> Library:
        """A library in a folder on this machine (an embedded, persistent Chroma).

        Args:
            path: the index's folder (created if missing).
            embedder: the embedder; `MiniLMEmbedder()` by default.
            collection: the Chroma collection, to keep several libraries in one folder.
            target_tokens: the chunker's target size.
            overlap: characters each chunk repeats from the one before.
        """
        embedder = embedder if embedder is not None else MiniLMEmbedder()
        index = ChromaIndex.persistent(path, embedder=embedder, collection=collection)
        return cls(
            index,
            embedder=embedder,
            target_tokens=target_tokens,
            overlap=overlap,
            keyword_folder=Path(path, _KEYWORDS, collection),
        )

    @classmethod
    def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        embedder: Embedder | None = None,
        collection: str = "handrail",
        ssl: bool = False,
        headers: dict[str, str] | None = None,
        target_tokens: int = 200,
        overlap: int = 200,
    ) -> Library:
        """A library on a shared Chroma server (`chroma run --path DIR --port PORT`).

        Its BM25 index is kept in this process's memory only: built at the first query,
        and again after any change (by this process or another), since the server has no
        place for it and a copy on this machine would be one per client machine to keep
        right. Pass `keyword_folder=` to `Library(ChromaIndex.http(...), ...)` to keep one
        on this machine all the same (it is checked against the server's version).

        Args:
            host: the server's host.
            port: the server's port.
            embedder: the embedder; `MiniLMEmbedder()` by default.
            collection: the Chroma collection.
            ssl: speak HTTPS.
            headers: sent with every request (an auth token, say).
            target_tokens: the chunker's target size.
            overlap: characters each chunk repeats from the one before.
        """
        embedder = embedder if embedder is not None else MiniLMEmbedder()
        index = ChromaIndex.http(
            host, port, embedder=embedder, collection=collection, ssl=ssl, headers=headers
        )
        return cls(index, embedder=embedder, target_tokens=target_tokens, overlap=overlap)

    def __repr__(self) -> str:
        return f"Library({self.index!r})"

    async def __aenter__(self) -> Library:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the index (a later call opens it again). The embedder is left as it is."""
        await self.index.close()

    # -- ingest --------------------------------------------------------------------------------

    async def ingest(
        self,
        folder: str | os.PathLike[str],
        *,
        progress: Callable[[IngestProgress], None] | None = None,
    ) -> IngestReport:
        """Bring the index in line with a folder: embed what is new or changed, drop what left.

        Args:
            folder: the documents' folder; files are found recursively, hidden ones (and
                those in hidden folders) aside.
            progress: called after each source is handled (in the event loop: keep it quick).

        Returns:
            What was done; files that could not be ingested are in `skipped` with the reason.

        Raises:
            DocumentLoadError: `folder` is not a folder (nothing is changed).
            DocumentIndexError: the embedder or the index failed.
        """
        began = self._clock()
        root = Path(folder)
        if not await asyncio.to_thread(root.is_dir):
            exists = await asyncio.to_thread(root.exists)
            what = "is not a folder" if exists else "does not exist"
            raise DocumentLoadError(
                f"{os.fspath(folder)}: {what}; pass the folder that holds the documents.",
                source=os.fspath(folder),
            )
        files = await asyncio.to_thread(_walk, root)
        version = await self.index.version()
        stored = await self.index.sources()
        present = {source for source, _ in files}
        vanished = [s for s in stored if s not in present and not s.startswith(NOTE_PREFIX)]
        report = IngestReport(files=len(files))
        total = len(files) + len(vanished)
        done = 0

        def tell(
            source: str, outcome: IngestOutcome, chunks: int = 0, why: str | None = None
        ) -> None:
            nonlocal done
            done += 1
            if progress is not None:
                progress(
                    IngestProgress(
                        source=source,
                        outcome=outcome,
                        done=done,
                        total=total,
                        chunks=chunks,
                        reason=why,
                    )
                )

        for source in vanished:
            await self.index.delete_source(source)
            report.deleted += 1
            tell(source, "deleted")

        pending: list[_Loaded] = []
        # A pipeline of two: while one batch is embedded (in worker threads), the next files
        # are read and chunked (in another), and the batch before is written.
        in_flight: asyncio.Task[tuple[list[_Loaded], Vectors]] | None = None

        async def embed(batch: list[_Loaded]) -> tuple[list[_Loaded], Vectors]:
            chunks = [c for loaded in batch for c in loaded.chunks]
            return batch, await self.embedder.embed([_embedding_text(c) for c in chunks])

        async def write(batch: list[_Loaded], vectors: Vectors) -> None:
            at = 0
            for loaded in batch:
                if loaded.replaces:
                    await self.index.delete_source(loaded.source)
                count = len(loaded.chunks)
                await self.index.upsert(loaded.chunks, vectors[at : at + count])
                at += count
                report.ingested += 1
                report.chunks_written += count
                tell(loaded.source, "ingested", count)

        async def flush() -> None:
            nonlocal in_flight
            batch = list(pending)
            pending.clear()
            previous, in_flight = in_flight, asyncio.create_task(embed(batch))
            if previous is not None:
                await write(*await previous)

        try:
            for source, path in files:
                prepared = await asyncio.to_thread(self._prepare, source, path, stored.get(source))
                if prepared == "unchanged":
                    report.unchanged += 1
                    tell(source, "unchanged")
                elif isinstance(prepared, _Skipped):
                    if prepared.replaces:
                        await self.index.delete_source(source)
                    report.skipped.append((source, prepared.reason))
                    tell(source, "skipped", why=prepared.reason)
                else:
                    pending.append(prepared)
                    if sum(len(loaded.chunks) for loaded in pending) >= _EMBED_BATCH:
                        await flush()
            if pending:
                await flush()
            if in_flight is not None:
                last, in_flight = in_flight, None
                await write(*await last)
        finally:
            if in_flight is not None:  # failed on the way: the batch being embedded is dropped
                in_flight.cancel()
        report.chunks_total = await self.index.count()
        if self._keyword_folder is not None and await self.index.version() != version:
            await self._keyword_index()  # built and saved now, so no query waits for it
        report.seconds = self._clock() - began
        return report

    def _prepare(
        self, source: str, path: Path, stored_hash: str | None
    ) -> _Loaded | _Skipped | _Unchanged:
        """Read, and when new or changed, load and chunk one file (in a worker thread)."""
        replaces = stored_hash is not None
        if source.startswith(NOTE_PREFIX):
            return _Skipped(
                source,
                f"its path starts with {NOTE_PREFIX!r}, which marks notes; rename it",
                replaces=False,
            )
        try:
            if Path(source).suffix.lower() not in SUPPORTED_SUFFIXES:
                load_bytes(b"", source=source)  # raises, with the loaders' own wording
            data = path.read_bytes()
        except DocumentLoadError as error:
            return _Skipped(source, _reason(error, source), replaces=replaces)
        except OSError as error:
            why = error.strerror or str(error)
            return _Skipped(source, f"cannot be read ({why})", replaces=replaces)
        if hashlib.sha256(data).hexdigest() == stored_hash:
            return "unchanged"
        try:
            document = load_bytes(data, source=source)
            chunks = chunk_document(
                document, target_tokens=self.target_tokens, overlap=self.overlap
            )
        except DocumentLoadError as error:
            return _Skipped(source, _reason(error, source), replaces=replaces)
        except (ImportError, ConfigError):
            raise  # the setup is wrong, not this file: every file would fail alike
        except Exception as error:  # a loader's bug on an odd file must not stop the batch
            return _Skipped(
                source,
                f"could not be read ({type(error).__name__}: {error}); please report it "
                f"to handrail with the file if you can",
                replaces=replaces,
            )
        if not chunks:
            return _Skipped(
                source,
                "no text found (a scanned PDF has none: OCR it first)",
                replaces=replaces,
            )
        return _Loaded(source, chunks, replaces=replaces)

    # -- notes ---------------------------------------------------------------------------------

    async def add_note(self, text: str, *, author: str, question: str | None = None) -> Chunk:
        """Keep a person's answer as a chunk that retrieval finds like any other.

        The note's source is `note:<author>`, its metadata `{"author": author}` plus
        `"question"` when one is given; its id is a hash of (author, question, text), so
        adding the same note twice keeps one. The question is embedded with the answer (so
        a later, similar question finds it) but is not part of the chunk's text.

        Args:
            text: the answer, as the person wrote it.
            author: who wrote it (a name or an id); shown as the source.
            question: the question it answers, when there was one.

        Raises:
            ConfigError: `text` or `author` is empty.
        """
        text, author = text.strip(), author.strip()
        if not text or not author:
            raise ConfigError(
                "Library.add_note(text=..., author=...): both must be non-empty; a note "
                "needs its answer and who gave it."
            )
        key = "\x00".join([author, question or "", text]).encode()
        digest = hashlib.sha256(key).hexdigest()
        metadata: dict[str, str | int | float | bool] = {"author": author}
        if question is not None:
            metadata["question"] = question
        note = Chunk(
            id=f"{digest[:16]}:0",
            source=f"{NOTE_PREFIX}{author}",
            text=text,
            index=0,
            start=0,
            end=len(text),
            content_hash=digest,
            metadata=metadata,
        )
        vectors = await self._embed_chunks([note])
        await self.index.upsert([note], vectors)
        return note

    # -- retrieve ------------------------------------------------------------------------------

    async def retrieve(
        self,
        query: str,
        *,
        top_k: int = 5,
        min_relevance: float = 0.5,
        neighbours: bool = True,
        model: Model | None = None,
    ) -> list[Evidence]:
        """The chunks that bear on `query`, most useful first, each with its relevance.

        1. Dense: the query's embedding against the index, `max(4 * top_k, 20)` nearest.
        2. Keyword: BM25 (stemmed) over every chunk, as many matches. Its index is built
           from `Index.chunks()` and rebuilt only when `Index.version()` changes.
        3. The two rankings are fused by reciprocal rank (`sum 1 / (60 + rank)`): that is
           the order. A chunk only BM25 found gets its cosine too (read back from the
           index, by a query over its source; recomputed when that is too big).
        4. Relevance is `relevance_from_cosine(cosine)`; chunks below `min_relevance` are
           dropped, and the first `top_k` left are kept.
        5. With `neighbours`, the chunks just before and after (`prev_id`, `next_id`) each
           kept chunk of relevance above 0.7 get +0.15 relevance (at most 1); those that
           then reach `min_relevance` are returned too, beyond `top_k` (at most two for each
           such chunk, so at most `3 * top_k` in all). Chunks that follow one another in a
           document are then returned next to each other, in document order, where the
           best of them ranks: the first item is not always the best ranked one (its
           `fused_rank` says). Without `neighbours`, the order is the fused order.

        Args:
            query: the question or words to look for.
            top_k: chunks to return at most (boosted neighbours aside); with `model`, for
                each sub-question.
            min_relevance: no chunk below this relevance (0-1) is returned.
            neighbours: boost the neighbours of strong hits, and return them beside them.
            model: when given, a multi-part question is first split into its sub-questions
                (one call to this model, cached by model name and question; see
                `decompose`); each is retrieved, and the results are merged, a chunk found
                by several keeping its highest relevance, taking each sub-question's best in
                turn.

        Returns:
            The evidence; [] when nothing reaches `min_relevance`.

        Raises:
            ConfigError: `top_k` or `min_relevance` is out of range.
            DocumentIndexError: the embedder or the index failed.
        """
        if top_k < 1:
            raise ConfigError(f"Library.retrieve(top_k={top_k}): ask for 1 chunk or more.")
        if not 0.0 <= min_relevance <= 1.0:
            raise ConfigError(
                f"Library.retrieve(min_relevance={min_relevance}): pass a relevance from 0 "
                f"to 1 (0.5 is the evidence/noise boundary)."
            )
        parts = [query]
        if model is not None:
            parts = await decompose(query, model, cache=self._decompositions)
        if len(parts) == 1:
            return await self._retrieve(parts[0], top_k, min_relevance, neighbours)
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(self._retrieve(part, top_k, min_relevance, neighbours))
                    for part in parts
                ]
        except BaseExceptionGroup as failed:  # the first failure is the one to tell
            raise failed.exceptions[0] from None
        return _merge([task.result() for task in tasks], arrange=neighbours)

    async def _retrieve(
        self, query: str, top_k: int, min_relevance: float, neighbours: bool
    ) -> list[Evidence]:
        wanted = max(top_k * 4, 20)
        query_vector = (await self.embedder.embed([query]))[0]
        dense, keywords = await asyncio.gather(
            self.index.query(query_vector, wanted), self._keyword_index()
        )
        hits = await asyncio.to_thread(keywords.index.search, query, wanted)
        chunks = {c.id: c for c, _ in dense}
        cosines = {c.id: cosine for c, cosine in dense}
        dense_rank = {c.id: rank for rank, (c, _) in enumerate(dense, 1)}
        keyword_rank = {id_: rank for rank, (id_, _) in enumerate(hits, 1)}
        extra = await self._chunks([id_ for id_ in keyword_rank if id_ not in chunks], keywords)
        chunks.update((c.id, c) for c in extra)
        cosines.update(await self._cosines(extra, query_vector))
        fused = {
            id_: sum(1.0 / (_RRF_K + r[id_]) for r in (dense_rank, keyword_rank) if id_ in r)
            for id_ in chunks
        }
        order = sorted(chunks, key=lambda id_: (-fused[id_], dense_rank.get(id_, math.inf), id_))
        candidates = {
            id_: Evidence(
                chunk=chunks[id_],
                relevance=relevance_from_cosine(cosines[id_]),
                cosine=cosines[id_],
                keyword_rank=keyword_rank.get(id_),
                dense_rank=dense_rank.get(id_),
                fused_rank=fused_rank,
            )
            for fused_rank, id_ in enumerate(order, 1)
        }
        kept = [item for item in candidates.values() if item.relevance >= min_relevance]
        kept = kept[:top_k]
        if not neighbours:
            return kept
        kept = await self._boost(kept, candidates, keywords, query_vector, min_relevance)
        return _arrange(kept)

    async def _boost(
        self,
        kept: list[Evidence],
        candidates: dict[str, Evidence],
        keywords: _Keywords,
        query_vector: Vectors,
        min_relevance: float,
    ) -> list[Evidence]:
        """`kept` with the neighbours of its strong hits boosted, and added when they qualify."""
        near: list[str] = []  # neighbours of a strong hit, in the order of their hit
        for item in kept:
            if item.relevance > _STRONG:
                for id_ in (item.chunk.prev_id, item.chunk.next_id):
                    if id_ is not None and id_ not in near:
                        near.append(id_)
        if not near:
            return kept
        unseen = await self._chunks([id_ for id_ in near if id_ not in candidates], keywords)
        cosines = await self._cosines(unseen, query_vector)
        found = dict(candidates)
        for chunk in unseen:
            found[chunk.id] = Evidence(
                chunk=chunk,
                relevance=relevance_from_cosine(cosines[chunk.id]),
                cosine=cosines[chunk.id],
                keyword_rank=None,
                dense_rank=None,
                fused_rank=None,
            )
        out = [_boosted(item) if item.chunk.id in near else item for item in kept]
        held = {item.chunk.id for item in kept}
        for id_ in near:
            if id_ not in held and id_ in found:
                item = _boosted(found[id_])
                if item.relevance >= min_relevance:
                    out.append(item)
        return out

    async def _keyword_index(self) -> _Keywords:
        """The BM25 index of the index's chunks, rebuilt when the index's version changed."""
        version = await self.index.version()
        current = self._keywords
        if current is not None and current.version == version:
            return current
        async with self._keywords_lock:
            current = self._keywords
            if current is not None and current.version == version:
                return current
            folder = self._keyword_folder
            if folder is not None:
                loaded = await asyncio.to_thread(KeywordIndex.load, folder, version=version)
                if loaded is not None:  # saved for this very version: no chunk read
                    self._keywords = _Keywords(version, loaded, {})
                    return self._keywords
            # The version is read before the chunks: a write in between leaves it stale, and
            # the next query rebuilds.
            chunks = await self.index.chunks()
            built = await asyncio.to_thread(KeywordIndex.build, chunks)
            if folder is not None:
                try:
                    await asyncio.to_thread(built.save, folder, version=version)
                except OSError as error:  # a cache: the index in memory is right regardless
                    _log.warning("Could not save the keyword index to %s: %s", folder, error)
            self._keywords = _Keywords(version, built, {c.id: c for c in chunks})
            return self._keywords

    async def _chunks(self, ids: Sequence[str], keywords: _Keywords) -> list[Chunk]:
        """The chunks with these ids, from the keyword index's copy or else from the index."""
        found = {id_: keywords.chunks[id_] for id_ in ids if id_ in keywords.chunks}
        missing = [id_ for id_ in ids if id_ not in found]
        if missing:
            found.update((c.id, c) for c in await self.index.get(missing))
        return [found[id_] for id_ in ids if id_ in found]

    async def _cosines(self, chunks: Sequence[Chunk], query_vector: Vectors) -> dict[str, float]:
        """The chunks' cosine similarities to the query.

        From the vectors the index stores (one read by id, about 1 ms for 20 chunks); a chunk
        the index does not hold (a note added since the keyword index was built) is embedded.
        """
        if not chunks:
            return {}
        stored = await self.index.vectors([c.id for c in chunks])
        found = {id_: float(vector @ query_vector) for id_, vector in stored.items()}
        rest = [c for c in chunks if c.id not in found]
        if rest:
            similarities = (await self._embed_chunks(rest)) @ query_vector
            found.update((c.id, float(s)) for c, s in zip(rest, similarities, strict=True))
        return found

    async def _embed_chunks(self, chunks: Sequence[Chunk]) -> Vectors:
        """The chunks' vectors, as ingest made them; recent ones are remembered."""
        texts = [_embedding_text(c) for c in chunks]
        missing = sorted({t for t in texts if t not in self._vectors})
        if missing:
            vectors = await self.embedder.embed(missing)
            for text, vector in zip(missing, vectors, strict=True):
                self._vectors[text] = vector
        out = np.stack([self._vectors[t] for t in texts]).astype(np.float32)
        for text in texts:
            self._vectors.move_to_end(text)
        while len(self._vectors) > _VECTOR_CACHE:
            self._vectors.popitem(last=False)
        return out


# -- helpers -----------------------------------------------------------------------------------

_EMPTY = Document(source="", text="", blocks=(), content_hash="")


def _walk(root: Path) -> list[tuple[str, Path]]:
    """Every file under `root` (hidden files and folders aside), by source."""
    found: list[tuple[str, Path]] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if not name.startswith("."):
                path = Path(folder, name)
                found.append((path.relative_to(root).as_posix(), path))
    found.sort()
    return found


def _reason(error: DocumentLoadError, source: str) -> str:
    """A load error's message without the file's name, which the report shows beside it."""
    message = str(error)
    return message.removeprefix(f"{source}: ")


def _embedding_text(chunk: Chunk) -> str:
    """What is embedded for a chunk: its text, after what the text alone would not say.

    Its heading path (less the last heading when the text starts with it), a table's header
    rows (for a chunk that starts inside a table), and a note's question. On the calibration
    questions (see `relevance_from_cosine`) the heading path raised the answers' cosines by
    0.03 on average and lowered the noise's.
    """
    path = list(chunk.headings)
    if path and chunk.text.lstrip("#> \t").startswith(path[-1]):
        path.pop()
    before = [" > ".join(path)] if path else []
    before += [
        value
        for key in ("table_header", "question")
        if isinstance(value := chunk.metadata.get(key), str) and value
    ]
    return "\n".join([*before, chunk.text])


def _boosted(item: Evidence) -> Evidence:
    return Evidence(
        chunk=item.chunk,
        relevance=min(1.0, item.relevance + _BOOST),
        cosine=item.cosine,
        keyword_rank=item.keyword_rank,
        dense_rank=item.dense_rank,
        fused_rank=item.fused_rank,
        boosted=True,
    )


def _arrange(items: Sequence[Evidence]) -> list[Evidence]:
    """`items`, with chunks that follow one another in a document put together.

    A run of consecutive chunks stands, in document order, where its first member in
    `items`' order stood.
    """
    by_id = {item.chunk.id: item for item in items}
    placed: set[str] = set()
    out: list[Evidence] = []
    for item in items:
        if item.chunk.id in placed:
            continue
        first, seen = item, {item.chunk.id}
        while (before := first.chunk.prev_id) in by_id and before not in seen:
            first = by_id[before]
            seen.add(before)
        current: Evidence | None = first
        while current is not None and current.chunk.id not in placed:
            out.append(current)
            placed.add(current.chunk.id)
            after = current.chunk.next_id
            current = by_id.get(after) if after is not None else None
    return out


def _merge(results: Sequence[Sequence[Evidence]], *, arrange: bool) -> list[Evidence]:
    """The evidence of several sub-questions, merged.

    Each one's best in turn; one item a chunk, the one of highest relevance.
    """
    best: dict[str, Evidence] = {}
    for position in range(max((len(r) for r in results), default=0)):
        for result in results:
            if position < len(result):
                item = result[position]
                held = best.get(item.chunk.id)
                if held is None or item.relevance > held.relevance:
                    best[item.chunk.id] = item  # a new key goes last; a replaced one stays
    merged = list(best.values())
    return _arrange(merged) if arrange else merged
