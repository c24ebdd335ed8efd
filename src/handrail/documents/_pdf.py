"""PDF: pages into paragraphs, with their page numbers (pypdf).

Running headers and footers are not content: a line at the top or bottom of most pages
(a page number at its start or end aside, so "Refund policy    3/12" is the same line on
every page, and "Handbook iv" in the front matter too), and a page counter ("3", "3/12",
"Page 3 of 12", "- 3 -") at the top or bottom of a page, are dropped. Compatibility
characters are normalised first (`_draft.normalise`, as in every format), so the ligature
in a browser-printed "ﬁle:///" reads "file:///".
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import median
from typing import TYPE_CHECKING, Any

from ..exceptions import DocumentLoadError
from ._draft import INSTALL, Draft, normalise

__all__ = ["read_pdf"]

_EDGE_LINES = 2
"""How many lines at the top and at the bottom of a page may be a running header or footer."""
_NUMBER = r"(?:page\s*)?(?:\d{1,5}|[ivxlc]{1,7})(?:\s*(?:/|of|von|de|sur)\s*\d{1,5})?"
"""A page number: "3", "3/12", "Page 3 of 12", "iv" (front matter)."""
_PAGE_COUNTER = re.compile(rf"[-\u2013\u2014(\[]?\s*{_NUMBER}\s*[-\u2013\u2014)\]]?", re.IGNORECASE)
_COUNTER_AT_ENDS = re.compile(rf"^{_NUMBER}\b|\b{_NUMBER}$", re.IGNORECASE)

if TYPE_CHECKING:
    from pypdf import PageObject


@dataclass(slots=True)
class _Line:
    text: str = ""
    y: float = 0.0
    size: float = 0.0


class _LineCollector:
    """A pypdf text visitor: the page's lines with their baseline and font size."""

    def __init__(self) -> None:
        self.lines: list[_Line] = []
        self.current = _Line()
        self.placed = False

    def __call__(self, text: str, cm: Any, tm: Any, font: Any, font_size: Any) -> None:
        for i, part in enumerate(text.split("\n")):
            if i:
                self.end_line()
            if part.strip() and not self.placed:
                # the text matrix times the current transformation matrix, as pypdf does
                self.current.y = tm[4] * cm[1] + tm[5] * cm[3] + cm[5]
                scale = abs(tm[2] * cm[1] + tm[3] * cm[3]) or 1.0
                self.current.size = float(font_size or 0) * scale
                self.placed = True
            self.current.text += part

    def end_line(self) -> None:
        self.current.text = " ".join(normalise(self.current.text.replace("\x00", "")).split())
        self.lines.append(self.current)
        self.current, self.placed = _Line(), False


def read_pdf(data: bytes, source: str) -> tuple[list[Draft], str | None]:
    try:
        from pypdf import PasswordType, PdfReader
        from pypdf.errors import DependencyError
    except ImportError as exc:
        raise ImportError(INSTALL) from exc
    pages: list[list[list[str]]] = []  # a page's paragraphs, a paragraph's lines
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")  # many PDFs only restrict printing or copying
            except DependencyError as exc:
                raise DocumentLoadError(
                    f"{source}: is encrypted with AES, which needs the cryptography package: "
                    f"pip install cryptography.",
                    source=source,
                ) from exc
            if opened == PasswordType.NOT_DECRYPTED:
                raise DocumentLoadError(
                    f"{source}: is encrypted with a password; save a decrypted copy (e.g. "
                    f"qpdf --decrypt --password=PASSWORD in.pdf out.pdf) and load that.",
                    source=source,
                )
        for page in reader.pages:
            pages.append(_pdf_paragraphs(page))
    except DocumentLoadError:
        raise
    except Exception as exc:  # pypdf raises many kinds on a damaged file; none may escape raw
        where = f" at page {len(pages) + 1}" if pages else ""
        raise DocumentLoadError(
            f"{source}: is not a readable PDF ({type(exc).__name__}{where}: {exc}); check that "
            f"the file is complete (download or export it again).",
            source=source,
        ) from exc
    pages = _without_running_lines(pages)
    vocabulary = {
        word.lower()
        for paragraphs in pages
        for lines in paragraphs
        for line in lines
        for word in re.findall(r"[^\W\d_]+", line)
    }
    drafts = [
        Draft("paragraph", _join_lines(lines, vocabulary), page=number)
        for number, paragraphs in enumerate(pages, start=1)
        for lines in paragraphs
    ]
    if not any(draft.text.strip() for draft in drafts):
        raise DocumentLoadError(
            f"{source}: has no extractable text; it may be a scanned image. Run OCR on it "
            f"(e.g. ocrmypdf in.pdf out.pdf) and load the result.",
            source=source,
        )
    try:
        title = reader.metadata.title if reader.metadata else None
    except Exception:  # a damaged info dictionary costs the title, not the document
        title = None
    return drafts, (title.strip() or None) if isinstance(title, str) else None


