"""Anthropic's server tools (hosted tools) through the real `anthropic` SDK and the fake server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fake_providers import (
    FakeProviders,
    anthropic_bash_result,
    anthropic_server_tool_error,
    anthropic_server_tool_use,
    anthropic_stream,
    anthropic_web_fetch_result,
    anthropic_web_search_result,
)
from handrail import (
    Agent,
    Engine,
    RunState,
    Runtime,
    TextPart,
    ToolCallCompleted,
    ToolCallStarted,
    ToolResult,
    code_execution,
    tool,
    web_fetch,
    web_search,
)
from handrail.runtime import sequential_ids
from handrail.store import SqliteStore

SEARCH = anthropic_server_tool_use("srvtoolu_01", "web_search", {"query": "handrail python"})
RESULTS = anthropic_web_search_result(
    "srvtoolu_01",
    [("https://example.com/a", "A <guide>"), ("https://example.com/b", "B")],
)
SEARCHED = {
    "kind": "web_search",
    "queries": ["handrail python"],
    "sources": [
        {"url": "https://example.com/a", "title": "A <guide>"},
        {"url": "https://example.com/b", "title": "B"},
    ],
}


def text(*pieces: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return {"type": "text", "text": ""}, [{"type": "text_delta", "text": p} for p in pieces]


def whole(block: tuple[dict[str, Any], list[dict[str, Any]]]) -> dict[str, Any]:
    """A streamed block as it is once its deltas are in (a call's input made whole)."""
    start, deltas = block
    if start["type"] != "server_tool_use":
        return start
    return {**start, "input": json.loads("".join(d["partial_json"] for d in deltas))}


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


async def turn(agent: Agent[Any], model: Any, prompt: str = "Search it.") -> Any:
    run = agent.run_stream(prompt, runtime=Runtime(model=model, ids=sequential_ids()))
    events = [e async for e in run]
    return events, run.result


# -- the request ------------------------------------------------------------------------------


async def test_the_request_declares_hosted_tools_in_anthropics_form(
    fake: FakeProviders, anthropic_model
):
    @tool
    def note(text: str) -> str:
        """Keep a note."""
        return text

    fake.script(anthropic_stream([text("ok")]))
    agent = Agent(
        "a",
        tools=[
            note,
            web_search(
                max_uses=3,
                allowed_domains=["docs.python.org"],
                user_location={"city": "Paris", "country": "FR", "timezone": "Europe/Paris"},
            ),
            code_execution(),
            web_fetch(blocked_domains=["example.org"], max_content_tokens=5000, citations=True),
        ],
    )
    await turn(agent, anthropic_model)
    body = fake.requests[0].body
    assert body["tools"] == [
        {
            "name": "note",
            "description": "Keep a note.",
            "input_schema": {
                "additionalProperties": False,
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "type": "object",
            },
        },
        {
            "type": "web_search_20250305",
            "name": "web_search",
            "max_uses": 3,
            "allowed_domains": ["docs.python.org"],
            "user_location": {
                "type": "approximate",
                "city": "Paris",
                "country": "FR",
                "timezone": "Europe/Paris",
            },
        },
        {"type": "code_execution_20250825", "name": "code_execution"},
        {
            "type": "web_fetch_20250910",
            "name": "web_fetch",
            "blocked_domains": ["example.org"],
            "max_content_tokens": 5000,
            "citations": {"enabled": True},
        },
    ]
    assert body["tool_choice"] == {"type": "auto"}
    assert "anthropic-beta" not in fake.requests[0].headers  # GA tools: no beta header


# -- a web search, streamed, stored, replayed ---------------------------------------------


async def test_a_streamed_web_search_is_one_provider_part_stored_and_replayed_unchanged(
    fake: FakeProviders, anthropic_model, tmp_path: Path
):
    fake.script(
        anthropic_stream([text("Let me look."), SEARCH, RESULTS, text("Two sources agree.")]),
        anthropic_stream([text("You're welcome.")]),
    )
    engine = Engine(
        Agent("a", tools=[web_search(name="search")]),
        store=SqliteStore(tmp_path / "s.db"),
        runtime=Runtime(model=anthropic_model, ids=sequential_ids()),
    )
    events = [e async for e in engine.submit("s1", "What is handrail?")]

    hosted = [e for e in events if isinstance(e, ToolCallStarted | ToolCallCompleted)]
    assert hosted == [
        ToolCallStarted(
            agent="a",
            tool_call_id="srvtoolu_01",
            name="search",
            args={"query": "handrail python"},
            executor="provider",
        ),
        ToolCallCompleted(
            tool_call_id="srvtoolu_01",
            name="search",
            ok=True,
            status="completed",
            summary="searched the web: 2 sources",
            digest=SEARCHED,
            executor="provider",
        ),
    ]
    assert events[-1].type == "run-completed"
    assert len(fake.requests) == 1  # the hosted call was no reason to ask again

    stored = await engine.session("s1")  # read back from SQLite
    answer = stored.messages[1]
    assert answer.text == "Let me look.Two sources agree."
    (part,) = answer.tool_calls
    assert (part.id, part.name, part.args, part.status) == (
        "srvtoolu_01",
        "search",
        {"query": "handrail python"},
        "completed",
    )
    assert (part.executor, part.provider) == ("provider", "anthropic")
    assert part.result == ToolResult(data=SEARCHED, summary="searched the web: 2 sources")
    assert part.digest == SEARCHED
    assert part.provider_blocks == [whole(SEARCH), whole(RESULTS)]

    [e async for e in engine.submit("s1", "Thanks!")]
    replayed = fake.requests[1].body["messages"][1]
    assert replayed["role"] == "assistant"
    # Equal as JSON (every key and value, nulls included; JSON objects have no key order).
    assert canonical(replayed["content"]) == canonical(
        [
            {"type": "text", "text": "Let me look."},
            whole(SEARCH),
            whole(RESULTS),
            {"type": "text", "text": "Two sources agree."},
        ]
    )
    assert fake.requests[1].body["messages"][2] == {
        "role": "user",
        "content": [{"type": "text", "text": "Thanks!"}],
    }


async def test_code_execution_projects_the_command_and_its_output(
    fake: FakeProviders, anthropic_model
):
    command = {"command": "python -c 'print(6 * 7)'"}
    fake.script(
        anthropic_stream(
            [
                anthropic_server_tool_use("srvtoolu_02", "bash_code_execution", command),
                anthropic_bash_result("srvtoolu_02", "42\n"),
                text("It is 42."),
            ]
        )
    )
    _, result = await turn(Agent("a", tools=[code_execution()]), anthropic_model)
    (part,) = result.state.messages[-1].tool_calls
    assert part.name == "code_execution"
    assert part.result == ToolResult(
        data={
            "kind": "code_execution",
            "code": "python -c 'print(6 * 7)'",
            "stdout": "42\n",
            "stderr": "",
            "return_code": 0,
        },
        summary="ran code (exit 0)",
    )
    assert result.output == "It is 42."


async def test_a_web_fetch_projects_the_page(fake: FakeProviders, anthropic_model):
    fake.script(
        anthropic_stream(
            [
                anthropic_server_tool_use(
                    "srvtoolu_03", "web_fetch", {"url": "https://example.com/doc"}
                ),
                anthropic_web_fetch_result(
                    "srvtoolu_03", "https://example.com/doc", "The doc", "Hello."
                ),
                text("It says hello."),
            ]
        )
    )
    _, result = await turn(Agent("a", tools=[web_fetch()]), anthropic_model)
    (part,) = result.state.messages[-1].tool_calls
    assert part.result == ToolResult(
        data={"kind": "web_fetch", "url": "https://example.com/doc", "title": "The doc"},
        summary="fetched https://example.com/doc",
    )


async def test_a_provider_side_error_is_a_failed_part_with_the_providers_code(
    fake: FakeProviders, anthropic_model
):
    error = anthropic_server_tool_error(
        "web_search_tool_result", "srvtoolu_01", "max_uses_exceeded"
    )
    fake.script(anthropic_stream([SEARCH, error, text("I could not search.")]))
    events, result = await turn(Agent("a", tools=[web_search()]), anthropic_model)
    (part,) = result.state.messages[-1].tool_calls
    assert part.status == "failed"
    assert part.result == ToolResult(
        ok=False,
        data={"kind": "web_search", "queries": ["handrail python"], "sources": []},
        summary="web search failed: max_uses_exceeded",
        error="max_uses_exceeded",
        code="max_uses_exceeded",  # the provider's own code, for programs
    )
    completed = next(e for e in events if isinstance(e, ToolCallCompleted))
    assert (completed.ok, completed.error, completed.executor) == (
        False,
        "max_uses_exceeded",
        "provider",
    )
    assert part.provider_blocks == [whole(SEARCH), whole(error)]


# -- pause_turn, cut streams, mixed responses, unknown blocks -------------------------------


async def test_pause_turn_sends_the_content_back_as_it_is_and_the_model_continues(
    fake: FakeProviders, anthropic_model
):
    fake.script(
        anthropic_stream([text("Searching. "), SEARCH, RESULTS], stop_reason="pause_turn"),
        anthropic_stream([text("Found two.")]),
    )
    _, result = await turn(Agent("a", tools=[web_search()]), anthropic_model)
    assert len(fake.requests) == 2
    continued = fake.requests[1].body["messages"]
    assert continued[-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Searching. "}, whole(SEARCH), whole(RESULTS)],
    }
    assert (result.outcome, result.output) == ("completed", "Searching. Found two.")


async def test_a_stream_cut_inside_a_server_tool_block_is_never_acted_on(
    fake: FakeProviders, anthropic_model
):
    # message_start, ping, text start, delta, stop, then the server tool's start and a piece.
    fake.script(anthropic_stream([text("Let me look."), SEARCH, RESULTS], cut_after=7))
    events, result = await turn(Agent("a", tools=[web_search()]), anthropic_model)
    assert events[-1].type == "run-failed"
    assert events[-1].error.startswith("IncompleteResponseError: anthropic: ")
    assert not [e for e in events if isinstance(e, ToolCallStarted | ToolCallCompleted)]
    assert all(not m.tool_calls for m in result.state.messages)


async def test_a_hosted_call_and_a_function_call_in_one_response(
    fake: FakeProviders, anthropic_model
):
    ran: list[str] = []

    @tool(name="notes.keep")
    def keep(text: str) -> str:
        """Keep a note."""
        ran.append(text)
        return "kept"

    function_call = (
        {"type": "tool_use", "id": "toolu_01", "name": "notes_keep", "input": {}},
        [{"type": "input_json_delta", "partial_json": '{"text": "found two"}'}],
    )
    fake.script(
        anthropic_stream([SEARCH, RESULTS, function_call], stop_reason="tool_use"),
        anthropic_stream([text("Noted.")]),
    )
    _, result = await turn(Agent("a", tools=[web_search(), keep]), anthropic_model)
    assert ran == ["found two"]  # the function call ran once; the hosted one not at all
    hosted, noted = result.state.messages[1].tool_calls
    assert (hosted.executor, hosted.status, noted.status) == ("provider", "completed", "completed")
    second = fake.requests[1].body["messages"]
    assert second[1]["content"] == [
        whole(SEARCH),
        whole(RESULTS),
        {
            "type": "tool_use",
            "id": "toolu_01",
            "name": "notes_keep",
            "input": {"text": "found two"},
        },
    ]
    assert second[2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "kept"}],
    }
    assert result.output == "Noted."


