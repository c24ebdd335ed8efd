"""Answering from evidence: the prompt, verified citations, confidence, and when to escalate.

```python
answerer = Answerer(library, "openai:gpt-4o-mini")
reply = await answerer.answer("How long do refunds take?")
reply.answer, reply.citations, reply.confidence, reply.escalated
```

One question goes:

1. **Retrieve** (`Library.retrieve`): hybrid, and only chunks at or above `min_relevance`
   (0.5) are passed on. With `decompose=True`, a multi-part question is split first (one
   model call, cached).
2. **Prompt**: grounding instructions, then the evidence as numbered excerpts with source,
   page and relevance, then the question. With no evidence, the prompt says so, and that the
   model must say the documents do not answer rather than guess.
3. **One model call** through handrail's model layer (its retry policy included), asking for
   JSON: the answer, the citations (excerpt number and an exact quote), and whether the
   evidence answers the question. A reply the provider did not finish (cut by a token limit)
   is never used: the question escalates.
4. **Verify** each citation: its quote must occur in the excerpt it cites (whitespace,
   typographic quotes and dashes aside; `...` may elide). One that does not is dropped, and
   lowers the confidence.
5. **Confidence** (0-1) = retrieval x backing x honesty, and the optional self-check:
   - retrieval: the relevance of the best cited chunk (0 with no verified citation);
   - backing: the share of the answer's content words found in the verified cited chunks;
   - honesty: verified citations over all citations given (1 when none was dropped);
   - `self_check=True`: a second model call rates how well the evidence supports the answer
     (0-1), and the confidence is multiplied by it.
   A model that says the evidence does not answer the question gives confidence 0.
6. **Escalate** below `escalate_below` (0.3): `DocumentAnswer.escalated` with the reason. As
   an agent's tool (`Answerer.tools()`), `documents.answer` then asks a person
   (`AskPerson`: a `question` card that survives restarts and shows on the web page); the
   person's answer becomes the reply and is stored as a note (`Library.add_note`) that later
   retrieval finds, with that person as its source.
"""

from __future__ import annotations

import re
import time
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field, ValidationError

from ..models import Model, Usage
from ..models._infer import as_model
from ._ask import ask_model, read_json_object

if TYPE_CHECKING:
    from ._library import Evidence, Library

__all__ = [
    "Answerer",
    "Citation",
    "DocumentAnswer",
    "evidence_prompt",
    "verify_quote",
]

INSTRUCTIONS = """\
You answer questions about a company's documents using ONLY the numbered excerpts you are
given. Never use outside knowledge, never guess.

Reply with one JSON object and nothing else:
{"answer": "...", "citations": [{"excerpt": 1, "quote": "..."}], "answerable": true}

- "answer": a short, direct answer in plain text. Every claim must come from the excerpts.
- "citations": for each claim, the excerpt number and a quote copied EXACTLY, word for word,
  from that excerpt (a sentence or a phrase; use ... to skip words inside a quote).
- "answerable": false when the excerpts do not answer the question: then say so in
  "answer" (for example "The documents do not say.") and give no citations.
"""

NO_EVIDENCE = (
    "There is NO evidence for this question in the documents: nothing relevant was found. "
    'Say that the documents do not answer it, set "answerable" to false, and do not guess.'
)

SELF_CHECK = """\
You check an answer against its evidence. Reply with one JSON object and nothing else:
{"support": 0.0}
where "support" (0 to 1) says how fully the excerpts support every claim of the answer:
1 = every claim is stated in the excerpts, 0 = the excerpts do not support it.
"""


class Citation(BaseModel):
    """A verified citation: where the quote is, and how relevant its chunk was."""

    source: str
    page: int | None = None
    quote: str
    chunk_id: str
    relevance: float = Field(ge=0.0, le=1.0)


class DocumentAnswer(BaseModel):
    """An answer from the documents, with what it rests on."""

    question: str
    answer: str
    citations: list[Citation] = Field(default_factory=list)
    """The citations whose quotes were found in the chunks they cite."""
    dropped_citations: int = 0
    """Citations the model gave whose quotes were not in the excerpt they cited."""
    confidence: float = Field(ge=0.0, le=1.0)
    escalated: bool = False
    """Confidence was below the threshold: a person should answer (or did: `answered_by`)."""
    escalation_reason: str | None = None
    answered_by: str | None = None
    """The person who answered an escalated question, when one did."""
    steps: list[str] = Field(default_factory=list)
    """What was done, in order (retrieval, the model calls, verification, escalation)."""
    input_tokens: int = 0
    output_tokens: int = 0
    latency_ms: float = 0.0


