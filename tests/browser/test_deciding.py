"""What a person reads on a card they decide with others, in chromium.

Ana asks to pay a supplier; the payment needs two people with the role it-admin. Bo, who had
the page open, hears of the new card, opens it from "To decide" and reads Ana's message as
hers; he lowers the amount and approves, and his card then says it waits for one more, with
no buttons. Cy sees what Bo changed (the diff of the arguments), approves, and reads what came
of it: paid. Ana reads that both approved. Di, an auditor, reads the trail and that it holds;
the others get no audit view. axe-core finds no serious or critical violation on the card, the
inbox and the audit view, and each is saved as a screenshot.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from handrail import Agent, DecisionPolicy, Domain, Engine, Runtime, tool
from handrail.audit import AuditKey
from handrail.models import ModelRequest
from handrail.store import MemoryStore
from handrail.testing import FunctionModel, Step, call

from .conftest import Served

pytestmark = pytest.mark.browser

Serve = Callable[[Engine], Served]
NewPage = Callable[..., Page]
Shoot = Callable[[Page, str], Any]
Axe = Callable[[Page], list[str]]

paid: list[float] = []


@tool(
    name="pay",
    permission="destructive",
    amendable=["amount"],
    decision_policy=DecisionPolicy(roles={"it-admin"}, approvals=2),
    digest=lambda paid: paid,  # what people see of the result
)
def pay(to: str, amount: float) -> str:
    """Pay a supplier."""
    paid.append(amount)
    return f"paid {amount:g} to {to}"


def pay_script(request: ModelRequest) -> Step:
    if request.messages[-1].role == "user":
        return call("pay", to="acme-supplies", amount=500)
    return "Paid."


def signed_in(new_page: NewPage, served: Served, key: str) -> Page:
    page = new_page()
    page.goto(f"{served.url}/#key={key}")
    expect(page.get_by_label("Message")).to_be_visible()
    return page


def test_two_approvers_read_who_asked_what_is_needed_what_changed_and_what_came_of_it(
    serve: Serve, new_page: NewPage, shoot: Shoot, axe: Axe
) -> None:
    paid.clear()
    engine = Engine(
        Domain(agents=[Agent("desk", tools=[pay])]),
        store=MemoryStore(audit_key=AuditKey("k1", b"k" * 32)),
        runtime=Runtime(model=FunctionModel(pay_script)),
    )
    served = serve(engine)
    bo = signed_in(new_page, served, "key-bo")  # his page is open before the card exists
    expect(bo.locator("#inbox-list")).to_have_text("Nothing waits for you.")

    ana = signed_in(new_page, served, "key-ana")
    ana.get_by_label("Message").fill("Pay the supplier for the March invoice")
    ana.get_by_label("Message").press("Enter")
    expect(ana.locator(".card.approval")).to_be_visible()
    # her own card: her message is hers, and the session is named by it
    expect(ana.locator(".bubble.user .who")).to_have_text("You")
    expect(ana.locator(".session .session-title")).to_have_text(
        "Pay the supplier for the March invoice"
    )
    expect(ana.locator(".card .needs")).to_have_text(
        "Needs the approval of two people with the role it-admin."
    )

    # the inbox, read again while bo's page is open, announces the new card
    item = bo.locator("#inbox-list .inbox-card")
    expect(item).to_have_count(1)
    expect(bo.locator("#announce")).to_have_text("New in To decide: pay, from ana.")
    # one phrase to a screen reader (chromium spaces the spans of the grid: "pay , from ana")
    expect(bo.get_by_role("button", name=re.compile(r"^pay ?, from ana , "))).to_be_visible()
    assert axe(bo) == []
    shoot(bo, "inbox")

    item.click()
    card = bo.locator(".card.approval")
    expect(card).to_be_focused()
    # ana's message is ana's, not "You"
    expect(bo.locator(".bubble.user .who")).to_have_text("ana")
    expect(bo.locator("#chat-title")).to_have_text("Pay the supplier for the March invoice (ana's)")
    expect(card.locator(".requester")).to_have_text("Asked by ana")
    expect(card.locator(".needs")).to_have_text(
        "Needs the approval of two people with the role it-admin."
    )
    expect(card.locator(".approvals")).to_have_text(
        "0 of 2 approvals of these arguments: no approvals yet"
    )
    # the keyboard: from the card, the amount, the reason, then Approve and Reject
    order = []
    for _ in range(4):
        bo.keyboard.press("Tab")
        order.append(
            bo.evaluate("() => document.activeElement.id || document.activeElement.textContent")
        )
    assert order == [
        f"{card.get_attribute('id')}-amend-amount",
        f"{card.get_attribute('id')}-reason",
        "Approve",
        "Reject",
    ]
    assert axe(bo) == []
    card.get_by_label("amount").fill("450")
    card.get_by_role("button", name="Approve").click()
    # his approval is given: the card says it waits for another, and offers no buttons
    expect(card.locator(".waiting-for-others")).to_have_text(
        "You approved; waiting for 1 more (role it-admin)."
    )
    expect(card.get_by_role("button")).to_have_count(0)
    expect(card.locator(".approvals")).to_have_text(
        "1 of 2 approvals of these arguments: approved by bo"
    )
    shoot(bo, "card-approved-waiting")

    cy = signed_in(new_page, served, "key-cy")
    cy.locator("#inbox-list .inbox-card").click()
    card = cy.locator(".card.approval")
    # what bo changed: the argument as it is now, and what it was
    amount = card.locator(".args dd.changed-arg")
    expect(amount).to_have_text("450 (was 500)")
    expect(amount.locator("del")).to_have_text("500")
    expect(card.locator(".changed")).to_have_text(
        "Changed by bo from the agent's proposal: amount 500 → 450"
    )
    expect(card.locator(".approvals")).to_have_text(
        "1 of 2 approvals of these arguments: approved by bo"
    )
    assert axe(cy) == []
    shoot(cy, "card")
    card.get_by_role("button", name="Approve").click()
    expect(cy.locator("#status")).to_have_text("Decided; the turn resumes in the background.")
    # what came of it, though the session is no longer hers to read
    outcome = cy.locator(".outcome .outcome-status")
    expect(outcome).to_have_text("Approved by bo and cy; ✓ done: paid 450 to acme-supplies.")
    expect(cy.locator(".outcome")).to_be_focused()
    shoot(cy, "outcome")
    assert paid == [450]

    ana.reload()
    expect(ana.locator(".bubble.assistant .text")).to_have_text("Paid.")
    expect(ana.locator(".line.decided")).to_have_text(
        "Approved by bo and cy: pay (amended: amount 500 → 450)"
    )

    # the audit view: only for those who may read the trail
    expect(cy.get_by_role("button", name="Audit trail")).to_be_hidden()
    di = signed_in(new_page, served, "key-di")
    di.get_by_role("button", name="Audit trail").click()
    expect(di.locator("#audit-heading")).to_be_focused()
    expect(di.locator(".verify-result")).to_contain_text(
        "✓ The trail holds: 3 entries (3 keyed, 0 unkeyed) verified; the last is 3:"
    )
    rows = di.locator("#audit-rows tr")
    expect(rows).to_have_count(3)
    expect(rows.nth(0)).to_contain_text("bo")
    expect(rows.nth(0)).to_contain_text("amended: amount 500 → 450")
    expect(rows.nth(1)).to_contain_text("cy")
    expect(rows.nth(2)).to_contain_text("call")
    di.get_by_label("Kind").select_option("call")
    di.get_by_role("button", name="Show", exact=True).click()
    expect(rows).to_have_count(1)
    assert axe(di) == []
    shoot(di, "audit")
    di.reload()  # the view is in the URL
    expect(di.locator(".verify-result")).to_contain_text("✓ The trail holds")


def reads(line: Any, status: str, args: str, digest: str | None = None) -> None:
    """A call's line in the conversation: its status, its arguments, what it gave."""
    expect(line.locator(".call-status")).to_have_text(status)
    expect(line.locator(".call-args")).to_have_text(args)
    if digest is not None:
        expect(line.locator(".call-digest")).to_have_text(digest)