async def test_an_unknown_content_block_refuses_the_response(fake: FakeProviders, anthropic_model):
    fake.script(anthropic_stream([({"type": "container_upload", "file_id": "file_1"}, [])]))
    events, _ = await turn(Agent("a", tools=[code_execution()]), anthropic_model)
    assert events[-1].type == "run-failed"
    assert "content block of type 'container_upload'" in events[-1].error
    assert "refused rather than dropped" in events[-1].error


async def test_a_hosted_call_from_another_provider_is_sent_as_a_note(
    fake: FakeProviders, anthropic_model
):
    from handrail import Message, TextPart
    from handrail.models import ModelRequest
    from handrail.testing import hosted_call

    other = hosted_call(
        "web_search",
        SEARCHED,
        id="ws_1",
        provider="openai-responses",
        blocks=[{"type": "web_search_call", "id": "ws_1"}],
    )
    fake.script(anthropic_stream([text("ok")]))
    request = ModelRequest(
        agent="a",
        instructions=None,
        messages=[
            Message(id="u", role="user", parts=[TextPart(text="Hi")]),
            Message(id="m", role="assistant", parts=[other, TextPart(text="Done.")]),
            Message(id="u2", role="user", parts=[TextPart(text="And?")]),
        ],
    )
    [c async for c in anthropic_model.stream(request)]
    content = fake.requests[0].body["messages"][1]["content"]
    assert content[0]["type"] == "text"
    assert content[0]["text"].startswith(
        "(The tool 'web_search' ran at openai-responses: searched the web: 2 sources."
    )
    assert content[1] == {"type": "text", "text": "Done."}