class _Cited(BaseModel):
    excerpt: int
    quote: str


class _Reply(BaseModel):
    answer: str
    citations: list[_Cited] = Field(default_factory=list)
    answerable: bool = True


class _Check(BaseModel):
    support: float = Field(ge=0.0, le=1.0)


def evidence_prompt(question: str, evidence: Sequence[Evidence]) -> str:
    """The user message of an answering call: the excerpts, numbered, then the question."""
    if not evidence:
        return f"{NO_EVIDENCE}\n\nQuestion: {question}"
    blocks = []
    for number, item in enumerate(evidence, 1):
        chunk = item.chunk
        where = chunk.source + (f", page {chunk.page}" if chunk.page is not None else "")
        if chunk.headings:
            where += f", section {' > '.join(chunk.headings)}"
        blocks.append(
            f"[{number}] {where} (relevance {item.relevance:.2f})\n"
            f"<excerpt>\n{chunk.text}\n</excerpt>"
        )
    return "Excerpts:\n\n" + "\n\n".join(blocks) + f"\n\nQuestion: {question}"


_SPACE = re.compile(r"\s+")
_ELLIPSIS = re.compile(r"\s*(?:\.\.\.|…)\s*")
_SAME = str.maketrans(  # typographic quotes and dashes, as their plain forms
    {"\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2018": "'", "\u2019": "'"}
    | {"\u2013": "-", "\u2014": "-"}
)


def _plain(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).translate(_SAME)
    return _SPACE.sub(" ", text).strip()


def verify_quote(quote: str, text: str) -> bool:
    """Whether `quote` occurs in `text`, word for word.

    Whitespace, typographic quotes and dashes do not count, and `...` (or `…`) may elide words
    inside the quote (the pieces must then occur in order). Case counts: a quote is a copy.
    """
    pieces = [p for p in (_plain(piece) for piece in _ELLIPSIS.split(_plain(quote))) if p]
    pieces = [p.strip("\"' ") for p in pieces]
    if not pieces or sum(len(p) for p in pieces) < 3:
        return False
    haystack, at = _plain(text), 0
    for piece in pieces:
        found = haystack.find(piece, at)
        if found < 0:
            return False
        at = found + len(piece)
    return True


_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'-]*")
_STOPWORDS = """a an and are as at be by can do does for from has have how i if in is it its may
not of on or our that the their them then there these they this to was we were what when which
who will with you your yes no"""
_STOP = frozenset(_STOPWORDS.split())


def content_words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text) if len(w) > 2 and w.lower() not in _STOP}


def _backing(answer: str, cited: Sequence[str]) -> float:
    """The share of the answer's content words that the cited chunks contain (0-1)."""
    words = content_words(answer)
    if not words:
        return 0.0
    found = set().union(*(content_words(text) for text in cited)) if cited else set()
    return len(words & found) / len(words)


