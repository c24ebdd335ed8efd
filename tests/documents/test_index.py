"""The `Index` contract, run against both forms of `ChromaIndex`.

`persistent`: embedded Chroma in a temporary folder. `http`: a real `chroma run` server,
started once for this module on a free port (each test gets its own collection).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from handrail.documents import _index
from handrail.documents._embed import Vectors, normalize
from handrail.documents._index import ChromaIndex, Index
from handrail.documents._types import Chunk
from handrail.exceptions import DocumentIndexError

DIMENSIONS = 16


class FakeEmbedder:
    """An embedder identity for the index: the tests make the vectors themselves."""

    def __init__(self, name: str = "fake-embedder", dimensions: int = DIMENSIONS) -> None:
        self.name = name
        self.dimensions = dimensions

    async def embed(self, texts: Sequence[str]) -> Vectors:
        raise AssertionError("the index never embeds")


# -- the Chroma server -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    chroma = Path(sys.executable).parent / "chroma"
    if not chroma.exists():
        pytest.fail(f"no chroma executable at {chroma}: pip install chromadb into this venv")
    folder = tmp_path_factory.mktemp("chroma-server")
    port = _free_port()
    log = (folder / "server.log").open("wb")
    env = {**os.environ, "ANONYMIZED_TELEMETRY": "False"}
    process = subprocess.Popen(
        [
            str(chroma),
            "run",
            "--path",
            str(folder / "data"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        url = f"http://127.0.0.1:{port}/api/v2/heartbeat"
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"chroma run exited with {process.returncode}:\n"
                    + (folder / "server.log").read_text(errors="replace")
                )
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    "chroma run did not answer its heartbeat within 60 s:\n"
                    + (folder / "server.log").read_text(errors="replace")
                )
            time.sleep(0.1)
        yield "127.0.0.1", port
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()


# -- the two forms -----------------------------------------------------------------------------

Opener = Callable[..., ChromaIndex]


@pytest.fixture(params=["persistent", "http"])
async def open_index(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens the same store (folder or server + collection) as often as a test asks."""
    collection = f"test-{uuid.uuid4().hex[:12]}"
    opened: list[ChromaIndex] = []
    if request.param == "persistent":

        def make(embedder: Any) -> ChromaIndex:
            return ChromaIndex.persistent(
                tmp_path / "index", embedder=embedder, collection=collection
            )

    else:
        host, port = request.getfixturevalue("chroma_server")

        def make(embedder: Any) -> ChromaIndex:
            return ChromaIndex.http(host, port, embedder=embedder, collection=collection)

    def opener(embedder: Any = None) -> ChromaIndex:
        index = make(embedder or FakeEmbedder())
        opened.append(index)
        return index

    yield opener
    for index in opened:
        await index.close()


@pytest.fixture
def index(open_index: Opener) -> ChromaIndex:
    return open_index()


def vectors(count: int, seed: int = 0) -> NDArray[np.float32]:
    return normalize(np.random.default_rng(seed).standard_normal((count, DIMENSIONS)))


def chunk(
    source: str, index: int, text: str | None = None, content_hash: str = "hash-1", **fields: Any
) -> Chunk:
    return Chunk(
        id=f"{source}:{index}",
        source=source,
        text=text if text is not None else f"chunk {index} of {source}",
        index=index,
        start=index * 100,
        end=index * 100 + 99,
        content_hash=content_hash,
        **fields,
    )


# -- the contract ------------------------------------------------------------------------------


async def test_is_an_index(index: ChromaIndex) -> None:
    assert isinstance(index, Index)


async def test_upsert_then_get_round_trips_every_field(index: ChromaIndex) -> None:
    chunks = [
        chunk(
            "guide.pdf",
            0,
            text="Refunds take 14 days. — Ünïcode ☔",
            page=1,
            end_page=2,
            headings=("Billing", "Refunds — policy"),
            next_id="guide.pdf:1",
            metadata={"author": "Ana", "count": 3, "score": 0.25, "pinned": True, "whole": 1.0},
        ),
        chunk(
            "guide.pdf",
            1,
            page=2,
            end_page=2,
            headings=(),
            prev_id="guide.pdf:0",
        ),
        chunk("notes.md", 0, text="", headings=("Only",), metadata={}),
    ]
    await index.upsert(chunks, vectors(3))

    got = await index.get(["notes.md:0", "missing", "guide.pdf:1", "guide.pdf:0"])

    assert got == [chunks[2], chunks[1], chunks[0]]
    assert type(got[2].metadata["count"]) is int
    assert type(got[2].metadata["whole"]) is float
    assert type(got[2].metadata["pinned"]) is bool
    assert got[1].page == 2 and got[2].page == 1 and got[0].page is None
    assert await index.get([]) == []


