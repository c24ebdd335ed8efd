"""The suite format: scenarios with a conversation, mocks, a model and expectations.

A suite is pydantic data, so a YAML file and a Python module describe the same thing:

```yaml
domain: handrail.demo.support_desk:support_domain
concurrency: 4
scenarios:
  - name: question-takes-the-simple-route
    turns: ["Do you refund items that arrive damaged?"]
    model:
      scripted:
        - output: {route: simple, reason: a policy question}
        - "Yes: damaged items are refunded in full."
    expect:
      route: simple
      text_contains: refunded in full
```

Every model forbids unknown keys, so a typo is an error that names the field.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

__all__ = [
    "CapturedExpectation",
    "DeciderSpec",
    "DecisionSpec",
    "Expect",
    "Judge",
    "Mock",
    "ModelSpec",
    "ProposalExpectation",
    "Scenario",
    "StepPart",
    "Suite",
    "ToolCallExpectation",
    "Turn",
    "UsageSpec",
]

_TARGET = re.compile(r"^[\w.]+:[\w.]+$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str | dict) else value


class StepPart(_Strict):
    """One part of a scripted model answer: text, a tool call, or structured output.

    In YAML a plain string is a text part; `{call: orders.lookup, args: {order_id: A1}}` a
    tool call; `{output: {route: search}}` a structured answer (sent as its JSON text).
    """

    text: str | None = None
    """Answer text."""
    call: str | None = None
    """The tool to call."""
    args: dict[str, Any] = Field(default_factory=dict)
    """The call's arguments."""
    id: str | None = None
    """The call's id (default: `call_1`, `call_2`, ... in script order)."""
    output: Any = None
    """A structured answer (a supervisor's route decision, an output type's fields)."""

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        return {"text": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _one_kind(self) -> StepPart:
        kinds = [k for k in ("text", "call", "output") if k in self.model_fields_set]
        if len(kinds) != 1:
            raise ValueError("a step part is exactly one of text, call or output")
        if (self.args or self.id) and self.call is None:
            raise ValueError("args and id belong to a call")
        return self


Step = Annotated[list[StepPart], Field(min_length=1)]


class UsageSpec(_Strict):
    """Token usage a scripted model reports for each answer (scripted models report none)."""

    input_tokens: int = Field(default=0, ge=0)
    """Prompt tokens of each answer."""
    output_tokens: int = Field(default=0, ge=0)
    """Completion tokens of each answer."""


class ModelSpec(_Strict):
    """A model: scripted steps, a function, or a real model's name.

    In YAML a plain string names a real model (`openai:gpt-4o-mini`, see
    `handrail.models.infer`); `{scripted: [...]}` plays steps in order, one per model call
    (a step is a part or a list of parts: one answer with several parts);
    `{function: module:attr}` answers each request with `attr(request)` (a `FunctionModel`).
    A fresh model is built for each scenario, so scripts never leak between scenarios.
    """

    name: str | None = None
    """A real model, as `provider:model`."""
    scripted: list[Step] | None = None
    """Steps played in order; each is one answer."""
    function: Any = None
    """`module:attr` (or, in Python, the function itself) computing each step."""
    usage: UsageSpec | None = None
    """Token usage reported with each scripted or computed answer."""

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data

    @field_validator("scripted", mode="before")
    @classmethod
    def _steps(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [_as_list(step) for step in value]
        return value

    @field_validator("function")
    @classmethod
    def _target(cls, value: Any) -> Any:
        if isinstance(value, str) and not _TARGET.match(value):
            raise ValueError(f"{value!r} is not module:attr")
        if value is not None and not (isinstance(value, str) or callable(value)):
            raise ValueError("give module:attr, or a function")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> ModelSpec:
        kinds = [k for k in ("name", "scripted", "function") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("a model is exactly one of: a name, scripted: [...], function:")
        if self.usage is not None and self.name is not None:
            raise ValueError("usage is for scripted and function models (real ones report it)")
        return self


class Mock(_Strict):
    """A mocked tool: one output for every call, outputs in call order, or an error.

    The tool keeps its name, schema and approval gate; only its implementation is replaced.
    With `ask`, a call first asks a person that question (as a tool raising `AskPerson`),
    and once answered runs again and returns its output.
    """

    output: Any = None
    """What every call returns."""
    outputs: list[Any] | None = None
    """What the first, second, ... call returns; a call past the end is a tool error."""
    error: str | None = None
    """Every call fails with this tool error (the model reads it)."""
    code: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_]*$")
    """With `error`: the failure's code (`out_of_stock`; default `tool_error`)."""
    ask: str | None = Field(default=None, min_length=1)
    """Each call first asks a person this question (a `question` card, answered by a
    decision turn), then runs again and gives its output or error."""

    @model_validator(mode="after")
    def _one_kind(self) -> Mock:
        kinds = [k for k in ("output", "outputs", "error") if k in self.model_fields_set]
        if len(kinds) != 1:
            raise ValueError("a mock is exactly one of output, outputs or error")
        if self.code is not None and self.error is None:
            raise ValueError("code goes with error")
        return self


_DECISIONS = ("approve", "reject", "answer")


class DeciderSpec(_Strict):
    """Who decides a waiting call: a person of the scenario's organisation and their roles.

    In YAML `by: {user_id: fiona, roles: [finance]}`, or `by: fiona` (no roles). The runner
    passes it to the engine as a `handrail.policy.Decider`, so the call's `DecisionPolicy`
    (roles, four eyes, several approvals) is checked as it is for the server's callers.
    """

    user_id: str = Field(min_length=1)
    """The person (the decision's `by`)."""
    roles: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    """Their roles (a policy's `roles` needs one of them)."""

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"user_id": data}
        if not isinstance(data, dict | DeciderSpec):
            raise ValueError("give the person as {user_id: fiona, roles: [finance]}, or fiona")
        return data

    @field_validator("roles", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


def _expected_refusal(value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        raise ValueError("expect_refused: true, or words the refusal must contain")
    return value


class DecisionSpec(_Strict):
    """A decision on ONE waiting call, which it names by tool or by position.

    In YAML `{approve: orders.refund, amend: {amount: 40}}`, `{reject: orders.cancel, reason:
    "not today"}`, `{answer: ask_customer, output: blue}` or `{answer: 1, output: {...}}`. The
    target is a tool name (the one call of that tool that waits) or an index into the waiting
    calls, in the order the model proposed them (0 is the first).

    `answer` answers an elicitation (a `human` tool), a tool's question (`AskPerson`) or a
    `client` tool (its result, as the client would post it). `by` names who decides, so the
    call's `DecisionPolicy` is checked; `expect_refused` asserts that the engine refuses the
    decision (the policy, a refused amendment, an invalid decision).
    """

    approve: str | StrictInt | None = None
    """Approve the call of this tool (or at this index)."""
    reject: str | StrictInt | None = None
    """Reject the call of this tool (or at this index)."""
    answer: str | StrictInt | None = None
    """Answer the call of this tool (or at this index) with `output`."""
    amend: dict[str, Any] | None = None
    """With `approve`: the amended arguments (amendable fields only)."""
    reason: str | None = None
    """With `reject`: why (the model reads it)."""
    output: Any = None
    """With `answer` (required there): the person's answer, or the client tool's result."""
    by: DeciderSpec | None = None
    """Who decides (default: the turn's `by`, else the scenario's user, trusted only where
    no decision policy applies)."""
    expect_refused: StrictBool | str = False
    """The engine must refuse this decision (`true`): the call's policy, a refused amendment
    or an invalid decision; a string names words the refusal contains (e.g. `four eyes`).
    Nothing is recorded, and the call still waits."""

    @field_validator("expect_refused")
    @classmethod
    def _refusal(cls, value: Any) -> Any:
        return _expected_refusal(value)

    @field_validator("approve", "reject", "answer", mode="before")
    @classmethod
    def _call(cls, value: Any) -> Any:
        if isinstance(value, bool):  # YAML reads `approve: yes` as true, which is no call
            raise ValueError(
                f"{str(value).lower()} names no call: give its tool (orders.refund) or its "
                f"index among the waiting calls (0)"
            )
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> DecisionSpec:
        kinds = [k for k in _DECISIONS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                "a decision is exactly one of approve, reject or answer, naming its call: "
                "{approve: TOOL} or {approve: INDEX}"
            )
        _companions(kinds[0], self.amend, self.reason, "output" in self.model_fields_set)
        target = self.target
        if isinstance(target, int) and target < 0:
            raise ValueError(f"{kinds[0]}: an index counts from 0, got {target}")
        if isinstance(target, str) and not target:
            raise ValueError(f"{kinds[0]}: name the tool whose call it decides")
        return self

    @property
    def kind(self) -> Literal["approve", "reject", "answer"]:
        """What is decided."""
        if self.approve is not None:
            return "approve"
        return "reject" if self.reject is not None else "answer"

    @property
    def target(self) -> str | int:
        """The waiting call it decides: a tool name, or an index into the waiting calls."""
        found = getattr(self, self.kind)
        assert found is not None
        return found  # type: ignore[no-any-return]

    @property
    def label(self) -> str:
        """The decision in a message: `approve orders.refund`, `answer [1] by fiona`."""
        target = self.target
        who = f" by {self.by.user_id}" if self.by is not None else ""
        return f"{self.kind} {f'[{target}]' if isinstance(target, int) else target}{who}"


def _companions(kind: str, amend: Any, reason: Any, output: bool, how: str = "") -> None:
    if amend is not None and kind != "approve":
        raise ValueError(f"amend goes with {how}approve")
    if reason is not None and kind != "reject":
        raise ValueError(f"reason goes with {how}reject")
    if output and kind != "answer":
        raise ValueError(f"output goes with {how}answer")
    if not output and kind == "answer":
        raise ValueError(f"{how}answer needs its output: the answer, or the client's result")


class Turn(_Strict):
    """One turn: a user message (a plain string in YAML), or decisions on waiting calls.

    A decision turn follows a turn that suspended, decides the calls that wait, then resumes
    that turn. `decide: approve | reject | answer` decides every waiting call the same way;
    `decisions: [...]` decides each waiting call on its own (`DecisionSpec`), and must cover
    every one of them. `by` names who decides (see `DeciderSpec`); a call that still waits
    afterwards (it needs another approval, or its decision was refused as expected) leaves
    the turn suspended, for the next decision turn.
    """

    text: str | None = None
    """What the user writes."""
    decide: Literal["approve", "reject", "answer"] | None = None
    """Decide every waiting call this way, then resume the suspended turn."""
    decisions: list[DecisionSpec] | None = Field(default=None, min_length=1)
    """One decision a waiting call, each naming its call; then resume the suspended turn."""
    amend: dict[str, Any] | None = None
    """With `decide: approve`: the amended arguments (amendable fields only)."""
    reason: str | None = None
    """With `decide: reject`: why (the model reads it)."""
    output: Any = None
    """With `decide: answer` (required there): the answer, or the client tool's result."""
    by: DeciderSpec | None = None
    """With `decide` or `decisions`: who decides (a decision's own `by` wins). Default: the
    scenario's user, trusted only where no decision policy applies."""
    expect_refused: StrictBool | str = False
    """With `decide`: the engine must refuse each of these decisions (see `DecisionSpec`)."""
    route: str | None = None
    """The route to take (default: the supervisor chooses)."""
    org_id: str | None = None
    """The caller's organisation (default: the first turn's; the same on every turn)."""
    user_id: str | None = None
    """The caller (default: the first turn's; the same on every turn)."""
    roles: list[Annotated[str, Field(min_length=1)]] | None = None
    """The caller's roles for this message turn, which a `tools_for` chooses the turn's tools
    from (default: the roles the session has, none on the first turn)."""
    context: dict[str, Any] | None = None
    """This message turn's per-turn context (the page, the record the user is on), validated
    against the domain's `context_model` as a live turn's is (default: the scenario's)."""

    @field_validator("expect_refused")
    @classmethod
    def _refusal(cls, value: Any) -> Any:
        return _expected_refusal(value)

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        return {"text": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _one_kind(self) -> Turn:
        given = [k for k in ("text", "decide", "decisions") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("a turn is exactly one of text, decide or decisions")
        output = "output" in self.model_fields_set
        if self.decisions is not None:
            if self.amend is not None or self.reason is not None or output:
                raise ValueError("with decisions, amend, reason and output go inside each decision")
            if self.expect_refused:
                raise ValueError("with decisions, expect_refused goes inside each decision")
            for number, decision in enumerate(self.decisions):
                if decision.expect_refused and decision.by is None and self.by is None:
                    raise ValueError(
                        f"decisions[{number}]: expect_refused needs by: the person refused "
                        f"(on the decision, or on the turn)"
                    )
        elif self.decide is not None:
            _companions(self.decide, self.amend, self.reason, output, "decide: ")
            if self.expect_refused and self.by is None:
                raise ValueError("expect_refused needs by: the person refused")
        elif self.amend is not None or self.reason is not None or output:
            raise ValueError("amend, reason and output go with a decision, not a message")
        elif self.by is not None or self.expect_refused:
            raise ValueError("by and expect_refused go with a decision, not a message")
        if self.route is not None and self.text is None:
            raise ValueError("a decision resumes its turn on that turn's route: drop route")
        if self.context is not None and self.text is None:
            raise ValueError("a decision resumes its turn with that turn's context: drop context")
        return self

    @property
    def deciding(self) -> bool:
        """Whether the turn decides waiting calls (rather than sending a message)."""
        return self.text is None

    @property
    def label(self) -> str:
        """The turn as the judge reads it: the message, or the decision."""
        if self.text is not None:
            return self.text
        if self.decisions is not None:
            return f"(a person decides: {', '.join(d.label for d in self.decisions)})"
        who = f" by {self.by.user_id}" if self.by is not None else ""
        return f"(a person decides: {self.decide}{who})"


class ToolCallExpectation(_Strict):
    """A tool call that must (or must not) happen: the tool, and arguments it must include.

    `args` match partially: every key given must be there with a matching value (nested
    mappings match partially too; numbers match across int and float).
    """

    tool: str
    """The tool's name."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Arguments the call must include."""

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"tool": data} if isinstance(data, str) else data


class ProposalExpectation(ToolCallExpectation):
    """A call that waited for a decision (an approval, an answer, a client), and its fate.

    In YAML a bare tool name, or `{tool, args, decision}`; `args` match the call as the model
    proposed it, partially.
    """

    decision: Literal["approved", "amended", "rejected", "answered", "undecided"] | None = None
    """How it was decided: approved as proposed, approved with amendments, rejected,
    answered (a person's answer or a client's result), or still undecided when the scenario
    ended (default: any)."""


class ToolErrorExpectation(_Strict):
    """A tool call that must fail: the tool, and the failure's code.

    In YAML a bare tool name (any failure), or `{tool, code}`.
    """

    tool: str
    """The tool's name (as the model called it: an unknown tool's too)."""
    code: str | None = None
    """The result's `code` (`invalid_arguments`, `rejected`, ... or the tool's own; default:
    any)."""

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"tool": data} if isinstance(data, str) else data


class CapturedExpectation(_Strict):
    """The actions a capture-mode scenario must capture."""

    actions: list[ToolCallExpectation] = Field(default_factory=list)
    """Actions that must be captured, in this order (others may come between)."""
    count: int | None = Field(default=None, ge=0)
    """How many actions exactly, when given."""


class Judge(_Strict):
    """An LLM judge: a model reads the conversation and gives a pass/fail verdict."""

    rubric: str
    """What a good answer does, for the judge."""
    model: ModelSpec | None = None
    """The judge's model (default: the suite's `judge_model`)."""


class Expect(_Strict):
    """What a scenario asserts. Each key given is one assertion; none is required."""

    outcome: Literal["completed", "suspended", "failed"] | None = None
    """How the last turn ends (default: anything but a failed run)."""
    route: str | list[str] | None = None
    """The route chosen: a name checks the last turn, a list checks each turn in order."""
    called: list[ToolCallExpectation] = Field(default_factory=list)
    """Calls that must happen (each matched by some call, arguments partially): calls that
    ran, and calls a person answered or a client ran; not the ones rejected or waiting."""
    not_called: list[ToolCallExpectation] = Field(default_factory=list)
    """Calls that must not happen (a bare tool name: no call of that tool at all). A call
    that waited and was rejected, or waits still, did not happen."""
    proposed: list[ProposalExpectation] = Field(default_factory=list)
    """Calls that must have waited for a decision (each matched by some waiting call),
    with how they were decided."""
    tool_errors: list[ToolErrorExpectation] = Field(default_factory=list)
    """Calls that must fail (each matched by some failed call), with the failure's code."""
    captured: CapturedExpectation | None = None
    """The actions capture mode must record."""
    approvals: list[str] | None = None
    """The tools whose calls asked for approval, in order (`[]`: none did)."""
    text_contains: list[str] = Field(default_factory=list)
    """Substrings the final text must contain."""
    text_matches: str | None = None
    """A regular expression the final text must match (`re.search`)."""
    output: Any = None
    """The structured output, exactly (as JSON-compatible data)."""
    max_model_calls: int | None = Field(default=None, ge=0)
    """At most this many model calls (the judge's not counted)."""
    max_tokens: int | None = Field(default=None, ge=0)
    """At most this many tokens (input + output), when the model reports them."""
    judge: Judge | None = None
    """An LLM judge's verdict must be a pass."""

    @field_validator(
        "called", "not_called", "proposed", "tool_errors", "text_contains", mode="before"
    )
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return _as_list(value)

    @field_validator("text_matches")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value


class Scenario(_Strict):
    """One conversation to run, with its mocks, its model and what it must do."""

    name: str = Field(min_length=1)
    """Identifies the scenario in reports and baselines (unique in its suite)."""
    turns: list[Turn] = Field(min_length=1)
    """The user's messages, one a turn, on one session (a string: one turn)."""
    mocks: dict[str, Mock] = Field(default_factory=dict)
    """Tool name -> its mock (passed to the engine as `wrap_tools`)."""
    model: ModelSpec | None = None
    """The model for agents that name none (default: the suite's)."""
    mode: Literal["mock", "capture"] = "mock"
    """`mock`: tools without a mock fail with a tool error; `capture`: gated calls are
    captured through their `mint` (`Engine.run_headless`), others run (or their mock does)."""
    client: bool = False
    """The caller runs `client` tools: their calls wait for the client's result, which a
    decision turn gives (`answer`). Without, they fail fast, as for a caller that cannot."""
    expect: Expect = Field(default_factory=Expect)
    """The assertions."""
    context: dict[str, Any] | None = None
    """The per-turn context of every message turn that gives none of its own."""

    @field_validator("turns", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return _as_list(value)

    @model_validator(mode="after")
    def _decisions(self) -> Scenario:
        if self.turns[0].deciding:
            raise ValueError("turns: the first turn is a message; a decision follows one")
        if self.mode == "capture" and any(t.deciding for t in self.turns):
            raise ValueError("turns: a capture-mode run asks nobody, so it has no decisions")
        if self.mode == "capture" and self.client:
            raise ValueError("client: a capture-mode run has no client to run its tools")
        return self


class Suite(_Strict):
    """A named set of scenarios on one domain."""

    name: str | None = None
    """The suite's name in reports (default: the file's stem)."""
    domain: Any = None
    """The `Domain` or `Agent` under test: `module:attr` (or, in Python, the object)."""
    app: Any = None
    """Instead of `domain`: the application under test, as `handrail serve` takes it
    (`MODULE:NAME` of an `Engine`, a function or coroutine function returning one, or an
    async context-manager function yielding one; in Python, the object). It is opened once
    in the eval's event loop before the first scenario and closed after the last; each
    scenario runs its engine's domain on a fresh store, with its runtime's deps (unless
    `deps` is given) and its default model (unless the suite or scenario gives one)."""
    model: ModelSpec | None = None
    """The default model of the scenarios."""
    judge_model: ModelSpec | None = None
    """The default model of judge assertions."""
    deps: Any = None
    """The tools' `ctx.deps`: `module:attr` of a factory (called once a scenario) or an
    object (in Python, the factory or object itself)."""
    concurrency: int = Field(default=4, ge=1)
    """Scenarios run at once."""
    scenarios: list[Scenario] = Field(min_length=1)
    """The scenarios, in report order."""

    @field_validator("domain", "deps", "app")
    @classmethod
    def _target(cls, value: Any) -> Any:
        if isinstance(value, str) and not _TARGET.match(value):
            raise ValueError(f"{value!r} is not module:attr")
        return value

    @model_validator(mode="after")
    def _one_subject(self) -> Suite:
        if (self.domain is None) == (self.app is None):
            raise ValueError(
                "give the domain under test (domain: module:attr, a Domain or Agent) or the "
                "application (app: MODULE:NAME, as `handrail serve` takes it), not both"
                if self.domain is not None
                else "give domain: (a Domain or Agent, module:attr) or app: (the application, "
                "MODULE:NAME, as `handrail serve` takes it)"
            )
        return self

    @model_validator(mode="after")
    def _unique(self) -> Suite:
        seen: set[str] = set()
        for scenario in self.scenarios:
            if scenario.name in seen:
                raise ValueError(f"two scenarios are named {scenario.name!r}")
            seen.add(scenario.name)
        return self
