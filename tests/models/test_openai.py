"""`OpenAIModel` against the fake server: the real `openai` SDK over real HTTP."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fake_providers import (
    AZURE_SAFE,
    Drop,
    FakeProviders,
    Hang,
    Json,
    Stream,
    azure_annotation,
    azure_chunk,
    azure_prompt_filter,
    azure_stream,
    openai_chunk,
    openai_completion,
    openai_error,
    openai_stream,
    openai_usage,
    sse,
)
from handrail import (
    Agent,
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
)
from handrail.models.openai import OpenAIModel
from handrail.models.retry import RetryPolicy
from handrail.runtime import sequential_ids

FIXTURES = Path(__file__).parent / "fixtures"
WEATHER = ToolDefinition(
    name="weather.today",
    description="Today's weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


def ask(text: str = "Hello", **kwargs: Any) -> ModelRequest:
    return ModelRequest(
        agent="a",
        instructions="Be brief.",
        messages=[Message(id="m1", role="user", parts=[TextPart(text=text)])],
        **kwargs,
    )


async def collect(model: OpenAIModel, request: ModelRequest | None = None) -> list[ModelChunk]:
    return [chunk async for chunk in model.stream(request or ask())]


def tool_call(index: int, *, id: str | None = None, name: str | None = None, args: str = ""):
    function: dict[str, Any] = {"arguments": args}
    if name is not None:
        function["name"] = name
    call: dict[str, Any] = {"index": index, "function": function}
    if id is not None:
        call |= {"id": id, "type": "function"}
    return call


# -- streaming --------------------------------------------------------------------------------


async def test_text_streams_then_one_response_with_usage(fake: FakeProviders, openai_model):
    fake.script(
        openai_stream(
            [
                openai_chunk(role="assistant", content=""),
                openai_chunk(content="Hel"),
                openai_chunk(content="lo!"),
                openai_chunk(finish_reason="stop"),
            ],
            usage=openai_usage(12, 3, cached=8),
        )
    )

    assert await collect(openai_model) == [
        TextChunk(text="Hel"),
        TextChunk(text="lo!"),
        ModelResponse(
            parts=[TextPart(text="Hello!")],
            usage=Usage(requests=1, input_tokens=12, output_tokens=3, cached_tokens=8),
            stop_reason="stop",
            finish_reason="stop",
            model_name="gpt-4o-mini-2024-07-18",
        ),
    ]
    (sent,) = fake.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.headers["x-stainless-retry-count"] == "0"
    assert sent.body == {
        "model": "gpt-4o-mini",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello"},
        ],
    }


async def test_parallel_tool_calls_stream_their_arguments_split_anywhere(
    fake: FakeProviders, openai_model
):
    # The arguments of the first call are cut inside a \u escape and between the two halves
    # of a surrogate pair; the HTTP chunks split the SSE lines mid-character as well.
    first = '{"city": "Z\\u00fcrich \\ud83c\\udf27 \\"rain\\""}'
    pieces = ['{"ci', 'ty": "Z\\u00', "fcrich \\ud83c", "\\udf27 \\", '"rain\\""}']
    assert "".join(pieces) == first
    second = '{"city": "Zürich ☔"}'
    chunks = [openai_chunk(role="assistant", content=None)]
    chunks.append(openai_chunk(tool_calls=[tool_call(0, id="call_a", name="weather_today")]))
    chunks.append(openai_chunk(tool_calls=[tool_call(1, id="call_b", name="weather_today")]))
    for piece in pieces:
        chunks.append(openai_chunk(tool_calls=[tool_call(0, args=piece)]))
    chunks.append(openai_chunk(tool_calls=[tool_call(1, args=second[:12])]))
    chunks.append(openai_chunk(tool_calls=[tool_call(1, args=second[12:])]))
    chunks.append(openai_chunk(finish_reason="tool_calls"))
    stream = openai_stream(chunks, usage=openai_usage(50, 20))
    stream.chunk_size = 7
    fake.script(stream)

    out = await collect(openai_model, ask(tools=[WEATHER]))

    deltas = [c for c in out if isinstance(c, ToolCallChunk)]
    assert deltas[:2] == [
        ToolCallChunk(index=0, id="call_a", name="weather.today"),
        ToolCallChunk(index=1, id="call_b", name="weather.today"),
    ]
    assert "".join(c.args_delta for c in deltas if c.index == 0) == first
    response = out[-1]
    assert isinstance(response, ModelResponse)
    assert response.parts == [
        ToolCallPart(id="call_a", name="weather.today", raw_args=first),
        ToolCallPart(id="call_b", name="weather.today", raw_args=second),
    ]
    assert json.loads(first) == {"city": 'Zürich 🌧 "rain"'}
    assert response.stop_reason == "tool_calls"
    body = fake.requests[0].body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather_today",
                "description": "Today's weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    assert body["tool_choice"] == "auto"


async def test_reasoning_from_a_compatible_server_streams_as_reasoning(
    fake: FakeProviders, openai_model
):
    fake.script(
        openai_stream(
            [
                openai_chunk(role="assistant", reasoning_content="Think"),
                openai_chunk(reasoning_content="ing."),
                openai_chunk(content="42"),
                openai_chunk(finish_reason="stop"),
            ]
        )
    )

    out = await collect(openai_model)

    assert out[:3] == [
        ReasoningChunk(text="Think"),
        ReasoningChunk(text="ing."),
        TextChunk(text="42"),
    ]
    assert out[-1] == ModelResponse(
        parts=[ReasoningPart(text="Thinking.", provider="openai"), TextPart(text="42")],
        usage=Usage(requests=1),
        stop_reason="stop",
        finish_reason="stop",
        model_name="gpt-4o-mini-2024-07-18",
    )


async def test_a_complete_answer_without_streaming(fake: FakeProviders, retry: RetryPolicy):
    fake.script(
        openai_completion(
            {
                "content": "Checking.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather_today", "arguments": '{"city":"Oslo"}'},
                    }
                ],
            },
            finish_reason="tool_calls",
            usage=openai_usage(30, 9, cached=10),
        )
    )
    async with OpenAIModel(
        "gpt-4o-mini", api_key="k", base_url=fake.openai_url, retry=retry, stream=False
    ) as model:
        out = await collect(model, ask(tools=[WEATHER]))

    assert out == [
        TextChunk(text="Checking."),
        ToolCallChunk(index=0, id="call_1", name="weather.today", args_delta='{"city":"Oslo"}'),
        ModelResponse(
            parts=[
                TextPart(text="Checking."),
                ToolCallPart(id="call_1", name="weather.today", raw_args='{"city":"Oslo"}'),
            ],
            usage=Usage(requests=1, input_tokens=30, output_tokens=9, cached_tokens=10),
            stop_reason="tool_calls",
            finish_reason="tool_call",
            model_name="gpt-4o-mini-2024-07-18",
        ),
    ]
    assert "stream" not in fake.requests[0].body


async def test_reasoning_tokens_are_counted_in_the_usage(fake: FakeProviders, openai_model):
    fake.script(
        openai_stream([openai_chunk(content="42")], usage=openai_usage(10, 50, reasoning=44))
    )

    out = await collect(openai_model)

    assert out[-1].usage == Usage(
        requests=1, input_tokens=10, output_tokens=50, reasoning_tokens=44
    )


# -- what is sent -----------------------------------------------------------------------------


async def test_history_is_sent_with_each_result_after_its_call(fake: FakeProviders, openai_model):
    waiting = ToolCallPart(id="c3", name="orders.refund", args={"amount": 5}, status="waiting")
    history = [
        Message(id="m1", role="user", parts=[TextPart(text="Refund A1")]),
        Message(
            id="m2",
            role="assistant",
            parts=[
                ReasoningPart(text="hmm", signature="sig", provider="anthropic"),
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
        Message(id="m4", role="assistant", parts=[waiting]),
    ]
    fake.script(openai_stream([openai_chunk(content="ok")]))

    await collect(openai_model, ModelRequest(agent="a", instructions=None, messages=history))

    assert fake.requests[0].body["messages"] == [
        {"role": "user", "content": "Refund A1"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "orders_lookup", "arguments": '{"id":"A1"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    # Not an object: it never ran (its result says why); strict servers
                    # refuse any `arguments` but an object.
                    "function": {"name": "orders_lookup", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"total":5}'},
        {"role": "tool", "tool_call_id": "c2", "content": "Error: not JSON"},
        {"role": "user", "content": "Use your tools."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c3",
                    "type": "function",
                    "function": {"name": "orders_refund", "arguments": '{"amount":5}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c3",
            "content": "This call has not run yet: it is waiting for a decision (a person's "
            "approval or answer, or a client's result). Do not assume an outcome.",
        },
    ]


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
async def test_tool_choice_and_structured_output_are_sent(
    fake: FakeProviders, openai_model, choice: str
):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fake.script(openai_stream([openai_chunk(content='{"n": 1}')]))

    await collect(openai_model, ask(tools=[WEATHER], tool_choice=choice, output_schema=schema))

    body = fake.requests[0].body
    assert body["tool_choice"] == choice
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "final_output", "schema": schema},
    }


async def test_settings_are_sent_as_they_are(fake: FakeProviders, retry: RetryPolicy):
    fake.script(openai_stream([openai_chunk(content="ok")]))
    async with OpenAIModel(
        "o4-mini",
        api_key="k",
        base_url=fake.openai_url,
        retry=retry,
        settings={"temperature": 0.2, "reasoning_effort": "low"},
    ) as model:
        await collect(model)
    assert fake.requests[0].body["temperature"] == 0.2
    assert fake.requests[0].body["reasoning_effort"] == "low"


# -- failures and retries ---------------------------------------------------------------------


async def test_429_waits_as_retry_after_says_then_succeeds(
    fake: FakeProviders, openai_model, sleeper
):
    fake.script(
        openai_error(429, "Rate limit reached", "requests", headers={"retry-after": "7"}),
        openai_stream([openai_chunk(content="ok")]),
    )

    out = await collect(openai_model)

    assert out[-1].parts == [TextPart(text="ok")]
    assert sleeper.waits == [7.0]
    assert len(fake.requests) == 2


async def test_500_twice_then_success_backs_off_exponentially(
    fake: FakeProviders, openai_model, sleeper
):
    fake.script(
        openai_error(500, "The server had an error", "server_error"),
        openai_error(503, "Overloaded", "server_error"),
        openai_stream([openai_chunk(content="ok")]),
    )

    out = await collect(openai_model)

    assert out[-1].parts == [TextPart(text="ok")]
    assert sleeper.waits == [0.5, 1.0]


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "invalid_api_key"), (404, "not_found")],
)
async def test_client_errors_are_not_retried(
    fake: FakeProviders, openai_model, sleeper, status: int, kind: str
):
    fake.script(openai_error(status, f"Nope ({kind})", kind))

    with pytest.raises(ModelHTTPError) as caught:
        await collect(openai_model)

    error = caught.value
    assert (error.status, error.provider, error.request_id, error.message, error.attempts) == (
        status,
        "openai",
        f"req_{status}",
        f"Nope ({kind})",
        1,
    )
    assert str(error) == f"openai: HTTP {status}: Nope ({kind}) (request id req_{status})"
    assert sleeper.waits == []
    assert len(fake.requests) == 1


async def test_retries_give_up_with_the_last_error(fake: FakeProviders, openai_model, sleeper):
    fake.script(*[openai_error(500, "down", "server_error")] * 4)

    with pytest.raises(ModelHTTPError) as caught:
        await collect(openai_model)

    assert caught.value.attempts == 4
    assert str(caught.value) == "openai: HTTP 500 after 4 attempts: down (request id req_500)"
    assert sleeper.waits == [0.5, 1.0, 2.0]


async def test_a_stream_cut_before_any_output_is_retried(fake: FakeProviders, openai_model):
    cut = openai_stream([openai_chunk(role="assistant", content=""), openai_chunk(content="x")])
    cut.cut_after = 1  # the role-only chunk went out, nothing the caller would see
    fake.script(cut, Drop(), openai_stream([openai_chunk(content="whole")]))

    out = await collect(openai_model)

    assert out == [TextChunk(text="whole"), out[-1]]
    assert len(fake.requests) == 3


async def test_a_stream_cut_after_output_is_not_retried(fake: FakeProviders, openai_model):
    fake.script(
        openai_stream([openai_chunk(content="Half"), openai_chunk(content="...")], cut_after=1)
    )
    seen: list[ModelChunk] = []

    with pytest.raises(IncompleteResponseError) as caught:
        async for chunk in openai_model.stream(ask()):
            seen.append(chunk)

    assert seen == [TextChunk(text="Half")]
    assert (caught.value.provider, caught.value.missing, caught.value.attempts) == (
        "openai",
        "finish_reason",
        1,
    )
    assert "not retried" in str(caught.value)
    assert len(fake.requests) == 1


async def test_an_error_event_inside_the_stream_is_a_failure(fake: FakeProviders, openai_model):
    error = {"error": {"message": "The model crashed", "type": "server_error"}}
    fake.script(
        Stream([sse(error)]),
        openai_stream([openai_chunk(content="ok")]),
    )
    out = await collect(openai_model)
    assert out[-1].parts == [TextPart(text="ok")]


async def test_a_response_that_never_comes_times_out(fake: FakeProviders, sleeper):
    fake.script(Hang(), Hang())
    policy = RetryPolicy(max_attempts=2, sleep=sleeper, random=lambda: 0.0)
    async with OpenAIModel(
        "gpt-4o-mini", api_key="k", base_url=fake.openai_url, retry=policy, timeout=0.2
    ) as model:
        with pytest.raises(ModelHTTPError) as caught:
            await collect(model)
    assert caught.value.status is None
    assert caught.value.attempts == 2
    assert "timed out" in caught.value.message


# -- finish reasons and incomplete answers ----------------------------------------------------


async def test_a_length_stop_mid_tool_call_keeps_the_partial_call_as_it_is(
    fake: FakeProviders, openai_model
):
    fake.script(
        openai_stream(
            [
                openai_chunk(tool_calls=[tool_call(0, id="call_1", name="weather_today")]),
                openai_chunk(tool_calls=[tool_call(0, args='{"city": ')]),
                openai_chunk(tool_calls=[tool_call(0, args='"Os')]),
                openai_chunk(finish_reason="length"),
            ],
            usage=openai_usage(20, 8),
        )
    )

    out = await collect(openai_model, ask(tools=[WEATHER]))

    assert out[-1] == ModelResponse(
        parts=[ToolCallPart(id="call_1", name="weather.today", raw_args='{"city": "Os')],
        usage=Usage(requests=1, input_tokens=20, output_tokens=8),
        stop_reason="length",
        finish_reason="length",
        model_name="gpt-4o-mini-2024-07-18",
    )


async def test_a_length_stop_mid_text_says_length(fake: FakeProviders, openai_model):
    fake.script(openai_stream([openai_chunk(content="The answer is")], finish_reason="length"))

    out = await collect(openai_model)

    assert out[-1].parts == [TextPart(text="The answer is")]
    assert (out[-1].stop_reason, out[-1].finish_reason) == ("length", "length")


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("stop", "stop"),
        ("tool_calls", "tool_call"),
        ("function_call", "tool_call"),
        ("length", "length"),
        ("content_filter", "content_filter"),
        ("eos", "stop"),
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("model_length", "length"),
        ("max_tokens", "length"),
        ("abort", "other"),
    ],
)
async def test_each_finish_reason_is_kept_raw_and_normalized(
    fake: FakeProviders, openai_model, raw: str, normalized: str
):
    fake.script(openai_stream([openai_chunk(content="ok")], finish_reason=raw))

    out = await collect(openai_model)

    assert (out[-1].stop_reason, out[-1].finish_reason) == (raw, normalized)


def no_finish(*chunks: dict[str, Any], end: str) -> Stream:
    """A stream of `chunks` with no finish_reason, ended as `end` says."""
    if end == "clean":  # the body ends properly, without a finish_reason or [DONE]
        return openai_stream(chunks, finish_reason=None, done=False)
    if end == "done":  # [DONE] came, but no finish_reason ever did
        return openai_stream(chunks, finish_reason=None)
    return openai_stream(chunks, finish_reason=None, cut_after=len(chunks))


@pytest.mark.parametrize("end", ["clean", "done", "cut"])
async def test_a_stream_without_finish_reason_is_retried_before_output(
    fake: FakeProviders, openai_model, end: str
):
    fake.script(
        no_finish(openai_chunk(role="assistant", content=""), end=end),
        openai_stream([openai_chunk(content="whole")]),
    )

    out = await collect(openai_model)

    assert out == [
        TextChunk(text="whole"),
        ModelResponse(
            parts=[TextPart(text="whole")],
            stop_reason="stop",
            finish_reason="stop",
            model_name="gpt-4o-mini-2024-07-18",
        ),
    ]
    assert len(fake.requests) == 2


@pytest.mark.parametrize("end", ["clean", "done", "cut"])
async def test_a_stream_without_finish_reason_after_text_is_incomplete(
    fake: FakeProviders, openai_model, sleeper, end: str
):
    fake.script(no_finish(openai_chunk(content="Half"), end=end))
    seen: list[ModelChunk] = []

    with pytest.raises(IncompleteResponseError) as caught:
        async for chunk in openai_model.stream(ask()):
            seen.append(chunk)

    assert seen == [TextChunk(text="Half")]
    error = caught.value
    assert (error.provider, error.missing, error.attempts) == ("openai", "finish_reason", 1)
    assert str(error).startswith("openai: the response ended without its finish_reason: ")
    assert str(error).endswith("(the stream broke after output had started, so it was not retried)")
    assert sleeper.waits == []
    assert len(fake.requests) == 1


async def test_incomplete_streams_give_up_with_incomplete_response_error(
    fake: FakeProviders, openai_model, sleeper
):
    fake.script(*[no_finish(openai_chunk(role="assistant"), end="clean")] * 4)

    with pytest.raises(IncompleteResponseError) as caught:
        await collect(openai_model)

    assert caught.value.attempts == 4
    assert str(caught.value) == (
        "openai: the response ended without its finish_reason: the body ended with no error "
        "(after 4 attempts)"
    )
    assert sleeper.waits == [0.5, 1.0, 2.0]


async def test_a_stream_cut_after_its_finish_reason_is_whole(fake: FakeProviders, openai_model):
    stream = openai_stream(
        [openai_chunk(content="Done."), openai_chunk(finish_reason="stop")],
        usage=openai_usage(9, 2),
        cut_after=2,  # the usage chunk and [DONE] are lost
    )
    fake.script(stream)

    out = await collect(openai_model)

    assert out[-1] == ModelResponse(
        parts=[TextPart(text="Done.")],
        usage=Usage(requests=1),
        stop_reason="stop",
        finish_reason="stop",
        model_name="gpt-4o-mini-2024-07-18",
    )
    assert len(fake.requests) == 1


@pytest.mark.parametrize("cut", [False, True])
async def test_a_body_ending_inside_a_character_before_any_text_is_retried(
    fake: FakeProviders, openai_model, cut: bool
):
    broken = openai_stream([openai_chunk(content="Zürich")]).ending_inside("ü", cut=cut)
    fake.script(broken, openai_stream([openai_chunk(content="Zürich")]))

    out = await collect(openai_model)

    assert out[0] == TextChunk(text="Zürich")
    assert out[-1].parts == [TextPart(text="Zürich")]
    assert len(fake.requests) == 2


@pytest.mark.parametrize("cut", [False, True])
async def test_a_body_ending_inside_a_character_after_text_is_incomplete(
    fake: FakeProviders, openai_model, cut: bool
):
    stream = openai_stream([openai_chunk(content="Weather in "), openai_chunk(content="Zürich")])
    fake.script(stream.ending_inside("ü", cut=cut))
    seen: list[ModelChunk] = []

    with pytest.raises(IncompleteResponseError) as caught:
        async for chunk in openai_model.stream(ask()):
            seen.append(chunk)

    assert seen == [TextChunk(text="Weather in ")]
    assert "not retried" in str(caught.value)
    if not cut:
        assert "the body ended inside a UTF-8 character" in str(caught.value)
        assert isinstance(caught.value.__cause__.__cause__, UnicodeDecodeError)
    assert len(fake.requests) == 1


def oslo(*, finish_reason: str = "tool_calls", arguments: str = '{"city":"Oslo"}') -> Json:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "weather_today", "arguments": arguments},
    }
    return openai_completion({"content": None, "tool_calls": [call]}, finish_reason=finish_reason)


async def test_a_complete_answer_cut_by_length_says_so(fake: FakeProviders, retry: RetryPolicy):
    fake.script(oslo(finish_reason="length", arguments='{"city":"Os'))
    async with OpenAIModel(
        "gpt-4o-mini", api_key="k", base_url=fake.openai_url, retry=retry, stream=False
    ) as model:
        out = await collect(model, ask(tools=[WEATHER]))

    response = out[-1]
    assert response.parts == [
        ToolCallPart(id="call_1", name="weather.today", raw_args='{"city":"Os')
    ]
    assert (response.stop_reason, response.finish_reason) == ("length", "length")


@pytest.mark.parametrize("ending", ["mid-json", "mid-character", "cut"])
async def test_a_complete_answer_whose_body_ends_early_is_retried(
    fake: FakeProviders, retry: RetryPolicy, ending: str
):
    broken = openai_completion({"content": "Zürich is sunny."})
    body = json.dumps(broken.body, ensure_ascii=False).encode()
    broken.truncate = body.index("ü".encode()) + (1 if ending == "mid-character" else 0)
    broken.cut = ending == "cut"
    fake.script(broken, openai_completion({"content": "Oslo is sunny."}))
    async with OpenAIModel(
        "gpt-4o-mini", api_key="k", base_url=fake.openai_url, retry=retry, stream=False
    ) as model:
        out = await collect(model)

    assert out[-1].parts == [TextPart(text="Oslo is sunny.")]
    assert out[-1].finish_reason == "stop"
    assert len(fake.requests) == 2


async def test_a_complete_answer_whose_body_keeps_ending_early_is_incomplete(
    fake: FakeProviders, sleeper
):
    broken = openai_completion({"content": "Zürich is sunny."})
    broken.truncate = 40
    fake.script(broken, broken)
    policy = RetryPolicy(max_attempts=2, sleep=sleeper, random=lambda: 0.0)
    async with OpenAIModel(
        "gpt-4o-mini", api_key="k", base_url=fake.openai_url, retry=policy, stream=False
    ) as model:
        with pytest.raises(IncompleteResponseError) as caught:
            await collect(model)

    assert caught.value.missing == "complete JSON body"
    assert caught.value.attempts == 2


# -- parallel calls that all say index 0 --------------------------------------------------------


async def test_parallel_calls_at_index_0_are_told_apart_by_their_ids(
    fake: FakeProviders, openai_model
):
    # As Ollama 0.20 streams them: every call at index 0, each with its own id. The first
    # call's arguments also come in pieces, with braces inside a string.
    fake.script(
        openai_stream(
            [
                openai_chunk(
                    tool_calls=[tool_call(0, id="call_a", name="weather_today", args='{"city": ')]
                ),
                openai_chunk(tool_calls=[tool_call(0, args='"Oslo {north}"}')]),
                openai_chunk(
                    tool_calls=[
                        tool_call(0, id="call_b", name="weather_today", args='{"city": "Rome"}')
                    ]
                ),
                openai_chunk(finish_reason="tool_calls"),
            ]
        )
    )

    out = await collect(openai_model, ask(tools=[WEATHER]))

    assert [c for c in out if isinstance(c, ToolCallChunk)] == [
        ToolCallChunk(index=0, id="call_a", name="weather.today", args_delta='{"city": '),
        ToolCallChunk(index=0, args_delta='"Oslo {north}"}'),
        ToolCallChunk(index=1, id="call_b", name="weather.today", args_delta='{"city": "Rome"}'),
    ]
    assert out[-1].parts == [
        ToolCallPart(id="call_a", name="weather.today", raw_args='{"city": "Oslo {north}"}'),
        ToolCallPart(id="call_b", name="weather.today", raw_args='{"city": "Rome"}'),
    ]
    assert out[-1].finish_reason == "tool_call"


@pytest.mark.parametrize(
    ("deltas", "says"),
    [
        (
            [tool_call(3, args='{"city": "Oslo"}')],
            "a delta at index 3 names no call (no id, no tool name) and no call is open there",
        ),
        (
            [
                tool_call(0, id="call_a", name="weather_today", args='{"city": "Oslo"}'),
                tool_call(0, args='{"city": "Rome"}'),
            ],
            "call 'call_a' (weather.today) at index 0 got more arguments "
            """('{"city": "Rome"}') after a complete JSON value, with no new id""",
        ),
        (
            [
                tool_call(0, id="call_a", name="weather_today", args='{"city": "Oslo"} {"ci'),
            ],
            "call 'call_a' (weather.today) at index 0 got more arguments",
        ),
        (
            [
                tool_call(0, id="call_a", name="weather_today", args="{"),
                tool_call(0, name="orders_refund", args="}"),
            ],
            "call 'call_a' (weather.today) at index 0 is named 'orders_refund' with no new id",
        ),
        (
            [
                tool_call(0, id="call_a", name="weather_today", args="{}"),
                tool_call(0, id="call_b", name="weather_today", args="{}"),
                tool_call(0, id="call_a", args="{}"),
            ],
            "call id 'call_a' came again at index 0, where call 'call_b' (weather.today) is open",
        ),
    ],
    ids=["no-call-at-index", "two-objects", "two-objects-one-delta", "renamed", "id-again"],
)
async def test_tool_call_deltas_that_cannot_be_told_apart_are_refused(
    fake: FakeProviders, openai_model, deltas: list[dict[str, Any]], says: str
):
    chunks = [openai_chunk(tool_calls=[delta]) for delta in deltas]
    fake.script(openai_stream(chunks, finish_reason="tool_calls"))

    with pytest.raises(ModelError) as caught:
        await collect(openai_model, ask(tools=[WEATHER]))

    assert not isinstance(caught.value, IncompleteResponseError)
    assert str(caught.value).startswith("openai: the streamed tool calls cannot be told apart: ")
    assert says in str(caught.value)
    assert len(fake.requests) == 1


async def test_a_call_whose_id_comes_later_and_is_repeated_is_one_call(
    fake: FakeProviders, openai_model
):
    fake.script(
        openai_stream(
            [
                openai_chunk(tool_calls=[tool_call(0, name="weather_today", args='{"ci')]),
                openai_chunk(tool_calls=[tool_call(0, id="call_late", args='ty": "Oslo"}')]),
                openai_chunk(tool_calls=[tool_call(0, id="call_late", args="")]),
            ],
            finish_reason="tool_calls",
        )
    )

    out = await collect(openai_model, ask(tools=[WEATHER]))

    assert out[-1].parts == [
        ToolCallPart(id="call_late", name="weather.today", raw_args='{"city": "Oslo"}')
    ]


# -- recorded responses -----------------------------------------------------------------------


async def test_recorded_stream_of_parallel_calls_replays(fake: FakeProviders, openai_model):
    recorded = json.loads((FIXTURES / "openai_stream_parallel_calls.json").read_text())
    fake.script(Stream([sse(e) for e in recorded["events"]]))

    out = await collect(openai_model, ask(tools=[WEATHER]))

    assert out[-1] == ModelResponse(
        parts=[
            ToolCallPart(
                id="call_3GbB9lSyCRd9qBAU7nTsrBfq",
                name="weather.today",
                raw_args='{"city": "Paris"}',
            ),
            ToolCallPart(
                id="call_Kq7eTiwcGVZKFlcVqUxfTC6U",
                name="weather.today",
                raw_args='{"city": "Tokyo"}',
            ),
        ],
        usage=Usage(requests=1, input_tokens=82, output_tokens=52, cached_tokens=0),
        stop_reason="tool_calls",
        finish_reason="tool_call",
        model_name="gpt-4o-mini-2024-07-18",
    )


async def test_recorded_completion_replays(fake: FakeProviders, retry: RetryPolicy):
    recorded = json.loads((FIXTURES / "openai_completion.json").read_text())
    fake.script(Json(recorded))
    async with OpenAIModel(
        "gpt-4o", api_key="k", base_url=fake.openai_url, retry=retry, stream=False
    ) as model:
        out = await collect(model)
    assert out[-1] == ModelResponse(
        parts=[TextPart(text="Hello! How can I assist you today?")],
        usage=Usage(requests=1, input_tokens=19, output_tokens=10, cached_tokens=0),
        stop_reason="stop",
        finish_reason="stop",
        model_name="gpt-4o-2024-08-06",
    )


# -- end to end -------------------------------------------------------------------------------


@tool(name="weather.today")
def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"Sunny in {city}"


async def test_an_agent_runs_its_tool_through_openai(fake: FakeProviders, openai_model):
    fake.script(
        openai_stream(
            [
                openai_chunk(tool_calls=[tool_call(0, id="call_1", name="weather_today")]),
                openai_chunk(tool_calls=[tool_call(0, args='{"city": "Oslo"}')]),
                openai_chunk(tool_calls=[tool_call(1, id="call_2", name="weather_tomorrow")]),
                openai_chunk(finish_reason="tool_calls"),
            ],
            usage=openai_usage(40, 10),
        ),
        openai_stream([openai_chunk(content="Sunny in Oslo.")], usage=openai_usage(70, 5)),
    )
    agent = Agent("forecaster", instructions="Use your tools.", tools=[weather])

    result = await agent.run(
        "Weather in Oslo?", runtime=Runtime(model=openai_model, ids=sequential_ids())
    )

    assert result.output == "Sunny in Oslo."
    assert result.state.usage == Usage(requests=2, input_tokens=110, output_tokens=15, tool_calls=1)
    second = fake.requests[1].body["messages"]
    assert second[-2:] == [
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny in Oslo"},
        {
            "role": "tool",
            "tool_call_id": "call_2",
            "content": "Error: Unknown tool 'weather_tomorrow'. Did you mean 'weather.today'? "
            "Available tools: weather.today.",
        },
    ]


async def test_a_stream_cut_midway_fails_the_run_and_keeps_the_partial_text(
    fake: FakeProviders, openai_model
):
    fake.script(
        openai_stream([openai_chunk(content="It is su"), openai_chunk(content="nny")], cut_after=1)
    )
    agent = Agent("forecaster", tools=[weather])

    run = agent.run_stream("Weather?", runtime=Runtime(model=openai_model))
    events = [e async for e in run]

    assert events[-1].type == "run-failed"
    assert events[-1].error.startswith("IncompleteResponseError: openai: ")
    assert run.result.outcome == "failed"
    assert run.result.state.messages[-1].role == "assistant"
    assert run.result.state.messages[-1].text == "It is su"


# -- end to end: what the provider did not finish is never acted on ---------------------------


def ran_tool() -> tuple[list[str], Any]:
    calls: list[str] = []

    @tool(name="weather.today")
    def get_weather(city: str, note: str = "") -> str:
        """Today's weather in a city."""
        calls.append(city)
        return f"Sunny in {city}"

    return calls, get_weather


