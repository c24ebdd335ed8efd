"""Answering from evidence: the prompt, verified citations, confidence, and when to escalate.

```python
answerer = Answerer(library, "openai:gpt-4o-mini")
reply = await answerer.answer("How long do refunds take?")
reply.answer, reply.citations, reply.confidence, reply.escalated
later = await answerer.answer("And for a damaged item?", history=[...earlier turns...])
```

One question goes:

1. **Retrieve** (`Library.retrieve`): hybrid, at most `top_k` chunks, only those at or above
   `min_relevance` (0.5). With `decompose=True`, a multi-part question is split first (one
   model call, cached). With `history`, a follow-up ("and how long does it take?") is also
   retrieved together with the last earlier question of the user, and the two lists merged
   (each chunk at its higher relevance, the best `top_k` kept).
2. **Nothing passed the threshold**: no model is asked to answer. The question escalates at
   once, and the reason says so.
3. **Prompt**: grounding instructions; the conversation's earlier turns (as the messages they
   were, before the evidence: they tell what a follow-up refers to, and are not evidence);
   then the evidence as numbered excerpts with source, page and relevance, then the question.
4. **One model call** through handrail's model layer (its retry policy included), asking for
   JSON: the answer, the citations (excerpt number and an exact quote), and whether the
   evidence answers the question. A reply that is not that JSON (it does not parse, or does
   not fit the shape) is answered once with what was wrong, and the model asked again; a
   second bad reply escalates. A reply the provider did not finish (cut by a token limit,
   filtered) is never used, and not retried as "malformed": the question escalates.
5. **Verify** each citation: its quote must occur in the excerpt it cites (whitespace,
   typographic quotes and dashes aside; `...` may elide). One that does not is dropped, and
   lowers the confidence.
6. **Confidence** (0-1): an estimate of the probability that the answer is right and rests on
   the documents. It starts from the chance that the best cited passage holds the answer (its
   relevance: retrieval's 0-1 score, 0.5 the evidence/noise boundary, treated as that
   probability), discounted by the support the answer has:
   - backing: the share of the answer's content words found in the verified cited chunks;
   - honesty: verified citations over all citations given (1 when none was dropped);
   - `self_check=True`: a second model call rates how well the evidence supports the answer
     (0-1), and the confidence is multiplied by it.
   A model that says the evidence does not answer the question, or an answer with no
   verified citation, gives confidence 0.
7. **Escalate** below `escalate_below` (0.3): `DocumentAnswer.escalated` with the reason. As
   an agent's tool (`document_tools(answerer)`), `documents.answer` then asks a person
   (`AskPerson`: a `question` card that survives restarts and shows on the web page); the
   person's answer becomes the reply and is stored as a note (`Library.add_note`) that later
   retrieval finds, with that person as its source.

Each answer carries its token usage and, when the model's price is known
(`handrail.models.price_of`), its cost in USD.
"""

from __future__ import annotations

import re
import time
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field, ValidationError

from ..messages import Message
from ..models import Model, Price, Usage, price_of
from ..models._infer import as_model
from ._ask import Turn, ask_model, read_json_object
from ._words import content_words

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

Earlier messages of the conversation may come before the excerpts. Use them only to
understand what the question refers to (a follow-up such as "and how long does it take?").
They are not evidence: never cite them, and never answer from them.

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

CORRECTION = """\
Your reply could not be used: {problem}. Reply again with only the JSON object the
instructions describe ({{"answer": ..., "citations": [...], "answerable": ...}}), nothing else.\
"""
"""What the one retry after a malformed reply says (with what was wrong)."""

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
    """An estimate of the probability that the answer is right and rests on the documents
    (see `Answerer`)."""
    escalated: bool = False
    """Confidence was below the threshold: a person should answer (or did: `answered_by`)."""
    escalation_reason: str | None = None
    answered_by: str | None = None
    """The person who answered an escalated question, when one did."""
    steps: list[str] = Field(default_factory=list)
    """What was done, in order (retrieval, the model calls, verification, escalation)."""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    """What the model calls cost, in USD, when the model's price is known
    (`handrail.models.price_of`, or the `Answerer`'s `price=`); None when it is not."""
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


