r"""The chunker: a `Document`'s blocks grouped into `Chunk`s of about a target size.

```python
chunks = chunk(document)  # at most 222 word pieces each, 200 characters of overlap
```

Sizes are counted in the word pieces of the default embedder, all-MiniLM-L6-v2, which reads
at most `EMBEDDER_WORD_PIECES` (256, its `[CLS]` and `[SEP]` markers included) and silently
drops the rest. So no chunk may exceed `MAX_CHUNK_WORD_PIECES`: 256, less the two markers,
less `EMBEDDING_PREFIX_WORD_PIECES` (32) kept for the title and heading path that are
embedded before a chunk's text.

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
- Never over `max_tokens` (`MAX_CHUNK_WORD_PIECES` with the default counter), what the
  embedder reads: a row, line or heading longer than that is split between words, and a
  word longer than that (a base64 blob, say) inside the word.
- Every chunk of a document with a title gets it in `metadata["title"]` (a page's
  `<title>` or first heading, a PDF's title), for whoever builds the text to embed.
- A chunk that starts inside a Markdown table (a table split between rows) gets the table's
  header and delimiter rows in `metadata["table_header"]`, for whoever builds the text to
  embed; they are not in `text`, which must stay a slice of the document.
"""

from __future__ import annotations

import functools
import hashlib
import re
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Literal

from ..exceptions import ConfigError, MissingExtraError
from ._types import Block, Chunk, Document

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "DEFAULT_TARGET_TOKENS",
    "EMBEDDER_WORD_PIECES",
    "EMBEDDING_PREFIX_WORD_PIECES",
    "MAX_CHUNK_WORD_PIECES",
    "chunk",
    "chunk_prefix",
    "count_word_pieces",
]

EMBEDDER_WORD_PIECES = 256
"""The most word pieces all-MiniLM-L6-v2 (the default embedder) reads, markers included."""
EMBEDDING_PREFIX_WORD_PIECES = 32
"""Word pieces kept free in every chunk for what is embedded before its text (the page's
title and the heading path): a prefix longer than this must be shortened by its builder."""
MAX_CHUNK_WORD_PIECES = EMBEDDER_WORD_PIECES - 2 - EMBEDDING_PREFIX_WORD_PIECES
"""The most word pieces a chunk's text may have with the default counter: 222."""
DEFAULT_TARGET_TOKENS = MAX_CHUNK_WORD_PIECES
"""The chunker's (and `Library`'s) default target: as much as the embedder reads. About the
size of the 200 o200k tokens the chunker aimed at before it counted word pieces, so the
relevance calibration (`relevance_from_cosine`) still holds."""
TITLE_KEY = "title"
"""The `Chunk.metadata` key of its document's title."""
_TOKENIZER = "minilm-tokenizer.json"
_CHARS_PER_TOKEN = 4
"""About how many characters of English a token covers: bounds a sensible overlap."""