async def test_a_tool_call_cut_by_the_token_limit_is_never_run(fake: FakeProviders, openai_model):
    cut_args = '{"city": "Zürich", "note": "say \\"h'
    fake.script(
        openai_stream(
            [
                openai_chunk(tool_calls=[tool_call(0, id="call_1", name="weather_today")]),
                openai_chunk(tool_calls=[tool_call(0, args=cut_args)]),
            ],
            finish_reason="length",
        ),
        openai_stream([openai_chunk(content="My answer was too long; sorry.")]),
    )
    calls, get_weather = ran_tool()
    run = Agent("forecaster", tools=[get_weather]).run_stream(
        "Weather?", runtime=Runtime(model=openai_model, ids=sequential_ids())
    )
    events = [e async for e in run]

    assert calls == []  # neither as sent nor "repaired" into valid JSON
    assert [e.finish_reason for e in events if e.type == "usage"] == ["length", "stop"]
    assert "tool-call-started" not in [e.type for e in events]
    sent = fake.requests[1].body["messages"]
    # Never run, and not an object: `{}` (the result says why; strict servers refuse the rest).
    assert sent[-2]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert sent[-1]["role"] == "tool"
    assert sent[-1]["content"].startswith("Error: Not run: your response was cut off by the")
    assert run.result.output == "My answer was too long; sorry."


