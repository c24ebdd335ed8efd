"""MCPToolset against real MCP servers: server-everything (Node, stdio) and tests/mcp/_server.py
(Python, streamable HTTP), through `Agent` + `Engine` as users drive them."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TextIO

import pytest

pytest.importorskip(
    "mcp", reason='the MCP toolset tests need the extra: pip install "handrail[mcp]"'
)

from mcp.types import ToolAnnotations

from handrail import (
    Agent,
    Answer,
    Approve,
    ConfigError,
    Engine,
    Runtime,
    Tool,
    ToolCallPart,
    ToolContext,
    ToolDefinitionError,
)
from handrail.mcp import MCPToolset, hint_permission
from handrail.mcp._elicitation import UnfitAnswer, form_content, question
from handrail.store import MemoryStore
from handrail.testing import ScriptedModel, call, sequential_ids

ROOT = Path(__file__).resolve().parents[2]
EVERYTHING = ROOT / "js" / "node_modules" / ".bin" / "mcp-server-everything"
SERVER = Path(__file__).with_name("_server.py")


# -- helpers ---------------------------------------------------------------------------------


def engine_for(tools: list[Any], steps: list[Any], store: MemoryStore) -> Engine:
    runtime = Runtime(model=ScriptedModel(steps), ids=sequential_ids())
    return Engine(Agent("helper", tools=tools), store=store, runtime=runtime)


async def events_of(run: Any) -> list[Any]:
    return [e async for e in run]


async def submit(engine: Engine, text: str = "go") -> list[Any]:
    return await events_of(engine.submit("s1", text))


def completed(events: list[Any]) -> Any:
    (done,) = [e for e in events if e.type == "tool-call-completed"]
    return done


async def stored_call(engine: Engine, call_id: str = "call_1") -> ToolCallPart:
    state = await engine.session("s1")
    (part,) = [p for m in state.messages for p in m.tool_calls if p.id == call_id]
    return part


# -- server-everything over stdio ------------------------------------------------------------


def _everything_missing() -> str | None:
    if shutil.which("node") is None:
        return "MCP NODE TESTS SKIPPED: node is not installed (needs Node.js and npm)"
    if not EVERYTHING.exists():
        return (
            f"MCP NODE TESTS SKIPPED: {EVERYTHING.relative_to(ROOT)} is missing; run "
            f"`npm ci --prefix js` (make test does when npm exists)"
        )
    return None


def _devnull() -> TextIO:
    return open(os.devnull, "w")


@contextlib.asynccontextmanager
async def everything(**options: Any) -> AsyncIterator[MCPToolset]:
    missing = _everything_missing()
    if missing is not None:
        pytest.skip(missing)
    with _devnull() as errlog:  # its banner ("Starting default (STDIO) server...")
        toolset = MCPToolset(
            command=str(EVERYTHING), args=["stdio"], prefix="everything", errlog=errlog, **options
        )
        async with toolset:
            yield toolset


async def test_server_everything_tools_get_permissions_from_their_annotations() -> None:
    async with everything() as toolset:
        tools = {t.name: t for t in await toolset.tools()}
    assert {"everything.echo", "everything.trigger-elicitation-request"} <= set(tools)
    # What server-everything 2026.8.31 declares: readOnlyHint on its getters, and
    # destructiveHint false on its toggles (it declares no destructive tool).
    echo = tools["everything.echo"]
    assert (echo.permission, echo.gated) == ("read", False)
    assert echo.definition.parameters["required"] == ["message"]
    toggle = tools["everything.toggle-simulated-logging"]
    assert (toggle.permission, toggle.gated) == ("write", True)
    assert tools["everything.trigger-elicitation-request"].permission == "write"


async def test_a_call_through_the_engine_returns_the_server_text() -> None:
    async with everything() as toolset:
        engine = engine_for(
            await toolset.tools(), [[call("everything.echo", message="hi")], "Done."], MemoryStore()
        )
        events = await submit(engine)
        assert completed(events).ok
        assert events[-1].type == "run-completed"
        part = await stored_call(engine)
    assert part.result is not None and part.result.data == "Echo: hi"


async def test_structured_content_is_the_output() -> None:
    async with everything() as toolset:
        steps = [[call("everything.get-structured-content", location="New York")], "Done."]
        engine = engine_for(await toolset.tools(), steps, MemoryStore())
        await submit(engine)
        part = await stored_call(engine)
    assert part.result is not None
    assert set(part.result.data) == {"temperature", "conditions", "humidity"}


async def test_an_error_result_is_a_tool_error_the_model_reads() -> None:
    async with everything() as toolset:
        engine = engine_for(
            await toolset.tools(), [[call("everything.echo")], "Oops."], MemoryStore()
        )
        events = await submit(engine)
    done = completed(events)
    assert not done.ok
    assert "expected string" in done.error and "message" in done.error


async def test_a_gated_tool_suspends_for_approval_then_runs() -> None:
    store = MemoryStore()
    async with everything(permissions={"echo": "destructive"}) as toolset:
        tools = await toolset.tools()
        engine = engine_for(tools, [[call("everything.echo", message="careful")], "Done."], store)
        events = await submit(engine)
        assert [e.type for e in events if e.type.endswith("-required")] == ["approval-required"]
        assert events[-1].type == "run-suspended"
        await engine.resolve("s1", "call_1", Approve(by="ana"))
        resumed = await events_of(engine.resume("s1"))
        assert completed(resumed).ok
        part = await stored_call(engine)
    assert part.result is not None and part.result.data == "Echo: careful"


async def test_server_everything_elicitation_becomes_a_question_and_the_answer_reaches_it() -> None:
    store = MemoryStore()
    steps = [[call("everything.trigger-elicitation-request")], "Thanks."]
    async with everything(permissions={"trigger-elicitation-request": "read"}) as toolset:
        engine = engine_for(await toolset.tools(), steps, store)
        events = await submit(engine)
        (asked,) = [e for e in events if e.type == "input-required"]
        assert asked.output_schema == {"type": "string"}
        assert asked.prompt.startswith("Please provide inputs for the following fields:")
        assert "plain text for 'name'" in asked.prompt
        assert events[-1].type == "run-suspended"
        await engine.resolve("s1", "call_1", Answer(output="Ada Lovelace", by="ana"))
        resumed = await events_of(engine.resume("s1"))
        assert completed(resumed).ok
        part = await stored_call(engine)
    assert part.result is not None
    assert "accept" in part.result.data and "Ada Lovelace" in part.result.data


# -- the Python fixture server over streamable HTTP ------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the MCP test server did not start (exit {process.poll()})")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


async def test_http_tools_get_permissions_from_their_annotations(http_url: str) -> None:
    async with MCPToolset(url=http_url, prefix="shop") as toolset:
        tools = {t.name: t for t in await toolset.tools()}
    got = {name: (t.permission, t.gated) for name, t in tools.items()}
    assert got == {
        "shop.lookup": ("read", False),
        "shop.add_note": ("write", True),
        "shop.purge": ("destructive", True),
        "shop.broken": ("read", False),
        "shop.cancel_order": ("read", False),
        "shop.exchange": ("read", False),
    }


async def test_http_calls_errors_and_approval(http_url: str) -> None:
    store = MemoryStore()
    steps = [
        [
            call("shop.lookup", order_id="A1"),
            call("shop.broken", order_id="A1"),
            call("shop.purge", order_id="A1"),
        ],
        "Done.",
    ]
    async with MCPToolset(url=http_url, prefix="shop", headers={"X-Test": "1"}) as toolset:
        engine = engine_for(await toolset.tools(), steps, store)
        events = await submit(engine)
        done = {e.tool_call_id: e for e in events if e.type == "tool-call-completed"}
        assert done["call_1"].ok
        assert not done["call_2"].ok and "Error executing tool broken" in done["call_2"].error
        (gate,) = [e for e in events if e.type == "approval-required"]
        assert gate.tool_call_id == "call_3"
        await engine.resolve("s1", "call_3", Approve())
        await events_of(engine.resume("s1"))
        lookup = await stored_call(engine, "call_1")
        purge = await stored_call(engine, "call_3")
    assert lookup.result is not None and lookup.result.data == {"id": "A1", "status": "delivered"}
    assert purge.result is not None and purge.result.data == {"result": "purged A1"}


@pytest.mark.parametrize(
    ("protocol", "tool_name", "prompt", "result"),
    [
        # a 2025-11-25 connection: the server sends elicitation/create during the call
        ("legacy", "cancel_order", "Why cancel A1?", "cancelled A1: changed my mind"),
        # a 2026-07-28 connection: the call returns an InputRequiredResult (SEP-2322)
        ("auto", "exchange", "Which size for A1?", "exchanged A1 for size changed my mind"),
    ],
)
async def test_http_elicitation_asks_a_person_and_survives_a_restart(
    http_url: str, protocol: str, tool_name: str, prompt: str, result: str
) -> None:
    store = MemoryStore()
    steps = [[call(f"shop.{tool_name}", order_id="A1")], "Done."]
    async with MCPToolset(url=http_url, prefix="shop", protocol=protocol) as toolset:
        engine = engine_for(await toolset.tools(), steps, store)
        events = await submit(engine)
    (asked,) = [e for e in events if e.type == "input-required"]
    assert asked.prompt.splitlines()[0] == prompt
    assert events[-1].type == "run-suspended"

    # A restart while it waits: a new connection (the old MCP session is gone) and engine.
    async with MCPToolset(url=http_url, prefix="shop", protocol=protocol) as toolset:
        engine = engine_for(await toolset.tools(), steps[1:], store)
        await engine.resolve("s1", "call_1", Answer(output="changed my mind"))
        resumed = await events_of(engine.resume("s1"))
        assert completed(resumed).ok
        part = await stored_call(engine)
    assert part.result is not None and part.result.data == {"result": result}


async def test_a_tool_used_outside_the_connection_says_how_to_connect(http_url: str) -> None:
    async with MCPToolset(url=http_url) as toolset:
        tools = await toolset.tools()
    engine = engine_for(tools, [[call("lookup", order_id="A1")], "Done."], MemoryStore())
    done = completed(await submit(engine))
    assert not done.ok and "is not connected" in done.error


# -- permissions, without a server -----------------------------------------------------------

READ = ToolAnnotations(read_only_hint=True)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False)
DESTRUCTIVE = ToolAnnotations(destructive_hint=True)


def test_hints_map_to_permissions_with_mcp_defaults() -> None:
    assert hint_permission(READ) == "read"
    assert hint_permission(ToolAnnotations(read_only_hint=True, destructive_hint=True)) == "read"
    assert hint_permission(WRITE) == "write"
    assert hint_permission(DESTRUCTIVE) == "destructive"
    assert hint_permission(ToolAnnotations()) == "destructive"
    assert hint_permission(None) == "destructive"


def test_untrusted_hints_only_tighten_the_server_permission() -> None:
    toolset = MCPToolset(url="http://127.0.0.1:1/mcp", permission="write")
    assert toolset.permission_of("a", READ) == "write"  # a read-only claim cannot loosen it
    assert toolset.permission_of("a", DESTRUCTIVE) == "destructive"  # tightening is fine
    assert toolset.permission_of("a", None) == "destructive"


def test_trusted_hints_decide_and_the_server_permission_covers_unannotated_tools() -> None:
    toolset = MCPToolset(url="http://127.0.0.1:1/mcp", permission="write", trust_hints=True)
    assert toolset.permission_of("a", READ) == "read"
    assert toolset.permission_of("a", None) == "write"


def test_a_per_tool_override_always_wins() -> None:
    toolset = MCPToolset(
        url="http://127.0.0.1:1/mcp", permission="write", permissions={"a": "read", "b": "draft"}
    )
    assert toolset.permission_of("a", DESTRUCTIVE) == "read"
    assert toolset.permission_of("b", None) == "draft"


def test_bad_configurations_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="exactly one of command="):
        MCPToolset()
    with pytest.raises(ConfigError, match="exactly one of command="):
        MCPToolset(command="x", url="http://x")
    with pytest.raises(ConfigError, match="headers= is for url="):
        MCPToolset(command="x", headers={"a": "b"})
    with pytest.raises(ConfigError, match="permission must be one of"):
        MCPToolset(command="x", permission="admin")  # type: ignore[arg-type]


# -- a person's text as the server's form ----------------------------------------------------

FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Your name"},
        "age": {"type": "integer"},
        "ok": {"type": "boolean"},
        "pet": {"type": "string", "oneOf": [{"const": "pet-1", "title": "Cats"}]},
        "tools": {"type": "array", "items": {"type": "string", "enum": ["saw", "drill"]}},
    },
    "required": ["name"],
}


def test_plain_text_fills_the_one_required_field() -> None:
    assert form_content(FORM, "Ada") == {"name": "Ada"}
    one = {"type": "object", "properties": {"n": {"type": "number"}}}
    assert form_content(one, " 2.5 ") == {"n": 2.5}


def test_a_json_answer_fills_the_fields_with_their_types() -> None:
    answer = '{"name": "Ada", "age": "36", "ok": "yes", "pet": "cats", "tools": "saw, drill"}'
    assert form_content(FORM, answer) == {
        "name": "Ada",
        "age": 36,
        "ok": True,
        "pet": "pet-1",
        "tools": ["saw", "drill"],
    }


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ('{"age": 3}', "leaves out the required 'name'"),
        ('{"name": "A", "colour": "red"}', "no field 'colour'"),
        ('{"name": "A", "age": "old"}', "'age' needs a integer"),
        ('{"name": "A", "ok": "maybe"}', "'ok' needs yes or no"),
        ('{"name": "A", "pet": "dogs"}', "'pet' must be one of pet-1"),
    ],
)
def test_an_answer_that_does_not_fit_says_why(answer: str, why: str) -> None:
    with pytest.raises(UnfitAnswer, match=why):
        form_content(FORM, answer)


def test_plain_text_cannot_fill_a_form_of_several_optional_fields() -> None:
    form = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}
    with pytest.raises(UnfitAnswer, match="must be a JSON object"):
        form_content(form, "x")
    assert "Answer with a JSON object of these fields:" in question("Tell me", form)


# -- Tool(parameters=): a tool whose JSON Schema is given as is ------------------------------
# (the handrail side of MCPToolset; these belong with tests/test_tools.py)


def test_a_tool_can_take_its_arguments_schema_as_is() -> None:
    async def run(ctx: ToolContext[None], **arguments: Any) -> Any:
        return arguments

    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    made = Tool(run, name="search.web", description="Search.", parameters=schema)
    assert made.takes_ctx and made.definition.parameters == schema
    schema["required"] = []  # the tool keeps its own copy
    assert made.definition.parameters["required"] == ["q"]
    validated = made.validate({"q": "x", "page": 2}, None)  # type: ignore[arg-type]
    assert made.arguments(validated) == {"q": "x", "page": 2}  # passed through, unchecked
    assert made.stored_args(validated) == {"q": "x", "page": 2}


def test_a_given_schema_must_be_an_object_and_excludes_bindings_and_amendments() -> None:
    def run(**arguments: Any) -> Any:
        return arguments

    with pytest.raises(ToolDefinitionError, match='JSON Schema of type "object"'):
        Tool(run, name="a", parameters={"type": "string"})
    with pytest.raises(ToolDefinitionError, match="bindings= and amendable="):
        Tool(run, name="a", parameters={"type": "object"}, bindings={"q": "sys:user_id"})
    with pytest.raises(ToolDefinitionError, match="bindings= and amendable="):
        Tool(run, name="a", parameters={"type": "object"}, amendable=["q"], approval="required")
