"""After a decision, each kind of card leaves a line that says what was decided and what came
of it, in chromium: a client's result, a card nobody decided in time, a call cut off by a
crash (run again, skipped, or answered: each in the card's own words), a person's answer
declined. (An approval, an amended one, a rejection and a
batch with a skipped action are in test_page.py, test_inbox.py and test_deciding.py.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from handrail import Agent, Engine, Runtime, ToolContext, tool
from handrail.models import ModelRequest
from handrail.server import ApiKeyAuthenticator, create_app
from handrail.store import MemoryStore
from handrail.testing import FunctionModel, Step, call

from .conftest import KEYS, Served, _Thread

pytestmark = pytest.mark.browser

Serve = Callable[[Engine], Served]
NewPage = Callable[..., Page]
Shoot = Callable[[Page, str], Any]
ANA = {"Authorization": "Bearer key-ana"}


def signed_in(new_page: NewPage, served: Served, key: str = "key-ana") -> Page:
    page = new_page()
    page.goto(f"{served.url}/#key={key}")
    expect(page.get_by_label("Message")).to_be_visible()
    return page


def send(page: Page, text: str) -> None:
    page.get_by_label("Message").fill(text)
    page.get_by_label("Message").press("Enter")


def reads(line: Any, status: str, digest: str | None = None) -> None:
    expect(line.locator(".call-status")).to_have_text(status)
    if digest is not None:
        expect(line.locator(".call-digest")).to_have_text(digest)


@tool(name="tab.open", executor="client")
def open_tab(url: str) -> str:
    """Open a tab in the user's browser."""
    raise AssertionError("a client tool never runs here")


@tool(name="pay", permission="write", approval="required", expires_after=60.0)
def pay(amount: float) -> str:
    """Pay."""
    return f"paid {amount:g}"


def script(request: ModelRequest) -> Step:
    last = request.messages[-1]
    if last.role != "user":
        return "Done."
    text = "".join(getattr(p, "text", "") for p in last.parts)
    return call("tab.open", url="https://example.com") if text == "open" else call("pay", amount=5)


def test_a_client_result_reads_ran_in_the_client_and_the_call_done(
    serve: Serve, new_page: NewPage, shoot: Shoot
) -> None:
    engine = Engine(
        Agent("desk", tools=[open_tab, pay]),
        store=MemoryStore(),
        runtime=Runtime(model=FunctionModel(script)),
    )
    served = serve(engine)
    # a client app that runs client tools asks (?client=true): the call waits for its result
    session_id = httpx.post(f"{served.url}/sessions", headers=ANA).json()["id"]
    turn = httpx.post(
        f"{served.url}/sessions/{session_id}/turns?client=true", headers=ANA, json={"text": "open"}
    )
    assert turn.status_code == 202, turn.text
    page = new_page()
    page.goto(f"{served.url}/#key=key-ana&session={session_id}")
    card = page.locator(".card.client_exec")
    expect(card).to_be_visible()
    reads(page.locator("#transcript .call"), "⚑ waiting for a decision")
    call_id = card.get_attribute("data-call")
    posted = httpx.post(  # what the client app does once it ran the tool
        f"{served.url}/sessions/{session_id}/resolve",
        headers=ANA,
        json={
            "tool_call_id": call_id,
            "decision": {"decision": "client_result", "output": "opened"},
        },
    )
    assert posted.status_code == 200, posted.text
    # the page was left open: it reads the session again and shows what happened
    expect(page.locator(".bubble.assistant .text")).to_have_text("Done.")
    expect(page.locator(".line.decided")).to_have_text("Ran in the client by ana: tab.open")
    reads(page.locator("#transcript .call"), "✓ done")
    shoot(page, "client-result")