async def test_a_text_answer_cut_by_the_token_limit_is_marked_on_the_turn(
    fake: FakeProviders, openai_model
):
    fake.script(openai_stream([openai_chunk(content="First, open the")], finish_reason="length"))
    run = Agent("helper").run_stream("How?", runtime=Runtime(model=openai_model))
    events = [e async for e in run]
    assert (events[-1].type, events[-1].stop_reason, events[-1].finish_reason) == (
        "run-completed",
        "cut",
        "length",
    )


async def test_a_tool_call_whose_stream_has_no_end_is_never_run(fake: FakeProviders, openai_model):
    # The stream ends (cleanly) without a finish_reason: the call may be cut ("Zü" for "Zürich").
    fake.script(
        openai_stream(
            [
                openai_chunk(tool_calls=[tool_call(0, id="call_1", name="weather_today")]),
                openai_chunk(tool_calls=[tool_call(0, args='{"city": "Zü')]),
            ],
            finish_reason=None,
            done=False,
        )
    )
    calls, get_weather = ran_tool()
    run = Agent("forecaster", tools=[get_weather]).run_stream(
        "Weather?", runtime=Runtime(model=openai_model)
    )
    events = [e async for e in run]

    assert calls == []
    assert events[-1].type == "run-failed"
    assert events[-1].error.startswith("IncompleteResponseError: ")
    assert "finish_reason" in events[-1].error
    assert run.result.outcome == "failed"
    # A valid history: the user's message, and no call without its result.
    for message in run.result.state.messages:
        for part in message.tool_calls:
            assert part.result is not None


