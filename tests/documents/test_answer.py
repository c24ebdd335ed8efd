"""Answers from the shop's policies: verified citations, confidence, escalation to a person."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from handrail import Agent, Answer, Engine, Reject, Runtime
from handrail.documents._answer import Answerer, evidence_prompt, verify_quote
from handrail.documents._embed import MiniLMEmbedder
from handrail.documents._library import Library
from handrail.documents._tools import document_tools
from handrail.documents.testing import extractive_model
from handrail.models import ModelRequest, ModelResponse, Usage
from handrail.store import SqliteStore
from handrail.testing import FunctionModel, ScriptedModel, call, sequential_ids

POLICIES = Path(__file__).parents[2] / "src" / "handrail" / "demo" / "policies"


@pytest.fixture(scope="module")
def embedder() -> Iterator[MiniLMEmbedder]:
    yield MiniLMEmbedder()


@pytest.fixture
async def library(tmp_path: Path, embedder: MiniLMEmbedder) -> AsyncIterator[Library]:
    async with Library.open(tmp_path / "index", embedder=embedder) as library:
        report = await library.ingest(POLICIES)
        assert report.skipped == [] and report.chunks_written > 0
        yield library


async def excerpt_of(library: Library, question: str, chunk_id: str) -> int:
    """The number the answering prompt gives the chunk `chunk_id` (from 1)."""
    found = [e.chunk.id for e in await library.retrieve(question)]
    return found.index(chunk_id) + 1


def replying(*texts: str) -> FunctionModel:
    """A model that gives these replies in turn (and records the prompts)."""
    replies = list(texts)

    def reply(request: ModelRequest) -> str:
        return replies.pop(0)

    return FunctionModel(reply)


# -- verification of quotes -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("quote", "found"),
    [
        ("reaches your card within 5 to 10 business days", True),
        ("reaches  your card\nwithin 5 to 10 business days", True),  # whitespace is not content
        ("\u201cRefunds go back to the card\u201d", True),  # typographic quotes around it
        ("Refunds go back ... within 5 to 10 business days", True),  # an elision, in order
        ("within 5 to 10 business days ... Refunds go back", False),  # out of order
        ("reaches your card within 3 business days", False),  # a changed number
        ("REACHES YOUR CARD", False),  # a quote is a copy: case counts
        ("", False),
        ("..", False),
    ],
)
def test_a_quote_counts_only_if_it_occurs_word_for_word(quote: str, found: bool) -> None:
    text = (
        "Refunds go back to the card or account you paid with. After a person approves it, "
        "a refund reaches your card within 5 to 10 business days."
    )
    assert verify_quote(quote, text) is found


# -- answering --------------------------------------------------------------------------------


async def test_a_policy_question_is_answered_with_a_verified_citation(library: Library) -> None:
    answerer = Answerer(library, extractive_model())
    reply = await answerer.answer("How long does a refund take to reach my card?")
    assert not reply.escalated and reply.confidence >= 0.3
    assert "5 to 10 business days" in reply.answer
    (citation,) = reply.citations
    assert citation.source == "refunds.md" and citation.page is None
    assert citation.quote in reply.answer and 0.5 <= citation.relevance <= 1.0
    assert reply.dropped_citations == 0
    assert reply.steps[0].startswith("retrieved ")


async def test_a_citation_from_the_pdf_names_its_page(library: Library) -> None:
    answerer = Answerer(library, extractive_model())
    reply = await answerer.answer("What happens if my parcel is lost?")
    assert not reply.escalated
    (citation,) = reply.citations
    assert (citation.source, citation.page) == ("shipping.pdf", 3)


async def test_a_quote_that_is_not_in_its_excerpt_is_dropped_and_lowers_confidence(
    library: Library,
) -> None:
    question = "How long does a refund take to reach my card?"
    honest = await Answerer(library, extractive_model()).answer(question)
    number = await excerpt_of(library, question, honest.citations[0].chunk_id)
    invented = json.dumps(
        {
            "answer": honest.answer,
            "citations": [
                {"excerpt": number, "quote": honest.citations[0].quote},
                {"excerpt": number, "quote": "refunds are instant"},  # not in the excerpt
                {"excerpt": 9, "quote": "no such excerpt"},
            ],
            "answerable": True,
        }
    )
    reply = await Answerer(library, replying(invented)).answer(question)
    assert len(reply.citations) == 1 and reply.dropped_citations == 2
    assert reply.confidence == pytest.approx(honest.confidence / 3, abs=1e-3)


async def test_a_question_the_documents_cannot_answer_escalates(library: Library) -> None:
    model = extractive_model()
    reply = await Answerer(library, model).answer("Do you price-match other shops?")
    assert reply.escalated and reply.confidence == 0.0 and reply.citations == []
    assert reply.escalation_reason is not None
    # Nothing passed the threshold: the model was told so, and not to guess.
    prompt = model.calls[0].messages[-1].parts[0].text  # type: ignore[union-attr]
    assert "There is NO evidence" in prompt and "do not guess" in prompt


async def test_an_answer_without_citations_or_with_a_bad_reply_escalates(library: Library) -> None:
    question = "How long does a refund take to reach my card?"
    uncited = json.dumps({"answer": "About a week.", "citations": [], "answerable": True})
    for model, why in [
        (replying(uncited), "no citation"),
        (replying("Sure! About a week."), "could not be read"),
    ]:
        reply = await Answerer(library, model).answer(question)
        assert reply.escalated and reply.confidence == 0.0
        assert why in (reply.escalation_reason or "")


async def test_a_reply_cut_by_the_token_limit_is_never_used(library: Library) -> None:
    cut = ModelResponse(
        parts=[],
        usage=Usage(requests=1, input_tokens=10, output_tokens=5),
        finish_reason="length",
    )
    model = ScriptedModel([cut])
    reply = await Answerer(library, model).answer("How long does a refund take?")
    assert reply.escalated and reply.answer == ""
    assert "did not finish its reply (length)" in (reply.escalation_reason or "")


async def test_the_self_check_folds_into_the_confidence(library: Library) -> None:
    question = "How long does a refund take to reach my card?"
    plain = await Answerer(library, extractive_model()).answer(question)
    number = await excerpt_of(library, question, plain.citations[0].chunk_id)
    cited = {"excerpt": number, "quote": plain.citations[0].quote}
    answer = json.dumps({"answer": plain.answer, "citations": [cited]})
    checked = Answerer(library, replying(answer, '{"support": 0.5}'), self_check=True)
    reply = await checked.answer(question)
    assert reply.confidence == pytest.approx(plain.confidence * 0.5, abs=1e-3)
    assert "self-check: support 0.50" in reply.steps


def test_the_prompt_numbers_the_excerpts_with_source_page_and_relevance() -> None:
    from handrail.documents import Chunk
    from handrail.documents._library import Evidence

    chunk = Chunk(id="c:0", source="shipping.pdf", text="Express costs 12.50 euros.", index=0,
                  start=0, end=26, page=1, headings=("Shipping",))  # fmt: skip
    evidence = Evidence(chunk=chunk, relevance=0.81, cosine=0.6, keyword_rank=1, dense_rank=1,
                        fused_rank=1, keyword=1.0)  # fmt: skip
    prompt = evidence_prompt("How much is express?", [evidence])
    assert prompt.startswith("Excerpts:\n\n[1] shipping.pdf, page 1, section Shipping")
    assert "(relevance 0.81)\n<excerpt>\nExpress costs 12.50 euros.\n</excerpt>" in prompt
    assert prompt.endswith("Question: How much is express?")


# -- as tools: escalation through the suspension primitive -------------------------------------


def desk(store: Any, answerer: Answerer, steps: list[Any]) -> Engine:
    agent = Agent("policies", tools=document_tools(answerer))
    runtime = Runtime(model=ScriptedModel(steps), ids=sequential_ids())
    return Engine(agent, store=store, runtime=runtime)


async def test_an_unanswerable_question_asks_a_person_whose_answer_becomes_a_note(
    library: Library, tmp_path: Path
) -> None:
    question = "Do you price-match other shops?"
    answerer = Answerer(library, extractive_model())
    steps = [[call("documents.answer", question=question)], "We match prices, says Ana."]
    async with SqliteStore(tmp_path / "sessions.db") as store:
        events = [e async for e in desk(store, answerer, steps).submit("s1", question)]
        asked = next(e for e in events if e.type == "input-required")
        assert question in (asked.prompt or "") and events[-1].type == "run-suspended"

    # A restart while it waits: the card is still there; a person answers.
    async with SqliteStore(tmp_path / "sessions.db") as store:
        engine = desk(store, answerer, steps[1:])
        answer = "Yes: we match any EU shop's price for the same item, on request."
        await engine.resolve("s1", asked.tool_call_id, Answer(output=answer, by="ana"))
        events = [e async for e in engine.resume("s1")]
        (done,) = [e for e in events if e.type == "tool-call-completed"]
        assert done.ok and events[-1].type == "run-completed"
        state = await engine.session("s1")
    result = state.messages[1].tool_calls[0].result
    assert result is not None
    assert result.data["answer"] == answer and result.data["answered_by"] == "ana"
    assert result.data["citations"][0]["source"] == "note:ana"

    # The next time, retrieval finds the note, with the person as its source.
    later = await answerer.answer("Will you match another shop's price?")
    assert not later.escalated
    assert later.citations[0].source == "note:ana"


async def test_a_declined_question_tells_the_model(library: Library) -> None:
    from handrail.store import MemoryStore

    answerer = Answerer(library, extractive_model())
    question = "Do you price-match other shops?"
    engine = desk(MemoryStore(), answerer, [[call("documents.answer", question=question)], "OK."])
    events = [e async for e in engine.submit("s1", question)]
    asked = next(e for e in events if e.type == "input-required")
    await engine.resolve("s1", asked.tool_call_id, Reject(reason="ask sales", by="bo"))
    events = [e async for e in engine.resume("s1")]
    (done,) = [e for e in events if e.type == "tool-call-completed"]
    assert not done.ok


async def test_retrieve_and_extract_tools(library: Library) -> None:
    from handrail.store import MemoryStore

    answerer = Answerer(library, extractive_model())
    steps = [
        [
            call("documents.retrieve", query="express shipping cost", top_k=2),
            call(
                "documents.extract", text="Order: A1042\nTotal: 84 EUR", fields=["Order", "Email"]
            ),
        ],
        "Done.",
    ]
    engine = desk(MemoryStore(), answerer, steps)
    events = [e async for e in engine.submit("s1", "go")]
    assert events[-1].type == "run-completed"
    state = await engine.session("s1")
    found, extracted = (p.result for p in state.messages[1].tool_calls)
    assert found is not None and extracted is not None
    assert found.data[0]["source"] == "shipping.pdf" and found.data[0]["page"] == 1
    assert "12.50 euros" in found.data[0]["text"]
    assert extracted.data == {"Order": "A1042", "Email": None}  # not in the text: null
