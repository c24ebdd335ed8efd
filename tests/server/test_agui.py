"""The AG-UI endpoint, driven by `@ag-ui/client`'s `HttpAgent` (Node) over a real socket."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette

from handrail import Agent, AskPerson, Engine, Runtime, ToolContext, tool
from handrail.demo.support_desk import CUSTOMER_MESSAGE, Scenario, build_scenario
from handrail.server import create_app
from handrail.server._agui import thread_session_id
from handrail.server._auth import Caller
from handrail.store.sqlite import SqliteStore
from handrail.testing import ScriptedModel, call, hosted_call, sequential_ids
from handrail.tools import web_search

from .conftest import authenticator, reuse_app, roles_app
from .test_uvicorn import serving

NODE = shutil.which("node")
JS = Path(__file__).resolve().parents[2] / "js" / "node_modules"
CLIENT = Path(__file__).with_name("agui_client.mjs")

pytestmark = pytest.mark.skipif(
    NODE is None or not (JS / "@ag-ui" / "client").is_dir(),
    reason="AG-UI NODE TESTS SKIPPED: `node` or js/node_modules/@ag-ui/client is missing "
    "(install Node 20 and the js/ packages to run them).",
)

ANA = Caller(org_id="acme", user_id="ana")


def _app(scenario: Scenario) -> Starlette:
    return create_app(scenario.engine, authenticator=authenticator(), static_dir=None)


async def _client(url: str, thread: str, steps: list[dict[str, Any]], **more: Any) -> list[Any]:
    spec: dict[str, Any] = {
        "url": f"{url}/agui",
        "key": "key-ana",
        "threadId": thread,
        "nodeModules": str(JS),
        "steps": steps,
        **more,
    }
    assert NODE is not None
    process = await asyncio.create_subprocess_exec(
        NODE,
        str(CLIENT),
        json.dumps(spec),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]


def _types(step: dict[str, Any]) -> list[str]:
    return [e["type"] for e in step["events"]]


def _refund_interrupt(step: dict[str, Any]) -> dict[str, Any]:
    finished = step["events"][-1]
    assert finished["type"] == "RUN_FINISHED"
    assert finished["outcome"]["type"] == "interrupt"
    (interrupt,) = finished["outcome"]["interrupts"]
    return interrupt  # type: ignore[no-any-return]


def _edited(amount: float, **changes: Any) -> dict[str, Any]:
    args = {"order_id": "A1042", "amount": amount, "reason": "damaged on arrival"}
    return {**args, **changes}


async def test_a_refund_pauses_with_an_interrupt_listing_only_the_amendable_field() -> None:
    scenario = build_scenario()
    async with serving(_app(scenario)) as url:
        (step, final) = await _client(url, "t-1", [{"message": CUSTOMER_MESSAGE}])
    assert step["error"] is None
    types = _types(step)
    assert types[0] == "RUN_STARTED" and step["events"][0]["protocolVersion"] == "1.0"
    assert {"TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"} <= set(types)
    interrupt = _refund_interrupt(step)
    assert interrupt["reason"] == "approval"
    assert interrupt["toolCallId"] == interrupt["id"]
    schema = interrupt["responseSchema"]
    assert list(schema["properties"]["editedArgs"]["properties"]) == ["amount"]
    assert interrupt["metadata"]["handrail"]["args"] == _edited(84.0)
    assert final["final"]["pendingInterrupts"] == [interrupt]
    assert scenario.desk.refunds == []


async def test_an_approval_with_edited_args_refunds_the_edited_amount() -> None:
    scenario = build_scenario()
    async with serving(_app(scenario)) as url:
        steps: list[dict[str, Any]] = [
            {"message": CUSTOMER_MESSAGE},
            {"resume": [{"status": "resolved", "payload": {
                "approved": True, "editedArgs": _edited(40)}}]},
        ]  # fmt: skip
        first, second, final = await _client(url, "t-2", steps)
    _refund_interrupt(first)
    assert second["error"] is None
    types = _types(second)
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
    assert "outcome" not in second["events"][-1] or second["events"][-1]["outcome"]["type"] == (
        "success"
    )
    assert "TEXT_MESSAGE_CONTENT" in types and "TOOL_CALL_RESULT" in types
    assert [r["amount"] for r in scenario.desk.refunds] == ["€40.00"]
    assert final["final"]["pendingInterrupts"] == []
    # The audit trail has the decision (the authenticated user's, amended) and the refund.
    decided, ran = await scenario.engine.store.audit("acme")
    assert (decided.who, decided.decision, decided.amended_after) == (
        "ana", "approve", {"amount": 40.0},
    )  # fmt: skip
    assert (ran.kind, ran.outcome, ran.args_digest) == ("call", "ok", decided.args_digest)


def _reply(step: dict[str, Any]) -> str:
    return "".join(e["delta"] for e in step["events"] if e["type"] == "TEXT_MESSAGE_CONTENT")


async def test_a_rejection_makes_no_refund_and_the_thread_goes_on() -> None:
    scenario = build_scenario()
    async with serving(_app(scenario)) as url:
        steps: list[dict[str, Any]] = [
            {"message": CUSTOMER_MESSAGE},
            {"resume": [{"status": "resolved", "payload": {"approved": False}}]},
            {"message": "Thanks. Where is my order A1042?"},
        ]
        _, second, third, _ = await _client(url, "t-3", steps)
    assert second["error"] is None
    assert _types(second)[-1] == "RUN_FINISHED"
    assert scenario.desk.refunds == []
    assert "did not approve" in _reply(second)
    # Only the message the session had not seen is the new turn's.
    assert third["error"] is None and _types(third)[-1] == "RUN_FINISHED"
    assert _reply(third) == "Your order A1042 (€84.00) was delivered on 18 November. Anything else?"


async def test_an_edit_of_a_field_that_is_not_amendable_is_refused_and_nothing_recorded() -> None:
    scenario = build_scenario()
    async with serving(_app(scenario)) as url:
        steps: list[dict[str, Any]] = [
            {"message": CUSTOMER_MESSAGE},
            {"resume": [{"status": "resolved", "payload": {
                "approved": True, "editedArgs": _edited(84.0, order_id="B2001")}}]},
        ]  # fmt: skip
        first, second, _ = await _client(url, "t-4", steps)
    interrupt = _refund_interrupt(first)
    error = second["events"][-1]
    assert error["type"] == "RUN_ERROR" and error["code"] == "not_amendable"
    assert "order_id cannot be amended" in error["message"]
    state = await scenario.engine.session(
        thread_session_id(ANA, "t-4"), org_id="acme", user_id="ana"
    )
    assert list(state.pending) == [interrupt["id"]]  # still waiting: nothing decided
    assert scenario.desk.refunds == []


async def test_a_thread_resumes_on_a_restarted_server(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    scenario = build_scenario(store=SqliteStore(path))
    async with serving(_app(scenario)) as url:
        (first, final) = await _client(url, "t-5", [{"message": CUSTOMER_MESSAGE}])
    _refund_interrupt(first)
    restarted = build_scenario(store=SqliteStore(path))  # a new process: same store only
    async with serving(_app(restarted)) as url:
        steps: list[dict[str, Any]] = [{"resume": [{"status": "resolved", "payload": {
            "approved": True, "editedArgs": _edited(40)}}]}]  # fmt: skip
        (second, _) = await _client(url, "t-5", steps, **final["final"])
    assert second["error"] is None
    assert _types(second)[-1] == "RUN_FINISHED"
    assert [r["amount"] for r in restarted.desk.refunds] == ["€40.00"]


async def test_another_tenant_with_the_same_thread_id_cannot_resume_it() -> None:
    scenario = build_scenario()
    async with serving(_app(scenario)) as url:
        (first, final) = await _client(url, "shared", [{"message": CUSTOMER_MESSAGE}])
        approve: list[dict[str, Any]] = [
            {"resume": [{"status": "resolved", "payload": {"approved": True}}]}
        ]
        (bob, _) = await _client(url, "shared", approve, key="key-bob", **final["final"])
    _refund_interrupt(first)
    error = bob["events"][-1]
    assert error["type"] == "RUN_ERROR" and error["code"] == "nothing_to_resume"
    assert scenario.desk.refunds == []


async def test_a_cancelled_interrupt_is_a_rejection_and_nothing_is_refunded() -> None:
    scenario = build_scenario()
    async with serving(_app(scenario)) as url:
        steps: list[dict[str, Any]] = [
            {"message": CUSTOMER_MESSAGE},
            {"resume": [{"status": "cancelled"}]},
        ]
        _, second, final = await _client(url, "t-cancel", steps)
    assert second["error"] is None and _types(second)[-1] == "RUN_FINISHED"
    assert scenario.desk.refunds == []
    assert "did not approve" in _reply(second)
    assert final["final"]["pendingInterrupts"] == []


def _asking_app() -> tuple[Starlette, list[str]]:
    """A desk whose tools ask a person (AskPerson) and run in the client."""
    sizes: list[str] = []

    @tool(name="orders.resize")
    def resize(ctx: ToolContext, order_id: str) -> str:
        """Change an order's size."""
        if ctx.answer is None:
            raise AskPerson(f"Which size should {order_id} be?")
        sizes.append(ctx.answer)
        return f"{order_id} is now size {ctx.answer}"

    @tool(name="browser.tab", executor="client")
    def tab(url: str) -> int:
        """Open a page in the user's browser; the client answers with the tab's number."""
        raise NotImplementedError

    model = ScriptedModel(
        [
            call("orders.resize", order_id="A1"),
            "Resized.",
            call("browser.tab", url="https://example.org/track"),
            "Opened.",
        ]
    )
    engine = Engine(
        Agent("desk", tools=[resize, tab]), runtime=Runtime(model=model, ids=sequential_ids())
    )
    return create_app(engine, authenticator=authenticator(), static_dir=None), sizes