_Level = Literal["block", "line", "sentence", "word", "part"]
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
    target_tokens: int = DEFAULT_TARGET_TOKENS,
    overlap: int = 200,
    count_tokens: Callable[[str], int] | None = None,
    max_tokens: int | None = None,
) -> list[Chunk]:
    """Split a document into chunks of at most about `target_tokens` tokens.

    By default tokens are all-MiniLM-L6-v2's word pieces (`count_word_pieces`), and the
    target is `MAX_CHUNK_WORD_PIECES` (222), which no chunk exceeds.

    Args:
        document: what a loader produced.
        target_tokens: the most tokens a chunk should have (overlap included); only an
            unsplittable row, line or word makes a chunk bigger.
        overlap: at most this many characters from the end of each chunk begin the next one.
        count_tokens: counts a text's tokens; defaults to `count_word_pieces`.
        max_tokens: the most tokens any chunk may have, with no exception: a row, line or
            word longer is split. Defaults to `MAX_CHUNK_WORD_PIECES` with the default
            counter, and to no limit with another `count_tokens`.

    Returns:
        The chunks in document order, linked by `prev_id`/`next_id`; [] for an empty document.

    Raises:
        ConfigError: `target_tokens`, `overlap` or `max_tokens` is out of range (names the
            argument).
    """
    if max_tokens is None and count_tokens is None:
        max_tokens = MAX_CHUNK_WORD_PIECES
    if max_tokens is not None and max_tokens < target_tokens:
        default = " (the default counter's limit)" if count_tokens is None else ""
        raise ConfigError(
            f"chunk(target_tokens={target_tokens}, max_tokens={max_tokens}{default}): the "
            f"target must not exceed the limit; all-MiniLM-L6-v2 reads "
            f"{EMBEDDER_WORD_PIECES} word pieces, {EMBEDDING_PREFIX_WORD_PIECES} of them kept "
            f"for the title and headings. Pass target_tokens={MAX_CHUNK_WORD_PIECES} or less, "
            f"or count_tokens (and max_tokens) for another embedder."
        )
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
        count_tokens = count_word_pieces
    spans = _Packer(document, target_tokens, overlap, count_tokens, max_tokens).run()
    return _chunks(document, spans)


def count_word_pieces(text: str) -> int:
    """How many word pieces all-MiniLM-L6-v2 makes of `text`, its two markers aside.

    Raises:
        ImportError: the documents extra (the tokenizers package) is missing.
    """
    return len(_word_pieces().encode(text, add_special_tokens=False).ids)


@functools.cache
def _word_pieces() -> Tokenizer:
    try:
        import tokenizers
    except ImportError as error:
        raise MissingExtraError("chunk", needs="tokenizers", extra="documents") from error
    data = resources.files(__name__.rpartition(".")[0]).joinpath("_data", _TOKENIZER)
    tokenizer = tokenizers.Tokenizer.from_str(data.read_text("utf-8"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


class _Packer:
    """Greedy packing of atoms into spans, splitting an atom only when it must."""

    def __init__(
        self,
        document: Document,
        target: int,
        overlap: int,
        count: Callable[[str], int],
        limit: int | None,
    ) -> None:
        self.text = document.text
        self.blocks = document.blocks
        self.starts = [block.start for block in document.blocks]
        self.target = target
        self.overlap = overlap
        self.count = count
        self.limit = limit

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
            elif self.over_limit(own[0].start if own else atom.start, atom):
                if self.over_limit(atom.start, atom):  # the embedder could not read it all
                    queue.popleft()
                    queue.extendleft(reversed(self.forced(atom)))
                else:  # the headings above it go first, so that it fits alone
                    spans.append(_Span(own[0].start, own[0], own[-1]))
                    own = []
            else:  # unsplittable: it goes alone, over the target
                own.append(queue.popleft())
        if own:
            spans.append(_Span(options[0] if options else own[0].start, own[0], own[-1]))
        return spans

    def fits(self, start: int, atom: _Atom) -> bool:
        return self.count(self.text[start : atom.end]) <= self.target

    def over_limit(self, start: int, atom: _Atom) -> bool:
        return self.limit is not None and self.count(self.text[start : atom.end]) > self.limit

    def forced(self, atom: _Atom) -> list[_Atom]:
        """An atom over the limit, in pieces under it: words, then parts of a word."""
        if atom.level != "word":
            words = [
                _Atom(m.start(), m.end(), atom.block, "word")
                for m in _WORD.finditer(self.text, atom.start, atom.end)
            ]
            if len(words) > 1:
                return words
        assert self.limit is not None
        parts, start = [], atom.start
        while start < atom.end:
            low, high = start + 1, atom.end  # the longest part that fits, by bisection
            while low < high:
                middle = (low + high + 1) // 2
                if self.count(self.text[start:middle]) <= self.limit:
                    low = middle
                else:
                    high = middle - 1
            parts.append(_Atom(start, low, atom.block, "part"))
            start = low
        return parts

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
        return []  # a word, or a part of one

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
        if document.title:
            metadata[TITLE_KEY] = document.title
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
