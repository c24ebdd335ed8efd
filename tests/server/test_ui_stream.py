"""The AI SDK's UI message stream (`POST /chat`), driven by the `ai` package's own chat (Node).

The Node script (ui_stream_client.mjs) is an `AbstractChat` over `DefaultChatTransport`, as
`useChat` is, against a real uvicorn; the Python-level tests at the end cover bad bodies.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from starlette.applications import Starlette

from handrail import Agent, Engine, Runtime, tool
from handrail.demo.support_desk import CUSTOMER_MESSAGE, Scenario, build_scenario
from handrail.server import Limits, create_app
from handrail.server._auth import Caller
from handrail.server._ui_stream import chat_session
from handrail.store import MemoryStore
from handrail.store.sqlite import SqliteStore
from handrail.testing import ScriptedModel, call, hosted_call, sequential_ids
from handrail.tools import web_search

from .conftest import ANA, BOB, StreamingTransport, authenticator, reuse_app, roles_app
from .test_limits import Clock
from .test_uvicorn import serving

NODE = shutil.which("node")
JS = Path(__file__).resolve().parents[2] / "js" / "node_modules"
CLIENT = Path(__file__).with_name("ui_stream_client.mjs")

node = pytest.mark.skipif(
    NODE is None or not (JS / "ai").is_dir(),
    reason="AI SDK NODE TESTS SKIPPED: `node` or js/node_modules/ai is missing "
    "(install Node 20 and the js/ packages, npm ci --prefix js, to run them).",
)

ANA_CALLER = Caller(org_id="acme", user_id="ana")


def _app(engine: Engine) -> Starlette:
    return create_app(engine, authenticator=authenticator(), static_dir=None)


async def _chat(url: str, chat: str, steps: list[dict[str, Any]], **more: Any) -> list[Any]:
    spec: dict[str, Any] = {
        "url": url,
        "key": "key-ana",
        "chatId": chat,
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
    return [c["type"] for c in step["chunks"]]


def _text(step: dict[str, Any]) -> str:
    return "".join(p["text"] for p in step["message"]["parts"] if p["type"] == "text")


def _tool(step: dict[str, Any], name: str) -> dict[str, Any]:
    (part,) = [p for p in step["message"]["parts"] if p["type"] == f"tool-{name}"]
    return part  # type: ignore[no-any-return]


def _card(step: dict[str, Any], call_id: str) -> dict[str, Any]:
    (part,) = [
        p
        for p in step["message"]["parts"]
        if p["type"] == "data-handrail-card" and p["id"] == call_id
    ]
    return part["data"]  # type: ignore[no-any-return]


def _refunds(scenario: Scenario) -> list[str]:
    return [r["amount"] for r in scenario.desk.refunds]


@node
async def test_a_plain_answer_streams_as_one_assistant_message() -> None:
    scenario = build_scenario()
    async with serving(_app(scenario.engine)) as url:
        (step, final) = await _chat(url, "c-plain", [{"message": "Where is my order A1042?"}])
    assert step["error"] is None and step["status"] == "ready"
    types = _types(step)
    assert types[0] == "start" and types[-1] == "finish"
    assert step["chunks"][-1]["finishReason"] == "stop"
    assert {"start-step", "finish-step", "text-start", "text-delta", "text-end"} <= set(types)
    assert {"reasoning-start", "reasoning-delta", "reasoning-end"} <= set(types)  # supervisor
    assert _text(step) == "Your order A1042 (€84.00) was delivered on 18 November. Anything else?"
    lookup = _tool(step, "orders.lookup")
    assert lookup["state"] == "output-available" and lookup["input"] == {"order_id": "A1042"}
    assert [m["role"] for m in final["final"]["messages"]] == ["user", "assistant"]
    usage = [p for p in step["message"]["parts"] if p["type"] == "data-handrail-usage"]
    assert [u["data"] for u in usage] == [{"inputTokens": 0, "outputTokens": 0, "cachedTokens": 0}]


@node
async def test_a_refund_asks_for_approval_and_runs_with_the_amended_amount() -> None:
    scenario = build_scenario()
    async with serving(_app(scenario.engine)) as url:
        steps: list[dict[str, Any]] = [
            {"message": CUSTOMER_MESSAGE},
            {"approve": True, "edits": {"amount": 40}, "auto": True},  # sent by the chat
        ]
        first, second, final = await _chat(url, "c-approve", steps)
    assert first["error"] is None
    refund = _tool(first, "orders.refund")
    assert refund["state"] == "approval-requested"
    assert refund["approval"] == {"id": refund["toolCallId"]}
    assert refund["input"] == {"order_id": "A1042", "amount": 84.0, "reason": "damaged on arrival"}
    card = _card(first, refund["toolCallId"])
    assert card["kind"] == "approval" and card["amendable"] == ["amount"]
    assert first["chunks"][-1] == {
        "type": "finish",
        "finishReason": "tool-calls",
        "messageMetadata": {"handrail": {"status": "suspended", "pending": [refund["toolCallId"]]}},
    }
    assert second["error"] is None
    assert second["message"]["id"] == first["message"]["id"]  # the same message goes on
    ran = _tool(second, "orders.refund")
    assert ran["state"] == "output-available"
    # The part shows the arguments that ran, and the card their digest (not the proposal's).
    amended = {"order_id": "A1042", "amount": 40.0, "reason": "damaged on arrival"}
    assert ran["input"] == amended
    assert _card(second, ran["toolCallId"])["args"] == amended
    assert _card(second, ran["toolCallId"])["digest"] != card["digest"]
    assert _types(second).count("tool-input-available") == 1
    assert _refunds(scenario) == ["€40.00"]
    assert "40" in _text(second)
    (_, assistant) = final["final"]["messages"]
    (part,) = [p for p in assistant["parts"] if p["type"] == "tool-orders.refund"]
    assert part["input"] == amended  # one part, updated in place
    assert [m["role"] for m in final["final"]["messages"]] == ["user", "assistant"]


@node
async def test_a_rejection_is_denied_without_running_and_the_chat_goes_on() -> None:
    scenario = build_scenario()
    async with serving(_app(scenario.engine)) as url:
        steps: list[dict[str, Any]] = [
            {"message": CUSTOMER_MESSAGE},
            {"approve": False, "reason": "not this one"},
            {"message": "Thanks. Where is my order A1042?"},
        ]
        _, second, third, final = await _chat(url, "c-reject", steps)
    assert second["error"] is None
    assert "tool-output-denied" in _types(second)
    assert _tool(second, "orders.refund")["state"] == "output-denied"
    assert _refunds(scenario) == []
    assert "did not approve" in _text(second)
    # Only the message the session had not seen starts the next turn.
    assert third["error"] is None
    assert _text(third) == "Your order A1042 (€84.00) was delivered on 18 November. Anything else?"
    assert [m["role"] for m in final["final"]["messages"]] == ["user", "assistant"] * 2


@node
async def test_an_edit_of_a_field_that_is_not_amendable_is_an_error_and_nothing_is_decided() -> (
    None
):
    scenario = build_scenario()
    async with serving(_app(scenario.engine)) as url:
        steps: list[dict[str, Any]] = [
            {"message": CUSTOMER_MESSAGE},
            {"approve": True, "edits": {"order_id": "B2001"}},
        ]
        first, second, final = await _chat(url, "c-refused", steps)
        state = await scenario.engine.session(
            chat_session(ANA_CALLER, "c-refused"), org_id="acme", user_id="ana"
        )
        # As docs/ai-sdk.md says: the same part, sent again with an edit it allows.
        retry: list[dict[str, Any]] = [{"retry": True, "edits": {"amount": 40}}]
        (retried, _) = await _chat(url, "c-refused", retry, **final["final"])
    call_id = _tool(first, "orders.refund")["toolCallId"]
    assert second["status"] == "error"
    assert second["error"].startswith("not_amendable: ")
    assert "order_id cannot be amended (amendable: amount); nothing was decided" in second["error"]
    assert _types(second) == ["error"]
    assert list(state.pending) == [call_id]  # still waiting: never a silent denial
    assert _tool(second, "orders.refund")["state"] == "approval-responded"
    assert retried["error"] is None and retried["status"] == "ready"
    assert _tool(retried, "orders.refund")["state"] == "output-available"
    assert _tool(retried, "orders.refund")["input"]["amount"] == 40
    assert _refunds(scenario) == ["€40.00"]


@node
async def test_a_second_answer_to_a_decided_call_is_an_error_not_a_second_refund() -> None:
    scenario = build_scenario()
    async with serving(_app(scenario.engine)) as url:
        (_, final) = await _chat(url, "c-twice", [{"message": CUSTOMER_MESSAGE}])
        approve: list[dict[str, Any]] = [{"approve": True}]
        (second, _) = await _chat(url, "c-twice", approve, **final["final"])
        (again, _) = await _chat(url, "c-twice", approve, **final["final"])  # the same answer
    assert second["error"] is None and _refunds(scenario) == ["€84.00"]
    assert again["status"] == "error" and again["error"].startswith("not_pending: ")
    assert _refunds(scenario) == ["€84.00"]


@node
async def test_reconnecting_replays_the_suspended_turn_and_it_can_be_approved() -> None:
    scenario = build_scenario()
    async with serving(_app(scenario.engine)) as url:
        (first, final) = await _chat(url, "c-reconnect", [{"message": CUSTOMER_MESSAGE}])
        # A reloaded page: the user's message was kept, the assistant's was not.
        (user, _) = final["final"]["messages"]
        steps: list[dict[str, Any]] = [{"resume": True}, {"approve": True, "edits": {"amount": 40}}]
        replayed, approved, _ = await _chat(url, "c-reconnect", steps, messages=[user])
        # Nothing runs or waits now: 204, and the chat is left as it is.
        (nothing, after) = await _chat(url, "c-reconnect", [{"resume": True}], messages=[user])
    assert replayed["error"] is None
    assert replayed["message"]["id"] == first["message"]["id"]
    assert replayed["message"]["parts"] == first["message"]["parts"]
    assert approved["error"] is None and _refunds(scenario) == ["€40.00"]
    assert nothing["error"] is None and nothing["chunks"] == []
    assert after["final"]["messages"] == [user]


@node
async def test_a_chat_suspended_on_one_server_is_approved_on_a_restarted_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sessions.db"
    scenario = build_scenario(store=SqliteStore(path))
    async with serving(_app(scenario.engine)) as url:
        (first, final) = await _chat(url, "c-restart", [{"message": CUSTOMER_MESSAGE}])
    assert _tool(first, "orders.refund")["state"] == "approval-requested"
    restarted = build_scenario(store=SqliteStore(path))  # a new process: the same store only
    async with serving(_app(restarted.engine)) as url:
        steps: list[dict[str, Any]] = [{"approve": True, "edits": {"amount": 40}}]
        (second, _) = await _chat(url, "c-restart", steps, **final["final"])
    assert second["error"] is None
    assert _tool(second, "orders.refund")["state"] == "output-available"
    assert _refunds(restarted) == ["€40.00"] and _refunds(scenario) == []


@node
async def test_another_tenant_with_the_same_chat_id_gets_another_chat() -> None:
    scenario = build_scenario()
    async with serving(_app(scenario.engine)) as url:
        (first, final) = await _chat(url, "shared", [{"message": CUSTOMER_MESSAGE}])
        approve: list[dict[str, Any]] = [{"approve": True}]
        (bob, _) = await _chat(url, "shared", approve, key="key-bob", **final["final"])
        (user, _) = final["final"]["messages"]
        (bob_resume, _) = await _chat(
            url, "shared", [{"resume": True}], key="key-bob", messages=[user]
        )
    assert bob["status"] == "error" and bob["error"].startswith("not_pending: ")
    assert bob_resume["chunks"] == []  # 204: bob's chat "shared" has no turn
    assert _refunds(scenario) == []
    state = await scenario.engine.session(
        chat_session(ANA_CALLER, "shared"), org_id="acme", user_id="ana"
    )
    assert list(state.pending) == [_tool(first, "orders.refund")["toolCallId"]]


class Opened(BaseModel):
    tab: int


class Size(BaseModel):
    size: str


@tool(name="browser.open_tab", executor="client")
def open_tab(url: str) -> Opened:
    """Open a tab in the user's browser."""
    raise AssertionError("a client tool never runs on the server")