async def test_vectors_are_read_back_by_id(index: ChromaIndex) -> None:
    written = vectors(3, seed=7)
    await index.upsert([chunk("a.md", i) for i in range(3)], written)
    found = await index.vectors(["a.md:2", "nope", "a.md:0"])
    assert sorted(found) == ["a.md:0", "a.md:2"]  # an unknown id is left out
    np.testing.assert_allclose(found["a.md:0"], written[0], atol=1e-6)
    np.testing.assert_allclose(found["a.md:2"], written[2], atol=1e-6)
    assert await index.vectors([]) == {}


async def test_query_returns_the_nearest_by_cosine_similarity(index: ChromaIndex) -> None:
    chunks = [chunk(f"doc-{i % 3}.md", i) for i in range(40)]
    stored = vectors(40)
    await index.upsert(chunks, stored)
    query = vectors(1, seed=7)[0]

    hits = await index.query(query * 3.5, k=5)  # any length: only the direction counts

    expected = stored @ query
    best = np.argsort(-expected)[:5]
    assert [hit.id for hit, _ in hits] == [chunks[i].id for i in best]
    assert [score for _, score in hits] == pytest.approx(expected[best].tolist(), abs=1e-5)
    assert hits[0][0] == chunks[best[0]]


async def test_query_finds_an_identical_vector_with_similarity_one(index: ChromaIndex) -> None:
    stored = vectors(5)
    await index.upsert([chunk("a.md", i) for i in range(5)], stored)

    hits = await index.query(stored[3], k=1)

    assert [(hit.id, round(score, 5)) for hit, score in hits] == [("a.md:3", 1.0)]


async def test_query_keeps_to_the_sources_asked_for(index: ChromaIndex) -> None:
    chunks = [chunk(f"doc-{i % 4}.md", i) for i in range(20)]
    await index.upsert(chunks, vectors(20))

    hits = await index.query(vectors(1, seed=3)[0], k=20, sources={"doc-1.md", "doc-3.md"})

    assert sorted(hit.id for hit, _ in hits) == sorted(
        c.id for c in chunks if c.source in ("doc-1.md", "doc-3.md")
    )
    one = await index.query(vectors(1, seed=3)[0], k=20, sources="doc-2.md")
    assert sorted(hit.id for hit, _ in one) == sorted(
        c.id for c in chunks if c.source == "doc-2.md"
    )
    assert await index.query(vectors(1)[0], k=3, sources=[]) == []
    assert await index.query(vectors(1)[0], k=3, sources=["nowhere.md"]) == []


async def test_query_of_more_than_the_index_holds_returns_all(index: ChromaIndex) -> None:
    await index.upsert([chunk("a.md", i) for i in range(3)], vectors(3))

    hits = await index.query(vectors(1, seed=9)[0], k=10)

    assert len(hits) == 3
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)


async def test_an_empty_index_finds_nothing(index: ChromaIndex) -> None:
    assert await index.query(vectors(1)[0], k=5) == []
    assert await index.count() == 0
    assert await index.sources() == {}
    assert await index.chunks() == []
    assert await index.get(["a.md:0"]) == []


async def test_delete_source_removes_that_source_only(index: ChromaIndex) -> None:
    chunks = [chunk("keep.md", i) for i in range(3)] + [chunk("drop.md", i) for i in range(4)]
    await index.upsert(chunks, vectors(7))

    await index.delete_source("drop.md")
    await index.delete_source("never-there.md")

    assert await index.count() == 3
    assert await index.sources() == {"keep.md": "hash-1"}
    assert await index.chunks() == chunks[:3]
    hits = await index.query(vectors(1)[0], k=10)
    assert {hit.source for hit, _ in hits} == {"keep.md"}


async def test_sources_maps_each_source_to_its_content_hash(index: ChromaIndex) -> None:
    await index.upsert(
        [
            chunk("a.md", 0, content_hash="aaa"),
            chunk("a.md", 1, content_hash="aaa"),
            chunk("sub/b.pdf", 0, content_hash="bbb"),
        ],
        vectors(3),
    )

    assert await index.sources() == {"a.md": "aaa", "sub/b.pdf": "bbb"}


async def test_upserting_the_same_ids_replaces_them(index: ChromaIndex) -> None:
    first = [chunk("a.md", i, text=f"old {i}") for i in range(3)]
    await index.upsert(first, vectors(3, seed=1))
    second = [chunk("a.md", i, text=f"new {i}", content_hash="hash-2") for i in range(3)]
    replaced = vectors(3, seed=2)

    await index.upsert(second, replaced)

    assert await index.count() == 3
    assert await index.get([c.id for c in second]) == second
    hits = await index.query(replaced[1], k=1)
    assert hits[0][0] == second[1]
    assert hits[0][1] == pytest.approx(1.0, abs=1e-5)
    assert await index.sources() == {"a.md": "hash-2"}


