"""Documents: answer from a company's own documents, with verified citations.

ingest (loaders → chunker) → embed (`Embedder`) → index (`Index`) → retrieve (hybrid,
threshold, neighbours) → answer (evidence prompt, verified citations, confidence, escalation
through the suspension primitive). Needs `pip install "handrail[documents]"`.
"""

from __future__ import annotations

from ._types import Block, BlockKind, Chunk, Document

__all__ = ["Block", "BlockKind", "Chunk", "Document"]
