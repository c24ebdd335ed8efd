"""OpenTelemetry spans, checked with the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind

from handrail import Agent, Approve, Domain, Engine, Reject, RouteDecision, Runtime, tool
from handrail.models import Model, ModelChunk, ModelRequest, Usage
from handrail.state import RunState
from handrail.testing import ScriptedModel, call, sequential_ids
from handrail.tracing import Tracing


@tool(name="orders.lookup")
def lookup(order_id: str) -> dict[str, str]:
    """Look an order up."""
    return {"id": order_id}


@tool(name="orders.refund", permission="write")
def refund(order_id: str) -> str:
    """Refund an order."""
    return "ok"


def traced(
    steps: list[Any], *, model: Model | None = None, capture_content: bool = False
) -> tuple[Engine, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    domain = Domain(
        agents=[Agent("executor", tools=[lookup, refund]), Agent("responder")],
        routes={"search": ["executor", "responder"]},
        supervisor=Agent("supervisor", output_type=RouteDecision),
    )
    runtime = Runtime(
        model=model or ScriptedModel(steps),
        ids=sequential_ids(),
        tracing=Tracing(provider, capture_content=capture_content),
    )
    return Engine(domain, runtime=runtime), exporter


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


class OpenAINamed:
    """A model of one's own named `provider:model`, answering as a scripted model."""

    name = "openai:gpt-4o-mini"

    def __init__(self, steps: list[Any]) -> None:
        self._inner = ScriptedModel(steps)

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        return self._inner.stream(request)


async def test_a_turn_is_a_tree_of_spans_with_genai_attributes():
    engine, exporter = traced(
        [
            json.dumps({"route": "search"}),
            [call("orders.lookup", order_id="A1"), call("orders.refund", order_id="A1")],
        ]
    )
    events = [e async for e in engine.submit("s1", "refund A1")]
    assert events[-1].type == "run-suspended"
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {
        "handrail.turn",
        "handrail.route",
        "handrail.suspension",
        "invoke_agent supervisor",
        "invoke_agent executor",
        "chat scripted",
        "execute_tool orders.lookup",
    }
    turn = spans["handrail.turn"]
    assert turn.parent is None
    assert turn.attributes["handrail.outcome"] == "suspended"  # type: ignore[index]
    for child in ("handrail.route", "invoke_agent executor", "handrail.suspension"):
        assert spans[child].parent.span_id == turn.context.span_id  # type: ignore[union-attr]
    tool_span = spans["execute_tool orders.lookup"]
    executor = spans["invoke_agent executor"]
    assert tool_span.parent.span_id == executor.context.span_id  # type: ignore[union-attr]
    assert tool_span.attributes["gen_ai.tool.call.id"] == "call_1"  # type: ignore[index]
    assert tool_span.attributes["handrail.tool.status"] == "completed"  # type: ignore[index]
    assert spans["handrail.route"].attributes["handrail.route"] == "search"  # type: ignore[index]
    assert list(spans["handrail.suspension"].attributes["handrail.pending"]) == ["call_2"]  # type: ignore[index]
    chats = [s for s in exporter.get_finished_spans() if s.name == "chat scripted"]
    assert len(chats) == 2 and all(s.attributes["gen_ai.operation.name"] == "chat" for s in chats)  # type: ignore[index]


async def test_a_failed_tool_and_a_failed_turn_are_marked_as_errors():
    engine, exporter = traced([json.dumps({"route": "search"}), [call("orders.lookup")]])
    events = [e async for e in engine.submit("s1", "go")]
    assert events[-1].type == "run-failed"  # the script ran out
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert not spans["handrail.turn"].status.is_ok
    assert "ran out of steps" in (spans["handrail.turn"].status.description or "")
    assert not spans["chat scripted"].status.is_ok


async def test_without_tracing_there_are_no_spans_and_no_cost():
    runtime = Runtime(model=ScriptedModel(["Hi."]))
    assert runtime.tracing is None
    events = [e async for e in Engine(Agent("a"), runtime=runtime).submit("s1", "hello")]
    assert events[-1].type == "run-completed"


