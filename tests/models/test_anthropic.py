"""`AnthropicModel` against the fake server: the real `anthropic` SDK over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from fake_providers import (
    Drop,
    FakeProviders,
    Hang,
    Json,
    Stream,
    anthropic_error,
    anthropic_message,
    anthropic_stream,
    anthropic_tool_use_whole,
    sse,
    with_frame,
)
from handrail import (
    Agent,
    Approve,
    Engine,
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
    temp_id,
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
from handrail.models.anthropic import AnthropicModel
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


async def collect(model: AnthropicModel, request: ModelRequest | None = None) -> list[ModelChunk]:
    return [chunk async for chunk in model.stream(request or ask())]


def text_block(*pieces: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return {"type": "text", "text": ""}, [{"type": "text_delta", "text": p} for p in pieces]


def tool_block(id: str, name: str, *pieces: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return (
        {"type": "tool_use", "id": id, "name": name, "input": {}},
        [{"type": "input_json_delta", "partial_json": p} for p in pieces],
    )


# -- streaming --------------------------------------------------------------------------------


async def test_text_streams_then_one_response_with_usage(fake: FakeProviders, anthropic_model):
    fake.script(
        anthropic_stream(
            [text_block("Hel", "lo!")],
            usage={
                "input_tokens": 4,
                "cache_read_input_tokens": 8,
                "cache_creation_input_tokens": 2,
            },
            output_tokens=3,
        )
    )

    assert await collect(anthropic_model) == [
        TextChunk(text="Hel"),
        TextChunk(text="lo!"),
        ModelResponse(
            parts=[TextPart(text="Hello!")],
            usage=Usage(requests=1, input_tokens=14, output_tokens=3, cached_tokens=8),
            stop_reason="end_turn",
            finish_reason="stop",
            model_name="claude-sonnet-4-5-20250929",
        ),
    ]
    (sent,) = fake.requests
    assert sent.path == "/v1/messages"
    assert sent.headers["authorization"] == "Bearer sk-ant-test"
    assert sent.headers["x-stainless-retry-count"] == "0"
    assert sent.body == {
        "model": "claude-sonnet-4-6",
        "max_tokens": 4096,
        "stream": True,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
    }


async def test_thinking_then_parallel_calls_with_awkward_argument_splits(
    fake: FakeProviders, anthropic_model
):
    first = '{"city": "Z\\u00fcrich \\ud83c\\udf27"}'
    pieces = ['{"ci', 'ty": "Z\\u00', "fcrich \\ud83c", '\\udf27"}']
    thinking = (
        {"type": "thinking", "thinking": "", "signature": ""},
        [
            {"type": "thinking_delta", "thinking": "Two cities, "},
            {"type": "thinking_delta", "thinking": "two calls."},
            {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"},
        ],
    )
    stream = anthropic_stream(
        [
            thinking,
            tool_block("toolu_01", "weather_today", *pieces),
            tool_block("toolu_02", "weather_today", '{"city": "Gen', 'ève ☔"}'),
        ],
        stop_reason="tool_use",
    )
    stream.chunk_size = 5
    fake.script(stream)

    out = await collect(anthropic_model, ask(tools=[WEATHER]))

    assert out[:2] == [ReasoningChunk(text="Two cities, "), ReasoningChunk(text="two calls.")]
    calls = [c for c in out if isinstance(c, ToolCallChunk)]
    assert calls[0] == ToolCallChunk(index=0, id="toolu_01", name="weather.today")
    assert "".join(c.args_delta for c in calls if c.index == 0) == first
    assert out[-1] == ModelResponse(
        parts=[
            ReasoningPart(
                text="Two cities, two calls.",
                signature="EqQBCgIYAhIM1gbcDa9GJwZA2b3h",
                provider="anthropic",
                redacted=False,
            ),
            ToolCallPart(id="toolu_01", name="weather.today", raw_args=first),
            ToolCallPart(id="toolu_02", name="weather.today", raw_args='{"city": "Genève ☔"}'),
        ],
        usage=Usage(requests=1, input_tokens=10, output_tokens=5),
        stop_reason="tool_use",
        finish_reason="tool_call",
        model_name="claude-sonnet-4-5-20250929",
    )
    body = fake.requests[0].body
    assert body["tools"] == [
        {
            "name": "weather_today",
            "description": "Today's weather in a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    assert body["tool_choice"] == {"type": "auto"}


async def test_a_complete_answer_without_streaming(fake: FakeProviders, retry: RetryPolicy):
    fake.script(
        anthropic_message(
            [
                {"type": "thinking", "thinking": "Oslo.", "signature": "sig1"},
                {"type": "redacted_thinking", "data": "ENCRYPTED"},
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "weather_today",
                    "input": {"city": "Oslo"},
                },
            ],
            stop_reason="tool_use",
            usage={"input_tokens": 30, "output_tokens": 9, "cache_read_input_tokens": 100},
        )
    )
    async with AnthropicModel(
        "claude-sonnet-4-6", api_key="k", base_url=fake.url, retry=retry, stream=False
    ) as model:
        out = await collect(model, ask(tools=[WEATHER]))

    assert out == [
        ReasoningChunk(text="Oslo."),
        TextChunk(text="Checking."),
        ToolCallChunk(index=0, id="toolu_1", name="weather.today", args_delta='{"city":"Oslo"}'),
        ModelResponse(
            parts=[
                ReasoningPart(text="Oslo.", signature="sig1", provider="anthropic", redacted=False),
                ReasoningPart(text="", signature="ENCRYPTED", provider="anthropic", redacted=True),
                TextPart(text="Checking."),
                ToolCallPart(id="toolu_1", name="weather.today", raw_args='{"city":"Oslo"}'),
            ],
            usage=Usage(requests=1, input_tokens=130, output_tokens=9, cached_tokens=100),
            stop_reason="tool_use",
            finish_reason="tool_call",
            model_name="claude-sonnet-4-5-20250929",
        ),
    ]


# -- what is sent -----------------------------------------------------------------------------


async def test_history_alternates_with_results_first_and_thinking_replayed(
    fake: FakeProviders, anthropic_model
):
    history = [
        Message(id="m0", role="system", parts=[TextPart(text="Today is Monday.")]),
        Message(id="m1", role="user", parts=[TextPart(text="Refund A1")]),
        Message(
            id="m2",
            role="assistant",
            parts=[
                ReasoningPart(
                    text="Look it up.", signature="sig", provider="anthropic", redacted=False
                ),
                ReasoningPart(text="elsewhere", provider="openai"),
                ReasoningPart(text="", signature="REDACTED", provider="anthropic", redacted=True),
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
            parts=[ToolCallPart(id="c3", name="orders.refund", args={}, status="waiting")],
        ),
    ]
    fake.script(anthropic_stream([text_block("ok")]))

    await collect(anthropic_model, ModelRequest(agent="a", instructions="Help.", messages=history))

    body = fake.requests[0].body
    assert body["system"] == "Help.\n\nToday is Monday."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Refund A1"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Look it up.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "REDACTED"},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "c1", "name": "orders_lookup", "input": {"id": "A1"}},
                {
                    "type": "tool_use",
                    "id": "c2",
                    "name": "orders_lookup",
                    "input": {"invalid_json": "{oops"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": '{"total":5}'},
                {
                    "type": "tool_result",
                    "tool_use_id": "c2",
                    "content": "Error: not JSON",
                    "is_error": True,
                },
                {"type": "text", "text": "Use your tools."},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "c3", "name": "orders_refund", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "c3",
                    "content": "This call has not run yet: it is waiting for a decision (a "
                    "person's approval or answer, or a client's result). Do not assume an outcome.",
                }
            ],
        },
    ]


@pytest.mark.parametrize(
    ("choice", "sent"),
    [("auto", {"type": "auto"}), ("required", {"type": "any"}), ("none", {"type": "none"})],
)
async def test_tool_choice_is_mapped(fake: FakeProviders, anthropic_model, choice: str, sent: Any):
    fake.script(anthropic_stream([text_block("ok")]))
    await collect(anthropic_model, ask(tools=[WEATHER], tool_choice=choice))
    assert fake.requests[0].body["tool_choice"] == sent


class Answer(BaseModel):
    city: str
    degrees: int


async def test_structured_output_is_a_forced_tool_whose_input_streams_as_text(
    fake: FakeProviders, anthropic_model
):
    schema = Answer.model_json_schema()
    fake.script(
        anthropic_stream(
            [tool_block("toolu_9", "final_output", '{"city": "Oslo", ', '"degrees": 21}')],
            stop_reason="tool_use",
        )
    )

    out = await collect(anthropic_model, ask(output_schema=schema))

    assert out == [
        TextChunk(text='{"city": "Oslo", '),
        TextChunk(text='"degrees": 21}'),
        ModelResponse(
            parts=[TextPart(text='{"city": "Oslo", "degrees": 21}')],
            usage=Usage(requests=1, input_tokens=10, output_tokens=5),
            stop_reason="tool_use",
            finish_reason="tool_call",
            model_name="claude-sonnet-4-5-20250929",
        ),
    ]
    body = fake.requests[0].body
    assert body["tools"] == [
        {
            "name": "final_output",
            "description": "Give your final answer. Call this only when you have the answer.",
            "input_schema": schema,
        }
    ]
    assert body["tool_choice"] == {"type": "tool", "name": "final_output"}


async def test_a_structured_answer_that_is_not_an_object_is_wrapped(
    fake: FakeProviders, anthropic_model
):
    fake.script(
        anthropic_stream([tool_block("toolu_9", "final_output", '{"response": [1, 2]}')]),
        anthropic_stream([tool_block("toolu_9", "final_output", '{"response": [3]}')]),
    )
    schema = {"type": "array", "items": {"type": "integer"}}

    out = await collect(anthropic_model, ask(tools=[WEATHER], output_schema=schema))
    assert out == [TextChunk(text="[1,2]"), out[-1]]
    assert out[-1].parts == [TextPart(text="[1,2]")]
    assert fake.requests[0].body["tool_choice"] == {"type": "any"}
    assert fake.requests[0].body["tools"][-1]["input_schema"] == {
        "type": "object",
        "properties": {"response": schema},
        "required": ["response"],
    }

    out = await collect(
        anthropic_model, ask(tools=[WEATHER], tool_choice="none", output_schema=schema)
    )
    assert out[-1].parts == [TextPart(text="[3]")]
    assert fake.requests[1].body["tool_choice"] == {"type": "tool", "name": "final_output"}


# -- failures and retries ---------------------------------------------------------------------


async def test_429_with_an_http_date_then_success(fake: FakeProviders, anthropic_model, sleeper):
    # The retry fixture's clock says 1_000_000.0 (1970-01-12 13:46:40 UTC): the date is 3 s on.
    date = "Mon, 12 Jan 1970 13:46:43 GMT"
    fake.script(
        anthropic_error(429, "rate_limit_error", "Slow down", headers={"retry-after": date}),
        anthropic_stream([text_block("ok")]),
    )

    out = await collect(anthropic_model)

    assert out[-1].parts == [TextPart(text="ok")]
    assert sleeper.waits == [3.0]


async def test_overloaded_and_500_then_success(fake: FakeProviders, anthropic_model, sleeper):
    fake.script(
        anthropic_error(529, "overloaded_error", "Overloaded"),
        anthropic_error(500, "api_error", "Internal server error"),
        anthropic_stream([text_block("ok")]),
    )
    out = await collect(anthropic_model)
    assert out[-1].parts == [TextPart(text="ok")]
    assert sleeper.waits == [0.5, 1.0]


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error")],
)
async def test_client_errors_are_not_retried(
    fake: FakeProviders, anthropic_model, sleeper, status: int, kind: str
):
    fake.script(anthropic_error(status, kind, f"Nope ({kind})"))

    with pytest.raises(ModelHTTPError) as caught:
        await collect(anthropic_model)

    error = caught.value
    assert (error.status, error.provider, error.request_id, error.message) == (
        status,
        "anthropic",
        f"req_{status}",
        f"Nope ({kind})",
    )
    assert sleeper.waits == []


async def test_an_overloaded_event_inside_the_stream_is_retried_before_output(
    fake: FakeProviders, anthropic_model
):
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    fake.script(Stream([sse(error, "error")]), anthropic_stream([text_block("ok")]))
    out = await collect(anthropic_model)
    assert out[-1].parts == [TextPart(text="ok")]


async def test_a_stream_cut_before_output_is_retried(fake: FakeProviders, anthropic_model):
    fake.script(
        anthropic_stream([text_block("never")], cut_after=3),  # start, ping, block start
        Drop(),
        anthropic_stream([text_block("whole")]),
    )
    out = await collect(anthropic_model)
    assert out[0] == TextChunk(text="whole")
    assert len(fake.requests) == 3


async def test_a_stream_cut_after_output_fails_the_run_keeping_the_text(
    fake: FakeProviders, anthropic_model
):
    fake.script(anthropic_stream([text_block("It is su", "nny")], cut_after=4))
    agent = Agent("forecaster")

    run = agent.run_stream("Weather?", runtime=Runtime(model=anthropic_model))
    events = [e async for e in run]

    assert [e.type for e in events] == [
        "run-started",
        "agent-started",
        "text-delta",
        "run-failed",
    ]
    assert events[-1].error.startswith("IncompleteResponseError: anthropic: ")
    assert "the stream broke after output had started" in events[-1].error
    assert run.result.state.messages[-1].text == "It is su"
    assert len(fake.requests) == 1


async def test_a_response_that_never_comes_times_out(fake: FakeProviders, sleeper):
    fake.script(Hang())
    policy = RetryPolicy(max_attempts=1, sleep=sleeper)
    async with AnthropicModel(
        "claude-sonnet-4-6", api_key="k", base_url=fake.url, retry=policy, timeout=0.2
    ) as model:
        with pytest.raises(ModelHTTPError, match="anthropic: no response: Request timed out"):
            await collect(model)


# -- finish reasons and incomplete answers ----------------------------------------------------


async def test_max_tokens_mid_tool_call_keeps_the_partial_call_as_it_is(
    fake: FakeProviders, anthropic_model
):
    fake.script(
        anthropic_stream(
            [tool_block("toolu_1", "weather_today", '{"city": ', '"Os')],
            stop_reason="max_tokens",
        )
    )

    out = await collect(anthropic_model, ask(tools=[WEATHER]))

    assert out[-1] == ModelResponse(
        parts=[ToolCallPart(id="toolu_1", name="weather.today", raw_args='{"city": "Os')],
        usage=Usage(requests=1, input_tokens=10, output_tokens=5),
        stop_reason="max_tokens",
        finish_reason="length",
        model_name="claude-sonnet-4-5-20250929",
    )


async def test_max_tokens_mid_text_says_length(fake: FakeProviders, anthropic_model):
    fake.script(anthropic_stream([text_block("The answer is")], stop_reason="max_tokens"))

    out = await collect(anthropic_model)

    assert out[-1].parts == [TextPart(text="The answer is")]
    assert (out[-1].stop_reason, out[-1].finish_reason) == ("max_tokens", "length")


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("tool_use", "tool_call"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("refusal", "content_filter"),
        ("pause_turn", "pause"),
        ("something_new", "other"),
    ],
)
@pytest.mark.parametrize("streaming", [True, False])
async def test_each_stop_reason_is_kept_raw_and_normalized(
    fake: FakeProviders, retry: RetryPolicy, raw: str, normalized: str, streaming: bool
):
    if streaming:
        fake.script(anthropic_stream([text_block("ok")], stop_reason=raw))
    else:
        fake.script(anthropic_message([{"type": "text", "text": "ok"}], stop_reason=raw))
    async with AnthropicModel(
        "claude-sonnet-4-6", api_key="k", base_url=fake.url, retry=retry, stream=streaming
    ) as model:
        out = await collect(model)

    assert (out[-1].stop_reason, out[-1].finish_reason) == (raw, normalized)


def no_stop(*blocks: tuple[dict[str, Any], list[dict[str, Any]]], end: str) -> Stream:
    """A stream of `blocks` with no `message_stop`, ended cleanly or cut."""
    stream = anthropic_stream(blocks, message_stop=False)
    stream.cut = end == "cut"
    return stream


@pytest.mark.parametrize("end", ["clean", "cut"])
async def test_a_stream_without_message_stop_is_retried_before_output(
    fake: FakeProviders, anthropic_model, end: str
):
    fake.script(no_stop(end=end), anthropic_stream([text_block("whole")]))

    out = await collect(anthropic_model)

    assert out == [
        TextChunk(text="whole"),
        ModelResponse(
            parts=[TextPart(text="whole")],
            usage=Usage(requests=1, input_tokens=10, output_tokens=5),
            stop_reason="end_turn",
            finish_reason="stop",
            model_name="claude-sonnet-4-5-20250929",
        ),
    ]
    assert len(fake.requests) == 2


@pytest.mark.parametrize("end", ["clean", "cut"])
async def test_a_stream_without_message_stop_after_text_is_incomplete(
    fake: FakeProviders, anthropic_model, sleeper, end: str
):
    fake.script(no_stop(text_block("Half"), end=end))
    seen: list[ModelChunk] = []

    with pytest.raises(IncompleteResponseError) as caught:
        async for chunk in anthropic_model.stream(ask()):
            seen.append(chunk)

    assert seen == [TextChunk(text="Half")]
    error = caught.value
    assert (error.provider, error.missing, error.attempts) == ("anthropic", "message_stop", 1)
    assert str(error).startswith("anthropic: the response ended without its message_stop: ")
    assert "not retried" in str(error)
    assert sleeper.waits == []
    assert len(fake.requests) == 1


async def test_incomplete_streams_give_up_with_incomplete_response_error(
    fake: FakeProviders, anthropic_model, sleeper
):
    fake.script(*[no_stop(end="clean")] * 4)

    with pytest.raises(IncompleteResponseError) as caught:
        await collect(anthropic_model)

    assert caught.value.attempts == 4
    assert str(caught.value) == (
        "anthropic: the response ended without its message_stop: the body ended with no error "
        "(after 4 attempts)"
    )
    assert sleeper.waits == [0.5, 1.0, 2.0]


async def test_a_stream_cut_after_message_stop_is_whole(fake: FakeProviders, anthropic_model):
    stream = anthropic_stream([text_block("Done.")])
    stream.cut = True  # every event came, then the connection closed without the last chunk
    fake.script(stream)

    out = await collect(anthropic_model)

    assert out[-1].parts == [TextPart(text="Done.")]
    assert out[-1].finish_reason == "stop"
    assert len(fake.requests) == 1


@pytest.mark.parametrize("cut", [False, True])
async def test_a_body_ending_inside_a_character_before_any_text_is_retried(
    fake: FakeProviders, anthropic_model, cut: bool
):
    broken = anthropic_stream([text_block("Zürich")]).ending_inside("ü", cut=cut)
    fake.script(broken, anthropic_stream([text_block("Zürich")]))

    out = await collect(anthropic_model)

    assert out[0] == TextChunk(text="Zürich")
    assert out[-1].parts == [TextPart(text="Zürich")]
    assert len(fake.requests) == 2


@pytest.mark.parametrize("cut", [False, True])
async def test_a_body_ending_inside_a_character_after_text_is_incomplete(
    fake: FakeProviders, anthropic_model, cut: bool
):
    stream = anthropic_stream([text_block("Weather in ", "Zürich")])
    fake.script(stream.ending_inside("ü", cut=cut))
    seen: list[ModelChunk] = []

    with pytest.raises(IncompleteResponseError) as caught:
        async for chunk in anthropic_model.stream(ask()):
            seen.append(chunk)

    assert seen == [TextChunk(text="Weather in ")]
    assert "not retried" in str(caught.value)
    if not cut:
        assert "the body ended inside a UTF-8 character" in str(caught.value)
    assert len(fake.requests) == 1


@pytest.mark.parametrize("ending", ["mid-character", "cut"])
async def test_a_complete_answer_whose_body_ends_early_is_retried(
    fake: FakeProviders, retry: RetryPolicy, ending: str
):
    broken = anthropic_message([{"type": "text", "text": "Zürich is sunny."}])
    body = json.dumps(broken.body, ensure_ascii=False).encode()
    broken.truncate = body.index("ü".encode()) + 1
    broken.cut = ending == "cut"
    fake.script(broken, anthropic_message([{"type": "text", "text": "Oslo is sunny."}]))
    async with AnthropicModel(
        "claude-sonnet-4-6", api_key="k", base_url=fake.url, retry=retry, stream=False
    ) as model:
        out = await collect(model)

    assert out[-1].parts == [TextPart(text="Oslo is sunny.")]
    assert len(fake.requests) == 2


# -- thinking, omitted and redacted -----------------------------------------------------------


async def replay(model: AnthropicModel, fake: FakeProviders, parts: list[Any]) -> dict[str, Any]:
    """Send the answer `parts` back as history; the assistant turn the API received."""
    history = [
        Message(id="m1", role="user", parts=[TextPart(text="Hello")]),
        Message(id="m2", role="assistant", parts=parts),
        Message(id="m3", role="user", parts=[TextPart(text="And?")]),
    ]
    ok = [{"type": "text", "text": "ok"}]
    fake.script(anthropic_stream([text_block("ok")]) if model.streaming else anthropic_message(ok))
    await collect(model, ModelRequest(agent="a", instructions=None, messages=history))
    return fake.requests[-1].body["messages"][1]


async def test_omitted_thinking_goes_back_as_thinking_with_its_signature(
    fake: FakeProviders, anthropic_model
):
    # `thinking: {"type": "enabled", "display": "omitted"}`: no text, only a signature.
    omitted = (
        {"type": "thinking", "thinking": "", "signature": ""},
        [{"type": "signature_delta", "signature": "EqQBCgIYAhIMomitted"}],
    )
    fake.script(anthropic_stream([omitted, text_block("Hi.")]))

    out = await collect(anthropic_model)

    assert out[0] == TextChunk(text="Hi.")
    parts = out[-1].parts
    assert parts == [
        ReasoningPart(
            text="", signature="EqQBCgIYAhIMomitted", provider="anthropic", redacted=False
        ),
        TextPart(text="Hi."),
    ]
    assert await replay(anthropic_model, fake, parts) == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "", "signature": "EqQBCgIYAhIMomitted"},
            {"type": "text", "text": "Hi."},
        ],
    }


async def test_redacted_thinking_goes_back_as_redacted_thinking(
    fake: FakeProviders, anthropic_model
):
    redacted = ({"type": "redacted_thinking", "data": "ENCRYPTED=="}, [])
    fake.script(anthropic_stream([redacted, text_block("Hi.")]))

    out = await collect(anthropic_model)

    parts = out[-1].parts
    assert parts == [
        ReasoningPart(text="", signature="ENCRYPTED==", provider="anthropic", redacted=True),
        TextPart(text="Hi."),
    ]
    assert await replay(anthropic_model, fake, parts) == {
        "role": "assistant",
        "content": [
            {"type": "redacted_thinking", "data": "ENCRYPTED=="},
            {"type": "text", "text": "Hi."},
        ],
    }


async def test_omitted_thinking_in_a_complete_answer_goes_back_as_thinking(
    fake: FakeProviders, retry: RetryPolicy
):
    fake.script(
        anthropic_message(
            [
                {"type": "thinking", "thinking": "", "signature": "SIG"},
                {"type": "text", "text": "Hi."},
            ]
        )
    )
    async with AnthropicModel(
        "claude-sonnet-4-6", api_key="k", base_url=fake.url, retry=retry, stream=False
    ) as model:
        out = await collect(model)
        assert out[0] == TextChunk(text="Hi.")
        content = (await replay(model, fake, out[-1].parts))["content"]

    assert content[0] == {"type": "thinking", "thinking": "", "signature": "SIG"}


# -- recorded responses -----------------------------------------------------------------------


async def test_recorded_stream_with_thinking_and_a_tool_call_replays(
    fake: FakeProviders, anthropic_model
):
    recorded = json.loads((FIXTURES / "anthropic_stream_thinking_tool_use.json").read_text())
    fake.script(Stream([sse(e, e["type"]) for e in recorded["events"]]))

    out = await collect(anthropic_model, ask(tools=[WEATHER]))

    assert out[-1] == ModelResponse(
        parts=[
            ReasoningPart(
                text="The user wants the weather in Paris. I'll call the weather tool.",
                signature="EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds",
                provider="anthropic",
                redacted=False,
            ),
            TextPart(text="I'll check the weather in Paris for you."),
            ToolCallPart(
                id="toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                name="weather.today",
                raw_args='{"city": "Paris"}',
            ),
        ],
        usage=Usage(requests=1, input_tokens=1030, output_tokens=144, cached_tokens=600),
        stop_reason="tool_use",
        finish_reason="tool_call",
        model_name="claude-sonnet-4-5-20250929",
    )


async def test_recorded_message_replays(fake: FakeProviders, retry: RetryPolicy):
    recorded = json.loads((FIXTURES / "anthropic_message.json").read_text())
    fake.script(Json(recorded))
    async with AnthropicModel(
        "claude-sonnet-4-6", api_key="k", base_url=fake.url, retry=retry, stream=False
    ) as model:
        out = await collect(model)
    assert out[-1] == ModelResponse(
        parts=[TextPart(text="Hi! My name is Claude.")],
        usage=Usage(requests=1, input_tokens=2095, output_tokens=503, cached_tokens=0),
        stop_reason="end_turn",
        finish_reason="stop",
        model_name="claude-sonnet-4-5-20250929",
    )


# -- end to end -------------------------------------------------------------------------------


@tool(name="weather.today")
def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"Sunny in {city}"


async def test_an_agent_runs_its_tool_through_anthropic(fake: FakeProviders, anthropic_model):
    fake.script(
        anthropic_stream(
            [
                text_block("Let me check."),
                tool_block("toolu_1", "weather_today", '{"city": ', '"Oslo"}'),
                tool_block("toolu_2", "weather_today", "{'city': 'Bergen',}"),
            ],
            stop_reason="tool_use",
        ),
        anthropic_stream([text_block("Sunny in both.")], output_tokens=4),
    )
    agent = Agent("forecaster", instructions="Use your tools.", tools=[weather])

    result = await agent.run(
        "Weather in Oslo and Bergen?",
        runtime=Runtime(model=anthropic_model, ids=sequential_ids()),
    )

    assert result.output == "Sunny in both."
    assert result.state.usage == Usage(requests=2, input_tokens=20, output_tokens=9, tool_calls=2)
    sent = fake.requests[1].body["messages"]
    assert sent[-1] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny in Oslo"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "Sunny in Bergen"},
        ],
    }
    assert sent[-2]["content"][-1] == {
        "type": "tool_use",
        "id": "toolu_2",
        "name": "weather_today",
        "input": {"city": "Bergen"},
    }


async def test_a_tool_call_cut_by_max_tokens_is_never_run(fake: FakeProviders, anthropic_model):
    ran: list[str] = []

    @tool(name="weather.today")
    def get_weather(city: str) -> str:
        """Today's weather in a city."""
        ran.append(city)
        return f"Sunny in {city}"

    fake.script(
        anthropic_stream(
            [tool_block("toolu_1", "weather_today", '{"city": ', '"Zü')], stop_reason="max_tokens"
        ),
        anthropic_stream([text_block("Sorry.")]),
    )
    run = Agent("forecaster", tools=[get_weather]).run_stream(
        "Weather?", runtime=Runtime(model=anthropic_model, ids=sequential_ids())
    )
    events = [e async for e in run]

    assert ran == []
    assert "tool-call-started" not in [e.type for e in events]
    sent = fake.requests[1].body["messages"]
    assert sent[-2]["content"][-1] == {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "weather_today",
        "input": {"invalid_json": '{"city": "Zü'},  # as sent: never repaired into {"city": "Zü"}
    }
    (result,) = sent[-1]["content"]
    assert result["is_error"] and "cut off by the output token limit" in result["content"]
    assert run.result.output == "Sorry."


