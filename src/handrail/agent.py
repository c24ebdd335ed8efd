"""`Agent`: a named model loop with instructions, tools and an optional output type.

An `Agent` is what it declares (`AgentSpec`: the loop and the turn need no more) and can run
itself: `run` and `run_stream` run one user turn of it alone, through the turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from ._agent_spec import CONTINUE_PROMPT as CONTINUE_PROMPT
from ._agent_spec import DEFAULT_NUDGE as DEFAULT_NUDGE
from ._agent_spec import AgentSpec
from ._turn import run_turn
from .state import RunState

if TYPE_CHECKING:
    from ._loop import AgentResult, AgentRun
    from .models import Model
    from .runtime import Runtime

__all__ = ["Agent"]

OutputT = TypeVar("OutputT")


class Agent(AgentSpec[OutputT]):
    """An agent: instructions, tools, and the limits of its loop, which can run itself.

    What it declares is its `AgentSpec` (all the loop and the turn use); `run` and
    `run_stream` run one turn of it alone.

    Args:
        name: identifies the agent in events, history and routes.
        instructions: the system prompt, or a function that returns it: of the run state
            (`instructions(state)`), or of the run state and the turn's per-turn context
            (`instructions(state, context)`, the context as `submit(context=...)` gave it,
            None without one): the only way the model sees that context.
        tools: what the agent may call (its allow-list); names must be unique.
        model: the agent's model; when None the runtime's default is used.
        max_iterations: model calls this agent may make in one turn (default 10); reaching
            the cap ends the agent's turn with a message that says so.
        min_tool_calls: when the model answers before making this many tool calls, one
            synthetic nudge (visible in history, marked synthetic) asks it to use its tools.
        output_type: a type (usually a pydantic model) the final answer must validate
            against; invalid output is sent back once with the validation error.
        nudge: the text of the `min_tool_calls` nudge (`{n}` is replaced by the minimum).
        scratch: keep this agent's messages (its tool calls, its nudges, its answer) out of
            the conversation, in the turn's scratch: the next agent of the route gets its
            answer as a handoff; as the last agent of a route, its answer is published.
        continue_on_length: how many times, in one turn, the loop asks the model to go on
            with a text answer that its output token limit cut (the answer is then the
            pieces joined). 0 (the default): a cut answer ends the turn as it is, marked
            `stop_reason="cut"` (and `finish_reason="length"`) on the result and on
            `run-completed`. Tool calls of a cut response are never run, whatever this says.
        expires_after: how long this agent's waiting calls accept a decision, for tools that
            set none: seconds, a `Deadlines` (by kind of card), or None (no deadline). Default
            (`INHERIT`): the domain's, else the runtime's `pending_ttl`.
        tools_for: chooses the tools a turn may see and call from its caller (a function of
            a `TurnInfo`: org, user, roles) returning the allowed names (None: all); e.g.
            `by_role({...})`. A tool left out is never shown to the model and a call to it is
            an `unknown_tool` error. Applied with the domain's (`Domain(tools_for=...)`).
        tool_menu: append a menu of the turn's tools, grouped by `category`, to the
            instructions (`render_tool_menu`).
    """

    def run_stream(
        self,
        prompt: str | None,
        *,
        state: RunState | None = None,
        runtime: Runtime[Any] | None = None,
        model: Model | str | None = None,
        context: Any = None,
    ) -> AgentRun[OutputT]:
        """Run one user turn of this agent alone, as a stream of events.

        Iterate the returned `AgentRun` for events; afterwards `run.result` holds the
        outcome and the new state. The events start with `run-started` and end with
        exactly one of `run-completed`, `run-suspended`, `run-failed`.

        Args:
            prompt: the user's message (None to continue the state's conversation as is).
            state: the session state to continue (a new one when None).
            runtime: dependencies, hooks, clock and ids (defaults when None).
            model: a per-turn model override (before the agent's and the runtime's).
            context: the per-turn context (the page, the record the user is on): kept on the
                state (`state.turn_context`) for this turn, read by tools
                (`ctx.turn_context`), bindings (`sys:context.<field>`) and
                `instructions(state, context)`; never shown to the model otherwise. An agent
                has no domain to validate it: it is taken as given, but string instructions
                must find the `{context.<field>}` they read.

        Raises:
            InvalidContextError: the instructions read a `{context.<field>}` that `context`
                lacks (or no context was given); nothing has run.
        """
        if prompt is not None:  # a new turn carries its own context
            self.check_context(context)
            state = state if state is not None else RunState()
            state.turn_context = context
        run: AgentRun[OutputT] = run_turn(self, prompt, state=state, runtime=runtime, model=model)
        return run

    async def run(
        self,
        prompt: str | None,
        *,
        state: RunState | None = None,
        runtime: Runtime[Any] | None = None,
        model: Model | str | None = None,
        context: Any = None,
    ) -> AgentResult[OutputT]:
        """Run one user turn to its end and return the result (see `run_stream`)."""
        run = self.run_stream(prompt, state=state, runtime=runtime, model=model, context=context)
        return await run.finish()