@tool(name="ask.size", executor="human", prompt="Which size?")
def ask_size(question: str) -> Size:
    """Ask the customer for a size."""
    raise AssertionError("a human tool never runs on the server")


def _browser_engine() -> tuple[Engine, ScriptedModel]:
    model = ScriptedModel(
        [
            [call("browser.open_tab", url="https://shop.example/a1042")],
            [call("ask.size", question="Which size would you like?")],
            "Opened tab 3; size M it is.",
        ]
    )
    agent = Agent("shop", tools=[open_tab, ask_size])
    runtime = Runtime(model=model, ids=sequential_ids())
    return Engine(agent, store=MemoryStore(), runtime=runtime), model


@node
async def test_a_client_tool_and_a_question_are_answered_with_add_tool_output() -> None:
    engine, _ = _browser_engine()
    async with serving(_app(engine)) as url:
        steps: list[dict[str, Any]] = [
            {"message": "Show me the order page."},
            {"output": {"tab": 3}},
            {"output": {"size": "M"}},
        ]
        first, second, third, _ = await _chat(
            url, "c-client", steps, handrail={"clientTools": True}
        )
    opened = _tool(first, "browser.open_tab")
    assert opened["state"] == "input-available"
    assert opened["input"] == {"url": "https://shop.example/a1042"}
    assert _card(first, opened["toolCallId"])["kind"] == "client_exec"
    assert second["error"] is None
    asked = _tool(second, "ask.size")
    assert asked["state"] == "input-available"
    assert _card(second, asked["toolCallId"]) == {
        "toolCallId": asked["toolCallId"],
        "tool": "ask.size",
        "kind": "input",
        "prompt": "Which size?",
        "args": {"question": "Which size would you like?"},
        "outputSchema": Size.model_json_schema(),
    }
    assert third["error"] is None and _text(third) == "Opened tab 3; size M it is."
    state = await engine.session(chat_session(ANA_CALLER, "c-client"), org_id="acme", user_id="ana")
    results = {p.name: p.result for m in state.messages for p in m.tool_calls}
    assert results["browser.open_tab"] is not None and results["browser.open_tab"].data == {
        "tab": 3
    }
    assert results["ask.size"] is not None and results["ask.size"].data == {"size": "M"}


