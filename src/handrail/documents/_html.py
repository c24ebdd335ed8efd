"""HTML: the main content only, one block per paragraph-like element (beautifulsoup4).

Navigation is not content: the page furniture of the common documentation generators is
dropped before anything is read (see `_navigation`), so a page's first block is its first
heading or paragraph, not "Prev | Up | Home | Next".
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ._draft import INSTALL, Draft
from ._types import BlockKind

__all__ = ["read_html"]

if TYPE_CHECKING:
    from bs4 import Tag

_DROPPED = {"script", "style", "nav", "header", "footer", "aside", "noscript", "template", "form"}
_DROPPED |= {"svg", "head", "title"}
# Page furniture by class or id, from the generators that make most manuals: DocBook XSL
# (navheader, navfooter, toc), gtk-doc (navigation), Sphinx (related, sphinxsidebar, footer,
# headerlink), asciidoc (footer, toc), Doxygen (navpath, nav-path, side-nav, tabs, navrow,
# MSearchBox, titlearea), texinfo (nav-panel), and generic breadcrumbs and skip links.
_NAVIGATION_NAMES = {"navheader", "navfooter", "navigation", "toc", "related", "sphinxsidebar"}
_NAVIGATION_NAMES |= {"footer", "headerlink", "footer-text", "navpath", "nav-path", "side-nav"}
_NAVIGATION_NAMES |= {"tabs", "tabs2", "tabs3", "navrow", "navrow1", "navrow2", "msearchbox"}
_NAVIGATION_NAMES |= {"msearchselectwindow", "msearchresultswindow", "titlearea", "nav-panel"}
_NAVIGATION_NAMES |= {"breadcrumb", "breadcrumbs", "skip-link", "skiplink", "skip-links"}
_NAVIGATION_NAMES |= {"skip-to-content", "mobile-nav", "navbar", "topnav", "menu-wrapper"}
_NAVIGATION_NAMES |= {"sidebarbutton", "searchbox", "this-page-menu", "header-nav", "nav"}
_NAVIGATION_ROLES = {"navigation", "search", "banner", "contentinfo", "doc-toc"}
_NAVIGATION_RELS = {"prev", "previous", "next", "up", "home", "start", "contents", "index"}
_NAVIGATION_KEYS = {"p", "n", "u", "h"}  # DocBook's accesskeys for prev, next, up, home
_NAVIGATION_WORDS = re.compile(
    r"(?:\s|[|\[\]()<>«»←→↑↓⇐⇒·•:,;/-]|&(?:gt|lt);|"
    r"\b(?:prev(?:ious)?|next|up|home|top|contents|table of contents|index|toc|"
    r"go to|skip to (?:the )?(?:main )?content|back to top|page|navigation)\b)*",
    re.IGNORECASE,
)
"""Text that says nothing but where to go: a block of only these is navigation."""
_PERMALINK_MARKS = {"¶", "#", "§", "🔗", "link"}
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
    root = (
        soup.find("main")
        or soup.find(True, attrs={"role": "main"})
        or soup.find("article")
        or soup.find("body")
        or soup
    )
    walker.walk(root, "paragraph")
    title = " ".join(soup.title.get_text().split()) if soup.title else ""
    if walker.first_h1 and title.startswith(walker.first_h1):
        title = walker.first_h1  # "json — JSON encoder — Python 3.11 docs": the site aside
    return walker.drafts, title or walker.first_h1


class _HtmlWalker:
    """Turns the visible block elements under a root into drafts, in document order."""

    def __init__(self) -> None:
        self.drafts: list[Draft] = []
        self.path: list[tuple[int, str]] = []
        self.first_h1: str | None = None

    def emit(self, kind: BlockKind, text: str) -> None:
        if text.strip() and (kind == "code" or not _NAVIGATION_WORDS.fullmatch(text)):
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
            if any(cells) and not _NAVIGATION_WORDS.fullmatch(" ".join(cells)):
                rows.append(" | ".join(cells))
        self.emit("table", "\n".join(rows))


def _hidden(tag: Tag) -> bool:
    return (
        tag.name in _DROPPED
        or tag.has_attr("hidden")
        or str(tag.get("aria-hidden", "")).lower() == "true"
        or _navigation(tag)
    )


def _navigation(tag: Tag) -> bool:
    """Whether `tag` is page furniture: links to elsewhere, not content.

    By its role (`navigation`, `search`, `banner`, `contentinfo`), its class or id (the
    generators' names in `_NAVIGATION_NAMES`), a permalink mark (`¶` after a heading), a skip
    link, or a table of only links to the previous, next, upper and home pages (DocBook's,
    gtk-doc's).
    """
    names = {
        str(tag.get("id", "")).lower(),
        *(str(c).lower() for c in tag.get_attribute_list("class")),
    }
    if names & _NAVIGATION_NAMES or str(tag.get("role", "")).lower() in _NAVIGATION_ROLES:
        return True
    if tag.name == "a":
        href = str(tag.get("href", ""))
        text = tag.get_text().strip()
        if href.startswith("#") and (
            text in _PERMALINK_MARKS or text.lower().startswith("skip to")
        ):
            return True
    if tag.name == "table":
        summary = str(tag.get("summary", "")).lower()
        if summary.startswith("navigation"):
            return True
        links = tag.find_all("a")
        return bool(links) and all(_navigation_link(a) for a in links)
    if tag.name in _LINK_BARS:
        return _link_bar(tag)
    return False


_LINK_BARS = {"p", "div", "span", "ul", "ol"}
"""Where a bare bar of links may stand ("Next: Intro, Previous: Top, Up: Top [Contents]")."""


def _link_bar(tag: Tag) -> bool:
    """Whether `tag` is a bar of navigation links (texinfo's header line, say).

    Its links are all navigation links (by `rel`, or DocBook's `accesskey`), with nothing
    around them but words like "Next:" and separators.
    """
    from bs4.element import NavigableString, Tag

    found, outside = False, []
    for node in tag.descendants:
        if isinstance(node, Tag) and node.name == "a":
            if not _navigation_link(node):
                return False
            found = True
        elif type(node) is NavigableString and node.parent and node.parent.name != "a":
            outside.append(str(node))
            if sum(map(len, outside)) > 200:
                return False
    return found and _NAVIGATION_WORDS.fullmatch("".join(outside)) is not None


def _navigation_link(a: Tag) -> bool:
    rels = {str(r).lower() for r in a.get_attribute_list("rel") if r}
    return bool(rels & _NAVIGATION_RELS) or str(a.get("accesskey", "")).lower() in _NAVIGATION_KEYS


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
