"""Token counting against the counts the providers document.

The fixtures are the providers' own published examples, not captures of ours (this machine
cannot reach the APIs): OpenAI's cookbook "How to count tokens with tiktoken" (token ids of
"tiktoken is great!", and the prompt tokens the API reported for its tool example) and
Anthropic's token-counting guide (the `input_tokens` of its basic, tool and thinking examples).
"""

from __future__ import annotations

import pytest

from handrail import Message, ReasoningPart, TextPart, ToolCallPart, ToolResult
from handrail.models import ToolDefinition
from handrail.testing import ScriptedModel
from handrail.tokens import _encoding, count_text, count_tokens, encoding_name


def user(text: str) -> Message:
    return Message(id="m", role="user", parts=[TextPart(text=text)])


def within(estimate: int, reported: int, tolerance: float = 0.02) -> bool:
    return abs(estimate - reported) <= tolerance * reported


# -- OpenAI: the cookbook's examples -----------------------------------------------------------

COOKBOOK_TOOL = ToolDefinition(
    name="get_current_weather",
    description="Get the current weather in a given location",
    parameters={
        "type": "object",
        "properties": {
            "location": {
                "type": "string",
                "description": "The city and state, e.g. San Francisco, CA",
            },
            "unit": {
                "type": "string",
                "description": "The unit of temperature to return",
                "enum": ["celsius", "fahrenheit"],
            },
        },
        "required": ["location"],
    },
)


@pytest.mark.parametrize(
    ("model", "reported"),
    [("gpt-4o", 101), ("gpt-4o-mini", 101), ("gpt-4", 105), ("gpt-3.5-turbo", 105)],
)
def test_the_cookbook_tool_example_counts_what_the_api_reported(model: str, reported: int):
    estimate = count_tokens(
        [user("What's the weather like in San Francisco?")],
        model,
        instructions="You are a helpful assistant that can answer to questions about the weather.",
        tools=[COOKBOOK_TOOL],
    )
    assert within(estimate, reported)
    assert estimate == reported


def test_the_encodings_are_tiktokens_own():
    assert _encoding("cl100k_base").encode_ordinary("tiktoken is great!") == [
        83,
        1609,
        5963,
        374,
        2294,
        0,
    ]
    assert _encoding("o200k_base").encode_ordinary("tiktoken is great!") == [
        83,
        8251,
        2488,
        382,
        2212,
        0,
    ]
    assert count_text("お誕生日おめでとう", "gpt-4") == 9
    assert count_text("お誕生日おめでとう", "gpt-4o") == 8


def test_an_encoding_is_loaded_once():
    assert _encoding("o200k_base") is _encoding("o200k_base")


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4.1", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("qwen2.5:7b", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("text-embedding-3-small", "cl100k_base"),
    ],
)
def test_the_encoding_follows_the_model(model: str, encoding: str):
    assert encoding_name(model) == encoding


def test_messages_cost_three_each_and_three_to_prime_the_reply():
    hello = count_text("Hello", "gpt-4o")
    assert count_tokens([user("Hello")], "gpt-4o") == 3 + (3 + 1 + hello)
    assert count_tokens([user("Hello")], "openai:gpt-4o") == count_tokens([user("Hello")], "gpt-4o")


def test_tool_calls_and_their_results_are_counted():
    call = ToolCallPart(
        id="c1",
        name="orders.lookup",
        args={"order_id": "A1042"},
        status="completed",
        result=ToolResult(data={"status": "delivered"}),
    )
    history = [user("Where is A1042?"), Message(id="a", role="assistant", parts=[call])]
    without = count_tokens(history[:1], "gpt-4o")
    with_call = count_tokens(history, "gpt-4o")
    arguments = count_text('{"order_id":"A1042"}', "gpt-4o")
    result = count_text('{"status":"delivered"}', "gpt-4o")
    name = count_text("orders_lookup", "gpt-4o")
    assistant, tool = count_text("assistant", "gpt-4o"), count_text("tool", "gpt-4o")
    assert with_call - without == (3 + assistant + 3 + name + arguments) + (3 + tool + result)


def test_a_model_object_is_counted_by_its_name():
    assert count_tokens([user("Hi")], ScriptedModel([])) == count_tokens([user("Hi")], "gpt-4o")


# -- Anthropic: the token-counting guide's examples --------------------------------------------


def test_anthropic_basic_example():
    estimate = count_tokens(
        [user("Hello, Claude")], "anthropic:claude-sonnet-4-6", instructions="You are a scientist"
    )
    assert within(estimate, 14)


def test_anthropic_tool_example():
    tool = ToolDefinition(
        name="get_weather",
        description="Get the current weather in a given location",
        parameters={
            "type": "object",
            "properties": {
                "location": {
                    "type": "string",
                    "description": "The city and state, e.g. San Francisco, CA",
                }
            },
            "required": ["location"],
        },
    )
    estimate = count_tokens(
        [user("What's the weather like in San Francisco?")], "claude-sonnet-4-6", tools=[tool]
    )
    assert within(estimate, 403)


def test_anthropic_thinking_example_is_the_documented_gap():
    # With thinking enabled the API adds tokens the estimate cannot see: it is 16% low here,
    # as tokens.py's docstring says.
    history = [
        user("Are there an infinite number of prime numbers such that n mod 4 == 3?"),
        Message(
            id="a",
            role="assistant",
            parts=[
                ReasoningPart(
                    text="This is a nice number theory question. Let's think about it step by "
                    "step...",
                    signature="EuYBCkQYAiJAgCs1le6/Pol5Z4/JMomVOouGrWdhYNsH3ukzUECbB6iWrSQtsQuRHJID6lWV...",
                    provider="anthropic",
                ),
                TextPart(
                    text="Yes, there are infinitely many prime numbers p such that p mod 4 = 3..."
                ),
            ],
        ),
        user("Can you write a formal proof?"),
    ]
    estimate = count_tokens(history, "claude-sonnet-4-6")
    assert estimate == 74
    assert within(estimate, 88, tolerance=0.17)


def test_newer_claude_models_count_about_thirty_percent_more_content():
    text = "A sentence of ordinary English prose, to be counted. " * 20
    older = count_tokens([user(text)], "claude-sonnet-4-6")
    newer = count_tokens([user(text)], "claude-opus-4-7")
    framing = 4 + 3
    assert newer - framing == round((older - framing) * 1.3)
    assert count_tokens([user(text)], "claude-opus-5") == newer
