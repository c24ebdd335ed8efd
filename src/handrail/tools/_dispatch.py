"""The dispatch pipeline: from the calls of one model response to their stamped results.

Each call goes through the same steps, in this order:

1. parse the JSON arguments (malformed or not an object: a tool error the model can read);
2. the domain's `transform_args` hook;
3. bind arguments from the context store (`bindings`: scope comes from the session); the
   values are kept on the part (`bound`): a captured call is applied with them later;
4. the tool's `normalize`, then validation: a value that validates reaches the tool as the
   model sent it; only a value that fails is repaired, and only in ways that cannot change
   its meaning (every field still bad is listed);
5. allow-list and permission check (an unknown tool's error lists the close names);
6. dedup (a `read` call identical to a successful one earlier this turn, with no
   side-effecting call in between, is reused and marked) and the idempotent-tool cache;
7. execute, with the tool's timeout, draining progress from streaming tools;
8. digest (a small UI projection);
9. capture the output into the context store (`tool:`, `tool:[]`, `call:`);
10. result hooks (`on_tool_result`, `transform_tool_result`);
11. stamp the part (status, result, timings).

Gated, human and client calls stop after step 6 and wait (see `handrail.suspension`): each
gets a card, a placeholder result and an entry in the pending map, and no
`tool-call-started` (a call starts once: an approved call starts when it runs, a call that
never runs here only completes). When the run resumes,
`Dispatcher.resume` settles the decided calls and runs the approved ones through steps 7-11,
after binding and validating their arguments again against the context of now (a binding
that no longer resolves refuses the call) and checking them against the approved digest.

The pipeline never raises for a
tool's failure: an exception becomes `ToolResult(ok=False)` and the loop goes on. Independent
calls run in parallel in one `TaskGroup`; `sequential` tools run alone, in the model's order;
one failure or timeout never sinks the others; results stay in the model's call order. A
side-effecting call is logged `started` right before it runs; a journal that cannot log a
call's start (it then does not run) or its result (the store stayed away) does not sink the
others either: the calls of the batch all finish and log theirs, then the batch raises the
journal's error.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeAlias

import pydantic_core

from .._captured import proposed_text, temp_id
from .._deadlines import INHERIT, Expiry, Inherit, ttl_for
from .._redact import log_failure, new_reference
from .._tool_result import ToolResult
from ..events import (
    Event,
    ToolCallCompleted,
    ToolCallStarted,
    ToolProgress,
)
from ..exceptions import AskPerson, ModelRetry, PathError
from ..messages import ApprovalCardPart, CardKind, Message, ToolCallPart
from ..recovery import Journal, attempt_id, idempotency_key

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from .._captured import CapturedAction

from ..runtime import Runtime
from ..state import RunState
from ..suspension import args_digest, card_event, placeholder, settle
from ._arguments import ArgumentsError, parse_arguments
from ._tool import Tool, ToolContext, jsonable, positional_count

__all__ = ["Dispatcher", "completed_event"]

_NO_CLIENT = (
    "Tool {name!r} runs in the client, and no client is connected to run it. Tell the user "
    "to open the app (or do it another way)."
)
_NOT_HEADLESS = {
    "human": (
        "Tool {name!r} asks a person, and this is a headless run (capture mode) with nobody "
        "to ask. Say what you would have asked instead."
    ),
    "client": (
        "Tool {name!r} runs in the client, and this is a headless run (capture mode) with no "
        "client. Tell the user it needs the app."
    ),
    "provider": "Tool {name!r} cannot be captured.",
}
Emit = Callable[[Event], None]
_log = logging.getLogger("handrail.tools")
_Final: TypeAlias = None  # what `_prepare` returns for a part that is already final or waiting


class _Copy:
    """A read identical to one earlier in the same response.

    It reuses that call's result once the call succeeded, and runs itself when it failed.
    """

    __slots__ = ("original", "ready")

    def __init__(self, ready: _Ready, original: _Ready) -> None:
        self.ready = ready
        self.original = original


class _Ready:
    """A call that passed steps 1-6 and will be executed."""

    __slots__ = (
        "answer",
        "asked",
        "error",
        "fault",
        "key",
        "kwargs",
        "log_id",
        "part",
        "tool",
        "warnings",
    )

    def __init__(
        self,
        part: ToolCallPart,
        tool: Tool[Any],
        kwargs: dict[str, Any],
        key: str,
        warnings: list[str] | None = None,
    ):
        self.part = part
        self.warnings = warnings or None  # what the tool's `normalize` noted, for the model
        self.tool = tool
        self.kwargs = kwargs
        self.key = key
        self.log_id = part.id  # the attempt's id in the tool-call log (a retry has its own)
        self.answer: ApprovalCardPart | None = None  # the answered question, on a rerun
        self.asked: str | None = None  # the question it raised (`AskPerson`) as it ran
        self.fault: Exception | None = None  # the journal could not log its start or result
        self.error: tuple[Exception, str] | None = None  # what the tool raised, its reference


class Dispatcher:
    """Runs the calls of one agent's model responses through the pipeline.

    Args:
        tools: the agent's tools by name (the allow-list).
        state: the run state (context store, dedup and cache, scope).
        runtime: hooks, permission policy, clock and dependencies.
        agent: the agent's name (stamped on events and handed to tools).
        journal: where side effects are recorded before they happen (the engine's); None
            keeps no record.
        trace: the agent's span, when the runtime traces: each execution gets a child span.
        expires_after: the agent's deadline for waiting calls (its domain's folded in), for
            tools that set none; then the runtime's `pending_ttl`.
    """

    def __init__(
        self,
        tools: Mapping[str, Tool[Any]],
        state: RunState,
        runtime: Runtime[Any],
        agent: str,
        journal: Journal | None = None,
        trace: Span | None = None,
        *,
        expires_after: Expiry | Inherit = INHERIT,
    ) -> None:
        self.tools = tools
        self.expires_after = expires_after
        self.state = state
        self.runtime = runtime
        self.agent = agent
        self.journal = journal
        self.trace = trace

    async def run(
        self, message: Message, calls: list[ToolCallPart], cards: list[ApprovalCardPart]
    ) -> AsyncIterator[Event]:
        """Dispatch `calls` of `message` (stamping each part) and yield the events as they happen.

        Calls that must wait for a person or a client are left `waiting`, with a card on
        `message` (before any call of the response runs: the checkpoint taken before the first
        side effect holds every card, so a crash cannot drop one) and in `cards`; the caller
        suspends the run when any are.
        """
        ready: list[_Ready] = []
        copies: list[_Copy] = []
        planned: dict[str, _Ready] = {}
        finished: list[ToolCallPart] = []
        for part in calls:
            parsed = self._parse(part)
            outcome = self._prepare(part, planned) if parsed else None
            if part.status == "waiting":  # it starts when it runs, after its decision
                yield self._wait(message, part, cards)
                continue
            yield ToolCallStarted(
                agent=self.agent,
                tool_call_id=part.id,
                name=part.name,
                args=part.args if parsed else None,
                executor=part.executor,
            )
            if isinstance(outcome, _Ready):
                ready.append(outcome)
            elif isinstance(outcome, _Copy):
                copies.append(outcome)
            else:
                finished.append(part)
        for part in finished:
            if part.captured is not None and part.status == "running":
                assert part.result is not None
                await self._finish(part, self.tools[part.name], part.result, None)
            yield completed_event(part)
        async for event in self._execute_ready(ready, message, cards, checkpoint=True):
            yield event
        if not copies:
            return
        again: list[_Ready] = []
        for copy in copies:
            if copy.original.part.status == "completed":
                self._reuse(copy.ready.part, copy.original.part)
                yield completed_event(copy.ready.part)
            else:  # a failed (or asking) call is never reused: the copy tries for itself
                self.state.turn_calls[copy.ready.key] = copy.ready.part
                again.append(copy.ready)
        async for event in self._execute_ready(again, message, cards, checkpoint=False):
            yield event

    def hosted(self, calls: list[ToolCallPart], started: set[str] | None = None) -> list[Event]:
        """The events of calls the model provider ran, which arrived with their results.

        They are not run here and their results are kept as the provider gave them; a
        successful one is captured into the context store (`tool:web_search`) like any
        other call. A call whose result has not arrived yet only starts; one whose id is in
        `started` (it started in an earlier response) only completes.
        """
        events: list[Event] = []
        for part in calls:
            if started is None or part.id not in started:
                events.append(
                    ToolCallStarted(
                        agent=self.agent,
                        tool_call_id=part.id,
                        name=part.name,
                        args=part.args,
                        executor="provider",
                    )
                )
            result = part.result
            if result is None:
                continue
            if result.ok:
                self.state.context.record(part.name, part.id, result.data)
            events.append(completed_event(part))
        return events

    async def resume(self, message: Message, cards: list[ApprovalCardPart]) -> AsyncIterator[Event]:
        """Settle the decided calls of a suspended `message`; run the approved ones.

        Rejected, expired, answered and client-run calls get their final result (then steps
        8-11). An approved call runs only if its arguments, validated again against the state
        of now, still hash to the digest that was approved, and its tool's `revalidate` hook
        accepts them. A gated `client` tool, once approved, waits again for the client (a new
        card in `cards`).
        """
        # The settlement's events go out once the resumption's first write is done (below):
        # a drive that loses the session to another worker there has shown nothing.
        settled: list[Event] = []
        decided: dict[str, ApprovalCardPart] = {}
        for p in message.parts:
            if isinstance(p, ApprovalCardPart) and p.decision is not None:
                decided[p.tool_call_id] = p
        ready: list[_Ready] = []
        for part in message.parts:
            if not isinstance(part, ToolCallPart) or part.status not in ("waiting", "running"):
                continue
            if part.executor == "provider":  # the provider runs it; its result comes from there
                continue
            card = decided.get(part.id)
            if part.status == "running" and (card is None or card.decision != "approve"):
                outcome = self._rerun(part)  # cut off by a crash: never started, or idempotent
                if isinstance(outcome, _Ready):
                    ready.append(outcome)
                else:
                    settled.append(completed_event(part))
                continue
            if card is None:  # still pending: the caller resumes only when nothing is
                continue
            tool = self.tools.get(part.name)
            result = settle(tool, part, card)
            if result is None and card.kind == "question":  # answered: the tool runs again
                outcome = self._rerun(part)
                if isinstance(outcome, _Ready):
                    outcome.log_id = attempt_id(message, part)
                    outcome.answer = card
                    part.status = "running"
                    ready.append(outcome)
                else:
                    settled.append(completed_event(part))
                continue
            if result is not None:
                await self._finish(part, tool, result, None)
                if card.decision == "reject":
                    part.status = "rejected"
                settled.append(completed_event(part))
                continue
            assert tool is not None  # `settle` settles every call whose tool is gone
            outcome = await self._approved(part, tool, card)
            if isinstance(outcome, _Ready):
                outcome.log_id = attempt_id(message, part)
                settled.append(
                    ToolCallStarted(
                        agent=self.agent,
                        tool_call_id=part.id,
                        name=part.name,
                        args=part.args,
                        executor=part.executor,
                    )
                )
                ready.append(outcome)
            elif part.status == "waiting":  # an approved client tool: now the client runs it
                settled.append(self._wait(message, part, cards, approved=True))
            else:
                settled.append(completed_event(part))
        # The message was stored when the turn stopped, so the calls are already on record.
        # The first write of the resumption comes before any call runs: the checkpoint with
        # the `started` of the side effects that start at once (and the lease, with the
        # version read), or, for reads alone, the session.
        journal = self.journal
        if journal is not None and ready and not await self._checkpoint(ready):
            await journal.acting()
        for event in settled:
            yield event
        async for event in self._execute_ready(ready, message, cards, checkpoint=False):
            yield event

    def _rerun(self, part: ToolCallPart, bound: dict[str, Any] | None = None) -> _Ready | _Final:
        """Look the tool up, bind (from `bound`, else the context) and validate again."""
        tool = self.tools.get(part.name)
        if tool is None:
            return self._fail(part, _unknown_tool(part.name, self.tools), "unknown_tool")
        try:
            validated = tool.validate(
                part.args, self.state.context, bound, turn_context=self.state.turn_context
            )
        except Exception as exc:
            return self._fail(
                part, f"Tool {part.name!r}: {type(exc).__name__}: {exc}", "invalid_arguments"
            )
        return _Ready(part, tool, tool.arguments(validated), _call_key(part.name, part.args))

    async def _approved(
        self, part: ToolCallPart, tool: Tool[Any], card: ApprovalCardPart
    ) -> _Ready | _Final:
        args = card.amended_args if card.amended_args is not None else part.args
        warnings: list[str] = []
        try:
            validated = tool.validate(
                args, self.state.context, warnings=warnings, turn_context=self.state.turn_context
            )
        except (ArgumentsError, PathError) as exc:
            return self._fail(
                part,
                f"Tool {part.name!r}: the approved call no longer holds: {exc}",
                "invalid_arguments",
            )
        except Exception as exc:
            return self._fail(
                part, f"Tool {part.name!r}: {type(exc).__name__}: {exc}", "invalid_arguments"
            )
        final = tool.stored_args(validated)
        if card.args_digest != args_digest(part.name, final):
            return self._fail(
                part,
                f"Refused to run {part.name!r}: its arguments are not the ones that were "
                f"approved (the approval's digest does not match). Ask for approval again.",
                "policy_denied",
            )
        if tool.revalidate is not None:
            try:
                checked = tool.revalidate(self._context(part, tool), final)
                if inspect.isawaitable(checked):
                    await checked
            except ModelRetry as exc:
                return self._fail(part, exc.message, exc.code or "invalid_arguments")
            except Exception as exc:
                reference = self._raised(part, exc, f"The revalidate hook of {part.name!r} raised")
                return self._fail(
                    part,
                    f"Tool {part.name!r}: the approved call no longer holds: "
                    f"{type(exc).__name__}: {exc} (reference {reference})",
                    "invalid_arguments",
                )
        part.args = final
        if tool.executor == "client":
            # It was dispatched with a client connected (else it would have failed then): it
            # waits for that client's result, whoever resumes the turn (a worker has none).
            part.status = "waiting"
            return None
        part.status = "running"
        return _Ready(part, tool, tool.arguments(validated), _call_key(part.name, final), warnings)

    async def _execute_ready(
        self,
        ready: list[_Ready],
        message: Message,
        cards: list[ApprovalCardPart],
        *,
        checkpoint: bool,
    ) -> AsyncIterator[Event]:
        """Steps 7-11 for `ready`; then a card for each call that asked a person."""
        async for event in self._execute_all(ready, checkpoint=checkpoint):
            yield event
        for item in ready:
            if item.asked is not None:
                yield self._wait(message, item.part, cards, question=item.asked)

    async def _checkpoint(self, ready: list[_Ready]) -> bool:
        """Checkpoint before `ready` runs, if any of it has a side effect; whether it did.

        The calls on record before any of them may happen, and, in the same write, the
        `started` of the side effects that start at once (docs/durability.md).
        """
        journal = self.journal
        if journal is None or all(r.tool.permission == "read" for r in ready):
            return False
        starting = [
            (r.log_id, r.part, idempotency_key(self.state, r.part))
            for r in _first_to_run(ready)
            if r.tool.permission != "read"
        ]
        await journal.checkpoint(starting)
        return True

    async def _execute_all(self, ready: list[_Ready], *, checkpoint: bool) -> AsyncIterator[Event]:
        journal = self.journal
        if journal is not None and ready and not (checkpoint and await self._checkpoint(ready)):
            await journal.acting()  # a drive's first write comes before any call runs
        if len(ready) == 1 and ready[0].tool.kind != "stream":
            events: list[Event] = []
            await self._execute(ready[0], events.append)
            for event in events:
                yield event
        elif ready:
            async for event in self._execute_many(ready):
                yield event
        # A result the journal could not log (the store stayed away) stops the run only now,
        # once every sibling has finished and logged its own: a call is never cancelled in
        # the middle of its side effect for another's sake.
        faults = [item.fault for item in ready if item.fault is not None]
        if faults:
            raise faults[0]

    # -- steps 1 to 6 ---------------------------------------------------------------------

    def _parse(self, part: ToolCallPart) -> bool:
        """Step 1 for one call: parse its arguments; False (and the call failed) if they did not.

        The text is kept as the model sent it: it is shown to the model again.
        """
        part.started_at = self.runtime.clock()
        part.duration_ms = 0.0
        if part.raw_args is None:
            return True
        try:
            part.args = parse_arguments(part.raw_args)
        except ArgumentsError as exc:
            self.state.usage.invalid_tool_calls += 1
            self._fail(part, f"Tool {part.name!r}: {exc}", "invalid_arguments")
            return False
        return True

    def _prepare(self, part: ToolCallPart, planned: dict[str, _Ready]) -> _Ready | _Copy | _Final:
        """Steps 2-6 for a call whose arguments parsed.

        Returns what to execute, an in-response copy of an identical read, or None when the
        part is already final (an error, a reuse) or waiting.
        """
        runtime = self.runtime
        state = self.state
        tool = self.tools.get(part.name)
        if tool is None:  # the allow-list: only the agent's tools exist for its model
            return self._fail(part, _unknown_tool(part.name, self.tools), "unknown_tool")
        part.executor = tool.executor
        if tool.executor == "provider":  # a function call: the provider did not run it
            return self._fail(
                part,
                f"Tool {part.name!r} is run by the model provider, not called as a function: "
                f"this call did not run. Use the tool the provider offers under that name.",
                "not_available",
            )
        try:
            args = part.args
            transform = runtime.transform_args
            if transform is not None:  # 2. domain transform
                if _transform_takes_ctx(transform):
                    args = transform(tool, dict(args), self._context(part, tool))
                else:
                    args = transform(tool, dict(args))
            bound = tool.bind(state.context) if tool.bindings else None  # 3. bind
            warnings: list[str] = []
            validated = tool.validate(  # 4. validate
                args, state.context, bound, warnings, turn_context=state.turn_context
            )
        except ArgumentsError as exc:
            return self._fail(part, f"Tool {part.name!r}: {exc}", "invalid_arguments")
        except PathError as exc:
            return self._fail(
                part, f"Tool {part.name!r} could not bind its arguments: {exc}", "invalid_arguments"
            )
        except Exception as exc:  # a user hook failed: still data, never a crash
            return self._fail(
                part, f"Tool {part.name!r}: {type(exc).__name__}: {exc}", "invalid_arguments"
            )
        part.args = tool.stored_args(validated)
        part.bound = bound
        kwargs = tool.arguments(validated)

        # 5. permission policy (the allow-list was checked when the tool was looked up)
        allowed = runtime.allowed_permissions
        if allowed is not None and tool.permission not in allowed:
            return self._fail(
                part,
                f"Tool {part.name!r} needs permission {tool.permission!r}, which this run "
                f"does not allow (allowed: {', '.join(sorted(allowed))}).",
                "permission_denied",
            )

        # 6. dedup and the idempotent cache
        # Validated arguments dump in field order, so their JSON is canonical for the tool.
        key = _call_key(part.name, part.args)
        reusable = tool.reusable and runtime.dedup
        if reusable:
            twin = planned.get(key)
            if twin is not None:
                part.status = "running"
                return _Copy(_Ready(part, tool, kwargs, key), twin)
            earlier = state.turn_calls.get(key)
            if earlier is not None and earlier is not part and earlier.status == "completed":
                self._reuse(part, earlier)
                return None
        elif tool.permission != "read":
            # A side effect may change what any earlier read said: none of them is reused.
            state.turn_calls.clear()
            planned.clear()
        if tool.cache_ttl is not None:
            hit = state.tool_cache.get(key)
            if hit is not None and hit[0] > (part.started_at or 0.0):
                part.result = hit[1]
                part.cached = True
                part.status = "completed" if hit[1].ok else "failed"
                return None

        if tool.gated or tool.executor in ("human", "client"):
            if tool.capture:
                self._capture(part, tool)
                return None
            self._hold(part, tool)
            return None
        part.status = "running"
        ready = _Ready(part, tool, kwargs, key, warnings)
        if reusable:
            state.turn_calls[key] = part
            planned[key] = ready
        return ready

    def _capture(self, part: ToolCallPart, tool: Tool[Any]) -> None:
        """Capture mode: record a gated call with its predicted output instead of running it."""
        if tool.executor != "server":
            self._fail(part, _NOT_HEADLESS[tool.executor].format(name=part.name), "not_available")
            return
        state = self.state
        index = state.captures
        if tool.mint is None:
            # Nothing predicts its output: an opaque placeholder stands for all of it.
            result = ToolResult(data=temp_id(index))
            predicted = (
                f"{temp_id(index)} (a placeholder for the whole output, unknown until it runs: "
                f"pass it on to refer to what this call produces)"
            )
        else:
            try:
                result = tool.to_result(tool.mint(dict(part.args), index))
            except Exception as exc:
                self._fail(
                    part,
                    f"Tool {part.name!r}: mint failed: {type(exc).__name__}: {exc}",
                    "tool_error",
                )
                return
            if not result.ok:
                self._fail(
                    part,
                    f"Tool {part.name!r}: mint predicted: {result.error}",
                    result.code or "tool_error",
                )
                return
            predicted = result.model_text()
        state.captures = index + 1
        if result.summary is None:
            result.summary = f"captured as action {index}: not run yet"
        # The model reads a proposal, never a result: nothing ran, and it may never run.
        result.markdown = proposed_text(index, predicted)
        part.result = result
        part.captured = index
        part.status = "running"  # `run` finishes it (steps 8-11) without executing it

    def _hold(self, part: ToolCallPart, tool: Tool[Any]) -> None:
        """Make a call wait for a person or a client, unless it cannot (then it fails)."""
        state, runtime = self.state, self.runtime
        if tool.executor == "client" and not state.client_connected:
            self._fail(part, _NO_CLIENT.format(name=part.name), "not_available")
            return
        if tool.gated:
            cap = runtime.max_approvals_per_turn
            if cap is not None and state.approvals >= cap:
                self._fail(
                    part,
                    f"Not asked: this turn already has {cap} call(s) waiting for approval, the "
                    f"most it allows. Stop calling tools that need approval; summarise what "
                    f"you have done and what still needs a decision.",
                    "policy_denied",
                )
                return
            state.approvals += 1
        part.status = "waiting"
        return None

    @staticmethod
    def _fail(part: ToolCallPart, error: str, code: str) -> _Final:
        part.result = ToolResult.failure(error, code=code)
        part.status = "failed"
        return None

    @staticmethod
    def _reuse(part: ToolCallPart, original: ToolCallPart) -> None:
        """Give `part` the result of the identical, successful read `original`."""
        part.reused_from = original.id
        part.result = original.result
        part.status = "completed"
        part.digest = original.digest

    def _wait(
        self,
        message: Message,
        part: ToolCallPart,
        cards: list[ApprovalCardPart],
        *,
        approved: bool = False,
        question: str | None = None,
    ) -> Event:
        """Raise the card of a waiting call: on its message, its event, placeholder, pending entry.

        A gated call is asked for approval first; once `approved`, a client tool waits for
        the client's result. A call that ran and asked `question` (`AskPerson`) waits for
        a person's answer.
        """
        tool = self.tools[part.name]
        kind: CardKind
        if question is not None:
            kind = "question"
            part.status = "waiting"
        elif tool.gated and not approved:
            kind = "approval"
        elif tool.executor == "human":
            kind = "elicitation"
        else:
            kind = "client_exec"
        now = self.runtime.clock()
        ttl = ttl_for(kind, tool.expires_after, self.expires_after, self.runtime.pending_ttl)
        card = ApprovalCardPart(
            tool_call_id=part.id,
            tool_name=part.name,
            args=part.args,
            prompt=question if question is not None else tool.prompt,
            amendable=list(tool.amendable) if kind == "approval" else [],
            kind=kind,
            executor=tool.executor,
            agent=self.agent,
            created_at=now,
            expires_at=None if ttl is None else now + ttl,
        )
        part.result = placeholder(card)
        self.state.pending[part.id] = card
        message.parts.append(card)
        cards.append(card)
        return card_event(card, tool)

    async def apply(
        self, action: CapturedAction, args: dict[str, Any], bound: dict[str, Any] | None
    ) -> ToolCallPart:
        """Run a captured action for real (steps 3-4 and 7-11; applying it is the approval).

        Args:
            action: the action.
            args: its arguments, temporary ids already replaced.
            bound: its bound arguments as they were captured, temporary ids replaced (None:
                bind from the context).
        """
        part = ToolCallPart(
            id=action.call_id or f"apply_{action.local_index}",
            name=action.tool,
            args=args,
            bound=bound,
            started_at=self.runtime.clock(),
        )
        tool = self.tools.get(part.name)
        if tool is not None and tool.executor != "server":
            self._fail(
                part,
                f"Tool {part.name!r} runs elsewhere ({tool.executor}), not here.",
                "not_available",
            )
            return part
        ready = self._rerun(part, bound)  # look the tool up, bind and validate, as for a rerun
        if ready is not None:
            part.status = "running"
            async for _ in self._execute_all([ready], checkpoint=False):
                pass
            if ready.asked is not None:
                self._fail(
                    part,
                    f"Tool {part.name!r} asked a person a question while it was "
                    f"applied; a captured action must run without one.",
                    "not_available",
                )
        return part

    # -- steps 7 to 11 --------------------------------------------------------------------

    async def _execute_many(self, ready: list[_Ready]) -> AsyncIterator[Event]:
        # (`_first_to_run` says which of `ready` this starts at once: keep the two in step.)
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        emit = queue.put_nowait

        async def run_all() -> None:
            try:
                group: list[_Ready] = []
                for item in [*ready, None]:
                    if item is not None and not item.tool.sequential:
                        group.append(item)
                        continue
                    if group:
                        async with asyncio.TaskGroup() as tasks:
                            for member in group:
                                tasks.create_task(self._execute(member, emit))
                        group = []
                    if any(r.fault is not None for r in ready):
                        return  # the store is away: start nothing more (as a crash would)
                    if item is not None:
                        await self._execute(item, emit)
            finally:
                emit(None)

        runner = asyncio.create_task(run_all())
        try:
            while (event := await queue.get()) is not None:
                yield event
            await runner
        finally:
            if not runner.done():
                runner.cancel()
                await asyncio.wait([runner])

    async def _execute(self, ready: _Ready, emit: Emit) -> None:
        """Steps 7-11 for one call; never raises but for cancellation."""
        if self.trace is not None:
            await self._traced(ready, emit)
            return
        await self._execute_untraced(ready, emit)

    async def _traced(self, ready: _Ready, emit: Emit) -> None:
        tracing = self.runtime.tracing
        assert tracing is not None
        part = ready.part
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": part.name,
            "gen_ai.tool.call.id": part.id,
            "gen_ai.tool.description": ready.tool.description,
            "gen_ai.tool.type": "function",
        }
        if self.state.session_id:
            attributes["gen_ai.conversation.id"] = self.state.session_id
        if tracing.capture_content:
            attributes["gen_ai.tool.call.arguments"] = pydantic_core.to_json(
                part.args, fallback=str
            ).decode()
        span = tracing.start(f"execute_tool {part.name}", self.trace, attributes)
        try:
            with tracing.current(span):  # the tool's own spans nest under this one
                await self._execute_untraced(ready, emit)
            if ready.error is not None:
                tracing.exception(span, *ready.error)
        except BaseException as exc:
            tracing.fail(span, f"{type(exc).__name__}: {exc}", type(exc).__name__)
            raise
        finally:
            span.set_attribute("handrail.tool.status", part.status)
            result = part.result
            if result is not None:
                if not result.ok:
                    tracing.fail(span, result.error or "failed", "tool_error")
                elif tracing.capture_content:
                    span.set_attribute(
                        "gen_ai.tool.call.result",
                        pydantic_core.to_json(result.data, fallback=str).decode(),
                    )
            span.end()

    async def _execute_untraced(self, ready: _Ready, emit: Emit) -> None:
        part, tool = ready.part, ready.tool
        journal = self.journal
        if journal is not None and tool.permission != "read":
            # Logged `started` right before it runs: a call the store's absence (or a lost
            # lease) stops here never ran, and the log says so (no entry), so recovery runs
            # it rather than asking whether it did.
            try:
                await journal.started(ready.log_id, part, idempotency_key(self.state, part))
            except Exception as fault:  # raised by `_execute_all` once the siblings are done
                ready.fault = fault
                return
        begun = time.perf_counter()
        try:
            output = await self._invoke(ready, emit)
            result = tool.to_result(output)
        except AskPerson as ask:  # it waits for a person: its card comes once the calls end
            ready.asked = ask.prompt
            part.duration_ms = (time.perf_counter() - begun) * 1000.0
            return
        except ModelRetry as exc:
            result = ToolResult.failure(exc.message, code=exc.code or "tool_error")
        except TimeoutError as exc:
            result = (
                ToolResult.failure(
                    f"Tool {part.name!r} timed out after {tool.timeout:g} s; it may be slow or "
                    f"stuck. Try again later or with a smaller request.",
                    code="timed_out",
                )
                if tool.timeout is not None
                else ToolResult.failure(f"TimeoutError: {exc}")
            )
        except Exception as exc:
            reference = self._raised(part, exc, f"Tool {part.name!r} raised")
            ready.error = (exc, reference)
            result = ToolResult.failure(f"{type(exc).__name__}: {exc} (reference {reference})")
        if ready.warnings:  # what `normalize` repaired reaches the model with the result
            result = replace(result, warnings=[*(result.warnings or []), *ready.warnings])
        await self._finish(part, tool, result, ready.key)
        part.duration_ms = (time.perf_counter() - begun) * 1000.0
        if self.journal is not None and tool.permission != "read":
            try:
                await self.journal.finished(ready.log_id, part, part.result or result)
            except Exception as fault:  # raised by `_execute_all` once the siblings are done
                ready.fault = fault
                return  # not completed on record: the turn's recovery settles it from the log
        emit(completed_event(part))

    def _raised(self, part: ToolCallPart, error: Exception, what: str) -> str:
        """Log what the application's code raised for `part`, once; its reference."""
        reference = new_reference()
        log_failure(
            _log,
            what,
            error,
            reference=reference,
            session_id=self.state.session_id,
            call_id=part.id,
            tool=part.name,
            agent=self.agent,
            run_id=self.state.run_id or None,
        )
        return reference

    async def _finish(
        self, part: ToolCallPart, tool: Tool[Any] | None, result: ToolResult, key: str | None
    ) -> None:
        """Steps 8-11: digest, capture, result hooks, stamp."""
        state = self.state
        if result.ok and tool is not None:
            if tool.digest is not None:  # 8. digest (and the summary line)
                try:
                    part.digest = tool.digest(result.data)
                except Exception as exc:
                    part.digest = {"error": f"digest failed: {type(exc).__name__}: {exc}"}
            if tool.summary is not None and result.summary is None:
                try:
                    result.summary = tool.summary(result.data)
                except Exception as exc:
                    result.summary = f"(summary failed: {type(exc).__name__}: {exc})"
            state.context.record(part.name, part.id, result.data)  # 9. capture
            if tool.cache_ttl is not None and key is not None:
                state.tool_cache[key] = (part.started_at or 0.0) + tool.cache_ttl, result
        result = await self._hooks(part, result)  # 10. result hooks
        if not result.ok and result.code is None:  # a failed result the tool made, no code
            result.code = "tool_error"
        if result.summary is None:  # the line events show, kept with the history too
            result.summary = result.display_summary()
        part.result = result  # 11. stamp
        part.status = "completed" if result.ok else "failed"
        state.usage.tool_calls += 1

    def _context(
        self, part: ToolCallPart, tool: Tool[Any], answer: ApprovalCardPart | None = None
    ) -> ToolContext[Any]:
        state = self.state
        return ToolContext(
            deps=self.runtime.deps,
            context=state.context,
            agent=self.agent,
            tool_name=tool.name,
            tool_call_id=part.id,
            run_id=state.run_id,
            org_id=state.org_id,
            user_id=state.user_id,
            session_id=state.session_id,
            state=state.domain_state,
            turn_context=state.turn_context,
            idempotency_key=idempotency_key(state, part),
            answer=None if answer is None else answer.output,
            answered_by=None if answer is None else answer.decided_by,
            messages=state.messages,
        )

    async def _invoke(self, ready: _Ready, emit: Emit) -> Any:
        tool = ready.tool
        function = tool.function
        assert function is not None  # server tools always have one (checked at definition)
        if tool.takes_ctx:
            context = self._context(ready.part, tool, ready.answer)
            call: Callable[[], Any] = functools.partial(function, context, **ready.kwargs)
        else:
            call = functools.partial(function, **ready.kwargs)
        if tool.timeout is None:
            return await self._run(tool, call, ready.part.id, emit)
        async with asyncio.timeout(tool.timeout):
            return await self._run(tool, call, ready.part.id, emit)

    async def _run(self, tool: Tool[Any], call: Callable[[], Any], call_id: str, emit: Emit) -> Any:
        if tool.kind == "async":
            return await call()
        if tool.kind == "sync":
            return await self.runtime.workers.run(call)
        output: Any = None
        async for item in call():
            if not isinstance(item, ToolResult):
                emit(ToolProgress(tool_call_id=call_id, progress=jsonable(item)))
            output = item
        return output

    async def _hooks(self, part: ToolCallPart, result: ToolResult) -> ToolResult:
        runtime = self.runtime
        try:
            if runtime.on_tool_result is not None:
                observed = runtime.on_tool_result(part, result)
                if inspect.isawaitable(observed):
                    await observed
            if runtime.transform_tool_result is not None:
                result = runtime.transform_tool_result(part, result)
        except Exception as exc:
            reference = self._raised(part, exc, f"A result hook failed on {part.name!r}")
            return ToolResult.failure(
                f"a result hook failed: {type(exc).__name__}: {exc} (reference {reference})",
                code="tool_error",
            )
        return result


