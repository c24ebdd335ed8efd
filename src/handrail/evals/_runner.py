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
from ..apps import open_app
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
from ..exceptions import (
    DecisionNotAllowedError,
    InvalidContextError,
    InvalidDecisionError,
    StaleResolutionError,
    UserError,
)
from ..messages import ApprovalCardPart, ToolCallPart
from ..models import Model
from ..policy import Decider, policy_for
from ..runtime import Runtime, sequential_ids
from ..state import RunState
from ..store import MemoryStore
from ..suspension import Answer, Approve, ClientResult, Decision, Reject, current_digest
from ._check import Call, Proposal, ToolFailure, Transcript, TurnRecord, check
from ._config import AgentConfig, configure
from ._judge import judge
from ._load import SuiteError, as_domain, check_suite, import_target
from ._mocks import wrap_tools
from ._models import CountingModel, Tally, build_model, close, unplayed
from ._result import Failure, ScenarioResult, SuiteResult
from ._suite import DeciderSpec, DecisionSpec, ModelSpec, Scenario, Suite, Turn

__all__ = ["run_suite"]


async def run_suite(
    suite: Suite,
    *,
    concurrency: int | None = None,
    config: AgentConfig | None = None,
    on_result: Callable[[ScenarioResult], None] | None = None,
) -> SuiteResult:
    """Run every scenario of `suite` and return the results in the suite's order.

    A suite that names an application (`app`) has it opened (`handrail.apps.open_app`) in
    this event loop before the first scenario, and closed after the last.

    Args:
        suite: the suite (from `load_suite`, or built in Python).
        concurrency: scenarios run at once (default: the suite's `concurrency`).
        config: an agent configuration to run the suite on (see `handrail.evals.AgentConfig`).
        on_result: called with each result as its scenario finishes (a progress bar).

    Raises:
        SuiteError: the suite's application cannot be opened (its error told in one line),
            its domain (`module:attr` is imported) is not a Domain or Agent, a scenario
            names tools or routes it does not have, or the configuration names
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
    if suite.app is None:
        return await _run_suite(suite, None, concurrency, config, on_result)
    async with contextlib.AsyncExitStack() as stack:
        try:
            app = await stack.enter_async_context(open_app(suite.app))
        except UserError as exc:
            raise SuiteError(f"{where}: app: {exc}") from exc
        return await _run_suite(suite, app, concurrency, config, on_result)


async def _run_suite(
    suite: Suite,
    app: Engine | None,
    concurrency: int | None,
    config: AgentConfig | None,
    on_result: Callable[[ScenarioResult], None] | None,
) -> SuiteResult:
    where = suite.name or "suite"
    if app is not None:
        domain = app.domain
        check_suite(suite, where, domain)
    else:
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
            result = await _run(suite, scenario, domain, config, index, app)
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
    app: Engine | None = None,
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
        runtime: Runtime[Any] = Runtime(deps=deps, ids=sequential_ids())
        if app is not None:  # the application's runtime, its deps unless the suite gives some
            if suite.deps is None:
                deps = app.runtime.deps
            runtime = dataclasses.replace(app.runtime, deps=deps, ids=sequential_ids())
            fallback = app.assembly.default_model or runtime.model
            if default is None and fallback is not None and not isinstance(fallback, str):
                default = CountingModel(fallback, tally)  # the app's: closed by the app
        engine = Engine(
            counted,
            store=MemoryStore(),
            runtime=runtime,
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
            captured = [(a.tool, a.args) for a in seen.actions]
            found = await judge(rubric.rubric, turns, calls, judge_model, asked, captured)
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
    amended: set[str] = set()  # calls an approval amended, while they wait for more approvals
    started: set[str] = set()
    captured: set[str] = set()  # calls capture mode recorded instead of running
    first = scenario.turns[0]
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
        # The session's caller is the same on every turn: a turn that names none is theirs.
        org_id = turn.org_id if turn.org_id is not None else first.org_id
        user_id = turn.user_id if turn.user_id is not None else first.user_id
        record = TurnRecord(text=turn.label)
        if turn.deciding:
            try:
                ready = await _decide(engine, session, turn, (org_id, user_id), seen, made, amended)
            except _Undecidable as exc:
                seen.error = f"turn {number}: {exc}"
                return
            if not ready:  # a call waits for another approval, or a refusal left it waiting
                record.outcome = "suspended"
                record.route = await _route(engine, session, None, org_id, user_id)
                seen.turns.append(record)
                continue
        seen.turns.append(record)
        context = turn.context if turn.context is not None else scenario.context
        if turn.text is not None:
            try:  # validated as a live turn's is: a context that does not fit fails the case
                engine.domain.check_context(context, route=turn.route)
            except InvalidContextError as exc:
                seen.error = f"turn {number}: {exc}"
                return
        if turn.text is not None and scenario.mode == "capture":
            headless = await engine.run_headless(
                session,
                turn.text,
                org_id=org_id,
                user_id=user_id,
                route=turn.route,
                roles=turn.roles,
                context=context,
            )
            events: list[Event] = list(headless.events)
            record.outcome = headless.outcome
            record.answer = headless.text
            record.output = _jsonable(headless.output)
            seen.actions += [Call(tool=a.tool, args=dict(a.args)) for a in headless.actions]
            # A captured call did not run: it is an action (`captured`), not a call made.
            captured.update(a.call_id for a in headless.actions)
        else:
            if turn.text is not None:
                run = engine.submit(
                    session,
                    turn.text,
                    org_id=org_id,
                    user_id=user_id,
                    route=turn.route,
                    client=scenario.client,
                    roles=turn.roles,
                    context=context,
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
                if event.tool_call_id in captured:
                    continue
                started.add(event.tool_call_id)
                seen.calls.append(Call(tool=event.name, args=event.args))
            elif isinstance(event, ToolCallCompleted):
                if not event.ok:
                    seen.failures.append(
                        ToolFailure(tool=event.name, code=event.code, error=event.error)
                    )
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
    """A decision turn the scenario cannot go on from: the scenario stops there.

    Its decisions do not fit the calls that wait (then nothing was decided), or one was
    refused, or recorded, against the suite's expectation.
    """


@dataclasses.dataclass(kw_only=True, slots=True)
class _Choice:
    """One decision of a decision turn: the card it decides, how, and by whom."""

    label: str
    card: ApprovalCardPart
    kind: str
    fate: str
    decision: Decision
    by: DeciderSpec | None
    refused: bool | str


async def _decide(
    engine: Engine,
    session: str,
    turn: Turn,
    scope: tuple[str | None, str | None],
    seen: Transcript,
    made: dict[str, Proposal],
    amended: set[str],
) -> bool:
    """Decide the calls the session waits on, as the decision turn says; whether none waits.

    Every decision is checked against the waiting calls before any is recorded. Then they
    are recorded in order, each person's run of decisions together (all or none), and a
    decision expected to be refused on its own.

    Raises:
        _Undecidable: a decision names no waiting call (or several), two decide the same
            call (other than approvals by different people), a waiting call has no decision,
            the engine refuses one (unless it was expected to), or an expected refusal was
            not refused.
    """
    org_id, user_id = scope
    state = await engine.session(session, org_id=org_id, user_id=user_id)
    asked = [p.id for m in state.all_messages() for p in m.parts if isinstance(p, ToolCallPart)]
    order = {call: position for position, call in enumerate(asked)}
    waiting = sorted(state.pending.values(), key=lambda c: order.get(c.tool_call_id, len(order)))
    choices = _choices(turn, waiting)
    undecided = [c for c in waiting if all(ch.card is not c for ch in choices)]
    if undecided:
        raise _Undecidable(
            f"{len({id(ch.card) for ch in choices})} of {len(waiting)} waiting calls decided; "
            f"no decision for {'; '.join(_show(waiting, c) for c in undecided)} (add one to "
            f"decisions, or decide every call alike with decide: approve | reject | answer)"
        )
    ready = False
    for group in _groups(choices):
        lead = group[0]
        decider = (
            Decider(user_id=lead.by.user_id, roles=frozenset(lead.by.roles), org_id=org_id)
            if lead.by is not None
            else None
        )
        # Each person decides on the cards as they stand when they decide (an earlier
        # person's amendment included): their decisions name those arguments' digests.
        now = await engine.session(session, org_id=org_id, user_id=user_id)
        decisions = {c.card.tool_call_id: _made_on(c.decision, now, c.card) for c in group}
        try:
            if decider is None:
                resolution = await engine.resolve_many(
                    session, decisions, org_id=org_id, user_id=user_id
                )
            else:
                resolution = await engine.resolve_many(session, decisions, decider=decider)
        except DecisionNotAllowedError as exc:
            refused = next((c for c in group if c.card.tool_name == exc.tool_name), lead)
            _refused(engine, turn, refused, exc)
            continue  # refused, as expected: nothing was recorded, and the call still waits
        except InvalidDecisionError as exc:
            if not lead.refused:
                raise _Undecidable(str(exc)) from None
            _invalid(lead, exc)
            continue  # refused, as expected: nothing was recorded, and the call still waits
        except StaleResolutionError as exc:
            raise _Undecidable(str(exc)) from None
        if lead.refused:
            why = (
                f"the policy let {lead.by.user_id} make it"
                if lead.by is not None
                else "it was a valid decision"
            )
            raise _Undecidable(f"{lead.label}: expected a refusal, but {why}, and it was recorded")
        for choice in group:
            _fate(choice, resolution.decided, seen, made, amended)
        ready = resolution.ready
    return ready


def _choices(turn: Turn, waiting: list[ApprovalCardPart]) -> list[_Choice]:
    """The turn's decisions, each on the waiting card it names."""
    choices: list[_Choice] = []
    if turn.decide is not None:
        for position, card in enumerate(waiting):
            who = f", by {turn.by.user_id}" if turn.by is not None else ""
            fate, decision = _decision(
                turn.decide, card, amend=turn.amend, reason=turn.reason, output=turn.output
            )
            choices.append(
                _Choice(
                    label=f"decide: {turn.decide} ([{position}] {card.tool_name}{who})",
                    card=card,
                    kind=turn.decide,
                    fate=fate,
                    decision=decision,
                    by=turn.by,
                    refused=turn.expect_refused,
                )
            )
        return choices
    assert turn.decisions is not None
    for number, spec in enumerate(turn.decisions):
        label = f"decisions[{number}] ({spec.label})"
        card = _target(spec, waiting, label)
        fate, decision = _decision(
            spec.kind, card, amend=spec.amend, reason=spec.reason, output=spec.output
        )
        choice = _Choice(
            label=label,
            card=card,
            kind=spec.kind,
            fate=fate,
            decision=decision,
            by=spec.by or turn.by,
            refused=spec.expect_refused,
        )
        for earlier, other in enumerate(choices):
            if other.card is card:
                _twice(waiting, earlier, other, number, choice)
        choices.append(choice)
    return choices


