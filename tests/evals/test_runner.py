"""Running suites built in Python: every assertion, its failure reasons, counting, mocks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from handrail import Agent, Domain, RouteDecision, tool
from handrail.evals import (
    AgentConfig,
    AgentOverride,
    Expect,
    Failure,
    Judge,
    Mock,
    ModelSpec,
    Scenario,
    Suite,
    SuiteResult,
    run_suite,
)
from handrail.testing import ScriptedModel


class Ticket(BaseModel):
    order_id: str
    urgent: bool


@tool(name="orders.lookup", permission="read")
def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    raise AssertionError("mocked in every scenario")


@tool(name="orders.cancel", permission="write")
def cancel(order_id: str) -> dict[str, Any]:
    """Cancel an order (a person approves)."""
    raise AssertionError("never runs: it is gated")


triage = Agent("triage", tools=[lookup, cancel], output_type=Ticket)


def scenario(**fields: Any) -> Scenario:
    return Scenario.model_validate({"name": "s", "turns": "Order A1 is late!", **fields})


def run(*scenarios: Scenario, domain: Any = triage, **suite: Any) -> SuiteResult:
    built = Suite(name="t", domain=domain, scenarios=list(scenarios), **suite)
    return asyncio.run(run_suite(built))


def failures(*scenarios: Scenario, **suite: Any) -> list[tuple[str, str]]:
    (result,) = run(*scenarios, **suite).scenarios
    return [(f.assertion, f.reason) for f in result.failures]


TICKET = [
    [{"call": "orders.lookup", "args": {"order_id": "A1"}}],
    [{"output": {"order_id": "A1", "urgent": True}}],
]


def test_structured_output_calls_and_counts_pass() -> None:
    result = run(
        scenario(
            mocks={"orders.lookup": {"output": {"status": "late"}}},
            model={"scripted": TICKET},
            expect={
                "outcome": "completed",
                "called": [{"tool": "orders.lookup", "args": {"order_id": "A1"}}],
                "not_called": ["orders.cancel"],
                "output": {"order_id": "A1", "urgent": True},
                "text_contains": '"urgent": true',
                "max_model_calls": 2,
                "approvals": [],
            },
        )
    )
    (only,) = result.scenarios
    assert only.failures == []
    assert (only.outcome, only.model_calls, only.tokens, only.routes) == (
        "completed",
        2,
        None,
        ["default"],
    )


def test_each_assertion_says_what_it_found() -> None:
    assert failures(
        scenario(
            mocks={"orders.lookup": {"output": {"status": "late"}}},
            model={"scripted": TICKET, "usage": {"input_tokens": 50, "output_tokens": 10}},
            expect={
                "outcome": "suspended",
                "route": "default",
                "called": [{"tool": "orders.lookup", "args": {"order_id": "B2"}}, "orders.cancel"],
                "not_called": [{"tool": "orders.lookup", "args": {"order_id": "A1"}}],
                "approvals": ["orders.cancel"],
                "text_matches": "^never",
                "output": {"order_id": "A1", "urgent": False},
                "max_model_calls": 1,
                "max_tokens": 100,
            },
        )
    ) == [
        ("outcome", "expected suspended, got completed"),
        (
            "called",
            'no call of orders.lookup {"order_id": "B2"} (1 of that tool; the first: order_id '
            "is 'A1', not 'B2')",
        ),
        ("called", "no call of orders.cancel (calls: orders.lookup)"),
        ("not_called", 'orders.lookup was called with {"order_id": "A1"}'),
        ("approvals", "expected ['orders.cancel'], got []"),
        (
            "text_matches",
            '/^never/ does not match "{\\"order_id\\": \\"A1\\", \\"urgent\\": true}"',
        ),
        (
            "output",
            'expected {"order_id": "A1", "urgent": false}, got {"order_id": "A1", "urgent": true}',
        ),
        ("max_model_calls", "2 model calls, more than 1"),
        ("max_tokens", "120 tokens, more than 100"),
    ]


def test_mocks_give_outputs_in_order_then_a_tool_error_the_model_reads() -> None:
    seen: list[Any] = []

    def answer(request: Any) -> Any:
        last = request.messages[-1]
        calls = [p for m in request.messages for p in m.tool_calls]
        seen.extend(c.result.data if c.result.ok else c.result.error for c in last.tool_calls)
        if len(calls) < 3:
            from handrail.testing import call

            return call("orders.lookup", order_id=f"A{len(calls)}")
        return '{"order_id": "A1", "urgent": false}'

    spec = ModelSpec(function=answer)
    result = run(
        Scenario(
            name="s",
            turns=["Go"],  # type: ignore[list-item]
            mocks={"orders.lookup": Mock(outputs=[{"n": 1}, {"n": 2}])},
            model=spec,
        )
    )
    assert result.passed
    assert seen == [
        {"n": 1},
        {"n": 2},
        "Tool 'orders.lookup' was called 3 times, but its mock has 2 output(s).",
    ]


def test_an_error_mock_is_a_tool_error() -> None:
    def answer(request: Any) -> Any:
        from handrail.testing import call

        last = request.messages[-1]
        if last.role == "user":
            return call("orders.lookup", order_id="A1")
        return f'{{"order_id": "{last.tool_calls[0].result.error}", "urgent": false}}'

    result = run(
        scenario(
            mocks={"orders.lookup": {"error": "database down"}},
            model={"function": answer},
            expect={"output": {"order_id": "database down", "urgent": False}},
        )
    )
    assert result.passed, result.scenarios[0].failures


def test_a_gated_call_asks_for_approval_and_the_run_suspends() -> None:
    result = run(
        scenario(
            model={"scripted": [[{"call": "orders.cancel", "args": {"order_id": "A1"}}]]},
            expect={"outcome": "suspended", "approvals": ["orders.cancel"]},
        )
    )
    assert result.passed, result.scenarios[0].failures
    assert result.scenarios[0].outcome == "suspended"


def test_a_turn_after_a_suspended_one_cannot_be_sent() -> None:
    got = failures(
        scenario(
            turns=["Cancel A1", "And B2?"],
            model={"scripted": [[{"call": "orders.cancel", "args": {"order_id": "A1"}}]]},
        )
    )
    assert got == [
        (
            "run",
            "turn 1 suspended (waiting on orders.cancel), so turn 2 could not be sent; follow "
            "it with a decision (decide: approve | reject | answer, or decisions: [...]) or end "
            "the scenario there",
        )
    ]


def test_a_script_not_played_to_its_end_fails_and_so_does_a_failed_run() -> None:
    got = failures(scenario(model={"scripted": [*TICKET[1:], "left over"]}))
    assert got == [
        (
            "model",
            "the scripted model played 1 of 2 steps (the agent stopped early, or the script "
            "has steps too many)",
        )
    ]
    (assertion, reason), *_ = failures(scenario())
    assert (assertion, reason.split(":")[0]) == ("run", "ConfigError")
    assert "Agent 'triage' has no model" in reason


def test_unknown_token_usage_fails_a_token_limit() -> None:
    got = failures(scenario(model={"scripted": TICKET[1:]}, expect={"max_tokens": 5}))
    assert got == [("max_tokens", "the model reported no token usage, so it cannot be checked")]


def test_the_judge_gives_a_verdict_and_a_failing_one_fails() -> None:
    judged = scenario(
        model={"scripted": TICKET[1:]},
        expect={"judge": {"rubric": "Marks late orders urgent."}},
    )
    passing = ModelSpec.model_validate(
        {"scripted": [[{"output": {"passed": True, "reason": "urgent"}}]]}
    )
    result = run(judged, judge_model=passing)
    assert result.passed and result.scenarios[0].judge == "urgent"

    failing = Judge(
        rubric="Marks late orders urgent.",
        model=ModelSpec.model_validate(
            {"scripted": [[{"output": {"passed": False, "reason": "not urgent"}}]]}
        ),
    )
    assert failures(scenario(model={"scripted": TICKET[1:]}, expect=Expect(judge=failing))) == [
        ("judge", "not urgent")
    ]
    assert failures(judged) == [("judge", "no judge model: give judge.model or judge_model")]
    nonsense = ModelSpec.model_validate({"scripted": ["maybe", "still maybe"]})
    ((assertion, reason),) = failures(judged, judge_model=nonsense)
    assert assertion == "judge" and reason.startswith("the judge gave no verdict")


def test_the_judge_reads_the_conversation_and_the_calls() -> None:
    prompts: list[str] = []

    def grade(request: Any) -> str:
        prompts.append(request.messages[-1].text)
        return '{"passed": true, "reason": "ok"}'

    result = run(
        scenario(
            mocks={"orders.lookup": {"output": {}}},
            model={"scripted": TICKET},
            expect={"judge": {"rubric": "Be right.", "model": {"function": grade}}},
        )
    )
    assert result.passed
    assert prompts == [
        "Rubric:\nBe right.\n\nConversation:\nUser: Order A1 is late!\n"
        'Agent: {"order_id": "A1", "urgent": true}\n\nTool calls the agent made:\n'
        '- orders.lookup {"order_id": "A1"}'
    ]


def routed_domain(agent_model: Any = None) -> Domain:
    supervisor = Agent("supervisor", output_type=RouteDecision)
    writer = Agent("writer", instructions="Write.", model=agent_model)
    return Domain(
        agents=[writer], routes={"write": ["writer"], "other": ["writer"]}, supervisor=supervisor
    )


def test_an_agents_own_model_is_counted_and_routes_are_recorded_turn_by_turn() -> None:
    domain = routed_domain(agent_model=ScriptedModel(["one", "two"]))
    result = run(
        Scenario.model_validate(
            {
                "name": "two-turns",
                "turns": [
                    {"text": "a", "org_id": "acme", "user_id": "ana"},
                    {"text": "b", "route": "other", "org_id": "acme", "user_id": "ana"},
                ],
                "model": {"scripted": [[{"output": {"route": "write"}}]]},
                "expect": {
                    "route": ["write", "other"],
                    "max_model_calls": 3,
                    "text_contains": "two",
                },
            }
        ),
        domain=domain,
    )
    assert result.passed, result.scenarios[0].failures
    assert result.scenarios[0].model_calls == 3


def echo_instructions(request: Any) -> str:
    if request.agent == "supervisor":
        return '{"route": "write"}'
    return request.instructions


def test_a_configuration_overrides_instructions_and_models() -> None:
    suite = Suite(
        name="t",
        domain=routed_domain(),
        model=ModelSpec(function=echo_instructions),
        scenarios=[
            Scenario.model_validate(
                {"name": "s", "turns": "hi", "expect": {"text_contains": "Write."}}
            )
        ],
    )
    assert asyncio.run(run_suite(suite)).passed
    draft = AgentConfig(name="draft", agents={"writer": AgentOverride(instructions="Shout.")})
    result = asyncio.run(run_suite(suite, config=draft))
    assert result.config == "draft"
    assert [f.reason for f in result.scenarios[0].failures] == [
        "'Write.' not in the final text \"Shout.\""
    ]
    scripted = AgentConfig(
        name="scripted",
        agents={
            "writer": AgentOverride(model=ModelSpec.model_validate({"scripted": ["Write. Now."]}))
        },
    )
    assert asyncio.run(run_suite(suite, config=scripted)).passed


def test_scenarios_report_in_suite_order_whatever_finishes_first() -> None:
    names = [f"s{i}" for i in range(12)]
    result = run(
        *[scenario(name=n, model={"scripted": TICKET[1:]}) for n in names],
        concurrency=5,
    )
    assert [s.name for s in result.scenarios] == names and result.passed


def test_capture_mode_records_actions_and_asserts_them() -> None:
    from handrail.demo.support_desk import support_domain

    base = {
        "turns": "Hi, my order A1042 arrived damaged. Can I get a refund?",
        "mode": "capture",
        "mocks": {
            "orders.lookup": {"output": {"order": "A1042", "total_cents": 8400}},
            "policy.refunds": {"output": {"refund": "full"}},
        },
        "model": {"function": "handrail.demo.support_desk:script"},
    }
    good = Scenario.model_validate(
        {
            **base,
            "name": "captured",
            "expect": {
                "route": "action",
                "approvals": [],
                "captured": {
                    "count": 1,
                    "actions": [{"tool": "orders.refund", "args": {"amount": 84}}],
                },
            },
        }
    )
    bad = Scenario.model_validate(
        {
            **base,
            "name": "wrong",
            "expect": {
                "captured": {
                    "count": 2,
                    "actions": [{"tool": "orders.refund", "args": {"amount": 40}}],
                }
            },
        }
    )
    result = run(good, bad, domain=support_domain)
    assert result.scenarios[0].failures == []
    assert result.scenarios[1].failures == [
        Failure(assertion="captured", reason="expected 2 action(s), captured 1 (orders.refund)"),
        Failure(
            assertion="captured",
            reason='no captured action of orders.refund {"amount": 40} (1 of that tool; the '
            "first: amount is 84.0, not 40)",
        ),
    ]


def test_a_captured_call_is_captured_not_called() -> None:
    from handrail.demo.support_desk import support_domain

    base = {
        "turns": "Hi, my order A1042 arrived damaged. Can I get a refund?",
        "mode": "capture",
        "mocks": {
            "orders.lookup": {"output": {"order": "A1042", "total_cents": 8400}},
            "policy.refunds": {"output": {"refund": "full"}},
        },
        "model": {"function": "handrail.demo.support_desk:script"},
    }
    honest = Scenario.model_validate(
        {
            **base,
            "name": "honest",
            "expect": {
                "called": ["orders.lookup"],  # a read runs, even headless
                "not_called": "orders.refund",  # captured: it did not run
                "captured": {"count": 1, "actions": ["orders.refund"]},
            },
        }
    )
    prompts: list[str] = []

    def grade(request: Any) -> str:
        prompts.append(request.messages[-1].text)
        return '{"passed": true, "reason": "ok"}'

    honest.expect.judge = Judge(rubric="Be right.", model=ModelSpec(function=grade))
    claims = Scenario.model_validate(
        {**base, "name": "claims", "expect": {"called": ["orders.refund"]}}
    )
    result = run(honest, claims, domain=support_domain)
    assert result.scenarios[0].failures == []
    # The judge reads the captured call apart from the calls made, as not run.
    made, captured = (
        prompts[0]
        .split("\n\nTool calls the agent made:\n")[1]
        .split("\n\nCalls captured to be applied later (proposed, not run):\n")
    )
    assert "orders.refund" not in made and captured.startswith("- orders.refund {")
    assert result.scenarios[1].failures == [
        Failure(
            assertion="called",
            reason="no call of orders.refund (calls: orders.lookup, policy.refunds); a call of "
            "orders.refund was captured (proposed, not run): assert it with captured",
        )
    ]


CANCEL_THEN_ANSWER = [
    [{"call": "orders.cancel", "args": {"order_id": "A1"}}],
    [{"output": {"order_id": "A1", "urgent": False}}],
]


def test_a_decision_turn_approves_with_amendments_or_rejects_then_resumes() -> None:
    approved = scenario(
        name="approved",
        turns=["Cancel A1", {"decide": "approve"}],
        mocks={"orders.cancel": {"output": {"cancelled": "A1"}}},
        model={"scripted": CANCEL_THEN_ANSWER},
        expect={
            "outcome": "completed",
            "approvals": ["orders.cancel"],
            "output": {"order_id": "A1", "urgent": False},
        },
    )
    rejected = scenario(
        name="rejected",
        turns=["Cancel A1", {"decide": "reject", "reason": "keep it"}],
        mocks={"orders.cancel": {"error": "must not run"}},
        model={"function": _reads_the_rejection},
        expect={"outcome": "completed", "output": {"order_id": "keep it", "urgent": False}},
    )
    result = run(approved, rejected)
    assert [s.failures for s in result.scenarios] == [[], []]
    assert [s.outcome for s in result.scenarios] == ["completed", "completed"]


def _reads_the_rejection(request: Any) -> Any:
    from handrail.testing import call

    last = request.messages[-1]
    if last.role == "user":
        return call("orders.cancel", order_id="A1")
    reason = last.tool_calls[0].result.error or ""
    return f'{{"order_id": "{"keep it" if "keep it" in reason else reason}", "urgent": false}}'


def test_a_decision_needs_a_suspended_turn_before_it() -> None:
    got = failures(scenario(turns=["Hi", {"decide": "approve"}], model={"scripted": TICKET[1:]}))
    assert got == [("run", "turn 2 decides, but nothing waits for a decision")]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"turns": [{"decide": "approve"}]}, "the first turn is a message"),
        ({"turns": ["a", {"decide": "approve"}], "mode": "capture"}, "asks nobody"),
        ({"turns": ["a", {"decide": "reject", "amend": {}}]}, "amend goes with decide: approve"),
        ({"turns": ["a", {"decide": "approve", "reason": "x"}]}, "reason goes with decide: reject"),
        (
            {"turns": ["a", {"text": "b", "decide": "approve"}]},
            "exactly one of text, decide or decisions",
        ),
    ],
)
def test_decision_turns_are_validated(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Scenario.model_validate({"name": "s", **fields})


def test_tool_errors_assert_the_failed_calls_and_their_codes() -> None:
    steps = [
        [
            {"call": "orders.lookup", "args": {"order": "A1"}},
            {"call": "orders.track", "args": {"order_id": "A1"}},
        ],
        [{"call": "orders.lookup", "args": {"order_id": "A1"}}],
        [{"output": {"order_id": "A1", "urgent": False}}],
    ]
    mocks = {"orders.lookup": {"error": "A1 is archived", "code": "archived"}}
    passing = scenario(
        mocks=mocks,
        model={"scripted": steps},
        expect={
            "tool_errors": [
                {"tool": "orders.lookup", "code": "invalid_arguments"},
                {"tool": "orders.track", "code": "unknown_tool"},
                {"tool": "orders.lookup", "code": "archived"},
            ]
        },
    )
    assert run(passing).passed, run(passing).scenarios[0].failures
    failing = scenario(
        mocks=mocks,
        model={"scripted": steps},
        expect={"tool_errors": [{"tool": "orders.track", "code": "timed_out"}, "orders.cancel"]},
    )
    assert failures(failing) == [
        ("tool_errors", "orders.track failed with unknown_tool, not timed_out"),
        (
            "tool_errors",
            "no failed call of orders.cancel (failed: orders.lookup, orders.track)",
        ),
    ]


def test_a_mock_code_needs_an_error() -> None:
    with pytest.raises(ValueError, match="code goes with error"):
        scenario(mocks={"orders.lookup": {"output": 1, "code": "archived"}})
