"""Embedders: the real MiniLM ONNX model, and OpenAIEmbedder against a local fake endpoint.

The fake speaks OpenAI's `POST /v1/embeddings` over real HTTP on 127.0.0.1 (as
tests/fake_providers.py does for chat), so the real SDK's request and response handling run.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handrail.documents import _embed
from handrail.documents._embed import (
    MINILM_MODELS,
    Embedder,
    MiniLMEmbedder,
    OpenAIEmbedder,
    _batches,
    normalize,
)
from handrail.documents._library import Library
from handrail.exceptions import ConfigError, DocumentIndexError

# -- MiniLM --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    embedder = MiniLMEmbedder()
    embedder.embed_sync(["warm up"])  # load the model once for the module
    return embedder


def cosine(a: Any, b: Any) -> float:
    return float(np.dot(a, b))


async def test_minilm_is_an_embedder(minilm: MiniLMEmbedder) -> None:
    assert isinstance(minilm, Embedder)
    assert (minilm.name, minilm.dimensions) == ("all-MiniLM-L6-v2-int8-v2", 384)


REFERENCE = Path(__file__).with_name("minilm_float_reference.json")
"""Vectors of the float model (torch export of all-MiniLM-L6-v2, made once, outside handrail)."""


@pytest.mark.parametrize("model", list(MINILM_MODELS))
async def test_minilm_stays_close_to_the_float_model(model: str) -> None:
    reference = json.loads(REFERENCE.read_text("utf-8"))
    embedder = MiniLMEmbedder(model=model)

    together = await embedder.embed(reference["texts"])
    alone = np.vstack([embedder.embed_sync([text]) for text in reference["texts"]])

    expected = np.asarray(reference["vectors"], dtype=np.float32)
    for vectors in (together, alone):
        cosines = np.sum(vectors * expected, axis=1)
        assert cosines.min() >= 0.99, cosines
    assert embedder.name == model


def test_minilm_refuses_an_unknown_model() -> None:
    with pytest.raises(ConfigError, match=r"model='all-MiniLM-L6-v2-fp16'.*int8-v2"):
        MiniLMEmbedder(model="all-MiniLM-L6-v2-fp16")


async def test_an_index_of_the_earlier_model_names_how_to_open_it(tmp_path: Path) -> None:
    earlier = MiniLMEmbedder(model="all-MiniLM-L6-v2-int8")
    async with Library.open(tmp_path, embedder=earlier) as library:
        await library.add_note("Refunds take 14 days.", author="ana")

    async with Library.open(tmp_path) as library:  # today's default embedder
        with pytest.raises(DocumentIndexError) as caught:
            await library.retrieve("refunds")
    message = str(caught.value)
    assert "MiniLMEmbedder(model='all-MiniLM-L6-v2-int8')" in message
    assert "re-ingest" in message

    async with Library.open(tmp_path, embedder=earlier) as library:  # and it still opens
        found = await library.retrieve("How long do refunds take?")
    assert [item.chunk.text for item in found] == ["Refunds take 14 days."]


async def test_minilm_returns_unit_float32_rows(minilm: MiniLMEmbedder) -> None:
    vectors = await minilm.embed(["How do I get a refund?", "", "Ünïcode ☔ text", "x " * 50])

    assert vectors.shape == (4, 384)
    assert vectors.dtype == np.float32
    assert np.linalg.norm(vectors, axis=1) == pytest.approx([1.0] * 4, abs=1e-5)


async def test_minilm_of_nothing_is_an_empty_array(minilm: MiniLMEmbedder) -> None:
    vectors = await minilm.embed([])

    assert vectors.shape == (0, 384)
    assert vectors.dtype == np.float32


async def test_minilm_puts_related_sentences_closer_than_unrelated(
    minilm: MiniLMEmbedder,
) -> None:
    question, answer, unrelated = await minilm.embed(
        [
            "How do I get a refund?",
            "Refunds are issued within 14 days",
            "The office cat is named Tom",
        ]
    )

    related = cosine(question, answer)
    assert related > 0.5
    assert cosine(question, unrelated) < 0.2
    assert cosine(answer, unrelated) < 0.2


async def test_minilm_batched_equals_one_by_one(minilm: MiniLMEmbedder) -> None:
    texts = [
        "Refunds are issued within 14 days.",
        "short",
        "A much longer paragraph about shipping times, customs duties and the tracking "
        "numbers that customers receive by email once their parcel leaves the warehouse.",
        "The office cat is named Tom.",
        "",
    ] * 3

    together = await minilm.embed(texts)
    alone = np.vstack([minilm.embed_sync([text]) for text in texts])

    # Not equal: the int8 layers scale each batch's activations by the batch's own range.
    # The empty text moves most (cosine 0.981 here); a real sentence, less than 0.005.
    agreement = np.sum(together * alone, axis=1)
    assert agreement.min() >= 0.975
    assert np.median(agreement) >= 0.995


async def test_minilm_keeps_the_order_of_the_texts(minilm: MiniLMEmbedder) -> None:
    texts = [f"{'word ' * n}end" for n in (40, 1, 25, 3, 60, 2)]  # lengths out of order

    vectors = await minilm.embed(texts)

    for text, vector in zip(texts, vectors, strict=True):
        assert cosine(vector, minilm.embed_sync([text])[0]) >= 0.99


async def test_minilm_reads_only_the_first_max_tokens() -> None:
    short = MiniLMEmbedder(max_tokens=16)
    start = "refunds are issued within fourteen days of the request being received " * 3

    a, b = await short.embed([start + " and then " * 200, start + " cats " * 300])

    assert cosine(a, b) == pytest.approx(1.0, abs=1e-5)


async def test_minilm_does_not_block_the_event_loop(minilm: MiniLMEmbedder) -> None:
    texts = [
        f"Paragraph {i} about refunds, shipping and the returns policy. " * 12 for i in range(64)
    ]
    ticks: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    started = time.perf_counter()
    vectors = await minilm.embed(texts)
    took = time.perf_counter() - started
    done.set()
    await task

    assert vectors.shape == (64, 384)
    assert took > 0.3  # long enough for the ticker to matter
    gaps = np.diff(ticks)
    assert len(ticks) > took / 0.1  # it kept ticking throughout
    assert gaps.max() < 0.5  # blocked, the loop would stall for the whole embed (seconds)


def test_minilm_loads_once_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[int] = []
    real = _embed._load_minilm

    def slow_load(model: str, max_tokens: int, threads: int) -> Any:
        loads.append(threads)
        time.sleep(0.2)  # so every thread arrives while the first is loading
        return real(model, max_tokens, threads)

    monkeypatch.setattr(_embed, "_load_minilm", slow_load)
    embedder = MiniLMEmbedder()
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(embedder.embed_sync(["same text"])))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(loads) == 1
    assert len(results) == 4
    for vectors in results[1:]:
        np.testing.assert_allclose(vectors, results[0], atol=1e-6)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"batch_size": 0}, "batch_size=0"),
        ({"max_tokens": 513}, "max_tokens=513"),
        ({"max_tokens": 0}, "max_tokens=0"),
        ({"threads": 0}, "threads=0"),
    ],
)
def test_minilm_refuses_bad_settings(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MiniLMEmbedder(**arguments)


def test_batches_group_similar_lengths_within_the_limits() -> None:
    lengths = [200, 5, 180, 7, 6, 300, 190, 5]

    groups = _batches(lengths, size=3, max_tokens=400)

    assert sorted(i for group in groups for i in group) == list(range(len(lengths)))
    for group in groups:
        assert len(group) <= 3
        assert len(group) == 1 or len(group) * max(lengths[i] for i in group) <= 400
    assert groups == [[1, 7, 4], [3, 2], [6, 0], [5]]


def test_normalize_gives_unit_rows_and_leaves_zero_rows_zero() -> None:
    vectors = normalize(np.array([[3.0, 4.0], [0.0, 0.0]]))

    assert vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, [[0.6, 0.8], [0.0, 0.0]])


# -- OpenAI, against a fake endpoint -------------------------------------------------------------


def fake_vector(text: str, dimensions: int) -> list[float]:
    """A deterministic, unnormalised vector for a text."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    vector: list[float] = (np.random.default_rng(seed).standard_normal(dimensions) * 3).tolist()
    return vector


