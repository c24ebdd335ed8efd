"""Answers from the shop's policies: verified citations, confidence, escalation to a person."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from handrail import Agent, Answer, Engine, Reject, Runtime
from handrail.documents import Chunk
from handrail.documents._answer import Answerer, evidence_prompt, verify_quote
from handrail.documents._embed import MiniLMEmbedder
from handrail.documents._library import Library
from handrail.documents._tools import document_tools
from handrail.documents.testing import extractive_model
from handrail.messages import TextPart
from handrail.models import ModelRequest, ModelResponse, Price, Usage, price_of
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


@dataclass(frozen=True)
class Found:
    """A piece of evidence, as the answer path reads it (a chunk and its relevance)."""

    chunk: Chunk
    relevance: float


def found(source: str, text: str, relevance: float, index: int = 0) -> Found:
    chunk = Chunk(id=f"{source}:{index}", source=source, text=text, index=index, start=0,
                  end=len(text))  # fmt: skip
    return Found(chunk=chunk, relevance=relevance)


class Shelf:
    """A library that returns the evidence it is given (at most top_k, none under the
    threshold, in the order given), and records the queries."""

    def __init__(self, evidence: list[Found]) -> None:
        self.evidence = evidence
        self.queries: list[str] = []

    async def retrieve(
        self, query: str, *, top_k: int = 5, min_relevance: float = 0.5, **_: Any
    ) -> list[Found]:
        self.queries.append(query)
        return [e for e in self.evidence if e.relevance >= min_relevance][:top_k]


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


async def test_with_nothing_above_the_threshold_no_model_is_asked() -> None:
    model = extractive_model()
    reply = await Answerer(Shelf([]), model).answer("How long does a refund take?")
    assert model.calls == []
    assert reply.escalated and reply.confidence == 0.0 and reply.answer == ""
    assert reply.escalation_reason == (
        "nothing in the documents reaches relevance 0.5: no model was asked to answer"
    )
    assert reply.steps == [
        "retrieved 0 excerpt(s) at relevance ≥ 0.5",
        f"escalated: {reply.escalation_reason}",
    ]
    assert (reply.input_tokens, reply.output_tokens) == (0, 0)


async def test_an_answer_without_citations_or_with_a_bad_reply_escalates(library: Library) -> None:
    question = "How long does a refund take to reach my card?"
    uncited = json.dumps({"answer": "About a week.", "citations": [], "answerable": True})
    for model, why in [
        (replying(uncited), "no citation"),
        (replying("Sure! About a week.", "Sure! About a week."), "could not be read, twice"),
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
    model = ScriptedModel([cut, '{"answer": "never asked for", "citations": []}'])
    reply = await Answerer(library, model).answer("How long does a refund take?")
    assert reply.escalated and reply.answer == ""
    assert "did not finish its reply (length)" in (reply.escalation_reason or "")
    assert model.remaining == 1  # not retried as "malformed": an unfinished reply is not used


async def test_a_reply_that_did_not_arrive_whole_is_not_retried_as_malformed() -> None:
    from handrail.exceptions import IncompleteResponseError

    def cut(request: ModelRequest) -> str:
        raise IncompleteResponseError("cut", provider="openai", missing="finish_reason")

    model = FunctionModel(cut)
    shelf = Shelf([found("shipping.pdf", SHIPPING, 0.9)])
    reply = await Answerer(shelf, model).answer("How much does express shipping cost?")
    assert len(model.calls) == 1
    assert reply.escalated and reply.answer == "" and reply.confidence == 0.0
    assert reply.escalation_reason == "the model failed (IncompleteResponseError)"


async def test_a_malformed_reply_is_corrected_once_saying_what_was_wrong(library: Library) -> None:
    question = "How long does a refund take to reach my card?"
    honest = await Answerer(library, extractive_model()).answer(question)
    number = await excerpt_of(library, question, honest.citations[0].chunk_id)
    good = json.dumps(
        {"answer": honest.answer, "citations": [{"excerpt": number, "quote": honest.answer}]}
    )
    for bad, problem in [
        ("Sure! About a week.", "it is not a JSON object"),
        ('{"answer": "About a week.", "citations": "all of them"}', "citations: Input should"),
    ]:
        model = replying(bad, good)
        reply = await Answerer(library, model).answer(question)
        assert not reply.escalated and reply.confidence == honest.confidence
        assert reply.answer == honest.answer and len(reply.citations) == 1
        first, second = model.calls
        # The retry is the same conversation, then the bad reply, then what was wrong with it.
        assert [m.role for m in second.messages] == ["user", "assistant", "user"]
        assert second.messages[0].text == first.messages[-1].text
        assert second.messages[1].text == bad
        assert problem in second.messages[2].text
        assert "asked the model again" in reply.steps


async def test_a_malformed_reply_twice_escalates_with_the_reason(library: Library) -> None:
    model = replying("Sure! About a week.", '{"answer": 7}')
    reply = await Answerer(library, model).answer("How long does a refund take?")
    assert len(model.calls) == 2
    assert reply.escalated and reply.confidence == 0.0 and reply.answer == ""
    assert (reply.escalation_reason or "").startswith(
        "the model's reply could not be read, twice (it does not fit the shape asked for (answer:"
    )


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


# -- what the steps and the answer report -------------------------------------------------------

SHIPPING = (
    "Standard shipping within the European Union takes 3 to 5 business days and costs 4.90 "
    "euros. Express shipping within the European Union takes 1 to 2 business days and costs "
    "12.50 euros, whatever the size of the order."
)
REFUNDS = (
    "Refunds go back to the card or account you paid with. After a person approves it, a "
    "refund reaches your card within 5 to 10 business days."
)


async def test_the_steps_report_the_best_relevance_not_the_first() -> None:
    shelf = Shelf([found("refunds.md", REFUNDS, 0.62), found("shipping.pdf", SHIPPING, 0.91)])
    reply = await Answerer(shelf, extractive_model()).answer("How much does express cost?")
    assert reply.steps[0] == "retrieved 2 excerpt(s) at relevance ≥ 0.5 (best 0.91)"
    (citation,) = reply.citations
    assert citation.source == "shipping.pdf" and reply.confidence == 0.91


async def test_cost_is_reported_where_the_models_price_is_known() -> None:
    shelf = Shelf([found("shipping.pdf", SHIPPING, 0.9)])
    usage = Usage(requests=1, input_tokens=2_000, cached_tokens=1_000, output_tokens=100)

    def answer(request: ModelRequest) -> ModelResponse:
        text = _extractive(request)
        return ModelResponse(parts=[TextPart(text=text)], usage=usage, finish_reason="stop")

    priced = await Answerer(shelf, FunctionModel(answer, name="openai:gpt-4o-mini")).answer(
        "How much does express shipping cost?"
    )
    # 1,000 fresh input tokens at 0.15, 1,000 cached at 0.075, 100 output at 0.60 per million
    assert priced.cost_usd == pytest.approx((150 + 75 + 60) / 1_000_000)
    assert (priced.input_tokens, priced.output_tokens) == (2_000, 100)
    unknown = await Answerer(shelf, FunctionModel(answer, name="mine")).answer("Express cost?")
    assert unknown.cost_usd is None  # no price known: none made up
    own = Price(input=1.0, output=2.0)
    mine = await Answerer(shelf, FunctionModel(answer, name="mine"), price=own).answer("Cost?")
    assert mine.cost_usd == pytest.approx((2_000 * 1.0 + 100 * 2.0) / 1_000_000)


def test_list_prices_are_known_only_for_named_models() -> None:
    assert price_of("anthropic:claude-sonnet-4-6") == Price(
        input=3.0, cached_input=0.3, output=15.0
    )
    assert price_of("openai-responses:gpt-5") == price_of("openai:gpt-5") is not None
    for unknown in ("openai:gpt-4o-mini-2024-07-18", "openai-compatible:gpt-4o-mini", "x"):
        assert price_of(unknown) is None


def _extractive(request: ModelRequest) -> str:
    from handrail.documents.testing import extractive_reply

    return extractive_reply(request)


# -- follow-up questions --------------------------------------------------------------------


async def test_a_follow_up_question_is_answered_from_the_conversation_before_it(
    library: Library,
) -> None:
    model = extractive_model()
    history = [
        ("user", "How much does express shipping cost?"),
        ("assistant", "Express shipping costs 12.50 euros."),
    ]
    reply = await Answerer(library, model).answer("And how long does it take?", history=history)
    assert not reply.escalated, reply.steps
    assert "1 to 2 business days" in reply.answer
    assert reply.citations[0].source == "shipping.pdf"
    assert reply.steps[0].endswith("with the conversation's last question")
    # The earlier turns went first, as the messages they were; the evidence came after them.
    (request,) = model.calls
    assert [(m.role, m.text) for m in request.messages[:2]] == history
    last = request.messages[-1].text
    assert last.startswith("Excerpts:") and "12.50 euros." not in last.split("<excerpt>")[0]
    assert last.endswith(
        "Question (a follow-up to the conversation above): And how long does it take?"
    )

    alone = await Answerer(library, extractive_model()).answer("And how long does it take?")
    assert "1 to 2 business days" not in alone.answer  # without the conversation: not known


async def test_history_keeps_what_was_said_and_refuses_an_unknown_role() -> None:
    from handrail.messages import Message

    model = extractive_model()
    shelf = Shelf([found("shipping.pdf", SHIPPING, 0.9)])
    history: list[Any] = [
        Message(id="s", role="system", parts=[TextPart(text="You are a shop.")]),
        Message(id="u", role="user", parts=[TextPart(text="How much is express shipping?")]),
        Message(id="a", role="assistant", parts=[call("documents.answer", question="x")]),
        Message(id="k", role="assistant", parts=[TextPart(text="thinking")], scratch=True),
        ("assistant", "12.50 euros."),
    ]
    await Answerer(shelf, model, history_limit=1).answer("And how long?", history=history)
    (request,) = model.calls
    assert [(m.role, m.text) for m in request.messages[:-1]] == [("assistant", "12.50 euros.")]
    await Answerer(shelf, model).answer("And how long?", history=history)
    assert [(m.role, m.text) for m in model.calls[-1].messages[:-1]] == [
        ("user", "How much is express shipping?"),
        ("assistant", "12.50 euros."),
    ]
    assert shelf.queries[-1] == "How much is express shipping?\nAnd how long?"
    with pytest.raises(ValueError, match=r"history: a turn's role is 'system'; pass \('user'"):
        await Answerer(shelf, model).answer("And how long?", history=[("system", "Be brief.")])


async def test_the_answer_tool_passes_the_sessions_earlier_turns(library: Library) -> None:
    from handrail.store import MemoryStore

    answerer = Answerer(library, extractive_model())
    steps: list[Any] = [
        [call("documents.answer", question="How much does express shipping cost?")],
        "12.50 euros.",
        [call("documents.answer", question="And how long does it take?")],
        "Done.",
    ]
    engine = desk(MemoryStore(), answerer, steps)
    for text in ("How much does express shipping cost?", "And how long does it take?"):
        events = [e async for e in engine.submit("s1", text)]
        assert events[-1].type == "run-completed"
    state = await engine.session("s1")
    results = [p.result for m in state.messages for p in m.tool_calls]
    second = results[-1]
    assert second is not None and second.ok
    assert "1 to 2 business days" in second.data["answer"]


# -- the offline model: answers only what the excerpts support -----------------------------


def ask_offline(question: str, *evidence: Found) -> dict[str, Any]:
    model = extractive_model()
    reply = model_reply(model, evidence_prompt(question, list(evidence)))  # type: ignore[arg-type]
    return json.loads(reply)


def model_reply(model: FunctionModel, prompt: str) -> str:
    from handrail.documents._answer import INSTRUCTIONS
    from handrail.documents.testing import extractive_reply
    from handrail.messages import Message

    request = ModelRequest(
        agent="documents",
        instructions=INSTRUCTIONS,
        messages=[Message(id="m", role="user", parts=[TextPart(text=prompt)])],
    )
    return extractive_reply(request)


def test_the_offline_model_refuses_what_the_excerpts_do_not_answer() -> None:
    excerpts = [found("refunds.md", REFUNDS, 0.9), found("shipping.pdf", SHIPPING, 0.9, 1)]
    # Each word of the question is somewhere in the excerpts, but no sentence speaks to it.
    reply = ask_offline("Do you refund shipping to Norway?", *excerpts)
    assert reply == {"answer": "The documents do not say.", "citations": [], "answerable": False}
    assert ask_offline("Can I pay with a gift voucher?", *excerpts)["answerable"] is False


def test_the_offline_model_quotes_the_sentence_that_answers() -> None:
    excerpts = [found("refunds.md", REFUNDS, 0.9), found("shipping.pdf", SHIPPING, 0.9, 1)]
    reply = ask_offline("How many days until a refund reaches my card?", *excerpts)
    assert reply["answerable"] is True
    assert reply["citations"] == [
        {
            "excerpt": 1,
            "quote": "After a person approves it, a refund reaches your card within 5 to 10 "
            "business days.",
        }
    ]


def test_the_offline_model_cites_two_excerpts_for_a_two_part_question() -> None:
    excerpts = [found("refunds.md", REFUNDS, 0.9), found("shipping.pdf", SHIPPING, 0.9, 1)]
    reply = ask_offline(
        "What does express shipping cost, and when does a refund reach my card?", *excerpts
    )
    assert reply["answerable"] is True
    assert sorted(c["excerpt"] for c in reply["citations"]) == [1, 2]
    assert "12.50 euros" in reply["answer"] and "5 to 10 business days" in reply["answer"]
