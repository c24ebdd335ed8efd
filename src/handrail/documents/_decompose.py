"""Query decomposition: a multi-part question split into the questions it asks.

```python
parts = await decompose("How long do refunds take, and who approves them?", model)
# ["How long do refunds take?", "Who approves refunds?"]
```

One model call through handrail's model layer (so the model's own retry policy applies),
asking for JSON that fits `SubQuestions`. Decomposition only ever helps retrieval, so it
never fails it: a model that errors, or a reply that is not the JSON asked for, gives
`[question]`, as does a question of one part (the question itself, not the model's
rewording). Successful answers are kept in a `DecompositionCache` when one is given
(`Library` keeps one), keyed by the model's name and the question.
"""

from __future__ import annotations

from collections import OrderedDict

from pydantic import BaseModel, Field, ValidationError

from ..models import Model
from ._ask import ask_model

__all__ = ["DECOMPOSE_INSTRUCTIONS", "DecompositionCache", "SubQuestions", "decompose"]

MAX_PARTS = 4
"""Sub-questions kept, at most; a model that returns more is cut to the first ones."""

DECOMPOSE_INSTRUCTIONS = """\
You prepare a user's question for a search over a company's documents. When the question asks
about several distinct things, split it into self-contained sub-questions, one for each thing
(repeat the subject in each, so each can be searched on its own). When it asks about one
thing, return it unchanged as the only sub-question. Never answer the question, never add
questions it does not ask, and return at most 4 sub-questions.

Reply with one JSON object and nothing else: {"questions": ["...", "..."]}"""
"""The system prompt of the decomposition call."""


class SubQuestions(BaseModel):
    """The decomposition call's reply: the sub-questions, in the order they were asked."""

    questions: list[str] = Field(min_length=1)


class DecompositionCache:
    """A least-recently-used map from (model name, question) to its sub-questions.

    Args:
        size: entries kept; the least recently used one goes first when it is full.
    """

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[str, str], list[str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, model: str, question: str) -> list[str] | None:
        """The cached sub-questions (a copy), or None."""
        found = self._entries.get((model, question))
        if found is None:
            return None
        self._entries.move_to_end((model, question))
        return list(found)

    def put(self, model: str, question: str, parts: list[str]) -> None:
        """Remember `parts` for this model and question."""
        self._entries[(model, question)] = list(parts)
        self._entries.move_to_end((model, question))
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


async def decompose(
    question: str, model: Model, *, cache: DecompositionCache | None = None
) -> list[str]:
    """The sub-questions of `question`, by one call to `model` (never raises for its reply).

    Args:
        question: the user's question.
        model: the model that splits it; a cached answer is used for the same model name.
        cache: where answers are kept between calls (None: no caching).

    Returns:
        One to `MAX_PARTS` self-contained questions; `[question]` when it has one part, or
        when the model failed or replied with something other than the JSON asked for (such
        a failure is not cached, so the next call asks again).
    """
    if cache is not None and (found := cache.get(model.name, question)) is not None:
        return found
    text = await _ask(model, question)
    parts = _parse(text) if text is not None else None
    if parts is None:
        return [question]
    if len(parts) == 1:
        parts = [question]
    if cache is not None:
        cache.put(model.name, question, parts)
    return parts


async def _ask(model: Model, question: str) -> str | None:
    text, _ = await ask_model(
        model,
        DECOMPOSE_INSTRUCTIONS,
        question,
        agent="documents.decompose",
        output_schema=SubQuestions.model_json_schema(),
    )
    return text  # None: the model failed or did not finish; search as asked


def _parse(text: str) -> list[str] | None:
    """The sub-questions in a reply (a fenced block or words around the JSON tolerated)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        reply = SubQuestions.model_validate_json(text[start : end + 1])
    except ValidationError:
        return None
    parts: list[str] = []
    for part in (" ".join(q.split()) for q in reply.questions):
        if part and part not in parts:
            parts.append(part)
    return parts[:MAX_PARTS] or None
