"""An offline model that answers from the evidence it is given, for tests, demos and evals.

```python
answerer = Answerer(library, extractive_model())
```

`extractive_model()` is a `FunctionModel` that reads the answering prompt and replies as a
careful model would, without a network: it answers only with sentences of the excerpts that
speak to the question, quoted word for word, and says "The documents do not say." (with
`answerable: false`) when none does. It is deterministic: the same prompt gives the same reply.

How it reads the question. Its words are the question's content words (lower-cased, stemmed,
without stopwords or the words that frame a question, such as "how long" or "please tell
me": see `handrail.documents._words`). A follow-up (earlier user messages before the prompt)
is read together with the user's last earlier message: "and how long does it take?" after
"How much is express shipping?" asks about express shipping.

How it chooses. The question's distinctive words are those not in every excerpt (when there
are three excerpts or more, a word they all hold cannot tell them apart, like "git" in a Git
manual; with two, a shared word is as likely their shared topic). A sentence speaks to the
question when it shares at least two of them (or the only one): one shared word is chance,
not a topic. The sentence that shares the most is quoted first (the question's own words
before those of the conversation, then the first in the prompt); while two or more words are
still unanswered, the sentence that answers most of them is quoted too if it answers two of
them: another part of the question (up to three quotes: a two-part question cites the two
excerpts it needs). It answers when the quoted sentences hold at least half of the
question's distinctive words (and of a follow-up's own words); otherwise the documents do not
answer it, however relevant retrieval found the excerpts. It does not know synonyms: a
question worded unlike its answer ("shows up" for "reaches") needs the two to share enough
other words, or it is not answered.

It also answers the self-check prompt (the share of the answer's content words that the
excerpts hold) and the extraction prompt (`Field: value` lines of the text).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..models import ModelRequest
from ..testing import FunctionModel
from ._answer import INSTRUCTIONS, SELF_CHECK
from ._tools import EXTRACT
from ._words import content_words

__all__ = ["extractive_model", "extractive_reply"]

_EXCERPT = re.compile(r"^\[(\d+)\] [^\n]*\n<excerpt>\n(.*?)\n</excerpt>", re.MULTILINE | re.DOTALL)
_SENTENCE = re.compile(r"(?:[^.!?\n]|[.!?](?=\S))+[.!?]?")  # "12.50" is not an end
_LINE_BREAK = re.compile(r"(?<![\n|])\n(?![\n|#])")
_QUESTION = re.compile(r"^Question[^:\n]*: (.*)$", re.MULTILINE)
_ANSWER = re.compile(r"^Answer to check: (.*)$", re.MULTILINE | re.DOTALL)
_FIELDS = re.compile(r"^Fields: (.*)$", re.MULTILINE)
_MOST_QUOTES = 3
_FEWEST_TO_COMPARE = 3
"""Excerpts needed before a word they all hold counts as common, not distinctive."""
_NOT_ANSWERED = {"answer": "The documents do not say.", "citations": [], "answerable": False}


def extractive_model(name: str = "extractive") -> FunctionModel:
    """The offline answering model described above."""
    return FunctionModel(extractive_reply, name=name)


def extractive_reply(request: ModelRequest) -> str:
    """One reply of `extractive_model`: a function an eval suite can name.

    In a documents suite: `model: {function: "handrail.documents.testing:extractive_reply"}`.
    """
    texts = [m.text for m in request.messages]
    prompt = next((t for t in reversed(texts) if _QUESTION.search(t) or _FIELDS.search(t)), "")
    if request.instructions == SELF_CHECK:
        return json.dumps({"support": _support(prompt)})
    if request.instructions == EXTRACT:
        return json.dumps(_extract(prompt))
    if request.instructions == INSTRUCTIONS:
        earlier = [m.text for m in request.messages[:-1] if m.role == "user"]
        return json.dumps(_answer(prompt, earlier[-1] if earlier else ""))
    return "I can only answer from documents."


@dataclass(frozen=True, slots=True)
class _Sentence:
    excerpt: int
    text: str
    words: frozenset[str]


def _sentences(prompt: str) -> list[_Sentence]:
    found = []
    for number, text in _EXCERPT.findall(prompt):
        text = _LINE_BREAK.sub(" ", text)  # a sentence may wrap; paragraphs stay apart
        for sentence in _SENTENCE.findall(text):
            sentence = sentence.strip(" |#")
            if len(sentence) >= 3:
                found.append(_Sentence(int(number), sentence, frozenset(content_words(sentence))))
    return found


def _half(held: set[str], wanted: set[str]) -> bool:
    return 2 * len(held & wanted) >= len(wanted)


def _answer(prompt: str, earlier: str) -> dict[str, Any]:
    asked = _QUESTION.findall(prompt)
    sentences = _sentences(prompt)
    common = _in_every_excerpt(sentences)
    own = content_words(asked[-1] if asked else "")
    wanted = own | content_words(earlier)
    if wanted - common:  # words in every excerpt do not tell the excerpts apart
        own, wanted = own - common, wanted - common
    if not wanted:
        return _NOT_ANSWERED
    enough = min(2, len(wanted))  # a sentence speaks to the question
    chosen: list[_Sentence] = []
    held: set[str] = set()
    candidates = [s for s in sentences if len(s.words & wanted) >= enough]
    while candidates and len(chosen) < _MOST_QUOTES and not wanted <= held:
        left = wanted - held

        def merit(sentence: _Sentence, left: set[str] = left) -> tuple[int, int]:
            return len(sentence.words & left & own), len(sentence.words & left)

        best = max(candidates, key=merit)  # the first of equals
        if chosen and merit(best)[1] < 2:  # a further quote answers another part
            break
        chosen.append(best)
        held |= best.words
        candidates.remove(best)
    if not _half(held, wanted) or (own and not _half(held, own)):
        return _NOT_ANSWERED
    return {
        "answer": " ".join(s.text for s in chosen),
        "citations": [{"excerpt": s.excerpt, "quote": s.text} for s in chosen],
        "answerable": True,
    }


def _in_every_excerpt(sentences: list[_Sentence]) -> set[str]:
    """The words every excerpt holds, when there are three excerpts or more (else none)."""
    words: dict[int, set[str]] = {}
    for sentence in sentences:
        words.setdefault(sentence.excerpt, set()).update(sentence.words)
    if len(words) < _FEWEST_TO_COMPARE:
        return set()
    return set.intersection(*words.values())


def _support(prompt: str) -> float:
    answer = _ANSWER.findall(prompt)
    words = content_words(answer[-1] if answer else "")
    if not words:
        return 0.0
    held = set().union(*(s.words for s in _sentences(prompt)))
    return round(len(words & held) / len(words), 4)


def _extract(prompt: str) -> dict[str, Any]:
    fields = _FIELDS.findall(prompt)
    names = [f.strip() for f in fields[0].split(",")] if fields else []
    found: dict[str, Any] = {}
    for name in names:
        match = re.search(rf"^\s*{re.escape(name)}\s*:\s*(.+)$", prompt, re.MULTILINE | re.I)
        found[name] = match.group(1).strip() if match else None
    return found