@pytest.fixture
def swept() -> Iterator[Callable[[Engine], Served]]:
    """A server that runs the sweeps (cards past their deadline expire) every 0.2 s."""
    running: list[_Thread] = []

    def start(engine: Engine) -> Served:
        app = create_app(
            engine,
            authenticator=ApiKeyAuthenticator(KEYS),
            poll_interval=0.2,
            ping_interval=5.0,
            shutdown_grace=1.0,
            sweep_interval=0.2,
        )
        thread = _Thread(app)
        running.append(thread)
        return Served(thread.__enter__(), engine)

    yield start
    for thread in running:
        thread.__exit__()


def test_a_card_nobody_decided_in_time_reads_expired(
    swept: Serve, new_page: NewPage, shoot: Shoot
) -> None:
    now = [1_000_000.0]
    engine = Engine(
        Agent("desk", tools=[open_tab, pay]),
        store=MemoryStore(clock=lambda: now[0]),
        runtime=Runtime(model=FunctionModel(script), clock=lambda: now[0]),
    )
    served = swept(engine)
    page = signed_in(new_page, served)
    send(page, "pay")
    expect(page.locator(".card.approval")).to_be_visible()
    now[0] += 120  # past the card's minute: the sweep expires it, and the turn goes on
    expect(page.locator(".bubble.assistant .text")).to_have_text("Done.")
    expect(page.locator(".line.decided")).to_have_text("Expired: pay")
    line = page.locator("#transcript .call")
    # it never ran: expired, not failed, and why
    reads(
        line,
        "⊘ expired",
        "→ Nobody decided on this call before its deadline, so it did not run. Tell the user it "
        "is still to be done, or ask again.",
    )
    shoot(page, "expired")


charges: list[str] = []
charging: list[asyncio.Event] = []  # set once the first charge runs (the crash point)


@tool(name="charge", permission="write", approval="auto")
async def charge(ctx: ToolContext[None], order: str) -> str:
    """Charge an order (not idempotent)."""
    charges.append(order)
    if len(charges) == 1:
        charging[0].set()
        await asyncio.sleep(3600)  # the worker dies in here
    return f"charged {order}"


def charge_script(request: ModelRequest) -> Step:
    if request.messages[-1].role == "user":
        return call("charge", order="A1")
    return "Charged."


def cut_off(store: MemoryStore) -> None:
    """A turn of ana's whose worker died while `charge` ran, recovered onto a card."""

    async def crash_and_recover() -> None:
        charging[:] = [asyncio.Event()]  # of this loop
        engine = Engine(
            Agent("desk", tools=[charge]),
            store=store,
            runtime=Runtime(model=FunctionModel(charge_script)),
        )
        task = asyncio.create_task(
            _drain(engine.submit("s1", "charge A1", org_id="acme", user_id="ana"))
        )
        await charging[0].wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _drain(engine.recover("s1", org_id="acme", user_id="ana"))

    with ThreadPoolExecutor(1) as pool:  # Playwright's loop runs in this thread
        pool.submit(lambda: asyncio.run(crash_and_recover())).result()


async def _drain(run: Any) -> None:
    async for _ in run:
        pass


