"""Bound arguments survive suspension: approve, amend, batch approve and batch amend.

A tool's `bindings` fill arguments from the context store (`sys:`, `var:`, `tool:` paths).
A decision, an amendment, a resumption or a batch apply happens on a session loaded again
from its store (here a `MemoryStore`, or a `SqliteStore` reopened by a new `Engine`), after
the turn that bound them: the tool must still receive what its first dispatch bound.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from handrail import (
    ActionChoice,
    Agent,
    Approve,
    Engine,
    MemoryStore,
    Runtime,
    SessionStore,
    Tool,
    ToolContext,
    temp_id,
    tool,
)
from handrail.store import SqliteStore
from handrail.testing import ScriptedModel, call, sequential_ids

SESSION = "s1"
SCOPE: dict[str, Any] = {"org_id": "acme", "user_id": "u1"}
CALLS: list[tuple[str, dict[str, Any]]] = []


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    CALLS.clear()


# -- tools ---------------------------------------------------------------------------------


@tool(name="tickets.lookup")
def lookup(ctx: ToolContext[None], ticket: str) -> dict[str, str]:
    """Look a ticket up, and remember its queue in a session variable."""
    CALLS.append(("tickets.lookup", {"ticket": ticket}))
    ctx.context.set("var:ticket.queue", "billing")
    return {"id": f"T-{ticket}", "queue": "billing"}


def escalate_bound_to(path: str) -> Tool[Any]:
    """A gated, amendable, capturable tool whose `requested_by` is bound to `path`."""

    @tool(
        name="tickets.escalate",
        permission="write",
        amendable=["priority"],
        bindings={"requested_by": path},
        mint=lambda args, i: {"escalation_id": temp_id(i), "priority": args["priority"]},
    )
    def escalate(note: str, requested_by: str, priority: str = "normal") -> dict[str, str]:
        """Escalate the ticket."""
        CALLS.append(
            ("tickets.escalate", {"note": note, "requested_by": requested_by, "priority": priority})
        )
        return {"escalation_id": "E-1", "priority": priority}

    return escalate


@tool(
    name="tickets.create",
    permission="write",
    mint=lambda args, i: {"id": temp_id(i), "title": args["title"]},
)
def create(title: str) -> dict[str, str]:
    """Open a ticket."""
    CALLS.append(("tickets.create", {"title": title}))
    return {"id": "T-100", "title": title}


@tool(
    name="tickets.assign",
    permission="write",
    bindings={"ticket_id": "tool:tickets.create.id"},
    mint=lambda args, i: {"assignment_id": temp_id(i)},
)
def assign(ticket_id: str, assignee: str) -> dict[str, str]:
    """Assign the ticket just opened."""
    CALLS.append(("tickets.assign", {"ticket_id": ticket_id, "assignee": assignee}))
    return {"assignment_id": f"A-{ticket_id}"}


# -- engines over a store that is reopened between steps -----------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Backend:
    """Builds engines over one session store; `reopen` is a reload (a restart, a deploy).

    SQLite: the store is closed and a new `SqliteStore` opens the same file, under a new
    `Engine`. Memory: a new `Engine` over the same `MemoryStore`. The model, the id factory and
    the clock are shared, as a real deployment shares its provider and its wall time.
    """

    def __init__(self, kind: str, path: Path) -> None:
        self.kind, self.path = kind, path
        self.memory = MemoryStore()
        self.store: SessionStore | None = None

    async def open(self, tools: list[Tool[Any]], model: ScriptedModel) -> Engine:
        self.tools, self.model = tools, model
        self.ids, self.clock = sequential_ids(), Clock()
        return await self.reopen()

    async def reopen(self) -> Engine:
        if self.kind == "sqlite":
            await self.close()
            self.store = SqliteStore(self.path)
        else:
            self.store = self.memory
        runtime = Runtime(model=self.model, ids=self.ids, clock=self.clock)
        return Engine(Agent("desk", tools=self.tools), store=self.store, runtime=runtime)

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()
            self.store = None


@pytest.fixture(params=["memory", "sqlite"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    opened = Backend(request.param, tmp_path / "sessions.db")
    yield opened
    await opened.close()


def script() -> ScriptedModel:
    return ScriptedModel(
        [
            [call("tickets.lookup", ticket="42")],
            [call("tickets.escalate", note="refund stuck")],
            "Escalated.",
        ]
    )


# -- the matrix ------------------------------------------------------------------------------

BINDINGS = {
    "sys": ("sys:user_id", "u1"),  # the session's scope, given at submit
    "var": ("var:ticket.queue", "billing"),  # set by the read tool earlier in the turn
    "tool": ("tool:tickets.lookup.id", "T-42"),  # the read tool's output this turn
}
binding_kinds = pytest.mark.parametrize("kind", list(BINDINGS))
AMENDMENTS = {"plain": ({}, "normal"), "amended": ({"priority": "urgent"}, "urgent")}
approvals = pytest.mark.parametrize("approval", list(AMENDMENTS))


async def drain(run: AsyncIterator[Any]) -> list[Any]:
    return [event async for event in run]


def escalations() -> list[dict[str, Any]]:
    return [args for name, args in CALLS if name == "tickets.escalate"]


@binding_kinds
@approvals
async def test_an_approved_call_after_a_reload_receives_its_bound_value(
    backend: Backend, kind: str, approval: str
) -> None:
    path, expected = BINDINGS[kind]
    changes, priority = AMENDMENTS[approval]
    engine = await backend.open([lookup, escalate_bound_to(path)], script())
    events = await drain(engine.submit(SESSION, "Ticket 42 needs a human", **SCOPE))
    assert events[-1].type == "run-suspended"
    (call_id,) = events[-1].pending
    assert escalations() == []  # gated: nothing ran yet

    engine = await backend.reopen()
    decision = Approve(amended_args=changes or None, by="ana")
    resolution = await engine.resolve(SESSION, call_id, decision, **SCOPE)
    assert resolution.ready

    engine = await backend.reopen()
    events = await drain(engine.resume(SESSION, **SCOPE))
    assert events[-1].type == "run-completed"
    assert escalations() == [
        {"note": "refund stuck", "requested_by": expected, "priority": priority}
    ]
    state = await engine.session(SESSION, **SCOPE)
    (escalated,) = [p for m in state.messages for p in m.tool_calls if p.id == call_id]
    assert escalated.status == "completed", escalated.result


@binding_kinds
@approvals
async def test_an_approved_batch_after_a_reload_applies_with_the_bound_values_it_captured(
    backend: Backend, kind: str, approval: str
) -> None:
    path, expected = BINDINGS[kind]
    changes, priority = AMENDMENTS[approval]
    engine = await backend.open([lookup, escalate_bound_to(path)], script())
    result = await engine.run_headless(SESSION, "Ticket 42 needs a human", propose=True, **SCOPE)
    assert result.outcome == "suspended" and result.card is not None
    assert [(a.tool, a.local_index) for a in result.actions] == [("tickets.escalate", 0)]
    assert escalations() == []  # captured, not run

    engine = await backend.reopen()
    if changes:
        decision = Approve(actions={0: ActionChoice(amended_args=changes)}, by="ana")
    else:
        decision = Approve(by="ana")
    await engine.resolve(SESSION, result.card, decision, **SCOPE)

    engine = await backend.reopen()
    if changes:  # both ways of applying a decided batch: `apply` and `resume`
        report = await engine.apply(SESSION, **SCOPE)
        assert report.ok, [(a.status, a.error) for a in report.actions]
    else:
        events = await drain(engine.resume(SESSION, **SCOPE))
        assert events[-1].type == "run-completed"
        assert events[-1].output == "Applied 1 of 1 action(s)."
    assert escalations() == [
        {"note": "refund stuck", "requested_by": expected, "priority": priority}
    ]


async def test_a_tool_binding_on_an_earlier_captured_action_gets_its_real_id_at_apply(
    backend: Backend,
) -> None:
    model = ScriptedModel(
        [
            [call("tickets.create", title="printer on fire")],
            [call("tickets.assign", assignee="ana")],  # bound to the prediction: temp_0
            "Opened and assigned.",
        ]
    )
    engine = await backend.open([create, assign], model)
    result = await engine.run_headless(SESSION, "The printer is on fire", propose=True, **SCOPE)
    assert result.card is not None
    assert [(a.tool, a.bound) for a in result.actions] == [
        ("tickets.create", None),
        ("tickets.assign", {"ticket_id": "temp_0"}),
    ]
    assert CALLS == []

    engine = await backend.reopen()
    await engine.resolve(SESSION, result.card, Approve(by="ana"), **SCOPE)

    engine = await backend.reopen()
    report = await engine.apply(SESSION, **SCOPE)
    assert report.ok, [(a.status, a.error) for a in report.actions]
    assert report.ids == {"temp_0": "T-100", "temp_1": "A-T-100"}
    assert CALLS == [
        ("tickets.create", {"title": "printer on fire"}),
        ("tickets.assign", {"ticket_id": "T-100", "assignee": "ana"}),
    ]