# -- Python-level: bad requests answer the server's error shape, never a 500 -----------------


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"id": "c", "messages": []}, 422),
        ({"id": "", "messages": [{"id": "u", "role": "user", "parts": []}]}, 422),
        ({"id": "c\u0000", "messages": [{"id": "u", "role": "user", "parts": []}]}, 422),
        ({"id": "c", "messages": [{"id": "u", "role": "robot", "parts": []}]}, 422),
        ({"id": "c", "messages": "hi"}, 422),
        ({"id": "c", "messages": [{"id": "u", "role": "user"}], "handrail": {"x": 1}}, 422),
    ],
)
async def test_a_bad_body_is_refused_with_the_error_shape(body: Any, status: int) -> None:
    app = _app(build_scenario().engine)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            response = await client.post("/chat", json=body, headers=ANA)
            unauthenticated = await client.post("/chat", json=body)
    assert response.status_code == status
    assert response.json()["error"]["type"] == "invalid_request"
    assert unauthenticated.status_code == 401


async def test_a_request_that_cannot_be_acted_on_is_an_error_chunk() -> None:
    app = _app(build_scenario().engine)
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
    assistant = {"id": "a1", "role": "assistant", "parts": []}
    cases = {
        "empty_message": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": " "}]}],
        "no_new_message": [
            user,
            {**assistant, "parts": [{"type": "tool-x", "toolCallId": "c", "state": {"x": 1}}]},
        ],
        "not_pending": [
            user,
            {
                "id": "a1",
                "role": "assistant",
                "parts": [
                    {
                        "type": "tool-orders.refund",
                        "toolCallId": "call_9",
                        "state": "approval-responded",
                        "input": {},
                        "approval": {"id": "call_9", "approved": True},
                    }
                ],
            },
        ],
    }
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for code, messages in cases.items():
                body = {"id": f"c-{code}", "messages": messages}
                response = await client.post("/chat", json=body, headers=ANA)
                assert response.status_code == 200
                assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
                (chunk, done) = response.text.strip().split("\n\n")
                assert json.loads(chunk.removeprefix("data: "))["errorText"].startswith(f"{code}: ")
                assert done == "data: [DONE]"
            regenerate = {"id": "c-r", "messages": [user], "trigger": "regenerate-message"}
            response = await client.post("/chat", json=regenerate, headers=ANA)
            assert "regenerate_unsupported: " in response.text
            nothing = await client.get("/chat/c-none/stream", headers=ANA)
            assert nothing.status_code == 204
            bad = await client.get("/chat/%01/stream", headers=ANA)
            assert bad.status_code == 422 and bad.json()["error"]["type"] == "invalid_request"
    assert app.state.runs._tasks == {}


