"""Running a suite: each scenario on its own engine and store, a few at a time.

Every scenario gets a fresh `Engine` over a `MemoryStore`, fresh models (wrapped to count
their calls), its mocks as `wrap_tools`, and sequential ids, so a scripted scenario runs the
same way every time, whatever else runs beside it. Results come back in the suite's order.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

from pydantic_core import to_jsonable_python

from .._agent_spec import AgentSpec
from .._captured import BATCH_TOOL
from ..engine import Domain, Engine
from ..events import (
    ApprovalRequired,
    ClientExecRequired,
    Event,
    InputRequired,
    RunFailed,
    ToolCallCompleted,
    ToolCallStarted,
)
from ..exceptions import InvalidDecisionError
from ..messages import ApprovalCardPart, ToolCallPart
from ..models import Model
from ..runtime import Runtime, sequential_ids
from ..store import MemoryStore
from ..suspension import Answer, Approve, ClientResult, Decision, Reject
from ._check import Call, Proposal, Transcript, TurnRecord, check
from ._config import AgentConfig, configure
from ._judge import judge
from ._load import as_domain, check_suite, import_target
from ._mocks import wrap_tools
from ._models import CountingModel, Tally, build_model, close, unplayed
from ._result import Failure, ScenarioResult, SuiteResult
from ._suite import DecisionSpec, ModelSpec, Scenario, Suite, Turn

__all__ = ["run_suite"]


async def run_suite(
    suite: Suite,
    *,
    concurrency: int | None = None,
    config: AgentConfig | None = None,
    on_result: Callable[[ScenarioResult], None] | None = None,
) -> SuiteResult:
    """Run every scenario of `suite` and return the results in the suite's order.

    Args:
        suite: the suite (from `load_suite`, or built in Python).
        concurrency: scenarios run at once (default: the suite's `concurrency`).
        config: an agent configuration to run the suite on (see `handrail.evals.AgentConfig`).
        on_result: called with each result as its scenario finishes (a progress bar).

    Raises:
        SuiteError: the suite's domain (`module:attr` is imported) is not a Domain or Agent, a
            scenario names tools or routes it does not have, or the configuration names
            agents it does not have.
    """
    where = suite.name or "suite"
    if isinstance(suite.domain, str) or isinstance(suite.deps, str):
        suite = suite.model_copy(
            update={
                "domain": import_target(suite.domain, f"{where}: domain"),
                "deps": import_target(suite.deps, f"{where}: deps"),
            }
        )
    check_suite(suite, where)
    domain = as_domain(suite.domain, f"{where}: domain")
    if config is not None:
        if config.domain is not None:
            domain = as_domain(config.domain, f"{config.name}: domain")
        domain = configure(domain, config, config.name or "configuration")
    limit = asyncio.Semaphore(concurrency or suite.concurrency)
    results: list[ScenarioResult | None] = [None] * len(suite.scenarios)

    async def one(index: int, scenario: Scenario) -> None:
        async with limit:
            result = await _run(suite, scenario, domain, config, index)
        results[index] = result
        if on_result is not None:
            on_result(result)

    async with asyncio.TaskGroup() as group:
        for index, scenario in enumerate(suite.scenarios):
            group.create_task(one(index, scenario))
    done = [r for r in results if r is not None]
    return SuiteResult(
        suite=where, scenarios=done, config=config.name if config is not None else None
    )


async def _run(
    suite: Suite,
    scenario: Scenario,
    domain: Domain,
    config: AgentConfig | None,
    index: int,
) -> ScenarioResult:
    where = f"{suite.name}: scenario {scenario.name!r}"
    tally = Tally()
    models: list[Model] = []
    seen = Transcript()
    started = time.perf_counter()
    try:
        spec = scenario.model or (config.model if config else None) or suite.model
        default = build_model(spec, tally, where) if spec is not None else None
        if default is not None:
            models.append(default)
        counted = _counted_domain(domain, config, tally, models, where)
        deps = suite.deps() if callable(suite.deps) else suite.deps
        engine = Engine(
            counted,
            store=MemoryStore(),
            runtime=Runtime(deps=deps, ids=sequential_ids()),
            mode=scenario.mode,
            model=default,
            wrap_tools=wrap_tools(scenario.mocks) or None,
        )
        await _play(engine, scenario, seen, index)
    except Exception as exc:
        seen.error = f"{type(exc).__name__}: {exc}"
    latency = time.perf_counter() - started
    failures = check(scenario.expect, seen, model_calls=tally.calls, tokens=tally.tokens)
    if seen.error is None:
        for model in models:
            why = unplayed(model)
            if why is not None:
                failures.append(Failure(assertion="model", reason=why))
    verdict = None
    rubric = scenario.expect.judge
    if rubric is not None and seen.error is None:
        spec = rubric.model or suite.judge_model
        try:
            if spec is None:
                raise _NoJudge("no judge model: give judge.model or judge_model")
            judge_model = build_model(spec, Tally(), where)
            models.append(judge_model)
            calls = [(c.tool, c.args) for c in seen.calls]
            turns = [(t.text, t.answer) for t in seen.turns]
            asked = [(p.tool, p.args, p.decision) for p in seen.proposals]
            found = await judge(rubric.rubric, turns, calls, judge_model, asked)
        except Exception as exc:
            why = str(exc) if isinstance(exc, _NoJudge) else f"{type(exc).__name__}: {exc}"
            failures.append(Failure(assertion="judge", reason=why))
        else:
            verdict = found.reason
            if not found.passed:
                failures.append(Failure(assertion="judge", reason=found.reason))
    for model in models:
        with contextlib.suppress(Exception):  # a client that fails to close fails nothing
            await close(model)
    return ScenarioResult(
        name=scenario.name,
        failures=failures,
        outcome=seen.turns[-1].outcome if seen.turns else None,
        routes=[t.route for t in seen.turns],
        model_calls=tally.calls,
        tokens=tally.tokens,
        latency=latency,
        judge=verdict,
    )


class _NoJudge(Exception):
    pass


def _counted_domain(
    domain: Domain,
    config: AgentConfig | None,
    tally: Tally,
    models: list[Model],
    where: str,
) -> Domain:
    """The domain with every agent's own model (or the configuration's) counted into `tally`."""
    overrides = config.agents if config is not None else {}

    def counted(agent: AgentSpec[Any]) -> AgentSpec[Any]:
        override = overrides.get(agent.name)
        spec: ModelSpec | None = override.model if override is not None else None
        model: Model | None
        if spec is not None:
            model = build_model(spec, tally, f"{where}: agent {agent.name!r}")
        elif agent.model is not None:
            model = CountingModel(agent.model, tally)
        else:
            return agent
        models.append(model)
        clone = copy.copy(agent)
        clone.model = model
        return clone

    everyone = [*domain.agents, *([domain.supervisor] if domain.supervisor else [])]
    if all(a.model is None and a.name not in overrides for a in everyone):
        return domain
    return dataclasses.replace(
        domain,
        agents=[counted(a) for a in domain.agents],
        supervisor=counted(domain.supervisor) if domain.supervisor is not None else None,
    )


async def _play(engine: Engine, scenario: Scenario, seen: Transcript, index: int) -> None:
    session = f"eval-{index}"
    suspended = False
    made: dict[str, Proposal] = {}  # answered calls: made once their answer settles them
    started: set[str] = set()
    for number, turn in enumerate(scenario.turns, 1):
        if suspended != turn.deciding:
            seen.error = (
                f"turn {number - 1} suspended (waiting on {_waiting(seen)}), so turn {number} "
                f"could not be sent; follow it with a decision (decide: approve | reject | "
                f"answer, or decisions: [...]) or end the scenario there"
                if suspended
                else f"turn {number} decides, but nothing waits for a decision"
            )
            return
        org_id, user_id = turn.org_id, turn.user_id
        if turn.deciding:
            try:
                await _decide(engine, session, turn, seen, made)
            except _Undecidable as exc:
                seen.error = f"turn {number}: {exc}"
                return
        record = TurnRecord(text=turn.label)
        seen.turns.append(record)
        if turn.text is not None and scenario.mode == "capture":
            headless = await engine.run_headless(
                session, turn.text, org_id=org_id, user_id=user_id, route=turn.route
            )
            events: list[Event] = list(headless.events)
            record.outcome = headless.outcome
            record.answer = headless.text
            record.output = _jsonable(headless.output)
            seen.actions += [Call(tool=a.tool, args=dict(a.args)) for a in headless.actions]
        else:
            if turn.text is not None:
                run = engine.submit(
                    session,
                    turn.text,
                    org_id=org_id,
                    user_id=user_id,
                    route=turn.route,
                    client=scenario.client,
                )
            else:
                run = engine.resume(session, org_id=org_id, user_id=user_id, client=scenario.client)
            events = [event async for event in run]
            result = run.result
            record.outcome = result.outcome
            output = result.output
            record.answer = output if isinstance(output, str) else ""
            record.output = None if isinstance(output, str) else _jsonable(output)
            record.error = result.error
        if record.output is not None and not record.answer:
            record.answer = json.dumps(record.output, ensure_ascii=False, sort_keys=True)
        for event in events:
            if isinstance(event, ToolCallStarted):
                started.add(event.tool_call_id)
                seen.calls.append(Call(tool=event.name, args=event.args))
            elif isinstance(event, ToolCallCompleted):
                answered = made.pop(event.tool_call_id, None)
                if answered is not None and event.tool_call_id not in started:
                    # A person answered it, or the client ran it: made, though not here.
                    seen.calls.append(Call(tool=answered.tool, args=answered.args))
            elif isinstance(event, ApprovalRequired | InputRequired | ClientExecRequired):
                if event.name == BATCH_TOOL:  # the card of a run's captured actions
                    seen.approvals.append(event.name)
                    continue
                # A call that waits is only proposed: it is made once it is decided (if it
                # is approved or answered), and shows among the calls then.
                seen.proposals.append(
                    Proposal(tool=event.name, args=event.args, tool_call_id=event.tool_call_id)
                )
                if isinstance(event, ApprovalRequired):
                    seen.approvals.append(event.name)
            elif isinstance(event, RunFailed) and record.error is None:
                record.error = event.error or event.reason
        record.route = await _route(engine, session, turn.route, org_id, user_id)
        suspended = record.outcome == "suspended"


class _Undecidable(Exception):
    """A decision turn that does not fit the calls that wait: nothing was decided."""


async def _decide(
    engine: Engine, session: str, turn: Turn, seen: Transcript, made: dict[str, Proposal]
) -> None:
    """Decide the calls the session waits on, as the decision turn says, all or none.

    Raises:
        _Undecidable: a decision names no waiting call (or several), two decide the same
            call, a waiting call has no decision, or the engine refuses one.
    """
    scope = {"org_id": turn.org_id, "user_id": turn.user_id}
    state = await engine.session(session, **scope)
    asked = [p.id for m in state.all_messages() for p in m.parts if isinstance(p, ToolCallPart)]
    order = {call: position for position, call in enumerate(asked)}
    waiting = sorted(state.pending.values(), key=lambda c: order.get(c.tool_call_id, len(order)))
    chosen: dict[str, tuple[str, Decision]] = {}
    if turn.decide is not None:
        for card in waiting:
            chosen[card.tool_call_id] = _decision(
                turn.decide, card, amend=turn.amend, reason=turn.reason, output=turn.output
            )
    else:
        assert turn.decisions is not None
        by: dict[str, int] = {}
        for number, spec in enumerate(turn.decisions):
            card = _target(spec, waiting, f"decisions[{number}] ({spec.label})")
            if card.tool_call_id in by:
                raise _Undecidable(
                    f"decisions[{by[card.tool_call_id]}] and decisions[{number}] both decide "
                    f"{_show(waiting, card)}; a call is decided once"
                )
            by[card.tool_call_id] = number
            chosen[card.tool_call_id] = _decision(
                spec.kind, card, amend=spec.amend, reason=spec.reason, output=spec.output
            )
        undecided = [c for c in waiting if c.tool_call_id not in chosen]
        if undecided:
            raise _Undecidable(
                f"{len(chosen)} of {len(waiting)} waiting calls decided; no decision for "
                f"{'; '.join(_show(waiting, c) for c in undecided)} (add one to decisions, "
                f"or decide every call alike with decide: approve | reject | answer)"
            )
    try:
        await engine.resolve_many(
            session,
            {call: decision for call, (_, decision) in chosen.items()},
            org_id=turn.org_id,
            user_id=turn.user_id,
        )
    except InvalidDecisionError as exc:
        raise _Undecidable(str(exc)) from None
    for call, (fate, _) in chosen.items():
        proposal = next((p for p in reversed(seen.proposals) if p.tool_call_id == call), None)
        if proposal is None:  # its card came with no event this scenario saw
            card = next(c for c in waiting if c.tool_call_id == call)
            proposal = Proposal(tool=card.tool_name, args=card.args, tool_call_id=call)
            seen.proposals.append(proposal)
        proposal.decision = fate
        if fate == "answered":
            made[call] = proposal


def _decision(
    kind: str, card: ApprovalCardPart, *, amend: Any, reason: str | None, output: Any
) -> tuple[str, Decision]:
    """The engine's decision for `card`, and the fate it gives the proposal."""
    if kind == "approve":
        return ("amended" if amend else "approved"), Approve(amended_args=amend)
    if kind == "reject":
        return "rejected", Reject(reason=reason)
    if card.kind == "client_exec":
        return "answered", ClientResult(output=output)
    return "answered", Answer(output=output)