@pytest.mark.parametrize(
    ("choice", "decided", "status", "says", "outcome", "audited", "ran"),
    [
        # each of the card's choices reads in its own words, not as the `approve` or the
        # `reject` the server records: the line, the call's status, "Decided by you", the
        # audit view
        (
            "Run it again",
            "Run again by ana: charge",
            "✓ done",
            "charged A1",
            "Run again by ana; ✓ done",
            ("Run again", "recorded as approve (recovery card)"),
            ["A1", "A1"],
        ),
        (
            "Skip",
            "Skipped by ana: charge",
            "⊘ not run again",  # it may have run before the crash
            "→ This call may have run before a crash, and a person chose not to retry it",
            "Skipped by ana; ⊘ not run again: This call may have run before a crash",
            ("Skipped", "recorded as reject (recovery card)"),
            ["A1"],
        ),
        # someone checked that it ran, and what it returned (the API's answer: no button)
        (
            None,
            "Answered by ana: charge (charged A1)",
            "✓ done",
            "→ it ran before a crash (confirmed by ana)",
            "Answered by ana; ✓ done: it ran before a crash (confirmed by ana).",
            ("Answered", None),  # the plain word: nothing more to say
            ["A1"],
        ),
    ],
    ids=["run-again", "skip", "answer"],
)
def test_a_call_cut_off_by_a_crash_reads_as_the_choice_made(
    serve: Serve,
    new_page: NewPage,
    shoot: Shoot,
    choice: str | None,
    decided: str,
    status: str,
    says: str,
    outcome: str,
    audited: tuple[str, str | None],
    ran: list[str],
) -> None:
    charges.clear()
    store = MemoryStore()
    cut_off(store)
    served = serve(
        Engine(
            Agent("desk", tools=[charge]),
            store=store,
            runtime=Runtime(model=FunctionModel(charge_script)),
        )
    )
    page = new_page()
    page.goto(f"{served.url}/#key=key-ana&session=s1")
    card = page.locator(".card.recovery")
    expect(card.get_by_role("heading")).to_have_text("charge may have run before a crash")
    expect(card.get_by_role("button")).to_have_text(["Run it again", "Skip"])
    if choice is not None:
        card.get_by_role("button", name=choice).click()
    else:
        posted = httpx.post(
            f"{served.url}/sessions/s1/resolve",
            headers=ANA,
            json={
                "tool_call_id": card.get_attribute("data-call"),
                "decision": {"decision": "answer", "output": "charged A1"},
            },
        )
        assert posted.status_code == 200, posted.text
    expect(page.locator(".bubble.assistant .text")).to_have_text("Charged.")
    expect(page.locator(".line.decided")).to_have_text(decided)
    reads(page.locator("#transcript .call"), status)
    expect(page.locator("#transcript .call")).to_contain_text(says)
    expect(page.locator("#decided-list .decided-outcome")).to_contain_text(outcome)
    shoot(page, f"recovery-{(choice or 'answer').split()[0].lower()}")
    assert charges == ran
    # and the audit view, beside what the trail records
    di = signed_in(new_page, served, "key-di")
    di.get_by_role("button", name="Audit trail").click()
    decision = di.locator("#audit-rows tr.audit-decision")
    words, recorded = audited
    expect(decision.locator(".audit-what")).to_have_text(words)
    if recorded is not None:
        expect(decision).to_contain_text(recorded)
    else:
        expect(decision).not_to_contain_text("recorded as")


def test_a_declined_question_reads_declined(serve: Serve, new_page: NewPage, shoot: Shoot) -> None:
    engine = Engine(
        Agent("desk", tools=[ask]),
        store=MemoryStore(),
        runtime=Runtime(model=FunctionModel(ask_script)),
    )
    page = signed_in(new_page, serve(engine))
    send(page, "ask")
    card = page.locator(".card.elicitation")
    card.get_by_label("Reason").fill("not mine to say")
    card.get_by_role("button", name="Decline").click()
    expect(page.locator(".bubble.assistant .text")).to_have_text("Done.")
    # "Decline" on the card, "Declined" after it: never "Rejected"
    expect(page.locator(".line.decided")).to_have_text(
        "Declined by ana: customer.ask: “not mine to say”"
    )
    reads(page.locator("#transcript .call"), "⊘ declined", "→ declined by ana: not mine to say")
    expect(page.locator("#decided-list .decided-outcome")).to_contain_text(
        "Declined by ana; ⊘ declined"
    )
    shoot(page, "declined")


@tool(name="customer.ask", executor="human", prompt="What does the customer prefer?")
def ask(question: str) -> str:
    """Ask the customer (a person answers for them)."""
    raise AssertionError("a human tool never runs")


def ask_script(request: ModelRequest) -> Step:
    if request.messages[-1].role == "user":
        return call("customer.ask", question="Refund or replacement?")
    return "Done."