class FakeEmbeddings:
    """`POST /v1/embeddings` on 127.0.0.1; `fail(status, ...)` scripts errors for the next
    requests. Answers the data in reverse order, to check that `index` is honoured."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.failures: deque[tuple[int, str]] = deque()
        self.wrong_dimensions: int | None = None
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                fake.answer(self, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def fail(self, status: int, message: str, times: int = 1) -> None:
        self.failures.extend([(status, message)] * times)

    def answer(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        with self.lock:
            self.requests.append(
                {"path": handler.path, "auth": handler.headers.get("authorization"), **body}
            )
            failure = self.failures.popleft() if self.failures else None
        if handler.path != "/v1/embeddings":
            return self.send(handler, 404, {"error": {"message": f"no route {handler.path}"}})
        if not (handler.headers.get("authorization") or "").startswith("Bearer "):
            return self.send(handler, 401, {"error": {"message": "You didn't provide an API key."}})
        if failure is not None:
            status, message = failure
            error = {"message": message, "type": "error", "param": None, "code": None}
            return self.send(handler, status, {"error": error})
        texts = body["input"]
        if any(text == "" for text in texts):
            error = {"message": "'$.input' is invalid.", "type": "invalid_request_error"}
            return self.send(handler, 400, {"error": error})
        dimensions = self.wrong_dimensions or body.get("dimensions") or 1536
        data = []
        for i, text in enumerate(texts):
            vector = fake_vector(text, dimensions)
            if body.get("encoding_format") == "base64":
                raw = np.asarray(vector, dtype="<f4").tobytes()
                embedding: Any = base64.b64encode(raw).decode()
            else:
                embedding = vector
            data.append({"object": "embedding", "index": i, "embedding": embedding})
        data.reverse()
        usage = {"prompt_tokens": 3 * len(texts), "total_tokens": 3 * len(texts)}
        self.send(
            handler, 200, {"object": "list", "data": data, "model": body["model"], "usage": usage}
        )

    @staticmethod
    def send(handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
        payload = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(payload)))
        handler.send_header("x-request-id", "req_fake")
        handler.end_headers()
        handler.wfile.write(payload)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture(scope="module")
def fake_openai() -> Iterator[FakeEmbeddings]:
    fake = FakeEmbeddings()
    yield fake
    fake.close()


@pytest.fixture
async def openai_embedder(fake_openai: FakeEmbeddings) -> AsyncIterator[OpenAIEmbedder]:
    fake_openai.requests.clear()
    fake_openai.failures.clear()
    fake_openai.wrong_dimensions = None
    embedder = OpenAIEmbedder(api_key="sk-test", base_url=fake_openai.url, batch_size=2)
    yield embedder
    await embedder.aclose()


async def test_openai_embeds_in_order_in_batches(
    openai_embedder: OpenAIEmbedder, fake_openai: FakeEmbeddings
) -> None:
    texts = ["alpha", "beta", "gamma", "delta", "epsilon"]

    vectors = await openai_embedder.embed(texts)

    assert isinstance(openai_embedder, Embedder)
    assert (openai_embedder.name, openai_embedder.dimensions) == (
        "openai:text-embedding-3-small",
        1536,
    )
    assert vectors.shape == (5, 1536)
    assert vectors.dtype == np.float32
    expected = normalize(np.array([fake_vector(text, 1536) for text in texts]))
    np.testing.assert_allclose(vectors, expected, atol=1e-6)
    sent = sorted((r["input"] for r in fake_openai.requests), key=lambda i: texts.index(i[0]))
    assert sent == [["alpha", "beta"], ["gamma", "delta"], ["epsilon"]]
    assert {r["model"] for r in fake_openai.requests} == {"text-embedding-3-small"}
    assert {r["auth"] for r in fake_openai.requests} == {"Bearer sk-test"}
    assert all("dimensions" not in r for r in fake_openai.requests)


async def test_openai_asks_for_shortened_vectors(fake_openai: FakeEmbeddings) -> None:
    fake_openai.requests.clear()
    embedder = OpenAIEmbedder(
        "text-embedding-3-large", api_key="sk-test", base_url=fake_openai.url, dimensions=256
    )
    try:
        vectors = await embedder.embed(["one", "two"])
    finally:
        await embedder.aclose()

    assert (embedder.name, embedder.dimensions) == ("openai:text-embedding-3-large", 256)
    assert vectors.shape == (2, 256)
    assert [r["dimensions"] for r in fake_openai.requests] == [256]


async def test_openai_sends_an_empty_text_as_a_space(
    openai_embedder: OpenAIEmbedder, fake_openai: FakeEmbeddings
) -> None:
    vectors = await openai_embedder.embed(["", "text"])

    assert fake_openai.requests[0]["input"] == [" ", "text"]
    assert np.linalg.norm(vectors, axis=1) == pytest.approx([1.0, 1.0], abs=1e-5)


async def test_openai_of_nothing_sends_nothing(
    openai_embedder: OpenAIEmbedder, fake_openai: FakeEmbeddings
) -> None:
    vectors = await openai_embedder.embed([])

    assert vectors.shape == (0, 1536)
    assert fake_openai.requests == []


async def test_openai_refused_key_names_the_fix(
    openai_embedder: OpenAIEmbedder, fake_openai: FakeEmbeddings
) -> None:
    fake_openai.fail(401, "Incorrect API key provided: sk-test.")

    with pytest.raises(DocumentIndexError, match=r"HTTP 401.*Incorrect API key.*OPENAI_API_KEY"):
        await openai_embedder.embed(["text"])


async def test_openai_retries_a_server_error(fake_openai: FakeEmbeddings) -> None:
    fake_openai.requests.clear()
    fake_openai.fail(500, "The server had an error.")
    embedder = OpenAIEmbedder(api_key="sk-test", base_url=fake_openai.url, max_retries=1)
    try:
        vectors = await embedder.embed(["text"])
    finally:
        await embedder.aclose()

    assert vectors.shape == (1, 1536)
    assert len(fake_openai.requests) == 2


async def test_openai_gives_up_after_its_retries(fake_openai: FakeEmbeddings) -> None:
    fake_openai.failures.clear()
    fake_openai.fail(503, "Overloaded.", times=2)
    embedder = OpenAIEmbedder(api_key="sk-test", base_url=fake_openai.url, max_retries=1)
    try:
        with pytest.raises(DocumentIndexError, match="HTTP 503: Overloaded"):
            await embedder.embed(["text"])
    finally:
        await embedder.aclose()


async def test_openai_vectors_of_the_wrong_length_are_refused(
    openai_embedder: OpenAIEmbedder, fake_openai: FakeEmbeddings
) -> None:
    fake_openai.wrong_dimensions = 8

    with pytest.raises(DocumentIndexError, match=r"shape \(1, 8\).*dimensions="):
        await openai_embedder.embed(["text"])


async def test_openai_unreachable_server_names_the_fix() -> None:
    embedder = OpenAIEmbedder(api_key="sk-test", base_url="http://127.0.0.1:9/v1", max_retries=0)
    try:
        with pytest.raises(DocumentIndexError, match="Check the network and base_url"):
            await embedder.embed(["text"])
    finally:
        await embedder.aclose()


def test_openai_without_a_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIEmbedder()


def test_openai_unknown_model_needs_dimensions() -> None:
    with pytest.raises(ConfigError, match="pass dimensions="):
        OpenAIEmbedder("my-embedder", api_key="sk-test")
    assert OpenAIEmbedder("my-embedder", api_key="sk-test", dimensions=768).dimensions == 768


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"batch_size": 0}, "batch_size=0"),
        ({"batch_size": 4096}, "batch_size=4096"),
        ({"concurrency": 0}, "concurrency=0"),
    ],
)
def test_openai_refuses_bad_settings(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        OpenAIEmbedder(api_key="sk-test", **arguments)
