"""The agent loop: streaming, nudges, structured output, caps, interruption."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from handrail import (
    MESSAGES,
    Agent,
    ConfigError,
    ModelRequest,
    ModelResponse,
    RunCompleted,
    RunFailed,
    RunState,
    Runtime,
    TextPart,
    ToolCallPart,
    ToolResult,
    UserError,
    run_agent,
    tool,
)
from handrail.testing import FunctionModel, ScriptedModel, call, reasoning, sequential_ids


def stored(data: Any) -> ToolResult:
    """A plain result as the history keeps it: with the summary line derived from it."""
    result = ToolResult(data=data)
    result.summary = result.display_summary()
    return result


def types(events: list[Any]) -> list[str]:
    return [e.type for e in events]


@tool
async def lookup(order_id: str) -> dict[str, str]:
    """Look an order up."""
    return {"id": order_id, "status": "shipped"}


async def test_a_turn_streams_text_and_ends_with_run_completed():
    model = ScriptedModel(
        [[reasoning("Look it up."), call("lookup", order_id="A1")], "It shipped."]
    )
    agent = Agent("support", instructions="Be brief.", tools=[lookup])
    run = agent.run_stream("Where is A1?", runtime=Runtime(model=model, ids=sequential_ids()))
    events = [e async for e in run]
    assert types(events) == [
        "run-started",
        "agent-started",
        "reasoning-delta",
        "reasoning-delta",
        "reasoning-delta",
        "usage",
        "tool-call-started",
        "tool-call-completed",
        "text-delta",
        "text-delta",
        "usage",
        "agent-completed",
        "run-completed",
    ]
    assert "".join(e.delta for e in events if e.type == "text-delta") == "It shipped."
    assert events[-1].output == "It shipped."
    result = run.result
    assert (result.outcome, result.output, result.stop_reason) == (
        "completed",
        "It shipped.",
        "answer",
    )
    assert [m.role for m in result.state.messages] == ["user", "assistant", "assistant"]
    assert model.calls[0].instructions == "Be brief."
    assert model.calls[0].tools[0].name == "lookup"
    assert result.state.usage.requests == 2
    assert result.state.usage.tool_calls == 1


async def test_the_state_round_trips_through_json_after_a_turn():
    model = ScriptedModel([[call("lookup", order_id="A1")], "ok"])
    result = await Agent("a", tools=[lookup]).run("go", runtime=Runtime(model=model))
    messages = result.state.messages
    assert MESSAGES.validate_json(MESSAGES.dump_json(messages)) == messages


async def test_min_tool_calls_nudges_once_with_a_synthetic_message():
    model = ScriptedModel(["I think it shipped.", [call("lookup", order_id="A1")], "It shipped."])
    agent = Agent("a", tools=[lookup], min_tool_calls=1)
    result = await agent.run("Where is A1?", runtime=Runtime(model=model))
    nudge = result.state.messages[2]
    assert nudge.role == "user"
    assert nudge.parts == [
        TextPart(
            text="You answered before using your tools. Call at least 1 tool(s) to ground your "
            "answer, then answer.",
            synthetic=True,
        )
    ]
    assert result.output == "It shipped."
    model.assert_complete()


async def test_min_tool_calls_nudges_only_once():
    model = ScriptedModel(["No.", "Still no."])
    result = await Agent("a", tools=[lookup], min_tool_calls=1).run(
        "go", runtime=Runtime(model=model)
    )
    assert result.output == "Still no."


async def test_an_ends_turn_tool_stops_the_loop_with_its_output():
    @tool(ends_turn=True)
    def hand_off(team: str) -> dict[str, str]:
        """Hand the conversation to a team."""
        return {"team": team}

    model = ScriptedModel([[call("hand_off", team="billing")]])
    result = await Agent("a", tools=[hand_off]).run("go", runtime=Runtime(model=model))
    assert (result.outcome, result.stop_reason, result.output) == (
        "completed",
        "ends-turn",
        {"team": "billing"},
    )


class Verdict(BaseModel):
    refund: bool
    reason: str


async def test_structured_output_is_validated():
    model = ScriptedModel(['{"refund": true, "reason": "damaged"}'])
    agent = Agent("a", output_type=Verdict)
    result = await agent.run("go", runtime=Runtime(model=model))
    assert result.output == Verdict(refund=True, reason="damaged")
    assert model.calls[0].output_schema == Verdict.model_json_schema()


async def test_invalid_structured_output_is_sent_back_once_with_the_error():
    model = ScriptedModel(['{"refund": "maybe"}', '{"refund": false, "reason": "late"}'])
    result = await Agent("a", output_type=Verdict).run("go", runtime=Runtime(model=model))
    assert result.output == Verdict(refund=False, reason="late")
    feedback = result.state.messages[2]
    assert feedback.parts[0].synthetic  # type: ignore[union-attr]
    assert "does not match the required output schema" in feedback.text


async def test_structured_output_invalid_twice_fails_the_run():
    model = ScriptedModel(["nope", "still nope"])
    run = Agent("a", output_type=Verdict).run_stream("go", runtime=Runtime(model=model))
    events = [e async for e in run]
    assert events[-1].type == "run-failed"
    assert events[-1].reason == "error"
    assert "does not match the required output schema" in (events[-1].error or "")
    assert run.result.outcome == "failed"


async def test_reaching_max_iterations_ends_the_turn_with_a_message():
    model = FunctionModel(lambda request: call("lookup", order_id=str(len(request.messages))))
    agent = Agent("a", tools=[lookup], max_iterations=3)
    run = agent.run_stream("go", runtime=Runtime(model=model))
    events = [e async for e in run]
    result = run.result
    # The turn did not finish its work: it says so to the user, and ends failed, not completed.
    assert (result.outcome, result.stop_reason) == ("failed", "max-iterations")
    assert result.error == "agent 'a' reached its limit of 3 model calls for this turn"
    assert result.output == (
        "I stopped before finishing: agent 'a' reached its limit of 3 model calls for this turn."
    )
    assert events[-1] == RunFailed(reason="max-iterations", error=result.error)
    assert "run-completed" not in types(events)
    assert len(model.calls) == 3
    assert result.state.turn_iterations == 3


async def test_a_model_error_ends_the_run_with_run_failed():
    model = ScriptedModel([])
    run = Agent("a").run_stream("go", runtime=Runtime(model=model))
    events = [e async for e in run]
    assert types(events) == ["run-started", "agent-started", "run-failed"]
    assert "ScriptedModel ran out of steps" in (events[-1].error or "")


async def test_the_model_is_resolved_turn_then_agent_then_runtime():
    turn, own, default = (ScriptedModel([name]) for name in ("turn", "agent", "runtime"))
    runtime = Runtime(model=default)
    assert (await Agent("a", model=own).run("x", runtime=runtime, model=turn)).output == "turn"
    assert (await Agent("a", model=own).run("x", runtime=runtime)).output == "agent"
    assert (await Agent("a").run("x", runtime=runtime)).output == "runtime"


def test_an_agent_without_any_model_is_a_config_error():
    with pytest.raises(ConfigError, match="Agent 'a' has no model: pass model= to the Agent"):
        run_agent(Agent("a"), RunState())


def test_agent_definition_errors():
    with pytest.raises(UserError, match="two tools are named 'lookup'"):
        Agent("a", tools=[lookup, lookup])
    with pytest.raises(UserError, match="is not a Tool; decorate the function with @tool"):
        Agent("a", tools=[len])  # type: ignore[list-item]
    with pytest.raises(UserError, match="max_iterations must be at least 1"):
        Agent("a", max_iterations=0)


async def test_the_result_is_unavailable_until_the_run_has_finished():
    run = Agent("a").run_stream("go", runtime=Runtime(model=ScriptedModel(["hi"])))
    with pytest.raises(RuntimeError, match="iterate all its events first"):
        run.result  # noqa: B018
    assert (await run.finish()).output == "hi"


# -- interruption --------------------------------------------------------------------------


def assert_valid_history(state: RunState) -> None:
    """Every call has a result, and the history survives JSON."""
    for message in state.messages:
        for part in message.parts:
            if isinstance(part, ToolCallPart):
                assert part.result is not None, part
    assert MESSAGES.validate_json(MESSAGES.dump_json(state.messages)) == state.messages


async def test_interrupting_mid_model_keeps_the_partial_text():
    gate = asyncio.Event()

    async def slow_model(request: ModelRequest) -> Any:
        await gate.wait()
        return "never"

    class Streaming(FunctionModel):
        async def stream(self, request: ModelRequest):  # type: ignore[no-untyped-def, override]
            from handrail.models import TextChunk

            yield TextChunk(text="Let me ")
            yield TextChunk(text="check")
            await gate.wait()

    run = Agent("a").run_stream("go", runtime=Runtime(model=Streaming(slow_model)))
    seen: list[str] = []

    async def consume() -> None:
        async for event in run:
            seen.append(event.type)
            if seen.count("text-delta") == 2:
                asyncio.get_running_loop().call_soon(run.interrupt)

    await asyncio.wait_for(consume(), 2)
    assert seen[-1] == "run-failed"
    assert run.result.outcome == "interrupted"
    state = run.result.state
    assert state.messages[-1].text == "Let me check"
    assert_valid_history(state)


async def test_interrupting_mid_tool_pairs_every_call_with_an_interrupted_result():
    started = asyncio.Event()

    @tool
    async def forever() -> str:
        """Never returns."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    model = ScriptedModel([[call("forever"), call("lookup", order_id="A1")]])
    run = Agent("a", tools=[forever, lookup]).run_stream("go", runtime=Runtime(model=model))

    async def interrupt_when_started() -> None:
        await started.wait()
        run.interrupt()

    interrupter = asyncio.create_task(interrupt_when_started())
    events = [e async for e in run]
    await interrupter
    assert events[-1].type == "run-failed"
    assert events[-1].reason == "interrupted"
    hung, quick = run.result.state.messages[-1].tool_calls
    assert hung.status == "interrupted"
    assert hung.result == ToolResult.failure(
        "interrupted before it finished: the run was cancelled, so this call may or may not "
        "have taken effect",
        code="interrupted",
    )
    assert quick.status == "completed"
    assert_valid_history(run.result.state)


