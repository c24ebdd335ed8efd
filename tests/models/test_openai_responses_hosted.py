"""OpenAI's hosted tools (web search, code interpreter) through the Responses API: the real
`openai` SDK against the fake server, with the items and events OpenAI documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fake_providers import (
    FakeProviders,
    responses_call,
    responses_code_interpreter,
    responses_item,
    responses_message,
    responses_stream,
    responses_web_search,
)
from handrail import (
    Agent,
    Engine,
    HostedToolError,
    Message,
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
from handrail.models import ModelRequest
from handrail.runtime import sequential_ids
from handrail.store import SqliteStore
from handrail.testing import hosted_call

CITED = [
    {
        "type": "url_citation",
        "start_index": 0,
        "end_index": 8,
        "url": "https://example.com/a",
        "title": "A <guide>",
    },
    {
        "type": "url_citation",
        "start_index": 9,
        "end_index": 20,
        "url": "https://example.com/c",
        "title": "C, cited only",
    },
]
SEARCH = responses_web_search(
    "ws_1", "handrail python", ["https://example.com/a", "https://example.com/b"]
)
SEARCHED = {
    "kind": "web_search",
    "queries": ["handrail python"],
    "sources": [
        {"url": "https://example.com/a", "title": "A <guide>"},
        {"url": "https://example.com/b", "title": None},
        {"url": "https://example.com/c", "title": "C, cited only"},
    ],
}


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


async def turn(agent: Agent[Any], model: Any, prompt: str = "Search it.") -> Any:
    run = agent.run_stream(prompt, runtime=Runtime(model=model, ids=sequential_ids()))
    events = [e async for e in run]
    return events, run.result


# -- the request ------------------------------------------------------------------------------


async def test_the_request_declares_hosted_tools_in_openais_form(
    fake: FakeProviders, responses_model
):
    @tool
    def note(text: str) -> str:
        """Keep a note."""
        return text

    fake.script(responses_stream([responses_message("ok")]))
    agent = Agent(
        "a",
        tools=[
            note,
            web_search(
                allowed_domains=["docs.python.org"],
                user_location={"city": "Paris", "country": "FR", "timezone": "Europe/Paris"},
            ),
            code_execution(),
        ],
    )
    await turn(agent, responses_model)

    body = fake.requests[0].body
    assert body["tools"] == [
        {
            "type": "function",
            "name": "note",
            "description": "Keep a note.",
            "parameters": {
                "additionalProperties": False,
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "type": "object",
            },
            "strict": False,
        },
        {
            "type": "web_search",
            "filters": {"allowed_domains": ["docs.python.org"]},
            "user_location": {
                "type": "approximate",
                "city": "Paris",
                "country": "FR",
                "timezone": "Europe/Paris",
            },
        },
        {"type": "code_interpreter", "container": {"type": "auto"}},
    ]
    assert body["tool_choice"] == "auto"
    assert body["include"] == [
        "reasoning.encrypted_content",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
    ]


async def test_hosted_tools_alone_are_declared_with_a_tool_choice(
    fake: FakeProviders, responses_model
):
    fake.script(responses_stream([responses_message("ok")]))
    await turn(Agent("a", tools=[web_search()]), responses_model)
    body = fake.requests[0].body
    assert (body["tools"], body["tool_choice"]) == ([{"type": "web_search"}], "auto")


@pytest.mark.parametrize(
    ("tools", "says"),
    [
        (
            [web_fetch()],
            "Tool 'web_fetch' is a hosted web_fetch that the model provider runs, and "
            "OpenAIResponsesModel('gpt-5', ",
        ),
        ([web_search(max_uses=2)], "OpenAI's web search has no max_uses"),
        ([web_search(blocked_domains=["example.org"])], "has no blocked_domains"),
        (
            [web_search(), web_search(name="search_again")],
            "Tools 'web_search' and 'search_again' are both hosted web_search tools",
        ),
    ],
    ids=["web-fetch", "max-uses", "blocked-domains", "two-searches"],
)
async def test_what_openai_cannot_run_is_refused_before_sending(
    fake: FakeProviders, responses_model, tools: list[Any], says: str
):
    request = ModelRequest(
        agent="a",
        instructions=None,
        messages=[Message(id="m1", role="user", parts=[TextPart(text="Hi")])],
        hosted_tools=[t.hosted for t in tools],
    )
    with pytest.raises(HostedToolError) as caught:
        responses_model.stream(request)
    assert says in str(caught.value)
    assert fake.requests == []


async def test_an_agent_with_web_fetch_fails_naming_the_fix(fake: FakeProviders, responses_model):
    events, result = await turn(Agent("a", tools=[web_fetch()]), responses_model)

    assert events[-1].type == "run-failed"
    assert events[-1].error.startswith("HostedToolError: Tool 'web_fetch' is a hosted web_fetch")
    assert events[-1].error.endswith(
        "the Responses API has no web fetch; use web_search(), or AnthropicModel for web_fetch()."
    )
    assert result.outcome == "failed"
    assert fake.requests == []


# -- a web search, streamed, stored, replayed ---------------------------------------------


async def test_a_streamed_web_search_is_one_provider_part_stored_and_replayed_unchanged(
    fake: FakeProviders, responses_model, tmp_path: Path
):
    first = responses_message("Let me look.", id="msg_1")
    answer = responses_message("A guide. C says so too.", id="msg_2", annotations=CITED)
    fake.script(
        responses_stream([first, SEARCH, answer]),
        responses_stream([responses_message("You're welcome.")]),
    )
    engine = Engine(
        Agent("a", tools=[web_search(name="search")]),
        store=SqliteStore(tmp_path / "s.db"),
        runtime=Runtime(model=responses_model, ids=sequential_ids()),
    )
    events = [e async for e in engine.submit("s1", "What is handrail?")]

    hosted = [e for e in events if isinstance(e, ToolCallStarted | ToolCallCompleted)]
    assert hosted == [
        ToolCallStarted(
            agent="a",
            tool_call_id="ws_1",
            name="search",
            args={"type": "search", "query": "handrail python"},
            executor="provider",
        ),
        ToolCallCompleted(
            tool_call_id="ws_1",
            name="search",
            ok=True,
            status="completed",
            summary="searched the web: 3 sources",
            digest=SEARCHED,
            executor="provider",
        ),
    ]
    assert events[-1].type == "run-completed"
    assert [e.finish_reason for e in events if e.type == "usage"] == ["stop"]
    assert len(fake.requests) == 1  # the hosted call was no reason to ask again

    stored = await engine.session("s1")  # read back from SQLite
    message = stored.messages[1]
    assert message.text == "Let me look.A guide. C says so too."
    (part,) = message.tool_calls
    assert (part.id, part.name, part.status, part.executor, part.provider) == (
        "ws_1",
        "search",
        "completed",
        "provider",
        "openai-responses",
    )
    assert part.result == ToolResult(data=SEARCHED, summary="searched the web: 3 sources")
    assert part.digest == SEARCHED
    assert part.provider_blocks == [SEARCH.done]

    [e async for e in engine.submit("s1", "Thanks!")]
    replayed = fake.requests[1].body["input"]
    # Equal as JSON (every key and value, nulls included; JSON objects have no key order).
    assert canonical(replayed) == canonical(
        [
            {"role": "user", "content": "What is handrail?"},
            {"role": "assistant", "content": "Let me look."},
            SEARCH.done,  # in place, as it came: no output item, OpenAI ran it
            {"role": "assistant", "content": "A guide. C says so too."},
            {"role": "user", "content": "Thanks!"},
        ]
    )


async def test_code_interpreter_projects_the_code_and_its_logs(
    fake: FakeProviders, responses_model
):
    ran = responses_code_interpreter("ci_1", ["print(", "6 * 7)"], "42\n")
    fake.script(responses_stream([ran, responses_message("It is 42.")]))

    events, result = await turn(Agent("a", tools=[code_execution()]), responses_model)

    (part,) = result.state.messages[-1].tool_calls
    assert (part.id, part.name, part.args, part.provider_blocks) == (
        "ci_1",
        "code_execution",
        {"code": "print(6 * 7)"},
        [ran.done],
    )
    assert part.result == ToolResult(
        data={
            "kind": "code_execution",
            "code": "print(6 * 7)",
            "stdout": "42\n",
            "stderr": "",
            "return_code": None,  # OpenAI reports no exit status
        },
        summary="ran code",
    )
    assert result.output == "It is 42."
    assert [e.type for e in events if e.type.startswith("tool-call")] == [
        "tool-call-started",
        "tool-call-completed",
    ]


async def test_a_search_that_failed_at_openai_is_a_failed_part(
    fake: FakeProviders, responses_model
):
    failed = responses_web_search("ws_9", "handrail", status="failed")
    fake.script(responses_stream([failed, responses_message("The search failed.")]))

    _, result = await turn(Agent("a", tools=[web_search()]), responses_model)

    (part,) = result.state.messages[-1].tool_calls
    assert (part.status, part.result.ok, part.result.error, part.result.summary) == (
        "failed",
        False,
        "failed",
        "web search failed: failed",
    )
    assert result.output == "The search failed."


async def test_a_hosted_call_beside_a_function_call(fake: FakeProviders, responses_model):
    seen: list[str] = []

    @tool
    def save(url: str) -> str:
        """Save a link."""
        seen.append(url)
        return "saved"

    fake.script(
        responses_stream(
            [SEARCH, responses_call("call_1", "save", '{"url": "https://example.com/a"}')]
        ),
        responses_stream([responses_message("Saved.")]),
    )

    events, result = await turn(Agent("a", tools=[web_search(), save]), responses_model)

    assert seen == ["https://example.com/a"]
    assert [e.finish_reason for e in events if e.type == "usage"] == ["tool_call", "stop"]
    assert fake.requests[1].body["input"][1:] == [
        SEARCH.done,
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "save",
            "arguments": '{"url": "https://example.com/a"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "saved"},
    ]
    assert result.output == "Saved."


async def test_another_providers_hosted_call_is_a_note(fake: FakeProviders, responses_model):
    theirs = hosted_call(
        "web_search",
        {"kind": "web_search", "queries": ["q"], "sources": []},
        id="srvtoolu_1",
        provider="anthropic",
        blocks=[{"type": "server_tool_use", "id": "srvtoolu_1"}],
    )
    history = [
        Message(id="m1", role="user", parts=[TextPart(text="Search.")]),
        Message(id="m2", role="assistant", parts=[theirs, TextPart(text="Nothing found.")]),
        Message(id="m3", role="user", parts=[TextPart(text="Again.")]),
    ]
    fake.script(responses_stream([responses_message("ok")]))

    [
        c
        async for c in responses_model.stream(
            ModelRequest(agent="a", instructions=None, messages=history)
        )
    ]

    assert fake.requests[0].body["input"][1] == {
        "role": "assistant",
        "content": "(The tool 'web_search' ran at anthropic: searched the web: 0 sources. Its "
        'result: {"kind":"web_search","queries":["q"],"sources":[]})',
    }


async def test_an_unknown_output_item_refuses_the_response(fake: FakeProviders, responses_model):
    odd = responses_item({"id": "ig_1", "type": "image_generation_call", "status": "completed"})
    fake.script(responses_stream([odd, responses_message("Here it is.")]))

    events, result = await turn(Agent("a"), responses_model)

    assert events[-1].type == "run-failed"
    assert events[-1].error.startswith(
        "ModelError: openai-responses: the response has an output item of type "
        "'image_generation_call', which handrail cannot read or send back"
    )
    assert result.outcome == "failed"
    assert "Here it is." not in [m.text for m in result.state.messages]
