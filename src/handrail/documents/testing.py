"""An offline model that answers from the evidence it is given, for tests, demos and evals.

```python
answerer = Answerer(library, extractive_model())
```

`extractive_model()` is a `FunctionModel` that reads the answering prompt and replies as a
careful model would, without a network: with the sentence of the excerpts that shares the
most words with the question, cited word for word; with "The documents do not say." (and
`answerable: false`) when there are no excerpts or no sentence shares a content word. It also
answers the self-check (full support) and extraction (`Field: value` lines of the text)
prompts. It is deterministic: the same evidence gives the same answer.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..messages import TextPart
from ..models import ModelRequest
from ..testing import FunctionModel
from ._answer import INSTRUCTIONS, SELF_CHECK, content_words
from ._tools import EXTRACT

__all__ = ["extractive_model", "extractive_reply"]

_EXCERPT = re.compile(r"^\[(\d+)\] [^\n]*\n<excerpt>\n(.*?)\n</excerpt>", re.MULTILINE | re.DOTALL)
_SENTENCE = re.compile(r"(?:[^.!?\n]|[.!?](?=\S))+[.!?]?")  # "12.50" is not an end
_LINE_BREAK = re.compile(r"(?<![\n|])\n(?![\n|#])")
_QUESTION = re.compile(r"^Question: (.*)$", re.MULTILINE)
_FIELDS = re.compile(r"^Fields: (.*)$", re.MULTILINE)


def extractive_model(name: str = "extractive") -> FunctionModel:
    """The offline answering model described above."""
    return FunctionModel(extractive_reply, name=name)


def extractive_reply(request: ModelRequest) -> str:
    """One reply of `extractive_model`: a function an eval suite can name.

    In a documents suite: `model: {function: "handrail.documents.testing:extractive_reply"}`.
    """
    prompt = "".join(p.text for p in request.messages[-1].parts if isinstance(p, TextPart))
    if request.instructions == SELF_CHECK:
        return json.dumps({"support": 1.0})
    if request.instructions == EXTRACT:
        return json.dumps(_extract(prompt))
    if request.instructions == INSTRUCTIONS:
        return json.dumps(_answer(prompt))
    return "I can only answer from documents."


def _answer(prompt: str) -> dict[str, Any]:
    question = _QUESTION.findall(prompt)
    wanted = content_words(question[-1] if question else "")
    best: tuple[int, int, str] | None = None  # (shared words, excerpt, sentence)
    for number, text in _EXCERPT.findall(prompt):
        text = _LINE_BREAK.sub(" ", text)  # a sentence may wrap; paragraphs stay apart
        for sentence in _SENTENCE.findall(text):
            sentence = sentence.strip()
            shared = len(wanted & content_words(sentence))
            if shared and (best is None or shared > best[0]):
                best = (shared, int(number), sentence)
    if best is None:
        return {"answer": "The documents do not say.", "citations": [], "answerable": False}
    _, number, sentence = best
    return {
        "answer": sentence,
        "citations": [{"excerpt": number, "quote": sentence}],
        "answerable": True,
    }


def _extract(prompt: str) -> dict[str, Any]:
    fields = _FIELDS.findall(prompt)
    names = [f.strip() for f in fields[0].split(",")] if fields else []
    found: dict[str, Any] = {}
    for name in names:
        match = re.search(rf"^\s*{re.escape(name)}\s*:\s*(.+)$", prompt, re.MULTILINE | re.I)
        found[name] = match.group(1).strip() if match else None
    return found