async def test_a_stream_without_message_stop_after_output_fails_the_turn(
    fake: FakeProviders, anthropic_model
):
    fake.script(no_stop(text_block("It is su"), end="clean"))
    run = Agent("forecaster").run_stream("Weather?", runtime=Runtime(model=anthropic_model))
    events = [e async for e in run]
    assert events[-1].type == "run-failed"
    assert "message_stop" in events[-1].error
    assert run.result.state.messages[-1].text == "It is su"  # kept, marked by the failure


def frames(*events: dict[str, Any]) -> Stream:
    """A stream of the given events between a message_start and a message_stop."""
    start = anthropic_stream([], message_stop=False).frames[:2]
    body = [sse(e, e["type"]) for e in events]
    end = [
        sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 3},
            },
            "message_delta",
        ),
        sse({"type": "message_stop"}, "message_stop"),
    ]
    return Stream([*start, *body, *end])


def start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": fields}


TOOL = {"type": "tool_use", "id": "toolu_1", "name": "weather_today", "input": {}}


@pytest.mark.parametrize(
    ("events", "problem"),
    [
        ([delta(3, type="text_delta", text="hi")], "content block 3, which never started"),
        (
            [start(0, TOOL), start(0, {**TOOL, "id": "toolu_2"})],
            "content block 0 started twice",
        ),
        (
            [start(0, TOOL), delta(0, type="text_delta", text='"}')],
            "text_delta for content block 0, which is a call block",
        ),
        (
            [
                start(0, {"type": "text", "text": ""}),
                delta(0, type="input_json_delta", partial_json="{"),
            ],
            "input_json_delta for content block 0, which is a text block",
        ),
    ],
)
async def test_a_stream_that_cannot_be_read_without_guessing_is_refused(
    fake: FakeProviders, anthropic_model, events: list[dict[str, Any]], problem: str
):
    fake.script(frames(*events))
    with pytest.raises(ModelError, match=problem):
        await collect(anthropic_model)


