"""`Draft`: a block as a format's reader finds it, before its place in the text is known."""

from __future__ import annotations

from dataclasses import dataclass

from ._types import BlockKind

__all__ = ["INSTALL", "Draft", "normalise"]

_COMPATIBLE = str.maketrans(
    {
        "\ufb00": "ff",
        "\ufb01": "fi",
        "\ufb02": "fl",
        "\ufb03": "ffi",
        "\ufb04": "ffl",
        "\ufb05": "st",
        "\ufb06": "st",
        "\u00a0": " ",
        "\u2007": " ",
        "\u202f": " ",
        "\u2060": "",
        "\ufeff": "",
        "\u200b": "",
        **{chr(code): " " for code in range(0x2000, 0x200B)},
        **{chr(code): chr(code - 0xFEE0) for code in range(0xFF01, 0xFF5F)},  # full width
    }
)
"""Compatibility characters and their plain spelling (see `normalise`)."""

INSTALL = 'reading documents needs the documents extra: pip install "handrail[documents]"'


@dataclass(frozen=True, slots=True)
class Draft:
    """A block's kind, text, page and heading path (`load_bytes` gives it its offsets)."""

    kind: BlockKind
    text: str
    page: int | None = None
    headings: tuple[str, ...] = ()


def normalise(text: str) -> str:
    """`text` with compatibility characters made plain.

    The Latin ligatures are spelled out (ﬁ ﬂ ﬀ ﬃ ﬄ ﬅ ﬆ), exotic spaces made spaces,
    zero-width ones removed and full-width ASCII made ASCII.
    Narrower than Unicode's NFKC on purpose: superscripts, fractions and the like keep their
    meaning ("m²" stays "m²", not "m2"). Loaders apply it before the text is assembled, so
    blocks and chunks point at the normalised text, exactly.
    """
    return text.translate(_COMPATIBLE)
