"""The support-desk scenario: an order database, three tools, a routed domain and its script.

Everything here is plain handrail, with no terminal in sight, so tests, evals and the server
can replay the same scenario that `python -m handrail.demo` renders:

```python
scenario = build_scenario()
result = await scenario.submit().finish()  # the refund message (the last of the three)
assert result.outcome == "suspended" and scenario.desk.refunds == []
await scenario.resolve(Approve(amended_args={"amount": 40.0}))
result = await scenario.resume().finish()
assert result.outcome == "completed" and scenario.desk.refunds[0]["amount"] == "€40.00"
```
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from handrail import (
    Agent,
    AgentRun,
    ApprovalCardPart,
    Decision,
    Domain,
    Engine,
    MemoryStore,
    Message,
    ModelRetry,
    Resolution,
    RouteDecision,
    Runtime,
    SessionStore,
    TextPart,
    ToolContext,
    temp_id,
    tool,
)
from handrail.models import ModelRequest
from handrail.testing import FunctionModel, Step, call, sequential_ids

__all__ = [
    "CUSTOMER_MESSAGE",
    "CUSTOMER_MESSAGES",
    "ORDERS",
    "Desk",
    "Scenario",
    "build_scenario",
    "executor",
    "lookup_order",
    "refund_order",
    "refund_policy",
    "responder",
    "script",
    "supervisor",
    "support_domain",
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
    # A headless run (capture mode) records the refund with this prediction instead of making it.
    mint=lambda args, i: {
        "refund": temp_id(i),
        "order": args["order_id"],
        "amount": _euros(round(args["amount"] * 100)),
        "reason": args["reason"],
    },
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


INSTRUCTIONS = (
    "You are the support desk of a small coffee-gear shop. Be warm and brief; never promise a "
    "refund before a person approved it."
)

supervisor: Agent[RouteDecision] = Agent(
    "supervisor",
    instructions=(
        "Route the customer's latest message: 'simple' for a question you can answer from "
        "the shop's policies, 'search' when an order must be looked up, 'action' when "
        "something must be done (a refund)."
    ),
    output_type=RouteDecision,
)
"""Picks each turn's route (it runs in scratch: its decision is not part of the chat)."""

executor: Agent[str] = Agent(
    "executor",
    instructions=(
        INSTRUCTIONS + " Look orders up and check the refund policy before you propose a "
        "refund with orders.refund (a person approves every refund). Finish with a short note "
        "of what you found or did, for your colleague who writes to the customer."
    ),
    tools=[lookup_order, refund_policy, refund_order],
    scratch=True,
)
"""Does the work; its calls and notes stay in scratch and its note is handed to the responder."""

responder: Agent[str] = Agent(
    "responder",
    instructions=INSTRUCTIONS + " Write the reply to the customer.",
)
"""Writes to the customer, from the conversation and the executor's note."""

support_domain = Domain(
    agents=[executor, responder],
    routes={
        "simple": ["responder"],
        "search": ["executor", "responder"],
        "action": ["executor", "responder"],
    },
    default_route="simple",
    supervisor=supervisor,
)
"""The support desk: a supervisor routes each message to `simple`, `search` or `action`."""

CUSTOMER_MESSAGES = (
    "Hi! Do you refund items that arrive damaged?",
    "Thanks. Where is my order A1042?",
    CUSTOMER_MESSAGE,
)
"""The customer's three messages: a question, a lookup, a refund."""


def script(request: ModelRequest) -> Step:
    """The scripted model: what each agent answers, from what it sees (deterministic)."""
    customer = next(
        m.text for m in reversed(request.messages) if m.role == "user" and not _synthetic(m)
    )
    # This turn's messages: after the customer's latest one.
    turn = request.messages[
        max(i for i, m in enumerate(request.messages) if m.role == "user" and not _synthetic(m)) :
    ]
    if request.agent == "supervisor":
        return _route(customer)
    if request.agent == "executor":
        return _work(customer, turn)
    return _reply(customer, turn)


def _synthetic(message: Message) -> bool:
    return all(isinstance(p, TextPart) and p.synthetic for p in message.parts) and bool(
        message.parts
    )


