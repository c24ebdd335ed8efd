"""Scenarios that decide waiting calls one by one, and assertions about what was proposed.

A person approves (with amendments), rejects or answers each waiting call, named by its
tool or its index; a rejected call is not a call made; a decision that fits no waiting call,
or a waiting call that no decision covers, fails the scenario, saying which.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from handrail import Agent, tool
from handrail.cli import app
from handrail.evals import Scenario, Suite, SuiteError, SuiteResult, load_suite, run_suite
from handrail.models import ModelRequest
from handrail.testing import Step, call


@tool(name="orders.lookup", permission="read")
def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    raise AssertionError("mocked")


@tool(name="orders.refund", permission="write", amendable=["amount"])
def refund(order_id: str, amount: int) -> dict[str, Any]:
    """Refund an order (a person approves, and may change the amount)."""
    raise AssertionError("mocked")


@tool(name="orders.cancel", permission="write")
def cancel(order_id: str) -> dict[str, Any]:
    """Cancel an order (a person approves)."""
    raise AssertionError("mocked")


@tool(name="ask_customer", executor="human")
def ask_customer(question: str) -> str:
    """Ask the customer something (a person answers)."""
    raise AssertionError("a person answers")


@tool(name="device.locate", executor="client")
def locate() -> dict[str, float]:
    """Where the customer's device is (the app runs it)."""
    raise AssertionError("the client runs it")


PROPOSALS = [
    call("orders.refund", order_id="A1", amount=84),
    call("orders.cancel", order_id="B2"),
    call("orders.cancel", order_id="C3"),
    call("ask_customer", question="Which colour?"),
    call("device.locate"),
]


def desk(request: ModelRequest) -> Step:
    """Proposes five calls, then answers with what each one returned (as JSON)."""
    last = request.messages[-1]
    if last.role == "user":
        return PROPOSALS
    seen = {
        f"{c.name} {c.args.get('order_id', '')}".strip(): (
            c.result.data if c.result.ok else f"error: {c.result.error}"
        )
        for c in last.tool_calls
        if c.result is not None
    }
    return json.dumps(seen, sort_keys=True)


agent = Agent("desk", tools=[lookup, refund, cancel, ask_customer, locate])
MOCKS = {
    "orders.refund": {"output": {"refunded": "A1"}},
    "orders.cancel": {"output": {"cancelled": True}},
}


def scenario(**fields: Any) -> Scenario:
    return Scenario.model_validate(
        {"name": "s", "mocks": MOCKS, "model": {"function": desk}, "client": True, **fields}
    )


def run(*scenarios: Scenario) -> SuiteResult:
    return asyncio.run(run_suite(Suite(name="t", domain=agent, scenarios=list(scenarios))))


def failures(*turns: Any, **expect: Any) -> list[tuple[str, str]]:
    (result,) = run(scenario(turns=["Sort my orders out", *turns], expect=expect)).scenarios
    return [(f.assertion, f.reason) for f in result.failures]


EVERY_ONE = {
    "decisions": [
        {"approve": "orders.refund", "amend": {"amount": 40}},
        {"reject": 1, "reason": "not today"},
        {"approve": 2},
        {"answer": "ask_customer", "output": "blue"},
        {"answer": 4, "output": {"lat": 1.5, "lon": 2.5}},
    ]
}


def test_each_waiting_call_gets_its_own_decision_and_the_model_reads_each_result() -> None:
    result = run(
        scenario(
            turns=["Sort my orders out", EVERY_ONE],
            expect={
                "outcome": "completed",
                "approvals": ["orders.refund", "orders.cancel", "orders.cancel"],
                "called": [
                    {"tool": "orders.refund", "args": {"order_id": "A1", "amount": 40}},
                    {"tool": "orders.cancel", "args": {"order_id": "C3"}},
                    {"tool": "ask_customer", "args": {"question": "Which colour?"}},
                    "device.locate",
                ],
                "not_called": [{"tool": "orders.cancel", "args": {"order_id": "B2"}}],
                "proposed": [
                    {"tool": "orders.refund", "args": {"amount": 84}, "decision": "amended"},
                    {"tool": "orders.cancel", "args": {"order_id": "B2"}, "decision": "rejected"},
                    {"tool": "orders.cancel", "args": {"order_id": "C3"}, "decision": "approved"},
                    {"tool": "ask_customer", "decision": "answered"},
                    {"tool": "device.locate", "decision": "answered"},
                ],
                "text_contains": [
                    '"ask_customer": "blue"',
                    '"device.locate": {"lat": 1.5, "lon": 2.5}',
                    '"orders.cancel C3": {"cancelled": true}',
                    '"orders.refund A1": {"refunded": "A1"}',
                    '"orders.cancel B2": "error: The call was rejected and did not run. Reason: '
                    "not today.",
                ],
            },
        )
    )
    (outcome,) = result.scenarios
    assert outcome.failures == []
    assert outcome.outcome == "completed"