async def test_an_interrupt_while_the_consumer_holds_an_event_stops_at_the_next_step():
    model = ScriptedModel([[call("lookup", order_id="A1")], "never reached"])
    run = Agent("a", tools=[lookup]).run_stream("go", runtime=Runtime(model=model))
    events = []
    async for event in run:
        events.append(event)
        if event.type == "tool-call-completed":
            run.interrupt()
            run.interrupt()  # idempotent
    assert events[-1].type == "run-failed"
    assert model.remaining == 1
    assert_valid_history(run.result.state)


async def test_cancelling_the_consumer_repairs_history_and_propagates():
    started = asyncio.Event()

    @tool
    async def forever() -> str:
        """Never returns."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    state = RunState()
    model = ScriptedModel([[call("forever")]])
    run = Agent("a", tools=[forever]).run_stream("go", state=state, runtime=Runtime(model=model))

    async def consume() -> None:
        async for _ in run:
            pass

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert state.messages[-1].tool_calls[0].status == "interrupted"
    assert_valid_history(state)


async def test_a_turn_without_a_prompt_continues_the_conversation():
    state = RunState()
    model = ScriptedModel(["Hello.", "Anything else?"])
    runtime = Runtime(model=model)
    await Agent("a").run("hi", state=state, runtime=runtime)
    result = await Agent("a").run(None, state=state, runtime=runtime)
    assert [m.text for m in result.state.messages] == ["hi", "Hello.", "Anything else?"]
    assert state.turn == 1


async def test_tool_call_chunks_are_accepted_and_the_response_is_what_counts():
    from handrail.models import ModelResponse, ToolCallChunk

    class Chunky(FunctionModel):
        async def stream(self, request: ModelRequest):  # type: ignore[no-untyped-def, override]
            yield ToolCallChunk(index=0, id="c1", name="lookup", args_delta='{"order_id": ')
            yield ToolCallChunk(index=0, args_delta='"A1"}')
            if len(request.messages) == 1:
                yield ModelResponse(
                    parts=[ToolCallPart(id="c1", name="lookup", args={"order_id": "A1"})]
                )
            else:
                yield ModelResponse(parts=[TextPart(text="done")])

    run = Agent("a", tools=[lookup]).run_stream(
        "go", runtime=Runtime(model=Chunky(lambda r: "unused"))
    )
    deltas = [
        (e.index, e.tool_call_id, e.name, e.args_delta)
        async for e in run
        if e.type == "tool-call-delta"
    ]
    result = run.result
    assert deltas == [(0, "c1", "lookup", '{"order_id": '), (0, None, None, '"A1"}')] * 2
    assert result.output == "done"
    assert result.state.messages[1].tool_calls[0].result == stored(
        {"id": "A1", "status": "shipped"}
    )


async def test_a_stream_that_ends_without_a_response_fails_the_run():
    class Broken(FunctionModel):
        async def stream(self, request: ModelRequest):  # type: ignore[no-untyped-def, override]
            from handrail.models import TextChunk

            yield TextChunk(text="Hel")

    run = Agent("a").run_stream("go", runtime=Runtime(model=Broken(lambda r: "x")))
    events = [e async for e in run]
    assert events[-1].type == "run-failed"
    assert events[-1].error == "ModelError: Model 'function' ended its stream without a response."
    assert run.result.state.messages[-1].text == "Hel"  # the partial text is kept


async def test_an_interrupt_between_the_response_and_its_tool_calls_runs_none_of_them():
    ran: list[str] = []

    @tool
    async def act() -> str:
        """Act."""
        ran.append("act")
        return "done"

    model = ScriptedModel([[call("act")]])
    run = Agent("a", tools=[act]).run_stream("go", runtime=Runtime(model=model))
    async for event in run:
        if event.type == "usage":
            run.interrupt()
    assert ran == []
    part = run.result.state.messages[-1].tool_calls[0]
    assert part.status == "interrupted"
    assert_valid_history(run.result.state)


async def test_one_interrupt_stops_every_agent_that_shares_it():
    from handrail import Interrupt

    interrupt = Interrupt()
    state = RunState()
    first = run_agent(Agent("a"), state, Runtime(model=ScriptedModel(["one"])), interrupt=interrupt)
    assert (await first.finish()).outcome == "completed"
    second = run_agent(
        Agent("b"), state, Runtime(model=ScriptedModel(["two"])), interrupt=interrupt
    )
    async for event in second:
        if event.type == "agent-started":
            second.interrupt()
    assert second.result.outcome == "interrupted"
    assert interrupt.requested
    assert [m.text for m in state.messages] == ["one"]


async def test_a_call_id_the_session_already_used_is_replaced():
    # Some OpenAI-compatible servers number the calls of each response from zero.
    model = ScriptedModel(
        [[call("lookup", id="c0", order_id="A1")], [call("lookup", id="c0", order_id="A2")], "ok"]
    )
    state = RunState()
    await Agent("a", tools=[lookup]).run(
        "go", state=state, runtime=Runtime(model=model, ids=sequential_ids())
    )
    ids = [p.id for m in state.messages for p in m.tool_calls]
    assert ids[0] == "c0" and ids[1] != "c0" and len(set(ids)) == 2
    assert RunState.load(state.dump()).call_ids == set(ids)


# -- responses the provider did not finish -----------------------------------------------------


def cut(*parts: Any, finish: str = "length", stop: str | None = "length") -> ModelResponse:
    """A response that stopped for `finish` (not `stop` or `tool_call`)."""
    return ModelResponse(parts=list(parts), finish_reason=finish, stop_reason=stop)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "finish", "why"),
    [
        ('{"city": "Zürich", "note": "say \\"h', "length", "cut off by the output token limit"),
        ('{"city": "Zü', "length", "cut off by the output token limit"),
        ('{"city": "Zürich"}', "length", "cut off by the output token limit"),  # looks whole
        ('{"city": "Zürich"}', "content_filter", "content filter stopped your response"),
        ('{"city": "Zürich"}', "other", "stop reason 'pause_turn'"),
    ],
)
async def test_calls_of_a_response_the_provider_did_not_finish_are_never_run(
    raw: str, finish: str, why: str
):
    ran: list[str] = []

    @tool
    def get_weather(city: str, note: str = "") -> str:
        """The weather."""
        ran.append(city)
        return "sunny"

    replies = iter(
        [
            cut(
                ToolCallPart(id="c1", name="get_weather", raw_args=raw),
                finish=finish,
                stop="pause_turn" if finish == "other" else finish,
            ),
            "Sorry, I could not check the weather.",
        ]
    )
    model = FunctionModel(lambda request: next(replies))
    run = Agent("a", tools=[get_weather]).run_stream("weather?", runtime=Runtime(model=model))
    events = [e async for e in run]
    assert ran == []
    (part,) = [p for m in run.result.state.messages for p in m.tool_calls]
    assert part.raw_args == raw  # kept as sent: never parsed, never repaired
    assert part.args == {}
    assert part.status == "failed"
    assert part.result is not None and why in (part.result.error or "")
    assert "tool-call-started" not in types(events)
    (done,) = [e for e in events if e.type == "tool-call-completed"]
    assert (done.tool_call_id, done.ok) == ("c1", False)
    usage = [e for e in events if e.type == "usage"]
    assert usage[0].finish_reason == finish
    assert run.result.outcome == "completed"
    # The model read why, under the call as it sent it, and answered.
    assert model.calls[1].messages[1].tool_calls[0].raw_args == raw


async def test_a_text_answer_cut_by_the_token_limit_is_marked_cut():
    model = FunctionModel(lambda request: cut(TextPart(text="The three steps are: one, tw")))
    run = Agent("a").run_stream("steps?", runtime=Runtime(model=model))
    events = [e async for e in run]
    assert (run.result.outcome, run.result.stop_reason, run.result.finish_reason) == (
        "completed",
        "cut",
        "length",
    )
    assert run.result.output == "The three steps are: one, tw"
    assert events[-1] == RunCompleted(
        output="The three steps are: one, tw", stop_reason="cut", finish_reason="length"
    )


async def test_a_finished_answer_says_so():
    run = Agent("a").run_stream("hi", runtime=Runtime(model=ScriptedModel(["Hello."])))
    events = [e async for e in run]
    assert events[-1] == RunCompleted(output="Hello.", stop_reason="answer", finish_reason="stop")


async def test_a_cut_answer_is_continued_when_the_agent_asks_for_it():
    replies = iter([cut(TextPart(text="one, tw")), cut(TextPart(text="o, thr")), "ee."])
    model = FunctionModel(lambda request: next(replies))
    agent = Agent("a", continue_on_length=2)
    result = await agent.run("count", runtime=Runtime(model=model))
    assert (result.output, result.stop_reason, result.finish_reason) == (
        "one, two, three.",
        "answer",
        "stop",
    )
    asked = model.calls[1].messages[-1]
    assert asked.role == "user" and asked.parts[0].synthetic  # type: ignore[union-attr]
    assert "cut off by the output token limit" in asked.text


async def test_a_cut_answer_is_continued_at_most_as_often_as_the_agent_says():
    model = FunctionModel(lambda request: cut(TextPart(text="more ")))
    result = await Agent("a", continue_on_length=1).run("go", runtime=Runtime(model=model))
    assert (result.output, result.stop_reason) == ("more more ", "cut")
    assert len(model.calls) == 2


def test_continue_on_length_cannot_be_negative():
    with pytest.raises(UserError, match="continue_on_length cannot be negative"):
        Agent("a", continue_on_length=-1)


# -- models named by a string -------------------------------------------------------------------


def test_a_model_string_is_accepted_wherever_a_model_is(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    from handrail.models import OpenAIModel

    assert isinstance(Runtime(model="openai:gpt-4o").model, OpenAIModel)
    assert isinstance(Agent("a", model="openai:gpt-4o-mini").model, OpenAIModel)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("gpt-4o", "write it as provider:model"),
        ("nope:x", "unknown provider 'nope'"),
        (42, "42 is not a model.*handrail.models.infer"),
    ],
)
def test_something_that_is_not_a_model_is_refused_when_it_is_given(model: Any, message: str):
    with pytest.raises(ConfigError, match=message):
        Runtime(model=model)
    with pytest.raises(ConfigError, match=message):
        Agent("a", model=model)


async def test_a_turn_given_a_bad_model_string_fails_before_it_starts():
    with pytest.raises(ConfigError, match="unknown provider"):
        Agent("a").run_stream("x", model="nope:x")
