"""KeywordIndex: BM25 with English stemming and stopwords."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handrail.documents import _library
from handrail.documents._embed import Vectors, normalize
from handrail.documents._index import ChromaIndex
from handrail.documents._keyword import KeywordIndex
from handrail.documents._library import Library
from handrail.documents._types import Chunk
from handrail.exceptions import DocumentIndexError


def chunk(index: int, text: str) -> Chunk:
    return Chunk(id=f"c{index}", source="faq.md", text=text, index=index, start=0, end=len(text))


CORPUS = [
    chunk(0, "Orders are refunded within 14 days of the return arriving."),
    chunk(1, "The office cat is named Tom."),
    chunk(2, "Refund requests need the order number. Refund requests are answered by email."),
    chunk(3, "Shipping to Canada takes 5-7 business days."),
    chunk(4, "of the and to is"),  # stopwords only
    chunk(5, "Error SKU-4471 means the warehouse has no stock."),
]


@pytest.fixture(scope="module")
def keywords() -> KeywordIndex:
    return KeywordIndex.build(CORPUS)


def ids(hits: list[tuple[str, float]]) -> list[str]:
    return [chunk_id for chunk_id, _ in hits]


def test_a_word_finds_its_other_forms(keywords: KeywordIndex) -> None:
    hits = keywords.search("refunds", k=10)

    assert ids(hits) == ["c2", "c0"]  # c2 says "refund" twice
    assert hits[0][1] > hits[1][1] > 0


def test_stemming_works_from_either_side(keywords: KeywordIndex) -> None:
    assert sorted(ids(keywords.search("refunding orders", k=10))) == ["c0", "c2"]
    assert "c1" in ids(keywords.search("cats", k=10))


def test_a_query_of_stopwords_only_finds_nothing(keywords: KeywordIndex) -> None:
    assert keywords.search("the and of to is", k=5) == []
    assert keywords.search("", k=5) == []
    assert keywords.search("?! -- ...", k=5) == []


def test_words_no_chunk_has_find_nothing(keywords: KeywordIndex) -> None:
    assert keywords.search("zebra giraffe", k=5) == []


def test_unknown_words_do_not_hide_known_ones(keywords: KeywordIndex) -> None:
    assert ids(keywords.search("zebra shipping", k=5)) == ["c3"]


def test_codes_and_numbers_are_words(keywords: KeywordIndex) -> None:
    assert ids(keywords.search("4471", k=5)) == ["c5"]
    assert ids(keywords.search("sku", k=5)) == ["c5"]


def test_search_returns_at_most_k_best_first(keywords: KeywordIndex) -> None:
    everything = keywords.search("refund order cat shipping stock", k=10)
    top_two = keywords.search("refund order cat shipping stock", k=2)

    assert top_two == everything[:2]
    scores = [score for _, score in everything]
    assert scores == sorted(scores, reverse=True)
    assert keywords.search("refund", k=0) == []


def test_equal_scores_keep_build_order() -> None:
    same = KeywordIndex.build([chunk(i, "identical refund text") for i in range(5)])

    assert ids(same.search("refund", k=3)) == ["c0", "c1", "c2"]


def test_an_empty_corpus_finds_nothing() -> None:
    empty = KeywordIndex.build([])

    assert len(empty) == 0
    assert empty.search("refund", k=5) == []


def test_a_corpus_of_stopwords_only_finds_nothing() -> None:
    stop = KeywordIndex.build([chunk(0, "the and of"), chunk(1, "")])

    assert len(stop) == 2
    assert stop.search("the", k=5) == []
    assert stop.search("refund", k=5) == []


def test_search_is_safe_from_several_threads(keywords: KeywordIndex) -> None:
    expected = keywords.search("refunds orders", k=5)
    results: list[list[tuple[str, float]]] = []

    def search() -> None:
        for _ in range(200):
            results.append(keywords.search("refunds orders", k=5))

    threads = [threading.Thread(target=search) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(results) == 800
    assert all(result == expected for result in results)


# -- saved and loaded ----------------------------------------------------------------------------

QUERIES = ["refunds", "refunding orders", "cats", "4471", "zebra shipping", "the and"]


def test_a_saved_index_loads_for_its_version_and_finds_the_same(
    keywords: KeywordIndex, tmp_path: Path
) -> None:
    keywords.save(tmp_path / "kw", version="v1")

    loaded = KeywordIndex.load(tmp_path / "kw", version="v1")

    assert loaded is not None
    assert len(loaded) == len(keywords)
    for query in QUERIES:
        assert loaded.search(query, k=10) == keywords.search(query, k=10)


def test_nothing_saved_or_another_version_loads_nothing(
    keywords: KeywordIndex, tmp_path: Path
) -> None:
    assert KeywordIndex.load(tmp_path / "kw", version="v1") is None
    keywords.save(tmp_path / "kw", version="v1")

    assert KeywordIndex.load(tmp_path / "kw", version="v2") is None


def test_saving_again_replaces_the_copy(keywords: KeywordIndex, tmp_path: Path) -> None:
    keywords.save(tmp_path / "kw", version="v1")
    other = KeywordIndex.build([chunk(9, "Zebras graze at dawn.")])
    other.save(tmp_path / "kw", version="v2")

    loaded = KeywordIndex.load(tmp_path / "kw", version="v2")

    assert loaded is not None
    assert ids(loaded.search("zebra", k=5)) == ["c9"]
    assert KeywordIndex.load(tmp_path / "kw", version="v1") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kw"]  # no drafts left behind


def test_an_empty_index_saves_and_loads(tmp_path: Path) -> None:
    KeywordIndex.build([]).save(tmp_path / "kw", version="v1")

    loaded = KeywordIndex.load(tmp_path / "kw", version="v1")

    assert loaded is not None
    assert len(loaded) == 0
    assert loaded.search("refund", k=5) == []


def damage(folder: Path, how: str) -> None:
    if how == "manifest-garbled":
        (folder / "manifest.json").write_text("{not json", "utf-8")
    elif how == "manifest-gone":
        (folder / "manifest.json").unlink()
    elif how == "ids-changed":
        (folder / "ids.json").write_text('["c5", "c4", "c3", "c2", "c1", "c0"]', "utf-8")
    elif how == "scores-flipped":
        target = max((p for p in folder.rglob("*.npy")), key=lambda p: p.stat().st_size)
        data = bytearray(target.read_bytes())
        data[-1] ^= 0xFF
        target.write_bytes(bytes(data))
    elif how == "file-gone":
        next(folder.rglob("*.npy")).unlink()
    elif how == "truncated":
        for path in folder.rglob("*.npy"):
            path.write_bytes(path.read_bytes()[:20])


@pytest.mark.parametrize(
    "how",
    [
        "manifest-garbled",
        "manifest-gone",
        "ids-changed",
        "scores-flipped",
        "file-gone",
        "truncated",
    ],
)
def test_a_damaged_copy_is_never_trusted(
    keywords: KeywordIndex, tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    keywords.save(tmp_path / "kw", version="v1")
    damage(tmp_path / "kw", how)

    assert KeywordIndex.load(tmp_path / "kw", version="v1") is None
    if how != "manifest-gone":  # gone is "never saved", not damage
        assert "rebuilding it" in caplog.text


# -- in a Library ----------------------------------------------------------------------------------


class HashEmbedder:
    """Vectors from the words' hashes: deterministic, instant, good enough to rank."""

    name = "test-hash-words"
    dimensions = 64

    async def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row, int(hashlib.sha256(word.encode()).hexdigest(), 16) % 64] += 1.0
            out[row, 0] += 0.01  # no zero rows
        return normalize(out)


