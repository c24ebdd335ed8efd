"""Content words: what an answer's backing and the offline model compare, stemmed.

`content_words("How long do refunds take?")` is `{"long", "refund", "tak"}`: lower-cased,
without stopwords (function words, and the words that frame a question rather than name its
topic) or words of two letters, and stemmed (`stem`) so that "refunds", "refunded" and
"refund" are one word.
"""

from __future__ import annotations

import re

__all__ = ["STOPWORDS", "content_words", "stem"]

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9']*")  # a hyphen separates: price-match
_STOPWORDS = """a an and are as at be by can do does for from has have how i if in is it its may
not of on or our that the their them then there these they this to was we were what when
which who will with you your yes no am any about also been being but did could would
should shall must might into out over than too very just only much many some such
please tell know want like me my us get got one ones other others own same so all each
why where whom whose here another long often soon until"""
STOPWORDS = frozenset(_STOPWORDS.split())
"""Function words, and words that frame a question ("please tell me", "how much")."""

_DOUBLE = re.compile(r"([b-df-hj-np-tv-z])\1$")  # "shipp" (from "shipping"), not "ll", "ss"


def stem(word: str) -> str:
    """A light English stem: plural, -ed, -ing, a final e (`"shipping"` -> `"ship"`).

    Crude on purpose (no dictionary): it only has to make a word's common forms equal.
    """
    word = word.lower().removesuffix("'s").strip("'-")
    if len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            if _DOUBLE.search(word) and not word.endswith(("ll", "ss", "zz")):
                word = word[:-1]
            break
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


def content_words(text: str) -> set[str]:
    """The stems of `text`'s content words (see the module's docstring)."""
    words = (w.lower().strip("'-") for w in _WORD.findall(text))
    return {stem(w) for w in words if len(w) > 2 and w not in STOPWORDS}
