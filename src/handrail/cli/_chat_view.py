"""How `handrail chat` draws a turn: a terminal view (rich), or JSON lines for scripts."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console

from ..events import (
    EVENT,
    AgentCompleted,
    AgentStarted,
    ApprovalRequired,
    Event,
    InputRequired,
    RunCompleted,
    RunFailed,
    RunSuspended,
    TextDelta,
    ToolCallCompleted,
    ToolCallStarted,
)
from ..messages import ApprovalCardPart
from ..suspension import Decision

__all__ = ["ChatView", "JsonView"]


class ChatView:
    """Draws a turn's events: the reply as it streams, a line a tool call, spinners.

    A spinner runs while the model or a tool works (`Console.status`).
    """

    def __init__(self, console: Console, *, supervisor: str | None = None) -> None:
        self.console = console
        self.supervisor = supervisor
        self._status: Any = None
        self._streaming = False

    def working(self, what: str) -> None:
        """Show a spinner saying `what` is going on (until the next output)."""
        if self._status is None:
            self._status = self.console.status(what)
            self._status.start()
        else:
            self._status.update(what)

    def idle(self) -> None:
        """Stop the spinner."""
        if self._status is not None:
            self._status.stop()
            self._status = None

    def end_text(self) -> None:
        if self._streaming:
            self.console.print()
            self._streaming = False

    def event(self, event: Event) -> None:
        """Draw one event."""
        from rich.text import Text

        from .._cards import outcome_line

        out = self.console
        match event:
            case AgentStarted(agent=agent):
                self.end_text()
                self.working(f"{agent} is thinking…")
            case TextDelta(agent=agent) if agent == self.supervisor:
                pass  # its decision is drawn when it completes
            case AgentCompleted(agent=agent, output={"route": route, **more}) if (
                agent == self.supervisor
            ):
                why = more.get("reason")
                out.print(f"[magenta]  ↳ route {route}[/]{f': {why}' if why else ''}")
            case TextDelta(agent=agent, delta=delta):
                self.idle()
                if not self._streaming:
                    out.print(Text(f"{agent}: ", style="bold green"), end="")
                    self._streaming = True
                out.print(delta, end="", markup=False, highlight=False, soft_wrap=True)
            case ToolCallStarted(name=name, args=args):
                self.end_text()
                shown = ", ".join(
                    f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in (args or {}).items()
                )
                self.working(f"running {name}({shown})…")
            case ToolCallCompleted() as done:
                self.idle()
                mark, style = ("✓", "green") if done.ok else ("✗", "red")
                out.print(
                    Text.assemble(
                        ("  " + mark + " " + done.name, style), (" → ", "dim"), outcome_line(done)
                    )
                )
                self.working("thinking…")
            case ApprovalRequired() | InputRequired():
                self.idle()
                self.end_text()
            case RunSuspended(pending=pending):
                self.idle()
                self.end_text()
                out.print(Text(f"⏸ waiting for {len(pending)} decision(s)", style="yellow"))
            case RunCompleted(stop_reason=stop, finish_reason=finish):
                self.idle()
                self.end_text()
                if stop == "cut":
                    out.print(Text(f"✂ the answer was cut off ({finish})", style="yellow"))
            case RunFailed(reason=reason, error=error, reference=reference):
                self.idle()
                self.end_text()
                where = f" (reference {reference})" if reference else ""
                out.print(
                    Text(f"✗ the turn failed ({reason}): {error or ''}{where}", style="bold red")
                )
            case _:
                pass

    def card(self, card: ApprovalCardPart) -> None:
        from .._cards import approval_card

        self.idle()
        self.console.print(approval_card(card))

    def refused(self, card: ApprovalCardPart, decision: Decision, reason: str) -> None:
        verb = {"approve": "approve", "reject": "reject", "answer": "answer"}
        self.console.print(
            f"[bold red]✗ refused:[/] you may not {verb.get(decision.decision, 'decide')} "
            f"{card.tool_name}: {reason} Nothing was recorded.",
            highlight=False,
        )

    def decided(self, card: ApprovalCardPart, decision: Decision) -> None:
        verb = {"approve": "approved", "reject": "rejected", "answer": "answered"}
        amended = getattr(decision, "amended_args", None)
        note = f", amended: {json.dumps(amended, ensure_ascii=False)}" if amended else ""
        self.console.print(
            f"[dim]{verb.get(decision.decision, decision.decision)} {card.tool_name}{note}[/]",
            highlight=False,
        )


class JsonView:
    """Writes each event as a JSON line on standard output, and nothing else."""

    def event(self, event: Event) -> None:
        typer.echo(EVENT.dump_json(event).decode())

    def card(self, card: ApprovalCardPart) -> None:
        pass

    def decided(self, card: ApprovalCardPart, decision: Decision) -> None:
        pass

    def refused(self, card: ApprovalCardPart, decision: Decision, reason: str) -> None:
        typer.echo(f"refused: {card.tool_name} (call {card.tool_call_id}): {reason}", err=True)

    def idle(self) -> None:
        pass
