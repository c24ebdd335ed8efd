"""Messages and their parts: what they hold, and that they survive JSON losslessly."""

from __future__ import annotations

import json
from typing import Any, get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from handrail import (
    MESSAGES,
    ApprovalCardPart,
    Message,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResult,
)
from handrail.messages import Executor, Role, ToolCallStatus

# -- strategies -------------------------------------------------------------------------------

texts = st.text(max_size=20)
optional_texts = st.none() | texts
optional_floats = st.none() | st.floats(allow_nan=False, allow_infinity=False)
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(texts, json_values, max_size=4)

tool_results = st.builds(
    ToolResult,
    ok=st.booleans(),
    data=json_values,
    summary=optional_texts,
    markdown=optional_texts,
    error=optional_texts,
)
text_parts = st.builds(
    TextPart,
    text=texts,
    synthetic=st.booleans(),
    citations=st.none() | st.lists(json_objects, max_size=2),
)
reasoning_parts = st.builds(
    ReasoningPart, text=texts, signature=optional_texts, provider=optional_texts
)
tool_call_parts = st.builds(
    ToolCallPart,
    id=texts,
    name=texts,
    args=json_objects,
    raw_args=optional_texts,
    status=st.sampled_from(get_args(ToolCallStatus)),
    result=st.none() | tool_results,
    digest=json_values,
    executor=st.sampled_from(get_args(Executor)),
    provider=optional_texts,
    provider_blocks=st.none() | st.lists(json_objects, max_size=3),
    reused_from=optional_texts,
    cached=st.booleans(),
    started_at=optional_floats,
    duration_ms=optional_floats,
)
approval_card_parts = st.builds(
    ApprovalCardPart,
    tool_call_id=texts,
    tool_name=texts,
    args=json_objects,
    prompt=optional_texts,
    kind=st.sampled_from(["approval", "elicitation", "client_exec", "recovery"]),
    decision=st.none() | st.sampled_from(["approve", "reject", "answer", "client_result", "skip"]),
    decided_by=optional_texts,
    decided_at=optional_floats,
    amended_args=st.none() | json_objects,
    reason=optional_texts,
    args_digest=optional_texts,
)
parts = text_parts | reasoning_parts | tool_call_parts | approval_card_parts
messages = st.lists(
    st.builds(
        Message,
        id=texts,
        role=st.sampled_from(get_args(Role)),
        parts=st.lists(parts, max_size=5),
        agent=optional_texts,
    ),
    max_size=4,
)


# -- round trips ------------------------------------------------------------------------------


@given(messages)
def test_messages_round_trip_through_json(msgs: list[Message]):
    assert MESSAGES.validate_json(MESSAGES.dump_json(msgs)) == msgs


@given(messages)
def test_messages_round_trip_through_json_compatible_python(msgs: list[Message]):
    dumped = MESSAGES.dump_python(msgs, mode="json")
    assert MESSAGES.validate_python(dumped) == msgs
    # the python form is plain JSON, the same document `dump_json` writes
    assert json.loads(json.dumps(dumped)) == dumped == json.loads(MESSAGES.dump_json(msgs))


# -- the wire form ----------------------------------------------------------------------------


def test_a_tool_call_and_its_result_travel_together_in_one_part():
    msgs = [
        Message(
            id="msg_1",
            role="assistant",
            agent="support",
            parts=[
                TextPart(text="Looking it up."),
                ToolCallPart(
                    id="call_1",
                    name="orders.lookup",
                    args={"order_id": "A1"},
                    status="completed",
                    result=ToolResult(data={"status": "shipped"}, summary="A1: shipped"),
                    digest={"status": "shipped"},
                ),
            ],
        )
    ]

    dumped = MESSAGES.dump_python(msgs, mode="json")

    assert dumped == [
        {
            "id": "msg_1",
            "role": "assistant",
            "agent": "support",
            "scratch": False,
            "parts": [
                {
                    "type": "text",
                    "text": "Looking it up.",
                    "synthetic": False,
                    "citations": None,
                },
                {
                    "type": "tool-call",
                    "id": "call_1",
                    "name": "orders.lookup",
                    "args": {"order_id": "A1"},
                    "raw_args": None,
                    "bound": None,
                    "status": "completed",
                    "result": {
                        "ok": True,
                        "data": {"status": "shipped"},
                        "summary": "A1: shipped",
                        "markdown": None,
                        "error": None,
                        "code": None,
                        "warnings": None,
                    },
                    "digest": {"status": "shipped"},
                    "executor": "server",
                    "provider": None,
                    "provider_blocks": None,
                    "reused_from": None,
                    "cached": False,
                    "started_at": None,
                    "duration_ms": None,
                    "captured": None,
                },
            ],
        }
    ]
    restored = MESSAGES.validate_json(MESSAGES.dump_json(msgs))
    assert restored[0].tool_calls[0].result == ToolResult(
        data={"status": "shipped"}, summary="A1: shipped"
    )


