"""Hosted tools through the loop: calls the model provider ran are shown, kept, never run."""

from __future__ import annotations

from typing import Any

import pytest

from handrail import (
    Agent,
    HostedToolError,
    ModelResponse,
    RunState,
    Runtime,
    TextPart,
    ToolCallCompleted,
    ToolCallStarted,
    ToolResult,
    tool,
    web_search,
)
from handrail.models import ModelRequest
from handrail.testing import FunctionModel, ScriptedModel, call, hosted_call, sequential_ids

SEARCH = {
    "kind": "web_search",
    "queries": ["handrail python"],
    "sources": [
        {"url": "https://example.com/a", "title": "A"},
        {"url": "https://example.com/b", "title": "B"},
    ],
}


def stored(data: Any) -> ToolResult:
    """A plain result as the history keeps it: with the summary line derived from it."""
    result = ToolResult(data=data)
    result.summary = result.display_summary()
    return result


def searched(**options: Any) -> Any:
    return hosted_call("web_search", SEARCH, args={"query": "handrail python"}, **options)


def hosted(agent: Agent[Any]) -> dict[str, Any]:
    return {"tools": agent.tool_definitions, "hosted_tools": agent.hosted_tools}


async def run(agent: Agent[Any], model: Any) -> tuple[list[Any], RunState]:
    state = RunState()
    rt = Runtime(model=model, ids=sequential_ids())
    events = [e async for e in agent.run_stream("go", state=state, runtime=rt)]
    return events, state


async def test_a_response_whose_only_calls_the_provider_ran_is_the_answer():
    model = ScriptedModel([[searched(id="srvtoolu_1"), "Two sources say so."]])
    events, state = await run(Agent("a", tools=[web_search()]), model)
    model.assert_complete()  # asked once: the hosted call is no reason to ask again
    (part,) = state.messages[-1].tool_calls
    assert (part.id, part.status, part.executor) == ("srvtoolu_1", "completed", "provider")
    assert part.result == ToolResult(data=SEARCH, summary="searched the web: 2 sources")
    assert part.digest == SEARCH
    hosted = [e for e in events if isinstance(e, ToolCallStarted | ToolCallCompleted)]
    assert hosted == [
        ToolCallStarted(
            agent="a",
            tool_call_id="srvtoolu_1",
            name="web_search",
            args={"query": "handrail python"},
            executor="provider",
        ),
        ToolCallCompleted(
            tool_call_id="srvtoolu_1",
            name="web_search",
            ok=True,
            status="completed",
            summary="searched the web: 2 sources",
            digest=SEARCH,
            executor="provider",
        ),
    ]
    assert events[-1].output == "Two sources say so."


async def test_a_provider_error_is_a_failed_call_with_its_code():
    failed = hosted_call(
        "web_search",
        {"kind": "web_search", "queries": ["x"], "sources": []},
        error="max_uses_exceeded",
    )
    _, state = await run(Agent("a", tools=[web_search()]), ScriptedModel([[failed, "Sorry."]]))
    (part,) = state.messages[-1].tool_calls
    assert part.status == "failed"
    assert part.result is not None
    assert (part.result.ok, part.result.error, part.result.summary) == (
        False,
        "max_uses_exceeded",
        "web search failed: max_uses_exceeded",
    )


async def test_in_a_mixed_response_the_function_call_runs_and_the_hosted_one_does_not():
    ran: list[str] = []

    @tool
    def note(text: str) -> str:
        """Keep a note."""
        ran.append(text)
        return "kept"

    model = ScriptedModel([[searched(id="srvtoolu_1"), call("note", text="hi")], "Done."])
    _, state = await run(Agent("a", tools=[web_search(), note]), model)
    model.assert_complete()
    hosted, noted = state.messages[1].tool_calls
    assert ran == ["hi"]
    assert (hosted.status, hosted.result) == (
        "completed",
        ToolResult(data=SEARCH, summary="searched the web: 2 sources"),
    )
    assert (noted.status, noted.result) == ("completed", stored("kept"))


async def test_a_paused_turn_is_sent_back_as_it_is_and_continued():
    requests: list[list[Any]] = []

    def answer(request: ModelRequest) -> Any:
        requests.append(list(request.messages))
        if len(requests) == 1:
            return ModelResponse(
                parts=[TextPart(text="Let me look. "), searched(id="srvtoolu_1")],
                stop_reason="pause_turn",
                finish_reason="pause",
            )
        return "Found it."

    events, state = await run(Agent("a", tools=[web_search()]), FunctionModel(answer))
    assert len(requests) == 2
    paused = requests[1][-1]
    assert (paused.role, paused.text) == ("assistant", "Let me look. ")
    assert paused.tool_calls[0].id == "srvtoolu_1"
    assert [m.role for m in state.messages] == ["user", "assistant", "assistant"]
    assert events[-1].output == "Let me look. Found it."


