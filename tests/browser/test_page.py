"""The web page, driven in chromium: chat, stream, cards, decisions, reloads, tenants."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import httpx
import pytest
from playwright.sync_api import Page, expect
from pydantic import BaseModel

from handrail import (
    Agent,
    Engine,
    MemoryStore,
    Message,
    RunState,
    Runtime,
    SessionRecord,
    TextPart,
    tool,
)
from handrail.demo.support_desk import CUSTOMER_MESSAGE, CUSTOMER_MESSAGES, Desk, refund_order
from handrail.demo.web import build_engine
from handrail.models import ModelRequest
from handrail.testing import FunctionModel, Step, call

from .conftest import Served

pytestmark = pytest.mark.browser

Serve = Callable[[Engine], Served]
NewPage = Callable[..., Page]
Shoot = Callable[[Page, str], Any]

REPLY_APPROVED = re.compile(r"your refund R0001 of €40\.00 has been approved")


@pytest.fixture
def desk(serve: Serve) -> Served:
    """The support desk (the web demo's engine) on a memory store, streaming word by word."""
    return serve(build_engine(store=MemoryStore(), pace=0.02))


def signed_in(new_page: NewPage, served: Served, key: str = "key-ana", **options: Any) -> Page:
    page = new_page(**options)
    page.goto(f"{served.url}/#key={key}")
    expect(page.get_by_label("Message")).to_be_visible()
    return page


def send(page: Page, text: str) -> None:
    page.get_by_label("Message").fill(text)
    page.get_by_label("Message").press("Enter")


def reply(page: Page) -> Any:
    """The text of the agent's reply (not of a scratch agent's working note)."""
    return page.locator(".bubble.assistant:not(.note) .text")


def refund_card(page: Page) -> Any:
    card = page.locator(".card.approval")
    expect(card).to_be_visible()
    return card


# -- signing in, streaming -------------------------------------------------------------------


def test_a_wrong_key_is_refused_with_a_message(
    desk: Served, new_page: NewPage, shoot: Shoot
) -> None:
    page = new_page()
    page.goto(desk.url)
    page.get_by_label("API key").fill("not-a-key")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("That API key was not accepted (401).")
    expect(page.get_by_label("Message")).to_be_hidden()
    shoot(page, "refused")

    page.get_by_label("API key").fill("key-ana")
    page.get_by_label("API key").press("Enter")
    expect(page.get_by_label("Message")).to_be_visible()
    page.reload()  # the key is kept
    expect(page.get_by_label("Message")).to_be_visible()
    assert "key-ana" not in page.url


def test_a_message_streams_its_reply(desk: Served, new_page: NewPage, shoot: Shoot) -> None:
    page = signed_in(new_page, desk)
    shoot(page, "empty")
    send(page, "Hi! Do you refund items that arrive damaged?")
    answer = page.locator(".bubble.assistant:not(.note)")
    # While the words arrive the bubble is busy (screen readers wait for it), then it is done.
    expect(answer).to_have_attribute("aria-busy", "true")
    shoot(page, "streaming")
    expect(reply(page)).to_have_text(
        re.compile(r"^Yes: .*refunded in full within 30 days.*order number\.$")
    )
    expect(page.locator("#status")).to_have_text("The reply is complete.")
    expect(answer).not_to_have_attribute("aria-busy", "true")
    expect(page.locator(".bubble.user")).to_have_text(re.compile("Do you refund items"))
    expect(page.locator(".line.route")).to_have_text(re.compile("Route: simple"))
    expect(page.locator(".session[aria-current=true]")).to_have_count(1)
    shoot(page, "replied")


# -- approvals ---------------------------------------------------------------------------------


def test_an_amended_refund_is_approved_and_the_reply_uses_the_amount(
    desk: Served, new_page: NewPage, shoot: Shoot
) -> None:
    page = signed_in(new_page, desk)
    send(page, CUSTOMER_MESSAGE)
    card = refund_card(page)
    expect(card).to_be_focused()  # the card that needs action has the focus
    expect(card.get_by_role("heading")).to_have_text("Approve orders.refund?")
    expect(card.locator("dl")).to_contain_text("damaged on arrival")
    lookup = page.locator(".call", has_text="orders.lookup")
    expect(lookup).to_contain_text("✓ done")
    expect(lookup).to_contain_text("total: €84.00")
    expect(page.locator(".call", has_text="orders.refund")).to_contain_text("waiting")
    amount = card.get_by_label("amount")
    expect(amount).to_have_value("84")
    shoot(page, "card")

    amount.fill("40")
    card.get_by_role("button", name="Approve").click()
    expect(reply(page)).to_have_text(REPLY_APPROVED)
    refund = page.locator(".call", has_text="orders.refund")
    expect(refund).to_contain_text("✓ done")
    expect(refund).to_contain_text("amount: €40.00")
    expect(page.locator(".line.decided")).to_have_text(
        "Approved by ana: orders.refund (amended: amount 84 → 40)"
    )
    expect(page.locator("#pending")).to_be_hidden()
    shoot(page, "approved")


def test_a_rejection_with_a_reason_reaches_the_reply(
    desk: Served, new_page: NewPage, shoot: Shoot
) -> None:
    page = signed_in(new_page, desk)
    send(page, CUSTOMER_MESSAGE)
    card = refund_card(page)
    card.get_by_label("Reason").fill("Ask for photos of the damage first")
    card.get_by_label("Reason").press("Enter")  # in the reason, Enter rejects
    expect(reply(page)).to_contain_text(
        "did not approve the refund this time (Ask for photos of the damage first)"
    )
    expect(page.locator(".call", has_text="orders.refund")).to_contain_text("rejected")
    expect(page.locator(".line.decided")).to_contain_text("Rejected by ana")
    shoot(page, "rejected")


def test_the_card_is_decided_with_the_keyboard_alone(desk: Served, new_page: NewPage) -> None:
    page = signed_in(new_page, desk)
    send(page, CUSTOMER_MESSAGE)
    card = refund_card(page)
    expect(card).to_be_focused()
    page.keyboard.press("Tab")
    expect(card.get_by_label("amount")).to_be_focused()
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.type("40")
    page.keyboard.press("Enter")  # submits the card's form: approve
    expect(reply(page)).to_have_text(REPLY_APPROVED)
    expect(page.get_by_label("Message")).to_be_focused()


def test_an_invalid_amendment_is_refused_on_the_card(desk: Served, new_page: NewPage) -> None:
    page = signed_in(new_page, desk)
    send(page, CUSTOMER_MESSAGE)
    card = refund_card(page)
    card.get_by_label("amount").fill("")
    card.get_by_label("amount").press_sequentially("4e")
    card.get_by_role("button", name="Approve").click()
    expect(card.get_by_role("alert")).to_contain_text("amount")
    expect(card).to_be_visible()


def test_after_a_reload_the_same_card_is_shown_and_approved(
    desk: Served, new_page: NewPage, shoot: Shoot
) -> None:
    page = signed_in(new_page, desk)
    send(page, CUSTOMER_MESSAGE)
    card_id = refund_card(page).get_attribute("data-call")
    page.reload()
    card = refund_card(page)
    assert card.get_attribute("data-call") == card_id
    expect(card).to_be_focused()
    expect(page.locator(".call", has_text="orders.lookup")).to_contain_text("total: €84.00")
    shoot(page, "reloaded")
    card.get_by_label("amount").fill("40")
    card.get_by_role("button", name="Approve").click()
    expect(reply(page)).to_have_text(REPLY_APPROVED)


def test_a_stale_approval_shows_the_conflict_on_the_card(
    desk: Served, new_page: NewPage, shoot: Shoot
) -> None:
    page = signed_in(new_page, desk)
    send(page, CUSTOMER_MESSAGE)
    card = refund_card(page)
    session_id = page.evaluate("() => new URLSearchParams(location.hash.slice(1)).get('session')")
    call_id = card.get_attribute("data-call")
    decided = httpx.post(
        f"{desk.url}/sessions/{session_id}/resolve",
        json={"tool_call_id": call_id, "decision": {"decision": "reject", "reason": "elsewhere"}},
        headers={"Authorization": "Bearer key-ana"},
    )
    assert decided.status_code == 200
    card.get_by_role("button", name="Approve").click()
    expect(card.get_by_role("alert")).to_contain_text(
        "was already decided (reject by ana); a call is never decided or run twice. "
        "(409 stale_resolution)"
    )
    expect(card.get_by_role("button", name="Approve")).to_be_disabled()
    shoot(page, "stale")
    page.get_by_role("button", name="Show the session as it is now").click()
    expect(page.locator(".card")).to_have_count(0)
    expect(reply(page)).to_contain_text("did not approve the refund this time (elsewhere)")


def test_a_reload_mid_stream_resumes_the_stream(
    serve: Serve, new_page: NewPage, shoot: Shoot
) -> None:
    served = serve(build_engine(store=MemoryStore(), pace=0.08))
    page = signed_in(new_page, served)
    send(page, "Thanks. Where is my order A1042?")
    expect(page.locator(".bubble.note")).to_contain_text("Order A1042")  # the executor's note
    page.reload()
    # The reply streams into the reloaded page: it follows the turn, not just the store.
    expect(page.locator(".bubble.assistant:not(.note)")).to_have_attribute("aria-busy", "true")
    expect(reply(page)).to_have_text(
        "Your order A1042 (€84.00) was delivered on 18 November. Anything else?"
    )
    expect(page.locator(".bubble.note .text")).to_have_text(
        "Order A1042 (€84.00): delivered on 18 November 2026."
    )
    expect(page.locator(".bubble.user")).to_have_count(1)
    expect(page.locator(".call", has_text="orders.lookup")).to_have_count(1)
    shoot(page, "resumed")


def test_a_stream_that_fails_is_reconnected_after_the_last_event(
    desk: Served, new_page: NewPage
) -> None:
    page = signed_in(new_page, desk)
    failed: list[str] = []

    def fail_once(route: Any) -> None:
        if failed:
            route.continue_()
        else:
            failed.append(route.request.url)
            route.abort()

    page.route("**/events?after=*", fail_once)
    send(page, "Hi! Do you refund items that arrive damaged?")
    expect(reply(page)).to_have_text(re.compile(r"^Yes: .*order number\.$"))
    assert len(failed) == 1
    expect(page.locator(".bubble.user")).to_have_count(1)


# -- tenants, phones ---------------------------------------------------------------------------


def test_two_users_do_not_see_each_others_sessions(
    desk: Served, new_page: NewPage, shoot: Shoot
) -> None:
    ana = signed_in(new_page, desk)
    send(ana, "Hi! Do you refund items that arrive damaged?")
    expect(ana.locator("#status")).to_have_text("The reply is complete.")
    session_id = ana.locator(".session[aria-current=true]").get_attribute("data-session")

    bob = signed_in(new_page, desk, key="key-bob")
    expect(bob.locator("#session-list")).to_have_text("No sessions yet.")
    bob.goto(f"{desk.url}/#session={session_id}")
    bob.reload()
    expect(bob.locator("#status")).to_have_text("That session does not exist (or is not yours).")
    expect(bob.locator(".bubble")).to_have_count(0)
    shoot(bob, "bob")
    expect(ana.locator(".session")).to_have_count(1)
    shoot(ana, "ana")


def test_the_card_fits_a_phone(desk: Served, new_page: NewPage, shoot: Shoot) -> None:
    page = signed_in(new_page, desk, viewport={"width": 375, "height": 812})
    send(page, CUSTOMER_MESSAGE)
    card = refund_card(page)
    expect(card.get_by_role("button", name="Approve")).to_be_visible()
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 375
    box = card.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 375
    shoot(page, "phone")


# -- a clerk domain: two refunds at once, and a question for a person --------------------------


class Preference(BaseModel):
    """What the customer prefers."""

    outcome: Literal["refund", "replacement"]
    note: str
    photos: bool = False


@tool(name="customer.ask", executor="human", prompt="What does the customer prefer?")
def ask_customer(question: str) -> Preference:
    """Ask the customer (a person answers for them)."""
    raise AssertionError("a human tool never runs")


def clerk_script(request: ModelRequest) -> Step:
    latest = max(i for i, m in enumerate(request.messages) if m.role == "user")
    customer = request.messages[latest].text
    turn: list[Message] = request.messages[latest:]
    done = [p for m in turn for p in m.tool_calls]
    if "both" in customer:
        if not done:
            return [
                call("orders.refund", order_id="A1042", amount=84.0, reason="damaged"),
                call("orders.refund", order_id="B2001", amount=26.5, reason="late"),
            ]
        return "Refunds: " + ", ".join(
            f"{p.result.data['amount']} ({p.status})" if p.result and p.result.ok else p.status
            for p in done
        )
    if not done:
        return call("customer.ask", question="Refund or replacement?")
    answer = done[0].result.data if done[0].result else None
    return f"The customer prefers: {answer}"


@pytest.fixture
def clerk(serve: Serve) -> Served:
    agent = Agent("clerk", instructions="Help.", tools=[refund_order, ask_customer])
    runtime = Runtime(model=FunctionModel(clerk_script, name="clerk"), deps=Desk())
    return serve(Engine(agent, store=MemoryStore(), runtime=runtime))


def test_several_pending_refunds_are_approved_at_once(
    clerk: Served, new_page: NewPage, shoot: Shoot
) -> None:
    page = signed_in(new_page, clerk)
    send(page, "Refund both orders")
    expect(page.locator(".card.approval")).to_have_count(2)
    expect(page.locator(".card.approval").first).to_be_focused()
    page.locator(".card.approval").nth(1).get_by_label("amount").fill("20")
    shoot(page, "batch")
    page.get_by_role("button", name="Approve all (2)").click()
    expect(reply(page)).to_have_text("Refunds: €84.00 (completed), €20.00 (completed)")
    expect(page.locator(".line.decided")).to_have_count(2)
    shoot(page, "batch-approved")


def test_a_question_for_a_person_is_answered_with_a_form(
    clerk: Served, new_page: NewPage, shoot: Shoot
) -> None:
    page = signed_in(new_page, clerk)
    send(page, "What should we do?")
    card = page.locator(".card.elicitation")
    expect(card).to_be_focused()
    expect(card).to_contain_text("What does the customer prefer?")
    expect(page.get_by_role("button", name=re.compile("Approve all"))).to_be_hidden()
    card.get_by_label("outcome").select_option("replacement")
    card.get_by_label("note").fill("same colour")
    card.get_by_label("photos").check()
    shoot(page, "question")
    card.get_by_role("button", name="Send answer").click()
    expect(reply(page)).to_have_text(
        "The customer prefers: {'outcome': 'replacement', 'note': 'same colour', 'photos': True}"
    )
    # the conversation says who answered what, and the call is done (waits no more)
    expect(page.locator(".line.decided")).to_have_text(
        "Answered by ana: customer.ask (outcome: replacement · note: same colour · photos: true)"
    )
    expect(page.locator(".call", has_text="customer.ask").locator(".call-status")).to_have_text(
        "✓ done"
    )
    shoot(page, "answered")


def test_a_required_answer_cannot_be_sent_empty(clerk: Served, new_page: NewPage) -> None:
    page = signed_in(new_page, clerk)
    send(page, "What should we do?")
    card = page.locator(".card.elicitation")
    card.get_by_role("button", name="Send answer").click()
    expect(card.get_by_role("alert")).to_have_text("outcome: a value is required")
    card.get_by_label("outcome").select_option("refund")
    card.get_by_role("button", name="Send answer").click()
    expect(card.get_by_role("alert")).to_contain_text("note: ")
    expect(card.get_by_label("note")).to_be_focused()
    expect(card).to_be_visible()


# -- answers from documents: citations, and a question for a person ----------------------------


@pytest.fixture
def librarian(serve: Serve, tmp_path: Any) -> Served:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from handrail.demo.policy_desk import POLICIES, policy_engine
    from handrail.documents import Library

    async def ingest() -> None:
        async with Library.open(tmp_path / "index") as library:
            await library.ingest(POLICIES)

    # In a thread of its own: Playwright keeps an event loop running in this one.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(ingest())).result()
    return serve(policy_engine(Library.open(tmp_path / "index")))


def test_an_answer_from_documents_shows_its_sources_and_a_person_answers_the_rest(
    librarian: Served, new_page: NewPage, shoot: Shoot
) -> None:
    page = signed_in(new_page, librarian)
    send(page, "How much does express shipping cost?")
    expect(reply(page).last).to_contain_text("costs 12.50 euros")
    sources = page.get_by_role("list", name="Sources")
    expect(sources.locator("li")).to_have_count(1)
    expect(sources.locator("cite")).to_have_text("shipping.pdf, page 1")
    expect(sources.locator("q")).to_contain_text("Express shipping within the European Union")
    shoot(page, "cited")

    send(page, "Do you price-match other shops?")
    card = page.locator(".card.question")
    expect(card).to_be_focused()
    expect(card).to_contain_text("documents.answer asks you")
    expect(card).to_contain_text("The documents do not answer it well enough")
    shoot(page, "asked")
    card.get_by_label("Your answer").fill("Yes, within the EU.")
    card.get_by_role("button", name="Send answer").click()
    expect(reply(page).last).to_contain_text("Yes, within the EU.")
    expect(reply(page).last).to_contain_text("(My colleague ana answered this.)")
    shoot(page, "answered")


# -- hosted tools -------------------------------------------------------------------------------


def test_a_provider_search_shows_its_summary_and_only_web_links(
    serve: Serve, new_page: NewPage
) -> None:
    from handrail import web_search
    from handrail.testing import hosted_call

    searched = {
        "kind": "web_search",
        "queries": ["refunds"],
        "sources": [
            {"url": "https://example.com/refunds", "title": "<img src=x onerror=alert(1)>"},
            {"url": "javascript:alert(1)", "title": "Not a link"},
            {"url": "http://example.org/b", "title": "B"},
        ],
    }

    def answer(request: ModelRequest) -> Step:
        return [hosted_call("web_search", searched, args={"query": "refunds"}), "Found three."]

    agent = Agent("assistant", tools=[web_search()])
    served = serve(Engine(agent, store=MemoryStore(), runtime=Runtime(model=FunctionModel(answer))))
    page = signed_in(new_page, served)
    send(page, "Search refunds")
    expect(reply(page)).to_have_text("Found three.")
    line = page.locator(".call.line")
    expect(line.locator(".call-digest")).to_have_text("→ searched the web: 3 sources")
    links = line.locator(".sources a")
    expect(links).to_have_count(2)
    expect(links.first).to_have_text("<img src=x onerror=alert(1)>")  # text, never markup
    expect(links.first).to_have_attribute("href", "https://example.com/refunds")
    expect(links.first).to_have_attribute("rel", "noopener noreferrer nofollow")
    expect(line.locator(".sources li span")).to_have_text("Not a link")
    expect(line.locator(".sources img")).to_have_count(0)
    page.reload()  # drawn again from the stored session: the same
    expect(page.locator(".call.line .sources a")).to_have_count(2)


# -- the history -----------------------------------------------------------------------------


def test_earlier_turns_keep_their_tool_calls_after_a_reload(
    desk: Served, new_page: NewPage, shoot: Shoot
) -> None:
    page = signed_in(new_page, desk)
    send(page, CUSTOMER_MESSAGES[1])  # the executor looks the order up, in its scratch
    expect(reply(page)).to_have_count(1)
    expect(reply(page).nth(0)).to_contain_text("was delivered")
    send(page, CUSTOMER_MESSAGES[0])  # the next turn: the first one's scratch is over
    expect(reply(page)).to_have_count(2)
    lookup = page.locator(".call", has_text="orders.lookup")
    expect(lookup).to_have_count(1)
    expect(page.locator("#transcript")).to_have_attribute("aria-busy", "false")  # turn over
    page.reload()  # drawn from the store alone
    expect(reply(page)).to_have_count(2)
    expect(lookup).to_have_count(1)  # kept in the history (it was lost with the scratch)
    expect(lookup).to_contain_text("done")
    # Drawn in its turn: after the question, before the answer.
    order = page.locator(".bubble.user, .call, .bubble.assistant:not(.note)").all_text_contents()
    assert [i for i, text in enumerate(order) if "orders.lookup" in text] == [1]
    shoot(page, "earlier-calls")


def test_a_long_history_is_drawn_from_its_latest_messages_and_paged_back(
    serve: Serve, new_page: NewPage
) -> None:
    store = MemoryStore()
    state = RunState(session_id="long", org_id="acme", user_id="ana")
    for n in range(70):
        state.messages.append(
            Message(id=f"u{n}", role="user", parts=[TextPart(text=f"question {n}")])
        )
        state.messages.append(
            Message(id=f"a{n}", role="assistant", parts=[TextPart(text=f"answer {n}")])
        )
    record = SessionRecord(
        id="long",
        org_id="acme",
        user_id="ana",
        status="completed",
        data=state.dump(messages=False),
        messages=state.dump_messages(),
    )
    with ThreadPoolExecutor(1) as thread:  # Playwright runs an event loop in this one
        thread.submit(asyncio.run, store.save(record)).result()
    served = serve(build_engine(store=store))
    page = new_page()
    page.goto(f"{served.url}/#key=key-ana&session=long")
    expect(page.locator(".bubble.user").last).to_have_text(re.compile("question 69"))
    expect(page.locator(".bubble.user")).to_have_count(50)  # the latest 100 messages
    earlier = page.get_by_role("button", name="Show earlier messages (40)")
    earlier.click()
    expect(page.locator(".bubble.user")).to_have_count(70)
    expect(page.locator(".bubble.user").first).to_have_text(re.compile("question 0"))
    expect(page.get_by_role("button", name=re.compile("Show earlier"))).to_have_count(0)


# -- reused reads -------------------------------------------------------------------------------


def test_a_reused_read_is_shown_as_not_run_again_and_the_write_after_it_runs(
    serve: Serve, new_page: NewPage
) -> None:
    notes: list[str] = []

    @tool(name="orders.get")
    def get_order(order_id: str) -> str:
        """Look an order up."""
        return f"{order_id}: pending"

    @tool(name="orders.note", permission="write", approval="auto")
    def note(order_id: str) -> str:
        """Note an order."""
        notes.append(order_id)
        return "noted"

    steps: list[Step] = [
        call("orders.get", order_id="A1"),
        call("orders.get", order_id="A1"),  # the same read: reused
        call("orders.note", order_id="A1"),
        "Noted A1.",
    ]

    def answer(request: ModelRequest) -> Step:
        return steps.pop(0)

    agent = Agent("clerk", tools=[get_order, note])
    served = serve(Engine(agent, store=MemoryStore(), runtime=Runtime(model=FunctionModel(answer))))
    page = signed_in(new_page, served)
    send(page, "Note A1")
    expect(reply(page)).to_have_text("Noted A1.")
    assert notes == ["A1"]
    for drawn in ("streamed", "reloaded"):  # then drawn again from the stored session
        if drawn == "reloaded":
            page.reload()
        lines = page.locator(".call.line")
        expect(lines).to_have_count(3)
        expect(lines.nth(1).locator(".call-reused")).to_have_text("reused, not run again")
        expect(page.locator(".call-reused")).to_have_count(1)
