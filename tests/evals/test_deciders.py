"""Scenarios that name who decides (`by:`), so a tool's `DecisionPolicy` is exercised.

A finance decider approves; the requester may not approve their own call (four eyes), nor
may someone without the role; a suite can expect such a refusal; two people approve a call
that needs two approvals; a decision without `by:` on a policy-gated call says which YAML
field to add.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from handrail import Agent, DecisionPolicy, tool
from handrail.cli import app
from handrail.evals import Scenario, Suite, SuiteError, load_suite, run_suite
from handrail.models import ModelRequest
from handrail.testing import Step, call

FINANCE = DecisionPolicy(roles={"finance"}, four_eyes=True)


@tool(name="expenses.approve", permission="write", decision_policy=FINANCE, amendable=["amount"])
def approve(claim: str, amount: int) -> dict[str, Any]:
    """Approve an expense claim (finance decides; never the claimant)."""
    raise AssertionError("mocked")


@tool(
    name="expenses.pay_out",
    permission="destructive",
    decision_policy=DecisionPolicy(roles={"finance"}, approvals=2),
)
def pay_out(claim: str) -> dict[str, Any]:
    """Pay a claim out (two people of finance approve)."""
    raise AssertionError("mocked")


@tool(
    name="expenses.refund",
    permission="destructive",
    amendable=["amount"],
    decision_policy=DecisionPolicy(roles={"finance"}, approvals=2),
)
def refund(claim: str, amount: int) -> dict[str, Any]:
    """Refund part of a claim (two people of finance approve the same amount)."""
    raise AssertionError("mocked")


@tool(name="expenses.note", permission="write")
def note(claim: str) -> str:
    """Add a note to a claim (no policy: the claimant decides)."""
    raise AssertionError("mocked")


def desk(request: ModelRequest) -> Step:
    """Asks for the tool the user names, then reports what each call returned."""
    last = request.messages[-1]
    if last.role == "user":
        if "pay" in last.text:
            return call("expenses.pay_out", claim="C1")
        if "refund" in last.text:
            return call("expenses.refund", claim="C1", amount=42)
        if "note" in last.text:
            return call("expenses.note", claim="C1")
        return call("expenses.approve", claim="C1", amount=42)
    result = last.tool_calls[0].result
    assert result is not None
    return f"done: {result.data}" if result.ok else f"not done: {result.error}"


agent = Agent("expenses", tools=[approve, pay_out, refund, note])
MOCKS = {
    "expenses.approve": {"output": {"approved": "C1"}},
    "expenses.pay_out": {"output": {"paid": "C1"}},
    "expenses.refund": {"output": {"refunded": "C1"}},
    "expenses.note": {"output": "noted"},
}
FIONA = {"user_id": "fiona", "roles": ["finance"]}
GUS = {"user_id": "gus", "roles": ["finance"]}
ED = {"user_id": "ed", "roles": ["finance"]}  # the claimant, who is in finance himself


def scenario(*turns: Any, name: str = "s", **expect: Any) -> Scenario:
    return Scenario.model_validate(
        {
            "name": name,
            "turns": [{"text": "Approve my taxi claim C1", "user_id": "ed"}, *turns],
            "mocks": MOCKS,
            "model": {"function": desk},
            "expect": expect,
        }
    )


def failures(*turns: Any, **expect: Any) -> list[tuple[str, str]]:
    suite = Suite(name="t", domain=agent, scenarios=[scenario(*turns, **expect)])
    (result,) = asyncio.run(run_suite(suite)).scenarios
    return [(f.assertion, f.reason) for f in result.failures]


def test_a_finance_decider_approves_and_the_call_runs() -> None:
    got = failures(
        {"decisions": [{"approve": "expenses.approve", "by": FIONA, "amend": {"amount": 40}}]},
        outcome="completed",
        called=[{"tool": "expenses.approve", "args": {"amount": 40}}],
        proposed=[{"tool": "expenses.approve", "decision": "amended"}],
        text_contains="done: {'approved': 'C1'}",
    )
    assert got == []
    # The turn's `by` decides every call of a `decide:` turn alike.
    assert failures({"decide": "approve", "by": FIONA}, called="expenses.approve") == []


def test_the_requester_approving_their_own_call_fails_the_scenario_naming_the_rule() -> None:
    got = failures({"decisions": [{"approve": 0, "by": ED}]}, not_called="expenses.approve")
    assert got == [
        (
            "run",
            "turn 2: decisions[0] (approve [0] by ed) was refused: expenses.approve needs four "
            "eyes: ed requested the call and may not approve it; someone else must. (if the "
            "suite expects that, add expect_refused: true to the decision)",
        )
    ]
    got = failures({"decide": "approve", "by": {"user_id": "di", "roles": "sales"}})
    assert got == [
        (
            "run",
            "turn 2: decide: approve ([0] expenses.approve, by di) was refused: "
            "expenses.approve needs the role finance; di has none of them (sales). (if the "
            "suite expects that, add expect_refused: true to the decision)",
        )
    ]


def test_without_by_a_policy_gated_call_says_which_field_of_the_suite_names_the_decider() -> None:
    assert failures({"decisions": [{"approve": "expenses.approve"}]}) == [
        (
            "run",
            "turn 2: decisions[0] (approve expenses.approve): expenses.approve has a decision "
            "policy (roles: finance; four eyes), so the suite must name who decides its calls: add "
            "by: {user_id: ..., roles: [...]} to the decision (or the turn)",
        )
    ]
    assert failures({"decide": "reject"})[0][1].endswith(
        "add by: {user_id: ..., roles: [...]} to the turn"
    )


def test_without_by_a_call_with_no_policy_is_decided_by_the_scenario_user_as_before() -> None:
    noted = {"text": "Add a note to C1", "user_id": "ed"}
    suite = Suite(
        name="t",
        domain=agent,
        scenarios=[
            Scenario.model_validate(
                {
                    "name": name,
                    "turns": [noted, {"decide": "approve", **extra}],
                    "mocks": MOCKS,
                    "model": {"function": desk},
                    "expect": {"called": "expenses.note"},
                }
            )
            for name, extra in [("trusted", {}), ("ed", {"by": "ed"}), ("fiona", {"by": FIONA})]
        ],
    )
    trusted, himself, other = asyncio.run(run_suite(suite)).scenarios
    assert trusted.failures == [] and himself.failures == []
    assert other.failures[0].reason == (
        "turn 2: decide: approve ([0] expenses.note, by fiona) was refused: expenses.note has "
        "no decision policy, so only ed, who requested the call, decides it; fiona may not. "
        "Give the tool a decision_policy= (or the domain policies=) to let others decide. (if "
        "the suite expects that, add expect_refused: true to the decision)"
    )


def test_an_expected_refusal_passes_and_the_call_waits_for_someone_allowed() -> None:
    refused = {"approve": 0, "by": ED, "expect_refused": "four eyes"}
    assert (
        failures(
            {"decisions": [refused, {"approve": 0, "by": FIONA}]},
            outcome="completed",
            called="expenses.approve",
            proposed=[{"tool": "expenses.approve", "decision": "approved"}],
        )
        == []
    )
    # A turn of refusals only leaves the call waiting: the scenario may end there...
    assert (
        failures(
            {"decisions": [refused]},
            outcome="suspended",
            not_called="expenses.approve",
            proposed=[{"tool": "expenses.approve", "decision": "undecided"}],
        )
        == []
    )
    # ... or the next decision turn decides it.
    assert (
        failures(
            {"decide": "approve", "by": {"user_id": "di"}, "expect_refused": True},
            {"decisions": [{"reject": "expenses.approve", "by": GUS, "reason": "no receipt"}]},
            outcome="completed",
            route=["default", "default", "default"],
            proposed=[{"tool": "expenses.approve", "decision": "rejected"}],
        )
        == []
    )


def test_an_expected_refusal_that_is_not_refused_or_not_for_that_rule_fails() -> None:
    assert failures({"decisions": [{"approve": 0, "by": FIONA, "expect_refused": True}]}) == [
        (
            "run",
            "turn 2: decisions[0] (approve [0] by fiona): expected a refusal, but the policy let "
            "fiona make it, and it was recorded",
        )
    ]
    wrong_rule = {"approve": 0, "by": {"user_id": "di"}, "expect_refused": "four eyes"}
    assert failures({"decisions": [wrong_rule]}) == [
        (
            "run",
            "turn 2: decisions[0] (approve [0] by di): refused, but not for 'four eyes': "
            "expenses.approve needs the role finance; di has none of them (no role).",
        )
    ]


def test_two_approvals_by_two_people_run_a_call_that_needs_two() -> None:
    pay = {"text": "Please pay C1 out", "user_id": "ed"}

    def paid(name: str, *turns: Any, **expect: Any) -> Scenario:
        return Scenario.model_validate(
            {
                "name": name,
                "turns": [pay, *turns],
                "mocks": MOCKS,
                "model": {"function": desk},
                "expect": expect,
            }
        )

    one_turn = paid(
        "one-turn",
        {
            "decisions": [
                {"approve": "expenses.pay_out", "by": FIONA},
                {"approve": "expenses.pay_out", "by": GUS},
            ]
        },
        outcome="completed",
        called="expenses.pay_out",
        proposed=[{"tool": "expenses.pay_out", "decision": "approved"}],
    )
    two_turns = paid(
        "two-turns",
        {"decide": "approve", "by": FIONA},
        {"decide": "approve", "by": GUS},
        outcome="completed",
        route=["default", "default", "default"],
        called="expenses.pay_out",
    )
    halfway = paid(
        "halfway",
        {"decide": "approve", "by": FIONA},
        outcome="suspended",
        not_called="expenses.pay_out",
        proposed=[{"tool": "expenses.pay_out", "decision": "undecided"}],
    )
    again = paid(
        "again",
        {"decide": "approve", "by": FIONA},
        {
            "decisions": [
                {"approve": 0, "by": FIONA, "expect_refused": "already approved"},
                {"approve": 0, "by": GUS},
            ]
        },
        called="expenses.pay_out",
    )
    same = paid(
        "same",
        {"decisions": [{"approve": 0, "by": FIONA}, {"approve": 0, "by": FIONA}]},
    )
    suite = Suite(name="t", domain=agent, scenarios=[one_turn, two_turns, halfway, again, same])
    results = asyncio.run(run_suite(suite)).scenarios
    assert [r.failures for r in results[:4]] == [[], [], [], []]
    assert [r.outcome for r in results] == [
        "completed",
        "completed",
        "suspended",
        "completed",
        "suspended",
    ]
    assert [(f.assertion, f.reason) for f in results[4].failures] == [
        (
            "run",
            'turn 2: decisions[0] and decisions[1] both approve [0] expenses.pay_out {"claim": '
            '"C1"} as the same person; approvals that add up are by different people: give '
            "each its by: {user_id: ...}",
        )
    ]


runner = CliRunner()

DOMAIN_MODULE = '''
from handrail import Agent, DecisionPolicy, tool
from handrail.testing import call


@tool(name="expenses.approve", permission="write",
      decision_policy=DecisionPolicy(roles={"finance"}, four_eyes=True))
def approve(claim: str) -> dict:
    """Approve a claim."""
    raise AssertionError("mocked")


def script(request):
    last = request.messages[-1]
    if last.role == "user":
        return call("expenses.approve", claim="C1")
    return "done" if last.tool_calls[0].result.ok else "refused"


agent = Agent("expenses", tools=[approve])
'''

SUITE = """\
domain: expense_evals_domain:agent
model: {function: "expense_evals_domain:script"}
scenarios:
  - name: finance-approves
    turns:
      - {text: Approve my claim C1, user_id: ed}
      - decisions:
          - {approve: 0, by: {user_id: ed, roles: [finance]}, expect_refused: four eyes}
          - {approve: expenses.approve, by: {user_id: fiona, roles: [finance]}}
    mocks: {expenses.approve: {output: {approved: C1}}}
    expect: {called: expenses.approve, text_contains: done}
