"""The inbox: every card of an organisation its caller may decide, library and HTTP.

acme: ana and al (request; no role), bo (it-admin), di (sales); globex: eve (it-admin), who
requests a wipe of her own. A wipe needs an it-admin who is not its requester; a mail is its
requester's to approve (no policy).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from handrail import (
    Agent,
    Decider,
    DecisionPolicy,
    Domain,
    Engine,
    Runtime,
    TextPart,
    UserError,
    tool,
)
from handrail.models import ModelRequest
from handrail.server import ApiKeyAuthenticator, create_app
from handrail.store import MemoryStore
from handrail.suspension import args_digest
from handrail.testing import FunctionModel, Step, call

ANA, AL, BO, DI, EVE = (
    {"Authorization": f"Bearer key-{n}"} for n in ("ana", "al", "bo", "di", "eve")
)
SPECS = [
    "acme:ana:key-ana",
    "acme:al:key-al",
    "id=bo-1,org=acme,user=bo,roles=it-admin,key=key-bo",
    "id=di-1,org=acme,user=di,roles=sales,key=key-di",
    "id=eve-1,org=globex,user=eve,roles=it-admin,key=key-eve",
]
BO_DECIDES = Decider(user_id="bo", roles={"it-admin"}, org_id="acme")

wiped: list[str] = []


@tool(name="laptops.wipe", permission="destructive", amendable=["reason"])
def wipe(laptop: str, reason: str = "lost") -> str:
    """Wipe a laptop."""
    wiped.append(laptop)
    return f"wiped {laptop}"


@tool(name="mail.send", permission="write")
def send(to: str) -> str:
    """Send a mail."""
    return f"sent to {to}"


def answer(request: ModelRequest) -> Step:
    """`wipe X` asks to wipe laptop X, `mail X` to mail X; once the call is done, 'Done.'."""
    last = request.messages[-1]
    if last.role != "user":
        return "Done."
    [part] = last.parts
    assert isinstance(part, TextPart)
    verb, _, what = part.text.partition(" ")
    return call("laptops.wipe", laptop=what) if verb == "wipe" else call("mail.send", to=what)


@dataclass
class Api:
    app: Starlette
    client: httpx.AsyncClient
    engine: Engine
    now: list[float]

    async def ask(self, who: dict[str, str], text: str) -> str:
        """A session of `who`'s, suspended on the call `text` asks for: its id."""
        session = (await self.client.post("/sessions", headers=who)).json()["id"]
        turn = await self.client.post(
            f"/sessions/{session}/turns", json={"text": text}, headers=who
        )
        assert turn.status_code == 202, turn.text
        await self.app.state.runs.join(session)
        return str(session)

    async def inbox(self, who: dict[str, str], **query: Any) -> Any:
        response = await self.client.get("/pending", params=query, headers=who)
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    wiped.clear()
    now = [1_000_000.0]
    engine = Engine(
        Domain(
            agents=[Agent("desk", tools=[wipe, send])],
            policies={"destructive": DecisionPolicy(roles={"it-admin"}, four_eyes=True)},
        ),
        store=MemoryStore(),
        runtime=Runtime(model=FunctionModel(answer), clock=lambda: now[0]),
    )
    keys = ApiKeyAuthenticator()
    for spec in SPECS:
        keys.add_spec(spec)
    app = create_app(engine, authenticator=keys)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client,
    ):
        yield Api(app=app, client=client, engine=engine, now=now)


