"""What every `handrail` command shares: its consoles, its one-line errors, its help's look.

A command is a function wrapped in `one_line_errors` (an error is one `error: ...` line on
stderr and exit status 1, no traceback), registered on the app in `handrail.cli`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

import typer
from rich.console import Console

from ..exceptions import HandrailError, TurnCutOffError, TurnSuspendedError

__all__ = ["CliError", "Group", "cli_message", "err", "one_line_errors", "out", "run", "when"]

P = ParamSpec("P")
T = TypeVar("T")

out = Console()
err = Console(stderr=True)


class CliError(Exception):
    """An error the command reports in one line."""


def one_line_errors(command: Callable[P, T]) -> Callable[P, T]:
    """Report what went wrong in one line on stderr and exit 1, without a traceback."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return command(*args, **kwargs)
        except (CliError, HandrailError, ImportError, OSError, ValueError) as error:
            typer.echo(f"error: {cli_message(error)}", err=True)
            raise typer.Exit(1) from None

    return run


def cli_message(error: Exception) -> str:
    """What a person at the terminal reads for `error`: what to do, in the CLI's terms.

    An exception's own message speaks to a Python caller (`engine.resume(...)`).
    """
    if isinstance(error, TurnCutOffError):
        return (
            f"Session {error.session_id!r}: the previous turn was cut off while it ran (a "
            f"crash, or a worker that stopped). `handrail serve` recovers it by itself (as "
            f"does any Worker on the same store); then chat again."
        )
    if isinstance(error, TurnSuspendedError) and not error.pending:
        return (
            f"Session {error.session_id!r} has a suspended turn whose calls are all decided: "
            f"`handrail serve` resumes it by itself (as does any Worker on the same store); "
            f"then chat again."
        )
    if isinstance(error, TurnSuspendedError):
        return (
            f"Session {error.session_id!r} has a suspended turn, waiting on decisions for "
            f"{', '.join(error.pending)} (`handrail chat --session {error.session_id}` asks "
            f"you for yours; a call its policy gives to others waits for them); the turn "
            f"resumes once none is left, then chat again."
        )
    return str(error)


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine in an event loop of its own."""
    return asyncio.run(coroutine)


def when(epoch: float) -> str:
    """A stored time as a table shows it (UTC)."""
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


# -- the help's look ------------------------------------------------------------------------


class Group(typer.core.TyperGroup):
    """The `handrail` command, whose help shows no type tags (`_untagged`)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        _untagged(self)


def _untagged(command: Any) -> None:
    """Help for `command` (and its subcommands) without typer's `<str>`/`<bool>` type tags.

    A flag shows none, an option its metavar if it has one (`--compare DRAFT PINNED`), a
    choice its values (`decision|call`); what an option takes is said by its help.
    """
    get_params = command.get_params

    def params(ctx: Any) -> Any:
        found = get_params(ctx)  # (the --help option is made here, so it is tidied here)
        for param in found:
            _untag(param)
        return found

    command.get_params = params
    for sub in getattr(command, "commands", {}).values():
        _untagged(sub)


def _untag(param: Any) -> None:
    described = getattr(param, "type_descriptor", None)
    if described is None:
        return

    def display(ctx: Any) -> str:
        if isinstance(param, typer.core.TyperOption) and param.metavar is not None:
            return str(param.metavar)
        if described.is_choice:
            return str(param.display_type(ctx)).strip("<>")
        return ""

    param.display_type_rich = display
