"""`handrail eval` on a documents suite: a progress bar, a table of numbers, reports, exit 1.

```
handrail eval evals/documents/suite.yaml --json numbers.json --junit junit.xml
```
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from ..documents._metrics import Question
from ..exceptions import HandrailError
from ._console import show
from ._documents import (
    DocumentsResult,
    DocumentsSuite,
    Stage,
    load_documents_suite,
    run_documents_suite,
)
from ._documents_report import documents_json, documents_junit

__all__ = ["documents_command"]

_LABELS: dict[Stage, str] = {
    "ingest": "ingest",
    "retrieve": "retrieve",
    "answer": "answer",
    "judge": "judge",
}


def documents_command(
    path: Path,
    *,
    json_path: Path | None,
    junit: Path | None,
    timings: bool,
    concurrency: int | None,
) -> None:
    """Run a documents suite, print its numbers, write the reports; exit 1 on a missed threshold.

    Raises:
        typer.Exit: 1 when a threshold is not met or the suite cannot run (one line on stderr).
    """
    out = Console(highlight=False)
    try:
        suite, questions = load_documents_suite(path)
        result = _run(suite.name or path.stem, suite, questions, concurrency)
    except (HandrailError, OSError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    show(out, _table(result))
    if result.input_tokens or result.output_tokens:
        cost = (
            f"${result.cost_usd:.4f}"
            if result.cost_usd is not None
            else "unknown (the model's price is not known)"
        )
        out.print(
            f"answers: {result.input_tokens} tokens in, {result.output_tokens} out, cost {cost}"
        )
    for note in result.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)
    for check in result.failed:
        out.print(f"FAIL {check.metric}: {check.reason}", markup=False, soft_wrap=True)
    if json_path is not None:
        json_path.write_text(documents_json(result, timings=timings), encoding="utf-8")
    if junit is not None:
        junit.write_text(documents_junit(result, timings=timings), encoding="utf-8")
    failed = len(result.failed)
    out.print(f"{len(result.checks) - failed} threshold(s) met, {failed} missed")
    if failed:
        raise typer.Exit(1)


def _run(
    label: str, suite: DocumentsSuite, questions: list[Question], concurrency: int | None
) -> DocumentsResult:
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        tasks: dict[Stage, TaskID] = {}

        def advance(stage: Stage, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(f"{label} · {_LABELS[stage]}", total=total)
            progress.update(tasks[stage], completed=done, total=total)

        return asyncio.run(
            run_documents_suite(suite, questions, concurrency=concurrency, on_progress=advance)
        )


def _table(result: DocumentsResult) -> Table:
    table = Table(
        title=(
            f"handrail eval · {result.suite}: {result.files} files, {result.chunks} chunks, "
            f"{len(result.questions)} questions"
        ),
        title_justify="left",
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("of", justify="right")
    table.add_column("expect")
    table.add_column("result")
    checks = {check.metric: check for check in result.checks}
    for name, value in result.metrics.items():
        check = checks.get(name)
        mark = Text("")
        if check is not None:
            mark = Text("pass", style="green") if check.passed else Text("FAIL", style="bold red")
        table.add_row(
            name,
            "-" if value is None else f"{value:.3f}",
            result.counts.get(name, ""),
            check.threshold if check is not None else "",
            mark,
        )
    return table
