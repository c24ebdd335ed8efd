"""`Library`: ingest, notes, hybrid retrieval and decomposition, on the real MiniLM embedder
and a real persistent Chroma index in a temporary folder."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from fpdf import FPDF

from handrail.documents._decompose import DecompositionCache, SubQuestions, decompose
from handrail.documents._embed import MiniLMEmbedder, Vectors, normalize
from handrail.documents._index import ChromaIndex
from handrail.documents._library import (
    IngestProgress,
    Library,
    relevance_from_cosine,
)
from handrail.exceptions import ConfigError, DocumentLoadError
from handrail.models import ModelRequest
from handrail.testing import FunctionModel

# -- the documents -----------------------------------------------------------------------------

REFUNDS = """\
# Refunds

## Timing

Refunds are paid back to the original payment method within 14 days of the warehouse
receiving the returned item. Bank transfers can add two to three working days.

## Exceptions

Gift cards, downloadable software and personalised items cannot be refunded. Items damaged
by the customer are refunded at the discretion of a store manager.
"""

SHIPPING = """\
<html><head><title>Shipping</title></head><body><main>
<h1>Shipping</h1>
<p>Standard delivery inside the country takes three to five working days. Express delivery
arrives the next working day when the order is placed before 2 pm.</p>
<h2>International</h2>
<p>International parcels are sent with a tracked courier and take seven to twelve working
days; customs duties are paid by the recipient.</p>
</main></body></html>
"""

WARRANTY = """\
Every appliance carries a two-year warranty against manufacturing defects, counted from the
date on the receipt.