def test_a_rejected_call_is_not_called_and_proposed_says_how_it_was_decided() -> None:
    assert failures({"decide": "reject"}, not_called=["orders.refund", "orders.cancel"]) == []
    got = failures(
        {"decide": "reject", "reason": "no"},
        called=[{"tool": "orders.refund", "args": {"amount": 84}}],
        proposed=[
            {"tool": "orders.cancel", "decision": "approved"},
            {"tool": "orders.lookup"},
            {"tool": "orders.refund", "args": {"amount": 40}},
        ],
    )
    assert got == [
        (
            "called",
            'no call of orders.refund {"amount": 84} (calls: none); a call of orders.refund '
            "was proposed, and rejected: assert it with proposed",
        ),
        ("proposed", "orders.cancel was rejected, not approved"),
        (
            "proposed",
            "no waiting call of orders.lookup (calls: orders.refund, orders.cancel, "
            "ask_customer, device.locate)",
        ),
        (
            "proposed",
            'no waiting call of orders.refund {"amount": 40} (1 of that tool; the first: '
            "amount is 84, not 40)",
        ),
    ]


def test_calls_still_waiting_when_the_scenario_ends_are_undecided_and_not_called() -> None:
    assert (
        failures(
            outcome="suspended",
            not_called=["orders.refund", "ask_customer"],
            proposed=[
                {"tool": "orders.refund", "decision": "undecided"},
                {"tool": "device.locate", "decision": "undecided"},
            ],
        )
        == []
    )
    got = failures(called=["ask_customer"])
    assert got == [
        (
            "called",
            "no call of ask_customer (calls: none); a call of ask_customer was proposed, and "
            "still waits: assert it with proposed",
        )
    ]


@tool(name="ask_customer", executor="human")
def ask_colour(question: str) -> str:
    """Ask the customer."""
    raise AssertionError("a person answers")


def test_decide_answer_answers_every_waiting_call() -> None:
    def asks(request: ModelRequest) -> Step:
        last = request.messages[-1]
        if last.role == "user":
            return call("ask_customer", question="Which colour?")
        return f"You chose {last.tool_calls[0].result.data}."

    asking = Agent("asking", tools=[ask_colour])
    answered = Scenario.model_validate(
        {
            "name": "answered",
            "turns": ["Paint it", {"decide": "answer", "output": "blue"}],
            "model": {"function": asks},
            "expect": {
                "text_contains": "You chose blue.",
                "called": "ask_customer",
                "proposed": {"tool": "ask_customer", "decision": "answered"},
            },
        }
    )
    suite = Suite(name="t", domain=asking, scenarios=[answered])
    (result,) = asyncio.run(run_suite(suite)).scenarios
    assert result.failures == []


WAITING = (
    '[0] orders.refund {"amount": 84, "order_id": "A1"}; [1] orders.cancel {"order_id": "B2"}; '
    '[2] orders.cancel {"order_id": "C3"}; [3] ask_customer {"question": "Which colour?"}; '
    "[4] device.locate {}"
)
OTHERS = [{"reject": 1}, {"reject": 2}, {"reject": 3}, {"reject": 4}]


