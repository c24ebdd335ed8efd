"""`python -m bench`: every framework x scenario, one table. See bench/run.py for the method."""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.run import FRAMEWORKS

HANDRAIL, BASELINE = "handrail", "pydantic-ai"
TARGET = "handrail target"
ROOT = Path(__file__).resolve().parent.parent  # where `-m bench.run` resolves
Results = dict[str, dict[str, Any]]  # framework -> what bench.run printed


@dataclass
class Goal:
    text: str
    limit: float | Callable[[Results], float | None]  # None: can't tell (peer missing)
    stretch: bool = False

    def check(self, value: float, results: Results) -> str:
        limit = self.limit(results) if callable(self.limit) else self.limit
        if limit is None:
            return f"? {self.text}"
        met, missed = ("★", "·") if self.stretch else ("✓", "✗")
        return f"{met if value <= limit else missed} {self.text}"


def _half_baseline_s1(results: Results) -> float | None:
    value = _get(results.get(BASELINE, {}), "s1", "median")
    return None if value is None else value / 2


@dataclass
class Row:
    label: str
    keys: tuple[str, str]
    goals: list[Goal] = field(default_factory=list)


ROWS = [
    Row("S1 µs/step, sync tool", ("s1", "median"),
        [Goal("≤ 200", 200), Goal("≤ ½ PydanticAI", _half_baseline_s1)]),
    Row("S1a µs/step, async tool", ("s1a", "median"), [Goal("≤ 50", 50)]),
    Row("S2 ms, 5 parallel 50 ms tools", ("s2", "median"), [Goal("≤ 60", 60)]),
    Row("S3 s, 1000 concurrent runs", ("s3", "seconds"),
        [Goal("≤ 2", 2), Goal("stretch ≤ 0.7", 0.7, stretch=True)]),
    Row("S3 KB/run, peak RSS growth", ("s3", "kb_per_run"), [Goal("≤ 30", 30)]),
    Row("S3 MiB, peak RSS growth", ("s3", "peak_mib"), [Goal("stretch ≤ 20", 20, stretch=True)]),
]  # fmt: skip


def _get(result: dict[str, Any], scenario: str, key: str) -> float | None:
    value = result.get(scenario, {}).get(key)
    return None if value is None else float(value)


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def run_framework(framework: str, scenarios: list[str], quick: bool) -> dict[str, Any]:
    """One fresh interpreter: `python -m bench.run FRAMEWORK SCENARIOS...`."""
    command = [sys.executable, "-m", "bench.run", framework, *scenarios]
    print(f"running {' '.join(command[1:])}{' --quick' * quick}", file=sys.stderr, flush=True)
    proc = subprocess.run(command + ["--quick"] * quick, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        error = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"framework": framework, "error": f"exit {proc.returncode}: {error}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def collect(frameworks: list[str], quick: bool) -> tuple[Results, dict[str, str]]:
    results: Results = {}
    problems: dict[str, str] = {}
    for framework in frameworks:
        # Latency scenarios share one process; S3 gets a fresh one of its own, for its RSS.
        result = run_framework(framework, ["s1", "s1a", "s2"], quick)
        if "skipped" not in result and "error" not in result:
            s3 = run_framework(framework, ["s3"], quick)
            result.update({k: v for k, v in s3.items() if k in ("s3", "error")})
        if problem := result.get("skipped") or result.get("error"):
            kind = "skipped" if "skipped" in result else "error"
            problems[framework] = f"{kind}: {problem}"
            print(f"{framework} {kind}: {problem}", file=sys.stderr)
        if "version" in result:
            results[framework] = result
    return results, problems


def table(results: Results) -> tuple[list[str], list[list[str]]]:
    peers = [f for f in results if f != HANDRAIL]
    has_handrail = HANDRAIL in results
    header = ["scenario"] + [f"{f} {results[f]['version']}" for f in results]
    if has_handrail:
        header += [f"handrail/{p}" for p in peers] + [TARGET]
    rows = []
    for row in ROWS:
        values = {f: _get(r, *row.keys) for f, r in results.items()}
        cells = [row.label] + [_fmt(values[f]) for f in results]
        if has_handrail:
            mine = values[HANDRAIL]
            for peer in peers:
                theirs = values[peer]
                cells.append("—" if mine is None or not theirs else f"{mine / theirs:.3f}")
            checks = [] if mine is None else [g.check(mine, results) for g in row.goals]
            cells.append("  ".join(checks) or "—")
        rows.append(cells)
    return header, rows


def show(header: list[str], rows: list[list[str]], notes: list[str]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for r in [header, ["-" * w for w in widths], *rows]:
            print(
                "  ".join(
                    c.ljust(w) if i == 0 or header[i] == TARGET else c.rjust(w)
                    for i, (c, w) in enumerate(zip(r, widths, strict=True))
                )
            )
        print(*notes, sep="\n")
        return
    t = Table(title="handrail benchmarks (lower is better)", caption="\n".join(notes))
    for i, name in enumerate(header):
        t.add_column(name, justify="left" if i == 0 or name == TARGET else "right", no_wrap=True)
    for r in rows:
        t.add_row(*r)
    console = Console()
    if not console.is_terminal:  # piped: don't squeeze the table into 80 columns
        console = Console(width=200)
    console.print(t)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--only", action="append", choices=FRAMEWORKS, help="repeatable")
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--json", metavar="FILE", help="write the numbers to FILE")
    args = parser.parse_args(argv)

    results, problems = collect(args.only or list(FRAMEWORKS), args.quick)
    header, rows = table(results)
    notes = [
        f"Python {platform.python_version()}, GC at defaults; medians of sequential runs"
        f"{' (--quick)' if args.quick else ''}; S3 RSS in a fresh process per framework.",
        "✓/✗ target met/missed, ★/· stretch goal met/missed, ? needs PydanticAI's figure.",
        *(f"{f} {p}" for f, p in problems.items()),
    ]
    show(header, rows, notes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"quick": args.quick, "results": results, "problems": problems}, f, indent=2)


if __name__ == "__main__":
    main()
