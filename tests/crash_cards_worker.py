"""A worker process for the crash tests of waiting calls: a card is never lost to a crash.

`python tests/crash_cards_worker.py DB EFFECTS SESSION KIND [LEASE_TTL]`, KIND one of
`approval`, `human`, `client`. The first model response of the turn holds two calls: one that
must wait (KIND: a gated `payments.charge`, a `desk.ask` a person answers, a `label.print` the
client runs), then `shipping.ship`, an ungated side effect that is not idempotent, so it runs
in the same response while the other call waits.

With `CRASH_AT` set, the worker starts the turn and kills itself with SIGKILL at that point:

- `ship-started`: inside the ship, before its effect (the log says `started`, no effect);
- `ship-done`: inside the ship, after its effect (the log says `started`, the effect happened);
- `before-suspend-save`: the ship returned and its result is in the tool-call log, and the
  session is not saved suspended yet. The hook: the `tool-call-completed` event of the ship,
  read from the turn's stream. The dispatcher hands that event out after it logged the result
  (`journal.finished`), and the engine saves the suspension only once the agent loop returns,
  after the batch's events. (An `on_tool_result` hook would not do: it runs *before* the result
  is logged, which is `ship-done` again as the log sees it; nor would the model function: the
  turn suspends right after this response, without asking the model again.)

Without `CRASH_AT` (the fresh process after a kill), the worker takes the session to the end
with `Engine.advance`, one call per step, deciding each pending card as a person would:
approve the charge, answer the question, post the client's result, and for a `recovery`
card (the ship may have run) check the ledger, as one would check the carrier: reject (skip)
if the ship happened, else approve (retry). A session that does not exist yet is started
first (`submit`), so a run without a kill goes through the same steps.

Effects are lines appended to the EFFECTS file, flushed and fsynced, so they survive the kill.
Output, one line each: `recovered {json}` (after the first `advance` of a session this process
found cut off: how it ended, the cards then pending, the card and run events it logged),
`decided ...` per decision, `final {json}` (the stored calls, cards and last answer), `done
<session status>`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from handrail import (
    Agent,
    Answer,
    Approve,
    ClientResult,
    Engine,
    Reject,
    Runtime,
    SessionBusyError,
    tool,
)
from handrail.messages import ApprovalCardPart, ToolCallPart
from handrail.models import ModelRequest
from handrail.store import SqliteStore
from handrail.testing import FunctionModel, call
from kill_points import append, crash, lines

KINDS = ("approval", "human", "client")
ANNOUNCED = frozenset({"approval-required", "input-required", "client-exec-required"})


def real_result(kind: str, order: str) -> str:
    """What the waiting call really returns once decided (the test expects exactly this)."""
    return {
        "approval": f"charged {order}",
        "human": f"gift note for {order}",
        "client": f"label printed for {order}",
    }[kind]


def _seen(part: ToolCallPart) -> str:
    """A call's result as the model read it."""
    result = part.result
    if result is None:
        return "no result"
    return str(result.data) if result.ok else f"error: {result.error}"


def build(db: str, effects: Path, kind: str, lease_ttl: float) -> Engine:
    @tool(name="payments.charge", permission="write")
    async def charge(order: str) -> str:
        """Charge an order (gated: a person approves it; not idempotent)."""
        append(effects, f"charge {order}")
        return f"charged {order}"

    @tool(name="desk.ask", executor="human", prompt="Which gift note goes in the box?")
    def ask(question: str) -> str:
        """Ask the customer desk a question (a person answers)."""
        raise AssertionError("a human tool never runs here")

    @tool(name="label.print", executor="client")
    def print_label(order: str) -> str:
        """Print the order's label on the desk's printer (the client runs it)."""
        raise AssertionError("a client tool never runs here")

    @tool(name="shipping.ship", permission="write", approval="auto")
    async def ship(order: str) -> str:
        """Ship an order (runs at once; not idempotent: a second call ships twice)."""
        crash("ship-started")
        append(effects, f"ship {order}")
        crash("ship-done")
        return f"shipped {order}"

    def waiting(order: str) -> ToolCallPart:
        if kind == "approval":
            return call("payments.charge", order=order)
        if kind == "human":
            return call("desk.ask", question=f"Gift note for {order}?")
        return call("label.print", order=order)

    def answer(request: ModelRequest) -> Any:
        order = request.messages[0].text.split()[-1]
        calls = [p for m in request.messages for p in m.tool_calls]
        if not calls:  # the waiting call first, then the ship, in ONE response
            return [waiting(order), call("shipping.ship", order=order)]
        return f"Order {order}: " + "; ".join(f"{p.name} -> {_seen(p)}" for p in calls)

    agent: Agent[str] = Agent("desk", tools=[charge, ask, print_label, ship])
    runtime: Runtime[None] = Runtime(model=FunctionModel(answer))
    return Engine(agent, store=SqliteStore(db), runtime=runtime, lease_ttl=lease_ttl)


