"""`OpenAIResponsesModel` against the fake server: the real `openai` SDK over real HTTP."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest

from fake_providers import (
    RESPONSES_MODEL,
    Drop,
    FakeProviders,
    Json,
    openai_error,
    responses_call,
    responses_item,
    responses_message,
    responses_object,
    responses_reasoning,
    responses_stream,
    responses_usage,
    sse,
)
from handrail import (
    Agent,
    ConfigError,
    IncompleteResponseError,
    Message,
    ModelError,
    ModelHTTPError,
    ModelResponse,
    ReasoningPart,
    Runtime,
    TextPart,
    ToolCallPart,
    ToolResult,
    Usage,
    tool,
)
from handrail.models import (
    ModelChunk,
    ModelRequest,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    ToolDefinition,
    infer,
)
from handrail.models.openai_responses import TERMINAL, OpenAIResponsesModel
from handrail.models.retry import RetryPolicy
from handrail.runtime import sequential_ids

WEATHER = ToolDefinition(
    name="weather.today",
    description="Today's weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
AWAITING = (
    "This call has not run yet: it is waiting for a decision (a person's approval or answer, "
    "or a client's result). Do not assume an outcome."
)


def ask(text: str = "Hello", **kwargs: Any) -> ModelRequest:
    return ModelRequest(
        agent="a",
        instructions="Be brief.",
        messages=[Message(id="m1", role="user", parts=[TextPart(text=text)])],
        **kwargs,
    )


async def collect(model: OpenAIResponsesModel, request: ModelRequest | None = None):
    return [chunk async for chunk in model.stream(request or ask())]


async def collect_until_error(model: OpenAIResponsesModel, request: ModelRequest | None = None):
    seen: list[ModelChunk] = []
    with pytest.raises(Exception) as caught:
        async for chunk in model.stream(request or ask()):
            seen.append(chunk)
    return seen, caught.value


# -- streaming --------------------------------------------------------------------------------


async def test_text_streams_then_one_response_with_usage(fake: FakeProviders, responses_model):
    fake.script(
        responses_stream(
            [responses_message("Hel", "lo!")],
            usage=responses_usage(12, 30, cached=8, reasoning=20),
        )
    )

    assert await collect(responses_model) == [
        TextChunk(text="Hel"),
        TextChunk(text="lo!"),
        ModelResponse(
            parts=[TextPart(text="Hello!")],
            usage=Usage(
                requests=1, input_tokens=12, output_tokens=30, cached_tokens=8, reasoning_tokens=20
            ),
            stop_reason="completed",
            finish_reason="stop",
            model_name=RESPONSES_MODEL,
        ),
    ]
    (sent,) = fake.requests
    assert sent.path == "/v1/responses"
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.headers["x-stainless-retry-count"] == "0"
    assert sent.body == {
        "model": "gpt-5",
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": "Hello"}],
    }


async def test_parallel_function_calls_stream_their_arguments_split_anywhere(
    fake: FakeProviders, responses_model
):
    # The arguments of the first call are cut inside a \u escape and between the two halves
    # of a surrogate pair; the HTTP chunks split the SSE lines mid-character as well.
    first = '{"city": "Z\\u00fcrich \\ud83c\\udf27 \\"rain\\""}'
    pieces = ['{"ci', 'ty": "Z\\u00', "fcrich \\ud83c", "\\udf27 \\", '"rain\\""}']
    assert "".join(pieces) == first
    second = '{"city": "Zürich ☔"}'
    stream = responses_stream(
        [
            responses_call("call_a", "weather_today", *pieces),
            responses_call("call_b", "weather_today", second[:12], second[12:]),
        ],
        usage=responses_usage(50, 20),
    )
    stream.chunk_size = 7
    fake.script(stream)

    out = await collect(responses_model, ask(tools=[WEATHER]))

    deltas = [c for c in out if isinstance(c, ToolCallChunk)]
    assert deltas[0] == ToolCallChunk(index=0, id="call_a", name="weather.today")
    assert ToolCallChunk(index=1, id="call_b", name="weather.today") in deltas
    assert "".join(c.args_delta for c in deltas if c.index == 0) == first
    assert "".join(c.args_delta for c in deltas if c.index == 1) == second
    response = out[-1]
    assert isinstance(response, ModelResponse)
    assert response.parts == [
        ToolCallPart(id="call_a", name="weather.today", raw_args=first),
        ToolCallPart(id="call_b", name="weather.today", raw_args=second),
    ]
    assert json.loads(first) == {"city": 'Zürich 🌧 "rain"'}
    assert (response.stop_reason, response.finish_reason) == ("completed", "tool_call")
    body = fake.requests[0].body
    assert body["tools"] == [
        {
            "type": "function",
            "name": "weather_today",
            "description": "Today's weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            "strict": False,
        }
    ]
    assert body["tool_choice"] == "auto"


async def test_reasoning_summaries_stream_and_the_item_is_kept_as_it_came(
    fake: FakeProviders, responses_model
):
    reasoning = responses_reasoning(["Weigh", "ing."], ["Then answer."], encrypted="gAAA+x/y==")
    reasoning.done["future_field"] = {"kept": True}  # a field this SDK does not know yet
    fake.script(responses_stream([reasoning, responses_message("42")]))

    out = await collect(responses_model)

    assert out[:5] == [
        ReasoningChunk(text="Weigh"),
        ReasoningChunk(text="ing."),
        ReasoningChunk(text="\n\n"),
        ReasoningChunk(text="Then answer."),
        TextChunk(text="42"),
    ]
    assert out[-1].parts == [
        ReasoningPart(
            text="Weighing.\n\nThen answer.",
            provider="openai-responses",
            provider_blocks=[
                {
                    "id": "rs_1",
                    "type": "reasoning",
                    "summary": [
                        {"type": "summary_text", "text": "Weighing."},
                        {"type": "summary_text", "text": "Then answer."},
                    ],
                    "encrypted_content": "gAAA+x/y==",
                    "future_field": {"kept": True},
                }
            ],
        ),
        TextPart(text="42"),
    ]


async def test_a_complete_answer_without_streaming(fake: FakeProviders, retry: RetryPolicy):
    output = [
        responses_reasoning(["Check the weather."]).done,
        responses_message("Checking.").done,
        responses_call("call_1", "weather_today", '{"city":"Oslo"}').done,
    ]
    fake.script(
        Json(
            responses_object(output, usage=responses_usage(30, 9, cached=10, reasoning=4)),
            headers={"x-request-id": "req_fake"},
        )
    )
    async with OpenAIResponsesModel(
        "gpt-5", api_key="k", base_url=fake.openai_url, retry=retry, stream=False
    ) as model:
        out = await collect(model, ask(tools=[WEATHER]))

    assert out == [
        ReasoningChunk(text="Check the weather."),
        TextChunk(text="Checking."),
        ToolCallChunk(index=0, id="call_1", name="weather.today", args_delta='{"city":"Oslo"}'),
        ModelResponse(
            parts=[
                ReasoningPart(
                    text="Check the weather.",
                    provider="openai-responses",
                    provider_blocks=[output[0]],
                ),
                TextPart(text="Checking."),
                ToolCallPart(id="call_1", name="weather.today", raw_args='{"city":"Oslo"}'),
            ],
            usage=Usage(
                requests=1, input_tokens=30, output_tokens=9, cached_tokens=10, reasoning_tokens=4
            ),
            stop_reason="completed",
            finish_reason="tool_call",
            model_name=RESPONSES_MODEL,
        ),
    ]
    assert "stream" not in fake.requests[0].body
    assert fake.requests[0].body["store"] is False


async def test_a_terminal_event_without_output_keeps_the_items_streamed_done(
    fake: FakeProviders, responses_model
):
    # Some servers that speak the Responses API leave the terminal event's output empty.
    fake.script(
        responses_stream(
            [responses_message("Hi."), responses_call("call_1", "weather_today", "{}")],
            output=[],
        )
    )

    out = await collect(responses_model, ask(tools=[WEATHER]))

    assert out[-1].parts == [
        TextPart(text="Hi."),
        ToolCallPart(id="call_1", name="weather.today", raw_args="{}"),
    ]
    assert out[-1].finish_reason == "tool_call"


@pytest.mark.parametrize(
    ("body", "error", "attempts"),
    [
        (
            responses_object(
                [], status="failed", error={"code": "invalid_prompt", "message": "No."}
            ),
            ModelHTTPError,
            1,  # a lasting error: not retried
        ),
        (
            responses_object([responses_message("Hal").done], status="in_progress"),
            IncompleteResponseError,
            2,
        ),
    ],
    ids=["failed", "in-progress"],
)
async def test_a_complete_answer_that_is_not_finished_is_refused(
    fake: FakeProviders, sleeper, body: dict[str, Any], error: type[Exception], attempts: int
):
    fake.script(*[Json(body)] * attempts)
    policy = RetryPolicy(max_attempts=2, sleep=sleeper, random=lambda: 0.0)
    async with OpenAIResponsesModel(
        "gpt-5", api_key="k", base_url=fake.openai_url, retry=policy, stream=False
    ) as model:
        with pytest.raises(error) as caught:
            await collect(model)
    assert caught.value.attempts == attempts
    if error is ModelHTTPError:
        assert caught.value.message == "No. (invalid_prompt)"
    else:
        assert caught.value.missing == "finished status"


async def test_a_refusal_is_the_answer_text(fake: FakeProviders, responses_model):
    refusal = {"type": "refusal", "refusal": "I can't help with that."}
    message = responses_item(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [refusal],
        },
        events=[
            {
                "type": "response.refusal.delta",
                "content_index": 0,
                "delta": "I can't help with that.",
            }
        ],
    )
    fake.script(responses_stream([message]))

    out = await collect(responses_model)

    assert out[0] == TextChunk(text="I can't help with that.")
    assert out[-1].parts == [TextPart(text="I can't help with that.")]
    assert out[-1].finish_reason == "stop"


# -- what is sent -----------------------------------------------------------------------------


def reasoning_item(id: str, encrypted: str) -> dict[str, Any]:
    return {
        "id": id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Look it up first."}],
        "encrypted_content": encrypted,
    }


async def test_history_is_sent_as_items_with_each_output_after_its_call(
    fake: FakeProviders, responses_model
):
    waiting = ToolCallPart(id="c3", name="orders.refund", args={"amount": 5}, status="waiting")
    ours = reasoning_item("rs_9", "gAAA-ours==")
    history = [
        Message(id="m0", role="system", parts=[TextPart(text="Earlier summary.")]),
        Message(id="m1", role="user", parts=[TextPart(text="Refund A1")]),
        Message(
            id="m2",
            role="assistant",
            parts=[
                ReasoningPart(text="hmm", signature="sig", provider="anthropic"),
                ReasoningPart(text="ours", provider="openai-responses", provider_blocks=[ours]),
                TextPart(text="Looking."),
                ToolCallPart(
                    id="c1",
                    name="orders.lookup",
                    args={"id": "A1"},
                    status="completed",
                    result=ToolResult(data={"total": 5}),
                ),
                ToolCallPart(
                    id="c2",
                    name="orders.lookup",
                    raw_args="{oops",
                    status="failed",
                    result=ToolResult.failure("not JSON"),
                ),
            ],
        ),
        Message(id="m3", role="user", parts=[TextPart(text="Use your tools.", synthetic=True)]),
        Message(
            id="m4",
            role="assistant",
            parts=[ReasoningPart(text="no item", provider="openai-responses"), waiting],
        ),
    ]
    fake.script(responses_stream([responses_message("ok")]))

    await collect(responses_model, ModelRequest(agent="a", instructions=None, messages=history))

    body = fake.requests[0].body
    assert "instructions" not in body
    assert body["input"] == [
        {"role": "system", "content": "Earlier summary."},
        {"role": "user", "content": "Refund A1"},
        ours,
        {"role": "assistant", "content": "Looking."},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "orders_lookup",
            "arguments": '{"id":"A1"}',
        },
        # Not an object: it never ran (its result says why); strict servers refuse the rest.
        {"type": "function_call", "call_id": "c2", "name": "orders_lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": '{"total":5}'},
        {"type": "function_call_output", "call_id": "c2", "output": "Error: not JSON"},
        {"role": "user", "content": "Use your tools."},
        {
            "type": "function_call",
            "call_id": "c3",
            "name": "orders_refund",
            "arguments": '{"amount":5}',
        },
        {"type": "function_call_output", "call_id": "c3", "output": AWAITING},
    ]


async def test_reasoning_the_api_would_refuse_is_not_sent_back(
    fake: FakeProviders, responses_model
):
    unencrypted = {"id": "rs_1", "type": "reasoning", "summary": []}
    trailing = reasoning_item("rs_2", "gAAA-cut==")
    kept = reasoning_item("rs_3", "gAAA-kept==")
    history = [
        Message(id="m1", role="user", parts=[TextPart(text="Hi")]),
        Message(
            id="m2",
            role="assistant",
            parts=[
                ReasoningPart(text="", provider="openai-responses", provider_blocks=[unencrypted]),
                TextPart(text="Hello."),
            ],
        ),
        Message(id="m3", role="user", parts=[TextPart(text="Think hard.")]),
        Message(  # cut by max_output_tokens while reasoning: nothing followed
            id="m4",
            role="assistant",
            parts=[ReasoningPart(text="", provider="openai-responses", provider_blocks=[trailing])],
        ),
        Message(id="m5", role="user", parts=[TextPart(text="Go on.")]),
        Message(
            id="m6",
            role="assistant",
            parts=[
                ReasoningPart(text="", provider="openai-responses", provider_blocks=[kept]),
                TextPart(text="Done."),
            ],
        ),
    ]
    fake.script(responses_stream([responses_message("ok")]))

    await collect(responses_model, ModelRequest(agent="a", instructions=None, messages=history))

    assert fake.requests[0].body["input"] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Think hard."},
        {"role": "user", "content": "Go on."},
        kept,
        {"role": "assistant", "content": "Done."},
    ]


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
async def test_tool_choice_and_structured_output_are_sent(
    fake: FakeProviders, responses_model, choice: str
):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fake.script(responses_stream([responses_message('{"n": 1}')]))

    await collect(responses_model, ask(tools=[WEATHER], tool_choice=choice, output_schema=schema))

    body = fake.requests[0].body
    assert body["tool_choice"] == choice
    assert body["text"] == {
        "format": {"type": "json_schema", "name": "final_output", "schema": schema}
    }


async def test_settings_are_sent_and_their_include_is_added(fake: FakeProviders, retry):
    fake.script(responses_stream([responses_message("ok")]))
    async with OpenAIResponsesModel(
        "o4-mini",
        api_key="k",
        base_url=fake.openai_url,
        retry=retry,
        settings={
            "reasoning": {"effort": "low", "summary": "auto"},
            "max_output_tokens": 500,
            "include": ["message.output_text.logprobs", "reasoning.encrypted_content"],
        },
    ) as model:
        await collect(model)
    body = fake.requests[0].body
    assert body["reasoning"] == {"effort": "low", "summary": "auto"}
    assert body["max_output_tokens"] == 500
    assert body["include"] == ["reasoning.encrypted_content", "message.output_text.logprobs"]


# -- failures and retries ---------------------------------------------------------------------


async def test_429_waits_as_retry_after_says_then_succeeds(
    fake: FakeProviders, responses_model, sleeper
):
    fake.script(
        openai_error(429, "Rate limit reached", "requests", headers={"retry-after": "7"}),
        responses_stream([responses_message("ok")]),
    )

    out = await collect(responses_model)

    assert out[-1].parts == [TextPart(text="ok")]
    assert sleeper.waits == [7.0]
    assert len(fake.requests) == 2


async def test_500_twice_then_success_backs_off_exponentially(
    fake: FakeProviders, responses_model, sleeper
):
    fake.script(
        openai_error(500, "The server had an error", "server_error"),
        openai_error(503, "Overloaded", "server_error"),
        responses_stream([responses_message("ok")]),
    )

    out = await collect(responses_model)

    assert out[-1].parts == [TextPart(text="ok")]
    assert sleeper.waits == [0.5, 1.0]


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "invalid_api_key"), (404, "not_found")],
)
async def test_client_errors_are_not_retried(
    fake: FakeProviders, responses_model, sleeper, status: int, kind: str
):
    fake.script(openai_error(status, f"Nope ({kind})", kind))

    with pytest.raises(ModelHTTPError) as caught:
        await collect(responses_model)

    error = caught.value
    assert (error.status, error.provider, error.request_id, error.message, error.attempts) == (
        status,
        "openai-responses",
        f"req_{status}",
        f"Nope ({kind})",
        1,
    )
    assert sleeper.waits == []
    assert len(fake.requests) == 1


async def test_a_stream_cut_before_any_output_is_retried(fake: FakeProviders, responses_model):
    cut = responses_stream([responses_message("x")], cut_after=2)  # created and in_progress
    fake.script(cut, Drop(), responses_stream([responses_message("whole")]))

    out = await collect(responses_model)

    assert out == [TextChunk(text="whole"), out[-1]]
    assert out[-1].parts == [TextPart(text="whole")]
    assert len(fake.requests) == 3


async def test_a_stream_cut_after_output_is_not_retried(fake: FakeProviders, responses_model):
    # created, in_progress, output_item.added, content_part.added, the first delta
    fake.script(responses_stream([responses_message("Half", "...")], cut_after=5))

    seen, error = await collect_until_error(responses_model)

    assert seen == [TextChunk(text="Half")]
    assert isinstance(error, IncompleteResponseError)
    assert (error.provider, error.missing, error.attempts) == ("openai-responses", TERMINAL, 1)
    assert "not retried" in str(error)
    assert len(fake.requests) == 1


@pytest.mark.parametrize("end", ["clean", "cut"])
async def test_a_stream_without_its_terminal_event_is_retried_before_output(
    fake: FakeProviders, responses_model, end: str
):
    empty = responses_stream([], terminal=False, cut_after=2 if end == "cut" else None)
    fake.script(empty, responses_stream([responses_message("whole")]))

    out = await collect(responses_model)

    assert out[-1].parts == [TextPart(text="whole")]
    assert len(fake.requests) == 2


@pytest.mark.parametrize("end", ["clean", "cut"])
async def test_a_stream_without_its_terminal_event_after_text_is_incomplete(
    fake: FakeProviders, responses_model, sleeper, end: str
):
    stream = responses_stream([responses_message("Half")], terminal=False)
    if end == "cut":
        stream.cut_after = len(stream.frames)
    fake.script(stream)

    seen, error = await collect_until_error(responses_model)

    assert seen == [TextChunk(text="Half")]
    assert isinstance(error, IncompleteResponseError)
    assert str(error).startswith(f"openai-responses: the response ended without its {TERMINAL}: ")
    assert str(error).endswith("(the stream broke after output had started, so it was not retried)")
    assert sleeper.waits == []
    assert len(fake.requests) == 1


async def test_incomplete_streams_give_up_with_incomplete_response_error(
    fake: FakeProviders, responses_model, sleeper
):
    fake.script(*[responses_stream([], terminal=False)] * 4)

    with pytest.raises(IncompleteResponseError) as caught:
        await collect(responses_model)

    assert caught.value.attempts == 4
    assert str(caught.value) == (
        f"openai-responses: the response ended without its {TERMINAL}: the body ended with no "
        "error (after 4 attempts)"
    )
    assert sleeper.waits == [0.5, 1.0, 2.0]


@pytest.mark.parametrize("cut", [False, True])
async def test_a_truncated_terminal_event_is_incomplete(
    fake: FakeProviders, responses_model, cut: bool
):
    # The body ends inside the JSON of response.completed: the call's arguments had all
    # streamed, but the response never said it was finished, so the call is never handed over.
    stream = responses_stream([responses_call("call_1", "weather_today", '{"city": "Oslo"}')])
    body = b"".join(stream.frames)
    stream.truncate = body.index(b'"type": "response.completed"') + 10
    stream.cut = cut
    fake.script(stream)

    seen, error = await collect_until_error(responses_model, ask(tools=[WEATHER]))

    assert next(c for c in seen if isinstance(c, ToolCallChunk)).id == "call_1"
    assert not any(isinstance(c, ModelResponse) for c in seen)
    assert isinstance(error, IncompleteResponseError)
    assert error.missing == TERMINAL
    assert len(fake.requests) == 1


async def test_a_stream_cut_after_its_terminal_event_is_whole(fake: FakeProviders, responses_model):
    stream = responses_stream([responses_message("Done.")], usage=responses_usage(9, 2))
    stream.cut_after = len(stream.frames)  # the connection closes without the body's end
    fake.script(stream)

    out = await collect(responses_model)

    assert out[-1] == ModelResponse(
        parts=[TextPart(text="Done.")],
        usage=Usage(requests=1, input_tokens=9, output_tokens=2),
        stop_reason="completed",
        finish_reason="stop",
        model_name=RESPONSES_MODEL,
    )
    assert len(fake.requests) == 1


@pytest.mark.parametrize("cut", [False, True])
async def test_a_body_ending_inside_a_character_after_text_is_incomplete(
    fake: FakeProviders, responses_model, cut: bool
):
    stream = responses_stream([responses_message("Weather in ", "Zürich")])
    fake.script(stream.ending_inside("ü", cut=cut))

    seen, error = await collect_until_error(responses_model)

    assert seen == [TextChunk(text="Weather in ")]
    assert isinstance(error, IncompleteResponseError)
    assert "not retried" in str(error)
    assert len(fake.requests) == 1


async def test_a_failed_response_with_a_passing_error_is_retried(
    fake: FakeProviders, responses_model, sleeper
):
    failed = {"code": "server_error", "message": "The model crashed"}
    fake.script(
        responses_stream([], failed=failed),
        responses_stream([responses_message("ok")]),
    )

    out = await collect(responses_model)

    assert out[-1].parts == [TextPart(text="ok")]
    assert sleeper.waits == [0.5]


async def test_a_failed_response_with_a_lasting_error_is_not_retried(
    fake: FakeProviders, responses_model, sleeper
):
    failed = {"code": "invalid_prompt", "message": "Your prompt was flagged."}
    fake.script(responses_stream([], failed=failed))

    with pytest.raises(ModelHTTPError) as caught:
        await collect(responses_model)

    error = caught.value
    assert (error.status, error.provider, error.request_id, error.attempts) == (
        None,
        "openai-responses",
        "req_fake",
        1,
    )
    assert error.message == "Your prompt was flagged. (invalid_prompt)"
    assert sleeper.waits == []


async def test_an_error_event_after_output_fails_the_stream(fake: FakeProviders, responses_model):
    stream = responses_stream([responses_message("Half")], terminal=False)
    error = {"type": "error", "code": "server_error", "message": "Overloaded", "param": None}
    stream.frames = [*stream.frames, sse({**error, "sequence_number": 50}, "error")]
    fake.script(stream)

    seen, caught = await collect_until_error(responses_model)

    assert seen == [TextChunk(text="Half")]
    assert isinstance(caught, ModelHTTPError)
    assert caught.message.startswith("Overloaded (server_error)")
    assert "not retried" in caught.message
    assert len(fake.requests) == 1


async def test_arguments_for_a_call_never_opened_are_refused(fake: FakeProviders, responses_model):
    stray = responses_item(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [],
        },
        events=[{"type": "response.function_call_arguments.delta", "delta": '{"city": "Oslo"}'}],
    )
    fake.script(responses_stream([stray]))

    with pytest.raises(ModelError) as caught:
        await collect(responses_model, ask(tools=[WEATHER]))

    assert not isinstance(caught.value, IncompleteResponseError)
    assert "function-call arguments came for output 0, where no function call was opened" in str(
        caught.value
    )
    assert len(fake.requests) == 1


# -- finish reasons ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "normalized"),
    [("max_output_tokens", "length"), ("content_filter", "content_filter"), ("steered", "other")],
)
async def test_an_incomplete_response_says_why(
    fake: FakeProviders, responses_model, reason: str, normalized: str
):
    fake.script(
        responses_stream(
            [responses_message("The answer is", status="incomplete")],
            incomplete_reason=reason,
            usage=responses_usage(20, 8),
        )
    )

    out = await collect(responses_model)

    assert out[-1] == ModelResponse(
        parts=[TextPart(text="The answer is")],
        usage=Usage(requests=1, input_tokens=20, output_tokens=8),
        stop_reason=reason,
        finish_reason=normalized,
        model_name=RESPONSES_MODEL,
    )


async def test_a_call_cut_by_the_token_limit_keeps_its_partial_arguments(
    fake: FakeProviders, responses_model
):
    fake.script(
        responses_stream(
            [responses_call("call_1", "weather_today", '{"city": ', '"Os', status="incomplete")],
            incomplete_reason="max_output_tokens",
        )
    )

    out = await collect(responses_model, ask(tools=[WEATHER]))

    assert out[-1].parts == [
        ToolCallPart(id="call_1", name="weather.today", raw_args='{"city": "Os')
    ]
    assert out[-1].finish_reason == "length"


# -- infer ------------------------------------------------------------------------------------


def test_infer_names_the_responses_model(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    model = infer("openai-responses:gpt-5")
    assert isinstance(model, OpenAIResponsesModel)
    assert model.name == "openai-responses:gpt-5"

    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ConfigError) as caught:
        infer("openai-responses:gpt-5")
    assert str(caught.value) == (
        "OpenAIResponsesModel('gpt-5') needs an API key: set the environment variable "
        "OPENAI_API_KEY, or pass api_key=."
    )


# -- end to end -------------------------------------------------------------------------------


@tool(name="weather.today")
def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"Sunny in {city}"


async def test_an_agent_runs_its_tool_and_replays_its_reasoning(
    fake: FakeProviders, responses_model
):
    raw = '{"city":  "Oslo"}'  # as the model wrote it, two spaces and all
    thought = responses_reasoning(["Look it up."], encrypted="gAAA-first==")
    fake.script(
        responses_stream(
            [
                thought,
                responses_call("call_1", "weather_today", raw),
                responses_call("call_2", "weather_tomorrow", "{}"),
            ],
            usage=responses_usage(40, 10, reasoning=6),
        ),
        responses_stream([responses_message("Sunny in Oslo.")], usage=responses_usage(70, 5)),
    )
    agent = Agent("forecaster", instructions="Use your tools.", tools=[weather])

    result = await agent.run(
        "Weather in Oslo?", runtime=Runtime(model=responses_model, ids=sequential_ids())
    )

    assert result.output == "Sunny in Oslo."
    assert result.state.usage == Usage(
        requests=2, input_tokens=110, output_tokens=15, reasoning_tokens=6, tool_calls=1
    )
    second = fake.requests[1].body
    assert second["instructions"] == "Use your tools."
    assert second["store"] is False
    assert second["input"] == [
        {"role": "user", "content": "Weather in Oslo?"},
        thought.done,  # sent back as it came: id, summary, encrypted_content
        {"type": "function_call", "call_id": "call_1", "name": "weather_today", "arguments": raw},
        {
            "type": "function_call",
            "call_id": "call_2",
            "name": "weather_tomorrow",
            "arguments": "{}",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny in Oslo"},
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": "Error: Unknown tool 'weather_tomorrow'. Did you mean 'weather.today'? "
            "Available tools: weather.today.",
        },
    ]


async def test_structured_output_through_an_agent(fake: FakeProviders, responses_model):
    class Forecast(pydantic.BaseModel):
        city: str
        sunny: bool

    fake.script(responses_stream([responses_message('{"city": "Oslo", ', '"sunny": true}')]))
    agent = Agent("forecaster", output_type=Forecast)

    result = await agent.run("Oslo?", runtime=Runtime(model=responses_model))

    assert result.output == Forecast(city="Oslo", sunny=True)
    text = fake.requests[0].body["text"]
    assert text["format"]["type"] == "json_schema"
    assert text["format"]["schema"]["properties"] == {
        "city": {"title": "City", "type": "string"},
        "sunny": {"title": "Sunny", "type": "boolean"},
    }


def ran_tool() -> tuple[list[str], Any]:
    calls: list[str] = []

    @tool(name="weather.today")
    def get_weather(city: str, note: str = "") -> str:
        """Today's weather in a city."""
        calls.append(city)
        return f"Sunny in {city}"

    return calls, get_weather


