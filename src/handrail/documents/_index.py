"""The vector index: chunks with their vectors, searched by cosine similarity.

`Index` is the seam; `ChromaIndex` is the one implementation, over ChromaDB in two forms:

```python
index = ChromaIndex.persistent("./.handrail/index", embedder=embedder)  # embedded, on disk
index = ChromaIndex.http("127.0.0.1", 8000, embedder=embedder)  # a shared `chroma run` server
```

The index always receives its vectors from handrail's `Embedder` (Chroma's own embedding
function, which would download a model, is never used). The collection records which
embedder made its vectors, and opening it with another one is refused: vectors of different
models cannot be compared. Chroma's client blocks, so every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from ..exceptions import ConfigError, DocumentIndexError, HandrailError, MissingExtraError
from ._embed import MINILM_MODELS, Embedder, Vectors, normalize
from ._types import Chunk

if TYPE_CHECKING:
    from chromadb.api import ClientAPI
    from chromadb.api.models.Collection import Collection as ChromaCollection
    from chromadb.config import Settings

__all__ = ["ChromaIndex", "Index"]

_T = TypeVar("_T")


@runtime_checkable
class Index(Protocol):
    """Where chunks and their vectors are kept and searched; one embedder's vectors only.

    A chunk is keyed by its `id`: upserting an id again replaces the chunk and its vector.
    Re-ingesting a changed file is `delete_source` then `upsert` of its new chunks.
    """

    async def upsert(self, chunks: Sequence[Chunk], vectors: Vectors) -> None:
        """Add or replace `chunks`, with `vectors[i]` the embedding of `chunks[i].text`.

        Raises:
            DocumentIndexError: the vectors do not fit (count, or length other than the
                embedder's), or the store failed.
        """
        ...

    async def delete_source(self, source: str) -> None:
        """Remove every chunk of `source` (nothing happens when it has none)."""
        ...

    async def clear(self) -> None:
        """Remove every chunk, of every source and every note (an empty index stays empty).

        The index stays usable, for the same embedder: the next ingest fills it again.
        """
        ...

    async def sources(self) -> dict[str, str]:
        """Each source in the index, with its `content_hash` (to skip unchanged files)."""
        ...

    async def query(
        self, vector: NDArray[np.floating[Any]], k: int, *, sources: Collection[str] | None = None
    ) -> list[tuple[Chunk, float]]:
        """The `k` chunks nearest to `vector`, nearest first, with their cosine similarity.

        Args:
            vector: the query's embedding, by the same embedder (its length is ignored).
            k: most chunks to return.
            sources: only chunks of these sources (None: all; a str: that one).

        Returns:
            `(chunk, similarity)` pairs, similarity in [-1, 1], highest first; [] when the
            index (or the sources' part of it) is empty.
        """
        ...

    async def get(self, ids: Sequence[str]) -> list[Chunk]:
        """The chunks with these ids, in this order; an id not in the index is left out."""
        ...

    async def vectors(self, ids: Sequence[str]) -> dict[str, Vectors]:
        """The stored vectors of these chunks (unit length), by id; an unknown id is left out."""
        ...

    async def chunks(self) -> list[Chunk]:
        """Every chunk, by source then position (to build the keyword index).

        Read `version()` first: if the index changes meanwhile, the version read will be
        stale, and the next check rebuilds.
        """
        ...

    async def count(self) -> int:
        """How many chunks the index holds."""
        ...

    async def version(self) -> str:
        """A token that changes whenever chunks are upserted or deleted (cheap to read)."""
        ...

    async def close(self) -> None:
        """Release the connection or the files; a later call opens them again."""
        ...


# -- ChromaDB ----------------------------------------------------------------------------------

_SCHEMA = 1
"""Version of how chunks are stored in Chroma metadata. 1: the first."""
_EMBEDDER = "handrail:embedder"
_DIMENSIONS = "handrail:dimensions"
_SCHEMA_KEY = "handrail:schema"
_VERSION = "handrail:version"
_PAGE = 5000  # records fetched a request when reading the whole collection


class ChromaIndex:
    """An `Index` over ChromaDB: embedded on disk (`persistent`), or a server (`http`).

    Build it with `ChromaIndex.persistent(...)` or `ChromaIndex.http(...)`. Nothing is opened
    until the first call, which opens (or creates) the collection and checks that its vectors
    are the embedder's. The collection uses cosine distance (`hnsw:space` `cosine`); the
    similarities returned are `1 - distance`.

    A chunk's fields are stored as Chroma metadata: optional fields are left out when None,
    headings and the chunk's own `metadata` are JSON strings, so a chunk comes back equal.
    """

    def __init__(
        self,
        connect: Callable[[], ClientAPI],
        *,
        embedder: Embedder,
        collection: str,
        where: str,
    ) -> None:
        """Prefer `ChromaIndex.persistent` or `ChromaIndex.http`.

        Args:
            connect: makes the Chroma client (called in a worker thread, once).
            embedder: the embedder whose vectors the collection holds.
            collection: the collection's name (3-512 of `[a-zA-Z0-9._-]`).
            where: the store, in words, for messages (`/srv/index`, `http://host:port`).
        """
        if not isinstance(embedder, Embedder):
            raise ConfigError(
                f"ChromaIndex(embedder={embedder!r}): pass an Embedder (MiniLMEmbedder(), "
                f"OpenAIEmbedder(...)), whose vectors the index holds."
            )
        self.embedder_name = embedder.name
        self.dimensions = embedder.dimensions
        self.collection_name = collection
        self.where = where
        self._connect = connect
        self._lock = threading.Lock()
        self._client: ClientAPI | None = None
        self._collection: ChromaCollection | None = None
        self._max_batch = _PAGE

    @classmethod
    def persistent(
        cls, path: str | os.PathLike[str], *, embedder: Embedder, collection: str = "handrail"
    ) -> ChromaIndex:
        """An index in a folder on this machine, read and written in-process (no server).

        One process at a time should write it; several processes share one through
        `ChromaIndex.http` and a `chroma run --path DIR` server instead.

        Args:
            path: the folder (created if missing).
            embedder: the embedder whose vectors it holds.
            collection: the collection's name, to keep several indexes in one folder.
        """
        folder = os.fspath(path)

        def connect() -> ClientAPI:
            settings = _settings()
            import chromadb

            return chromadb.PersistentClient(path=folder, settings=settings)

        return cls(connect, embedder=embedder, collection=collection, where=folder)

    @classmethod
    def http(
        cls,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        embedder: Embedder,
        collection: str = "handrail",
        ssl: bool = False,
        headers: dict[str, str] | None = None,
    ) -> ChromaIndex:
        """An index on a Chroma server (`chroma run --path DIR --host HOST --port PORT`).

        Args:
            host: the server's host.
            port: the server's port.
            embedder: the embedder whose vectors it holds.
            collection: the collection's name.
            ssl: speak HTTPS.
            headers: sent with every request (an auth token, say).
        """
        url = f"{'https' if ssl else 'http'}://{host}:{port}"

        def connect() -> ClientAPI:
            settings = _settings()
            import chromadb

            # Asked first, because a chromadb HttpClient that cannot connect leaks its pool.
            _answers(url, host, port)
            return chromadb.HttpClient(
                host=host, port=port, ssl=ssl, headers=headers, settings=settings
            )

        return cls(connect, embedder=embedder, collection=collection, where=url)

    def __repr__(self) -> str:
        return (
            f"ChromaIndex({self.where!r}, collection={self.collection_name!r}, "
            f"embedder={self.embedder_name!r})"
        )

    async def upsert(self, chunks: Sequence[Chunk], vectors: Vectors) -> None:
        """See `Index.upsert`."""
        array = self._check_vectors(vectors, len(chunks))
        if not chunks:
            return
        await self._call(self._upsert, list(chunks), array)

    async def delete_source(self, source: str) -> None:
        """See `Index.delete_source`."""
        await self._call(self._delete_source, source)

    async def clear(self) -> None:
        """See `Index.clear`.

        Deletes the records, not the collection, so another process's handle on it (a shared
        server's) stays valid.
        """
        await self._call(self._clear)

    async def sources(self) -> dict[str, str]:
        """See `Index.sources`."""
        return await self._call(self._sources)

    async def query(
        self, vector: NDArray[np.floating[Any]], k: int, *, sources: Collection[str] | None = None
    ) -> list[tuple[Chunk, float]]:
        """See `Index.query`."""
        query = self._check_vectors(np.reshape(vector, (1, -1)), 1)
        if isinstance(sources, str):  # one source, not its characters
            sources = [sources]
        if k < 1 or (sources is not None and not sources):
            return []
        return await self._call(self._query, normalize(query), k, sources)

    async def get(self, ids: Sequence[str]) -> list[Chunk]:
        """See `Index.get`."""
        if not ids:
            return []
        return await self._call(self._get, list(ids))

    async def vectors(self, ids: Sequence[str]) -> dict[str, Vectors]:
        """See `Index.vectors`."""
        if not ids:
            return {}
        return await self._call(self._vectors, list(ids))

    async def chunks(self) -> list[Chunk]:
        """See `Index.chunks`."""
        return await self._call(self._chunks)

    async def count(self) -> int:
        """See `Index.count`."""
        return await self._call(lambda: self._open().count())

    async def version(self) -> str:
        """See `Index.version`."""
        return await self._call(self._version)

    async def close(self) -> None:
        """See `Index.close`."""
        await asyncio.to_thread(self._close)

    # -- in the worker thread ------------------------------------------------------------------

    async def _call(self, function: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.to_thread(self._guarded, function, *args)

    def _guarded(self, function: Callable[..., _T], *args: Any) -> _T:
        try:
            return function(*args)
        except HandrailError:
            raise
        except Exception as error:  # Chroma's own, httpx's, OSError: the store failed
            raise DocumentIndexError(
                f"Chroma ({self.where}, collection {self.collection_name!r}) failed: "
                f"{type(error).__name__}: {error}"
            ) from error

    def _open(self) -> ChromaCollection:
        collection = self._collection
        if collection is not None:
            return collection
        with self._lock:
            if self._collection is None:
                client = self._client or self._connect()
                self._client = client
                collection = client.get_or_create_collection(
                    self.collection_name,
                    configuration={"hnsw": {"space": "cosine"}},
                    metadata=self._metadata(),
                    embedding_function=None,
                )
                self._check_collection(collection.metadata or {})
                self._max_batch = min(_PAGE, client.get_max_batch_size())
                self._collection = collection
            return self._collection

    def _metadata(self) -> dict[str, str | int | float | bool]:
        # Chroma replaces a collection's metadata whole, so each write restates all of it.
        return {
            _EMBEDDER: self.embedder_name,
            _DIMENSIONS: self.dimensions,
            _SCHEMA_KEY: _SCHEMA,
            _VERSION: uuid.uuid4().hex,
        }

    def _check_collection(self, metadata: dict[str, Any]) -> None:
        here = f"The Chroma collection {self.collection_name!r} at {self.where}"
        if _EMBEDDER not in metadata:
            raise DocumentIndexError(
                f"{here} was not made by handrail (its metadata has no {_EMBEDDER!r}): "
                f"pass another collection= name, or delete that collection."
            )
        name, dimensions = metadata[_EMBEDDER], metadata.get(_DIMENSIONS)
        if (name, dimensions) != (self.embedder_name, self.dimensions):
            use = f"MiniLMEmbedder(model={name!r})" if name in MINILM_MODELS else repr(name)
            raise DocumentIndexError(
                f"{here} holds vectors of the embedder {name!r} ({dimensions} dimensions), "
                f"not of {self.embedder_name!r} ({self.dimensions}): vectors of different "
                f"models cannot be compared. Open it with the embedder {use}, or re-ingest "
                f"into a new collection= (or a new path) with this one."
            )
        schema = metadata.get(_SCHEMA_KEY)
        if schema != _SCHEMA:
            raise DocumentIndexError(
                f"{here} stores chunks in handrail's format {schema!r}, which this version "
                f"(format {_SCHEMA}) cannot read: re-ingest into a new collection= or path, "
                f"or use the handrail version that made it."
            )

    def _touch(self, collection: ChromaCollection) -> None:
        collection.modify(metadata=self._metadata())

    def _upsert(self, chunks: list[Chunk], vectors: Vectors) -> None:
        collection = self._open()
        step = self._max_batch
        for start in range(0, len(chunks), step):
            part = chunks[start : start + step]
            collection.upsert(
                ids=[chunk.id for chunk in part],
                embeddings=vectors[start : start + step],
                documents=[chunk.text for chunk in part],
                metadatas=[_encode(chunk) for chunk in part],
            )
        self._touch(collection)

    def _delete_source(self, source: str) -> None:
        collection = self._open()
        collection.delete(where={"source": source})
        self._touch(collection)

    def _clear(self) -> None:
        collection = self._open()
        while True:
            ids = collection.get(include=[], limit=self._max_batch)["ids"]
            if not ids:
                break
            collection.delete(ids=ids)
        self._touch(collection)

    def _query(
        self, vector: Vectors, k: int, sources: Collection[str] | None
    ) -> list[tuple[Chunk, float]]:
        where: Any = None
        if sources is not None:
            where = {"source": {"$in": sorted(sources)}}
        result = self._open().query(
            query_embeddings=vector,
            n_results=k,
            where=where,
            include=["documents", "metadatas", "distances"],
        )
        ids, texts = result["ids"][0], (result["documents"] or [[]])[0]
        metas, distances = (result["metadatas"] or [[]])[0], (result["distances"] or [[]])[0]
        return [
            (_decode(id_, text, meta), 1.0 - float(distance))
            for id_, text, meta, distance in zip(ids, texts, metas, distances, strict=True)
        ]

    def _get(self, ids: list[str]) -> list[Chunk]:
        found: dict[str, Chunk] = {}
        collection = self._open()
        for start in range(0, len(ids), self._max_batch):
            result = collection.get(
                ids=ids[start : start + self._max_batch], include=["documents", "metadatas"]
            )
            for id_, text, meta in zip(
                result["ids"], result["documents"] or [], result["metadatas"] or [], strict=True
            ):
                found[id_] = _decode(id_, text, meta)
        return [found[id_] for id_ in ids if id_ in found]

    def _vectors(self, ids: list[str]) -> dict[str, Vectors]:
        found: dict[str, Vectors] = {}
        collection = self._open()
        for start in range(0, len(ids), self._max_batch):
            result = collection.get(
                ids=ids[start : start + self._max_batch], include=["embeddings"]
            )
            embeddings = result["embeddings"]
            if embeddings is None:
                continue
            for id_, vector in zip(result["ids"], embeddings, strict=True):
                found[id_] = np.asarray(vector, dtype=np.float32)
        return found

    def _pages(self, include: Any) -> Any:
        collection = self._open()
        offset = 0
        while True:
            page = collection.get(include=include, limit=_PAGE, offset=offset)
            if not page["ids"]:
                return
            yield page
            offset += len(page["ids"])

    def _chunks(self) -> list[Chunk]:
        chunks = [
            _decode(id_, text, meta)
            for page in self._pages(["documents", "metadatas"])
            for id_, text, meta in zip(
                page["ids"], page["documents"], page["metadatas"], strict=True
            )
        ]
        chunks.sort(key=lambda chunk: (chunk.source, chunk.index, chunk.id))
        return chunks

    def _sources(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for page in self._pages(["metadatas"]):
            for meta in page["metadatas"]:
                found[str(meta["source"])] = str(meta.get("content_hash", ""))
        return dict(sorted(found.items()))

    def _version(self) -> str:
        self._open()
        assert self._client is not None
        fresh = self._client.get_collection(self.collection_name, embedding_function=None)
        return str((fresh.metadata or {}).get(_VERSION, ""))

    def _close(self) -> None:
        with self._lock:
            client, self._client, self._collection = self._client, None, None
        if client is not None:
            _close_client(client)

    def _check_vectors(self, vectors: NDArray[Any], count: int) -> Vectors:
        array = np.asarray(vectors, dtype=np.float32)
        if array.shape != (count, self.dimensions):
            raise DocumentIndexError(
                f"{self!r} takes {count} vector(s) of {self.dimensions} dimensions here, got "
                f"an array of shape {array.shape}: embed with {self.embedder_name!r}, the "
                f"embedder this index was opened with."
            )
        if not np.isfinite(array).all():
            raise DocumentIndexError(
                f"{self!r} was given vectors with NaN or infinite values: the embedder failed."
            )
        return array


def _settings() -> Settings:
    """Chroma's settings (telemetry off), or an ImportError that names the extra."""
    try:
        from chromadb.config import Settings
    except ImportError as error:
        raise MissingExtraError("ChromaIndex", needs="chromadb", extra="documents") from error
    return Settings(anonymized_telemetry=False)


def _answers(url: str, host: str, port: int) -> None:
    """Raise a DocumentIndexError naming the fix unless a server answers at `url`."""
    try:
        with urllib.request.urlopen(f"{url}/api/v2/heartbeat", timeout=10):
            pass
    except urllib.error.HTTPError:
        pass  # something answered: let Chroma's client say what is wrong
    except OSError as error:
        raise DocumentIndexError(
            f"No Chroma server answered at {url} ({error}). Start one: chroma run --path DIR "
            f"--host {host} --port {port}, or fix host= and port=."
        ) from error


def _close_client(client: Any) -> None:
    client.close()
    # chromadb 1.5 stops an HTTP client's systems (its own and its admin client's) without
    # closing their connection pools, whose sockets then linger until garbage collection (a
    # ResourceWarning). Close each pool once its system is gone.
    from chromadb.api.shared_system_client import SharedSystemClient

    for owner in (client, getattr(client, "_admin_client", None)):
        if getattr(owner, "_identifier", None) in SharedSystemClient._identifier_to_system:
            continue  # still shared with another client
        session = getattr(getattr(owner, "_server", None), "_session", None)
        close = getattr(session, "close", None)
        if callable(close):
            close()


def _encode(chunk: Chunk) -> dict[str, str | int | float | bool]:
    meta: dict[str, str | int | float | bool] = {
        "source": chunk.source,
        "index": chunk.index,
        "start": chunk.start,
        "end": chunk.end,
        "headings": json.dumps(chunk.headings, ensure_ascii=False),
        "content_hash": chunk.content_hash,
        "metadata": json.dumps(chunk.metadata, ensure_ascii=False),
    }
    for key in ("page", "end_page", "prev_id", "next_id"):
        value = getattr(chunk, key)
        if value is not None:  # Chroma stores no None: absent means None
            meta[key] = value
    return meta


def _decode(id_: str, text: str | None, meta: Any) -> Chunk:
    return Chunk(
        id=id_,
        source=meta["source"],
        text=text or "",
        index=meta["index"],
        start=meta["start"],
        end=meta["end"],
        page=meta.get("page"),
        end_page=meta.get("end_page"),
        headings=tuple(json.loads(meta["headings"])),
        prev_id=meta.get("prev_id"),
        next_id=meta.get("next_id"),
        content_hash=meta.get("content_hash", ""),
        metadata=json.loads(meta["metadata"]),
    )