CLIENT_TOOLS = [{"name": "browser.tab", "description": "Open a tab", "parameters": {}}]


async def test_a_question_and_a_client_tool_are_answered_through_resume() -> None:
    app, sizes = _asking_app()
    async with serving(app) as url:
        steps: list[dict[str, Any]] = [
            {"message": "Make A1 a medium, please."},
            {"resume": [{"status": "resolved", "payload": {"answer": "M"}}]},
            {"message": "Open the tracking page.", "tools": CLIENT_TOOLS},
            {"resume": [{"status": "resolved", "payload": {"output": 3}}], "tools": CLIENT_TOOLS},
        ]
        asked, answered, opening, opened, final = await _client(url, "t-ask", steps)
    question = _finished_with_one_interrupt(asked)
    assert question["reason"] == "input_required"
    assert question["message"] == "Which size should A1 be?"
    assert question["responseSchema"]["required"] == ["answer"]
    assert answered["error"] is None and _reply(answered) == "Resized."
    assert sizes == ["M"]
    client_call = _finished_with_one_interrupt(opening)
    assert client_call["reason"] == "client_tool"
    assert client_call["metadata"]["handrail"]["args"] == {"url": "https://example.org/track"}
    assert opened["error"] is None and _reply(opened) == "Opened."
    results = [e for e in opened["events"] if e["type"] == "TOOL_CALL_RESULT"]
    assert [json.loads(r["content"])["status"] for r in results] == ["completed"]
    assert final["final"]["pendingInterrupts"] == []