async def test_edits_of_a_call_that_is_rejected_are_refused_and_nothing_is_decided() -> None:
    scenario = build_scenario()
    app = _app(scenario.engine)
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": CUSTOMER_MESSAGE}]}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            first = await client.post("/chat", json={"id": "c", "messages": [user]}, headers=ANA)
            chunks = [json.loads(f[6:]) for f in first.text.split("\n\n") if f[6:7] == "{"]
            (request,) = [c for c in chunks if c["type"] == "tool-approval-request"]
            call_id = request["toolCallId"]
            part = {
                "type": "tool-orders.refund",
                "toolCallId": call_id,
                "state": "approval-responded",
                "input": {},
                "approval": {"id": call_id, "approved": False},
            }
            assistant = {"id": "turn-1", "role": "assistant", "parts": [part]}
            args = {"order_id": "A1042", "amount": 40, "reason": "damaged on arrival"}
            body = {
                "id": "c",
                "messages": [user, assistant],
                "handrail": {"edits": {call_id: args, "call_0": {"amount": 1}}},
            }
            refused = await client.post("/chat", json=body, headers=ANA)
            del body["handrail"]["edits"][call_id]  # a leftover edit of another call remains
            rejected = await client.post("/chat", json=body, headers=ANA)
    assert f"invalid_payload: handrail.edits amends {call_id}, which this" in refused.text
    assert '"tool-output-denied"' in rejected.text and _refunds(scenario) == []
    state = await scenario.engine.session(
        chat_session(ANA_CALLER, "c"), org_id="acme", user_id="ana"
    )
    assert state.pending == {}


