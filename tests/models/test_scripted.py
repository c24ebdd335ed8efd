"""The offline test models, `ScriptedModel` and `FunctionModel`, driven directly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from handrail import (
    Message,
    Model,
    ModelError,
    ModelRequest,
    ModelResponse,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    Usage,
)
from handrail.models import ModelChunk, ReasoningChunk, TextChunk
from handrail.testing import FunctionModel, ScriptedModel, call, call_raw, reasoning


def request(text: str = "Where is A1?", *, agent: str = "support") -> ModelRequest:
    return ModelRequest(
        agent=agent,
        instructions="Be brief.",
        messages=[Message(id="msg_1", role="user", parts=[TextPart(text=text)])],
    )


async def stream(model: Model, req: ModelRequest | None = None) -> list[ModelChunk]:
    return [chunk async for chunk in model.stream(req or request())]


async def respond(model: Model, req: ModelRequest | None = None) -> ModelResponse:
    """Stream one answer and return its final response (checking it comes last, once)."""
    chunks = await stream(model, req)
    assert isinstance(chunks[-1], ModelResponse)
    assert not any(isinstance(c, ModelResponse) for c in chunks[:-1])
    return chunks[-1]


# -- text -------------------------------------------------------------------------------------


async def test_text_streams_word_by_word_then_ends_with_one_response():
    model = ScriptedModel(["It shipped  yesterday."])

    assert await stream(model) == [
        TextChunk(text="It "),
        TextChunk(text="shipped  "),
        TextChunk(text="yesterday."),
        ModelResponse(
            parts=[TextPart(text="It shipped  yesterday.")],
            usage=Usage(requests=1),
            stop_reason="end_turn",
            finish_reason="stop",
            model_name="scripted",
        ),
    ]


@given(st.text())
def test_the_text_chunks_add_up_to_the_text_one_word_each(text: str):
    chunks = asyncio.run(stream(FunctionModel(lambda _: text)))

    *pieces, response = chunks
    assert all(isinstance(p, TextChunk) for p in pieces)
    assert "".join(p.text for p in pieces) == text
    assert all(p.text and len(p.text.split()) <= 1 for p in pieces)
    assert response == ModelResponse(
        parts=[TextPart(text=text)],
        stop_reason="end_turn",
        finish_reason="stop",
        model_name="function",
    )


async def test_an_empty_text_streams_no_chunk():
    assert await stream(ScriptedModel([""])) == [
        ModelResponse(
            parts=[TextPart(text="")],
            stop_reason="end_turn",
            finish_reason="stop",
            model_name="scripted",
        )
    ]


async def test_reasoning_streams_as_reasoning_chunks_before_the_text():
    model = ScriptedModel([[reasoning("Check the order.", signature="sig"), "Shipped."]])

    assert await stream(model) == [
        ReasoningChunk(text="Check "),
        ReasoningChunk(text="the "),
        ReasoningChunk(text="order."),
        TextChunk(text="Shipped."),
        ModelResponse(
            parts=[
                ReasoningPart(text="Check the order.", signature="sig"),
                TextPart(text="Shipped."),
            ],
            stop_reason="end_turn",
            finish_reason="stop",
            model_name="scripted",
        ),
    ]


# -- tool calls -------------------------------------------------------------------------------


async def test_a_call_is_sent_as_json_text_and_numbered_call_1():
    model = ScriptedModel([call("orders.lookup", order_id="A1")])

    assert await stream(model) == [
        ModelResponse(
            parts=[ToolCallPart(id="call_1", name="orders.lookup", raw_args='{"order_id":"A1"}')],
            stop_reason="tool_use",
            finish_reason="tool_call",
            model_name="scripted",
        )
    ]


async def test_call_ids_count_up_across_parts_and_responses():
    model = ScriptedModel(
        [[call("orders.lookup", order_id="A1"), call("policy.refunds")], call("orders.lookup")]
    )

    first = await respond(model)
    second = await respond(model)

    assert [p.id for p in first.parts] == ["call_1", "call_2"]
    assert [p.id for p in second.parts] == ["call_3"]


async def test_a_given_call_id_is_kept():
    model = ScriptedModel([[call("orders.lookup", order_id="A1", id="toolu_42")]])

    [part] = (await respond(model)).parts
    assert part == ToolCallPart(id="toolu_42", name="orders.lookup", raw_args='{"order_id":"A1"}')


async def test_call_args_may_be_a_dict_merged_with_keywords():
    # The dict form also carries an argument named `id`, which the keyword form reserves.
    model = ScriptedModel([call("crm.update", {"id": 7, "name": "Ann"}, name="Anna")])

    [part] = (await respond(model)).parts
    assert isinstance(part, ToolCallPart)
    assert part.raw_args == '{"id":7,"name":"Anna"}'
    assert part.args == {}


async def test_call_raw_sends_its_arguments_verbatim():
    model = ScriptedModel([call_raw("orders.lookup", '{"order_id": "A1"', id="c9")])

    assert (await respond(model)).parts == [
        ToolCallPart(id="c9", name="orders.lookup", raw_args='{"order_id": "A1"')
    ]


async def test_text_and_calls_in_one_step_make_one_response_in_order():
    model = ScriptedModel([["Let me check.", call("orders.lookup", order_id="A1")]])

    chunks = await stream(model)

    assert chunks == [
        TextChunk(text="Let "),
        TextChunk(text="me "),
        TextChunk(text="check."),
        ModelResponse(
            parts=[
                TextPart(text="Let me check."),
                ToolCallPart(id="call_1", name="orders.lookup", raw_args='{"order_id":"A1"}'),
            ],
            stop_reason="tool_use",
            finish_reason="tool_call",
            model_name="scripted",
        ),
    ]


async def test_a_replayed_call_is_a_fresh_part_each_time():
    step = call("orders.lookup", order_id="A1")
    model = ScriptedModel([step, step])

    first = (await respond(model)).parts[0]
    assert isinstance(first, ToolCallPart)
    first.status = "completed"
    second = (await respond(model)).parts[0]

    assert second == ToolCallPart(id="call_2", name="orders.lookup", raw_args=first.raw_args)
    assert step == ToolCallPart(id="", name="orders.lookup", raw_args='{"order_id":"A1"}')


async def test_a_model_response_step_is_answered_as_it_is():
    given_response = ModelResponse(
        parts=[TextPart(text="Hello there"), ToolCallPart(id="x1", name="ping")],
        usage=Usage(requests=1, input_tokens=12, output_tokens=3),
        stop_reason="length",
        finish_reason="length",
        model_name="gpt-test",
    )
    model = ScriptedModel([given_response])

    chunks = await stream(model)

    assert chunks == [TextChunk(text="Hello "), TextChunk(text="there"), given_response]
    assert chunks[-1] is given_response


# -- bookkeeping ------------------------------------------------------------------------------


async def test_calls_records_every_request_in_order():
    model = ScriptedModel(["one", "two"])
    first, second = request("first"), request("second", agent="billing")

    await stream(model, first)
    await stream(model, second)

    assert model.calls == [first, second]
    assert [c.agent for c in model.calls] == ["support", "billing"]


async def test_calls_keeps_the_messages_as_they_were_when_asked():
    model = ScriptedModel(["ok"])
    req = request()

    await stream(model, req)
    req.messages.append(Message(id="msg_2", role="assistant", parts=[TextPart(text="ok")]))

    assert [m.id for m in model.calls[0].messages] == ["msg_1"]


async def test_running_out_of_steps_raises_a_model_error_naming_the_fix():
    model = ScriptedModel(["only one"])
    await stream(model)

    with pytest.raises(ModelError) as caught:
        await stream(model)

    assert str(caught.value) == (
        "ScriptedModel ran out of steps: it had 1 and agent 'support' asked for one more. "
        "Add a step to the script (the last message was 'user')."
    )


async def test_an_empty_script_fails_on_the_first_request():
    empty = ModelRequest(agent="a", instructions=None, messages=[])

    with pytest.raises(ModelError, match=r"it had 0 .* \(the last message was 'none'\)\.$"):
        await stream(ScriptedModel([]), empty)


async def test_assert_complete_fails_while_steps_remain():
    model = ScriptedModel(["one", "two"])
    await stream(model)

    assert model.remaining == 1
    with pytest.raises(AssertionError) as caught:
        model.assert_complete()
    assert str(caught.value) == (
        "ScriptedModel played 1 of 2 steps; 1 left unplayed (the agent stopped early?)"
    )

    await stream(model)
    assert model.remaining == 0
    model.assert_complete()


async def test_a_script_may_be_any_iterable_of_steps():
    model = ScriptedModel(f"step {n}" for n in range(2))

    assert (await respond(model)).parts == [TextPart(text="step 0")]
    assert (await respond(model)).parts == [TextPart(text="step 1")]


def test_both_models_are_models_with_a_name():
    assert isinstance(ScriptedModel([]), Model)
    assert isinstance(FunctionModel(lambda _: "hi"), Model)
    assert ScriptedModel([]).name == "scripted"
    assert FunctionModel(lambda _: "hi", name="echo").name == "echo"


# -- FunctionModel ----------------------------------------------------------------------------


async def test_a_function_model_answers_from_the_request():
    def answer(req: ModelRequest) -> Any:
        last = req.messages[-1]
        return call("orders.lookup", order_id=last.text) if last.role == "user" else "Done."

    model = FunctionModel(answer, name="echo")

    response = await respond(model, request("A7"))

    assert response == ModelResponse(
        parts=[ToolCallPart(id="call_1", name="orders.lookup", raw_args='{"order_id":"A7"}')],
        stop_reason="tool_use",
        finish_reason="tool_call",
        model_name="echo",
    )
    assert model.calls == [request("A7")]


async def test_an_async_function_model_works():
    async def answer(req: ModelRequest) -> Any:
        await asyncio.sleep(0)
        return [reasoning("Easy."), f"You said {req.messages[-1].text}"]

    response = await respond(FunctionModel(answer), request("hi"))

    assert response.parts == [ReasoningPart(text="Easy."), TextPart(text="You said hi")]


async def test_an_error_in_the_function_reaches_the_caller():
    def answer(req: ModelRequest) -> Any:
        raise RuntimeError("no answer")

    with pytest.raises(RuntimeError, match="no answer"):
        await stream(FunctionModel(answer))


# -- bad steps --------------------------------------------------------------------------------

BAD_STEP = (
    "A model step must be a str, call(...), reasoning(...), a list of those or a ModelResponse; "
    "got {}"
)


async def test_a_bad_part_in_a_list_step_raises_type_error_naming_the_step_kinds():
    with pytest.raises(TypeError) as caught:
        await stream(ScriptedModel([["fine", 42]]))
    assert str(caught.value) == BAD_STEP.format("int")


@pytest.mark.parametrize(
    ("step", "type_name"),
    [(42, "int"), (None, "NoneType"), ({"name": "orders.lookup"}, "dict")],
    ids=["int", "None", "dict"],
)
async def test_a_bad_step_raises_type_error_naming_the_step_kinds(step: Any, type_name: str):
    # A dict is iterable: its keys must not quietly become text parts.
    with pytest.raises(TypeError) as caught:
        await stream(ScriptedModel([step]))
    assert str(caught.value) == BAD_STEP.format(type_name)