async def test_a_server_tool_call_without_its_result_is_a_hosted_part_not_a_call(
    fake: FakeProviders, anthropic_model
):
    server = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    fake.script(
        frames(
            start(0, server),
            delta(0, type="input_json_delta", partial_json='{"query": "weather"}'),
            {"type": "content_block_stop", "index": 0},
            start(1, {"type": "text", "text": ""}),
            delta(1, type="text_delta", text="Sunny."),
            {"type": "content_block_stop", "index": 1},
        )
    )
    out = await collect(anthropic_model)
    assert [c.text for c in out if isinstance(c, TextChunk)] == ["Sunny."]
    assert not [c for c in out if isinstance(c, ToolCallChunk)]
    assert out[-1].parts == [
        ToolCallPart(
            id="srvtoolu_1",
            name="web_search",
            args={"query": "weather"},
            status="running",  # Anthropic runs it later (its result is not in this response)
            executor="provider",
            provider="anthropic",
            provider_blocks=[{**server, "input": {"query": "weather"}}],
        ),
        TextPart(text="Sunny."),
    ]


@pytest.mark.parametrize(
    ("stored", "sent"),
    [
        (
            {"type": "reasoning", "text": "", "signature": "DATA==", "provider": "anthropic"},
            {"type": "redacted_thinking", "data": "DATA=="},
        ),
        (
            {"type": "reasoning", "text": "Hmm.", "signature": "SIG", "provider": "anthropic"},
            {"type": "thinking", "thinking": "Hmm.", "signature": "SIG"},
        ),
    ],
)
def test_thinking_stored_before_redaction_was_marked_is_sent_as_it_was(
    stored: dict[str, Any], sent: dict[str, Any]
):
    from handrail import MESSAGES
    from handrail.models._anthropic_format import anthropic_messages
    from handrail.models._wire import ToolNames

    (message,) = MESSAGES.validate_python(
        [{"id": "m1", "role": "assistant", "parts": [stored, {"type": "text", "text": "ok"}]}]
    )
    assert message.parts[0].redacted is None  # type: ignore[union-attr]
    _, out = anthropic_messages(None, [message], ToolNames([]))
    assert out[0]["content"][0] == sent