async def test_chunks_lists_every_chunk_by_source_and_position(
    open_index: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_index, "_PAGE", 4)  # so reading it takes several pages
    index = open_index()
    chunks = [chunk(f"doc-{i % 3}.md", i // 3) for i in range(11)]
    await index.upsert(chunks, vectors(11))

    listed = await index.chunks()

    assert listed == sorted(chunks, key=lambda c: (c.source, c.index))
    assert await index.count() == 11


async def test_version_changes_with_every_write(index: ChromaIndex) -> None:
    before = await index.version()
    await index.upsert([chunk("a.md", 0)], vectors(1))
    after_upsert = await index.version()
    assert after_upsert != before
    assert await index.version() == after_upsert  # reading does not change it

    await index.delete_source("a.md")

    assert await index.version() not in (before, after_upsert)


async def test_another_embedder_is_refused(open_index: Opener) -> None:
    first = open_index(FakeEmbedder("model-a", DIMENSIONS))
    await first.upsert([chunk("a.md", 0)], vectors(1))
    await first.close()

    for other in (FakeEmbedder("model-b", DIMENSIONS), FakeEmbedder("model-a", 8)):
        with pytest.raises(DocumentIndexError, match="re-ingest into a new collection"):
            await open_index(other).count()

    same = open_index(FakeEmbedder("model-a", DIMENSIONS))
    assert await same.count() == 1  # and the same embedder reopens it


async def test_vectors_of_the_wrong_shape_are_refused(index: ChromaIndex) -> None:
    with pytest.raises(DocumentIndexError, match="16 dimensions"):
        await index.upsert([chunk("a.md", 0)], normalize(np.ones((1, 8))))
    with pytest.raises(DocumentIndexError, match="2 vector"):
        await index.upsert([chunk("a.md", 0), chunk("a.md", 1)], vectors(3))
    with pytest.raises(DocumentIndexError, match="16 dimensions"):
        await index.query(np.ones(8, dtype=np.float32), k=3)
    with pytest.raises(DocumentIndexError, match="NaN"):
        await index.upsert([chunk("a.md", 0)], np.full((1, DIMENSIONS), np.nan, np.float32))
    assert await index.count() == 0


async def test_what_was_written_is_there_after_reopening(open_index: Opener) -> None:
    chunks = [chunk("a.md", i) for i in range(4)]
    first = open_index()
    await first.upsert(chunks, vectors(4))
    await first.close()

    again = open_index()

    assert await again.chunks() == chunks


async def test_an_index_is_usable_again_after_close(index: ChromaIndex) -> None:
    await index.upsert([chunk("a.md", 0)], vectors(1))
    await index.close()
    await index.close()  # twice is fine

    assert await index.count() == 1


# -- one form or the other ---------------------------------------------------------------------


async def test_a_collection_not_made_by_handrail_is_refused(tmp_path: Path) -> None:
    import chromadb
    from chromadb.config import Settings

    client = chromadb.PersistentClient(
        path=str(tmp_path), settings=Settings(anonymized_telemetry=False)
    )
    client.create_collection("theirs", embedding_function=None)
    client.close()  # type: ignore[attr-defined]  # Client has it; ClientAPI does not say so
    index = ChromaIndex.persistent(tmp_path, embedder=FakeEmbedder(), collection="theirs")

    with pytest.raises(DocumentIndexError, match="not made by handrail"):
        await index.count()
    await index.close()


async def test_no_server_at_the_address_names_the_fix() -> None:
    index = ChromaIndex.http("127.0.0.1", _free_port(), embedder=FakeEmbedder())

    with pytest.raises(DocumentIndexError, match="chroma run --path DIR"):
        await index.count()


def test_an_object_that_is_not_an_embedder_is_refused(tmp_path: Path) -> None:
    from handrail.exceptions import ConfigError

    with pytest.raises(ConfigError, match="pass an Embedder"):
        ChromaIndex.persistent(tmp_path, embedder="minilm")  # type: ignore[arg-type]


async def test_clear_removes_every_chunk_and_the_index_stays_usable(
    open_index: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = open_index()
    await index.clear()  # an empty index: nothing happens
    assert await index.count() == 0
    chunks = [chunk(f"doc-{i % 3}.md", i // 3) for i in range(11)]
    await index.upsert(chunks, vectors(11))
    before = await index.version()
    monkeypatch.setattr(index, "_max_batch", 4)  # so clearing takes several batches

    await index.clear()

    assert await index.count() == 0
    assert await index.sources() == {}
    assert await index.chunks() == []
    assert await index.query(vectors(1)[0], k=5) == []
    assert await index.version() != before
    await index.upsert(chunks[:2], vectors(2))
    assert await index.chunks() == chunks[:2]
    await index.close()
    assert await open_index().count() == 2  # the same collection, for the same embedder
