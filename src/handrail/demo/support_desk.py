"""The support-desk scenario: an order database, three tools, an agent and its script.

Everything here is plain handrail, with no terminal in sight, so tests, evals and the server
can replay the same scenario that `python -m handrail.demo` renders:

```python
scenario = build_scenario()
result = await scenario.submit().finish()
assert result.outcome == "suspended" and scenario.desk.refunds == []
await scenario.resolve(Approve(amended_args={"amount": 40.0}))
result = await scenario.resume().finish()
assert result.outcome == "completed" and scenario.desk.refunds[0]["amount"] == "€40.00"
```
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from handrail import (
    Agent,
    AgentRun,
    ApprovalCardPart,
    Decision,
    Engine,
    MemoryStore,
    Message,
    ModelRetry,
    Resolution,
    Runtime,
    SessionStore,
    ToolContext,
    tool,
)
from handrail.models import ModelRequest
from handrail.testing import FunctionModel, Step, call, sequential_ids

__all__ = [
    "CUSTOMER_MESSAGE",
    "ORDERS",
    "Desk",
    "Scenario",
    "build_scenario",
    "closing",
    "lookup_order",
    "refund_order",
    "refund_policy",
    "script",
    "support_agent",
]

CUSTOMER_MESSAGE = "Hi, my order A1042 arrived damaged. Can I get a refund?"
"""What the customer writes."""

TODAY = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
"""The scenario's fixed "now": the runtime's clock, so every run is the same."""

ORDERS: dict[str, dict[str, Any]] = {
    "A1042": {
        "order": "A1042",
        "customer": "Dana Reyes",
        "items": ["Ceramic pour-over set", "Paper filters (100)"],
        "total_cents": 8400,
        "status": "delivered",
        "delivered_on": "2026-11-18",
    },
    "A1043": {
        "order": "A1043",
        "customer": "Sam Okafor",
        "items": ["Burr grinder"],
        "total_cents": 12900,
        "status": "shipped",
        "delivered_on": None,
    },
    "B2001": {
        "order": "B2001",
        "customer": "Lee Tanaka",
        "items": ["Espresso beans, 1 kg"],
        "total_cents": 2650,
        "status": "delivered",
        "delivered_on": "2026-09-02",
    },
}
"""The seed of the order database (every `Desk` starts from a copy)."""

Reason = Literal["damaged", "changed-mind", "late"]

_POLICY: dict[str, dict[str, Any]] = {
    "damaged": {"refund": "full", "window_days": 30, "return_needed": False},
    "changed-mind": {
        "refund": "full, minus return shipping",
        "window_days": 14,
        "return_needed": True,
    },
    "late": {"refund": "shipping costs", "window_days": 30, "return_needed": False},
}


@dataclass(kw_only=True, slots=True)
class Desk:
    """The support desk's in-memory database, handed to the tools as `ctx.deps`."""

    orders: dict[str, dict[str, Any]] = field(default_factory=lambda: copy.deepcopy(ORDERS))
    """Orders by id."""
    refunds: list[dict[str, Any]] = field(default_factory=list)
    """Refunds issued, in order (`orders.refund` appends here when it runs)."""
    latency: float = 0.0
    """Seconds each tool call takes, to make a live demo watchable (0 in tests)."""

    def order(self, order_id: str) -> dict[str, Any]:
        """The order `order_id`, or a `ModelRetry` the model can act on."""
        if self.latency:
            time.sleep(self.latency)
        order = self.orders.get(order_id.strip().upper())
        if order is None:
            raise ModelRetry(
                f"There is no order {order_id!r}. Order ids look like 'A1042'; ask the "
                f"customer to check theirs."
            )
        return order


def _euros(cents: int) -> str:
    return f"€{cents / 100:.2f}"


@tool(
    name="orders.lookup",
    permission="read",
    digest=lambda o: {
        "order": o["order"],
        "status": o["status"],
        "total": _euros(o["total_cents"]),
    },
)
def lookup_order(ctx: ToolContext[Desk], order_id: str) -> dict[str, Any]:
    """Look up an order: its items, total (in cents), status and delivery date.

    Args:
        ctx: the call's context (the desk is `ctx.deps`).
        order_id: the order's id, like "A1042".
    """
    return dict(ctx.deps.order(order_id))


@tool(
    name="policy.refunds",
    permission="read",
    digest=lambda p: {
        "reason": p["reason"],
        "refund": p["refund"],
        "window": f"{p['window_days']} days",
    },
)
def refund_policy(ctx: ToolContext[Desk], reason: Reason) -> dict[str, Any]:
    """The refund policy for a reason: what is refunded, within how long, and on what terms.

    Args:
        ctx: the call's context.
        reason: why the customer wants a refund.
    """
    if ctx.deps.latency:
        time.sleep(ctx.deps.latency)
    return {"reason": reason, **_POLICY[reason], "approval": "a person approves every refund"}