def test_the_call_line_the_inbox_and_what_you_decided_follow_the_card_as_it_changes(
    serve: Serve, new_page: NewPage, shoot: Shoot, axe: Axe
) -> None:
    """Ana keeps her page open; bo approves an amended amount, cy approves, and every page
    (none reloaded) says where the call stands: its arguments as they run, then its end."""
    paid.clear()
    engine = Engine(
        Domain(agents=[Agent("desk", tools=[pay])]),
        store=MemoryStore(audit_key=AuditKey("k1", b"k" * 32)),
        runtime=Runtime(model=FunctionModel(pay_script)),
    )
    served = serve(engine)
    ana = signed_in(new_page, served, "key-ana")
    ana.get_by_label("Message").fill("Pay the supplier")
    ana.get_by_label("Message").press("Enter")
    expect(ana.locator(".card.approval")).to_be_visible()
    line = ana.locator("#transcript .call")
    reads(line, "⚑ waiting for a decision", "to: acme-supplies · amount: 500")

    bo = signed_in(new_page, served, "key-bo")
    bo.locator("#inbox-list .inbox-card").click()
    # ana's conversation: bo decides its card, and is offered no message box
    expect(bo.locator("#not-yours")).to_have_text(
        "ana's conversation; you can decide its cards, not write in it."
    )
    expect(bo.get_by_label("Message")).to_be_hidden()
    card = bo.locator(".card.approval")
    card.get_by_label("amount").fill("450")
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".waiting-for-others")).to_be_visible()
    # his approval given, the card is not his to decide: out of "To decide", not "for you"
    expect(bo.locator("#status")).to_have_text(
        "You approved the call: it waits for another approver."
    )
    expect(bo.locator("#inbox-list")).to_have_text("Nothing waits for you.")
    expect(bo.locator("#inbox-count")).to_have_text("")
    waiting = bo.locator("#inbox-waiting")
    expect(waiting.locator("summary")).to_have_text("Waiting for others (1)")
    expect(waiting.locator(".inbox-card")).to_be_hidden()  # folded
    waiting.locator("summary").click()
    expect(waiting.locator(".badge.you-approved")).to_have_text("you approved · 1 of 2")
    # and what he decided, with where it stands
    decided = bo.locator("#decided-list .decided-item")
    expect(decided).to_have_count(1)
    expect(decided.locator(".decided-whose")).to_have_text("ana's session")
    expect(decided.locator(".decided-outcome")).to_have_text(
        "Waiting for more approvals: approved by bo so far."
    )
    # the call line says what runs if it is approved: the amount bo set, and what it was
    expect(bo.locator("#transcript .call .call-args")).to_have_text(
        "to: acme-supplies · amount: 450 (was 500)"
    )
    assert axe(bo) == []
    shoot(bo, "approved-waiting-for-others")
    # ana's page, not reloaded, reads the amendment
    expect(line.locator(".call-args")).to_have_text("to: acme-supplies · amount: 450 (was 500)")
    expect(line.locator(".call-args del")).to_have_text("500")
    expect(ana.locator(".card .approvals")).to_have_text(
        "1 of 2 approvals of these arguments: approved by bo"
    )

    cy = signed_in(new_page, served, "key-cy")
    cy.locator("#inbox-list .inbox-card").click()
    cy.locator(".card.approval").get_by_role("button", name="Approve").click()
    expect(cy.locator(".outcome .outcome-status")).to_have_text(
        "Approved by bo and cy; ✓ done: paid 450 to acme-supplies."
    )
    # the call line above it says the same, never "waiting for a decision"
    done = ("✓ done", "to: acme-supplies · amount: 450 (was 500)", "→ paid 450 to acme-supplies")
    reads(cy.locator("#transcript .call"), *done)
    shoot(cy, "outcome-and-line")
    assert paid == [450]

    # ana's page follows the turn as it resumes
    expect(ana.locator(".bubble.assistant .text")).to_have_text("Paid.")
    reads(line, *done)
    expect(ana.locator("#pending")).to_be_hidden()
    shoot(ana, "resumed-live")
    # bo's page: the card was decided by the others; he reads what came of it
    expect(bo.locator(".outcome .outcome-status")).to_have_text(
        "Approved by bo and cy; ✓ done: paid 450 to acme-supplies."
    )
    expect(bo.locator("#inbox-waiting")).to_be_hidden()
    # and, after leaving the page, in what he decided
    bo.goto(f"{served.url}/")
    expect(decided.locator(".decided-outcome")).to_have_text(
        "Approved by bo and cy; ✓ done: paid 450 to acme-supplies."
    )
    assert axe(bo) == []
    shoot(bo, "decided-by-you")

    # ana asks again; cy alone approves this one (one of two)
    ana.get_by_label("Message").fill("Pay the supplier again")
    ana.get_by_label("Message").press("Enter")
    expect(ana.locator(".card.approval")).to_be_visible()
    cy_elsewhere = signed_in(new_page, served, "key-cy")  # another browser: nothing stored
    cy_elsewhere.locator("#inbox-list .inbox-card").click()
    cy_elsewhere.locator(".card.approval").get_by_role("button", name="Approve").click()
    expect(cy_elsewhere.locator("#status")).to_have_text(
        "You approved the call: it waits for another approver."
    )
    # what each decided is kept by the server, not the browser: a fresh browser (its storage
    # empty) lists cy's two decisions, newest first, and bo's one, never the other's
    cys = cy_elsewhere.locator("#decided-list .decided-item")
    expect(cys.locator(".decided-outcome")).to_have_text(
        [
            "Waiting for more approvals: approved by cy so far.",
            "Approved by bo and cy; ✓ done: paid 450 to acme-supplies.",
        ]
    )
    expect(cys.locator(".decided-whose")).to_have_text(["ana's session", "ana's session"])
    bo_elsewhere = signed_in(new_page, served, "key-bo")
    bos = bo_elsewhere.locator("#decided-list .decided-item")
    expect(bos).to_have_count(1)
    expect(bos.locator(".decided-tool")).to_have_text("pay")
    expect(bos.locator(".decided-outcome")).to_have_text(
        "Approved by bo and cy; ✓ done: paid 450 to acme-supplies."
    )
    assert bo_elsewhere.evaluate("Object.keys(localStorage)") == ["handrail:key"]  # no list
    assert paid == [450]
