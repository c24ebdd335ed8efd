"""Compaction: the view fits the budget, the history is never changed, nothing is lost."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from handrail import (
    MESSAGES,
    ApprovalCardPart,
    ConfigError,
    Message,
    ModelError,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResult,
)
from handrail.compaction import (
    KEPT_HEADING,
    SUMMARIZER_INSTRUCTIONS,
    SUMMARY_HEADING,
    Compacted,
    Compaction,
    Retention,
    Summary,
    compact,
)
from handrail.models import ModelChunk, ModelRequest, TextChunk, ToolDefinition, Usage
from handrail.models._anthropic_format import anthropic_messages, anthropic_request
from handrail.models._openai_format import openai_request, request_tool_names
from handrail.models._wire import ToolNames
from handrail.testing import FunctionModel, ScriptedModel, call
from handrail.tokens import count_text, count_tokens

INSTRUCTIONS = "You help customers with their orders."
LOOKUP = ToolDefinition(
    name="orders.lookup",
    description="Look an order up.",
    parameters={"type": "object", "properties": {"order_id": {"type": "string"}}},
)
MODEL = FunctionModel(lambda request: "unused", name="openai:gpt-4o")


def user(id: str, text: str) -> Message:
    return Message(id=id, role="user", parts=[TextPart(text=text)])


def nudge(id: str) -> Message:
    return Message(id=id, role="user", parts=[TextPart(text="Use your tools.", synthetic=True)])


def lookup(id: str, data: Any, *, summary: str | None = None) -> ToolCallPart:
    return ToolCallPart(
        id=id,
        name="orders.lookup",
        args={"order_id": id},
        status="completed",
        result=ToolResult(data=data, summary=summary),
    )


def turn(t: int, *, question: str = "", data: Any = None) -> list[Message]:
    """One user turn: a question, a lookup, an answer."""
    data = data if data is not None else {"id": f"A{t}", "status": "shipped"}
    return [
        user(f"u{t}", question or f"Question {t}: where is my order A{t}?"),
        Message(
            id=f"c{t}",
            role="assistant",
            parts=[lookup(f"call{t}", data, summary=f"Order A{t}: shipped")],
        ),
        Message(id=f"a{t}", role="assistant", parts=[TextPart(text=f"A{t} shipped yesterday.")]),
    ]


def conversation(turns: int) -> list[Message]:
    return [m for t in range(turns) for m in turn(t)]


def request(messages: list[Message], **kwargs: Any) -> ModelRequest:
    return ModelRequest(
        agent="support", instructions=INSTRUCTIONS, messages=messages, tools=[LOOKUP], **kwargs
    )


def tokens(messages: list[Message], model: Any = MODEL) -> int:
    return count_tokens(messages, model, instructions=INSTRUCTIONS, tools=[LOOKUP])


def writer(*texts: str) -> FunctionModel:
    """A summarizer that writes `texts` in turn (the last one again when they run out)."""

    def write(request: ModelRequest) -> str:
        return texts[min(len(summarizer.calls), len(texts)) - 1]

    summarizer = FunctionModel(write, name="summarizer")
    return summarizer


def failing(error: Exception, *, after: int = 0, text: str = "S") -> FunctionModel:
    """A summarizer that writes `text` `after` times, then raises `error`."""

    def write(request: ModelRequest) -> str:
        if len(summarizer.calls) > after:
            raise error
        return text

    summarizer = FunctionModel(write, name="summarizer")
    return summarizer


def summary_message(summary: Summary) -> Message:
    return Message(
        id=f"summary-{summary.upto}",
        role="user",
        parts=[TextPart(text=f"{SUMMARY_HEADING}\n\n{summary.text}", synthetic=True)],
    )


def prompt(summarizer: FunctionModel, index: int = 0) -> str:
    (message,) = summarizer.calls[index].messages
    return message.text


def dumped(messages: list[Message]) -> Any:
    return MESSAGES.dump_python(messages, mode="json")


# -- Under budget: nothing happens ----------------------------------------------------------------


async def test_a_request_under_budget_is_sent_as_it_is():
    messages = conversation(3)
    summarizer = writer("S")
    config = Compaction(max_tokens=tokens(messages), summarizer=summarizer)
    stored = Summary(text="old", upto="x", messages=0, tokens=1)

    result = await compact(request(messages), config=config, model=MODEL, summary=stored)

    assert result == Compacted(messages=messages, summary=stored, tokens=tokens(messages))
    assert result.messages is messages
    assert result.summary is stored
    assert summarizer.calls == []


# -- Over budget: summary + recent turns ----------------------------------------------------------


async def test_over_budget_the_turns_before_the_recent_ones_become_a_summary():
    messages = conversation(6)
    history = dumped(messages)
    summarizer = writer("Orders A0-A3 all shipped.")
    config = Compaction(max_tokens=tokens(messages) - 1, summarizer=summarizer)

    result = await compact(request(messages), config=config, model=MODEL)

    summary = Summary(
        text="Orders A0-A3 all shipped.",
        upto="a3",
        messages=12,
        tokens=count_text("Orders A0-A3 all shipped.", MODEL),
    )
    view = [summary_message(summary), *messages[12:]]
    assert result == Compacted(
        messages=view, summary=summary, tokens=tokens(view), usage=Usage(requests=1)
    )
    assert all(a is b for a, b in zip(result.messages[1:], messages[12:], strict=True))
    assert dumped(messages) == history
    (sent,) = summarizer.calls
    assert sent.instructions == SUMMARIZER_INSTRUCTIONS
    assert sent.tools == []
    assert sent.tool_choice == "none"


async def test_the_summarizer_reads_the_dropped_messages_as_a_transcript():
    messages = [
        *turn(0),
        nudge("n0"),
        Message(
            id="r0",
            role="assistant",
            parts=[ReasoningPart(text="They want a refund.", provider="anthropic", signature="s")],
        ),
        *turn(1),
        *turn(2),
    ]
    messages[1].parts.append(
        ToolCallPart(
            id="bad",
            name="orders.refund",
            raw_args='{"order_id": "A0"',
            status="failed",
            result=ToolResult.failure("amount is required"),
        )
    )
    summarizer = writer("S")
    config = Compaction(max_tokens=tokens(messages) - 1, summarizer=summarizer, instructions="Sum.")

    await compact(request(messages), config=config, model=MODEL)

    assert prompt(summarizer) == (
        "<conversation>\n"
        "User: Question 0: where is my order A0?\n"
        'Tool call orders.lookup({"order_id":"call0"}) returned: {"id":"A0","status":"shipped"}\n'
        'Tool call orders.refund({"order_id": "A0") returned: Error: amount is required\n'
        "Assistant: A0 shipped yesterday.\n"
        "User (automatic): Use your tools.\n"
        "</conversation>"
    )


async def test_a_stored_summary_is_extended_with_only_the_messages_after_it():
    messages = conversation(6)
    summarizer = writer("A0-A3 shipped.", "A0-A7 shipped.")
    config = Compaction(
        max_tokens=tokens(messages) - 1, summarizer=summarizer, instructions="Summarise."
    )
    first = await compact(request(messages), config=config, model=MODEL)

    messages = conversation(10)  # four more turns
    second = await compact(request(messages), config=config, model=MODEL, summary=first.summary)

    assert second.summary == Summary(
        text="A0-A7 shipped.", upto="a7", messages=24, tokens=count_text("A0-A7 shipped.", MODEL)
    )
    assert second.messages == [summary_message(second.summary), *messages[24:]]
    assert len(summarizer.calls) == 2
    sent = prompt(summarizer, 1)
    assert sent.startswith(
        "<summary-so-far>\nA0-A3 shipped.\n</summary-so-far>\n\n<new-messages>\n"
    )
    assert [t for t in range(10) if f"Question {t}:" in sent] == [4, 5, 6, 7]


async def test_a_stored_summary_that_still_fits_costs_no_summarizer_call():
    messages = conversation(6)
    summarizer = writer("A0-A3 shipped.")
    config = Compaction(max_tokens=tokens(messages) - 1, summarizer=summarizer)
    first = await compact(request(messages), config=config, model=MODEL)
    messages.append(user("u6", "Thanks!"))

    again = await compact(request(messages), config=config, model=MODEL, summary=first.summary)

    assert again.summary is first.summary
    assert again.messages == [*first.messages, messages[-1]]
    assert len(summarizer.calls) == 1
    assert again.usage == Usage()


async def test_a_summarised_history_that_fits_a_bigger_budget_is_sent_whole_again():
    messages = conversation(30)
    summarizer = writer("S")
    small = Compaction(max_tokens=300, summarizer=summarizer, instructions="Summarise.")
    first = await compact(request(messages), config=small, model=MODEL)
    assert first.summary is not None and first.summary.messages == 84

    big = Compaction(max_tokens=tokens(messages), summarizer=summarizer)
    again = await compact(request(messages), config=big, model=MODEL, summary=first.summary)

    assert again == Compacted(messages=messages, summary=first.summary, tokens=tokens(messages))


async def test_a_summary_that_no_longer_matches_the_history_is_rewritten_from_the_start():
    messages = conversation(6)
    summarizer = writer("Fresh.")
    config = Compaction(max_tokens=tokens(messages) - 1, summarizer=summarizer)
    stale = Summary(text="Of another session.", upto="elsewhere", messages=3, tokens=5)

    result = await compact(request(messages), config=config, model=MODEL, summary=stale)

    assert result.summary is not None
    assert (result.summary.text, result.summary.upto, result.summary.messages) == (
        "Fresh.",
        "a3",
        12,
    )
    assert prompt(summarizer).startswith("<conversation>\nUser: Question 0:")


async def test_a_summary_is_found_by_its_id_when_its_count_is_off():
    messages = conversation(6)
    summarizer = writer("A0-A5 shipped.")
    moved = Summary(text="A0-A2 shipped.", upto="a2", messages=4, tokens=5)
    budget = tokens([summary_message(moved), *messages[9:]])
    config = Compaction(max_tokens=budget, summarizer=summarizer)

    result = await compact(request(messages), config=config, model=MODEL, summary=moved)

    assert result.summary is moved
    assert result.messages == [summary_message(moved), *messages[9:]]
    assert summarizer.calls == []


# -- Which turns are kept -------------------------------------------------------------------------


async def test_recent_turns_give_way_to_the_budget_but_the_current_turn_never_does():
    messages = [
        *conversation(5),
        *turn(5, question="Why? " + "It is late. " * 40),
        *turn(6, question="And now? " + "Still nothing. " * 300),
    ]
    summarizer = writer("S")
    current = messages[18:]
    budget = tokens([summary_message(Summary(text="S", upto="a5", messages=18, tokens=1))])
    budget += tokens(current) - tokens([])
    config = Compaction(
        max_tokens=budget, summarizer=summarizer, keep_recent_turns=2, instructions="Summarise."
    )

    result = await compact(request(messages), config=config, model=MODEL)

    assert result.summary is not None and result.summary.upto == "a5"
    assert result.messages[1:] == current
    assert not result.over_budget
    assert len(summarizer.calls) == 1  # turn 5 was folded in at once, not after a first try


async def test_keep_recent_turns_keeps_that_many_turns_when_they_fit():
    messages = conversation(6)
    config = Compaction(
        max_tokens=tokens(messages) - 1, summarizer=writer("S"), keep_recent_turns=4
    )

    result = await compact(request(messages), config=config, model=MODEL)

    assert result.summary is not None and result.summary.messages == 6
    assert result.messages[1:] == messages[6:]


@pytest.mark.parametrize("keep", [0, 1])
async def test_keeping_zero_or_one_turn_keeps_the_current_turn(keep: int):
    messages = conversation(4)
    config = Compaction(
        max_tokens=tokens(messages) - 1, summarizer=writer("S"), keep_recent_turns=keep
    )

    result = await compact(request(messages), config=config, model=MODEL)

    assert result.messages[1:] == messages[9:]


async def test_a_current_turn_over_budget_is_sent_with_the_summary_and_flagged():
    messages = [*conversation(3), user("u3", "Please read this. " + "Lorem ipsum. " * 300)]
    summarizer = writer("S")
    config = Compaction(max_tokens=500, summarizer=summarizer)

    result = await compact(request(messages), config=config, model=MODEL)

    assert result.summary is not None
    assert result.messages == [summary_message(result.summary), messages[-1]]
    assert result.over_budget
    assert result.tokens == tokens(result.messages) > 500
    assert result.error is None


async def test_a_single_turn_over_budget_is_sent_whole_and_flagged():
    messages = [user("u0", "Read this. " + "Lorem ipsum. " * 300), *turn(0)[1:]]
    summarizer = writer("S")

    result = await compact(
        request(messages), config=Compaction(max_tokens=100, summarizer=summarizer), model=MODEL
    )

    assert result == Compacted(
        messages=messages, summary=None, tokens=tokens(messages), over_budget=True
    )
    assert summarizer.calls == []


async def test_messages_before_the_first_user_turn_are_summarised_like_a_turn():
    greeting = Message(id="hi", role="assistant", parts=[TextPart(text="Hello! " * 20)])
    messages = [greeting, *conversation(1)]
    summarizer = writer("The assistant greeted the user.")
    config = Compaction(
        max_tokens=tokens(messages) - 1, summarizer=summarizer, instructions="Summarise."
    )

    result = await compact(request(messages), config=config, model=MODEL)

    assert result.summary is not None and result.summary.upto == "hi"
    assert result.messages[1:] == messages[1:]
    assert prompt(summarizer) == f"<conversation>\nAssistant: {greeting.text}\n</conversation>"


async def test_a_call_waiting_for_a_decision_is_never_summarised():
    waiting = ToolCallPart(id="refund", name="orders.refund", status="waiting", args={"n": 1})
    card = ApprovalCardPart(tool_call_id="refund", tool_name="orders.refund", args={"n": 1})
    messages = [
        *conversation(2),
        user("u2", "Refund A1."),
        Message(id="w", role="assistant", parts=[waiting, card]),
        *conversation(6)[9:],
    ]
    summarizer = writer("S")
    config = Compaction(max_tokens=200, summarizer=summarizer)

    result = await compact(request(messages), config=config, model=MODEL)

    assert result.summary is not None and result.summary.upto == "a1"
    assert result.messages[1:3] == messages[6:8]
    assert result.messages[2].parts == [waiting, card]
    assert result.over_budget


# -- Pruning: stale reasoning, expired big outputs ------------------------------------------------


async def test_reasoning_of_earlier_turns_is_dropped_and_the_current_turns_kept():
    claude = FunctionModel(lambda request: "unused", name="anthropic:claude-sonnet-4-6")
    thought = ReasoningPart(text="Check the order. " * 20, signature="sig", provider="anthropic")
    messages = conversation(3)
    messages[1].parts.insert(0, thought)
    messages[7].parts.insert(0, thought)
    history = dumped(messages)
    summarizer = writer("S")
    config = Compaction(max_tokens=tokens(messages, claude) - 1, summarizer=summarizer)

    result = await compact(request(messages), config=config, model=claude)

    pruned = Message(id="c0", role="assistant", parts=messages[1].parts[1:])
    assert result.messages == [messages[0], pruned, *messages[2:]]
    assert result.messages[7] is messages[7]
    assert dumped(messages) == history
    assert summarizer.calls == []


async def test_big_outputs_older_than_their_retention_are_shown_as_their_summary_line():
    big = {"id": "A0", "lines": [f"line {i}: cups and filters" for i in range(60)]}
    size = count_text(ToolResult(data=big).model_text(), MODEL)
    messages = [
        *turn(0, data=big),
        *turn(1, data=big),
        *turn(2, data=big),
        *turn(3, data={"id": "A3", "status": "shipped"}),
    ]
    messages[1].parts.append(
        ToolCallPart(
            id="doc",
            name="docs.read",
            status="completed",
            result=ToolResult(data=big, summary="Refund policy"),
        )
    )
    messages[4].parts.append(
        ToolCallPart(
            id="nosum", name="orders.lookup", status="completed", result=ToolResult(data=big)
        )
    )
    history = dumped(messages)
    summarizer = writer("S")
    config = Compaction(
        max_tokens=tokens(messages) - 1,
        summarizer=summarizer,
        tool_retention=1,
        retention_by_tool={"docs.read": None},
    )

    result = await compact(request(messages), config=config, model=MODEL)

    note = f"[output of {size} tokens dropped]"
    assert result.messages[1].parts == [
        ToolCallPart(
            id="call0",
            name="orders.lookup",
            args={"order_id": "call0"},
            status="completed",
            result=ToolResult(summary="Order A0: shipped", markdown=f"Order A0: shipped {note}"),
        ),
        messages[1].parts[1],  # docs.read: kept until summarised
    ]
    assert result.messages[4].parts[0].result == ToolResult(
        summary="Order A1: shipped", markdown=f"Order A1: shipped {note}"
    )
    assert result.messages[4].parts[1].result == ToolResult(markdown=note)
    assert result.messages[7] is messages[7]  # turn 2: within its retention (1 turn)
    assert result.messages[9:] == messages[9:]
    assert dumped(messages) == history
    assert summarizer.calls == []


@pytest.mark.parametrize(
    ("retention", "full"),
    [
        (Retention(last=2), [3, 4]),  # the count: the tool's two latest outputs
        (Retention(turns=3), [1, 2, 3, 4]),  # the age: three turns back
        (Retention(turns=3, last=2), [3, 4]),  # whichever comes first
        (Retention(turns=1, last=4), [3, 4]),
        (Retention(evict=False), [0, 1, 2, 3, 4]),  # never evicted
    ],
)
async def test_a_tool_s_retention_takes_an_age_a_count_or_never_evicts(
    retention: Retention, full: list[int]
):
    big = {"id": "A0", "lines": [f"line {i}: cups and filters" for i in range(60)]}
    messages = [m for t in range(5) for m in turn(t, data=big)]
    for t in range(5):  # another tool's big outputs, evicted after their turn (retention 0)
        messages[3 * t + 1].parts.append(
            ToolCallPart(
                id=f"doc{t}", name="docs.read", status="completed", result=ToolResult(data=big)
            )
        )
    config = Compaction(
        max_tokens=tokens(messages) - 1,
        summarizer=writer("S"),
        tool_retention=0,
        retention_by_tool={"orders.lookup": retention},
    )

    result = await compact(request(messages), config=config, model=MODEL)

    kept = [
        t
        for t in range(5)
        if result.messages[3 * t + 1].parts[0].result.data == big  # type: ignore[union-attr]
    ]
    assert kept == full
    assert result.messages[1].parts[1].result.data is None  # type: ignore[union-attr]
    assert not result.over_budget


async def test_a_never_evicted_output_is_kept_word_for_word_when_its_turn_is_summarised():
    messages = conversation(6)
    messages[1].parts.append(
        ToolCallPart(
            id="policy",
            name="docs.read",
            args={"doc": "refunds"},
            status="completed",
            result=ToolResult(data="Refunds within 30 days."),
        )
    )
    config = Compaction(
        max_tokens=200,
        summarizer=writer("S1", "S2"),
        keep_recent_turns=2,
        retention_by_tool={"docs.read": Retention(evict=False)},
    )

    first = await compact(request(messages), config=config, model=MODEL)

    assert first.summary is not None
    assert first.summary.kept == ['docs.read({"doc":"refunds"}): Refunds within 30 days.']
    shown = first.messages[0].parts[0].text  # type: ignore[union-attr]
    assert shown.endswith(
        f'{KEPT_HEADING}\n- docs.read({{"doc":"refunds"}}): Refunds within 30 days.'
    )
    assert all(p.id != "policy" for m in first.messages for p in m.tool_calls)
    stored = TypeAdapter(Summary).validate_json(TypeAdapter(Summary).dump_json(first.summary))
    assert stored == first.summary
    old = TypeAdapter(Summary).validate_python(
        {"text": "S", "upto": "a0", "messages": 3, "tokens": 1}
    )
    assert old.kept == []  # a summary stored before `kept` loads

    longer = [*messages, *turn(6), *turn(7)]
    again = await compact(request(longer), config=config, model=MODEL, summary=first.summary)
    assert again.summary is not None and again.summary is not first.summary
    assert again.summary.kept == first.summary.kept  # carried into the next summary


def test_a_retention_is_checked_when_it_is_made():
    with pytest.raises(ConfigError, match=r"Retention\(last=-1\): it cannot be negative"):
        Retention(last=-1)
    with pytest.raises(ConfigError, match="never evicted has no limits"):
        Retention(turns=2, evict=False)


async def test_a_big_failure_keeps_being_an_error_when_shortened():
    failure = ToolResult.failure("timeout while reading: " + "trace line\n" * 300)
    messages = conversation(3)
    messages[1].parts[0].result = failure
    config = Compaction(max_tokens=tokens(messages) - 1, summarizer=writer("S"), tool_retention=0)

    result = await compact(request(messages), config=config, model=MODEL)

    part = result.messages[1].parts[0]
    assert isinstance(part, ToolCallPart) and part.result is not None
    assert not part.result.ok
    _, rendered = anthropic_messages(None, result.messages, ToolNames(["orders.lookup"]))
    assert rendered[2]["content"][0]["is_error"] is True
    size = count_text(failure.model_text(), MODEL)
    assert rendered[2]["content"][0]["content"] == (
        f"Error: timeout while reading: trace line [output of {size} tokens dropped]"
    )


async def test_small_outputs_and_summary_lines_longer_than_the_output_are_kept():
    messages = conversation(4)
    messages[1].parts[0].result = ToolResult(data="x" * 1500, summary="y" * 2000)
    config = Compaction(
        max_tokens=tokens(messages) - 1,
        summarizer=writer("S"),
        tool_retention=0,
        big_output_tokens=10,
        keep_recent_turns=4,
    )

    result = await compact(request(messages), config=config, model=MODEL)

    assert result.summary is not None  # nothing could be pruned: the oldest turn went
    assert result.messages[1:] == messages[3:]


# -- The summarizer ----------------------------------------------------------------------------


async def test_the_requests_model_writes_the_summary_unless_one_is_configured():
    messages = conversation(4)
    model = ScriptedModel(["S"], name="openai:gpt-4o")
    config = Compaction(max_tokens=tokens(messages) - 1, instructions="Summarise.")

    result = await compact(request(messages), config=config, model=model)

    model.assert_complete()
    assert model.calls[0].agent == "compaction"
    assert result.summary is not None and result.summary.text == "S"


async def test_a_long_backlog_is_summarised_in_requests_that_each_fit_the_budget():
    messages = conversation(40)
    summarizer = writer(*(f"S{i}" for i in range(1, 50)))
    config = Compaction(max_tokens=600, summarizer=summarizer, instructions="Summarise.")

    result = await compact(request(messages), config=config, model=MODEL)

    calls = summarizer.calls
    assert len(calls) > 2
    for sent in calls:
        assert count_tokens(sent.messages, MODEL, instructions=sent.instructions) <= 600
    for i in range(1, len(calls)):  # each call extends what the one before wrote
        assert prompt(summarizer, i).startswith(f"<summary-so-far>\nS{i}\n</summary-so-far>")
    transcript = "".join(prompt(summarizer, i) for i in range(len(calls)))
    assert all(f"Question {t}:" in transcript for t in range(38))
    assert "Question 38:" not in transcript
    assert result.summary is not None and result.summary.messages == 114
    assert result.usage == Usage(requests=len(calls))
    assert not result.over_budget


async def test_a_message_too_big_for_one_summarizer_request_is_clipped():
    huge = "Lorem ipsum dolor sit amet. " * 400
    messages = [user("u0", huge), *conversation(3)[1:]]
    summarizer = writer("S")
    config = Compaction(max_tokens=400, summarizer=summarizer, instructions="Summarise.")

    result = await compact(request(messages), config=config, model=MODEL)

    first = prompt(summarizer)
    assert first.startswith("<conversation>\nUser: Lorem ipsum")
    assert f"[... clipped: {count_text('User: ' + huge, MODEL)} tokens in all]" in first
    assert count_tokens(summarizer.calls[0].messages, MODEL, instructions="Summarise.") <= 400
    assert result.summary is not None


async def test_a_failing_summarizer_loses_nothing_and_says_why():
    messages = conversation(6)
    history = dumped(messages)
    boom = ModelError("the summarizer is down")
    config = Compaction(max_tokens=tokens(messages) - 1, summarizer=failing(boom))

    result = await compact(request(messages), config=config, model=MODEL)

    assert result == Compacted(
        messages=messages, summary=None, tokens=tokens(messages), over_budget=True, error=boom
    )
    assert dumped(messages) == history


async def test_a_summarizer_failing_after_a_first_summary_keeps_that_summary():
    messages = [
        *conversation(4),
        *turn(4, question="Why? " + "It is late. " * 40),
        *turn(5, question="And now? " + "Still late. " * 40),
    ]
    wordy = "A very long summary. " * 60
    boom = RuntimeError("down")
    config = Compaction(
        max_tokens=tokens(messages[12:]) + 5,
        summarizer=failing(boom, after=1, text=wordy),
        instructions="Summarise.",
    )

    result = await compact(request(messages), config=config, model=MODEL)

    assert result.error is boom
    assert result.over_budget
    assert result.summary is not None and result.summary.upto == "a3"
    assert result.messages == [summary_message(result.summary), *messages[12:]]
    assert result.usage == Usage(requests=1)


@pytest.mark.parametrize(
    "answer",
    [call("orders.lookup", order_id="A1"), "   "],
    ids=["a tool call", "blank text"],
)
async def test_a_summarizer_that_writes_no_text_has_failed(answer: Any):
    messages = conversation(4)
    summarizer = FunctionModel(lambda request: answer, name="summarizer")
    config = Compaction(max_tokens=tokens(messages) - 1, summarizer=summarizer)

    result = await compact(request(messages), config=config, model=MODEL)

    assert isinstance(result.error, ModelError)
    assert str(result.error) == "The summarizer 'summarizer' wrote no text."
    assert result.summary is None
    assert result.usage == Usage(requests=1)


async def test_a_summarizer_whose_stream_ends_without_a_response_has_failed():
    class Mute:
        name = "mute"

        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
            yield TextChunk(text="Half a summ")

    messages = conversation(4)
    config = Compaction(max_tokens=tokens(messages) - 1, summarizer=Mute())

    result = await compact(request(messages), config=config, model=MODEL)

    assert isinstance(result.error, ModelError)
    assert str(result.error) == "The summarizer 'mute' ended without a response."
    assert result.usage == Usage()


async def test_cancellation_of_the_summarizer_is_not_swallowed():
    messages = conversation(4)
    config = Compaction(
        max_tokens=tokens(messages) - 1, summarizer=failing(asyncio.CancelledError())
    )

    with pytest.raises(asyncio.CancelledError):
        await compact(request(messages), config=config, model=MODEL)


# -- The request's size ---------------------------------------------------------------------------


async def test_a_structured_output_schema_counts_towards_the_budget():
    messages = conversation(2)
    schema = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(20)}}
    config = Compaction(max_tokens=tokens(messages), summarizer=writer("S"))

    plain = await compact(request(messages), config=config, model=MODEL)
    structured = await compact(request(messages, output_schema=schema), config=config, model=MODEL)

    assert plain.messages is messages
    assert structured.tokens > plain.tokens
    assert structured.summary is not None


# -- Configuration and storage --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "Compaction(max_tokens=0): give a positive budget."),
        ({"keep_recent_turns": -1}, "Compaction(keep_recent_turns=-1): it cannot be negative."),
        ({"tool_retention": -2}, "Compaction(tool_retention=-2): it cannot be negative."),
        (
            {"retention_by_tool": {"docs.read": -1}},
            "Compaction(retention_by_tool['docs.read']=-1): it cannot be negative.",
        ),
        ({"big_output_tokens": -5}, "Compaction(big_output_tokens=-5): it cannot be negative."),
        ({"instructions": " "}, "Compaction(instructions=''): the summarizer needs instructions."),
    ],
)
def test_a_bad_configuration_is_refused_naming_the_argument(kwargs: dict[str, Any], message: str):
    with pytest.raises(ConfigError) as raised:
        Compaction(**{"max_tokens": 1000, **kwargs})
    assert str(raised.value) == message


def test_a_summary_round_trips_through_json():
    adapter = TypeAdapter(Summary)
    summary = Summary(text="Orders shipped. «ünïcode»", upto="msg_12", messages=12, tokens=7)

    assert adapter.validate_json(adapter.dump_json(summary)) == summary


def test_a_missing_tokenizer_names_the_extra():
    script = """