async def test_reconnecting_to_a_resumed_turn_replays_it_through_its_suspension() -> None:
    gate = asyncio.Event()

    @tool(name="shop.pay", approval="required", amendable=["amount"])
    async def pay(amount: float) -> dict[str, float]:
        """Pay, once approved (it waits for the test's go)."""
        await gate.wait()
        return {"paid": amount}

    model = ScriptedModel([[call("shop.pay", amount=5)], "Paid."])
    engine = Engine(
        Agent("shop", tools=[pay]),
        store=MemoryStore(),
        runtime=Runtime(model=model, ids=sequential_ids()),
    )
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Pay it."}]}

    def chunks(text: str) -> list[dict[str, Any]]:
        return [json.loads(f[6:]) for f in text.split("\n\n") if f.startswith("data: {")]

    async with (
        serving(_app(engine)) as url,
        httpx.AsyncClient(base_url=url, headers=ANA, timeout=30) as client,
    ):
        first = chunks((await client.post("/chat", json={"id": "c", "messages": [user]})).text)
        (request,) = [c for c in first if c["type"] == "tool-approval-request"]
        part = {
            "type": "tool-shop.pay",
            "toolCallId": request["toolCallId"],
            "state": "approval-responded",
            "input": {"amount": 5},
            "approval": {"id": request["approvalId"], "approved": True},
        }
        assistant = {"id": "turn-1", "role": "assistant", "parts": [part]}
        edits = {request["toolCallId"]: {"amount": 7}}  # approved with an amendment
        body = {"id": "c", "messages": [user, assistant], "handrail": {"edits": edits}}
        async with client.stream("POST", "/chat", json=body) as approved:
            lines = approved.aiter_lines()
            assert json.loads((await anext(lines))[6:]) == {"type": "start", "messageId": "turn-1"}
            # The payment waits for the gate: the turn runs, resumed, while the client reconnects.
            async with client.stream("GET", "/chat/c/stream") as replay:
                assert replay.status_code == 200
                assert replay.headers["x-vercel-ai-ui-message-stream"] == "v1"
                gate.set()
                await replay.aread()
            replayed = chunks(replay.text)
            rest = [line async for line in lines]
        after = await client.get("/chat/c/stream")
    assert replayed[0] == {"type": "start", "messageId": "turn-1"}
    types = [c["type"] for c in replayed]
    assert types.index("tool-approval-request") < types.index("tool-output-available")
    assert replayed[-1]["type"] == "finish" and replayed[-1]["finishReason"] == "stop"
    finishes = [c["finishReason"] for c in replayed if c["type"] == "finish"]
    assert finishes == ["tool-calls", "stop"]  # the suspension, then the resumed turn's end
    resumed = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
    assert resumed[-1]["type"] == "finish"
    assert "tool-input-start" not in [c["type"] for c in resumed]  # the client holds the call
    assert after.status_code == 204  # the turn ended: nothing to resume
    # Both streams say the amended input ran: the replay announced 5, then updates it to 7.
    for stream in (replayed, resumed):
        inputs = [c["input"] for c in stream if c["type"] == "tool-input-available"]
        assert inputs[-1] == {"amount": 7}
        cards = [c["data"] for c in stream if c["type"] == "data-handrail-card"]
        assert cards == [] or cards[-1]["args"] == {"amount": 7}
    assert [c["input"] for c in replayed if c["type"] == "tool-input-available"] == [
        {"amount": 5},
        {"amount": 7},
    ]
    opened = [c["type"] for c in replayed[types.index("tool-approval-request") :]]
    assert "start-step" not in opened[: opened.index("tool-output-available")]