def evidence_prompt(question: str, evidence: Sequence[Evidence], *, follow_up: bool = False) -> str:
    """The user message of an answering call: the excerpts, numbered, then the question.

    Args:
        question: the question.
        evidence: the excerpts, in the order they are numbered (from 1).
        follow_up: the question follows the conversation before it (said beside it).
    """
    asked = f"Question{' (a follow-up to the conversation above)' if follow_up else ''}: "
    if not evidence:
        return f"{NO_EVIDENCE}\n\n{asked}{question}"
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
    return "Excerpts:\n\n" + "\n\n".join(blocks) + f"\n\n{asked}{question}"


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


def _backing(answer: str, cited: Sequence[str]) -> float:
    """The share of the answer's content words that the cited chunks contain (0-1)."""
    words = content_words(answer)
    if not words:
        return 0.0
    found = set().union(*(content_words(text) for text in cited)) if cited else set()
    return len(words & found) / len(words)


History = Sequence[Message | tuple[Literal["user", "assistant"], str]]
"""Earlier turns of a conversation: handrail `Message`s (a session's), or (role, text) pairs."""


def _turns(history: History, limit: int) -> list[Turn]:
    """The last `limit` turns of `history` with text: user and assistant messages only.

    Tool calls, system messages and a scratch message are left out: only what was said.
    """
    turns: list[Turn] = []
    for item in history:
        if isinstance(item, Message):
            if item.scratch or item.role == "system" or not item.text.strip():
                continue
            turns.append((item.role, item.text.strip()))
        else:
            role, text = item
            if role not in ("user", "assistant"):
                raise ValueError(
                    f"history: a turn's role is {role!r}; pass ('user', text) or "
                    "('assistant', text) pairs, or a session's Messages"
                )
            if text.strip():
                turns.append((role, text.strip()))
    return turns[-limit:] if limit else []


def _problem(error: ValueError | ValidationError) -> str:
    """What was wrong with a reply, in a line the model can act on."""
    if isinstance(error, ValidationError):
        wrong = [
            f"{'.'.join(map(str, e['loc'])) or 'the reply'}: {e['msg']}" for e in error.errors()[:5]
        ]
        return "it does not fit the shape asked for (" + "; ".join(wrong) + ")"
    return f"it is not a JSON object ({str(error)[:200]})"