async def test_each_caller_sees_the_cards_it_may_decide_and_no_other_organisations(
    api: Api,
) -> None:
    wipe_ana = await api.ask(ANA, "wipe L-1")
    api.now[0] += 10
    mail_ana = await api.ask(ANA, "mail bo@acme")
    wipe_eve = await api.ask(EVE, "wipe G-9")  # globex: bo never sees it
    bo = await api.inbox(BO)
    assert bo["next"] is None
    [card] = bo["cards"]
    assert card["expires_at"] == card["created_at"] + 24 * 3600  # the default deadline
    assert card | {"tool_call_id": None, "created_at": None, "expires_at": None} == {
        "session_id": wipe_ana,
        "tool_call_id": None,
        "tool": "laptops.wipe",
        "kind": "approval",
        "prompt": card["prompt"],
        "args": {"laptop": "L-1", "reason": "lost"},
        "digest": args_digest("laptops.wipe", {"laptop": "L-1", "reason": "lost"}),
        "proposed_args": {"laptop": "L-1", "reason": "lost"},
        "changes": {},
        "approved_by": [],
        "amendable": ["reason"],
        "created_at": None,
        "expires_at": None,
        "requester": "ana",
        "agent": "desk",
        "approvals": [],
    }
    # ana decides her mail (no policy), and may withdraw her wipe (reject it) though not
    # approve it: the inbox lists what `Engine.decidable` (the policy's rule) lets her decide
    assert [(c["session_id"], c["tool"]) for c in (await api.inbox(ANA))["cards"]] == [
        (mail_ana, "mail.send"),
        (wipe_ana, "laptops.wipe"),
    ]
    for nobody in (AL, DI):  # not his; no role
        assert (await api.inbox(nobody))["cards"] == []
    # eve has the role: she sees her own wipe (to withdraw), never acme's
    assert [c["session_id"] for c in (await api.inbox(EVE))["cards"]] == [wipe_eve]
    # a card decided from the inbox: the turn resumes, and the card leaves every inbox
    resolved = await api.client.post(
        f"/sessions/{wipe_ana}/resolve",
        json={"tool_call_id": card["tool_call_id"], "decision": {"decision": "approve"}},
        headers=BO,
    )
    assert resolved.json()["resumed"] is True
    await api.app.state.runs.join(wipe_ana)
    assert wiped == ["L-1"]
    assert (await api.inbox(BO))["cards"] == []
    assert wipe_eve not in [c["session_id"] for c in (await api.inbox(ANA))["cards"]]


async def test_filters_by_tool_kind_age_and_session(api: Api) -> None:
    old = await api.ask(ANA, "wipe L-1")
    api.now[0] += 3600
    new = await api.ask(AL, "wipe L-2")
    api.now[0] += 60

    def sessions(page: Any) -> list[str]:
        return [c["session_id"] for c in page["cards"]]

    assert sessions(await api.inbox(BO)) == [new, old]  # most recently updated first
    assert sessions(await api.inbox(BO, older_than=600)) == [old]
    assert sessions(await api.inbox(BO, newer_than=600)) == [new]
    assert sessions(await api.inbox(BO, session_id=old)) == [old]
    assert sessions(await api.inbox(BO, tool="laptops.wipe")) == [new, old]
    assert sessions(await api.inbox(BO, tool="mail.send")) == []
    assert sessions(await api.inbox(BO, kind="batch")) == []
    assert sessions(await api.inbox(BO, kind="approval")) == [new, old]
    # a session of another organisation, by its id, is not found: an empty page
    eves = await api.ask(EVE, "mail x@globex")
    assert (await api.inbox(BO, session_id=eves)) == {"cards": [], "next": None}
    bad = await api.client.get("/pending", params={"cursor": "x"}, headers=BO)
    assert bad.status_code == 422
    bad = await api.client.get("/pending", params={"kind": "nope"}, headers=BO)
    assert bad.status_code == 422