async def test_chat_streams_count_against_the_organisations_stream_bandwidth() -> None:
    clock = Clock()  # stands still until the test lets time pass: the debt stays until then
    limits = Limits(stream_bytes=1_000, stream_burst=1_000, clock=clock)
    app = create_app(
        build_scenario().engine,
        authenticator=authenticator(),
        static_dir=None,
        limits=limits,
        ping_interval=0.02,  # a waiting stream looks at the clock again this often
    )
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": CUSTOMER_MESSAGE}]}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=StreamingTransport(app), base_url="http://t") as client,
    ):
        body = {"id": "c", "messages": [user]}
        async with client.stream("POST", "/chat", json=body, headers=ANA) as first:
            received, chunks = 0, first.aiter_bytes()
            async for data in chunks:
                received += len(data)
                if received > 1_000:  # past the organisation's bandwidth
                    break
            again = await client.post("/chat", json={"id": "d", "messages": [user]}, headers=ANA)
            replay = await client.get("/chat/c/stream", headers=ANA)
            bob_body = {"id": "c", "messages": [user]}
            async with client.stream("POST", "/chat", json=bob_body, headers=BOB) as bob:
                pass  # its answer begins (200); its stream is left, as time stands still
            clock.step = 3_600.0  # an hour passes at each look: the debt is paid
            rest = b"".join([data async for data in chunks])
    for refused in (again, replay):
        assert refused.status_code == 429 and "bytes a second" in refused.text
    assert bob.status_code == 200  # another organisation's bandwidth is its own
    assert rest.endswith(b"data: [DONE]\n\n")