class Answerer:
    """Answers questions from a `Library`, with verified citations and a confidence.

    The confidence estimates the probability that an answer is right and rests on the
    documents: the relevance of its best verified citation (retrieval's 0-1 score that the
    passage holds the answer, taken as a probability), times the share of the answer the cited
    passages back, times the share of its citations that were verified (and the self-check's
    support, with `self_check=True`); 0 when the model says the excerpts do not answer, or no
    citation holds.

    Args:
        library: the documents.
        model: the model that writes the answers (a `Model`, or a name such as
            `"openai:gpt-4o-mini"`); its retry policy applies.
        top_k: evidence chunks passed to the model, at most.
        min_relevance: chunks below this relevance (0-1) are never passed on; when none
            reaches it, no model is asked and the question escalates.
        escalate_below: an answer with a lower confidence escalates to a person.
        self_check: ask the model, in a second call, how well the evidence supports the
            answer, and fold that into the confidence.
        decompose: split multi-part questions first (one model call, cached).
        history_limit: earlier turns of the conversation passed on, at most (the latest).
        price: the model's price, for `DocumentAnswer.cost_usd` (default: its list price
            from `handrail.models.price_of`, where known).
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
        history_limit: int = 8,
        price: Price | None = None,
    ) -> None:
        if not 0.0 <= min_relevance <= 1.0 or not 0.0 <= escalate_below <= 1.0:
            raise ValueError("min_relevance and escalate_below are between 0 and 1")
        if top_k < 1:
            raise ValueError("top_k must be at least 1")
        if history_limit < 0:
            raise ValueError("history_limit must be 0 (no history) or more")
        self.library = library
        self.model = as_model(model, where="Answerer(model=...)")
        self.top_k = top_k
        self.min_relevance = min_relevance
        self.escalate_below = escalate_below
        self.self_check = self_check
        self.decompose = decompose
        self.history_limit = history_limit
        self.price = price if price is not None else price_of(self.model.name)

    async def answer(self, question: str, *, history: History = ()) -> DocumentAnswer:
        """Answer `question` from the documents (never raises for a model's bad reply).

        Args:
            question: the question.
            history: the conversation's earlier turns, oldest first (a session's messages,
                or (role, text) pairs), so that a follow-up question can be answered. They
                reach the model before the evidence, as conversation, never as evidence.

        Raises:
            ValueError: a (role, text) turn of `history` has a role other than user or
                assistant.
        """
        began = time.perf_counter()
        usage = Usage(requests=0)
        steps: list[str] = []
        turns = _turns(history, self.history_limit)
        evidence = await self._retrieve(question, turns, steps)
        reply: _Reply | None = None
        why: str | None = None
        if not evidence:
            why = (
                f"nothing in the documents reaches relevance {self.min_relevance:g}: "
                "no model was asked to answer"
            )
        else:
            reply, why = await self._ask(question, evidence, turns, usage, steps)
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
            verified = {c.chunk_id for c in citations}
            cited_text = [e.chunk.text for e in evidence if e.chunk.id in verified]
            confidence = (
                max(c.relevance for c in citations)
                * _backing(reply.answer, cited_text)
                * (len(citations) / (len(citations) + dropped))
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
            cost_usd=round(self.price.cost(usage), 8) if self.price is not None else None,
            latency_ms=round((time.perf_counter() - began) * 1000, 2),
        )

    async def _retrieve(
        self, question: str, turns: Sequence[Turn], steps: list[str]
    ) -> list[Evidence]:
        """The evidence for `question`; for a follow-up, also read with the user's last turn."""
        model = self.model if self.decompose else None
        evidence = await self.library.retrieve(
            question, top_k=self.top_k, min_relevance=self.min_relevance, model=model
        )
        earlier = next((text for role, text in reversed(turns) if role == "user"), None)
        if earlier is not None and earlier != question:
            read = await self.library.retrieve(
                f"{earlier}\n{question}",
                top_k=self.top_k,
                min_relevance=self.min_relevance,
                model=model,
            )
            best: dict[str, Evidence] = {}
            for item in [*evidence, *read]:
                known = best.get(item.chunk.id)
                if known is None or item.relevance > known.relevance:
                    best[item.chunk.id] = item
            evidence = sorted(best.values(), key=lambda e: -e.relevance)[: self.top_k]
        steps.append(
            f"retrieved {len(evidence)} excerpt(s) at relevance ≥ {self.min_relevance:g}"
            + (f" (best {max(e.relevance for e in evidence):.2f})" if evidence else "")
            + (" with the conversation's last question" if earlier is not None else "")
        )
        return evidence

    async def _ask(
        self,
        question: str,
        evidence: Sequence[Evidence],
        turns: Sequence[Turn],
        usage: Usage,
        steps: list[str],
    ) -> tuple[_Reply | None, str | None]:
        """The model's answer, or None and why it could not be used.

        A malformed reply is answered once with what was wrong; an unfinished one is not.
        """
        prompt = evidence_prompt(question, evidence, follow_up=bool(turns))
        text, why = await ask_model(self.model, INSTRUCTIONS, prompt, usage, history=turns)
        steps.append("asked the model" + (f": {why}" if why else ""))
        if text is None:
            return None, why
        try:
            return _Reply.model_validate(read_json_object(text)), None
        except (ValueError, ValidationError) as error:
            problem = _problem(error)
        steps.append(f"the model's reply is not the JSON asked for ({problem}): asked again")
        again = [*turns, ("user", prompt), ("assistant", text)]
        correction = CORRECTION.format(problem=problem)
        text, why = await ask_model(self.model, INSTRUCTIONS, correction, usage, history=again)
        steps.append("asked the model again" + (f": {why}" if why else ""))
        if text is None:
            return None, why
        try:
            return _Reply.model_validate(read_json_object(text)), None
        except (ValueError, ValidationError) as error:
            problem = _problem(error)
        steps.append(f"the model's second reply is not the JSON asked for either ({problem})")
        return None, f"the model's reply could not be read, twice ({problem})"

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