def _without_running_lines(pages: list[list[list[str]]]) -> list[list[list[str]]]:
    """The pages without their running headers, footers and page counters."""

    def edges(paragraphs: list[list[str]]) -> list[tuple[str, int, int]]:
        # Each line near the top or the bottom, with its edge: a header runs at the top of
        # pages, a footer at the bottom; a line at the top of one and the bottom of another is
        # content (a sentence's last words wrapped onto a line of their own, say).
        places = [(p, i) for p, lines in enumerate(paragraphs) for i in range(len(lines))]
        return [("top", p, i) for p, i in places[:_EDGE_LINES]] + [
            ("bottom", p, i) for p, i in places[-_EDGE_LINES:]
        ]

    def key(line: str) -> str:  # the line less a page number at either end
        return _COUNTER_AT_ENDS.sub("#", line.casefold())

    seen: dict[tuple[str, str], int] = {}
    for paragraphs in pages:
        if sum(map(len, paragraphs)) < 2:
            continue  # a page of one line says nothing of what runs around its text
        for place in {(edge, key(paragraphs[p][i])) for edge, p, i in edges(paragraphs)}:
            seen[place] = seen.get(place, 0) + 1
    # on most pages, and on two at least: a line that opens two pages of ten is content
    repeated = {place for place, count in seen.items() if count >= max(2, len(pages) / 2)}
    cleaned = []
    for paragraphs in pages:
        drop = {
            (p, i)
            for edge, p, i in edges(paragraphs)
            if (edge, key(paragraphs[p][i])) in repeated
            or _PAGE_COUNTER.fullmatch(paragraphs[p][i])
        }
        kept = [
            [line for i, line in enumerate(lines) if (p, i) not in drop]
            for p, lines in enumerate(paragraphs)
        ]
        cleaned.append([lines for lines in kept if lines])
    # Pages that are all the same line (a slide deck's "Thank you"?) keep it: better a
    # repeated line than a document with no text at all.
    return cleaned if any(cleaned) else pages


def _pdf_paragraphs(page: PageObject) -> list[list[str]]:
    collector = _LineCollector()
    page.extract_text(visitor_text=collector)
    collector.end_line()
    lines = collector.lines
    placed = [line for line in lines if line.text]
    gaps = [a.y - b.y for a, b in pairwise(placed) if a.y - b.y > 0.5]
    typical = median(gaps) if gaps else 0.0
    paragraphs: list[list[str]] = [[]]
    previous: _Line | None = None
    for line in lines:
        if not line.text:
            paragraphs.append([])
            previous = None
            continue
        if previous is not None:
            gap = previous.y - line.y
            size = max(previous.size, line.size)
            if (
                gap < -0.5  # moved up: a new column or a new frame
                or (typical and gap > typical * 1.3 + 0.5)
                or (size and gap > size * 2.0)
                or (size and abs(previous.size - line.size) > 0.15 * size)
            ):
                paragraphs.append([])
        paragraphs[-1].append(line.text)
        previous = line
    return [lines for lines in paragraphs if lines]


def _join_lines(lines: Sequence[str], vocabulary: set[str]) -> str:
    text = lines[0]
    for line in lines[1:]:
        before = re.search(r"([^\W\d_]+)-$", text)
        after = re.match(r"[^\W\d_]+", line)
        if text.endswith("\u00ad"):  # a soft hyphen marks a hyphenation point by definition
            text = text[:-1] + line
        elif before and after:
            joined = (before.group(1) + after.group(0)).lower()
            text = (text[:-1] if joined in vocabulary else text) + line
        else:
            text += " " + line
    return text