import asyncio, sys
sys.modules["tiktoken"] = None  # as if handrail[tokens] were not installed
from handrail import Message, TextPart
from handrail.compaction import Compaction, compact
from handrail.models import ModelRequest
from handrail.testing import FunctionModel

request = ModelRequest(agent="a", instructions=None, messages=[
    Message(id="m", role="user", parts=[TextPart(text="hi")])])
try:
    asyncio.run(compact(request, config=Compaction(max_tokens=10), model=FunctionModel(str)))
except ImportError as error:
    print(error)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert 'pip install "handrail[tokens]"' in done.stdout


def test_the_module_imports_without_the_tokenizer():
    script = "import sys; sys.modules['tiktoken'] = None; import handrail.compaction"
    subprocess.run([sys.executable, "-c", script], check=True)


# -- Random histories: every view is valid for both providers -------------------------------------

WORDS = ["order", "refund", "cups", "late", "A1042", "shipped", "the", "é", "policy", "日本"]
sentences = st.lists(st.sampled_from(WORDS), min_size=1, max_size=25).map(" ".join)


@st.composite
def settled_calls(draw: st.DrawFn, id: str) -> ToolCallPart:
    status = draw(st.sampled_from(["completed", "completed", "failed", "rejected", "interrupted"]))
    size = draw(st.sampled_from([0, 3, 40, 40, 300]))
    if status == "completed":
        result = ToolResult(
            data=" ".join(["lorem"] * size) if size else {"ok": True},
            summary=draw(st.none() | sentences),
        )
    else:
        result = ToolResult.failure(draw(sentences) + " trace" * size)
    malformed = draw(st.integers(0, 9)) == 0
    return ToolCallPart(
        id=id,
        name=draw(st.sampled_from(["orders.lookup", "docs.read", "mail.send"])),
        args={} if malformed else {"q": draw(sentences)},
        raw_args='{"q": "unterminated' if malformed else None,
        status=status,
        result=result,
    )


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    numbers = itertools.count(1)

    def new_id(prefix: str) -> str:
        return f"{prefix}{next(numbers)}"

    messages: list[Message] = []
    if draw(st.integers(0, 4)) == 0:
        messages.append(
            Message(id=new_id("m"), role="assistant", parts=[TextPart(text=draw(sentences))])
        )
    turns = draw(st.integers(1, 7))
    for t in range(turns):
        messages.append(user(new_id("m"), draw(sentences)))
        for _ in range(draw(st.integers(0, 3))):
            parts: list[Any] = []
            if draw(st.booleans()):
                parts.append(
                    ReasoningPart(
                        text=draw(st.just("") | sentences),
                        signature=draw(st.sampled_from([None, "sig"])),
                        provider=draw(st.sampled_from(["anthropic", "openai", None])),
                    )
                )
            if draw(st.booleans()):
                parts.append(TextPart(text=draw(sentences)))
            parts += [draw(settled_calls(new_id("call"))) for _ in range(draw(st.integers(0, 3)))]
            messages.append(Message(id=new_id("m"), role="assistant", parts=parts))
            if draw(st.integers(0, 5)) == 0:
                messages.append(nudge(new_id("m")))
        if t == turns - 1 and draw(st.booleans()):  # the turn waits for a decision
            waiting = ToolCallPart(id=new_id("call"), name="mail.send", status="waiting")
            card = ApprovalCardPart(tool_call_id=waiting.id, tool_name="mail.send", args={})
            messages.append(Message(id=new_id("m"), role="assistant", parts=[waiting, card]))
    return messages