async def test_only_the_first_choice_is_the_answer_when_choices_interleave(
    fake: FakeProviders, openai_model
):
    # With `n=2` (settings) a server interleaves the second choice; it is never mixed in.
    other = openai_chunk(content="IGNORED", tool_calls=[tool_call(0, id="x", name="weather_today")])
    other["choices"][0]["index"] = 1
    both = openai_chunk(content="lo")
    both["choices"].insert(0, {**other["choices"][0]})
    fake.script(openai_stream([other, openai_chunk(content="Hel"), both]))

    out = await collect(openai_model)

    assert out[-1].parts == [TextPart(text="Hello")]
    assert [c for c in out if isinstance(c, ToolCallChunk)] == []


# -- Azure OpenAI's content filter: chunks without a delta ------------------------------------

FLAGGED = {"custom_blocklists": [{"filtered": True, "id": "svir"}]}


async def test_azure_filter_annotations_are_read_and_kept_on_the_response(
    fake: FakeProviders, openai_model
):
    fake.script(
        azure_stream(
            [
                azure_prompt_filter(),
                azure_chunk(role="assistant", content=""),
                azure_chunk(content="Colour is", results=AZURE_SAFE),
                azure_annotation(offsets=(44, 44, 198)),
                azure_chunk(content=" light.", results=AZURE_SAFE),
                azure_chunk(finish_reason="stop"),
                azure_annotation({"hate": {"filtered": False, "severity": "low"}}),
            ],
            usage=openai_usage(12, 3),
        )
    )

    out = await collect(openai_model)

    assert out[:-1] == [TextChunk(text="Colour is"), TextChunk(text=" light.")]
    assert out[-1] == ModelResponse(
        parts=[TextPart(text="Colour is light.")],
        usage=Usage(requests=1, input_tokens=12, output_tokens=3),
        stop_reason="stop",
        finish_reason="stop",
        model_name="gpt-4o-2024-11-20",  # not the annotations' empty name
        provider_details={
            "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": AZURE_SAFE}],
            "content_filter_results": [
                AZURE_SAFE,
                {"hate": {"filtered": False, "severity": "low"}},
            ],
        },
    )