def _route(customer: str) -> str:
    text = customer.lower()
    if "refund" in text and "order" in text:
        route, reason = "action", "a refund must be proposed"
        hints = {"executor": "look the order up and check the damaged-item policy first"}
    elif "order" in text:
        route, reason, hints = "search", "an order must be looked up", {}
    else:
        route, reason, hints = "simple", "a policy question", {}
    return json.dumps({"route": route, "reason": reason, "hints": hints})


def _work(customer: str, turn: list[Message]) -> Step:
    done = {p.name: p for m in turn for p in m.tool_calls}
    if "refund" not in customer.lower():
        if "orders.lookup" not in done:
            return call("orders.lookup", order_id="A1042")
        return "Order A1042 (€84.00): delivered on 18 November 2026."
    if "orders.lookup" not in done:
        return [
            call("orders.lookup", order_id="A1042"),
            call("policy.refunds", reason="damaged"),
        ]
    if "orders.refund" not in done:
        return [
            "Delivered on 18 November, within the 30-day window; damaged items are refunded "
            "in full. Proposing a full refund of €84.00.",
            call("orders.refund", order_id="A1042", amount=84.0, reason="damaged on arrival"),
        ]
    refund = done["orders.refund"]
    if refund.captured is not None and refund.result is not None:  # a headless run
        data = refund.result.data
        return f"Refund of {data['amount']} for order {data['order']} prepared, to be applied."
    if refund.status == "completed" and refund.result is not None:
        data = refund.result.data
        return f"Refund {data['refund']} of {data['amount']} for order {data['order']} made."
    card = next(
        (p for m in turn for p in m.parts if isinstance(p, ApprovalCardPart) and p.decision),
        None,
    )
    why = card.reason if card is not None and card.reason else "no reason given"
    return f"The refund was not approved ({why.rstrip('.')}). Nothing was refunded."


def _reply(customer: str, turn: list[Message]) -> str:
    note = next((m.text for m in reversed(turn) if _synthetic(m) and "handed over" in m.text), "")
    if not note:
        return (
            "Yes: items that arrive damaged are refunded in full within 30 days of delivery, "
            "and you don't need to send them back. Just tell me the order number."
        )
    if "delivered on" in note and "refund" not in customer.lower():
        return "Your order A1042 (€84.00) was delivered on 18 November. Anything else?"
    if "prepared" in note:
        amount = note.split("Refund of ", 1)[1].split(" for order")[0]
        return (
            f"Thank you, Dana: I've prepared a full refund of {amount} for order A1042; a "
            f"colleague confirms it shortly and you'll get a note when it's on its way."
        )
    if "made" in note:
        refund = note.split("Refund ", 1)[1].split(" for order")[0]
        return (
            f"Good news, Dana: your refund {refund} has been approved and is on its way. "
            f"Sorry again for the trouble!"
        )
    why = note.split("(", 1)[1].split(")", 1)[0] if "(" in note else "no reason given"
    return (
        f"I'm sorry: my colleague did not approve the refund this time ({why}). I've passed "
        f"your case on, and we'll be in touch soon."
    )


@dataclass(kw_only=True, slots=True)
class Scenario:
    """One support-desk conversation, ready to run: fresh database, fresh script."""

    engine: Engine
    """The engine: the support domain, the session store, the runtime."""
    model: FunctionModel
    """The scripted model (its `calls` are the requests it answered)."""
    desk: Desk
    """The database the tools read and write."""
    session_id: str = "support-1"
    """The conversation's session."""
    messages: tuple[str, ...] = CUSTOMER_MESSAGES
    """The customer's messages, one a turn."""

    def submit(self, text: str = CUSTOMER_MESSAGE) -> AgentRun[Any]:
        """Start a customer's turn; iterate the result for events, then read `.result`."""
        return self.engine.submit(self.session_id, text)

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
        A `Scenario`: `submit(text)` plays a customer's turn (the refund's stops at its
        approval card); `resolve(decision)` then `resume()` finish it.
    """
    desk = Desk(latency=latency)
    model = FunctionModel(script, name="scripted")
    runtime = Runtime(model=model, deps=desk, clock=lambda: TODAY.timestamp(), ids=sequential_ids())
    engine = Engine(support_domain, store=store or MemoryStore(), runtime=runtime)
    return Scenario(engine=engine, model=model, desk=desk, session_id=session_id)