@pytest.mark.parametrize(
    ("decisions", "reason"),
    [
        (
            [{"approve": "orders.lookup"}, *OTHERS],
            f"decisions[0] (approve orders.lookup): no call of orders.lookup waits (waiting: "
            f"{WAITING})",
        ),
        (
            [{"approve": 0}, {"answer": 7, "output": 1}],
            f"decisions[1] (answer [7]): no waiting call [7] (waiting: {WAITING})",
        ),
        (
            [{"approve": 0}, {"reject": "orders.cancel"}],
            "decisions[1] (reject orders.cancel): 2 calls of orders.cancel wait ([1], [2]): "
            f"name each by its index (waiting: {WAITING})",
        ),
        (
            [{"approve": "orders.refund"}, {"reject": 0}],
            'decisions[0] and decisions[1] both decide [0] orders.refund {"amount": 84, '
            '"order_id": "A1"}; a call is decided once',
        ),
        (
            [{"approve": 0}, {"reject": 1}, {"reject": 2}],
            '3 of 5 waiting calls decided; no decision for [3] ask_customer {"question": '
            '"Which colour?"}; [4] device.locate {} (add one to decisions, or decide every '
            "call alike with decide: approve | reject | answer)",
        ),
        (
            [{"answer": 0, "output": 1}, *OTHERS],
            "Call call_1 (orders.refund) waits for a decision on its approval card, which is "
            "one of approve, reject; got 'answer'.",
        ),
        (
            [{"approve": 0, "amend": {"order_id": "Z9"}}, *OTHERS],
            "Call call_1 (orders.refund): order_id cannot be amended (amendable: amount).",
        ),
    ],
    ids=["nothing-waits", "no-such-index", "ambiguous", "twice", "uncovered", "kind", "amend"],
)
def test_a_decision_that_does_not_fit_the_waiting_calls_fails_the_scenario(
    decisions: list[dict[str, Any]], reason: str
) -> None:
    got = failures({"decisions": decisions}, proposed=[{"tool": "orders.refund"}])
    assert got == [("run", f"turn 2: {reason}")]


