"""Markdown: one block per top-level element, with its heading path (markdown-it-py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._draft import INSTALL, Draft
from ._types import BlockKind

__all__ = ["read_markdown"]

if TYPE_CHECKING:
    from markdown_it.token import Token

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
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    path: list[tuple[int, str]] = []
    drafts: list[Draft] = []
    title: str | None = None
    for i, token in enumerate(tokens):
        kind = _MARKDOWN_KINDS.get(token.type)
        if kind is None or token.level != 0 or token.map is None:
            continue
        first, last = token.map
        block = "\n".join(lines[first:last]).rstrip()
        if kind == "heading":
            level, name = int(token.tag[1:]), _inline_text(tokens[i + 1])
            if name:
                while path and path[-1][0] >= level:
                    path.pop()
                path.append((level, name))
                title = name if title is None and level == 1 else title
        drafts.append(Draft(kind, block, headings=tuple(name for _, name in path)))
    return drafts, title


def _inline_text(inline: Token) -> str:
    parts: list[str] = []
    for child in inline.children or []:
        if child.type in ("text", "code_inline", "image"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
    return " ".join("".join(parts).split())