@tool(
    name="orders.refund",
    permission="write",
    amendable=["amount"],
    prompt="Refund this order?",
    digest=lambda r: {"refund": r["refund"], "order": r["order"], "amount": r["amount"]},
)
def refund_order(
    ctx: ToolContext[Desk], order_id: str, amount: float, reason: str
) -> dict[str, Any]:
    """Refund an order, fully or in part. A person approves every refund before it is made.

    Args:
        ctx: the call's context.
        order_id: the order to refund.
        amount: how much to refund, in euros (at most the order's total).
        reason: why, in a few words (kept with the refund).
    """
    desk = ctx.deps
    order = desk.order(order_id)
    cents = round(amount * 100)
    if not 0 < cents <= order["total_cents"]:
        raise ModelRetry(
            f"A refund of order {order['order']} must be more than €0 and at most its total, "
            f"{_euros(order['total_cents'])}."
        )
    refund = {
        "refund": f"R{len(desk.refunds) + 1:04d}",
        "order": order["order"],
        "amount": _euros(cents),
        "reason": reason,
    }
    desk.refunds.append(refund)
    return refund


support_agent: Agent[str] = Agent(
    "support",
    instructions=(
        "You are the support desk of a small coffee-gear shop. Look orders up and check the "
        "refund policy before you promise anything; propose refunds with orders.refund (a "
        "person approves them). Be warm and brief."
    ),
    tools=[lookup_order, refund_policy, refund_order],
)
"""The support agent (it names no model: the runtime, or a per-turn override, gives one)."""


def script() -> list[Step]:
    """The scripted model's first turns: both lookups at once, then the reply and the refund.

    Its last turn, after the refund was decided, is computed from the decision (`answer`).
    """
    return [
        [
            call("orders.lookup", order_id="A1042"),
            call("policy.refunds", reason="damaged"),
        ],
        [
            "I'm sorry your order arrived damaged, Dana. Order A1042 (€84.00) was delivered on "
            "18 November, well within our 30-day window, and damaged items are refunded in "
            "full with no need to send them back. I've proposed a full refund of €84.00; a "
            "colleague will approve it shortly.",
            call("orders.refund", order_id="A1042", amount=84.0, reason="damaged on arrival"),
        ],
    ]


def closing(message: Message) -> str:
    """The scripted model's last turn, from the message holding the decided refund call."""
    refund = message.tool_calls[-1]
    if refund.status == "completed" and refund.result is not None:
        data = refund.result.data
        return (
            f"Good news: your refund {data['refund']} of {data['amount']} for order "
            f"{data['order']} has been approved and is on its way. Sorry again for the trouble!"
        )
    if refund.status == "rejected":
        card = next(p for p in message.parts if isinstance(p, ApprovalCardPart) and p.decision)
        why = f" ({card.reason.rstrip('.')})" if card.reason else ""
        return (
            f"I'm sorry: my colleague did not approve the refund this time{why}. I've passed "
            f"your case on, and we'll be in touch soon."
        )
    return "I couldn't complete the refund just now; a colleague will follow up with you."


@dataclass(kw_only=True, slots=True)
class Scenario:
    """One support-desk conversation, ready to run: fresh database, fresh script."""

    engine: Engine
    """The engine: the support agent, the session store, the runtime."""
    model: FunctionModel
    """The scripted model (its `calls` are the requests it answered)."""
    desk: Desk
    """The database the tools read and write."""
    session_id: str = "support-1"
    """The conversation's session."""
    prompt: str = CUSTOMER_MESSAGE
    """The customer's message."""

    def submit(self) -> AgentRun[Any]:
        """Start the customer's turn; iterate the result for events, then read `.result`."""
        return self.engine.submit(self.session_id, self.prompt)

    async def resolve(self, decision: Decision) -> Resolution:
        """Decide the pending refund (the only pending call)."""
        state = await self.engine.session(self.session_id)
        (call_id,) = state.pending
        return await self.engine.resolve(self.session_id, call_id, decision)

    def resume(self) -> AgentRun[Any]:
        """Continue the suspended turn once the refund is decided."""
        return self.engine.resume(self.session_id)


def build_scenario(
    *, latency: float = 0.0, store: SessionStore | None = None, session_id: str = "support-1"
) -> Scenario:
    """Build the support-desk scenario on the scripted model (offline, deterministic).

    Args:
        latency: seconds each tool call sleeps, for a watchable live demo (0 by default).
        store: where the session lives (default: a fresh `MemoryStore`).
        session_id: the conversation's session id.

    Returns:
        A `Scenario`: `submit()` plays the customer's turn up to the refund's approval card;
        `resolve(decision)` then `resume()` finish it.
    """
    desk = Desk(latency=latency)
    steps = script()

    def answer(request: ModelRequest) -> Step:
        turns = sum(1 for m in request.messages if m.role == "assistant")
        if turns < len(steps):
            return steps[turns]
        return closing(request.messages[-1])

    model = FunctionModel(answer, name="scripted")
    runtime = Runtime(model=model, deps=desk, clock=lambda: TODAY.timestamp(), ids=sequential_ids())
    engine = Engine(support_agent, store=store or MemoryStore(), runtime=runtime)
    return Scenario(engine=engine, model=model, desk=desk, session_id=session_id)