async def test_model_spans_name_the_provider_and_the_model_without_its_prefix():
    engine, exporter = traced([], model=OpenAINamed([json.dumps({"route": "search"}), "Hi."]))
    [e async for e in engine.submit("s1", "hello")]
    spans = [s for s in exporter.get_finished_spans() if s.name.startswith(("chat", "invoke"))]
    assert {s.name for s in spans} == {
        "chat openai:gpt-4o-mini",
        "invoke_agent supervisor",
        "invoke_agent executor",
        "invoke_agent responder",
    }
    for span in spans:
        assert attrs(span)["gen_ai.provider.name"] == "openai"
        assert attrs(span)["gen_ai.request.model"] == "gpt-4o-mini"
        assert attrs(span)["gen_ai.conversation.id"] == "s1"


def test_provider_and_model_come_from_the_model_itself_when_it_says():
    tracing = Tracing(TracerProvider())

    class Compatible(OpenAINamed):  # e.g. OpenAIModel("llama3", provider="groq")
        provider = "groq"
        model_name = "llama-3.3-70b"
        name = "groq:llama-3.3-70b"

    class Unnamed(OpenAINamed):
        name = "house-model"

    assert tracing.model_attributes(Compatible([]), None) == {
        "gen_ai.provider.name": "groq",
        "gen_ai.request.model": "llama-3.3-70b",
    }
    assert tracing.model_attributes(Unnamed([]), "s9") == {
        "gen_ai.provider.name": "_OTHER",
        "gen_ai.request.model": "house-model",
        "gen_ai.conversation.id": "s9",
    }
    from handrail.models import OpenAIResponsesModel

    responses = OpenAIResponsesModel("gpt-5", api_key="unused")  # the Responses API is OpenAI's
    assert tracing.model_attributes(responses, None) == {
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-5",
    }
    scripted = ScriptedModel([], name="openai:gpt-4o")  # a test double, whatever its name
    assert tracing.model_attributes(scripted, None)["gen_ai.provider.name"] == "handrail.testing"


async def test_span_kinds_conversation_usage_and_tool_attributes():
    script = ScriptedModel(
        [json.dumps({"route": "search"}), [call("orders.lookup", order_id="A1")], "Done.", "Ok."]
    )
    usage = Usage(
        requests=1, input_tokens=120, output_tokens=7, cached_tokens=100, reasoning_tokens=5
    )
    original = script.stream

    async def with_usage(request: ModelRequest) -> AsyncIterator[ModelChunk]:
        async for chunk in original(request):
            if hasattr(chunk, "usage"):
                chunk.usage = usage  # type: ignore[union-attr]
            yield chunk

    script.stream = with_usage  # type: ignore[method-assign]
    engine, exporter = traced([], model=script)
    events = [e async for e in engine.submit("s1", "look A1")]
    assert events[-1].type == "run-completed"
    spans = exporter.get_finished_spans()
    chats = [s for s in spans if s.name == "chat scripted"]
    assert len(chats) == 4 and all(s.kind is SpanKind.CLIENT for s in chats)
    assert all(s.kind is SpanKind.INTERNAL for s in spans if s not in chats)
    assert attrs(chats[0]) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "handrail.testing",
        "gen_ai.request.model": "scripted",
        "gen_ai.conversation.id": "s1",
        "gen_ai.usage.input_tokens": 120,
        "gen_ai.usage.output_tokens": 7,
        "gen_ai.usage.cache_read.input_tokens": 100,
        "gen_ai.usage.reasoning.output_tokens": 5,
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.response.model": "scripted",
    }
    named = by_name(exporter)
    assert attrs(named["handrail.turn"])["gen_ai.conversation.id"] == "s1"
    assert attrs(named["execute_tool orders.lookup"]) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "orders.lookup",
        "gen_ai.tool.call.id": "call_1",
        "gen_ai.tool.description": "Look an order up.",
        "gen_ai.tool.type": "function",
        "gen_ai.conversation.id": "s1",
        "handrail.tool.status": "completed",
    }