def _twice(
    waiting: list[ApprovalCardPart], first: int, one: _Choice, second: int, other: _Choice
) -> None:
    """Two decisions on one call: fine for approvals by different people, or a refusal."""
    if one.refused or other.refused:
        return
    both = f"decisions[{first}] and decisions[{second}] both"
    if one.kind == other.kind == "approve":
        if one.by is None or other.by is None or one.by.user_id == other.by.user_id:
            raise _Undecidable(
                f"{both} approve {_show(waiting, one.card)} as the same person; approvals "
                f"that add up are by different people: give each its by: {{user_id: ...}}"
            )
        return
    raise _Undecidable(f"{both} decide {_show(waiting, one.card)}; a call is decided once")


def _groups(choices: list[_Choice]) -> list[list[_Choice]]:
    """The choices as the engine records them: a person's run together, a refusal alone."""
    groups: list[list[_Choice]] = []
    for choice in choices:
        last = groups[-1] if groups else None
        if (
            last is not None
            and not choice.refused
            and not last[0].refused
            and last[0].by == choice.by
            and all(c.card is not choice.card for c in last)
        ):
            last.append(choice)
        else:
            groups.append([choice])
    return groups


def _refused(engine: Engine, turn: Turn, choice: _Choice, exc: DecisionNotAllowedError) -> None:
    """Accept a refusal the suite expects; otherwise say why it failed, and how to fix it.

    Raises:
        _Undecidable: the refusal was not expected, or not for the words expected.
    """
    if choice.by is None:  # the scenario's user names no decider: a policy needs one
        where = "to the turn" if turn.decide is not None else "to the decision (or the turn)"
        raise _Undecidable(
            f"{choice.label}: {exc.tool_name} has a decision policy"
            f"{_policy_words(engine, exc.tool_name)}, so the suite must name who decides its "
            f"calls: add by: {{user_id: ..., roles: [...]}} {where}"
        )
    if not choice.refused:
        raise _Undecidable(
            f"{choice.label} was refused: {exc} (if the suite expects that, add "
            f"expect_refused: true to the decision)"
        )
    words = choice.refused
    if isinstance(words, str) and words.lower() not in str(exc).lower():
        raise _Undecidable(f"{choice.label}: refused, but not for {words!r}: {exc}")