def decide(card: ApprovalCardPart, kind: str, session: str, effects: Path) -> Any:
    """What the person in the loop (or the client) decides on a card."""
    if card.kind == "recovery":  # did the ship happen? check the carrier
        shipped = f"ship {session}" in lines(effects)
        return Reject(reason="it shipped") if shipped else Approve()
    if card.kind == "approval":
        return Approve(by="ops")
    if card.kind == "elicitation":
        return Answer(output=real_result(kind, session), by="desk")
    if card.kind == "client_exec":
        return ClientResult(output=real_result(kind, session), by="desk-app")
    raise AssertionError(f"unexpected card {card.kind} on {card.tool_name}")


async def _advance(engine: Engine, session: str) -> Any:
    """One `advance`, retried while the killed worker's lease has not expired."""
    for _ in range(200):
        try:
            return await engine.advance(session)
        except SessionBusyError:
            await asyncio.sleep(0.05)
    raise RuntimeError(f"session {session} stayed busy")


async def drive(engine: Engine, session: str, kind: str, effects: Path) -> str:
    """Take the session to the end of its turn; return its stored status."""
    found = await engine.store.load(session) is not None  # left by a killed worker
    if not found:
        run = engine.submit(session, f"Please process order {session}", client=True)
        async for event in run:
            if event.type == "tool-call-completed" and event.name == "shipping.ship":
                crash("before-suspend-save")  # logged finished; not saved suspended yet
        print(f"submitted {run.result.outcome}", flush=True)
    reported = not found
    for _ in range(10):
        result = await _advance(engine, session)
        state = await engine.session(session)
        if result is not None and not reported:
            reported = True
            events = [e for _, e in await engine.store.events(session)]
            report = {
                "outcome": result.outcome,
                "pending": [[c.tool_name, c.kind] for c in state.pending.values()],
                "events": [
                    [e["type"], e.get("name"), e.get("kind")]
                    for e in events
                    if e["type"] in ANNOUNCED or e["type"].startswith("run-")
                ],
            }
            print(f"recovered {json.dumps(report)}", flush=True)
        if state.progress is None:  # the turn is over
            record = await engine.store.load(session)
            assert record is not None
            return record.status
        if not state.pending and result is None:
            raise RuntimeError(f"session {session} is stuck: nothing pending, nothing to do")
        for call_id, card in list(state.pending.items()):
            decision = decide(card, kind, session, effects)
            print(f"decided {card.tool_name} {card.kind} {decision.decision}", flush=True)
            await engine.resolve(session, call_id, decision)
    raise RuntimeError(f"session {session} did not finish its turn")


async def final_report(engine: Engine, session: str) -> dict[str, Any]:
    state = await engine.session(session)
    calls, cards = [], []
    for message in state.all_messages():
        for part in message.parts:
            if isinstance(part, ToolCallPart):
                result = part.result
                calls.append(
                    {
                        "name": part.name,
                        "status": part.status,
                        "ok": None if result is None else result.ok,
                        "data": None if result is None else result.data,
                        "error": None if result is None else result.error,
                    }
                )
            elif isinstance(part, ApprovalCardPart):
                cards.append([part.tool_name, part.kind, part.decision])
    last = state.messages[-1]
    return {"calls": calls, "cards": cards, "text": last.text if last.role == "assistant" else ""}


async def main(db: str, effects: str, session: str, kind: str, lease_ttl: float) -> None:
    engine = build(db, Path(effects), kind, lease_ttl)
    try:
        status = await drive(engine, session, kind, Path(effects))
        print(f"final {json.dumps(await final_report(engine, session))}", flush=True)
        print(f"done {status}", flush=True)
    finally:
        await engine.store.close()


if __name__ == "__main__":
    if len(sys.argv) < 5 or sys.argv[4] not in KINDS:
        sys.exit(f"usage: {sys.argv[0]} DB EFFECTS SESSION {{{','.join(KINDS)}}} [LEASE_TTL]")
    ttl = float(sys.argv[5]) if len(sys.argv) > 5 else 0.3
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], ttl))