async def test_failures_carry_an_error_type():
    @tool(name="orders.lookup")
    def broken(order_id: str) -> str:
        """Look an order up."""
        raise LookupError("no such order")

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    runtime = Runtime(
        model=ScriptedModel([[call("orders.lookup", order_id="A1")]]),
        ids=sequential_ids(),
        tracing=Tracing(provider),
    )
    engine = Engine(Agent("a", tools=[broken]), runtime=runtime)
    events = [e async for e in engine.submit("s1", "go")]
    assert events[-1].type == "run-failed"  # the script ran out after the tool call
    spans = by_name(exporter)
    tool_span = spans["execute_tool orders.lookup"]
    assert attrs(tool_span)["error.type"] == "tool_error"
    description = tool_span.status.description or ""
    assert description.startswith("LookupError: no such order (reference ")
    (raised,) = tool_span.events  # what the tool raised, with the reference the model read
    assert raised.name == "exception"
    event = dict(raised.attributes or {})
    assert (event["exception.type"], event["exception.message"]) == ("LookupError", "no such order")
    assert 'raise LookupError("no such order")' in str(event["exception.stacktrace"])
    assert (
        description == f"LookupError: no such order (reference {event['handrail.error.reference']})"
    )
    assert attrs(spans["chat scripted"])["error.type"] == "ModelError"
    assert attrs(spans["invoke_agent a"])["error.type"] == "ModelError"
    assert attrs(spans["handrail.turn"])["error.type"] == "ModelError"


async def test_content_is_recorded_only_when_asked_for():
    steps: list[Any] = [json.dumps({"route": "search"}), [call("orders.lookup", order_id="A1")]]
    engine, exporter = traced([*steps, "Found.", "Ok."])
    [e async for e in engine.submit("s1", "look A1")]
    content = {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.tool.definitions",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
    }
    assert not any(content & set(attrs(s)) for s in exporter.get_finished_spans())

    engine, exporter = traced([*steps, "Found.", "Ok."], capture_content=True)
    [e async for e in engine.submit("s1", "look A1")]
    tool_span = by_name(exporter)["execute_tool orders.lookup"]
    assert json.loads(attrs(tool_span)["gen_ai.tool.call.arguments"]) == {"order_id": "A1"}
    assert json.loads(attrs(tool_span)["gen_ai.tool.call.result"]) == {"id": "A1"}
    chats = [s for s in exporter.get_finished_spans() if s.name == "chat scripted"]
    executor_second = chats[2]  # the executor's call after its tool call
    messages = json.loads(attrs(executor_second)["gen_ai.input.messages"])
    assert messages[0] == {"role": "user", "parts": [{"type": "text", "content": "look A1"}]}
    assert messages[-2:] == [
        {
            "role": "assistant",
            "parts": [
                {
                    "type": "tool_call",
                    "id": "call_1",
                    "name": "orders.lookup",
                    "arguments": {"order_id": "A1"},
                }
            ],
        },
        {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": "call_1", "response": {"id": "A1"}}],
        },
    ]
    assert json.loads(attrs(executor_second)["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "Found."}],
            "finish_reason": "stop",
        }
    ]
    definitions = json.loads(attrs(executor_second)["gen_ai.tool.definitions"])
    assert [d["name"] for d in definitions] == ["orders.lookup", "orders.refund"]


async def test_a_span_opened_inside_a_tool_nests_under_execute_tool():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    shop = provider.get_tracer("shop")  # any tracer: the parent comes from the current context

    @tool(name="orders.lookup")
    async def lookup_traced(order_id: str) -> str:
        """Look an order up."""
        with shop.start_as_current_span("shop.db.query"):
            return order_id

    @tool(name="orders.sync")
    def sync_traced(order_id: str) -> str:
        """Look an order up, blocking (it runs in a worker thread)."""
        with shop.start_as_current_span("shop.db.sync"):
            return order_id

    runtime = Runtime(
        model=ScriptedModel(
            [[call("orders.lookup", order_id="A1"), call("orders.sync", order_id="A1")], "ok"]
        ),
        ids=sequential_ids(),
        tracing=Tracing(provider),
    )
    engine = Engine(Agent("a", tools=[lookup_traced, sync_traced]), runtime=runtime)
    [e async for e in engine.submit("s1", "go")]
    spans = by_name(exporter)
    for inner, outer in (
        ("shop.db.query", "execute_tool orders.lookup"),
        ("shop.db.sync", "execute_tool orders.sync"),
    ):
        parent = spans[inner].parent
        assert parent is not None and parent.span_id == spans[outer].context.span_id
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing leaked into the caller