async def test_an_agent_answers_through_an_azure_stream_with_annotations(
    fake: FakeProviders, openai_model
):
    fake.script(
        azure_stream(
            [
                azure_prompt_filter(),
                azure_chunk(tool_calls=[tool_call(0, id="call_1", name="weather_today")]),
                azure_annotation(),
                azure_chunk(tool_calls=[tool_call(0, args='{"city": "Oslo"}')]),
                azure_chunk(finish_reason="tool_calls"),
                azure_annotation(),
            ],
            usage=openai_usage(40, 10),
        ),
        azure_stream(
            [
                azure_prompt_filter(),
                azure_chunk(content="Sunny."),
                azure_chunk(finish_reason="stop"),
            ]
        ),
    )
    calls, get_weather = ran_tool()

    result = await Agent("forecaster", tools=[get_weather]).run(
        "Weather?", runtime=Runtime(model=openai_model, ids=sequential_ids())
    )

    assert calls == ["Oslo"]
    assert (result.outcome, result.output, result.finish_reason) == ("completed", "Sunny.", "stop")


async def test_a_tool_call_azure_blocks_midway_is_never_run(fake: FakeProviders, openai_model):
    # Azure's asynchronous filter blocks the answer: an annotation with the verdict and the
    # `content_filter` finish, and no delta; `[DONE]` follows at once, with no usage chunk.
    fake.script(
        azure_stream(
            [
                azure_prompt_filter(),
                azure_chunk(tool_calls=[tool_call(0, id="call_1", name="weather_today")]),
                azure_chunk(tool_calls=[tool_call(0, args='{"city": "Oslo"}')]),
                azure_annotation(FLAGGED, finish_reason="content_filter"),
            ]
        ),
        azure_stream(
            [azure_chunk(content="I cannot help with that."), azure_chunk(finish_reason="stop")]
        ),
    )
    calls, get_weather = ran_tool()
    run = Agent("forecaster", tools=[get_weather]).run_stream(
        "Weather?", runtime=Runtime(model=openai_model, ids=sequential_ids())
    )
    events = [e async for e in run]

    assert calls == []
    assert [e.finish_reason for e in events if e.type == "usage"] == ["content_filter", "stop"]
    assert "tool-call-started" not in [e.type for e in events]
    sent = fake.requests[1].body["messages"]
    assert sent[-1]["role"] == "tool"
    assert sent[-1]["content"].startswith("Error: Not run: the provider's content filter stopped")


