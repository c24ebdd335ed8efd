"""Run scenarios for one framework and print one JSON line: `python -m bench.run FRAMEWORK S...`.

Scenarios: s1 (sync tool), s1a (async tool), s2, s3. `python -m bench` runs each framework in
fresh processes of this, so frameworks never share an interpreter, a heap or a GC.

Timing: `time.perf_counter_ns` around `agent.run(...)`, agents built beforehand; warm-up runs,
then the median of sequential runs. The GC is left at its defaults.

Memory (s3): in a fresh process, after one warm-up run (imports, schema caches), we read the
current RSS (`/proc/self/statm`), reset the kernel's RSS high-water mark (`/proc/self/clear_refs`,
so the peak belongs to the batch, not to start-up), run the batch, then read the peak RSS
(`getrusage(RUSAGE_SELF).ru_maxrss`). Peak minus baseline, over n, is the growth per run, with
all runs in flight. `retained_mib` is current RSS after the batch minus baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import platform
import resource
import statistics
import sys
from collections.abc import Awaitable, Callable
from importlib import metadata
from types import ModuleType
from typing import Any

FRAMEWORKS = {
    "handrail": "bench._handrail",
    "pydantic-ai": "bench._pydantic_ai",
    "langgraph": "bench._langgraph",
}
SCENARIOS = ("s1", "s1a", "s2", "s3")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def load(framework: str) -> ModuleType:
    """Import a framework's bench module; ImportError says why it can't run."""
    return importlib.import_module(FRAMEWORKS[framework])


def version(module: ModuleType) -> str:
    package = getattr(module, "PACKAGE", module.NAME)
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "?"


async def median(fn: Callable[[], Awaitable[float]], warmup: int, repeat: int) -> dict[str, Any]:
    for _ in range(warmup):
        await fn()
    samples = [await fn() for _ in range(repeat)]
    return {"median": statistics.median(samples), "min": min(samples), "runs": repeat}


def rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_KB


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


async def s3_with_memory(module: ModuleType, n: int) -> dict[str, Any]:
    await module.s1(3, sync_tool=False)  # warm-up: one-time costs are not per-run costs
    before = rss_kb()
    peak_reset = reset_peak_rss()
    seconds = await module.s3(n)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    growth = max(peak - before, 0)
    return {
        "seconds": seconds,
        "n": n,
        "kb_per_run": growth / n,
        "peak_mib": growth / 1024,
        "retained_mib": (rss_kb() - before) / 1024,
        "baseline_mib": before / 1024,
        "peak_reset": peak_reset,  # False: the peak may predate the batch (an overestimate)
    }


async def measure(module: ModuleType, scenarios: list[str], quick: bool) -> dict[str, Any]:
    s1_runs = (3, 10) if quick else (10, 50)  # (warm-up, timed) runs
    s2_runs = (1, 3) if quick else (2, 9)
    out: dict[str, Any] = {}
    for scenario in scenarios:
        if scenario == "s1":
            out["s1"] = await median(lambda: module.s1(sync_tool=True), *s1_runs)
        elif scenario == "s1a":
            out["s1a"] = await median(lambda: module.s1(sync_tool=False), *s1_runs)
        elif scenario == "s2":
            out["s2"] = await median(module.s2, *s2_runs)
        elif scenario == "s3":
            out["s3"] = await s3_with_memory(module, 1000)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.run")
    parser.add_argument("framework", choices=FRAMEWORKS)
    parser.add_argument("scenarios", nargs="+", choices=SCENARIOS)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args(argv)

    result: dict[str, Any] = {"framework": args.framework}
    try:
        module = load(args.framework)
    except ImportError as e:
        result["skipped"] = f"{type(e).__name__}: {e}"
    else:
        result["version"] = version(module)
        result["python"] = platform.python_version()
        result.update(asyncio.run(measure(module, args.scenarios, args.quick)))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
