"""Markdown: one block per top-level element, with its heading path (markdown-it-py).

A block's text is its Markdown source, except links: a link keeps its text only
(`[refunds](refunds.html "Refunds")` reads `refunds`), an image its alt text, a reference
link (`[text][label]`, `[text][]`, `[label]`) its text when the label is defined, and an
autolink (`<https://example.com>`) its address. Code (fenced, indented, or `inline`) is
left exactly as written.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ._draft import INSTALL, Draft
from ._types import BlockKind

__all__ = ["read_markdown"]

if TYPE_CHECKING:
    from markdown_it.token import Token

_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_DESTINATION = r"(?:<[^<>\n]*>|[^\s()<>]*(?:\([^\s()]*\)[^\s()<>]*)*)"
_LINK_TITLE = r"""(?:\s+(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\((?:[^()\\]|\\.)*\)))?"""
_LABEL = r"((?:[^\[\]\\]|\\.|\[(?:[^\[\]\\]|\\.)*\])*)"
_INLINE_LINK = re.compile(rf"(?<!\\)(!?)\[{_LABEL}\]\(\s*{_DESTINATION}{_LINK_TITLE}\s*\)")
_REFERENCE_LINK = re.compile(rf"(?<!\\)(!?)\[{_LABEL}\](?:\[((?:[^\[\]\\]|\\.)*)\])?")
_AUTOLINK = re.compile(
    r"<((?:[a-zA-Z][a-zA-Z0-9+.-]{1,31}:[^\s<>]*)|(?:[\w.!#$%&'*+/=?^`{|}~-]+@[\w-]+(?:\.[\w-]+)*))>"
)

_MARKDOWN_KINDS: dict[str, BlockKind] = {
    "heading_open": "heading",
    "paragraph_open": "paragraph",
    "blockquote_open": "paragraph",
    "html_block": "paragraph",
    "bullet_list_open": "list",
    "ordered_list_open": "list",
    "table_open": "table",
    "fence": "code",
    "code_block": "code",
}


def read_markdown(text: str) -> tuple[list[Draft], str | None]:
    try:
        from markdown_it import MarkdownIt
    except ImportError as exc:
        raise ImportError(INSTALL) from exc
    lines = text.split("\n")
    if lines[0] == "---" and "---" in lines[1:]:  # YAML front matter, not a heading
        end = lines.index("---", 1) + 1
        lines[:end] = [""] * end
        text = "\n".join(lines)
    env: dict[str, Any] = {}
    tokens = MarkdownIt("commonmark").enable("table").parse(text, env)
    references = {label.casefold() for label in env.get("references", {})}
    path: list[tuple[int, str]] = []
    drafts: list[Draft] = []
    title: str | None = None
    for i, token in enumerate(tokens):
        kind = _MARKDOWN_KINDS.get(token.type)
        if kind is None or token.level != 0 or token.map is None:
            continue
        first, last = token.map
        block = "\n".join(lines[first:last]).rstrip()
        if kind != "code":
            block = _without_links(block, references)
        if kind == "heading":
            level, name = int(token.tag[1:]), _inline_text(tokens[i + 1])
            if name:
                while path and path[-1][0] >= level:
                    path.pop()
                path.append((level, name))
                title = name if title is None and level == 1 else title
        drafts.append(Draft(kind, block, headings=tuple(name for _, name in path)))
    return drafts, title


def _without_links(block: str, references: set[str]) -> str:
    """`block` with each link replaced by its text, outside code spans."""
    parts, at = [], 0
    for span in _CODE_SPAN.finditer(block):
        parts.append(_unlink(block[at : span.start()], references))
        parts.append(span.group(0))
        at = span.end()
    parts.append(_unlink(block[at:], references))
    return "".join(parts)


def _unlink(text: str, references: set[str]) -> str:
    def inline(match: re.Match[str]) -> str:
        return match.group(2)

    def reference(match: re.Match[str]) -> str:
        label = match.group(3) or match.group(2)
        if _normalise_label(label) not in references:
            return match.group(0)
        return match.group(2)

    # Images first, innermost first: `[![alt](a.png)](page.html)` is a link around an image.
    for _ in range(3):
        unlinked = _INLINE_LINK.sub(inline, text)
        unlinked = _REFERENCE_LINK.sub(reference, unlinked)
        if unlinked == text:
            break
        text = unlinked
    return _AUTOLINK.sub(lambda match: match.group(1), text)


def _normalise_label(label: str) -> str:
    """A reference label as markdown-it keys it: whitespace collapsed, case folded."""
    return " ".join(label.split()).casefold()


def _inline_text(inline: Token) -> str:
    parts: list[str] = []
    for child in inline.children or []:
        if child.type in ("text", "code_inline", "image"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
    return " ".join("".join(parts).split())