def check_openai(body: dict[str, Any]) -> None:
    out = body["messages"]
    i = 0
    while i < len(out):
        message = out[i]
        assert message["role"] != "tool", "a tool result that follows no call"
        calls = [c["id"] for c in message.get("tool_calls", ())]
        results = [m.get("tool_call_id") for m in out[i + 1 : i + 1 + len(calls)]]
        assert results == calls, "every call's result right after it, in order"
        i += 1 + len(calls)


def check_anthropic(body: dict[str, Any], *, greeting: bool) -> None:
    out = body["messages"]
    assert out[0]["role"] == "user" or greeting, "a user turn first, unless the history had not"
    for before, after in itertools.pairwise(out):
        assert before["role"] != after["role"], "roles alternate"
    for i, message in enumerate(out):
        kinds = [block["type"] for block in message["content"]]
        assert kinds, "no empty turn"
        if message["role"] == "assistant":
            assert set(kinds) - {"thinking", "redacted_thinking"}, "no turn of thinking alone"
            uses = [b["id"] for b in message["content"] if b["type"] == "tool_use"]
            following = out[i + 1]["content"] if i + 1 < len(out) else []
            results = [b.get("tool_use_id") for b in following[: len(uses)]]
            assert results == uses, "the results open the next user turn, in order"
        else:
            previous = out[i - 1] if i else {"content": []}
            uses = [b["id"] for b in previous["content"] if b["type"] == "tool_use"]
            results = [b["tool_use_id"] for b in message["content"] if b["type"] == "tool_result"]
            assert results == uses[: len(results)], "no result without its call"