def _target(spec: DecisionSpec, waiting: list[ApprovalCardPart], label: str) -> ApprovalCardPart:
    target = spec.target
    listed = "; ".join(_show(waiting, c) for c in waiting) or "none"
    if isinstance(target, int):
        if target >= len(waiting):
            raise _Undecidable(f"{label}: no waiting call [{target}] (waiting: {listed})")
        return waiting[target]
    same = [c for c in waiting if c.tool_name == target]
    if not same:
        raise _Undecidable(f"{label}: no call of {target} waits (waiting: {listed})")
    if len(same) > 1:
        where = ", ".join(f"[{waiting.index(c)}]" for c in same)
        raise _Undecidable(
            f"{label}: {len(same)} calls of {target} wait ({where}): name each by its index "
            f"(waiting: {listed})"
        )
    return same[0]


def _show(waiting: list[ApprovalCardPart], card: ApprovalCardPart) -> str:
    args = json.dumps(card.args, ensure_ascii=False, sort_keys=True, default=str)
    return f"[{waiting.index(card)}] {card.tool_name} {args}"


def _waiting(seen: Transcript) -> str:
    names = [p.tool for p in seen.proposals if p.decision == "undecided"]
    return ", ".join(names) or "a decision"


async def _route(
    engine: Engine, session: str, asked: str | None, org_id: str | None, user_id: str | None
) -> str | None:
    """The route the turn took: the session's `RouteChoice`, else the one asked for."""
    state = await engine.session(session, org_id=org_id, user_id=user_id)
    if state.route is not None:
        return state.route.route
    if asked is not None or engine.domain.supervisor is None:
        return asked or engine.domain.default_route
    return None  # the supervisor never decided (the run failed first)


def _jsonable(value: Any) -> Any:
    return None if value is None else to_jsonable_python(value)
