"""A 200-scenario eval suite on scripted models: `python -m bench.evals`.

The suite is generated in Python (the same `Suite` a YAML file makes) on the demo's support
desk: a mix of the three routes (simple: 2 model calls; search: a mocked lookup, 4 calls;
action: lookup + policy + the gated refund, which asks for approval, 3 calls), a quarter of
the action scenarios in capture mode, and a scripted judge on every tenth scenario. Each
scenario gets its own Engine, MemoryStore and models, as under `handrail eval`.

Printed: scenarios/s for the whole run at the suite's concurrency (median of a few rounds),
and the JSON report's bytes being identical from round to round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

from handrail.evals import Scenario, Suite, run_suite, to_json, to_junit

N, ROUNDS = 200, 5
SCRIPT = "handrail.demo.support_desk:script"
LOOKUP = {"order": "A1042", "total_cents": 8400, "status": "delivered"}
POLICY = {"reason": "damaged", "refund": "full", "window_days": 30}
JUDGE = {"scripted": [{"output": {"passed": True, "reason": "polite and accurate"}}]}


def scenario(n: int) -> dict[str, Any]:
    kind = ("simple", "search", "action")[n % 3]
    data: dict[str, Any]
    if kind == "simple":
        data = {
            "turns": f"Hi! Do you refund items that arrive damaged? ({n})",
            "model": {
                "scripted": [
                    {"output": {"route": "simple", "reason": "a policy question"}},
                    "Yes: damaged items are refunded in full within 30 days.",
                ]
            },
            "expect": {"route": "simple", "text_contains": "in full", "max_model_calls": 2},
        }
    elif kind == "search":
        data = {
            "turns": f"Where is my order A1042? ({n})",
            "mocks": {"orders.lookup": {"output": LOOKUP}},
            "model": {"function": SCRIPT},
            "expect": {
                "route": "search",
                "called": [{"tool": "orders.lookup", "args": {"order_id": "A1042"}}],
                "text_contains": "A1042",
            },
        }
    else:
        capture = n % 4 == 2
        data = {
            "turns": f"My order A1042 arrived damaged. Can I get a refund? ({n})",
            "mode": "capture" if capture else "mock",
            "mocks": {"orders.lookup": {"output": LOOKUP}, "policy.refunds": {"output": POLICY}},
            "model": {"function": SCRIPT},
            "expect": {
                "route": "action",
                **(
                    {"captured": {"count": 1, "actions": [{"tool": "orders.refund"}]}}
                    if capture
                    else {"approvals": ["orders.refund"], "outcome": "suspended"}
                ),
            },
        }
    if n % 10 == 0:
        data["expect"]["judge"] = {"rubric": "Polite and accurate.", "model": JUDGE}
    return {"name": f"{kind}-{n:03d}", **data}


def suite(concurrency: int) -> Suite:
    return Suite(
        name="bench",
        domain="handrail.demo.support_desk:support_domain",
        concurrency=concurrency,
        scenarios=[Scenario.model_validate(scenario(n)) for n in range(N)],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    options = parser.parse_args()
    built = suite(options.concurrency)
    rates: list[float] = []
    reports: set[str] = set()
    for _ in range(options.rounds):
        start = time.perf_counter()
        result = asyncio.run(run_suite(built))
        elapsed = time.perf_counter() - start
        assert result.passed, [(s.name, s.reason) for s in result.failed][:3]
        rates.append(N / elapsed)
        reports.add(to_json(result) + to_junit(result))
    print(
        f"{N} scenarios (scripted), concurrency {options.concurrency}, {os.cpu_count()} CPUs: "
        f"{statistics.median(rates):,.0f} scenarios/s median "
        f"(rounds: {', '.join(f'{r:,.0f}' for r in rates)}); "
        f"reports identical across rounds: {len(reports) == 1}"
    )


if __name__ == "__main__":
    main()
