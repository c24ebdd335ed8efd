"""Tools per caller: `tools_for` chooses what a turn may see and call; grouped tool menus."""

from __future__ import annotations

import asyncio
from typing import Any

from handrail import (
    Agent,
    Approve,
    Domain,
    Engine,
    RouteDecision,
    RunState,
    Runtime,
    TurnInfo,
    by_role,
    render_tool_menu,
    tool,
)
from handrail.evals import Scenario, Suite, run_suite
from handrail.messages import ToolCallPart
from handrail.models import ModelRequest
from handrail.store import MemoryStore
from handrail.testing import FunctionModel, ScriptedModel, call, sequential_ids

ran: list[str] = []


@tool(name="hosts.status", category="capability")
def status(host: str) -> str:
    """Read a host's status.

    Args:
        host: the host.
    """
    ran.append("status")
    return f"{host} is up"


@tool(name="hosts.restart", permission="write", approval="required", category="system")
def restart(host: str) -> str:
    """Restart a service on a host.

    Args:
        host: the host.
    """
    ran.append("restart")
    return f"restarted {host}"


@tool(name="handoff", category="control", ends_turn=True)
def handoff(note: str) -> str:
    """Hand the conversation to a person."""
    return note


SRE_ONLY = by_role({"sre": ["hosts.status", "hosts.restart"]}, default=["hosts.status"])


def tool_names(request: ModelRequest) -> list[str]:
    return [t.name for t in request.tools]


def calls_of(state: RunState) -> list[ToolCallPart]:
    return [p for m in state.messages for p in m.tool_calls]


def engine_with(model: Any, **domain: Any) -> Engine:
    ran.clear()
    agent = Agent("ops", tools=[status, restart], model=model)
    runtime = Runtime(ids=sequential_ids())
    return Engine(Domain(agents=[agent], **domain), store=MemoryStore(), runtime=runtime)


async def drain(run: Any) -> None:
    async for _ in run:
        pass


def test_two_callers_with_different_roles_see_different_tools() -> None:
    model = FunctionModel(lambda request: "ok")
    engine = engine_with(model, tools_for=SRE_ONLY)

    async def both() -> None:
        await drain(engine.submit("s1", "hi", user_id="ana", roles={"sre"}))
        await drain(engine.submit("s2", "hi", user_id="bo", roles={"support"}))

    asyncio.run(both())
    assert [tool_names(r) for r in model.calls] == [
        ["hosts.status", "hosts.restart"],
        ["hosts.status"],
    ]


def test_a_call_to_a_filtered_tool_is_an_unknown_tool_and_nothing_runs() -> None:
    model = ScriptedModel([call("hosts.restart", host="web1"), "I cannot restart it."])
    engine = engine_with(model, tools_for=SRE_ONLY)

    async def turn() -> RunState:
        await drain(engine.submit("s1", "restart web1", user_id="bo", roles={"support"}))
        return await engine.session("s1", user_id="bo")

    state = asyncio.run(turn())
    (part,) = calls_of(state)
    assert part.status == "failed" and part.result is not None
    assert part.result.code == "unknown_tool"
    assert part.result.error == (  # it names the tools the caller has, never a hidden one
        "Unknown tool 'hosts.restart'. Did you mean 'hosts.status'? Available tools: hosts.status."
    )
    assert ran == [] and not state.pending  # not run, and no card asks anyone to approve it


def test_the_caller_s_roles_are_kept_for_the_turn_s_resumption() -> None:
    model = ScriptedModel([call("hosts.restart", host="web1"), "Restarted."])
    engine = engine_with(model, tools_for=SRE_ONLY)

    async def turn() -> RunState:
        await drain(engine.submit("s1", "restart web1", user_id="ana", roles={"sre"}))
        (card,) = (await engine.session("s1", user_id="ana")).pending
        await engine.resolve("s1", card, Approve(), user_id="ana")
        await drain(engine.resume("s1", user_id="ana"))
        return await engine.session("s1", user_id="ana")

    state = asyncio.run(turn())
    (part,) = calls_of(state)
    assert part.status == "completed" and ran == ["restart"]
    assert state.roles == frozenset({"sre"})