# -- odd but legal streams ---------------------------------------------------------------------


@pytest.mark.parametrize("odd", ["event", "delta", "both"])
async def test_event_and_delta_types_the_sdk_does_not_know_are_ignored(
    fake: FakeProviders, anthropic_model, odd: str
):
    # Anthropic may add event types ("handle unknown event types gracefully"); the SDK builds
    # an unknown event as a `RawMessageStartEvent` with no message, and an unknown delta as a
    # `TextDelta` with no text.
    stream = anthropic_stream(
        [
            text_block("Sunny"),
            tool_block("toolu_1", "weather_today", '{"city": ', '"Oslo"}'),
        ],
        stop_reason="tool_use",
    )
    odd_delta = {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_progress_delta", "progress": 0.5},
    }
    if odd != "event":  # between the call's start and its first delta
        stream = with_frame(stream, 6, sse(odd_delta, "content_block_delta"))
    made_up = {"type": "message_annotation", "annotation": {"kind": "safety", "ok": True}}
    if odd != "delta":
        stream = with_frame(stream, 2, sse(made_up, "message_annotation"))
    fake.script(stream, anthropic_stream([text_block("Sunny in Oslo.")]))
    calls: list[str] = []

    @tool(name="weather.today")
    def get_weather(city: str) -> str:
        """Today's weather in a city."""
        calls.append(city)
        return f"Sunny in {city}"

    run = Agent("forecaster", tools=[get_weather]).run_stream(
        "Weather?", runtime=Runtime(model=anthropic_model, ids=sequential_ids())
    )
    events = [e async for e in run]

    assert calls == ["Oslo"]
    assert events[-1].type == "run-completed"
    assert run.result.output == "Sunny in Oslo."
    sent = fake.requests[1].body["messages"]
    assert sent[-2]["content"] == [
        {"type": "text", "text": "Sunny"},
        {"type": "tool_use", "id": "toolu_1", "name": "weather_today", "input": {"city": "Oslo"}},
    ]


