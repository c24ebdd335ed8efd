"""`handrail eval`: run a suite with a progress bar, print a table, write reports.

```
handrail eval evals/support_desk.yaml --json report.json --junit junit.xml
handrail eval evals/support_desk.yaml --baseline report.json
handrail eval evals/support_desk.yaml --compare draft.yaml pinned.yaml
handrail eval evals/documents/suite.yaml --json numbers.json   # kind: documents
```

Exits 1 when a scenario fails (a documents suite: when a threshold is missed), or with one
line on stderr when the suite cannot be run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from ..exceptions import HandrailError
from ._config import AgentConfig, load_config
from ._console import show
from ._documents_cli import documents_command
from ._load import load_suite, suite_kind
from ._report import BaselineDiff, diff_baseline, read_report, to_json, to_junit
from ._result import ScenarioResult, SuiteResult
from ._runner import run_suite
from ._suite import Suite

__all__ = ["eval_command"]


def eval_command(
    suite: Annotated[
        Path, typer.Argument(help="The suite: a YAML file, or a .py file that defines `suite`.")
    ],
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the JSON report here.")
    ] = None,
    junit: Annotated[Path | None, typer.Option(help="Write a JUnit XML report here.")] = None,
    baseline: Annotated[
        Path | None,
        typer.Option(help="A saved JSON report: list regressions and improvements against it."),
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="Scenarios at once (default: the suite's).")
    ] = None,
    timings: Annotated[
        bool, typer.Option(help="Put wall-clock latency in the reports (no longer byte-stable).")
    ] = False,
    compare: Annotated[
        tuple[Path, Path] | None,
        typer.Option(
            metavar="DRAFT PINNED",
            help="Run the suite on two agent configurations and show them side by side.",
        ),
    ] = None,
) -> None:
    """Run an eval suite: a table of results, JSON and JUnit reports, exit 1 on a failure."""
    out = Console(highlight=False)
    try:
        documents = suite_kind(suite) == "documents"
        if documents and (baseline is not None or compare):
            raise typer.BadParameter("--baseline and --compare are for suites of scenarios.")
    except (HandrailError, typer.BadParameter) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    if documents:
        documents_command(
            suite, json_path=json_path, junit=junit, timings=timings, concurrency=concurrency
        )
        return
    try:
        loaded = load_suite(suite)
        configs = [load_config(path) for path in compare] if compare else []
        if configs and baseline is not None:
            raise typer.BadParameter("--baseline compares one run; drop it with --compare.")
        runs = [_run(loaded, concurrency, c) for c in configs] or [_run(loaded, concurrency, None)]
        previous = read_report(baseline) if baseline is not None else None
    except (HandrailError, OSError, typer.BadParameter) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    show(out, _side_by_side(runs) if configs else _table(runs[0]))
    for run in runs:
        for scenario in run.failed:
            label = f"{scenario.name} [{run.config}]" if run.config else scenario.name
            for failure in scenario.failures:
                out.print(
                    f"FAIL {label}: {failure.assertion}: {failure.reason}",
                    markup=False,
                    soft_wrap=True,
                )
    if previous is not None:
        _print_diff(out, baseline, diff_baseline(previous, runs[0]))
    report: SuiteResult | list[SuiteResult] = runs if configs else runs[0]
    if json_path is not None:
        json_path.write_text(to_json(report, timings=timings), encoding="utf-8")
    if junit is not None:
        junit.write_text(to_junit(report, timings=timings), encoding="utf-8")
    failed = sum(len(run.failed) for run in runs)
    total = sum(len(run.scenarios) for run in runs)
    out.print(f"{total - failed} passed, {failed} failed")
    if failed:
        raise typer.Exit(1)


def _run(suite: Suite, concurrency: int | None, config: AgentConfig | None) -> SuiteResult:
    label = f"{suite.name} [{config.name}]" if config is not None else str(suite.name)
    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,  # in a log, no bar (and no blank line it leaves)
    ) as progress:
        task = progress.add_task(label, total=len(suite.scenarios))

        def advance(result: ScenarioResult) -> None:
            progress.advance(task)

        return asyncio.run(
            run_suite(suite, concurrency=concurrency, config=config, on_result=advance)
        )


def _mark(result: ScenarioResult) -> Text:
    return Text("pass", style="green") if result.passed else Text("FAIL", style="bold red")


def _table(run: SuiteResult) -> Table:
    table = Table(title=f"handrail eval · {run.suite}", title_justify="left")
    table.add_column("scenario", overflow="fold")
    table.add_column("result")
    table.add_column("reason", overflow="fold")
    table.add_column("calls", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("latency", justify="right")
    for result in run.scenarios:
        table.add_row(
            result.name,
            _mark(result),
            Text(result.reason),
            str(result.model_calls),
            "-" if result.tokens is None else str(result.tokens),
            f"{result.latency * 1000:.0f} ms",
        )
    return table


def _side_by_side(runs: list[SuiteResult]) -> Table:
    draft, pinned = runs
    table = Table(title=f"handrail eval · {draft.suite}: compare", title_justify="left")
    table.add_column("scenario", overflow="fold")
    for run in runs:
        table.add_column(str(run.config))
        table.add_column("reason", overflow="fold")
        table.add_column("calls", justify="right")
        table.add_column("tokens", justify="right")
    for left, right in zip(draft.scenarios, pinned.scenarios, strict=True):
        name = Text(left.name, style="bold" if left.passed != right.passed else "")
        cells: list[Text | str] = [name]
        for result in (left, right):
            cells += [
                _mark(result),
                Text(result.reason),
                str(result.model_calls),
                "-" if result.tokens is None else str(result.tokens),
            ]
        table.add_row(*cells)
    return table


def _print_diff(out: Console, path: Path | None, diff: BaselineDiff) -> None:
    counts = (
        f"{len(diff.regressions)} regression(s), {len(diff.improvements)} improvement(s), "
        f"{len(diff.new)} new, {len(diff.missing)} missing"
    )
    out.print(f"Against the baseline {path}: {counts}", markup=False, soft_wrap=True)
    for result in diff.regressions:
        line = f"  regression {result.name}: passed, now fails ({result.reason})"
        out.print(line, markup=False, soft_wrap=True)
    for result in diff.improvements:
        out.print(f"  improvement {result.name}: failed, now passes", markup=False)
    for result in diff.new:
        state = "passes" if result.passed else "fails"
        out.print(f"  new {result.name}: {state}", markup=False)
    for name in diff.missing:
        out.print(f"  missing {name}: in the baseline, not in this suite", markup=False)