def _invalid(choice: _Choice, exc: InvalidDecisionError) -> None:
    """Accept a decision the engine refused as invalid (a refused amendment, say), as expected.

    Raises:
        _Undecidable: the refusal was not for the words expected.
    """
    words = choice.refused
    if isinstance(words, str) and words.lower() not in str(exc).lower():
        raise _Undecidable(f"{choice.label}: refused, but not for {words!r}: {exc}")


def _policy_words(engine: Engine, tool_name: str) -> str:
    """` (roles: finance; four eyes)`: the tool's policy in words, or nothing if unknown."""
    found = engine.domain.tools().get(tool_name)
    if found is None:
        return ""
    policy = policy_for(found.decision_policy, found.permission, engine.domain.policies)
    return f" ({policy.describe()})" if policy is not None else ""


def _fate(
    choice: _Choice,
    decided: list[str],
    seen: Transcript,
    made: dict[str, Proposal],
    amended: set[str],
) -> None:
    """Record on its proposal how a call was decided.

    A call that needs another approval stays undecided, remembering whether an approval
    amended it.
    """
    call = choice.card.tool_call_id
    if choice.fate == "amended":
        amended.add(call)
    if call not in decided:
        return
    proposal = next((p for p in reversed(seen.proposals) if p.tool_call_id == call), None)
    if proposal is None:  # its card came with no event this scenario saw
        card = choice.card
        proposal = Proposal(tool=card.tool_name, args=card.args, tool_call_id=call)
        seen.proposals.append(proposal)
    fate = choice.fate
    if fate == "approved" and call in amended:
        fate = "amended"  # an earlier approval amended it; this one approved it as it stood
    proposal.decision = fate
    amended.discard(call)
    if fate == "answered":
        made[call] = proposal


def _made_on(decision: Decision, state: RunState, card: ApprovalCardPart) -> Decision:
    """`decision`, naming the digest of its card's arguments as they stand in `state`."""
    current = state.pending.get(card.tool_call_id)
    if current is None:
        return decision  # decided meanwhile: the engine says so
    return dataclasses.replace(decision, digest=current_digest(current))


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
