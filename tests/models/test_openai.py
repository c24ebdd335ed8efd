"""`OpenAIModel` against the fake server: the real `openai` SDK over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fake_providers import (
    Drop,
    FakeProviders,
    Hang,
    Json,
    Stream,
    openai_chunk,
    openai_completion,
    openai_error,
    openai_stream,
    openai_usage,
    sse,
)
from handrail import (
    Agent,
    Message,
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
            model_name="gpt-4o-mini-2024-07-18",
        ),
    ]
    assert "stream" not in fake.requests[0].body


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
                    "function": {"name": "orders_lookup", "arguments": "{oops"},
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

    with pytest.raises(ModelHTTPError) as caught:
        async for chunk in openai_model.stream(ask()):
            seen.append(chunk)

    assert seen == [TextChunk(text="Half")]
    assert caught.value.status is None
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
    assert "ModelHTTPError" in events[-1].error
    assert run.result.outcome == "failed"
    assert run.result.state.messages[-1].role == "assistant"
    assert run.result.state.messages[-1].text == "It is su"