async def test_a_text_answer_azure_blocks_ends_the_turn_marked_content_filter(
    fake: FakeProviders, openai_model
):
    fake.script(
        azure_stream(
            [
                azure_prompt_filter(),
                azure_chunk(content="Hey Jude, don't"),
                azure_annotation(FLAGGED, finish_reason="content_filter"),
            ]
        )
    )
    run = Agent("helper").run_stream("Sing", runtime=Runtime(model=openai_model))
    events = [e async for e in run]

    assert (events[-1].type, events[-1].stop_reason, events[-1].finish_reason) == (
        "run-completed",
        "cut",
        "content_filter",
    )


async def test_a_verdict_that_filters_after_the_models_stop_blocks_the_answer(
    fake: FakeProviders, openai_model
):
    # Recorded from Azure's asynchronous filter: a block caught after `stop` comes with no
    # finish reason; only the verdict says the answer was blocked.
    fake.script(
        azure_stream(
            [
                azure_chunk(tool_calls=[tool_call(0, id="call_1", name="weather_today")]),
                azure_chunk(tool_calls=[tool_call(0, args='{"city": "Oslo"}')]),
                azure_chunk(finish_reason="tool_calls"),
                azure_annotation(FLAGGED),
            ],
            usage=openai_usage(40, 10),
        ),
        azure_stream([azure_chunk(content="Sorry."), azure_chunk(finish_reason="stop")]),
    )
    calls, get_weather = ran_tool()
    run = Agent("forecaster", tools=[get_weather]).run_stream(
        "Weather?", runtime=Runtime(model=openai_model, ids=sequential_ids())
    )
    events = [e async for e in run]

    assert calls == []
    assert [e.finish_reason for e in events if e.type == "usage"] == ["content_filter", "stop"]