async def test_a_turn_that_keeps_pausing_stops_at_max_iterations():
    def pause(request: ModelRequest) -> Any:
        return ModelResponse(parts=[searched()], stop_reason="pause_turn", finish_reason="pause")

    agent = Agent("a", tools=[web_search()], max_iterations=3)
    state = RunState()
    run_ = agent.run_stream("go", state=state, runtime=Runtime(model=FunctionModel(pause)))
    async for _ in run_:
        pass
    assert (run_.result.outcome, run_.result.stop_reason) == ("failed", "max-iterations")


async def test_the_hosted_tools_reach_the_model_apart_from_the_function_tools():
    @tool
    def note(text: str) -> str:
        """Keep a note."""
        return text

    model = ScriptedModel(["ok"])
    await run(Agent("a", tools=[web_search(max_uses=2), note]), model)
    (request,) = model.calls
    assert [t.name for t in request.tools] == ["note"]
    assert [(h.kind, h.name, h.max_uses) for h in request.hosted_tools] == [
        ("web_search", "web_search", 2)
    ]


async def test_a_hosted_tool_given_to_chat_completions_fails_before_any_request():
    pytest.importorskip("openai")
    from handrail.models.openai import OpenAIModel

    model = OpenAIModel("gpt-4o-mini", api_key="unused", base_url="http://127.0.0.1:9/v1")
    agent = Agent("a", tools=[web_search()])
    request = ModelRequest(agent="a", instructions=None, messages=[], **hosted(agent))
    with pytest.raises(HostedToolError) as caught:
        model.stream(request)  # refused as it is asked, before anything is sent
    assert str(caught.value) == (
        "Tool 'web_search' is a hosted web_search that the model provider runs, and "
        "OpenAIModel('gpt-4o-mini', base_url='http://127.0.0.1:9/v1/') cannot run it: Chat "
        "Completions has no hosted tools; use OpenAIResponsesModel (openai-responses:...), or "
        "AnthropicModel."
    )


def test_another_providers_hosted_call_reads_as_a_note_in_chat_completions():
    from handrail import Message
    from handrail.models._openai_format import openai_messages
    from handrail.models._wire import ToolNames

    part = searched(id="srvtoolu_1", provider="anthropic", blocks=[{"type": "server_tool_use"}])
    message = Message(id="m1", role="assistant", parts=[part, TextPart(text="Two sources.")])
    (out,) = openai_messages(None, [message], ToolNames([]))
    assert out == {
        "role": "assistant",
        "content": [
            {
                "type": "text",
                "text": "(The tool 'web_search' ran at anthropic: searched the web: 2 sources. "
                'Its result: {"kind":"web_search","queries":["handrail python"],"sources":'
                '[{"url":"https://example.com/a","title":"A"},'
                '{"url":"https://example.com/b","title":"B"}]})',
            },
            {"type": "text", "text": "Two sources."},
        ],
    }


async def test_a_hosted_call_counts_toward_min_tool_calls():
    model = ScriptedModel([[searched(), "Found it."]])
    events, _ = await run(Agent("a", tools=[web_search()], min_tool_calls=1), model)
    assert len(model.calls) == 1  # no nudge: the search was the call the agent owed
    assert (events[-1].type, events[-1].output) == ("run-completed", "Found it.")


async def test_a_turn_suspended_beside_a_hosted_call_resumes_without_touching_it():
    from handrail import Approve, Engine, MemoryStore

    sent: list[str] = []

    @tool(permission="write")
    def send(to: str) -> str:
        """Send a reply."""
        sent.append(to)
        return "sent"

    model = ScriptedModel([[searched(id="srvtoolu_1"), call("send", to="ana")], "Sent it."])
    engine = Engine(
        Agent("a", tools=[web_search(), send]),
        store=MemoryStore(),
        runtime=Runtime(model=model, ids=sequential_ids()),
    )
    first = [e async for e in engine.submit("s1", "Find and send")]
    assert first[-1].type == "run-suspended"
    (pending,) = (await engine.session("s1")).pending
    await engine.resolve("s1", pending, Approve())
    second = [e async for e in engine.resume("s1")]
    assert second[-1].type == "run-completed"
    model.assert_complete()
    assert sent == ["ana"]
    hosted = (await engine.session("s1")).messages[1].tool_calls[0]
    assert (hosted.id, hosted.status) == ("srvtoolu_1", "completed")
    assert hosted.result == ToolResult(data=SEARCH, summary="searched the web: 2 sources")
    assert not [e for e in second if getattr(e, "tool_call_id", None) == "srvtoolu_1"]