"""


def test_the_command_runs_a_suite_whose_decisions_name_their_decider(tmp_path: Path) -> None:
    (tmp_path / "expense_evals_domain.py").write_text(DOMAIN_MODULE, encoding="utf-8")
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE, encoding="utf-8")
    result = runner.invoke(app, ["eval", str(path)])
    assert result.exit_code == 0, result.output
    assert "1 passed, 0 failed" in result.stdout


BAD_BY = """\
domain: handrail.demo.support_desk:support_domain
scenarios:
  - name: refund
    turns:
      - {text: Refund A1042, user_id: ed, by: fiona}
      - decisions:
          - {approve: orders.refund, by: {user_id: fiona, role: finance}}
          - {reject: 0, by: {roles: [finance]}}
          - {approve: 1, by: {user_id: gus, roles: [""]}, expect_refused: ""}
      - {decide: approve, by: [fiona]}
  - name: alone
    turns:
      - Refund A1042
      - decisions: [{approve: 0, expect_refused: true}]
"""


def test_every_problem_of_a_by_is_listed(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(BAD_BY), encoding="utf-8")
    with pytest.raises(SuiteError) as caught:
        load_suite(path)
    assert str(caught.value) == (
        f"{path}: 7 problems:\n"
        "  scenario 'refund': turns[0]: by and expect_refused go with a decision, not a "
        "message\n"
        "  scenario 'refund': turns[1].decisions[0].by.role: Extra inputs are not permitted\n"
        "  scenario 'refund': turns[1].decisions[1].by.user_id: Field required\n"
        "  scenario 'refund': turns[1].decisions[2].by.roles[0]: String should have at least "
        "1 character\n"
        "  scenario 'refund': turns[1].decisions[2].expect_refused: expect_refused: true, or "
        "words the refusal must contain\n"
        "  scenario 'refund': turns[2].by: give the person as {user_id: fiona, roles: "
        "[finance]}, or fiona\n"
        "  scenario 'alone': turns[1]: decisions[0]: expect_refused needs by: the person "
        "refused (on the decision, or on the turn)"
    )


def test_an_amendment_by_the_first_approver_is_what_the_second_approves_and_what_runs() -> None:
    """Each scripted person decides on the card as it stands when they decide."""
    refund_turn = {"text": "Please refund C1", "user_id": "ed"}
    for turns in (
        [
            {
                "decisions": [
                    {"approve": "expenses.refund", "by": FIONA, "amend": {"amount": 30}},
                    {"approve": "expenses.refund", "by": GUS},
                ]
            }
        ],
        [
            {"decide": "approve", "by": FIONA, "amend": {"amount": 30}},
            {"decide": "approve", "by": GUS},
        ],
    ):
        got = Scenario.model_validate(
            {
                "name": "amended-then-approved",
                "turns": [refund_turn, *turns],
                "mocks": MOCKS,
                "model": {"function": desk},
                "expect": {
                    "outcome": "completed",
                    "called": [{"tool": "expenses.refund", "args": {"amount": 30}}],
                    "proposed": [{"tool": "expenses.refund", "decision": "amended"}],
                },
            }
        )
        suite = Suite(name="t", domain=agent, scenarios=[got])
        (result,) = asyncio.run(run_suite(suite)).scenarios
        assert [(f.assertion, f.reason) for f in result.failures] == []
