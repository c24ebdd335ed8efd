"""The documents as tools any handrail agent can use.

- `documents.answer(question)`: the grounded answer (`Answerer.answer`), with verified
  citations and a confidence; the session's earlier turns go with it (`ToolContext.messages`),
  so a follow-up question ("and how long does it take?") is understood. Below the confidence
  threshold it asks a person (`AskPerson`): the call waits on a `question` card, and the
  person's answer becomes the result, stored as a note that later retrieval finds with that
  person as its source.
- `documents.retrieve(query, top_k)`: the evidence itself (read), for agents that write
  their own answer.
- `documents.extract(text, fields)`: structured extraction by one model call; a field the
  text does not state is `null`, never guessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationError

from ..exceptions import AskPerson, ModelRetry
from ..messages import Message
from ..tools import Tool, ToolContext, tool
from ._answer import Answerer, Citation, DocumentAnswer
from ._ask import ask_model, read_json_object

__all__ = ["Passage", "document_tools"]

EXTRACT = """\
You extract fields from a text. Reply with one JSON object and nothing else, with exactly the
requested field names as keys. A field's value is what the text states, copied or minimally
normalised (a number as a number); when the text does not state it, the value is null. Never
guess, never use outside knowledge.
"""


class Passage(BaseModel):
    """One piece of evidence, as `documents.retrieve` gives it."""

    source: str
    page: int | None = None
    section: str | None = None
    text: str
    relevance: float
    chunk_id: str


def _digest(answer: dict[str, Any]) -> dict[str, Any]:
    """What a page shows of an answer (as stored): its confidence, who answered, its sources."""
    digest: dict[str, Any] = {"confidence": round(answer["confidence"], 2)}
    if answer.get("answered_by"):
        digest["answered by"] = answer["answered_by"]
    digest["citations"] = [
        {"source": c["source"], "page": c.get("page"), "quote": c["quote"]}
        for c in answer["citations"]
    ]
    return digest


def _before(messages: Sequence[Message], call_id: str) -> Sequence[Message]:
    """The turns before the one that makes the call `call_id`: what a follow-up refers to.

    The turn's own user message is left out: the call's `question` is what it asks.
    """
    end = next(
        (i for i, m in enumerate(messages) if any(p.id == call_id for p in m.tool_calls)),
        len(messages),
    )
    start = next((i for i in range(end - 1, -1, -1) if messages[i].role == "user"), end)
    return messages[:start]


def document_tools(answerer: Answerer) -> list[Tool[Any]]:
    """`documents.answer`, `documents.retrieve` and `documents.extract` over `answerer`."""
    library = answerer.library

    @tool(
        name="documents.answer",
        permission="read",
        digest=_digest,
        summary=lambda a: f"confidence {a['confidence']:.2f}, {len(a['citations'])} citation(s)",
    )
    async def answer(ctx: ToolContext[Any], question: str) -> DocumentAnswer:
        """Answer a question from the company's documents, with citations and a confidence.

        Args:
            ctx: the call's context (on a second run, a person's answer).
            question: the user's question, in full.
        """
        if ctx.answer is not None:  # a person answered what the documents could not
            who = ctx.answered_by or "a person"
            note = await library.add_note(ctx.answer, author=who, question=question)
            return DocumentAnswer(
                question=question,
                answer=ctx.answer,
                citations=[
                    Citation(source=note.source, quote=ctx.answer, chunk_id=note.id, relevance=1.0)
                ],
                confidence=1.0,
                escalated=True,
                escalation_reason="the documents could not answer it; a person did",
                answered_by=who,
                steps=["answered by a person", f"stored as a note ({note.source})"],
            )
        reply = await answerer.answer(question, history=_before(ctx.messages, ctx.tool_call_id))
        if reply.escalated:
            raise AskPerson(
                f"A user asks: {question!r}. The documents do not answer it well enough "
                f"({reply.escalation_reason}). Please answer: your answer goes to the user "
                f"and is kept as a note for next time."
            )
        return reply

    @tool(name="documents.retrieve", permission="read")
    async def retrieve(query: str, top_k: int = 5) -> list[Passage]:
        """Find the passages of the company's documents that bear on a query.

        Args:
            query: what to look for.
            top_k: how many passages, at most (1-20).
        """
        if not 1 <= top_k <= 20:
            raise ModelRetry("top_k must be between 1 and 20.")
        found = await library.retrieve(query, top_k=top_k, min_relevance=answerer.min_relevance)
        return [
            Passage(
                source=e.chunk.source,
                page=e.chunk.page,
                section=" > ".join(e.chunk.headings) or None,
                text=e.chunk.text,
                relevance=round(e.relevance, 4),
                chunk_id=e.chunk.id,
            )
            for e in found
        ]

    @tool(name="documents.extract", permission="read")
    async def extract(
        text: str, fields: Annotated[list[str], Field(min_length=1, max_length=50)]
    ) -> dict[str, Any]:
        """Extract named fields from a text; a field the text does not state is null.

        Args:
            text: the text to read (a passage, an e-mail, a form).
            fields: the names of the fields to extract.
        """
        prompt = f"Fields: {', '.join(fields)}\n\n<text>\n{text}\n</text>"
        reply, why = await ask_model(answerer.model, EXTRACT, prompt, agent="documents.extract")
        if reply is None:
            raise ModelRetry(f"The extraction failed: {why}.")
        try:
            found = read_json_object(reply)
        except (ValueError, ValidationError):
            raise ModelRetry("The extraction's reply was not the JSON asked for.") from None
        if not isinstance(found, dict):
            raise ModelRetry("The extraction's reply was not a JSON object.")
        return {name: found.get(name) for name in fields}

    return [answer, retrieve, extract]