async def test_a_complete_azure_answer_keeps_its_filter_verdicts(
    fake: FakeProviders, retry: RetryPolicy
):
    reply = openai_completion({"content": "Colour is light."}, model="gpt-4o-2024-11-20")
    reply.body["prompt_filter_results"] = [
        {"prompt_index": 0, "content_filter_results": AZURE_SAFE}
    ]
    reply.body["choices"][0]["content_filter_results"] = AZURE_SAFE
    fake.script(reply)
    model = OpenAIModel("gpt-4o", api_key="k", base_url=fake.openai_url, retry=retry, stream=False)
    try:
        out = await collect(model)
    finally:
        await model.aclose()

    assert out[-1].provider_details == {
        "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": AZURE_SAFE}],
        "content_filter_results": [AZURE_SAFE],
    }
    assert out[-1].finish_reason == "stop"


async def test_a_legacy_function_call_delta_is_a_tool_call(fake: FakeProviders, openai_model):
    # An old server answers `tools` with the deprecated `function_call` (and its finish).
    fake.script(
        openai_stream(
            [
                openai_chunk(function_call={"name": "weather_today", "arguments": ""}),
                openai_chunk(function_call={"arguments": '{"city": '}),
                openai_chunk(function_call={"arguments": '"Oslo"}'}),
            ],
            finish_reason="function_call",
        ),
        openai_stream([openai_chunk(content="Sunny in Oslo.")]),
    )
    calls, get_weather = ran_tool()

    result = await Agent("forecaster", tools=[get_weather]).run(
        "Weather?", runtime=Runtime(model=openai_model, ids=sequential_ids())
    )

    assert calls == ["Oslo"]
    assert result.output == "Sunny in Oslo."


# -- arguments that are not a JSON object, back to a strict server ------------------------------


