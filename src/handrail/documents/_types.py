"""What documents are made of, from a file on disk to a chunk in the index.

A loader reads a file into a `Document`: its whole text (as extracted) and its `Block`s, the
paragraphs, headings, tables and code blocks in reading order, each with its page and its
heading path. The chunker groups blocks into `Chunk`s of a target size; a chunk keeps where
it came from (source, page, heading path, character offsets into `Document.text`) and its
neighbours, so retrieval can cite it and put adjacent chunks side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Block", "BlockKind", "Chunk", "Document"]

BlockKind = Literal["heading", "paragraph", "list", "table", "code"]
"""What a block is. Tables and code blocks are never split inside a row or a line group."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Block:
    """One paragraph, heading, list, table or code block of a document, in reading order."""

    kind: BlockKind
    text: str
    """The block's text as it appears in `Document.text` (`Document.text[start:end]`)."""
    start: int
    """Offset of the block's first character in `Document.text`."""
    end: int
    """Offset just past the block's last character in `Document.text`."""
    page: int | None = None
    """1-based page number (PDF), or None where a format has no pages."""
    headings: tuple[str, ...] = ()
    """The headings above the block, outermost first (Markdown, HTML); () where none."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Document:
    """A file read by a loader."""

    source: str
    """Where it came from: the path relative to the ingested folder (posix separators), or
    the name it was given."""
    text: str
    """The whole extracted text; blocks and chunks point into it by character offsets."""
    blocks: tuple[Block, ...]
    content_hash: str
    """sha256 (hex) of the file's bytes: re-ingesting skips a file whose hash is unchanged."""
    title: str | None = None
    media_type: str = "text/plain"
    """`application/pdf`, `text/markdown`, `text/html` or `text/plain`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Chunk:
    """A piece of a document of about the chunker's target size: what is embedded and cited."""

    id: str
    """Stable for the same file at the same place: `<chunk_prefix(source, hash)>:<index>`."""
    source: str
    text: str
    index: int
    """Its place among its document's chunks, from 0."""
    start: int
    """Offset of its first character in its document's text."""
    end: int
    page: int | None = None
    """The page its text starts on (PDF), else None."""
    end_page: int | None = None
    """The page its text ends on (PDF), else None."""
    headings: tuple[str, ...] = ()
    """The heading path where it starts."""
    prev_id: str | None = None
    next_id: str | None = None
    content_hash: str = ""
    """Its document's content hash."""
    metadata: dict[str, str | int | float | bool] = field(default_factory=dict)
    """Anything else to keep with it (an escalation note's author, ...)."""
