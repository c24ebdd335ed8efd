"""HTML: the main content only, one block per paragraph-like element (beautifulsoup4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._draft import INSTALL, Draft
from ._types import BlockKind

__all__ = ["read_html"]

if TYPE_CHECKING:
    from bs4 import Tag

_DROPPED = {"script", "style", "nav", "header", "footer", "aside", "noscript", "template", "form"}
_DROPPED |= {"svg", "head", "title"}
_HEADING_LEVELS = {f"h{level}": level for level in range(1, 7)}
_PARAGRAPHS = {"p", "li", "blockquote", "dd", "dt", "figcaption"}
_BLOCK_LEVEL = {"pre", "table", "ul", "ol", "dl", "div", "section", "article", "main", "figure"}
_BLOCK_LEVEL |= {"details", "summary", "address", "hr", "body", "fieldset", "center", "caption"}
_BLOCK_LEVEL |= _PARAGRAPHS | set(_HEADING_LEVELS)


def read_html(text: str) -> tuple[list[Draft], str | None]:
    try:
        from bs4 import BeautifulSoup
    except ImportError as exc:
        raise ImportError(INSTALL) from exc
    soup = BeautifulSoup(text, "html.parser")
    walker = _HtmlWalker()
    root = soup.find("main") or soup.find("article") or soup.find("body") or soup
    walker.walk(root, "paragraph")
    title = " ".join(soup.title.get_text().split()) if soup.title else ""
    return walker.drafts, title or walker.first_h1


class _HtmlWalker:
    """Turns the visible block elements under a root into drafts, in document order."""

    def __init__(self) -> None:
        self.drafts: list[Draft] = []
        self.path: list[tuple[int, str]] = []
        self.first_h1: str | None = None

    def emit(self, kind: BlockKind, text: str) -> None:
        if text.strip():
            self.drafts.append(Draft(kind, text, headings=tuple(n for _, n in self.path)))

    def walk(self, node: Tag, kind: BlockKind) -> None:
        from bs4.element import NavigableString, Tag

        run: list[str] = []  # loose inline content between block elements

        def flush() -> None:
            self.emit(kind, " ".join("".join(run).split()))
            run.clear()

        for child in node.children:
            if type(child) is NavigableString:
                run.append(str(child))
            if not isinstance(child, Tag) or _hidden(child):
                continue
            name = child.name
            if name in _HEADING_LEVELS:
                flush()
                self.heading(_HEADING_LEVELS[name], _visible_text(child))
            elif name == "pre" or (name == "code" and "\n" in child.get_text().strip()):
                flush()
                self.emit("code", child.get_text().strip("\n").rstrip())
            elif name == "table":
                flush()
                self.table(child)
            elif name in _BLOCK_LEVEL or _has_block(child):
                flush()
                if name in _PARAGRAPHS and not _has_block(child):
                    self.emit("list" if name == "li" else "paragraph", _visible_text(child))
                else:
                    self.walk(child, "list" if name == "li" else "paragraph")
            else:
                run.append(" " if name == "br" else _visible_text(child, collapse=False))
        flush()

    def heading(self, level: int, name: str) -> None:
        if not name:
            return
        while self.path and self.path[-1][0] >= level:
            self.path.pop()
        self.path.append((level, name))
        if level == 1 and self.first_h1 is None:
            self.first_h1 = name
        self.emit("heading", name)

    def table(self, table: Tag) -> None:
        if table.caption is not None:
            self.emit("paragraph", _visible_text(table.caption))
        rows = []
        for row in table.find_all("tr"):
            if row.find_parent("table") is not table or _hidden(row):
                continue
            cells = [_visible_text(cell) for cell in row.find_all(["td", "th"], recursive=False)]
            if any(cells):
                rows.append(" | ".join(cells))
        self.emit("table", "\n".join(rows))


def _hidden(tag: Tag) -> bool:
    return (
        tag.name in _DROPPED
        or tag.has_attr("hidden")
        or str(tag.get("aria-hidden", "")).lower() == "true"
    )


def _has_block(tag: Tag) -> bool:
    return tag.find(_BLOCK_LEVEL) is not None


def _visible_text(tag: Tag, *, collapse: bool = True) -> str:
    from bs4.element import NavigableString, Tag

    parts: list[str] = []
    for child in tag.children:
        if type(child) is NavigableString:
            parts.append(str(child))
        elif isinstance(child, Tag) and not _hidden(child):
            parts.append(" " if child.name == "br" else _visible_text(child, collapse=False))
    text = "".join(parts)
    return " ".join(text.split()) if collapse else text