def test_an_agent_s_own_tools_for_applies_to_agent_run() -> None:
    seen: list[TurnInfo] = []

    def only_reads(turn: TurnInfo) -> list[str]:
        seen.append(turn)
        return ["hosts.status"]

    model = FunctionModel(lambda request: "ok")
    agent = Agent("ops", tools=[status, restart], model=model, tools_for=only_reads)
    asyncio.run(agent.run("hi", state=RunState(org_id="acme", user_id="ana")))
    assert tool_names(model.calls[0]) == ["hosts.status"]
    assert seen[0].agent == "ops" and seen[0].org_id == "acme" and seen[0].user_id == "ana"


def test_the_domain_s_and_the_agent_s_choices_both_apply() -> None:
    model = FunctionModel(lambda request: "ok")
    agent = Agent(
        "ops", tools=[status, restart, handoff], model=model, tools_for=lambda t: ["handoff"]
    )
    engine = Engine(Domain(agents=[agent], tools_for=lambda t: ["handoff", "hosts.status"]))
    asyncio.run(drain(engine.submit("s1", "hi")))
    assert tool_names(model.calls[0]) == ["handoff"]


def test_a_captured_run_sees_and_captures_only_the_caller_s_tools() -> None:
    def restart_web1(request: ModelRequest) -> Any:
        done = any(p.name == "hosts.restart" for m in request.messages for p in m.tool_calls)
        return "Done." if done else call("hosts.restart", host="web1")

    model = FunctionModel(restart_web1)
    engine = engine_with(model, tools_for=SRE_ONLY)

    async def both() -> tuple[Any, Any]:
        sre = await engine.run_headless("s1", "restart web1", roles=["sre"])
        support = await engine.run_headless("s2", "restart web1", roles=["support"])
        return sre, support

    sre, support = asyncio.run(both())
    assert [a.tool for a in sre.actions] == ["hosts.restart"]
    assert support.actions == [] and ran == []
    assert tool_names(model.calls[0]) == ["hosts.status", "hosts.restart"]
    assert tool_names(model.calls[2]) == ["hosts.status"]
    failed = [e for e in support.events if e.type == "tool-call-completed"]
    assert [(e.name, e.code) for e in failed] == [("hosts.restart", "unknown_tool")]


def test_the_evals_mock_run_filters_by_the_turn_s_roles() -> None:
    agent = Agent("ops", tools=[status, restart])
    steps = [[{"call": "hosts.restart", "args": {"host": "web1"}}], ["No."]]
    scenario = Scenario.model_validate(
        {
            "name": "support cannot restart",
            "turns": [{"text": "restart web1", "roles": ["support"]}],
            "model": {"scripted": steps},
            "expect": {
                "tool_errors": [{"tool": "hosts.restart", "code": "unknown_tool"}],
                "approvals": [],
            },
        }
    )
    suite = Suite(name="t", domain=Domain(agents=[agent], tools_for=SRE_ONLY), scenarios=[scenario])
    (result,) = asyncio.run(run_suite(suite)).scenarios
    assert result.passed, result.failures


def test_the_supervisor_is_shown_each_route_s_tools_for_the_caller() -> None:
    prompts: list[str] = []

    def supervise(request: ModelRequest) -> str:
        prompts.append(request.instructions or "")
        return '{"route": "ops", "reason": "a host"}'

    supervisor = Agent(
        "supervisor",
        instructions="Pick a route.",
        output_type=RouteDecision,
        model=FunctionModel(supervise),
    )
    ops = Agent("ops", tools=[status, restart], model=ScriptedModel(["ok", "ok"]))
    desk = Agent("desk", tools=[handoff], model=ScriptedModel(["unused"]))
    domain = Domain(
        agents=[ops, desk],
        routes={"ops": ["ops"], "desk": ["desk"]},
        supervisor=supervisor,
        tools_for=SRE_ONLY,
    )
    engine = Engine(domain, store=MemoryStore())

    async def both() -> None:
        await drain(engine.submit("s1", "restart web1", roles={"sre"}))
        await drain(engine.submit("s2", "restart web1", roles={"support"}))

    asyncio.run(both())
    assert prompts[0] == (
        "Pick a route.\n\n"
        "The routes, with the tools each agent can use for this caller:\n"
        "- ops: ops (hosts.status, hosts.restart)\n"
        "- desk: desk (no tools)"
    )
    assert "- ops: ops (hosts.status)\n" in prompts[1]


