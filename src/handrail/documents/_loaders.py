r"""Loaders: read a PDF, Markdown, HTML or plain-text file into a `Document`.

```python
document = load("policies/refunds.md")  # or load_bytes(data, source="refunds.md")
```

Every loader produces the same shape: blocks in reading order, joined by `"\n\n"` into
`Document.text`, each block's `start`/`end` pointing at its own text in it. Lines are
normalised to `"\n"`. A heading block's `headings` ends with the heading itself, so a chunk
that starts with a heading carries it in its heading path.

- **PDF** (pypdf): text is extracted page by page; lines are grouped into paragraphs where
  the vertical gap, the font size or the column changes. A paragraph's wrapped lines are
  joined with a space. A word hyphenated at a line break (`exam-` / `ple`) loses its hyphen
  only when the joined word (`example`) occurs elsewhere in the document; otherwise the lines
  are joined keeping the hyphen (`well-known`), so nothing is ever invented.
- **Markdown** (markdown-it-py, CommonMark with tables): one block per top-level element;
  a block's text is its Markdown source (pipes, fences and list markers kept).
- **HTML** (beautifulsoup4, stdlib `html.parser`): the main content only, one block per
  paragraph-like element, table (rows one per line, cells joined with `" | "`) or `<pre>`.
- **Plain text** (`.txt`, `.text`, `.rst`): paragraphs split on blank lines; markup kept.

Compatibility characters are made plain in every format, before offsets are counted: the
ligatures ﬁ ﬂ ﬀ ﬃ ﬄ are spelled out, no-break and other exotic spaces become spaces,
zero-width characters go, full-width ASCII becomes ASCII (superscripts and fractions stay).

Text is decoded as UTF-8 (a UTF-8 or UTF-16 byte-order mark is honoured; HTML may name
another charset in a `<meta>` tag). Nothing is guessed: undecodable text is an error.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import re
from pathlib import PurePath

from ..exceptions import DocumentLoadError
from ._draft import Draft, normalise
from ._html import read_html
from ._markdown import read_markdown
from ._pdf import read_pdf
from ._types import Block, Document

__all__ = ["SUPPORTED_SUFFIXES", "load", "load_bytes"]

_MEDIA_TYPES = {
    ".pdf": "application/pdf",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".html": "text/html",
    ".htm": "text/html",
    ".txt": "text/plain",
    ".text": "text/plain",
    ".rst": "text/plain",
}
SUPPORTED_SUFFIXES: frozenset[str] = frozenset(_MEDIA_TYPES)
"""The file suffixes `load` reads (lower case, with the dot)."""


def load(path: str | os.PathLike[str], *, source: str | None = None) -> Document:
    """Read a file into a `Document`, choosing the loader by its suffix.

    Args:
        path: the file to read; its suffix (one of `SUPPORTED_SUFFIXES`) picks the format.
        source: how the document names its origin; defaults to `path` as given, with `/`.

    Raises:
        DocumentLoadError: the file is missing, unsupported or unreadable (names the fix).
    """
    name = source if source is not None else PurePath(os.fspath(path)).as_posix()
    suffix = PurePath(os.fspath(path)).suffix.lower()
    if suffix not in _MEDIA_TYPES:
        raise DocumentLoadError(_unsupported(name, f"suffix {suffix or '(none)'!r}"), source=name)
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        raise DocumentLoadError(f"{name}: no such file; check the path.", source=name) from None
    except IsADirectoryError:
        raise DocumentLoadError(f"{name}: is a folder, not a file.", source=name) from None
    except OSError as exc:
        raise DocumentLoadError(
            f"{name}: cannot be read ({exc.strerror or exc}); check its permissions.", source=name
        ) from exc
    return load_bytes(data, source=name, media_type=_MEDIA_TYPES[suffix])


def load_bytes(data: bytes, *, source: str, media_type: str | None = None) -> Document:
    """Read a file's bytes into a `Document`.

    Args:
        data: the file's content.
        source: the document's name; its suffix gives the format when `media_type` is None.
        media_type: `application/pdf`, `text/markdown`, `text/html` or `text/plain`.

    Raises:
        DocumentLoadError: the format is unsupported or the bytes unreadable (names the fix).
    """
    if media_type is None:
        suffix = PurePath(source).suffix.lower()
        if suffix not in _MEDIA_TYPES:
            raise DocumentLoadError(
                _unsupported(source, f"suffix {suffix or '(none)'!r}"), source=source
            )
        media_type = _MEDIA_TYPES[suffix]
    title: str | None
    if media_type == "application/pdf":
        drafts, title = read_pdf(data, source)
    elif media_type == "text/markdown":
        drafts, title = read_markdown(_decode(data, source))
    elif media_type == "text/html":
        drafts, title = read_html(_decode(data, source, html=True))
    elif media_type == "text/plain":
        drafts, title = _plain(_decode(data, source)), None
    else:
        raise DocumentLoadError(_unsupported(source, f"media type {media_type!r}"), source=source)
    blocks: list[Block] = []
    for draft in drafts:
        text = normalise(draft.text)
        if not text.strip():
            continue
        start = blocks[-1].end + 2 if blocks else 0
        end = start + len(text)
        kind, page, headings = draft.kind, draft.page, tuple(map(normalise, draft.headings))
        blocks.append(
            Block(kind=kind, text=text, start=start, end=end, page=page, headings=headings)
        )
    return Document(
        source=source,
        text="\n\n".join(block.text for block in blocks),
        blocks=tuple(blocks),
        content_hash=hashlib.sha256(data).hexdigest(),
        title=normalise(title) if title else title,
        media_type=media_type,
    )


def _unsupported(source: str, what: str) -> str:
    supported = ", ".join(sorted(SUPPORTED_SUFFIXES))
    return f"{source}: unsupported {what}; convert it to one of {supported}, or skip it."


def _decode(data: bytes, source: str, *, html: bool = False) -> str:
    encoding = "utf-8"
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        encoding = "utf-16"
    elif html and (
        declared := re.search(rb"<meta[^>]*charset=[\"']?([\w.:-]+)", data[:4096], re.I)
    ):
        encoding = declared.group(1).decode("ascii")
    try:
        text = data.decode(encoding)
    except LookupError:
        raise DocumentLoadError(
            f"{source}: declares an unknown charset {encoding!r}; re-save it as UTF-8.",
            source=source,
        ) from None
    except UnicodeDecodeError as exc:
        raise DocumentLoadError(
            f"{source}: is not valid {encoding} (byte 0x{exc.object[exc.start]:02x} at offset "
            f"{exc.start}); re-save it as UTF-8 (e.g. iconv -f windows-1252 -t utf-8) and load "
            f"it again.",
            source=source,
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _plain(text: str) -> list[Draft]:
    return [Draft("paragraph", part.strip()) for part in re.split(r"\n[ \t]*\n", text)]
