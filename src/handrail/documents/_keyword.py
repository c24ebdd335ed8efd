"""Keyword search: BM25 over the chunks' words, stemmed, without English stopwords.

It finds what embeddings miss: exact names, codes and rare words ("SKU-4471", "GDPR").
Words are lower-cased, split into runs of two or more letters or digits, stripped of
English stopwords and stemmed with Snowball's English stemmer, so "refunds" finds
"refunded". The index lives in memory and is rebuilt from the vector index's chunks when
they change (about 1 s for 10,000 chunks of 150 words, 10 s for 100,000, on 2 cores).

```python
keywords = await asyncio.to_thread(KeywordIndex.build, chunks)  # CPU-bound: off the loop
hits = keywords.search("refund policy", k=10)  # [(chunk_id, score), ...], best first
```
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..exceptions import MissingExtraError
from ._types import Chunk

if TYPE_CHECKING:
    import bm25s  # type: ignore[import-untyped]

__all__ = ["KeywordIndex"]

_WORDS = r"(?u)\b\w\w+\b"
"""A word: two or more letters or digits (bm25s's default, kept for queries and chunks alike)."""


class KeywordIndex:
    """A BM25 index of chunk texts, built at once from all of them (it is not updated in place).

    Build it with `KeywordIndex.build(chunks)`. `search` is safe to call from several threads.
    """

    def __init__(
        self, ids: Sequence[str], retriever: bm25s.BM25 | None, vocabulary: dict[str, int]
    ) -> None:
        self._ids = list(ids)
        self._retriever = retriever
        self._vocabulary = vocabulary
        self._analyzer = _Analyzer()

    @classmethod
    def build(
        cls, chunks: Iterable[Chunk], text: Callable[[Chunk], str] | None = None
    ) -> KeywordIndex:
        """Index the chunks' texts (CPU-bound: from async code, call it in a worker thread).

        Args:
            chunks: what to index.
            text: what of a chunk is indexed; its `text` by default (the library indexes its
                text after its page title and heading path).

        No chunks give an index that finds nothing.
        """
        bm25s, stemmer = _bm25s()
        chunks = list(chunks)
        if not chunks:
            return cls([], None, {})
        tokenizer = bm25s.tokenization.Tokenizer(
            splitter=_WORDS, stopwords="english", stemmer=stemmer.Stemmer("english")
        )
        # allow_empty: a chunk of stopwords alone gets the empty token, so every chunk keeps
        # its row and the row numbers stay the chunks' positions.
        ids = tokenizer.tokenize(
            [chunk.text if text is None else text(chunk) for chunk in chunks],
            update_vocab=True,
            return_as="ids",
            show_progress=False,
            allow_empty=True,
        )
        vocabulary: dict[str, int] = dict(tokenizer.get_vocab_dict())
        retriever = bm25s.BM25()
        retriever.index((ids, dict(vocabulary)), show_progress=False)
        return cls([chunk.id for chunk in chunks], retriever, vocabulary)

    def __len__(self) -> int:
        return len(self._ids)

    def search(self, query: str, k: int) -> list[tuple[str, float]]:
        """The chunks that share words with `query`, best first.

        Args:
            query: the words to look for; stopwords and words no chunk has are ignored.
            k: most hits to return.

        Returns:
            Up to `k` `(chunk_id, score)` pairs with a positive BM25 score (unbounded; higher
            is better), best first, ties in build order. [] when the query has no indexed word
            (only stopwords, say) or the index is empty.
        """
        if k < 1 or self._retriever is None:
            return []
        vocabulary = self._vocabulary
        terms = {vocabulary[term] for term in self._analyzer.terms(query) if term in vocabulary}
        if not terms:
            return []
        scores: Any = self._retriever.get_scores_from_ids(sorted(terms))
        hits = np.flatnonzero(scores > 0)
        if len(hits) > k:
            hits = np.sort(hits[np.argpartition(-scores[hits], k - 1)[:k]])
        hits = hits[np.argsort(-scores[hits], kind="stable")]  # stable: ties in build order
        return [(self._ids[i], float(scores[i])) for i in hits]


class _Analyzer:
    """A query's terms, made as the build makes the chunks' (bm25s's tokenizer, set alike)."""

    def __init__(self) -> None:
        bm25s, stemmer = _bm25s()
        self._stopwords = frozenset(bm25s.stopwords.STOPWORDS_EN)
        self._split = re.compile(_WORDS).findall
        self._stemmer = stemmer.Stemmer("english")
        self._lock = threading.Lock()  # a PyStemmer stemmer must not be shared by threads

    def terms(self, text: str) -> list[str]:
        words = [word for word in self._split(text.lower()) if word not in self._stopwords]
        with self._lock:
            stems: list[str] = self._stemmer.stemWords(words)
        return stems


def _bm25s() -> tuple[Any, Any]:
    try:
        import bm25s
        import Stemmer  # type: ignore[import-not-found]
    except ImportError as error:
        raise MissingExtraError(
            "KeywordIndex", needs="bm25s and PyStemmer", extra="documents"
        ) from error
    return bm25s, Stemmer