def test_two_hosted_tools_of_one_kind_cannot_go_to_anthropic():
    from handrail import HostedToolError
    from handrail.models import ModelRequest
    from handrail.models._anthropic_format import anthropic_request
    from handrail.models._wire import ToolNames

    agent = Agent("a", tools=[web_search(), web_search(name="search2")])
    request = ModelRequest(
        agent="a", instructions=None, messages=[], hosted_tools=agent.hosted_tools
    )
    with pytest.raises(HostedToolError, match="both hosted web_search tools"):
        anthropic_request(request, ToolNames([]))


async def test_a_non_streamed_answer_makes_the_same_hosted_part(fake: FakeProviders, retry):
    from fake_providers import anthropic_message
    from handrail.models.anthropic import AnthropicModel

    fake.script(
        anthropic_message([whole(SEARCH), whole(RESULTS), text("Two.")[0] | {"text": "Two."}])
    )
    async with AnthropicModel(
        "claude-sonnet-4-6", api_key="k", base_url=fake.url, retry=retry, stream=False
    ) as model:
        _, result = await turn(Agent("a", tools=[web_search()]), model)
    (part,) = result.state.messages[-1].tool_calls
    assert part.result == ToolResult(data=SEARCHED, summary="searched the web: 2 sources")
    assert part.provider_blocks == [whole(SEARCH), whole(RESULTS)]
    assert result.output == "Two."


