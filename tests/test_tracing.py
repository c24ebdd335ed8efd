"""OpenTelemetry spans, checked with the SDK's in-memory exporter."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from handrail import Agent, Domain, Engine, RouteDecision, Runtime, tool
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


def traced(steps: list[Any]) -> tuple[Engine, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    domain = Domain(
        agents=[Agent("executor", tools=[lookup, refund]), Agent("responder")],
        routes={"search": ["executor", "responder"]},
        supervisor=Agent("supervisor", output_type=RouteDecision),
    )
    runtime = Runtime(model=ScriptedModel(steps), ids=sequential_ids(), tracing=Tracing(provider))
    return Engine(domain, runtime=runtime), exporter


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