async def test_a_call_of_an_incomplete_response_is_never_run(fake: FakeProviders, responses_model):
    cut_args = '{"city": "Zürich", "note": "say \\"h'
    fake.script(
        responses_stream(
            [responses_call("call_1", "weather_today", cut_args, status="incomplete")],
            incomplete_reason="max_output_tokens",
        ),
        responses_stream([responses_message("My answer was too long; sorry.")]),
    )
    calls, get_weather = ran_tool()
    run = Agent("forecaster", tools=[get_weather]).run_stream(
        "Weather?", runtime=Runtime(model=responses_model, ids=sequential_ids())
    )
    events = [e async for e in run]

    assert calls == []  # neither as sent nor "repaired" into valid JSON
    assert [e.finish_reason for e in events if e.type == "usage"] == ["length", "stop"]
    assert "tool-call-started" not in [e.type for e in events]
    sent = fake.requests[1].body["input"]
    assert sent[-2] == {
        "type": "function_call",
        "call_id": "call_1",
        "name": "weather_today",
        "arguments": "{}",  # never run, and not an object: its result says why
    }
    assert sent[-1]["type"] == "function_call_output"
    assert sent[-1]["output"].startswith("Error: Not run: your response was cut off by the")
    assert run.result.output == "My answer was too long; sorry."