async def test_a_span_opened_while_the_model_streams_nests_under_chat():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    http_client = provider.get_tracer("http")  # as an instrumented HTTP client would
    inner_parents: list[int] = []
    script = ScriptedModel(["Hi."])
    original = script.stream

    async def instrumented(request: ModelRequest) -> AsyncIterator[ModelChunk]:
        with http_client.start_as_current_span("POST /chat") as http:
            inner_parents.append(http.parent.span_id)  # type: ignore[attr-defined]
        async for chunk in original(request):
            yield chunk

    script.stream = instrumented  # type: ignore[method-assign]
    runtime = Runtime(model=script, ids=sequential_ids(), tracing=Tracing(provider))
    [e async for e in Engine(Agent("a"), runtime=runtime).submit("s1", "hello")]
    assert inner_parents == [by_name(exporter)["chat scripted"].context.span_id]
    assert trace.get_current_span() is trace.INVALID_SPAN


@tool(name="orders.refund_amount", permission="write", amendable=["amount"])
def refund_amount(order_id: str, amount: int) -> str:
    """Refund part of an order."""
    return f"refunded {amount}"


async def test_a_resumed_turn_links_to_the_suspended_one_and_records_the_decision():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    runtime = Runtime(
        model=ScriptedModel([[call("orders.refund_amount", order_id="A1", amount=50)], "Done."]),
        ids=sequential_ids(),
        tracing=Tracing(provider),
    )
    engine = Engine(Agent("a", tools=[refund_amount]), runtime=runtime)
    events = [e async for e in engine.submit("s1", "refund A1")]
    assert events[-1].type == "run-suspended"
    [suspended] = [s for s in exporter.get_finished_spans() if s.name == "handrail.turn"]
    stored = await engine.session("s1")
    assert stored.progress is not None
    context = suspended.context
    assert stored.progress.trace == (
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    )

    await engine.resolve("s1", "call_1", Approve(amended_args={"amount": 20}, by="ana"))
    events = [e async for e in engine.resume("s1")]
    assert events[-1].type == "run-completed"
    resumed = [s for s in exporter.get_finished_spans() if s.name == "handrail.turn"][1]
    assert resumed.parent is None and resumed.context.trace_id != context.trace_id
    [link] = resumed.links
    assert (link.context.trace_id, link.context.span_id) == (context.trace_id, context.span_id)
    assert attrs(resumed)["handrail.resumed"] is True
    [decision] = resumed.events
    assert decision.name == "handrail.decision"
    assert dict(decision.attributes or {}) == {
        "gen_ai.tool.call.id": "call_1",
        "gen_ai.tool.name": "orders.refund_amount",
        "handrail.decision": "approve",
        "handrail.decision.kind": "approval",
        "handrail.decision.by": "ana",
        "handrail.decision.amended": ("amount",),
    }
    assert (await engine.session("s1")).progress is None  # the turn ended


async def test_a_rejection_is_recorded_with_its_reason_when_content_is_captured():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    runtime = Runtime(
        model=ScriptedModel([[call("orders.refund_amount", order_id="A1", amount=50)], "Ok."]),
        ids=sequential_ids(),
        tracing=Tracing(provider, capture_content=True),
    )
    engine = Engine(Agent("a", tools=[refund_amount]), runtime=runtime)
    [e async for e in engine.submit("s1", "refund A1")]
    await engine.resolve("s1", "call_1", Reject(reason="over the limit", by="bo"))
    [e async for e in engine.resume("s1")]
    resumed = [s for s in exporter.get_finished_spans() if s.name == "handrail.turn"][1]
    [decision] = resumed.events
    assert dict(decision.attributes or {}) == {
        "gen_ai.tool.call.id": "call_1",
        "gen_ai.tool.name": "orders.refund_amount",
        "handrail.decision": "reject",
        "handrail.decision.kind": "approval",
        "handrail.decision.by": "bo",
        "handrail.decision.amended": (),
        "handrail.decision.reason": "over the limit",
    }