class CountingIndex:
    """A ChromaIndex that counts whole-index reads (each one a keyword-index rebuild)."""

    def __init__(self, inner: ChromaIndex) -> None:
        self.inner = inner
        self.embedder_name = inner.embedder_name
        self.reads = 0

    async def chunks(self) -> list[Chunk]:
        self.reads += 1
        return await self.inner.chunks()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


FILES = {
    "refunds.md": "# Refunds\n\nRefunds are issued within 14 days to the card that paid.\n",
    "shipping.md": "# Shipping\n\nParcels to Canada take 5-7 business days. SKU-4471 ships last.\n",
    "cats.md": "# The office\n\nThe office cat is named Tom and sleeps on the printer.\n",
}
QUESTIONS = ["How long do refunds take?", "SKU-4471", "Where does the cat sleep?", "zebra"]


def counting_library(path: Path) -> tuple[Library, CountingIndex]:
    embedder = HashEmbedder()
    index = CountingIndex(ChromaIndex.persistent(path, embedder=embedder))
    library = Library(index, embedder=embedder, keyword_folder=path / "handrail-keywords" / "x")
    return library, index


async def answers(library: Library) -> list[list[tuple[str, int | None]]]:
    out = []
    for question in QUESTIONS:
        found = await library.retrieve(question, min_relevance=0.0)
        out.append([(item.chunk.id, item.keyword_rank) for item in found])
    return out


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in FILES.items():
        (docs / name).write_text(text, "utf-8")
    return docs


async def test_library_open_saves_the_keyword_index_beside_the_index(
    tmp_path: Path, folder: Path
) -> None:
    async with Library.open(tmp_path / "index", embedder=HashEmbedder()) as library:
        await library.ingest(folder)

    assert (tmp_path / "index" / "handrail-keywords" / "handrail" / "manifest.json").is_file()


async def test_the_first_query_after_reopening_reads_no_chunk(tmp_path: Path, folder: Path) -> None:
    library, index = counting_library(tmp_path / "index")
    async with library:
        await library.ingest(folder)  # builds and saves it: no query waits
        first = await answers(library)
    assert index.reads == 1

    reopened, index = counting_library(tmp_path / "index")
    async with reopened:
        again = await answers(reopened)

    assert index.reads == 0  # loaded, not rebuilt
    assert again == first
    assert any(rank is not None for result in again for _, rank in result)


