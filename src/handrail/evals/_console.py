"""The console `handrail eval` prints its tables to: a terminal's width, or wide in a log.

At a terminal a table fits the window. Elsewhere (a CI log, a file, a pipe) rich would
assume 80 columns and wrap each reason into a narrow column, so a table is printed as wide
as its cells need (up to `WIDEST`); a log does not wrap lines, and a reader can grep them.
"""

from __future__ import annotations

from rich.console import Console, RenderableType

__all__ = ["WIDEST", "show"]

WIDEST = 400
"""The widest a table is printed when stdout is not a terminal: a reason longer than a line
of that is printed whole on its `FAIL` line below the table anyway."""


def show(out: Console, renderable: RenderableType) -> None:
    """Print `renderable`: at the terminal's width, or, off a terminal, as wide as it needs."""
    if not out.is_terminal:
        needed = out.measure(renderable, options=out.options.update_width(WIDEST)).maximum
        out.width = max(out.width, min(needed, WIDEST))
    out.print(renderable)