def test_a_grouped_tool_menu_in_the_instructions() -> None:
    @tool(name="notes.add", category="crm")
    def add_note(text: str) -> str:
        """Add a note."""
        return text

    @tool(name="echo")
    def echo(text: str) -> str:
        """Say it back."""
        return text

    menu = render_tool_menu([add_note, echo, status, restart, handoff])
    assert menu == (
        "Your tools:\n"
        "control:\n"
        "- handoff: Hand the conversation to a person.\n"
        "system:\n"
        "- hosts.restart: Restart a service on a host.\n"
        "capability:\n"
        "- hosts.status: Read a host's status.\n"
        "crm:\n"
        "- notes.add: Add a note.\n"
        "other:\n"
        "- echo: Say it back."
    )
    model = FunctionModel(lambda request: "ok")
    agent = Agent(
        "ops",
        instructions="You run hosts.",
        tools=[status, restart],
        model=model,
        tool_menu=True,
        tools_for=SRE_ONLY,
    )
    asyncio.run(agent.run("hi", state=RunState(roles=frozenset({"support"}))))
    assert model.calls[0].instructions == (
        "You run hosts.\n\nYour tools:\ncapability:\n- hosts.status: Read a host's status."
    )


def test_the_server_passes_the_authenticated_caller_s_roles() -> None:
    import httpx

    from handrail.server import ApiKeyAuthenticator, Caller, create_app

    model = FunctionModel(lambda request: "ok")
    engine = engine_with(model, tools_for=SRE_ONLY)
    keys = ApiKeyAuthenticator(
        {
            "key-ana": Caller("acme", "ana", frozenset({"sre"})),
            "key-bo": Caller("acme", "bo", frozenset({"support"})),
        }
    )
    app = create_app(engine, authenticator=keys, static_dir=None)

    async def turns() -> None:
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for who in ("ana", "bo"):
                headers = {"Authorization": f"Bearer key-{who}", "Accept": "text/event-stream"}
                made = await client.post("/sessions", headers=headers)
                session = made.json()["id"]
                turn = await client.post(
                    f"/sessions/{session}/turns", json={"text": "hi"}, headers=headers
                )
                assert turn.status_code == 200, turn.text

    asyncio.run(turns())
    assert [tool_names(r) for r in model.calls] == [
        ["hosts.status", "hosts.restart"],
        ["hosts.status"],
    ]


def test_a_tools_for_that_returns_one_name_as_a_string_is_refused() -> None:
    agent = Agent("ops", tools=[status], model=ScriptedModel(["ok"]), tools_for=lambda t: "x")
    result = asyncio.run(agent.run("hi"))
    assert result.outcome == "failed"
    assert "tools_for returned the string 'x'" in (result.error or "")


def test_the_page_the_user_is_on_chooses_the_tools_through_the_turn_s_context() -> None:
    def on_page(turn: TurnInfo) -> list[str]:
        page = (turn.context or {}).get("page")
        return ["hosts.status", "hosts.restart"] if page == "hosts" else ["hosts.status"]

    model = FunctionModel(lambda request: "ok")
    engine = engine_with(model, tools_for=on_page)

    async def both() -> None:
        await drain(engine.submit("s1", "hi", context={"page": "hosts"}))
        await drain(engine.submit("s2", "hi", context={"page": "billing"}))
        await drain(engine.submit("s3", "hi"))

    asyncio.run(both())
    assert [tool_names(r) for r in model.calls] == [
        ["hosts.status", "hosts.restart"],
        ["hosts.status"],
        ["hosts.status"],
    ]