async def test_an_ingest_change_rebuilds_it_and_saves_the_new_one(
    tmp_path: Path, folder: Path
) -> None:
    library, _ = counting_library(tmp_path / "index")
    async with library:
        await library.ingest(folder)
        assert (await library.retrieve("zebra", min_relevance=0.0))[0].keyword_rank is None
        (folder / "zoo.md").write_text("# Zoo\n\nThe zebra eats hay at noon.\n", "utf-8")
        await library.ingest(folder)
        found = await library.retrieve("zebra", min_relevance=0.0)
    assert found[0].chunk.source == "zoo.md"
    assert found[0].keyword_rank == 1

    reopened, index = counting_library(tmp_path / "index")
    async with reopened:
        again = await reopened.retrieve("zebra", min_relevance=0.0)
    assert index.reads == 0
    assert again[0].chunk.source == "zoo.md"
    assert again[0].keyword_rank == 1


async def test_a_note_makes_the_saved_copy_stale(tmp_path: Path, folder: Path) -> None:
    library, _ = counting_library(tmp_path / "index")
    async with library:
        await library.ingest(folder)
        await library.add_note("Giraffes are tall.", author="ana")

    reopened, index = counting_library(tmp_path / "index")
    async with reopened:
        found = await reopened.retrieve("giraffes", min_relevance=0.0)
        await reopened.retrieve("giraffes", min_relevance=0.0)
    assert index.reads == 1  # stale: rebuilt once, then kept
    assert found[0].chunk.source == "note:ana"
    assert found[0].keyword_rank == 1


@pytest.mark.parametrize("how", ["manifest-garbled", "scores-flipped", "file-gone", "truncated"])
async def test_a_damaged_copy_is_rebuilt_with_the_same_results(
    tmp_path: Path, folder: Path, how: str
) -> None:
    library, _ = counting_library(tmp_path / "index")
    async with library:
        await library.ingest(folder)
        first = await answers(library)
    damage(tmp_path / "index" / "handrail-keywords" / "x", how)

    reopened, index = counting_library(tmp_path / "index")
    async with reopened:
        again = await answers(reopened)
    assert index.reads == 1
    assert again == first

    third, index = counting_library(tmp_path / "index")  # and the rebuilt copy was saved
    async with third:
        assert await answers(third) == first
    assert index.reads == 0


async def test_a_keyword_folder_that_cannot_be_written_only_costs_a_rebuild(
    tmp_path: Path, folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the folder would go", "utf-8")
    embedder = HashEmbedder()
    index = ChromaIndex.persistent(tmp_path / "index", embedder=embedder)
    async with Library(index, embedder=embedder, keyword_folder=blocker / "kw") as library:
        await library.ingest(folder)
        found = await library.retrieve("SKU-4471", min_relevance=0.0)
    assert found[0].chunk.source == "shipping.md"
    assert "Could not save the keyword index" in caplog.text


# -- ingest's pipeline (embedding one batch while the one before is written) ----------------------


class FailingEmbedder(HashEmbedder):
    def __init__(self, fail_at: int) -> None:
        self.calls = 0
        self.fail_at = fail_at

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.calls += 1
        if self.calls == self.fail_at:
            raise DocumentIndexError("the model failed (test)")
        await asyncio.sleep(0.01)
        return await super().embed(texts)


async def test_an_embedder_failure_mid_ingest_leaves_whole_sources_and_a_rerun_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_library, "_EMBED_BATCH", 1)  # a batch a file
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(6):
        (docs / f"f{i}.md").write_text(f"# File {i}\n\nWord{i} appears here only.\n", "utf-8")
    failing = FailingEmbedder(fail_at=4)
    index = ChromaIndex.persistent(tmp_path / "index", embedder=failing)
    async with Library(index, embedder=failing) as library:
        with pytest.raises(DocumentIndexError, match="test"):
            await library.ingest(docs)
        held = await library.index.sources()
    assert set(held) <= {"f0.md", "f1.md", "f2.md"}  # written in order, none after the failure
    assert len(held) >= 2  # the pipeline wrote the batches embedded before it

    working = HashEmbedder()
    index = ChromaIndex.persistent(tmp_path / "index", embedder=working)
    async with Library(index, embedder=working) as library:
        report = await library.ingest(docs)
        assert report.unchanged == len(held)
        assert report.ingested == 6 - len(held)
        assert sorted(await library.index.sources()) == [f"f{i}.md" for i in range(6)]


async def test_progress_reports_every_file_once_in_order_across_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_library, "_EMBED_BATCH", 2)
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(7):
        (docs / f"f{i}.md").write_text(f"# File {i}\n\nWord{i} appears here only.\n", "utf-8")
    steps: list[Any] = []
    embedder = HashEmbedder()
    index = ChromaIndex.persistent(tmp_path / "index", embedder=embedder)
    async with Library(index, embedder=embedder) as library:
        report = await library.ingest(docs, progress=steps.append)

    assert [step.source for step in steps] == [f"f{i}.md" for i in range(7)]
    assert [step.done for step in steps] == list(range(1, 8))
    assert report.ingested == 7
    assert report.chunks_written == report.chunks_total == 7