def _finished_with_one_interrupt(step: dict[str, Any]) -> dict[str, Any]:
    assert step["error"] is None
    finished = step["events"][-1]
    assert finished["type"] == "RUN_FINISHED" and finished["outcome"]["type"] == "interrupt"
    (interrupt,) = finished["outcome"]["interrupts"]
    return interrupt  # type: ignore[no-any-return]


async def test_a_provider_run_search_arrives_as_a_tool_call_with_its_result() -> None:
    found = {
        "kind": "web_search",
        "queries": ["handrail agents"],
        "sources": [{"url": "https://example.org/handrail", "title": "Handrail"}],
    }
    model = ScriptedModel(
        [[hosted_call("web_search", found, args={"query": "handrail agents"}, id="srv_1"), "Ok."]]
    )
    engine = Engine(
        Agent("researcher", tools=[web_search()]),
        runtime=Runtime(model=model, ids=sequential_ids()),
    )
    app = create_app(engine, authenticator=authenticator(), static_dir=None)
    async with serving(app) as url:
        (step, _) = await _client(url, "t-search", [{"message": "What is handrail?"}])
    assert step["error"] is None
    (start,) = [e for e in step["events"] if e["type"] == "TOOL_CALL_START"]
    assert (start["toolCallId"], start["toolCallName"]) == ("srv_1", "web_search")
    (result,) = [e for e in step["events"] if e["type"] == "TOOL_CALL_RESULT"]
    content = json.loads(result["content"])
    assert content["executor"] == "provider" and content["summary"] == "searched the web: 1 source"
    assert content["digest"]["sources"] == found["sources"]
    assert _reply(step) == "Ok."


async def test_a_reused_result_says_which_call_it_repeats_and_the_write_after_it_runs() -> None:
    reuse = reuse_app()
    async with serving(reuse.app) as url:
        (step, _) = await _client(url, "t-reuse", [{"message": "Note A1"}])
    assert step["error"] is None
    results = [json.loads(e["content"]) for e in step["events"] if e["type"] == "TOOL_CALL_RESULT"]
    assert [(r["ok"], r["reused_from"]) for r in results] == [
        (True, None),
        (True, "call_1"),
        (True, None),
    ]
    assert reuse.notes == ["A1"] and _reply(step) == "Noted."


async def test_a_failed_call_s_result_carries_its_code_and_a_summary() -> None:
    model = ScriptedModel([[call("orders.delete", order_id="A1")], "I cannot delete orders."])
    engine = Engine(Agent("support", tools=[]), runtime=Runtime(model=model, ids=sequential_ids()))
    app = create_app(engine, authenticator=authenticator(), static_dir=None)
    async with serving(app) as url:
        (step, _) = await _client(url, "t-codes", [{"message": "Delete A1"}])
    assert step["error"] is None
    (result,) = [e for e in step["events"] if e["type"] == "TOOL_CALL_RESULT"]
    content = json.loads(result["content"])
    assert (content["ok"], content["code"]) == (False, "unknown_tool")
    assert content["summary"] == "Unknown tool 'orders.delete'. Available tools: none."


async def test_the_callers_roles_choose_the_tools_the_turn_sees() -> None:
    roles = roles_app()
    async with serving(roles.app) as url:
        (sre, _) = await _client(url, "t-sre", [{"message": "hi"}])
        (support, _) = await _client(url, "t-support", [{"message": "hi"}], key="key-bo")
    assert sre["error"] is None and support["error"] is None
    assert roles.seen == [["hosts.status", "hosts.restart"], ["hosts.status"]]
