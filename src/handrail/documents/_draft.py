"""`Draft`: a block as a format's reader finds it, before its place in the text is known."""

from __future__ import annotations

from dataclasses import dataclass

from ._types import BlockKind

__all__ = ["INSTALL", "Draft"]

INSTALL = 'reading documents needs the documents extra: pip install "handrail[documents]"'


@dataclass(frozen=True, slots=True)
class Draft:
    """A block's kind, text, page and heading path (`load_bytes` gives it its offsets)."""

    kind: BlockKind
    text: str
    page: int | None = None
    headings: tuple[str, ...] = ()