async def test_a_tool_input_given_whole_in_content_block_start_is_used(
    fake: FakeProviders, anthropic_model
):
    # Some gateways (LiteLLM, Bedrock and Vertex proxies) give the input whole when the block
    # starts, and stream no `input_json_delta` after it.
    fake.script(
        anthropic_stream(
            [anthropic_tool_use_whole("toolu_1", "weather_today", {"city": "Oslo"})],
            stop_reason="tool_use",
        ),
        anthropic_stream([text_block("Sunny in Oslo.")]),
    )
    calls: list[str] = []

    @tool(name="weather.today")
    def get_weather(city: str) -> str:
        """Today's weather in a city."""
        calls.append(city)
        return f"Sunny in {city}"

    run = Agent("forecaster", tools=[get_weather]).run_stream(
        "Weather?", runtime=Runtime(model=anthropic_model, ids=sequential_ids())
    )
    events = [e async for e in run]

    assert calls == ["Oslo"]
    deltas = [e for e in events if e.type == "tool-call-delta"]
    assert "".join(e.args_delta for e in deltas) == '{"city":"Oslo"}'
    sent = fake.requests[1].body["messages"]
    assert sent[-2]["content"] == [
        {"type": "tool_use", "id": "toolu_1", "name": "weather_today", "input": {"city": "Oslo"}}
    ]