async def test_a_hosted_result_that_comes_after_the_function_result_settles_its_call(
    fake: FakeProviders, anthropic_model
):
    ran: list[str] = []

    @tool
    def lookup(order: str) -> str:
        """Look an order up."""
        ran.append(order)
        return "shipped"

    function_call = (
        {"type": "tool_use", "id": "toolu_01", "name": "lookup", "input": {}},
        [{"type": "input_json_delta", "partial_json": '{"order": "A1"}'}],
    )
    # Anthropic runs the search only once the client tool's result is sent back.
    fake.script(
        anthropic_stream([SEARCH, function_call], stop_reason="tool_use"),
        anthropic_stream([RESULTS, text("A1 shipped; two sources agree.")]),
        anthropic_stream([text("Bye.")]),
    )
    agent = Agent("a", tools=[web_search(), lookup])
    state = RunState()
    runtime = Runtime(model=anthropic_model, ids=sequential_ids())
    events = [e async for e in agent.run_stream("Where is A1?", state=state, runtime=runtime)]
    assert ran == ["A1"]
    second = fake.requests[1].body["messages"]
    assert second[1]["content"] == [
        whole(SEARCH),
        {"type": "tool_use", "id": "toolu_01", "name": "lookup", "input": {"order": "A1"}},
    ]
    assert second[2]["content"][0]["tool_use_id"] == "toolu_01"

    first, later = state.messages[1].tool_calls[0], state.messages[2].tool_calls[0]
    assert (first.id, later.id) == ("srvtoolu_01", "srvtoolu_01")  # one call, in two responses
    for part in (first, later):
        assert (part.status, part.args) == ("completed", {"query": "handrail python"})
        assert part.result == ToolResult(data=SEARCHED, summary="searched the web: 2 sources")
    assert (first.provider_blocks, later.provider_blocks) == ([whole(SEARCH)], [whole(RESULTS)])
    hosted = [
        e.type
        for e in events
        if isinstance(e, ToolCallStarted | ToolCallCompleted) and e.tool_call_id == "srvtoolu_01"
    ]
    assert hosted == ["tool-call-started", "tool-call-completed"]

    [e async for e in agent.run_stream("Thanks", state=state, runtime=runtime)]
    third = fake.requests[2].body["messages"]
    assert [m["role"] for m in third] == ["user", "assistant", "user", "assistant", "user"]
    assert third[3]["content"] == [
        whole(RESULTS),
        {"type": "text", "text": "A1 shipped; two sources agree."},
    ]


async def test_a_cited_text_keeps_its_citations_and_is_sent_back_as_text(
    fake: FakeProviders, anthropic_model
):
    citation = {
        "type": "web_search_result_location",
        "url": "https://example.com/a",
        "title": "A <guide>",
        "encrypted_index": "Eo8BCioIAhgB",
        "cited_text": "handrail is a Python engine",
    }
    cited = (
        {"type": "text", "text": "", "citations": []},
        [
            {"type": "citations_delta", "citation": citation},
            {"type": "text_delta", "text": "It is a Python engine."},
        ],
    )
    fake.script(
        anthropic_stream([SEARCH, RESULTS, cited]),
        anthropic_stream([text("Bye.")]),
    )
    agent = Agent("a", tools=[web_search()])
    state = RunState()
    runtime = Runtime(model=anthropic_model, ids=sequential_ids())
    [e async for e in agent.run_stream("What is it?", state=state, runtime=runtime)]
    answer = state.messages[1].parts[-1]
    assert answer == TextPart(text="It is a Python engine.", citations=[citation])
    [e async for e in agent.run_stream("Thanks", state=state, runtime=runtime)]
    assert fake.requests[1].body["messages"][1]["content"][-1] == {
        "type": "text",
        "text": "It is a Python engine.",
    }
