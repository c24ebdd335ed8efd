"""The inbox and batch cards on the web page, in chromium.

The inbox: ana (acme) asks for a wipe that only an it-admin other than her may approve; bo
(acme, it-admin) finds it in his inbox, reads the card with ana's conversation, approves it,
and the turn resumes on the server. A batch: a captured run's three actions as rows, one
approved, one amended, one skipped; applied, the page says "Applied 2 of 3" with the real ids.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from handrail import Agent, DecisionPolicy, Domain, Engine, Runtime, temp_id, tool
from handrail.models import ModelRequest
from handrail.store import MemoryStore, SqliteStore
from handrail.testing import FunctionModel, Step, call

from .conftest import Served

pytestmark = pytest.mark.browser

Serve = Callable[[Engine], Served]
NewPage = Callable[..., Page]
Shoot = Callable[[Page, str], Any]

wiped: list[str] = []
made: list[str] = []


def signed_in(new_page: NewPage, served: Served, key: str) -> Page:
    page = new_page()
    page.goto(f"{served.url}/#key={key}")
    expect(page.get_by_label("Message")).to_be_visible()
    return page


@tool(name="laptops.wipe", permission="destructive")
def wipe(laptop: str) -> str:
    """Wipe a laptop."""
    wiped.append(laptop)
    return f"wiped {laptop}"


def desk_script(request: ModelRequest) -> Step:
    last = request.messages[-1]
    if last.role == "user":
        return call("laptops.wipe", laptop="L-<b>7</b>")  # drawn as text, never as markup
    return "Your laptop is wiped."


def test_an_approver_decides_from_the_inbox_and_the_turn_resumes(
    serve: Serve, new_page: NewPage, shoot: Shoot
) -> None:
    wiped.clear()
    policy = DecisionPolicy(roles={"it-admin"}, four_eyes=True)
    engine = Engine(
        Domain(agents=[Agent("desk", tools=[wipe])], policies={"destructive": policy}),
        store=MemoryStore(),
        runtime=Runtime(model=FunctionModel(desk_script)),
    )
    served = serve(engine)
    ana = signed_in(new_page, served, "key-ana")
    ana.get_by_label("Message").fill("I lost my laptop")
    ana.get_by_label("Message").press("Enter")
    expect(ana.locator(".card.approval")).to_be_visible()

    bo = signed_in(new_page, served, "key-bo")
    item = bo.locator("#inbox-list .inbox-card")
    expect(item).to_have_count(1)
    expect(item).to_contain_text("laptops.wipe")
    expect(item).to_contain_text("from ana")
    expect(item.locator(".inbox-agent")).to_have_text("proposed by desk")
    expect(bo.locator("#session-list")).to_have_text("No sessions yet.")  # none of his own
    shoot(bo, "inbox")
    item.click()
    card = bo.locator(".card.approval")
    expect(card).to_be_visible()
    expect(card.locator(".args")).to_contain_text("L-<b>7</b>")
    expect(bo.locator(".bubble.user")).to_contain_text("I lost my laptop")  # the conversation
    shoot(bo, "inbox-card")
    card.get_by_role("button", name="Approve").click()
    expect(bo.locator("#status")).to_have_text("Decided; the turn resumes in the background.")
    expect(bo.locator("#inbox-list")).to_have_text("Nothing waits for you.")
    # the turn resumed on the server: ana sees its end
    ana.reload()
    expect(ana.locator(".bubble.assistant .text")).to_have_text("Your laptop is wiped.")
    expect(ana.locator(".line.decided")).to_contain_text("Approved by bo")
    assert wiped == ["L-<b>7</b>"]

    # someone of another organisation sees nothing to decide
    bob = signed_in(new_page, served, "key-bob")
    expect(bob.locator("#inbox-list")).to_have_text("Nothing waits for you.")


paid: list[float] = []


@tool(
    name="pay",
    permission="destructive",
    amendable=["amount"],
    decision_policy=DecisionPolicy(roles={"it-admin"}, approvals=2),
)
def pay(to: str, amount: float) -> str:
    """Pay a supplier."""
    paid.append(amount)
    return f"paid {amount}"


def pay_script(request: ModelRequest) -> Step:
    if request.messages[-1].role == "user":
        return call("pay", to="acme-supplies", amount=500)
    return "Paid."


def test_a_second_approver_sees_the_amendment_and_never_approves_what_they_did_not_see(
    serve: Serve, new_page: NewPage, shoot: Shoot
) -> None:
    paid.clear()
    engine = Engine(
        Domain(agents=[Agent("desk", tools=[pay])]),
        store=MemoryStore(),
        runtime=Runtime(model=FunctionModel(pay_script)),
    )
    served = serve(engine)
    ana = signed_in(new_page, served, "key-ana")
    ana.get_by_label("Message").fill("Pay the supplier")
    ana.get_by_label("Message").press("Enter")
    expect(ana.locator(".card.approval")).to_be_visible()

    cy = signed_in(new_page, served, "key-cy")  # cy opens the card first: 500
    cy.locator("#inbox-list .inbox-card").click()
    stale = cy.locator(".card.approval")
    expect(stale.locator(".args")).to_contain_text("500")
    expect(stale.locator(".approvals")).to_have_text(
        "0 of 2 approvals of these arguments: no approvals yet"
    )

    bo = signed_in(new_page, served, "key-bo")  # bo amends to 999999 and approves
    bo.locator("#inbox-list .inbox-card").click()
    card = bo.locator(".card.approval")
    card.get_by_label("amount").fill("999999")
    card.get_by_role("button", name="Approve").click()
    expect(bo.locator(".card.approval .approvals")).to_have_text(
        "1 of 2 approvals of these arguments: approved by bo"
    )

    stale.get_by_role("button", name="Approve").click()  # on the page that still says 500
    expect(stale.locator(".error")).to_contain_text("arguments_changed")
    expect(stale.locator(".error")).to_contain_text("amount: 500.0 -> 999999.0")
    assert paid == []
    stale.get_by_role("button", name="Show the session as it is now").click()
    fresh = cy.locator(".card.approval")
    expect(fresh.locator(".args")).to_contain_text("999999")
    expect(fresh.locator(".changed")).to_have_text(
        "Changed by bo from the agent's proposal: amount 500 → 999999"
    )
    expect(fresh.locator(".approvals")).to_have_text(
        "1 of 2 approvals of these arguments: approved by bo"
    )
    shoot(cy, "card-amended-by-another")
    fresh.get_by_role("button", name="Approve").click()  # she sees 999999 and approves it
    expect(cy.locator("#status")).to_have_text("Decided; the turn resumes in the background.")
    ana.reload()
    expect(ana.locator(".bubble.assistant .text")).to_have_text("Paid.")
    assert paid == [999999]


@tool(
    name="orders.create",
    permission="write",
    amendable=["quantity"],
    mint=lambda args, i: {"order_id": temp_id(i), "item": args["item"]},
)
def create(item: str, quantity: int = 1) -> dict[str, Any]:
    """Create an order."""
    made.append(f"{item} x{quantity}")
    return {"order_id": f"ORD-{len(made)}", "item": item}


@tool(
    name="orders.add_note",
    permission="write",
    amendable=["note"],
    mint=lambda args, i: {"note_id": temp_id(i), "order_id": args["order_id"]},
)
def add_note(order_id: str, note: str) -> dict[str, Any]:
    """Add a note to an order."""
    made.append(f"note {order_id}")
    return {"note_id": "N-1", "order_id": order_id}


def clerk_script(request: ModelRequest) -> Step:
    last = request.messages[-1]
    if last.role == "user":
        return [
            call("orders.create", item="desk"),
            call("orders.create", item="<img src=x onerror=alert(1)>chair"),
            call("orders.add_note", order_id="temp_0", note="rush"),
        ]
    return "Three actions are ready."


def test_a_batch_card_is_decided_row_by_row_and_reports_what_it_applied(
    serve: Serve, new_page: NewPage, shoot: Shoot, tmp_path: Path
) -> None:
    made.clear()
    path = tmp_path / "batch.db"

    def clerk(store: SqliteStore) -> Engine:
        agent = Agent("clerk", tools=[create, add_note])
        return Engine(agent, store=store, runtime=Runtime(model=FunctionModel(clerk_script)))

    async def propose() -> None:
        async with SqliteStore(path) as store:
            result = await clerk(store).run_headless(
                "batch-1", "order", org_id="acme", user_id="ana", propose=True
            )
            assert result.card is not None

    with ThreadPoolExecutor(1) as pool:  # Playwright's loop runs in this thread
        pool.submit(lambda: asyncio.run(propose())).result()
    served = serve(clerk(SqliteStore(path)))
    page = new_page()
    page.goto(f"{served.url}/#key=key-ana&session=batch-1")
    # the captured calls: proposed, not done
    lines = page.locator("#transcript .call")
    expect(lines).to_have_count(3)
    for n in range(3):
        expect(lines.nth(n).locator(".call-status")).to_have_text("◌ proposed")
    rows = page.locator(".card.batch .batch-action")
    expect(rows).to_have_count(3)
    expect(rows.nth(0)).to_contain_text("orders.create")
    expect(rows.nth(0)).to_contain_text("would give: order_id: temp_0")
    expect(rows.nth(1)).to_contain_text("<img src=x onerror=alert(1)>chair")  # as text
    expect(page.locator(".card.batch img")).to_have_count(0)
    rows.nth(1).get_by_label("quantity", exact=True).fill("3")
    rows.nth(2).get_by_label("Skip", exact=True).check()
    expect(rows.nth(2).get_by_label("note", exact=True)).to_be_hidden()
    shoot(page, "batch-rows")
    # the button says what the card asks ("Approve these actions?"), and what it reads after
    page.locator(".card.batch").get_by_role("button", name="Approve", exact=True).click()
    summary = page.locator(".batch-summary")
    expect(summary.locator(".batch-applied")).to_have_text("Applied 2 of 3")
    report = summary.locator(".batch-action")
    expect(report.nth(0)).to_contain_text("order_id: ORD-1")
    expect(report.nth(1)).to_contain_text("order_id: ORD-2")
    expect(report.nth(1)).to_contain_text("quantity: 3")
    expect(report.nth(2)).to_contain_text("skipped")
    # the decision counts what was approved of what was proposed, and names what was skipped
    expect(page.locator(".line.decided")).to_have_text(
        "Approved by ana: 2 of 3 actions; skipped: orders.add_note"
    )
    expect(lines.nth(0).locator(".call-status")).to_have_text("✓ applied")
    expect(lines.nth(2).locator(".call-status")).to_have_text("⊘ skipped")
    shoot(page, "batch-applied")
    assert made == ["desk x1", "<img src=x onerror=alert(1)>chair x3"]