async def test_deltas_after_an_input_given_whole_replace_it_as_the_sdk_does(
    fake: FakeProviders, anthropic_model
):
    # The SDK's MessageStream starts from the block's input and replaces it with the deltas'
    # JSON once a delta brings text; an empty delta changes nothing.
    fake.script(
        anthropic_stream(
            [
                anthropic_tool_use_whole(
                    "toolu_1", "weather_today", {"city": "Bergen"}, '{"city": ', '"Oslo"}'
                ),
                anthropic_tool_use_whole("toolu_2", "weather_today", {"city": "Tromsø"}, ""),
            ],
            stop_reason="tool_use",
        )
    )

    out = await collect(anthropic_model, ask(tools=[WEATHER]))

    assert out[-1].parts == [
        ToolCallPart(id="toolu_1", name="weather.today", raw_args='{"city": "Oslo"}'),
        ToolCallPart(id="toolu_2", name="weather.today", raw_args='{"city":"Tromsø"}'),
    ]
    streamed = [c for c in out if isinstance(c, ToolCallChunk)]
    assert [(c.index, c.args_delta) for c in streamed if c.args_delta] == [
        (0, '{"city": '),
        (0, '"Oslo"}'),
        (1, '{"city":"Tromsø"}'),
    ]


async def test_a_structured_answer_given_whole_in_content_block_start_is_the_answer(
    fake: FakeProviders, anthropic_model
):
    fake.script(
        anthropic_stream(
            [anthropic_tool_use_whole("toolu_9", "final_output", {"city": "Oslo", "degrees": 21})],
            stop_reason="tool_use",
        )
    )

    out = await collect(anthropic_model, ask(output_schema=Answer.model_json_schema()))

    assert out[-1].parts == [TextPart(text='{"city":"Oslo","degrees":21}')]
    assert out[:-1] == [TextChunk(text='{"city":"Oslo","degrees":21}')]