async def test_pages_are_full_when_filtering_and_end_with_no_next(api: Api) -> None:
    wipes = []
    for n in range(5):
        wipes.append(await api.ask(ANA if n % 2 else AL, f"wipe L-{n}"))
        await api.ask(ANA, f"mail m{n}@acme")  # not bo's: filtered out between the wipes
        api.now[0] += 1
    seen: list[str] = []
    cursor = None
    pages = []
    while True:
        page = await api.inbox(BO, limit=2, **({"cursor": cursor} if cursor else {}))
        pages.append(len(page["cards"]))
        seen += [c["session_id"] for c in page["cards"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert pages[:2] == [2, 2] and sum(pages) == 5  # full pages until the last one
    assert seen == wipes[::-1]


async def test_the_library_inbox(api: Api) -> None:
    mine = await api.ask(ANA, "wipe L-1")
    page = await api.engine.pending("acme", BO_DECIDES)
    assert [(c.session_id, c.requester) for c in page.cards] == [(mine, "ana")]
    assert (await api.engine.pending("acme", Decider(user_id="di", org_id="acme"))).cards == []
    with pytest.raises(UserError, match="belongs to organisation 'acme'"):
        await api.engine.pending("globex", BO_DECIDES)
    with pytest.raises(UserError, match="not a cursor"):
        await api.engine.pending("acme", BO_DECIDES, cursor="1-2")
    with pytest.raises(UserError, match="limit must be 1 or more"):
        await api.engine.pending("acme", BO_DECIDES, limit=0)


async def test_a_card_names_the_agent_that_proposed_it_and_a_batch_its_actions(
    api: Api,
) -> None:
    asked = await api.ask(ANA, "wipe L-1")
    headless = await api.engine.run_headless(
        "batch", "mail bo@acme", propose=True, org_id="acme", user_id="ana"
    )
    assert headless.card is not None
    cards = (await api.inbox(ANA))["cards"]
    assert {c["kind"]: (c["session_id"], c["agent"]) for c in cards} == {
        "approval": (asked, "desk"),
        "batch": ("batch", "desk"),
    }
    page = await api.engine.pending("acme", Decider(user_id="ana", org_id="acme"))
    assert sorted((c.kind, c.agent) for c in page.cards) == [
        ("approval", "desk"),
        ("batch", "desk"),
    ]


async def test_a_page_reads_a_bounded_number_of_rows_and_says_where_to_go_on(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    import handrail.inbox

    monkeypatch.setattr(handrail.inbox, "_SCAN", 3)
    api.engine.domain.policies["destructive"] = DecisionPolicy(
        roles={"it-admin"}, four_eyes=True, withdraw=False
    )
    ana = Decider(user_id="ana", org_id="acme")
    mails = []
    for n in range(2):  # hers to decide (no policy: the requester's)
        mails.append(await api.ask(ANA, f"mail m{n}@acme"))
        api.now[0] += 1
    for n in range(3):  # newer: her own, so within her reach, but not hers to withdraw
        await api.ask(ANA, f"wipe L-{n}")
        api.now[0] += 1
    for n in range(3):  # newest, and out of her reach: the index query leaves them out
        await api.ask(AL, f"mail a{n}@acme")
        api.now[0] += 1
    first = await api.engine.pending("acme", ana, limit=10)
    assert first.cards == [] and first.next is not None  # three rows read: none hers
    second = await api.engine.pending("acme", ana, limit=10, cursor=first.next)
    assert [c.session_id for c in second.cards] == mails[::-1]
    assert second.next is None


async def test_a_card_lists_the_approvals_it_has_so_far(api: Api) -> None:
    api.engine.domain.policies["destructive"] = DecisionPolicy(
        roles={"it-admin"}, four_eyes=True, approvals=2
    )
    session = await api.ask(ANA, "wipe L-1")
    [card] = (await api.inbox(BO))["cards"]
    approved = await api.client.post(
        f"/sessions/{session}/resolve",
        json={"tool_call_id": card["tool_call_id"], "decision": {"decision": "approve"}},
        headers=BO,
    )
    assert approved.json()["resumed"] is False
    [card] = (await api.inbox(BO))["cards"]  # bo may still reject it
    assert [a["by"] for a in card["approvals"]] == ["bo"]


async def test_the_sessions_to_decide_are_those_of_the_card_inbox_paged_as_stored(
    api: Api,
) -> None:
    ana_wipe = await api.ask(ANA, "wipe L-1")
    api.now[0] += 1
    al_wipe = await api.ask(AL, "wipe L-2")
    api.now[0] += 1
    await api.ask(ANA, "mail x@acme")  # ana's to decide, not bo's
    api.now[0] += 1
    bo_wipe = await api.ask(BO, "wipe L-3")  # his own: he may withdraw it

    async def to_decide(**query: Any) -> list[str]:
        params = {"to_decide": "true", **query}
        response = await api.client.get("/sessions", params=params, headers=BO)
        assert response.status_code == 200, response.text
        return [s["id"] for s in response.json()["sessions"]]

    # others' sessions only (his own are in his own list), most recently updated first
    assert await to_decide() == [al_wipe, ana_wipe]
    # limit and offset page the sessions waiting for him (read off the inbox index): bo's
    # own and ana's mail are not among them, so every page but the last is full
    assert await to_decide(limit=1) == [al_wipe]
    assert await to_decide(limit=1, offset=1) == [ana_wipe]
    assert await to_decide(limit=2, offset=2) == []
    # the library's: the same reading, his own sessions counted unless own=False
    inbox = api.engine.inbox
    mine = [s.id for s in await inbox.sessions("acme", BO_DECIDES)]
    assert mine == [bo_wipe, al_wipe, ana_wipe]
    others = await inbox.sessions("acme", BO_DECIDES, own=False)
    assert [s.id for s in others] == [al_wipe, ana_wipe]
    cards = (await api.engine.pending("acme", BO_DECIDES)).cards
    assert [c.session_id for c in cards] == mine
    with pytest.raises(UserError, match="sessions: the decider belongs to organisation 'acme'"):
        await inbox.sessions("globex", BO_DECIDES)
    with pytest.raises(UserError, match="sessions: limit must be 1 or more"):
        await inbox.sessions("acme", BO_DECIDES, limit=0)