class Answerer:
    """Answers questions from a `Library`, with verified citations and a confidence.

    Args:
        library: the documents.
        model: the model that writes the answers (a `Model`, or a name such as
            `"openai:gpt-4o-mini"`); its retry policy applies.
        top_k: evidence chunks passed to the model, at most.
        min_relevance: chunks below this relevance (0-1) are never passed on.
        escalate_below: an answer with a lower confidence escalates to a person.
        self_check: ask the model, in a second call, how well the evidence supports the
            answer, and fold that into the confidence.
        decompose: split multi-part questions first (one model call, cached).
    """

    def __init__(
        self,
        library: Library,
        model: Model | str,
        *,
        top_k: int = 5,
        min_relevance: float = 0.5,
        escalate_below: float = 0.3,
        self_check: bool = False,
        decompose: bool = False,
    ) -> None:
        if not 0.0 <= min_relevance <= 1.0 or not 0.0 <= escalate_below <= 1.0:
            raise ValueError("min_relevance and escalate_below are between 0 and 1")
        if top_k < 1:
            raise ValueError("top_k must be at least 1")
        self.library = library
        self.model = as_model(model, where="Answerer(model=...)")
        self.top_k = top_k
        self.min_relevance = min_relevance
        self.escalate_below = escalate_below
        self.self_check = self_check
        self.decompose = decompose

    async def answer(self, question: str) -> DocumentAnswer:
        """Answer `question` from the documents (never raises for a model's bad reply)."""
        began = time.perf_counter()
        usage = Usage(requests=0)
        steps: list[str] = []
        evidence = await self.library.retrieve(
            question,
            top_k=self.top_k,
            min_relevance=self.min_relevance,
            model=self.model if self.decompose else None,
        )
        steps.append(
            f"retrieved {len(evidence)} excerpt(s) at relevance ≥ {self.min_relevance:g}"
            + (f" (best {evidence[0].relevance:.2f})" if evidence else "")
        )
        reply, why = await self._ask(question, evidence, usage, steps)
        citations: list[Citation] = []
        dropped = 0
        if reply is not None:
            for cited in reply.citations:
                if not 1 <= cited.excerpt <= len(evidence):
                    dropped += 1
                    continue
                item = evidence[cited.excerpt - 1]
                if not verify_quote(cited.quote, item.chunk.text):
                    dropped += 1
                    continue
                citations.append(
                    Citation(
                        source=item.chunk.source,
                        page=item.chunk.page,
                        quote=cited.quote,
                        chunk_id=item.chunk.id,
                        relevance=round(item.relevance, 4),
                    )
                )
            steps.append(f"verified {len(citations)} citation(s), dropped {dropped}")
        confidence = 0.0
        if reply is not None and reply.answerable and citations:
            given = len(citations) + dropped
            cited_text = [evidence[c.excerpt - 1].chunk.text for c in reply.citations
                          if 1 <= c.excerpt <= len(evidence)]  # fmt: skip
            confidence = (
                max(c.relevance for c in citations)
                * _backing(reply.answer, cited_text)
                * (len(citations) / given)
            )
            if self.self_check:
                confidence *= await self._check(question, evidence, reply.answer, usage, steps)
        elif reply is not None and not reply.answerable:
            why = "the model says the documents do not answer the question"
        elif reply is not None:
            why = "no citation of the answer could be found in the documents"
        confidence = round(min(1.0, max(0.0, confidence)), 4)
        escalated = confidence < self.escalate_below
        if escalated and why is None:
            why = f"confidence {confidence:.2f} is below {self.escalate_below:g}"
        if escalated:
            steps.append(f"escalated: {why}")
        return DocumentAnswer(
            question=question,
            answer=reply.answer if reply is not None else "",
            citations=citations,
            dropped_citations=dropped,
            confidence=confidence,
            escalated=escalated,
            escalation_reason=why if escalated else None,
            steps=steps,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            latency_ms=round((time.perf_counter() - began) * 1000, 2),
        )

    async def _ask(
        self, question: str, evidence: Sequence[Evidence], usage: Usage, steps: list[str]
    ) -> tuple[_Reply | None, str | None]:
        """The model's answer, or None and why it could not be used."""
        prompt = evidence_prompt(question, evidence)
        text, why = await ask_model(self.model, INSTRUCTIONS, prompt, usage)
        steps.append("asked the model" + (f": {why}" if why else ""))
        if text is None:
            return None, why
        try:
            return _Reply.model_validate(read_json_object(text)), None
        except (ValueError, ValidationError) as error:
            steps.append(f"the model's reply is not the JSON asked for ({type(error).__name__})")
            return None, "the model's reply could not be read"

    async def _check(
        self,
        question: str,
        evidence: Sequence[Evidence],
        answer: str,
        usage: Usage,
        steps: list[str],
    ) -> float:
        prompt = f"{evidence_prompt(question, evidence)}\n\nAnswer to check: {answer}"
        text, why = await ask_model(self.model, SELF_CHECK, prompt, usage)
        try:
            support = _Check.model_validate(read_json_object(text or "")).support
        except (ValueError, ValidationError):
            steps.append(f"self-check failed ({why or 'unreadable reply'}): counted as 0.5")
            return 0.5
        steps.append(f"self-check: support {support:.2f}")
        return support