async def test_a_reused_result_tells_the_model_it_was_not_run_again(
    fake: FakeProviders, anthropic_model
):
    ran: list[str] = []

    @tool(name="weather.today")
    def get_weather(city: str) -> str:
        """Today's weather in a city."""
        ran.append(city)
        return f"Sunny in {city}"

    fake.script(
        anthropic_stream(
            [tool_block("toolu_1", "weather_today", '{"city": "Oslo"}')], stop_reason="tool_use"
        ),
        anthropic_stream(
            [tool_block("toolu_2", "weather_today", '{"city": "Oslo"}')], stop_reason="tool_use"
        ),
        anthropic_stream([text_block("Sunny.")]),
    )
    result = await Agent("forecaster", tools=[get_weather]).run(
        "Weather?", runtime=Runtime(model=anthropic_model, ids=sequential_ids())
    )

    assert ran == ["Oslo"] and result.output == "Sunny."
    assert fake.requests[2].body["tool_choice"] == {"type": "auto"}  # it may go on acting
    results = [
        block["content"]
        for message in fake.requests[2].body["messages"]
        if message["role"] == "user"
        for block in message["content"]
        if block["type"] == "tool_result"
    ]
    assert results == [
        "Sunny in Oslo",
        "[Reused: this call repeats call toolu_1 of this turn and was not run again; this is "
        "that call's result.]\nSunny in Oslo",
    ]