@pytest.mark.parametrize(
    ("turn", "message"),
    [
        ({"decisions": [{"approve": 0, "reject": 1}]}, "exactly one of approve, reject or answer"),
        ({"decisions": [{"amend": {"amount": 1}}]}, "exactly one of approve, reject or answer"),
        ({"decisions": [{"answer": 0}]}, "answer needs its output"),
        ({"decisions": [{"approve": 0, "output": 1}]}, "output goes with answer"),
        ({"decisions": [{"reject": 0, "amend": {}}]}, "amend goes with approve"),
        ({"decisions": [{"approve": 0, "reason": "x"}]}, "reason goes with reject"),
        ({"decisions": [{"approve": -1}]}, "an index counts from 0"),
        ({"decisions": [{"approve": True}]}, "true names no call: give its tool"),
        ({"decisions": [{"reject": 1.0}]}, "Input should be a valid integer"),
        ({"decisions": []}, "at least 1 item"),
        ({"decisions": [{"approve": 0}], "amend": {}}, "go inside each decision"),
        ({"decide": "approve", "decisions": [{"approve": 0}]}, "exactly one of text, decide"),
        ({"decide": "answer"}, "decide: answer needs its output"),
        ({"decide": "reject", "output": 1}, "output goes with decide: answer"),
        ({"text": "hi", "reason": "x"}, "go with a decision, not a message"),
        ({"decisions": [{"approve": 0}], "route": "x"}, "drop route"),
    ],
)
def test_decisions_are_validated(turn: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Scenario.model_validate({"name": "s", "turns": ["a", turn]})
    with pytest.raises(ValueError, match="a decision follows one"):
        Scenario.model_validate({"name": "s", "turns": [{"decisions": [{"approve": 0}]}]})
    with pytest.raises(ValueError, match="decision"):
        Scenario.model_validate(
            {"name": "s", "turns": ["a", {"decide": "answer", "output": 1}], "mode": "capture"}
        )


runner = CliRunner()


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


DOMAIN_MODULE = '''
from handrail import Agent, tool
from handrail.testing import call


@tool(name="orders.cancel", permission="write")
def cancel(order_id: str) -> dict:
    """Cancel an order."""
    raise AssertionError("mocked")


@tool(name="ask_customer", executor="human")
def ask_customer(question: str) -> str:
    """Ask the customer."""
    raise AssertionError("a person answers")


@tool(name="device.locate", executor="client")
def locate() -> dict:
    """Where the device is."""
    raise AssertionError("the client runs it")


def script(request):
    last = request.messages[-1]
    if last.role == "user":
        return [call("orders.cancel", order_id="A1"), call("ask_customer", question="Colour?"),
                call("device.locate")]
    return " / ".join(str(c.result.data if c.result.ok else "refused") for c in last.tool_calls)


agent = Agent("desk", tools=[cancel, ask_customer, locate])
'''

SUITE = """\
domain: {module}:agent
model: {{function: "{module}:script"}}
scenarios:
  - name: decided-one-by-one
    client: true                  # the caller runs client tools (device.locate)
    turns:
      - Sort it out
      - decisions:
          - {{reject: orders.cancel, reason: "not today"}}
          - {{answer: ask_customer, output: blue}}
          - {{answer: 2, output: {{lat: 1.5}}}}
    expect:
      not_called: orders.cancel
      proposed:
        - {{tool: orders.cancel, args: {{order_id: A1}}, decision: rejected}}
        - {{tool: device.locate, decision: {wanted}}}
      text_contains: "refused / blue / {{'lat': 1.5}}"
"""


def test_the_command_runs_decisions_and_reports_a_proposal_that_fails(tmp_path: Path) -> None:
    (tmp_path / "desk_evals_domain.py").write_text(DOMAIN_MODULE, encoding="utf-8")
    module = "desk_evals_domain"
    good = write(tmp_path / "good.yaml", SUITE.format(module=module, wanted="answered"))
    result = runner.invoke(app, ["eval", str(good)])
    assert result.exit_code == 0, result.output
    assert "1 passed, 0 failed" in result.stdout
    bad = write(tmp_path / "bad.yaml", SUITE.format(module=module, wanted="rejected"))
    result = runner.invoke(app, ["eval", str(bad)])
    assert result.exit_code == 1
    assert (
        "FAIL decided-one-by-one: proposed: device.locate was answered, not rejected"
        in result.stdout
    )


BROKEN = """\
domain: handrail.demo.support_desk:support_domain
concurrency: 0
scenarios:
  - name: refund
    turns:
      - Refund A1042
      - decisions: [{approve: orders.refund, reason: "why not"}]
    expect: {max_model_calls: lots, proposed: [{tool: orders.refund, decision: maybe}]}
  - turns: hi
"""


def test_a_malformed_suite_names_every_problem(tmp_path: Path) -> None:
    path = write(tmp_path / "s.yaml", BROKEN)
    with pytest.raises(SuiteError) as caught:
        load_suite(path)
    assert str(caught.value) == (
        f"{path}: 5 problems:\n"
        "  concurrency: Input should be greater than or equal to 1\n"
        "  scenario 'refund': turns[1].decisions[0]: reason goes with reject\n"
        "  scenario 'refund': expect.proposed[0].decision: Input should be 'approved', "
        "'amended', 'rejected', 'answered' or 'undecided'\n"
        "  scenario 'refund': expect.max_model_calls: Input should be a valid integer, unable "
        "to parse string as an integer\n"
        "  scenarios[1]: name: Field required"
    )
    result = runner.invoke(app, ["eval", str(path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == f"error: {caught.value}\n"


UNKNOWN = """\
domain: handrail.demo.support_desk:support_domain
scenarios:
  - name: refund
    turns:
      - {text: Refund A1042, route: urgent}
      - decisions: [{approve: orders.refnd}, {reject: 1}]
    mocks: {orders.lookp: {output: 1}}
    expect: {not_called: orders.cancel, proposed: orders.refund, route: [action, rush]}
"""


def test_unknown_tools_and_routes_are_every_one_named(tmp_path: Path) -> None:
    path = write(tmp_path / "s.yaml", UNKNOWN)
    with pytest.raises(SuiteError) as caught:
        load_suite(path)
    tools = "(tools: orders.lookup, orders.refund, policy.refunds)."
    routes = "(routes: simple, search, action)."
    assert str(caught.value) == (
        f"{path}: 5 problems:\n"
        f"  scenario 'refund': mocks: no agent has a tool 'orders.lookp' {tools}\n"
        f"  scenario 'refund': turns[0].route: no route 'urgent' {routes}\n"
        "  scenario 'refund': turns[1].decisions[0].approve: no agent has a tool "
        f"'orders.refnd' {tools}\n"
        f"  scenario 'refund': expect.not_called[0]: no agent has a tool 'orders.cancel' {tools}\n"
        f"  scenario 'refund': expect.route[1]: no route 'rush' {routes}"
    )


def test_a_mock_that_asks_waits_on_a_question_a_decision_answers() -> None:
    def looks_up(request: ModelRequest) -> Step:
        last = request.messages[-1]
        if last.role == "user":
            return call("orders.lookup", order_id="A1")
        result = last.tool_calls[0].result
        return f"{result.data}" if result.ok else f"error: {result.error}"

    def asked(decision: dict[str, Any], **expect: Any) -> Scenario:
        return Scenario.model_validate(
            {
                "name": decision.get("answer", "rejected"),
                "turns": ["Where is A1?", {"decisions": [decision]}],
                "mocks": {"orders.lookup": {"ask": "Which warehouse?", "output": "shipped"}},
                "model": {"function": looks_up},
                "expect": {"approvals": [], **expect},
            }
        )

    answered = asked(
        {"answer": "orders.lookup", "output": "Leeds"},
        called=["orders.lookup"],
        proposed=[{"tool": "orders.lookup", "decision": "answered"}],
        text_contains="shipped",
    )
    declined = asked(
        {"reject": 0, "reason": "not mine to say"},
        proposed=[{"tool": "orders.lookup", "decision": "rejected"}],
        text_contains=["declined to answer: not mine to say", "(Which warehouse?)"],
    )
    suite = Suite(name="t", domain=agent, scenarios=[answered, declined])
    result = asyncio.run(run_suite(suite))
    assert [s.failures for s in result.scenarios] == [[], []]
    assert [s.outcome for s in result.scenarios] == ["completed", "completed"]


def test_the_members_of_a_union_give_one_reason_at_one_place(tmp_path: Path) -> None:
    path = write(
        tmp_path / "s.yaml",
        """\
        domain: handrail.demo.support_desk:support_domain
        scenarios:
          - name: a
            turns: [hi, {decisions: [{approve: [1]}]}]
            expect: {route: 3}
        """,
    )
    with pytest.raises(SuiteError) as caught:
        load_suite(path)
    assert str(caught.value).splitlines()[1:] == [
        "  scenario 'a': turns[1].decisions[0].approve: Input should be a valid string or a "
        "valid integer",
        "  scenario 'a': expect.route: Input should be a valid string or a valid list",
    ]


def test_the_judge_reads_the_calls_made_and_the_proposals_with_their_decisions() -> None:
    prompts: list[str] = []

    def grade(request: Any) -> str:
        prompts.append(request.messages[-1].text)
        return '{"passed": true, "reason": "ok"}'

    (result,) = run(
        scenario(
            turns=["Sort my orders out", EVERY_ONE],
            expect={"judge": {"rubric": "Be right.", "model": {"function": grade}}},
        )
    ).scenarios
    assert result.failures == []
    (prompt,) = prompts
    assert prompt.split("\n\nTool calls the agent made:\n")[1] == (
        '- orders.refund {"order_id": "A1", "amount": 40}\n'
        '- orders.cancel {"order_id": "C3"}\n'
        '- ask_customer {"question": "Which colour?"}\n'
        "- device.locate {}\n\n"
        "Calls that waited for a decision (as proposed), and the decision:\n"
        '- orders.refund {"order_id": "A1", "amount": 84}: amended\n'
        '- orders.cancel {"order_id": "B2"}: rejected\n'
        '- orders.cancel {"order_id": "C3"}: approved\n'
        '- ask_customer {"question": "Which colour?"}: answered\n'
        "- device.locate {}: answered"
    )


@tool(name="device.wipe", permission="destructive", executor="client")
def wipe(device: str) -> dict[str, Any]:
    """Wipe a device (a person approves, then the app does it)."""
    raise AssertionError("the client runs it")


def test_an_approved_client_tool_waits_again_for_its_client_and_is_made_once_answered() -> None:
    def wipes(request: ModelRequest) -> Step:
        last = request.messages[-1]
        if last.role == "user":
            return call("device.wipe", device="phone")
        return json.dumps(last.tool_calls[0].result.data)

    scenario = Scenario.model_validate(
        {
            "name": "wipe",
            "client": True,
            "turns": [
                "Wipe my phone",
                {"decisions": [{"approve": "device.wipe"}]},
                {"decisions": [{"answer": "device.wipe", "output": {"wiped": True}}]},
            ],
            "model": {"function": wipes},
            "expect": {
                "outcome": "completed",
                "route": ["default", "default", "default"],
                "approvals": ["device.wipe"],
                "called": [{"tool": "device.wipe", "args": {"device": "phone"}}],
                "proposed": [
                    {"tool": "device.wipe", "decision": "approved"},
                    {"tool": "device.wipe", "decision": "answered"},
                ],
                "text_contains": '{"wiped": true}',
            },
        }
    )
    suite = Suite(name="t", domain=Agent("wiper", tools=[wipe]), scenarios=[scenario])
    (result,) = asyncio.run(run_suite(suite)).scenarios
    assert result.failures == []
    assert result.outcome == "completed"


def test_indexes_count_the_waiting_calls_in_the_order_the_model_proposed_them() -> None:
    def both(request: ModelRequest) -> Step:
        last = request.messages[-1]
        if last.role == "user":  # the lookup asks as it runs: its card comes after the cancel's
            return [call("orders.lookup", order_id="A1"), call("orders.cancel", order_id="A1")]
        return " / ".join(f"{c.name}: {c.result.ok}" for c in last.tool_calls if c.result)

    scenario = Scenario.model_validate(
        {
            "name": "ordered",
            "turns": [
                "Where is A1? And cancel it.",
                {"decisions": [{"answer": 0, "output": "Leeds"}, {"reject": 1}]},
            ],
            "mocks": {"orders.lookup": {"ask": "Which warehouse?", "output": "shipped"}},
            "model": {"function": both},
            "expect": {
                "proposed": [
                    {"tool": "orders.lookup", "decision": "answered"},
                    {"tool": "orders.cancel", "decision": "rejected"},
                ],
                "text_contains": "orders.lookup: True / orders.cancel: False",
            },
        }
    )
    (result,) = asyncio.run(
        run_suite(Suite(name="t", domain=agent, scenarios=[scenario]))
    ).scenarios
    assert result.failures == []


def test_expect_refused_expects_a_refused_amendment_or_an_invalid_decision() -> None:
    refused_amendment = {
        "approve": 0,
        "amend": {"order_id": "Z9"},
        "expect_refused": "cannot be amended",
        "by": "bo",
    }
    invalid = {"answer": 0, "output": 1, "expect_refused": "one of approve, reject", "by": "bo"}
    then = {"approve": 0, "amend": {"amount": 40}}
    got = failures(
        {"decisions": [refused_amendment, invalid, then, *OTHERS]},
        outcome="completed",
        called=[{"tool": "orders.refund", "args": {"order_id": "A1", "amount": 40}}],
    )
    assert got == []
    # Refused, and nothing recorded: the call still waits, and a later turn decides it.
    got = failures(
        {"decisions": [refused_amendment, *OTHERS]},
        {"decisions": [then]},
        outcome="completed",
        proposed=[{"tool": "orders.refund", "decision": "amended"}],
    )
    assert got == []


def test_an_expected_refusal_that_is_not_one_or_not_for_those_words_fails() -> None:
    wrong_words = {
        "approve": 0,
        "amend": {"order_id": "Z9"},
        "expect_refused": "four eyes",
        "by": "bo",
    }
    assert failures({"decisions": [wrong_words, *OTHERS]}) == [
        (
            "run",
            "turn 2: decisions[0] (approve [0] by bo): refused, but not for 'four eyes': "
            "Call call_1 (orders.refund): order_id cannot be amended (amendable: amount).",
        )
    ]
    valid = {"approve": 0, "expect_refused": True, "by": "bo"}
    assert failures({"decisions": [valid, *OTHERS]}) == [
        (
            "run",
            "turn 2: decisions[0] (approve [0] by bo): expected a refusal, but the policy let bo "
            "make it, and it was recorded",
        )
    ]