def test_a_state_stored_before_progress_had_a_trace_still_loads():
    state = RunState(session_id="s1")
    from handrail.state import Progress

    state.progress = Progress(
        agent="a", status="suspended", trace="00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    )
    data = state.dump()
    assert RunState.load(data).progress == state.progress
    del data["progress"]["trace"]  # as a handrail before tracing links wrote it
    loaded = RunState.load(data).progress
    assert loaded is not None and loaded.trace == ""


def test_a_malformed_stored_trace_gives_no_link():
    tracing = Tracing(TracerProvider())
    assert tracing.resumed_from("") == []
    assert tracing.resumed_from("00-zz-yy-01") == []
    assert tracing.resumed_from("00-" + "0" * 32 + "-" + "0" * 16 + "-01") == []
    assert tracing.resumed_from("00-" + "g" * 32 + "-" + "1" * 16 + "-01") == []


class _Collector(BaseHTTPRequestHandler):
    received: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


async def test_spans_are_exported_over_otlp_http():
    otlp = pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    _Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(otlp.OTLPSpanExporter(endpoint=endpoint)))
        runtime = Runtime(model=ScriptedModel(["Hi."]), tracing=Tracing(provider))
        [e async for e in Engine(Agent("a"), runtime=runtime).submit("s1", "hello")]
        provider.shutdown()
    finally:
        server.shutdown()
        server.server_close()
    names: dict[str, dict[str, Any]] = {}
    for body in _Collector.received:
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    names[span.name] = {a.key: a.value for a in span.attributes}
    assert set(names) == {"handrail.turn", "invoke_agent a", "chat scripted"}
    assert names["chat scripted"]["gen_ai.provider.name"].string_value == "handrail.testing"


@pytest.mark.skipif(
    not os.environ.get("HANDRAIL_PHOENIX_URL"),
    reason="PHOENIX TEST SKIPPED: it needs a running Arize Phoenix; `make phoenix` installs one, "
    "starts it and runs this test against it (HANDRAIL_PHOENIX_URL)",
)
async def test_spans_reach_phoenix_nested():
    otlp = pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    import urllib.request

    base = os.environ["HANDRAIL_PHOENIX_URL"].rstrip("/")
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(otlp.OTLPSpanExporter(endpoint=f"{base}/v1/traces"))
    )

    @tool
    def lookup(order_id: str) -> str:
        """Look an order up."""
        return f"order {order_id}: shipped"

    session = f"phoenix-{os.getpid()}-{threading.get_ident()}"
    model = ScriptedModel([call("lookup", order_id="A1"), "It shipped."])
    runtime = Runtime(model=model, tracing=Tracing(provider))
    [e async for e in Engine(Agent("a", tools=[lookup]), runtime=runtime).submit(session, "hi")]
    provider.shutdown()

    def spans() -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{base}/v1/projects/default/spans?limit=1000") as reply:
            return list(json.load(reply)["data"])

    mine: list[dict[str, Any]] = []
    for _ in range(100):  # Phoenix ingests in the background
        found = await asyncio.to_thread(spans)
        traces = {
            s["context"]["trace_id"]
            for s in found
            if s["attributes"].get("gen_ai.conversation.id") == session
        }
        mine = [s for s in found if s["context"]["trace_id"] in traces]
        if len(mine) >= 5:
            break
        await asyncio.sleep(0.2)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in mine:
        by_name.setdefault(span["name"], []).append(span)
    assert set(by_name) == {
        "handrail.turn",
        "invoke_agent a",
        "chat scripted",
        "execute_tool lookup",
    }
    (turn,) = by_name["handrail.turn"]
    (agent,) = by_name["invoke_agent a"]
    (tool_span,) = by_name["execute_tool lookup"]
    assert len({s["context"]["trace_id"] for s in mine}) == 1
    assert turn["parent_id"] is None
    assert agent["parent_id"] == turn["context"]["span_id"]
    assert len(by_name["chat scripted"]) == 2
    for span in [*by_name["chat scripted"], tool_span]:
        assert span["parent_id"] == agent["context"]["span_id"]
    # Phoenix read the GenAI conventions: it knows which span is the agent, the model, the tool.
    assert (agent["span_kind"], tool_span["span_kind"]) == ("AGENT", "TOOL")
    assert {s["span_kind"] for s in by_name["chat scripted"]} == {"LLM"}
    assert tool_span["attributes"]["gen_ai.tool.name"] == "lookup"