async def test_a_call_whose_stream_has_no_end_is_never_run(fake: FakeProviders, responses_model):
    fake.script(
        responses_stream(
            [responses_call("call_1", "weather_today", '{"city": "Zü')], terminal=False
        )
    )
    calls, get_weather = ran_tool()
    run = Agent("forecaster", tools=[get_weather]).run_stream(
        "Weather?", runtime=Runtime(model=responses_model)
    )
    events = [e async for e in run]

    assert calls == []
    assert events[-1].type == "run-failed"
    assert events[-1].error.startswith("IncompleteResponseError: openai-responses: ")
    assert run.result.outcome == "failed"
    for message in run.result.state.messages:
        for part in message.tool_calls:
            assert part.result is not None


async def test_calls_that_never_ran_go_back_to_a_strict_server_as_objects(
    fake: FakeProviders, responses_model
):
    # vLLM's Responses API renders the history through the chat template too: arguments that
    # are not a JSON object fail every later request of the session with a 400.
    fake.strict_arguments = True
    fake.script(
        responses_stream(
            [
                responses_call("call_1", "weather_today", "[1]"),
                responses_call("call_2", "weather_today", '{"city": ', '"Oslo"}'),
            ]
        ),
        responses_stream(
            [responses_call("call_3", "weather_today", '{"city": "Zü', status="incomplete")],
            incomplete_reason="max_output_tokens",
        ),
        responses_stream([responses_message("Sunny in Oslo.")]),
    )
    calls, get_weather = ran_tool()

    result = await Agent("forecaster", tools=[get_weather]).run(
        "Weather?", runtime=Runtime(model=responses_model, ids=sequential_ids())
    )

    assert (result.outcome, result.output) == ("completed", "Sunny in Oslo.")
    assert calls == ["Oslo"]
    sent = [i for i in fake.requests[2].body["input"] if i.get("type") == "function_call"]
    assert [(i["call_id"], i["arguments"]) for i in sent] == [
        ("call_1", "{}"),
        ("call_2", '{"city": "Oslo"}'),
        ("call_3", "{}"),
    ]
