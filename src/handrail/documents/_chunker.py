r"""The chunker: a `Document`'s blocks grouped into `Chunk`s of about a target size.

```python
chunks = chunk(document)  # about 200 tokens each, 200 characters of overlap
```

A chunk's text is always one contiguous slice of `Document.text`
(`document.text[c.start:c.end] == c.text`), so a citation can be found in its document.

How blocks become chunks:

- A chunk is a run of whole blocks (with the `"\n\n"` between them) while it fits the
  target. A block bigger than the target alone is split: prose at sentence ends, then between
  words; a list between lines, then as prose; a table between rows and a code block between
  lines, never inside one.
- A chunk keeps to one page (PDF): a page break ends it, and the next one starts without
  overlap, so a citation of a chunk names the page its text is on.
- A heading is never the last thing in a chunk when more follows: it moves to the next chunk,
  with the text it heads. When a heading and the first piece of what follows cannot fit
  together, that piece is split finer.
- Each chunk after the first starts with up to `overlap` characters from the end of the one
  before: whole words, and whole rows or lines where that tail is a table or code. The
  overlap shrinks, down to none, when it would push the chunk's own first block over the
  target.
- Over the target only where nothing can be split: a single table row, code line or word
  longer than the target, alone (or after the headings above it). A heading longer than the
  target is the one case where a chunk ends with a heading.
- A chunk that starts inside a Markdown table (a table split between rows) gets the table's
  header and delimiter rows in `metadata["table_header"]`, for whoever builds the text to
  embed; they are not in `text`, which must stay a slice of the document.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..exceptions import ConfigError
from ._types import Block, Chunk, Document

__all__ = ["chunk", "chunk_prefix"]

_DEFAULT_TOKENIZER = "openai:gpt-4o"
"""Counted with tiktoken's o200k_base, through `handrail.tokens.count_text`."""
_CHARS_PER_TOKEN = 4
"""About how many characters of English a token covers: bounds a sensible overlap."""

_Level = Literal["block", "line", "sentence", "word"]
_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*(\s+)")
_WORD = re.compile(r"\S+")
_DELIMITER_ROW = re.compile(r"\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*")


@dataclass(frozen=True, slots=True)
class _Atom:
    """A piece of one block that is never split at its level: `text[start:end]`."""

    start: int
    end: int
    block: int
    level: _Level


@dataclass(frozen=True, slots=True)
class _Span:
    start: int
    first: _Atom
    last: _Atom


def chunk_prefix(source: str, content_hash: str) -> str:
    """The first part of a chunk's id: the same for the same file at the same place.

    Two copies of a file at two paths get different ids (their chunks are two sources'),
    and a file whose content changed gets new ones.
    """
    return hashlib.sha256(f"{source}\0{content_hash}".encode()).hexdigest()[:16]


def chunk(
    document: Document,
    *,
    target_tokens: int = 200,
    overlap: int = 200,
    count_tokens: Callable[[str], int] | None = None,
) -> list[Chunk]:
    """Split a document into chunks of at most about `target_tokens` tokens.

    The default target is 200 tokens because the default embedder, all-MiniLM-L6-v2, reads
    at most 256 word pieces and silently drops the rest: 200 tokens of the default tokenizer
    leave room for its word pieces, which run a little longer than BPE tokens.

    Args:
        document: what a loader produced.
        target_tokens: the most tokens a chunk should have (overlap included); only an
            unsplittable row, line or word makes a chunk bigger.
        overlap: at most this many characters from the end of each chunk begin the next one.
        count_tokens: counts a text's tokens; defaults to the o200k_base tokenizer
            (`handrail.tokens.count_text(text, "openai:gpt-4o")`).

    Returns:
        The chunks in document order, linked by `prev_id`/`next_id`; [] for an empty document.

    Raises:
        ConfigError: `target_tokens` or `overlap` is out of range (names the argument).
    """
    if target_tokens < 1:
        raise ConfigError(f"chunk(target_tokens={target_tokens}): it must be at least 1.")
    if overlap < 0:
        raise ConfigError(f"chunk(overlap={overlap}): it must be 0 (none) or more characters.")
    if overlap >= target_tokens * _CHARS_PER_TOKEN:
        raise ConfigError(
            f"chunk(overlap={overlap}): that many characters fill a whole chunk of "
            f"target_tokens={target_tokens} (about {_CHARS_PER_TOKEN} characters a token), so "
            f"every chunk would repeat the one before. Use an overlap well under "
            f"{target_tokens * _CHARS_PER_TOKEN}, or a bigger target_tokens."
        )
    if count_tokens is None:
        count_tokens = _default_counter()
    spans = _Packer(document, target_tokens, overlap, count_tokens).run()
    return _chunks(document, spans)


def _default_counter() -> Callable[[str], int]:
    from ..tokens import count_text

    def count(text: str) -> int:
        return count_text(text, _DEFAULT_TOKENIZER)

    return count