def _call_key(name: str, args: dict[str, Any]) -> str:
    """A call's identity for dedup and the idempotent cache: its name and canonical arguments."""
    return name + "\x00" + pydantic_core.to_json(args).decode()


def completed_event(part: ToolCallPart) -> ToolCallCompleted:
    """The `tool-call-completed` event of a part whose result is final."""
    result = part.result
    assert result is not None
    return ToolCallCompleted(
        tool_call_id=part.id,
        name=part.name,
        ok=result.ok,
        status=part.status,
        summary=result.display_summary(),
        digest=part.digest,
        error=result.error,
        code=None if result.ok else result.code,
        reused_from=part.reused_from,
        duration_ms=part.duration_ms,
        executor=part.executor,
    )


def _unknown_tool(name: str, tools: Mapping[str, Tool[Any]]) -> str:
    close = difflib.get_close_matches(name, list(tools), n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    available = ", ".join(sorted(tools)) or "none"
    return f"Unknown tool {name!r}.{hint} Available tools: {available}."


def _transform_takes_ctx(function: Callable[..., Any]) -> bool:
    """Whether a `transform_args` hook takes the call's `ToolContext` (a third argument)."""
    return positional_count(function) >= 3


def _first_to_run(ready: list[_Ready]) -> list[_Ready]:
    """The calls of `ready` that `_execute_all` starts at once.

    The parallel ones before the first sequential call, or that one alone.
    """
    first: list[_Ready] = []
    for item in ready:
        if item.tool.sequential:
            return first or [item]
        first.append(item)
    return first