def check_view(
    messages: list[Message], result: Compacted, config: Compaction, model: FunctionModel
) -> None:
    view = result.messages
    sent = request(view)
    names = request_tool_names(sent.tools, view)
    check_openai(openai_request(sent, names))
    check_anthropic(anthropic_request(sent, names), greeting=view[0] is messages[0])

    assert result.tokens == tokens(view, model)
    starts = [i for i, m in enumerate(messages) if m.role == "user" and not m.parts[0].synthetic]
    current = starts[-1]
    assert all(
        a is b
        for a, b in zip(
            view[len(view) - len(messages) + current :], messages[current:], strict=True
        )
    )
    summary = result.summary
    covered = summary.messages if summary is not None else 0
    if summary is not None:
        assert view[0] == summary_message(summary)
        assert messages[covered - 1].id == summary.upto
        assert covered in starts
    kept = view[1:] if summary is not None else view
    assert [m.id for m in kept] == [m.id for m in messages[covered:]]  # a suffix, in order
    if view is not messages:  # compacted: no reasoning left from earlier turns
        for message in kept[: len(kept) - (len(messages) - current)]:
            assert not any(isinstance(p, ReasoningPart) for p in message.parts)
    waiting = [p.id for m in messages for p in m.parts if getattr(p, "status", "") == "waiting"]
    assert waiting == [p.id for m in view for p in m.parts if getattr(p, "status", "") == "waiting"]
    if result.over_budget:
        assert result.tokens > config.max_tokens
        assert covered == current, "over budget only when nothing more could be summarised"
    else:
        assert result.tokens <= config.max_tokens


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=histories(),
    budget=st.floats(0.05, 1.1),
    keep=st.integers(0, 3),
    retention=st.none() | st.integers(0, 2),
    model_name=st.sampled_from(["openai:gpt-4o", "anthropic:claude-sonnet-4-6", "gpt-4"]),
)
def test_every_view_is_valid_for_both_providers_and_within_budget_when_it_can_be(
    messages: list[Message], budget: float, keep: int, retention: int | None, model_name: str
) -> None:
    history = dumped(messages)
    model = FunctionModel(lambda request: "unused", name=model_name)
    max_tokens = max(1, round(budget * tokens(messages, model)))  # a share of the whole request
    summarizer = FunctionModel(lambda request: "They talked about orders.", name="summarizer")
    config = Compaction(
        max_tokens=max_tokens,
        keep_recent_turns=keep,
        tool_retention=retention,
        big_output_tokens=30,
        summarizer=summarizer,
        instructions="Summarise.",
    )

    result = asyncio.run(compact(request(messages), config=config, model=model))
    event("sent as is" if result.messages is messages else "compacted")
    event(f"summarised: {result.summary is not None}, over budget: {result.over_budget}")
    if result.messages is not messages and result.summary is None and not result.over_budget:
        event("pruning was enough")
    event(f"summarizer calls: {min(len(summarizer.calls), 3)}")

    check_view(messages, result, config, model)
    assert dumped(messages) == history
    assert result.usage == Usage(requests=len(summarizer.calls))

    again = asyncio.run(
        compact(request(messages), config=config, model=model, summary=result.summary)
    )
    check_view(messages, again, config, model)
    if not result.over_budget:  # what fit once fits again, at no cost
        assert again.messages == result.messages
        assert again.summary is result.summary
        assert again.usage == Usage()