class _Packer:
    """Greedy packing of atoms into spans, splitting an atom only when it must."""

    def __init__(
        self, document: Document, target: int, overlap: int, count: Callable[[str], int]
    ) -> None:
        self.text = document.text
        self.blocks = document.blocks
        self.starts = [block.start for block in document.blocks]
        self.target = target
        self.overlap = overlap
        self.count = count

    def run(self) -> list[_Span]:
        queue = deque(
            _Atom(block.start, block.end, i, "block")
            for i, block in enumerate(self.blocks)
            if block.text.strip()
        )
        spans: list[_Span] = []
        own: list[_Atom] = []  # the chunk's atoms so far
        options: list[int] = []  # where its overlap may start, longest overlap first
        while queue:
            atom = queue[0]
            start = options[0] if options else (own[0].start if own else atom.start)
            if own and self.page(atom) != self.page(own[0]):
                # A chunk keeps to one page, so that a citation of it names the right page;
                # nor does its overlap reach back into the page before.
                spans.append(self.close(own, queue, start))
                options, own = [], []
            elif self.fits(start, atom):
                own.append(queue.popleft())
            elif own and not all(self.heading(a) for a in own):
                spans.append(self.close(own, queue, options[0] if options else own[0].start))
                options = self.overlap_starts(spans[-1])
                own = []
            elif options and self.fits(own[0].start if own else atom.start, atom):
                options.pop(0)  # what fits whole stays whole: the overlap gives way
            elif finer := self.split(atom):
                queue.popleft()
                queue.extendleft(reversed(finer))
            elif options:
                options.pop(0)
            elif own and self.heading(atom):  # a heading longer than the target
                spans.append(self.close(own, queue, own[0].start))
                options = self.overlap_starts(spans[-1])
                own = []
            else:  # unsplittable: it goes alone, over the target
                own.append(queue.popleft())
        if own:
            spans.append(_Span(options[0] if options else own[0].start, own[0], own[-1]))
        return spans

    def fits(self, start: int, atom: _Atom) -> bool:
        return self.count(self.text[start : atom.end]) <= self.target

    def page(self, atom: _Atom) -> int | None:
        return self.blocks[atom.block].page

    def heading(self, atom: _Atom) -> bool:
        return self.blocks[atom.block].kind == "heading"

    def close(self, own: list[_Atom], queue: deque[_Atom], start: int) -> _Span:
        """The span of `own`, its trailing headings handed back to go with what they head."""
        keep = len(own)
        while keep > 0 and self.heading(own[keep - 1]):
            keep -= 1
        if keep == 0:
            keep = len(own)
        queue.extendleft(reversed(own[keep:]))
        return _Span(start, own[0], own[keep - 1])

    def overlap_starts(self, span: _Span) -> list[int]:
        """Where the next chunk may start inside `span`'s tail, earliest first."""
        text, end = self.text, span.last.end
        found = []
        for position in range(max(span.start + 1, end - self.overlap), end):
            block = self.blocks[bisect_right(self.starts, position) - 1]
            if not block.start <= position < block.end:
                continue  # between blocks
            if block.kind in ("table", "code"):
                line_start = position == block.start or text[position - 1] == "\n"
                line_end = text.find("\n", position, block.end)
                line = text[position : block.end if line_end < 0 else line_end]
                if line_start and line.strip():
                    found.append(position)
            elif text[position - 1].isspace() and not text[position].isspace():
                found.append(position)
        return found

    def split(self, atom: _Atom) -> list[_Atom]:
        """The atom's pieces one level finer, or [] when it cannot be split."""
        kind = self.blocks[atom.block].kind
        if atom.level == "block" and kind in ("table", "code", "list"):
            return self.pieces(atom, "line")
        if atom.level in ("block", "line") and kind not in ("table", "code"):
            return self.pieces(atom, "sentence")
        if atom.level == "sentence":
            return self.pieces(atom, "word")
        return []

    def pieces(self, atom: _Atom, level: _Level) -> list[_Atom]:
        text, found = self.text, []
        if level == "word":
            bounds = [(m.start(), m.end()) for m in _WORD.finditer(text, atom.start, atom.end)]
        else:
            pattern = re.compile(r"\n") if level == "line" else _SENTENCE_END
            bounds, position = [], atom.start
            for match in pattern.finditer(text, atom.start, atom.end):
                cut = match.start(match.lastindex or 0)
                bounds.append((position, cut))
                position = match.end()
            bounds.append((position, atom.end))
        for start, end in bounds:
            piece = text[start:end]
            if not piece.strip():
                continue
            if level != "line":  # a line keeps its indentation, so no cut falls inside it
                start += len(piece) - len(piece.lstrip())
            end = start + len(text[start:end].rstrip()) if level != "line" else end
            found.append(_Atom(start, end, atom.block, level))
        if len(found) == 1:  # nothing to cut at this level: try the next one
            return self.split(found[0])
        return found


def _chunks(document: Document, spans: list[_Span]) -> list[Chunk]:
    starts = [block.start for block in document.blocks]

    def block_at(position: int) -> Block:
        return document.blocks[bisect_right(starts, position) - 1]

    prefix = chunk_prefix(document.source, document.content_hash)
    ids = [f"{prefix}:{index}" for index in range(len(spans))]
    chunks = []
    for index, span in enumerate(spans):
        first = document.blocks[span.first.block]
        metadata: dict[str, str | int | float | bool] = {}
        if first.kind == "table" and span.first.start > first.start:
            header = _table_header(first)
            if header:
                metadata["table_header"] = header
        chunks.append(
            Chunk(
                id=ids[index],
                source=document.source,
                text=document.text[span.start : span.last.end],
                index=index,
                start=span.start,
                end=span.last.end,
                page=block_at(span.start).page,
                end_page=block_at(span.last.end - 1).page,
                headings=first.headings,
                prev_id=ids[index - 1] if index else None,
                next_id=ids[index + 1] if index + 1 < len(ids) else None,
                content_hash=document.content_hash,
                metadata=metadata,
            )
        )
    return chunks


def _table_header(table: Block) -> str | None:
    """A Markdown table's header and delimiter rows, or None for a table without them."""
    lines = table.text.split("\n")
    if len(lines) > 2 and _DELIMITER_ROW.fullmatch(lines[1]) and "-" in lines[1]:
        return "\n".join(lines[:2])
    return None