To claim the warranty, send a photo of the defect and the receipt to the support team, who
repair or replace the appliance within thirty days.
"""

PRODUCTS = [
    ("SKU-4471-B", "insulated steel water bottle, 750 ml, blue lid", "24.90"),
    ("SKU-2208-K", "bamboo cutting board with juice groove", "31.50"),
    ("SKU-9315-M", "cast iron skillet, 26 cm, pre-seasoned", "42.00"),
    ("SKU-6642-R", "glass food storage set of four with clip lids", "27.80"),
]


def catalogue_pdf() -> bytes:
    """A real PDF, one product a page."""
    pdf = FPDF()
    pdf.set_title("Product catalogue")
    for code, name, price in PRODUCTS:
        pdf.add_page()
        pdf.set_font("Helvetica", size=12)
        pdf.multi_cell(
            0,
            6,
            f"Product {code}: {name}. Price {price} EUR. Ships from the central warehouse "
            f"and can be returned unused within thirty days.",
        )
    return bytes(pdf.output())


def write_folder(folder: Path) -> Path:
    """Markdown, HTML (in a subfolder), text and PDF files, an unsupported file, a corrupt
    PDF, and hidden files that must be ignored."""
    (folder / "guides").mkdir(parents=True)
    (folder / ".git").mkdir()
    (folder / "refunds.md").write_text(REFUNDS, encoding="utf-8")
    (folder / "guides" / "shipping.html").write_text(SHIPPING, encoding="utf-8")
    (folder / "warranty.txt").write_text(WARRANTY, encoding="utf-8")
    (folder / "catalogue.pdf").write_bytes(catalogue_pdf())
    (folder / "prices.xlsx").write_bytes(b"PK\x03\x04 not really a spreadsheet")
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4\n1 0 obj << /Type /Catalog")
    (folder / ".draft.md").write_text("# Draft\n\nNot ready.", encoding="utf-8")
    (folder / ".git" / "notes.md").write_text("# Git\n\nInternal.", encoding="utf-8")
    return folder


SUPPORTED = ["catalogue.pdf", "guides/shipping.html", "refunds.md", "warranty.txt"]

# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    embedder = MiniLMEmbedder()
    embedder.embed_sync(["warm up"])  # load the model once for the module
    return embedder


class CountingEmbedder:
    """The real embedder, recording every text it is asked to embed."""

    def __init__(self, inner: MiniLMEmbedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimensions = inner.dimensions
        self.texts: list[str] = []

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.texts.extend(texts)
        return await self.inner.embed(texts)


@pytest.fixture
def embedder(minilm: MiniLMEmbedder) -> CountingEmbedder:
    return CountingEmbedder(minilm)


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    return write_folder(tmp_path / "docs")


@pytest.fixture
async def library(tmp_path: Path, embedder: CountingEmbedder) -> AsyncIterator[Library]:
    async with Library.open(tmp_path / "index", embedder=embedder) as library:
        yield library


@pytest.fixture
async def ingested(library: Library, docs: Path, embedder: CountingEmbedder) -> Library:
    await library.ingest(docs)
    embedder.texts.clear()
    return library


# -- ingest ------------------------------------------------------------------------------------


async def test_ingest_reads_every_supported_file_and_skips_the_rest_with_reasons(
    library: Library, docs: Path
):
    steps: list[IngestProgress] = []
    report = await library.ingest(docs, progress=steps.append)

    assert (report.files, report.ingested, report.unchanged, report.deleted) == (6, 4, 0, 0)
    assert [source for source, _ in report.skipped] == ["broken.pdf", "prices.xlsx"]
    reasons = dict(report.skipped)
    assert "not a readable PDF" in reasons["broken.pdf"]
    assert "unsupported suffix '.xlsx'" in reasons["prices.xlsx"]
    assert not reasons["prices.xlsx"].startswith("prices.xlsx")  # the report names it
    assert list(await library.index.sources()) == SUPPORTED
    assert report.chunks_written == report.chunks_total == await library.index.count()
    assert report.chunks_total >= 4 + len(PRODUCTS) - 1
    assert report.seconds > 0

    assert [(s.source, s.outcome, s.done, s.total) for s in steps] == [
        ("broken.pdf", "skipped", 1, 6),
        ("prices.xlsx", "skipped", 2, 6),
        ("catalogue.pdf", "ingested", 3, 6),
        ("guides/shipping.html", "ingested", 4, 6),
        ("refunds.md", "ingested", 5, 6),
        ("warranty.txt", "ingested", 6, 6),
    ]
    assert sum(s.chunks for s in steps) == report.chunks_written
    assert steps[0].reason == reasons["broken.pdf"]


async def test_chunks_keep_their_pages_and_headings(ingested: Library):
    chunks = await ingested.index.chunks()
    [skillet] = [c for c in chunks if c.source == "catalogue.pdf" and "SKU-9315-M" in c.text]
    assert skillet.page is not None and skillet.end_page is not None
    assert skillet.page <= 3 <= skillet.end_page
    assert {c.headings[0] for c in chunks if c.source == "refunds.md"} == {"Refunds"}


async def test_reingesting_an_unchanged_folder_embeds_nothing(
    ingested: Library, docs: Path, embedder: CountingEmbedder
):
    before = await ingested.index.chunks()
    report = await ingested.ingest(docs)

    assert embedder.texts == []
    assert (report.ingested, report.unchanged, report.deleted, report.chunks_written) == (
        0,
        4,
        0,
        0,
    )
    assert len(report.skipped) == 2  # still reported, every time
    assert await ingested.index.chunks() == before


async def test_changing_one_file_reembeds_only_that_file(
    ingested: Library, docs: Path, embedder: CountingEmbedder
):
    others = [c for c in await ingested.index.chunks() if c.source != "warranty.txt"]
    (docs / "warranty.txt").write_text(WARRANTY.replace("two-year", "three-year"), encoding="utf-8")
    report = await ingested.ingest(docs)

    assert (report.ingested, report.unchanged) == (1, 3)
    new = [c for c in await ingested.index.chunks() if c.source == "warranty.txt"]
    assert "three-year warranty" in new[0].text
    assert len(embedder.texts) == len(new) == report.chunks_written
    assert sorted(embedder.texts) == sorted(c.text for c in new)  # plain text: no headings
    assert [c for c in await ingested.index.chunks() if c.source != "warranty.txt"] == others


async def test_a_deleted_file_loses_its_chunks(ingested: Library, docs: Path):
    (docs / "refunds.md").unlink()
    steps: list[IngestProgress] = []
    report = await ingested.ingest(docs, progress=steps.append)

    assert report.deleted == 1
    assert steps[0].source == "refunds.md" and steps[0].outcome == "deleted"
    assert "refunds.md" not in await ingested.index.sources()
    assert all(c.source != "refunds.md" for c in await ingested.index.chunks())


async def test_a_file_that_turns_unreadable_is_skipped_and_its_old_chunks_removed(
    ingested: Library, docs: Path
):
    (docs / "catalogue.pdf").write_bytes(b"%PDF-1.4 cut short")
    report = await ingested.ingest(docs)

    assert "catalogue.pdf" in dict(report.skipped)
    assert "catalogue.pdf" not in await ingested.index.sources()


async def test_ingesting_a_missing_folder_raises_and_changes_nothing(
    ingested: Library, tmp_path: Path
):
    count = await ingested.index.count()
    with pytest.raises(DocumentLoadError, match="does not exist; pass the folder"):
        await ingested.ingest(tmp_path / "nowhere")
    assert await ingested.index.count() == count


async def test_small_files_share_one_embedder_call(library: Library, tmp_path: Path):
    folder = tmp_path / "many"
    folder.mkdir()
    for n in range(12):
        (folder / f"faq-{n:02}.txt").write_text(f"Question {n}: the answer is {n}.")
    calls: list[int] = []
    inner = library.embedder

    class Recording:
        name, dimensions = inner.name, inner.dimensions

        async def embed(self, texts: Sequence[str]) -> Vectors:
            calls.append(len(texts))
            return await inner.embed(texts)

    library.embedder = Recording()
    report = await library.ingest(folder)
    assert report.ingested == 12
    assert calls == [12]


# -- notes -------------------------------------------------------------------------------------


async def test_a_note_survives_ingest_and_is_found_with_its_author(ingested: Library, docs: Path):
    note = await ingested.add_note(
        "Refunds to a company account are approved by finance within 5 working days.",
        author="ana",
        question="Who approves refunds to a company account?",
    )
    assert note.source == "note:ana"
    assert note.metadata == {
        "author": "ana",
        "question": "Who approves refunds to a company account?",
    }
    again = await ingested.add_note(note.text, author="ana", question=note.metadata["question"])
    assert again.id == note.id  # same author, question and text: the same note

    report = await ingested.ingest(docs)
    assert report.deleted == 0
    assert "note:ana" in await ingested.index.sources()

    found = await ingested.retrieve("who signs off refunds for business accounts?")
    assert found[0].chunk.id == note.id
    assert found[0].chunk.metadata["author"] == "ana"
    assert found[0].relevance >= 0.5


async def test_a_note_needs_text_and_an_author(library: Library):
    with pytest.raises(ConfigError, match="both must be non-empty"):
        await library.add_note("  ", author="ana")


# -- retrieve ----------------------------------------------------------------------------------


async def test_a_paraphrased_question_finds_the_right_chunk_first(ingested: Library):
    found = await ingested.retrieve(
        "How long until I get my money back after I send something back?"
    )
    assert found[0].chunk.source == "refunds.md"
    assert "within 14 days" in found[0].chunk.text
    assert found[0].fused_rank == 1
    assert all(item.relevance >= 0.5 for item in found)
    assert len(found) <= 5


async def test_an_unrelated_question_gets_no_evidence(ingested: Library):
    assert await ingested.retrieve("What is the capital of Australia?") == []
    assert await ingested.retrieve("Who won the football world cup in 2018?") == []


async def test_relevance_comes_from_the_cosine_and_the_keyword_score(ingested: Library):
    found = await ingested.retrieve("How long does international shipping take?", top_k=3)
    assert found
    for item in found:
        assert item.relevance == pytest.approx(relevance_from_cosine(item.cosine, item.keyword))
        assert 0.0 <= item.keyword <= 1.0
        assert (item.keyword > 0) == (item.keyword_rank is not None)
    assert max(item.keyword for item in found) in (0.0, 1.0)  # relative to the best match
    assert relevance_from_cosine(0.47) == pytest.approx(0.5, abs=0.01)
    assert relevance_from_cosine(0.39, 1.0) == pytest.approx(0.5, abs=0.01)
    assert relevance_from_cosine(0.3) < relevance_from_cosine(0.4)
    assert relevance_from_cosine(0.4) < relevance_from_cosine(0.4, 0.5)
    assert 0.0 < relevance_from_cosine(-1.0) < relevance_from_cosine(1.0) < 1.0


async def test_the_order_is_by_relevance_and_the_first_is_the_best(ingested: Library):
    for question in ("price of SKU-4471-B", "How long do refunds take?", "express shipping"):
        found = await ingested.retrieve(question, top_k=10, min_relevance=0.0)
        relevances = [item.relevance for item in found]
        assert relevances == sorted(relevances, reverse=True)
        assert [item.fused_rank for item in found] == list(range(1, len(found) + 1))


async def test_hybrid_ranks_an_exact_product_code_at_least_as_well_as_dense(ingested: Library):
    better = 0
    for code, _, _ in PRODUCTS:
        found = await ingested.retrieve(f"price of {code}", min_relevance=0.0)
        [gold] = [item for item in found if code in item.chunk.text]
        assert gold.keyword_rank == 1
        assert gold.dense_rank is not None
        assert gold.fused_rank <= gold.dense_rank
        better += gold.fused_rank < gold.dense_rank
        assert [item.fused_rank for item in found] == list(range(1, len(found) + 1))
    assert better >= 1  # MiniLM confuses the codes at least once; BM25 does not


async def test_a_chunk_only_bm25_found_gets_its_cosine(
    ingested: Library, embedder: CountingEmbedder
):
    found = await ingested.retrieve("SKU-4471-B", min_relevance=0.0, top_k=30)
    keyword_only = [item for item in found if item.dense_rank is None]
    for item in keyword_only:
        assert item.keyword_rank is not None
        [vector] = await embedder.inner.embed([item.chunk.text])
        query = (await embedder.inner.embed(["SKU-4471-B"]))[0]
        assert item.cosine == pytest.approx(float(vector @ query), abs=0.05)


async def test_an_empty_library_finds_nothing(library: Library):
    assert await library.retrieve("How long do refunds take?", min_relevance=0.0) == []


async def test_retrieve_checks_its_arguments(library: Library):
    with pytest.raises(ConfigError, match="top_k=0"):
        await library.retrieve("refunds", top_k=0)
    with pytest.raises(ConfigError, match=r"min_relevance=1\.5"):
        await library.retrieve("refunds", min_relevance=1.5)


# -- neighbours --------------------------------------------------------------------------------

STEPS = [
    "Open the returns page and sign in with the e-mail address used for the order. Pick the "
    "order from the list; orders older than ninety days are not shown there.",
    "Choose the items to return and give a reason for each one: wrong size, damaged, not as "
    "described, or changed mind. A damaged item needs a photo of the damage.",
    "Print the prepaid return label and stick it on the parcel over any old labels. Drop the "
    "parcel at any post office; keep the receipt the clerk gives you as proof of posting.",
    "When the warehouse receives the parcel it checks the items within two working days and "
    "sends an e-mail confirming the return, with the amount that will be refunded.",
    "Refunds then reach the original payment method; card refunds can take a few more days "
    "to show on the statement, depending on the bank.",
]


def returns_guide() -> str:
    # Each step is a section of about the chunk size, so each becomes its own chunk.
    filler = (
        " Customers can follow the parcel with the tracking number on the label, and the "
        "support team answers questions about a return by e-mail or phone on working days."
    )
    sections = [f"## Step {n}\n\n{text}{filler * 3}" for n, text in enumerate(STEPS, 1)]
    return "# Returning an item\n\n" + "\n\n".join(sections) + "\n"


async def test_at_most_top_k_and_none_under_the_threshold_whatever_their_neighbours(
    library: Library, tmp_path: Path
):
    folder = tmp_path / "guide"
    folder.mkdir()
    (folder / "returns.md").write_text(returns_guide(), encoding="utf-8")
    await library.ingest(folder)
    assert len(await library.index.chunks()) >= 5
    question = "Where do I drop off the parcel with the prepaid return label?"
    everything = await library.retrieve(question, top_k=50, min_relevance=0.0)
    assert "prepaid return label" in everything[0].chunk.text
    for top_k in (1, 2, 3):
        for threshold in (0.0, 0.3, 0.5, everything[1].relevance, everything[0].relevance):
            found = await library.retrieve(question, top_k=top_k, min_relevance=threshold)
            assert len(found) <= top_k
            assert all(item.relevance >= threshold for item in found)
            # The same items, in the same order, as the full ranking cut at the threshold.
            expected = [i.chunk.id for i in everything if i.relevance >= threshold][:top_k]
            assert [item.chunk.id for item in found] == expected


async def test_neighbours_is_deprecated_and_changes_nothing(ingested: Library):
    question = "How long do refunds take?"
    plain = await ingested.retrieve(question)
    with pytest.warns(DeprecationWarning, match="neighbours"):
        again = await ingested.retrieve(question, neighbours=True)
    assert [i.chunk.id for i in again] == [i.chunk.id for i in plain]


COOKING = (
    "Heat the oven to one hundred and eighty degrees. Whisk four eggs with sugar until pale, "
    "fold in flour and melted butter, and bake the sponge for twenty-five minutes. "
) * 3


class PlacedEmbedder:
    """An embedder that puts texts where a test wants them: by the first marker they hold."""

    name = "placed"
    dimensions = 8

    def __init__(self, places: dict[str, list[float]]) -> None:
        self.places = places

    async def embed(self, texts: Sequence[str]) -> Vectors:
        rows = []
        for text in texts:
            marker = next(m for m in self.places if m in text)
            rows.append(self.places[marker])
        return normalize(np.array(rows, dtype=np.float32).reshape(len(texts), self.dimensions))


async def test_a_chunk_first_for_dense_and_missed_by_bm25_is_not_buried(tmp_path: Path):
    # Reciprocal-rank fusion put the chunk dense ranked first, and BM25 not at all (it shares
    # no word with the question), below every chunk both rankings found a little.
    def at(cosine: float, axis: int) -> list[float]:
        row = [0.0] * 8
        row[0], row[axis] = cosine, (1 - cosine**2) ** 0.5
        return row

    embedder = PlacedEmbedder(
        {"QUESTION": at(1.0, 1), "Victoria": at(0.95, 1), "Desk": at(0.55, 2)}
    )
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "sponge.md").write_text(
        "# Victoria sponge\n\nLeave the tin in at one hundred and eighty degrees for "
        "twenty-five minutes, until a skewer comes out clean.\n",
        encoding="utf-8",
    )
    for n in range(30):
        (folder / f"desk-{n:02}.txt").write_text(
            f"Desk note {n}: the office cake sale is on day {n + 2}; ask how long the kitchen "
            f"oven is free."
        )
    async with Library.open(tmp_path / "index", embedder=embedder) as library:
        await library.ingest(folder)
        found = await library.retrieve(
            "QUESTION how long should the cake bake in the oven?", top_k=5, min_relevance=0.0
        )
        assert found[0].chunk.source == "sponge.md", [i.chunk.source for i in found]
        assert (found[0].dense_rank, found[0].keyword_rank) == (1, None)
        assert all(item.keyword_rank is not None for item in found[1:])


# -- decomposition -----------------------------------------------------------------------------


def splitter(*parts: str) -> FunctionModel:
    return FunctionModel(lambda request: json.dumps({"questions": list(parts)}), name="splitter")


async def test_a_multi_part_question_is_split_and_each_part_retrieved(ingested: Library):
    model = splitter("How long do refunds take?", "How long does international shipping take?")
    question = "How long do refunds and international shipping take?"
    found = await ingested.retrieve(question, model=model)

    sources = {item.chunk.source for item in found}
    assert {"refunds.md", "guides/shipping.html"} <= sources
    assert len({item.chunk.id for item in found}) == len(found)  # merged: one item a chunk
    [request] = model.calls
    assert request.output_schema == SubQuestions.model_json_schema()
    assert request.messages[-1].text == question

    await ingested.retrieve(question, model=model)
    assert len(model.calls) == 1  # the decomposition is cached


async def test_a_malformed_decomposition_falls_back_to_the_question(ingested: Library):
    model = FunctionModel(lambda request: "Sure! The sub-questions are: refunds, shipping.")
    question = "How long do refunds take?"
    found = await ingested.retrieve(question, model=model)
    plain = await ingested.retrieve(question)
    assert [item.chunk.id for item in found] == [item.chunk.id for item in plain]
    assert len(model.calls) == 1


async def test_decompose_keeps_a_one_part_question_as_asked_and_caches_per_model():
    cache = DecompositionCache()
    model = splitter("What is the warranty period?")
    question = "what's the warranty period"
    assert await decompose(question, model, cache=cache) == [question]
    assert await decompose(question, model, cache=cache) == [question]
    assert len(model.calls) == 1
    other = FunctionModel(
        lambda request: '```json\n{"questions": ["A?", "B?", " B? ", "C?", "D?", "E?"]}\n```',
        name="another",
    )
    assert await decompose(question, other, cache=cache) == ["A?", "B?", "C?", "D?"]


async def test_decompose_never_fails_and_does_not_cache_a_failure():
    cache = DecompositionCache()

    def broken(request: ModelRequest) -> str:
        raise RuntimeError("provider down")

    model = FunctionModel(broken)
    assert await decompose("refunds and shipping?", model, cache=cache) == ["refunds and shipping?"]
    empty = FunctionModel(lambda request: '{"questions": []}')
    assert await decompose("refunds and shipping?", empty, cache=cache) == ["refunds and shipping?"]
    assert len(cache) == 0


def test_the_decomposition_cache_forgets_the_least_recently_used():
    cache = DecompositionCache(size=2)
    cache.put("m", "a", ["a"])
    cache.put("m", "b", ["b"])
    assert cache.get("m", "a") == ["a"]
    cache.put("m", "c", ["c"])
    assert cache.get("m", "b") is None
    assert cache.get("m", "a") == ["a"]


# -- construction ------------------------------------------------------------------------------


def test_a_library_refuses_an_index_of_another_embedder(tmp_path: Path, minilm: MiniLMEmbedder):
    class Other:
        name, dimensions = "other-model", 384

        async def embed(self, texts: Sequence[str]) -> Vectors:
            raise AssertionError

    index = ChromaIndex.persistent(tmp_path / "index", embedder=minilm)
    with pytest.raises(ConfigError, match="Pass the same embedder to both"):
        Library(index, embedder=Other())


def test_a_library_checks_its_chunking_at_once(tmp_path: Path, minilm: MiniLMEmbedder):
    with pytest.raises(ConfigError, match="overlap"):
        Library.open(tmp_path / "index", embedder=minilm, target_tokens=10, overlap=100)


async def test_ingest_progress_counts_bytes_and_moves_inside_a_big_file(
    library: Library, tmp_path: Path
):
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "a.md").write_text("# A\n\nA short note about refunds.", encoding="utf-8")
    sections = [
        f"## Part {i}\n\n" + " ".join([f"Refund rule {i} applies."] * 30) for i in range(180)
    ]
    (folder / "manual.md").write_text("# Manual\n\n" + "\n\n".join(sections), encoding="utf-8")
    (folder / "z.txt").write_text("The last word on refunds.", encoding="utf-8")
    size = sum(path.stat().st_size for path in folder.iterdir())
    steps: list[IngestProgress] = []
    report = await library.ingest(folder, progress=steps.append)

    assert report.chunks_written > 128  # manual.md takes more than one embedding batch
    assert {s.bytes_total for s in steps} == {size}
    moving = [s for s in steps if s.outcome == "embedding"]
    assert moving and {s.source for s in moving} <= {"a.md", "manual.md"}
    assert all(s.done <= 1 for s in moving)  # manual.md is not counted done while embedding
    done = [s.bytes_done for s in steps]
    assert done == sorted(done) and len(set(done)) >= len(moving)  # it moves, never back
    assert steps[-1].bytes_done == size and steps[-1].done == steps[-1].total == 3
    assert [(s.source, s.outcome) for s in steps if s.outcome != "embedding"] == [
        ("a.md", "ingested"),
        ("manual.md", "ingested"),
        ("z.txt", "ingested"),
    ]


async def test_clear_empties_the_library_and_the_next_ingest_starts_over(
    ingested: Library, docs: Path
):
    await ingested.add_note("Refunds for gift cards go to the buyer.", author="ana")
    assert await ingested.retrieve("How long do refunds take?", min_relevance=0)

    await ingested.clear()

    assert await ingested.index.count() == 0
    assert await ingested.retrieve("How long do refunds take?", min_relevance=0) == []
    report = await ingested.ingest(docs)
    assert (report.ingested, report.unchanged) == (4, 0)
    assert report.chunks_total == report.chunks_written


def test_a_long_heading_path_keeps_the_title_and_nearest_heading_within_its_room() -> None:
    from handrail.documents import Chunk
    from handrail.documents._chunker import EMBEDDING_PREFIX_WORD_PIECES, count_word_pieces
    from handrail.documents._library import _embedding_text

    headings = ("Configuring the server", *[f"Section {n} about subsystem {n}" for n in range(8)])
    chunk = Chunk(
        id="c:0", source="manual.html", text="Set the option to 5.", index=0, start=0, end=20,
        headings=(*headings, "Timeouts"), metadata={"title": "The Product Manual"},
    )  # fmt: skip
    prefix, text = _embedding_text(chunk).split("\n")
    assert text == "Set the option to 5."
    assert prefix.startswith("The Product Manual > ") and prefix.endswith(" > Timeouts")
    assert count_word_pieces(prefix) <= EMBEDDING_PREFIX_WORD_PIECES
    short = Chunk(
        id="c:1", source="m.html", text="x", index=1, start=0, end=1, headings=("A", "B", "C")
    )
    assert _embedding_text(short) == "A > B > C\nx"
