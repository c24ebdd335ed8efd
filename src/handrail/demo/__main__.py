"""`python -m handrail.demo`: the support-desk scenario, rendered in the terminal with rich.

Only rendering and the command line live here; the scenario is `support_desk.py`. On an
interactive terminal tool calls and the reply are drawn live; anywhere else (CI, a pipe) the
same events are printed line by line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

try:
    from rich.console import Console, Group, RenderableType
    from rich.live import Live
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.spinner import Spinner
    from rich.table import Table
    from rich.text import Text
except ImportError:  # pragma: no cover - rich ships with the dev and demo extras
    sys.exit('The demo draws with rich: pip install "handrail[demo]"')

from handrail import (
    AgentCompleted,
    AgentResult,
    AgentRun,
    AgentStarted,
    Answer,
    ApprovalRequired,
    Approve,
    ConfigError,
    Decision,
    Event,
    InputRequired,
    Reject,
    RunCompleted,
    RunFailed,
    RunSuspended,
    TextDelta,
    ToolCallCompleted,
    ToolCallStarted,
)
from handrail._cards import Ask, approval_card, ask_decision, outcome_line
from handrail.demo.policy_desk import POLICY_QUESTIONS, PRICE_MATCH_ANSWER, build_policy_desk
from handrail.demo.support_desk import Scenario, build_scenario
from handrail.models import Model, as_model, infer
from handrail.store import MemoryStore, SqliteStore

NO_MODEL = (
    "--model {spec}: {error}\n"
    "Real models come with the openai/anthropic extras, for example:\n"
    '  pip install "handrail[openai]"; export OPENAI_API_KEY=...; --model openai:gpt-4o-mini\n'
    "Run without --model for the offline scripted demo."
)


def main(
    argv: Sequence[str] | None = None,
    *,
    console: Console | None = None,
    ask: Ask | None = None,
) -> int:
    """Run the demo from the command line.

    Args:
        argv: the arguments (default: `sys.argv[1:]`).
        console: where to draw (default: a `Console` on standard output).
        ask: how to ask for the approval decision (default: the terminal, when standard input
            is one; otherwise nobody is asked and the refund is rejected by default).

    Returns:
        The exit status: 0 when the scenario ran as scripted, 1 when the run failed, 2 for
        a usage error (such as a `--model` that cannot be used: the message says why).
    """
    args = _parser().parse_args(argv)
    model: Model | None = None
    if args.model is not None:
        try:
            model = infer(args.model)
        except ConfigError as exc:
            Console(stderr=True).print(
                NO_MODEL.format(spec=args.model, error=exc),
                style="red",
                markup=False,
                soft_wrap=True,
            )
            return 2
    console = console or Console()
    if ask is None and sys.stdin is not None and sys.stdin.isatty():
        ask = console.input
    decide = _decider(args.decision, ask)
    return asyncio.run(_run(args, console, decide, model, _answerer(ask)))


async def _run(
    args: argparse.Namespace,
    console: Console,
    decide: Decide,
    model: Model | None,
    answer: AnswerQuestion,
) -> int:
    # A throwaway demo: its audit trail is unkeyed, deliberately (docs/audit.md).
    store = SqliteStore(args.db, audit_key=None)
    try:
        scenario = build_scenario(
            latency=0.6 if args.slow else 0.0,
            store=store,
            session_id=f"support-{os.urandom(4).hex()}",
        )
        if model is not None:  # the same agent, tools and engine: only the model changes
            scenario.engine.runtime.model = model
        status = await play(scenario, console, decide, pace=0.04 if args.slow else 0.0)
        if status == 0 and not args.no_documents:
            status = await play_policies(console, answer, pace=0.04 if args.slow else 0.0)
    finally:
        await store.close()
        close = getattr(model, "aclose", None)
        if close is not None:
            await close()
    console.print(
        Text(f"Session {scenario.session_id} is saved in {args.db} (SQLite).", style="dim")
    )
    console.print(Text("See it in the browser: make web", style="dim"))
    return status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m handrail.demo",
        description="A support-desk agent: on a scripted model (offline), or on a real one.",
    )
    parser.add_argument(
        "--model",
        metavar="SPEC",
        help="a real model instead of the script: openai:gpt-4o-mini, "
        "anthropic:claude-sonnet-4-6, or openai-compatible:MODEL@BASE_URL (needs its API key "
        "in the environment)",
    )
    parser.add_argument(
        "--slow", action="store_true", help="pause in tools and between words, to watch it live"
    )
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument(
        "--yes",
        dest="decision",
        action="store_const",
        const="approve",
        help="approve the refund as proposed, without asking",
    )
    choice.add_argument(
        "--no",
        dest="decision",
        action="store_const",
        const="reject",
        help="reject the refund, without asking",
    )
    parser.add_argument(
        "--no-documents",
        action="store_true",
        help="skip the policy questions answered from the shop's documents",
    )
    parser.add_argument(
        "--db",
        default="handrail-demo.db",
        metavar="PATH",
        help="the SQLite file the session is saved in (default: %(default)s)",
    )
    return parser


Decide = Callable[[ApprovalRequired], tuple[Decision, str]]
"""Turns an approval card into a decision and a line saying how it was made."""

NOBODY = (
    "Nobody to ask: standard input is not a terminal, so the refund is rejected by default. "
    "Run `make demo` in a terminal to decide, or pass --yes to approve."
)


def _decider(preset: str | None, ask: Ask | None) -> Decide:
    def decide(card: ApprovalRequired) -> tuple[Decision, str]:
        if preset == "approve":
            return Approve(by="you (--yes)"), "--yes: approved as proposed."
        if preset == "reject":
            return Reject(reason="rejected with --no", by="you (--no)"), "--no: rejected."
        if ask is None:
            return Reject(reason="nobody was there to approve it", by="the demo"), NOBODY
        return _ask(card, ask)

    return decide


def _ask(card: ApprovalRequired, ask: Ask) -> tuple[Decision, str]:
    amount = card.args.get("amount")
    question = (
        f"Approve the refund of €{amount:.2f}? [bold]y[/]es / [bold]n[/]o / "
        f"or type another amount (e.g. 40): "
    )
    decision = ask_decision(card, ask, question=question, by="you")
    if decision is None:
        return Reject(reason="nobody answered", by="the demo"), NOBODY
    if isinstance(decision, Reject):
        return decision, "You rejected the refund."
    if isinstance(decision, Approve) and decision.amended_args:
        new = decision.amended_args["amount"]
        return decision, f"You approved the refund, amended to €{new:.2f}."
    return decision, "You approved the refund as proposed."


async def play(scenario: Scenario, console: Console, decide: Decide, *, pace: float = 0.0) -> int:
    """Render the scenario on `console`: three turns, each routed by the supervisor.

    The refund pauses for the approval, then the same turn resumes.

    Args:
        scenario: the scenario to run.
        console: where to draw.
        decide: turns the refund's approval card into a decision.
        pace: seconds to wait after each text delta (0: as fast as the model streams).

    Returns:
        The exit status: 1 when a run failed, else 0.
    """
    console.print(_header(scenario.engine.assembly.default_model or scenario.engine.runtime.model))
    transcript = Transcript(console, pace=pace)
    result: AgentResult[Any] | None = None
    for message in scenario.messages:
        console.print(Text.assemble(("\nCustomer  ", "bold cyan"), message))
        transcript.card = None
        result = await _show(scenario.submit(message), transcript)
        if result.outcome == "suspended" and transcript.card is not None:
            decision, how = decide(transcript.card)
            await scenario.resolve(decision)
            console.print(Text.assemble(("✔ Decision recorded", "bold"), f": {how}"))
            console.print(Text("Resuming the same turn…", style="dim"))
            result = await _show(scenario.resume(), transcript)
        if result.outcome == "failed":
            break
    assert result is not None
    console.print(_summary(transcript, result, refunds=len(scenario.desk.refunds)))
    return 1 if result.outcome == "failed" else 0


AnswerQuestion = Callable[[InputRequired], tuple[Decision, str]]
"""Turns a question a tool asked a person into an answer and a line saying who gave it."""


def _answerer(ask: Ask | None) -> AnswerQuestion:
    def answer(card: InputRequired) -> tuple[Decision, str]:
        if ask is not None:
            typed = ask("Your answer (Enter for your colleague Ana's): ").strip()
            if typed:
                return Answer(output=typed, by="you"), "You answered."
        return (
            Answer(output=PRICE_MATCH_ANSWER, by="Ana"),
            "Your colleague Ana answered (played by the demo).",
        )

    return answer


async def play_policies(console: Console, answer: AnswerQuestion, *, pace: float = 0.0) -> int:
    """Policy questions answered from the shop's documents, one escalated to a person.

    The documents (a Markdown file and a PDF) are ingested into a temporary index with the
    real embedder; a question they answer is answered with its citation; one they cannot goes
    to a person, whose answer is the reply and becomes a note the next question finds.

    Returns:
        The exit status: 1 when a run failed, else 0.
    """
    import tempfile

    console.print(Text("\nPolicy questions, answered from the shop's documents", style="bold"))
    with tempfile.TemporaryDirectory(prefix="handrail-demo-") as index:
        desk = await build_policy_desk(index, store=MemoryStore(audit_key=None))
        try:
            count = await desk.library.index.count()
            console.print(
                Text(
                    f"Ingested refunds.md and shipping.pdf: {count} chunks, embedded offline "
                    f"(all-MiniLM-L6-v2).",
                    style="dim",
                )
            )
            transcript = Transcript(console, pace=pace)
            for question in POLICY_QUESTIONS:
                console.print(Text.assemble(("\nCustomer  ", "bold cyan"), question))
                transcript.question = None
                result = await _show(desk.submit(question), transcript)
                if result.outcome == "suspended" and transcript.question is not None:
                    decision, how = answer(transcript.question)
                    await desk.resolve(decision)
                    console.print(Text.assemble(("✔ Answer recorded", "bold"), f": {how}"))
                    result = await _show(desk.resume(), transcript)
                if result.outcome == "failed":
                    return 1
        finally:
            await desk.close()
    return 0


async def _show(run: AgentRun[Any], transcript: Transcript) -> AgentResult[Any]:
    async for event in run:
        await transcript.show(event)
    transcript.close()
    return run.result


def _header(model: Model | str | None) -> Panel:
    if isinstance(model, str):  # never after `Runtime.__post_init__`, but the type allows it
        model = as_model(model, where="the demo's model")
    if model is not None and model.name != "scripted":
        body = Text.assemble(
            (f"Model: {model.name}", "bold magenta"),
            " (live): a real model plays the agent, on the same tools, loop and engine as the "
            "scripted demo. Its answers, and so the story, may differ from run to run.",
        )
        return Panel(body, title="handrail demo · support desk", title_align="left", expand=False)
    body = Text.assemble(
        ("Model: SCRIPTED", "bold magenta"),
        " (offline, deterministic): a fixed script plays the model's turns, with no "
        "network and no API key. The tools, the agent loop and the dispatch pipeline are the "
        "real ones.\n\n",
        ("Run it on a real model", "bold"),
        " with the openai or anthropic extra:\n"
        '  pip install "handrail[openai]"\n'
        "  export OPENAI_API_KEY=...\n"
        "  python -m handrail.demo --model openai:gpt-4o-mini",
    )
    return Panel(body, title="handrail demo · support desk", title_align="left", expand=False)


_SPEAKERS = frozenset({"responder", "librarian"})
"""The agents whose text is the reply to the customer."""


@dataclass(slots=True)
class _Call:
    """One tool call as drawn: its line changes as the call runs."""

    name: str
    args: dict[str, Any] | None
    state: Literal["running", "ok", "failed", "waiting"] = "running"
    note: str = ""

    def line(self) -> Text:
        if self.state == "running":
            return Text.assemble((self.name, "bold"), (f"({_args(self.args)})", "dim"))
        mark, style = {"ok": ("✓", "green"), "failed": ("✗", "red"), "waiting": ("⏸", "yellow")}[
            self.state
        ]
        return Text.assemble((f"{mark} {self.name}", style), (" → ", "dim"), self.note)

    def render(self) -> RenderableType:
        if self.state == "running":
            return Spinner("dots", text=self.line(), style="cyan")
        return self.line()


class Transcript:
    """Draws a run's events: live on an interactive terminal, line by line elsewhere.

    Args:
        console: where to draw.
        pace: seconds to wait after each text delta.
    """

    def __init__(self, console: Console, *, pace: float = 0.0) -> None:
        self.console = console
        self.pace = pace
        self.interactive = console.is_interactive
        self.ran = self.waiting = 0
        self.seen: set[str] = set()
        self.card: ApprovalRequired | None = None
        self.question: InputRequired | None = None
        self._calls: dict[str, _Call] = {}
        self._reply: Text | None = None
        self._live: Live | None = None
        self._column = 0
        self._space = ""

    async def show(self, event: Event) -> None:
        """Draw one event."""
        out = self.console
        match event:
            case AgentStarted(agent=agent):
                self.close()
                out.print(f"[dim]agent {agent!r} is on it[/]", highlight=False)
            case AgentCompleted(agent="supervisor", output={"route": route, "reason": why}):
                out.print(
                    Text.assemble(("  ↳ route ", "magenta"), (route, "bold magenta"), f": {why}")
                )
            case ToolCallStarted(tool_call_id=call_id, name=name, args=args):
                if self._reply is not None:
                    self.close()
                self.seen.add(call_id)
                call = self._calls[call_id] = _Call(name, args)
                self._draw(Text.assemble(("  … ", "cyan"), call.line()))
            case ToolCallCompleted(tool_call_id=call_id) as done:
                self.ran += 1
                call = self._calls.setdefault(call_id, _Call(done.name, None))
                call.state = "ok" if done.ok else "failed"
                call.note = outcome_line(done)
                self._draw(Text.assemble("  ", call.line()))
            case ApprovalRequired(tool_call_id=call_id) as asked:
                if self._reply is not None:  # a gated call's first event: it starts once approved
                    self.close()
                self.seen.add(call_id)
                self.waiting += 1
                self.card = asked
                call = self._calls.setdefault(call_id, _Call(asked.name, asked.args))
                call.state, call.note = "waiting", "waiting for approval"
                self._draw(Text.assemble("  ", call.line()))
                self.close()
                out.print(approval_card(asked))
            case InputRequired(tool_call_id=call_id, prompt=prompt) as asked:
                self.waiting += 1
                self.question = asked
                call = self._calls.setdefault(call_id, _Call(asked.name, asked.args))
                call.state, call.note = "waiting", "asks a person"
                self._draw(Text.assemble("  ", call.line()))
                self.close()
                body = Text(prompt or "", style="yellow")
                out.print(Panel(body, title=f"{asked.name} asks a person", expand=False))
            case TextDelta(agent="supervisor"):
                pass  # its decision is drawn when it completes
            case TextDelta(agent=agent, delta=delta):
                if self._reply is None:
                    self.close()
                    speaks = agent in _SPEAKERS  # to the customer, or to the team
                    style = "bold green" if speaks else "dim green"
                    label = "Agent" if speaks else f"{agent} (note for the team)"
                    out.print(Text(label, style=style))
                    self._reply = Text()
                self._reply.append(delta)
                if self.interactive:
                    self._refresh()
                else:
                    self._print_wrapped(delta)
                if self.pace:
                    await asyncio.sleep(self.pace)
            case RunSuspended(pending=pending):
                self.close()
                out.print(
                    Text.assemble(
                        ("⏸ Run suspended", "bold yellow"),
                        f": {len(pending)} call(s) wait for a decision ({', '.join(pending)}). "
                        "The session is saved: this could wait for days, or a restart.",
                    )
                )
            case RunCompleted(stop_reason="cut", finish_reason=finish):
                self.close()
                out.print(Text(f"Run completed, its answer cut off ({finish}).", style="yellow"))
            case RunCompleted():
                self.close()
                out.print(Text("Run completed.", style="dim green"))
            case RunFailed(reason=reason, error=error):
                self.close()
                out.print(Text.assemble((f"Run failed ({reason}): ", "bold red"), str(error)))
            case _:  # run-started, usage, agent-completed, progress: nothing to draw
                pass

    def close(self) -> None:
        """Finish the block being drawn (a batch of tool calls or a reply)."""
        if self._live is not None:
            self._live.stop()
            self._live = None
        elif self._reply is not None:
            self.console.print()  # end the streamed line
            self._column, self._space = 0, ""
        self._calls = {k: c for k, c in self._calls.items() if c.state == "running"}
        self._reply = None

    def _print_wrapped(self, delta: str) -> None:
        """Print streamed text as it comes, indented by two, wrapping between words."""
        for number, line in enumerate(delta.split("\n")):
            if number:
                self.console.print()
                self._column, self._space = 0, ""
            text = self._space + line
            # Trailing spaces wait for the next word, so a wrapped line does not end in one.
            self._space = text[len(text.rstrip()) :]
            text = text.rstrip()
            if not text:
                continue
            if self._column and self._column + len(text) > self.console.width:
                self.console.print()
                self._column = 0
            if not self._column:
                text = "  " + text.lstrip()
            self.console.print(text, end="", markup=False, highlight=False, soft_wrap=True)
            self._column += len(text)

    def _draw(self, line: Text) -> None:
        if self.interactive:
            self._refresh()
        else:
            self.console.print(line)

    def _refresh(self) -> None:
        view: RenderableType = (
            Padding(self._reply, (0, 0, 0, 2))
            if self._reply is not None
            else Padding(Group(*(c.render() for c in self._calls.values())), (0, 0, 0, 2))
        )
        if self._live is None:
            self._live = Live(view, console=self.console, refresh_per_second=12.5)
            self._live.start()
        else:
            self._live.update(view, refresh=True)


def _summary(transcript: Transcript, result: AgentResult[Any], *, refunds: int) -> Panel:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        "tool calls",
        f"{len(transcript.seen)} ({transcript.waiting} asked for approval)",
    )
    table.add_row("model calls", str(result.state.usage.requests))
    conversation = [m for m in result.state.messages if not m.scratch]
    table.add_row("session", f"{len(conversation)} messages")
    table.add_row("refunds made", str(refunds))
    return Panel(table, title=f"Summary · {result.outcome}", title_align="left", expand=False)


def _args(args: dict[str, Any] | None) -> str:
    if args is None:
        return "<unparsed arguments>"
    return ", ".join(f"{k}={_value(v)}" for k, v in args.items())


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


if __name__ == "__main__":
    sys.exit(main())