def _searching_engine() -> Engine:
    search = web_search(max_uses=2)
    found = {
        "kind": "web_search",
        "queries": ["handrail agents"],
        "sources": [
            {"url": "https://example.org/handrail", "title": "Handrail <docs>"},
            {"url": "javascript:alert(1)", "title": "not a page"},
            {"url": "https://example.org/handrail", "title": "the same page again"},
        ],
    }
    model = ScriptedModel(
        [
            [
                hosted_call("web_search", found, args={"query": "handrail agents"}, id="srv_1"),
                "handrail is an engine for agents that act.",
            ]
        ]
    )
    runtime = Runtime(model=model, ids=sequential_ids())
    return Engine(Agent("researcher", tools=[search]), runtime=runtime)


@node
async def test_a_provider_run_search_is_a_provider_executed_tool_part_with_its_sources() -> None:
    async with serving(_app(_searching_engine())) as url:
        (step, _final) = await _chat(url, "c-search", [{"message": "What is handrail?"}])
    assert step["error"] is None
    search = _tool(step, "web_search")
    assert search["providerExecuted"] is True and search["state"] == "output-available"
    assert search["input"] == {"query": "handrail agents"}
    assert search["output"]["summary"] == "searched the web: 3 sources"
    sources = [p for p in step["message"]["parts"] if p["type"] == "source-url"]
    # only http(s) pages, each once, as useChat lists a message's sources
    assert [(s["url"], s["title"]) for s in sources] == [
        ("https://example.org/handrail", "Handrail <docs>")
    ]
    assert _text(step) == "handrail is an engine for agents that act."


@node
async def test_a_reused_result_names_the_call_it_repeats_and_the_write_after_it_runs() -> None:
    reuse = reuse_app()
    async with serving(reuse.app) as url:
        (step, _final) = await _chat(url, "c-reuse", [{"message": "Note A1"}])
    assert step["error"] is None
    outputs = [
        (p["type"], p["state"], p["output"].get("reused_from"))
        for p in step["message"]["parts"]
        if p["type"].startswith("tool-")
    ]
    assert outputs == [
        ("tool-orders.get", "output-available", None),
        ("tool-orders.get", "output-available", "call_1"),
        ("tool-orders.note", "output-available", None),
    ]
    assert reuse.notes == ["A1"] and _text(step) == "Noted."


@node
async def test_a_failed_call_is_an_output_error_part_that_keeps_its_code() -> None:
    model = ScriptedModel([[call("orders.lookup", order="A1")], "Which order?"])
    engine = Engine(
        Agent("support", tools=[lookup_order]), runtime=Runtime(model=model, ids=sequential_ids())
    )
    async with serving(_app(engine)) as url:
        (step, _final) = await _chat(url, "c-codes", [{"message": "Where is it?"}])
    assert step["error"] is None
    part = _tool(step, "orders.lookup")
    assert part["state"] == "output-error"
    assert part["toolMetadata"] == {"code": "invalid_arguments"}
    assert part["errorText"].startswith("Tool 'orders.lookup'")


@tool(name="orders.lookup")
def lookup_order(order_id: str) -> str:
    """Look an order up."""
    return f"{order_id}: shipped"


@node
async def test_the_callers_roles_choose_the_tools_the_turn_sees() -> None:
    roles = roles_app()
    async with serving(roles.app) as url:
        (sre, _) = await _chat(url, "c-sre", [{"message": "hi"}])
        (support, _) = await _chat(url, "c-support", [{"message": "hi"}], key="key-bo")
    assert sre["error"] is None and support["error"] is None
    assert _text(sre) == _text(support) == "ok"
    assert roles.seen == [["hosts.status", "hosts.restart"], ["hosts.status"]]