def test_parts_validate_from_minimal_json_with_their_defaults():
    [msg] = MESSAGES.validate_json(
        '[{"id": "m", "role": "assistant", "parts": ['
        '{"type": "text", "text": "hi"},'
        '{"type": "reasoning", "text": "hmm"},'
        '{"type": "tool-call", "id": "c1", "name": "lookup"},'
        '{"type": "approval", "tool_call_id": "c1", "tool_name": "lookup", "args": {}}'
        "]}]"
    )

    assert msg == Message(
        id="m",
        role="assistant",
        parts=[
            TextPart(text="hi"),
            ReasoningPart(text="hmm"),
            ToolCallPart(id="c1", name="lookup"),
            ApprovalCardPart(tool_call_id="c1", tool_name="lookup", args={}),
        ],
    )
    assert msg.tool_calls[0].status == "pending"
    assert msg.tool_calls[0].executor == "server"
    assert msg.agent is None


# -- Message helpers --------------------------------------------------------------------------


def test_message_text_joins_only_the_text_parts_in_order():
    msg = Message(
        id="m",
        role="assistant",
        parts=[
            TextPart(text="It "),
            ReasoningPart(text="(thinking)"),
            ToolCallPart(id="c1", name="lookup"),
            TextPart(text="shipped."),
        ],
    )
    assert msg.text == "It shipped."


def test_message_text_is_empty_without_text_parts():
    assert Message(id="m", role="user").text == ""
    assert Message(id="m", role="assistant", parts=[ReasoningPart(text="x")]).text == ""


def test_message_tool_calls_are_the_tool_call_parts_in_order():
    first = ToolCallPart(id="c1", name="a")
    second = ToolCallPart(id="c2", name="b")
    msg = Message(
        id="m",
        role="assistant",
        parts=[
            first,
            TextPart(text="and"),
            ApprovalCardPart(tool_call_id="c1", tool_name="a", args={}),
            second,
        ],
    )
    assert msg.tool_calls == [first, second]
    assert msg.tool_calls[0] is first
    assert Message(id="m", role="user", parts=[TextPart(text="x")]).tool_calls == []


def test_each_message_gets_its_own_parts_list():
    a = Message(id="a", role="user")
    b = Message(id="b", role="user")
    a.parts.append(TextPart(text="x"))
    assert b.parts == []


# -- rejected input ---------------------------------------------------------------------------


def test_an_unknown_part_type_is_rejected():
    with pytest.raises(ValidationError) as caught:
        MESSAGES.validate_python(
            [{"id": "m", "role": "user", "parts": [{"type": "image", "url": "x.png"}]}]
        )

    [error] = caught.value.errors(include_url=False)
    assert error["type"] == "union_tag_invalid"
    assert error["loc"] == (0, "parts", 0)
    assert error["msg"] == (
        "Input tag 'image' found using 'type' does not match any of the expected tags: "
        "'text', 'reasoning', 'tool-call', 'approval'"
    )


def test_a_part_without_a_type_is_rejected():
    with pytest.raises(ValidationError) as caught:
        MESSAGES.validate_json('[{"id": "m", "role": "user", "parts": [{"text": "hi"}]}]')

    [error] = caught.value.errors(include_url=False)
    assert (error["type"], error["loc"]) == ("union_tag_not_found", (0, "parts", 0))


def test_an_unknown_role_is_rejected():
    with pytest.raises(ValidationError) as caught:
        MESSAGES.validate_json('[{"id": "m", "role": "tool", "parts": []}]')

    [error] = caught.value.errors(include_url=False)
    assert (error["type"], error["loc"]) == ("literal_error", (0, "role"))


def test_an_unknown_tool_call_status_is_rejected():
    with pytest.raises(ValidationError) as caught:
        MESSAGES.validate_json(
            '[{"id": "m", "role": "assistant", "parts": '
            '[{"type": "tool-call", "id": "c", "name": "n", "status": "done"}]}]'
        )

    [error] = caught.value.errors(include_url=False)
    assert error["type"] == "literal_error"
    assert error["loc"] == (0, "parts", 0, "tool-call", "status")


def test_tool_call_args_must_be_an_object():
    with pytest.raises(ValidationError) as caught:
        MESSAGES.validate_json(
            '[{"id": "m", "role": "assistant", "parts": '
            '[{"type": "tool-call", "id": "c", "name": "n", "args": [1, 2]}]}]'
        )

    [error] = caught.value.errors(include_url=False)
    assert (error["type"], error["loc"]) == ("dict_type", (0, "parts", 0, "tool-call", "args"))
