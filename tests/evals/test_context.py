"""Per-turn context in eval scenarios: per scenario or per turn, validated like a live turn."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from handrail import Agent, Domain, ToolContext, tool
from handrail.evals import Scenario, Suite, SuiteResult, run_suite


class Page(BaseModel):
    page: str
    record_id: int


seen: list[Any] = []


@tool(name="orders.status", permission="read", bindings={"order": "sys:context.record_id"})
def status(ctx: ToolContext[Any], order: int) -> str:
    """The status of the order the user is looking at."""
    seen.append((order, ctx.turn_context))
    return f"order {order} shipped"


@tool(name="orders.refund", permission="write", bindings={"order": "sys:context.record_id"})
def refund(order: int) -> str:
    """Refund the order the user is looking at."""
    return f"refunded {order}"


desk = Agent("desk", instructions="On {context.page}.", tools=[status, refund])
DOMAIN = Domain(agents=[desk], context_model=Page)
LOOK = [[{"call": "orders.status"}], ["It shipped."]]


@pytest.fixture(autouse=True)
def _clear() -> None:
    seen.clear()


# Capture mode: the read runs for real (and sees the context); the gated refund is captured.
def run(*scenarios: dict[str, Any]) -> SuiteResult:
    built = [
        Scenario.model_validate({"name": f"s{i}", "mode": "capture", **s})
        for i, s in enumerate(scenarios)
    ]
    return asyncio.run(run_suite(Suite(name="t", domain=DOMAIN, scenarios=built)))


def test_a_scenario_s_context_reaches_every_turn_and_a_turn_s_own_wins() -> None:
    (result,) = run(
        {
            "turns": [
                "where is it?",
                {"text": "and this one?", "context": {"page": "o", "record_id": 8}},
            ],
            "context": {"page": "orders", "record_id": 7},
            "model": {"scripted": [*LOOK, *LOOK]},
            "expect": {"called": ["orders.status", "orders.status"]},
        }
    ).scenarios
    assert result.passed, result.failures
    assert seen == [(7, Page(page="orders", record_id=7)), (8, Page(page="o", record_id=8))]


def test_an_invalid_context_fails_its_scenario_with_the_error_and_the_others_still_run() -> None:
    bad, missing, good = run(
        {
            "turns": "where?",
            "context": {"page": "orders", "record_id": "seven"},
            "model": {"scripted": LOOK},
        },
        {"turns": ["where?"], "model": {"scripted": LOOK}},  # no context: the placeholder fails
        {
            "turns": "where?",
            "context": {"page": "orders", "record_id": 7},
            "model": {"scripted": LOOK},
        },
    ).scenarios
    assert [(f.assertion, f.reason) for f in bad.failures][:1] == [
        (
            "run",
            "turn 1: context.record_id: Input should be a valid integer, unable to parse string "
            "as an integer (the domain's context model is Page).",
        )
    ]
    assert missing.failures[0].assertion == "run"
    assert "'desk'" in missing.failures[0].reason and "{context.page}" in missing.failures[0].reason
    assert good.passed, good.failures
    assert seen == [(7, Page(page="orders", record_id=7))]  # the failed ones ran nothing


def test_a_capture_mode_scenario_takes_a_context_too() -> None:
    (result,) = run(
        {
            "turns": "refund it",
            "context": {"page": "orders", "record_id": 42},
            "model": {"scripted": [[{"call": "orders.refund"}], ["Proposed."]]},
            # captured only if its binding found the record in the context
            "expect": {"captured": {"actions": ["orders.refund"], "count": 1}},
        }
    ).scenarios
    assert result.passed, result.failures


def test_a_decision_turn_carries_no_context_of_its_own() -> None:
    with pytest.raises(ValidationError, match="drop context"):
        Scenario.model_validate(
            {
                "name": "s",
                "turns": [
                    "refund it",
                    {"decide": "approve", "context": {"page": "p", "record_id": 1}},
                ],
            }
        )
