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

**Retrieve** is hybrid: the nearest chunks by embedding and the best BM25 matches are the
candidates; each gets a `relevance` (0-1) from its cosine similarity to the query and its
keyword score (`relevance_from_cosine`), and they are ordered by it. Chunks below
`min_relevance` are never returned, and never more than `top_k` (see `Library.retrieve`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, TypeAlias

import numpy as np

from ..exceptions import ConfigError, DocumentLoadError
from ..models import Model
from ._chunker import DEFAULT_TARGET_TOKENS, EMBEDDING_PREFIX_WORD_PIECES, count_word_pieces
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

COSINE_WEIGHT = 6.04
"""Log-odds of relevance per unit of cosine similarity (query to chunk)."""
KEYWORD_WEIGHT = 0.51
"""Log-odds of relevance for a chunk that is the query's best BM25 match (its keyword score
relative to the best match's: 0 to 1)."""
RELEVANCE_BIAS = -2.85
"""Log-odds at cosine 0 with no keyword match; with the weights above, relevance 0.5 falls at
cosine 0.47 for a chunk BM25 did not find, and 0.39 for the best keyword match."""

_EMBED_BATCH = 128
"""Chunks embedded together during ingest: small files share an embedder call, and MiniLM
spreads its model calls (about 5 chunks each) over the cores, so a batch keeps them busy to
its end; the next batch is read and chunked meanwhile. A bigger file is embedded this many
chunks at a time, so the progress bar moves inside it."""
_KEYWORDS = "handrail-keywords"
"""The folder, inside `Library.open`'s, of the saved BM25 indexes (one a collection)."""
_VECTOR_CACHE = 4096
"""Recomputed chunk vectors kept for the next query."""
_CANDIDATES = 30
"""Each ranking's candidates, at least (more for a larger `top_k`: `4 * top_k`)."""


def relevance_from_cosine(cosine: float, keyword: float = 0.0) -> float:
    """How strongly a chunk bears on a query, from 0 (noise) to 1 (evidence); 0.5 is the boundary.

    `sigmoid(6.04 * cosine + 0.51 * keyword - 2.85)`, where `cosine` is the query-chunk
    cosine similarity and `keyword` the chunk's BM25 score over the best BM25 score among the
    query's matches (0 when BM25 did not find it). It is monotone in both, and retrieval
    ranks by it, so the first item returned is always the best-ranked one.

    **How it was fitted, and what it is not.** The two weights are a logistic regression of
    "this candidate holds the answer" on the two signals, over the 79 frozen questions of the
    Git manual (`bench/corpora.py`, corpus `git`: 3,021 chunks); the bias then places 0.5
    where 90% of the answer passages that retrieval found in its first 5 keep at least 0.5.
    Nothing was fitted on the Python manual or on this repository's docs/, where it is
    reported (docs/documents.md). It is an evidence/noise scale, not the probability that the
    passage answers: on manuals whose unanswerable questions are close to their topics, no
    retrieval signal tells them from answerable ones (measured: the best cosine separates
    them worse than chance on both development manuals), so deciding whether the evidence
    answers is the answering model's job. It does separate questions off the documents'
    topics (an off-topic question's best chunk rarely reaches 0.5).

    It is calibrated for the default embedder, all-MiniLM-L6-v2, with chunks embedded as
    ingest embeds them. An embedder of another family has its own scale: calibrate
    `min_relevance` for it on your own questions (`handrail eval`, kind documents).
    """
    logit = COSINE_WEIGHT * cosine + KEYWORD_WEIGHT * keyword + RELEVANCE_BIAS
    return 1.0 / (1.0 + math.exp(-logit))


# -- results -----------------------------------------------------------------------------------

IngestOutcome: TypeAlias = Literal["ingested", "unchanged", "deleted", "skipped", "embedding"]
"""What ingest did with a source: embedded it (new or changed), left it (same bytes),
removed it (it left the folder), or skipped it (the reason says why); or, for a source with
more chunks than one embedding batch, that it is still being embedded (`done` does not count
it yet; `bytes_done` has moved)."""


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
    bytes_done: int = 0
    """Bytes of the folder's files handled so far; an ingested file's bytes count as its
    chunks are embedded, so that a progress bar moves during a big file too."""
    bytes_total: int = 0
    """Bytes of the folder's files (a source that left the folder counts none)."""


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
    """0 (noise) to 1 (evidence), 0.5 the boundary: `relevance_from_cosine(cosine, keyword)`.
    Never below the `min_relevance` it was retrieved with."""
    cosine: float
    """The cosine similarity of the chunk's embedding to the query's."""
    keyword: float
    """Its BM25 score over the best BM25 score among the query's matches (0 to 1; 0 when BM25
    did not find it)."""
    keyword_rank: int | None
    """Its place (1 = best) among the BM25 matches, or None when BM25 did not find it."""
    dense_rank: int | None
    """Its place (1 = nearest) among the embedding neighbours, or None when not among them."""
    fused_rank: int
    """Its place (1 = first) in the combined order, by relevance, of both rankings'
    candidates: the order retrieval returns."""


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
        target_tokens: int = DEFAULT_TARGET_TOKENS,
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
        target_tokens: int = DEFAULT_TARGET_TOKENS,
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
        target_tokens: int = DEFAULT_TARGET_TOKENS,
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

    async def clear(self) -> None:
        """Remove every chunk from the index, notes included (`Index.clear`).

        The library stays usable: the next `ingest` embeds the folder again from scratch.

        Raises:
            DocumentIndexError: the index failed.
        """
        await self.index.clear()
        self._keywords = None

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
        sizes = dict(await asyncio.to_thread(_sizes, files))
        bytes_total = sum(sizes.values())
        done = bytes_done = shown = 0  # shown: the most bytes told, so the count never falls

        def tell(
            source: str,
            outcome: IngestOutcome,
            chunks: int = 0,
            why: str | None = None,
            embedded: int = 0,
        ) -> None:
            nonlocal done, bytes_done, shown
            if outcome != "embedding":
                done += 1
            handled = embedded if outcome == "embedding" else sizes.get(source, 0)
            shown = max(shown, bytes_done + handled)
            if progress is not None:
                progress(
                    IngestProgress(
                        source=source,
                        outcome=outcome,
                        done=done,
                        total=total,
                        chunks=chunks,
                        reason=why,
                        bytes_done=shown,
                        bytes_total=bytes_total,
                    )
                )
            if outcome != "embedding":
                bytes_done += sizes.get(source, 0)

        for source in vanished:
            await self.index.delete_source(source)
            report.deleted += 1
            tell(source, "deleted")

        pending: list[_Loaded] = []
        # A pipeline of two: while one batch is embedded (in worker threads), the next files
        # are read and chunked (in another), and the batch before is written.
        in_flight: asyncio.Task[tuple[list[_Loaded], Vectors]] | None = None

        def embedding(batch: list[_Loaded], embedded: int) -> None:
            """`embedded` of the batch's chunks have their vectors: tell whose they are."""
            before = 0  # the bytes of the batch's files already embedded
            for loaded in batch:
                size = sizes.get(loaded.source, 0)
                if embedded < len(loaded.chunks):
                    part = round(size * embedded / len(loaded.chunks))
                    tell(loaded.source, "embedding", embedded=before + part)
                    return
                embedded -= len(loaded.chunks)
                before += size

        async def embed(batch: list[_Loaded]) -> tuple[list[_Loaded], Vectors]:
            texts = [_embedding_text(c) for loaded in batch for c in loaded.chunks]
            parts = []
            for at in range(0, len(texts), _EMBED_BATCH):  # a batch at a time: the bar moves
                parts.append(await self.embedder.embed(texts[at : at + _EMBED_BATCH]))
                if at + _EMBED_BATCH < len(texts):
                    embedding(batch, at + _EMBED_BATCH)
            return batch, np.concatenate(parts) if len(parts) > 1 else parts[0]

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
        neighbours: bool | None = None,
        model: Model | None = None,
    ) -> list[Evidence]:
        """The chunks that bear on `query`, best first, each with its relevance.

        1. Dense: the query's embedding against the index, `max(4 * top_k, 30)` nearest.
        2. Keyword: BM25 (stemmed) over every chunk's text with its page title and heading
           path, as many matches. Its index is built from `Index.chunks()` and rebuilt only
           when `Index.version()` changes.
        3. Every candidate of either ranking gets its cosine (a chunk only BM25 found has it
           read back from the index) and its keyword score (its BM25 score over the best
           match's), and its relevance from both (`relevance_from_cosine`). Candidates are
           ordered by relevance: a chunk first for one ranking and far down the other keeps
           the place its own strength earns, and the first item is the best.
        4. Chunks below `min_relevance` are dropped, and the first `top_k` left are returned:
           never more, never one under the threshold.

        Args:
            query: the question or words to look for.
            top_k: chunks to return at most; with `model`, for each sub-question.
            min_relevance: no chunk below this relevance (0-1) is returned.
            neighbours: no longer used (the neighbour boost could lift a chunk over
                `min_relevance` and return more than `top_k`); passing it warns.
            model: when given, a multi-part question is first split into its sub-questions
                (one call to this model, cached by model name and question; see
                `decompose`); each is retrieved, and the results are merged, a chunk found
                by several keeping its highest relevance, taking each sub-question's best in
                turn.

        Returns:
            The evidence, best first; [] when nothing reaches `min_relevance`.

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
        if neighbours is not None:
            warnings.warn(
                "Library.retrieve(neighbours=...) no longer does anything: retrieval returns "
                "at most top_k chunks, none under min_relevance, best first. Drop the argument.",
                DeprecationWarning,
                stacklevel=2,
            )
        parts = [query]
        if model is not None:
            parts = await decompose(query, model, cache=self._decompositions)
        if len(parts) == 1:
            return await self._retrieve(parts[0], top_k, min_relevance)
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(self._retrieve(part, top_k, min_relevance)) for part in parts
                ]
        except BaseExceptionGroup as failed:  # the first failure is the one to tell
            raise failed.exceptions[0] from None
        return _merge([task.result() for task in tasks])

    async def _retrieve(self, query: str, top_k: int, min_relevance: float) -> list[Evidence]:
        wanted = max(top_k * 4, _CANDIDATES)
        query_vector = (await self.embedder.embed([query]))[0]
        dense, keywords = await asyncio.gather(
            self.index.query(query_vector, wanted), self._keyword_index()
        )
        hits = await asyncio.to_thread(keywords.index.search, query, wanted)
        chunks = {c.id: c for c, _ in dense}
        cosines = {c.id: cosine for c, cosine in dense}
        dense_rank = {c.id: rank for rank, (c, _) in enumerate(dense, 1)}
        keyword_rank = {id_: rank for rank, (id_, _) in enumerate(hits, 1)}
        best = hits[0][1] if hits else 0.0
        keyword = {id_: score / best for id_, score in hits} if best > 0 else {}
        extra = await self._chunks([id_ for id_ in keyword_rank if id_ not in chunks], keywords)
        chunks.update((c.id, c) for c in extra)
        cosines.update(await self._cosines(extra, query_vector))
        relevance = {
            id_: relevance_from_cosine(cosines[id_], keyword.get(id_, 0.0)) for id_ in chunks
        }
        order = sorted(
            chunks, key=lambda id_: (-relevance[id_], dense_rank.get(id_, math.inf), id_)
        )
        out: list[Evidence] = []
        for rank, id_ in enumerate(order, 1):
            if len(out) == top_k or relevance[id_] < min_relevance:
                break
            out.append(
                Evidence(
                    chunk=chunks[id_],
                    relevance=relevance[id_],
                    cosine=cosines[id_],
                    keyword=keyword.get(id_, 0.0),
                    keyword_rank=keyword_rank.get(id_),
                    dense_rank=dense_rank.get(id_),
                    fused_rank=rank,
                )
            )
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
            built = await asyncio.to_thread(KeywordIndex.build, chunks, _embedding_text)
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


def _sizes(files: list[tuple[str, Path]]) -> list[tuple[str, int]]:
    """Each file's size in bytes (0 for one that cannot be read: it will be skipped)."""
    found = []
    for source, path in files:
        try:
            found.append((source, path.stat().st_size))
        except OSError:
            found.append((source, 0))
    return found