async def test_calls_whose_arguments_are_not_an_object_go_back_as_objects(
    fake: FakeProviders, openai_model
):
    # vLLM, SGLang and llama-server answer 400 to any history whose call arguments are not a
    # JSON object: once such a call is in the session, every later request would fail.
    fake.strict_arguments = True
    ran: list[str] = []

    @tool(name="clock.now")
    def now() -> str:
        """The time."""
        ran.append("now")
        return "12:00"

    @tool(name="weather.today")
    def get_weather(city: str) -> str:
        """Today's weather in a city."""
        ran.append(city)
        return f"Sunny in {city}"

    given = {
        "call_1": "",  # no arguments, as some models say it: ran
        "call_2": '{"city":  "Oslo" }',  # an object: ran, and goes back byte for byte
        "call_3": "[1]",  # not an object: never ran
        "call_4": "{'city': 'Bergen',}",  # near-JSON: repaired, ran
        "call_5": '{"city": Tromsø',  # not JSON: never ran
    }
    chunks = []
    for index, (id, args) in enumerate(given.items()):
        name = "clock_now" if id == "call_1" else "weather_today"
        chunks.append(openai_chunk(tool_calls=[tool_call(index, id=id, name=name)]))
        if args:
            chunks.append(openai_chunk(tool_calls=[tool_call(index, args=args)]))
    fake.script(
        openai_stream(chunks, finish_reason="tool_calls"),
        openai_stream([openai_chunk(content="Noon; sunny in Oslo and Bergen.")]),
    )

    run = Agent("forecaster", tools=[now, get_weather]).run_stream(
        "Time and weather?", runtime=Runtime(model=openai_model, ids=sequential_ids())
    )
    events = [e async for e in run]

    assert events[-1].type == "run-completed"
    assert run.result.output == "Noon; sunny in Oslo and Bergen."
    assert ran == ["now", "Oslo", "Bergen"]
    (assistant,) = [m for m in fake.requests[1].body["messages"] if m.get("tool_calls")]
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == [
        "{}",
        '{"city":  "Oslo" }',
        "{}",
        '{"city":"Bergen"}',
        "{}",
    ]
    # What the session stores is still what the model sent.
    calls = run.result.state.messages[1].tool_calls
    assert [c.raw_args for c in calls] == list(given.values())


async def test_a_call_cut_by_the_token_limit_does_not_poison_a_strict_session(
    fake: FakeProviders, openai_model
):
    fake.strict_arguments = True
    fake.script(
        openai_stream(
            [
                openai_chunk(tool_calls=[tool_call(0, id="call_1", name="weather_today")]),
                openai_chunk(tool_calls=[tool_call(0, args='{"city": "Zü')]),
            ],
            finish_reason="length",
        ),
        openai_stream([openai_chunk(content="Sorry, shorter now.")]),
        openai_stream([openai_chunk(content="Still here.")]),
    )
    calls, get_weather = ran_tool()
    agent = Agent("forecaster", tools=[get_weather])
    runtime = Runtime(model=openai_model, ids=sequential_ids())

    first = await agent.run("Weather?", runtime=runtime)
    second = await agent.run("And now?", runtime=runtime, state=first.state)

    assert calls == []
    assert (first.output, second.output) == ("Sorry, shorter now.", "Still here.")
    sent = [
        [c["function"]["arguments"] for m in r.body["messages"] for c in m.get("tool_calls", ())]
        for r in fake.requests[1:]
    ]
    assert sent == [["{}"], ["{}"]]


_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=5)  # no lone surrogates
_OBJECTS = st.dictionaries(_TEXT, st.one_of(st.integers(), _TEXT, st.none()), max_size=3)
_ARGUMENTS = st.one_of(
    _OBJECTS.map(json.dumps),  # an object, spaced as json.dumps spaces it
    _OBJECTS.map(lambda v: json.dumps(v, indent=1)),
    st.builds(lambda v, n: json.dumps(v)[:n], _OBJECTS, st.integers(0, 40)),  # cut anywhere
    st.lists(st.integers(), max_size=3).map(json.dumps),
    st.text(max_size=20),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=_ARGUMENTS)
def test_any_arguments_go_back_as_an_object_a_strict_server_accepts(
    fake_server: FakeProviders, retry: RetryPolicy, raw: str
):
    call = ToolCallPart(
        id="c1",
        name="weather.today",
        raw_args=raw,
        status="completed",
        result=ToolResult(data="Sunny"),
    )
    history = [
        Message(id="m1", role="user", parts=[TextPart(text="Weather?")]),
        Message(id="m2", role="assistant", parts=[call]),
    ]
    fake_server.reset()
    fake_server.strict_arguments = True
    fake_server.script(openai_stream([openai_chunk(content="ok")]))

    async def send() -> list[ModelChunk]:
        model = OpenAIModel("m", api_key="k", base_url=fake_server.openai_url, retry=retry)
        try:
            return await collect(
                model, ModelRequest(agent="a", instructions=None, messages=history)
            )
        finally:
            await model.aclose()

    out = asyncio.run(send())

    assert out[-1].parts == [TextPart(text="ok")]  # the strict server took the history
    sent = fake_server.requests[0].body["messages"][1]["tool_calls"][0]["function"]["arguments"]
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if isinstance(value, dict):
        assert sent == raw  # the model's own object, byte for byte
    fake_server.reset()


async def test_a_legacy_function_call_in_a_complete_answer_is_a_tool_call(
    fake: FakeProviders, retry: RetryPolicy
):
    fake.script(
        openai_completion(
            {
                "content": None,
                "function_call": {"name": "weather_today", "arguments": '{"city": "Oslo"}'},
            },
            finish_reason="function_call",
        ),
        openai_completion({"content": "Sunny in Oslo."}),
    )
    calls, get_weather = ran_tool()
    model = OpenAIModel("m", api_key="k", base_url=fake.openai_url, retry=retry, stream=False)
    try:
        result = await Agent("forecaster", tools=[get_weather]).run(
            "Weather?", runtime=Runtime(model=model, ids=sequential_ids())
        )
    finally:
        await model.aclose()

    assert calls == ["Oslo"]
    assert result.output == "Sunny in Oslo."
