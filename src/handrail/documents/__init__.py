"""Documents: answer from a company's own documents, with verified citations.

```python
from handrail.documents import Answerer, Library

async with Library.open(".handrail/documents") as library:
    await library.ingest("policies/")
    reply = await Answerer(library, "openai:gpt-4o-mini").answer("How long do refunds take?")
```

ingest (loaders → chunker) → embed (`Embedder`) → index (`Index`) → retrieve (hybrid,
threshold, neighbours) → answer (evidence prompt, verified citations, confidence, escalation
through the suspension primitive). `document_tools(answerer)` gives any agent the documents
as tools. Needs `pip install "handrail[documents]"`; see docs/documents.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._types import Block, BlockKind, Chunk, Document

if TYPE_CHECKING:
    from ._answer import Answerer, Citation, DocumentAnswer, evidence_prompt, verify_quote
    from ._chunker import chunk
    from ._decompose import decompose
    from ._embed import Embedder, MiniLMEmbedder, OpenAIEmbedder
    from ._index import ChromaIndex, Index
    from ._keyword import KeywordIndex
    from ._library import (
        Evidence,
        IngestProgress,
        IngestReport,
        Library,
        relevance_from_cosine,
    )
    from ._loaders import SUPPORTED_SUFFIXES, load, load_bytes
    from ._tools import Passage, document_tools

__all__ = [
    "SUPPORTED_SUFFIXES",
    "Answerer",
    "Block",
    "BlockKind",
    "ChromaIndex",
    "Chunk",
    "Citation",
    "Document",
    "DocumentAnswer",
    "Embedder",
    "Evidence",
    "Index",
    "IngestProgress",
    "IngestReport",
    "KeywordIndex",
    "Library",
    "MiniLMEmbedder",
    "OpenAIEmbedder",
    "Passage",
    "chunk",
    "decompose",
    "document_tools",
    "evidence_prompt",
    "load",
    "load_bytes",
    "relevance_from_cosine",
    "verify_quote",
]

_LAZY = {
    "Answerer": "_answer",
    "Citation": "_answer",
    "DocumentAnswer": "_answer",
    "evidence_prompt": "_answer",
    "verify_quote": "_answer",
    "chunk": "_chunker",
    "decompose": "_decompose",
    "Embedder": "_embed",
    "MiniLMEmbedder": "_embed",
    "OpenAIEmbedder": "_embed",
    "ChromaIndex": "_index",
    "Index": "_index",
    "KeywordIndex": "_keyword",
    "Evidence": "_library",
    "IngestProgress": "_library",
    "IngestReport": "_library",
    "Library": "_library",
    "relevance_from_cosine": "_library",
    "SUPPORTED_SUFFIXES": "_loaders",
    "load": "_loaders",
    "load_bytes": "_loaders",
    "Passage": "_tools",
    "document_tools": "_tools",
}


def __getattr__(name: str) -> Any:
    """Load the heavy parts (numpy, onnxruntime, chromadb) only when they are used."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'handrail.documents' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    except ImportError as error:
        raise ImportError(
            f"handrail.documents.{name} needs the documents extra ({error.name or error}): "
            f'pip install "handrail[documents]"'
        ) from error
    globals()[name] = value
    return value