def _reason(error: DocumentLoadError, source: str) -> str:
    """A load error's message without the file's name, which the report shows beside it."""
    message = str(error)
    return message.removeprefix(f"{source}: ")


def _embedding_text(chunk: Chunk) -> str:
    """What is embedded and keyword-indexed for a chunk: its text, after what it cannot say.

    Its page's title (`metadata["title"]`, when the heading path does not start with it), its
    heading path (less the last heading when the text starts with it), a table's header rows
    (for a chunk that starts inside a table), and a note's question; a heading path longer than
    the room the chunker left for it (`EMBEDDING_PREFIX_WORD_PIECES`) loses its middle
    headings, so the embedder never cuts the passage's end. A passage deep in a
    manual rarely names what it is about; its page and section do. Keyword-indexing them
    raised recall@10 of reciprocal-rank fusion on the Git manual's questions (the tuning corpus)
    from 0.37 to 0.39 (0.44 to 0.45 with the loaders and embedder that followed).
    """
    path = list(chunk.headings)
    title = chunk.metadata.get("title")
    if isinstance(title, str) and title.strip() and (not path or path[0] != title):
        path.insert(0, title.strip())
    if path and chunk.text.lstrip("#> \t").startswith(path[-1]):
        path.pop()
    while len(path) > 2 and count_word_pieces(" > ".join(path)) > EMBEDDING_PREFIX_WORD_PIECES:
        del path[1]  # the chunker left room for this much: keep the title and nearest heading
    before = [" > ".join(path)] if path else []
    before += [
        value
        for key in ("table_header", "question")
        if isinstance(value := chunk.metadata.get(key), str) and value
    ]
    return "\n".join([*before, chunk.text])


def _merge(results: Sequence[Sequence[Evidence]]) -> list[Evidence]:
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
    return list(best.values())