async def test_a_batch_s_outcome_note_reaches_claude_in_the_system_prompt(
    fake: FakeProviders, anthropic_model
):
    """Anthropic has no system turn mid-conversation: the note folds into `system`, in order."""
    ran: list[str] = []

    @tool(
        name="orders.create",
        permission="write",
        mint=lambda args, i: {"order_id": temp_id(i)},
    )
    def create(item: str) -> dict[str, str]:
        """Create an order."""
        ran.append(item)
        return {"order_id": f"ORD-{len(ran)}"}

    fake.script(
        anthropic_stream(
            [tool_block("toolu_1", "orders_create", '{"item": "mug"}')], stop_reason="tool_use"
        ),
        anthropic_stream([text_block("Proposed: a mug.")]),
        anthropic_stream([text_block("Your mug is ordered as ORD-1.")]),
    )
    engine = Engine(
        Agent("clerk", instructions="You take orders.", tools=[create]),
        runtime=Runtime(model=anthropic_model, ids=sequential_ids()),
    )
    card = (await engine.run_headless("s1", "Order a mug", propose=True)).card
    assert card is not None
    await engine.resolve("s1", card, Approve(by="ana"))
    applied = [e async for e in engine.resume("s1")]
    assert applied[-1].type == "run-completed" and ran == ["mug"]
    note = (await engine.session("s1")).messages[-1]
    assert note.role == "system"  # stored where it happened

    answer = [e async for e in engine.submit("s1", "Did it happen?")]
    assert answer[-1].type == "run-completed"  # the fake refuses a "system" turn, as Claude does
    body = fake.requests[2].body
    assert body["system"] == f"You take orders.\n\n{note.text}"
    assert f"Batch {card} was decided" in body["system"] and "temp_0 = ORD-1" in body["system"]
    assert [(m["role"], [b["type"] for b in m["content"]]) for m in body["messages"]] == [
        ("user", ["text"]),
        ("assistant", ["tool_use"]),
        ("user", ["tool_result"]),
        ("assistant", ["text"]),
        ("user", ["text"]),
    ]
    proposal = body["messages"][2]["content"][0]["content"]
    assert proposal.startswith("Proposed, not done yet: queued for approval as action 0")
