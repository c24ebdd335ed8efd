"""Who may decide: decision policies through `Engine.resolve`, as a library user drives them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from handrail import (
    MESSAGES,
    Agent,
    ApprovalCardPart,
    Approve,
    ArgumentsChangedError,
    CardApproval,
    ConflictError,
    Decider,
    DecisionNotAllowedError,
    DecisionPolicy,
    Domain,
    Engine,
    Reject,
    Runtime,
    SessionNotFoundError,
    ToolDefinitionError,
    UserError,
    tool,
)
from handrail.audit import verify
from handrail.store import MemoryStore
from handrail.suspension import approved_by, args_digest, current_args, current_digest
from handrail.testing import ScriptedModel, call, sequential_ids

wiped: list[str] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    wiped.clear()


ADMINS = DecisionPolicy(roles={"it-admin"}, four_eyes=True, approvals=2)


@tool(name="laptops.wipe", permission="destructive", amendable=["reason"])
def wipe(laptop: str, reason: str = "lost") -> str:
    """Wipe a laptop."""
    wiped.append(laptop)
    return f"wiped {laptop}"


@tool(name="laptops.lock", permission="write", decision_policy=DecisionPolicy(roles={"helpdesk"}))
def lock(laptop: str) -> str:
    """Lock a laptop."""
    return f"locked {laptop}"


@tool(name="laptops.rename", permission="write", amendable=["name"])
def rename(laptop: str, name: str) -> str:
    """Rename a laptop."""
    return f"renamed {laptop} to {name}"


ANA = Decider(user_id="ana", org_id="acme")  # the requester, no role
BO = Decider(user_id="bo", roles=frozenset({"it-admin"}), org_id="acme")
CY = Decider(user_id="cy", roles=frozenset({"it-admin", "helpdesk"}), org_id="acme")
DI = Decider(user_id="di", roles=frozenset({"sales"}), org_id="acme")
EVE = Decider(user_id="eve", roles=frozenset({"it-admin"}), org_id="globex")


def engine_for(call_: Any, store: MemoryStore | None = None, **domain: Any) -> Engine:
    model = ScriptedModel([[call_], "Done."])
    agent = Agent("desk", tools=[wipe, lock, rename])
    policies = domain.pop("policies", {"destructive": ADMINS})
    return Engine(
        Domain(agents=[agent], policies=policies),
        store=store or MemoryStore(),
        runtime=Runtime(model=model, ids=sequential_ids(), clock=lambda: 1_000.0),
    )


async def suspend(engine: Engine) -> None:
    events = [e async for e in engine.submit("s1", "go", org_id="acme", user_id="ana")]
    assert events[-1].type == "run-suspended"


async def card_of(engine: Engine) -> ApprovalCardPart:
    state = await engine.session("s1", org_id="acme", user_id="ana")
    return state.pending["call_1"]


async def test_a_decider_without_the_role_is_refused_naming_the_rule_and_nothing_is_recorded():
    engine = engine_for(call("laptops.wipe", laptop="L-7"))
    await suspend(engine)
    before = await engine.store.load("s1")
    for decider in (DI, ANA):  # someone without the role; the requester, who has none
        with pytest.raises(DecisionNotAllowedError) as refused:
            await engine.resolve("s1", "call_1", Approve(), decider=decider)
        assert refused.value.tool_name == "laptops.wipe"
        assert f"laptops.wipe needs the role it-admin; {decider.user_id} has none" in str(
            refused.value
        )
    after = await engine.store.load("s1")
    assert before is not None and after is not None
    assert after.version == before.version  # nothing was saved
    card = await card_of(engine)
    assert (card.decision, card.approvals) == (None, None)


async def test_four_eyes_refuses_the_requesters_approval_but_lets_them_withdraw():
    policies = {"destructive": DecisionPolicy(roles={"it-admin"}, four_eyes=True)}
    engine = engine_for(call("laptops.wipe", laptop="L-7"), policies=policies)
    await suspend(engine)
    admin_ana = Decider(user_id="ana", roles=frozenset({"it-admin"}), org_id="acme")
    with pytest.raises(DecisionNotAllowedError, match="needs four eyes: ana requested the call"):
        await engine.resolve("s1", "call_1", Approve(), decider=admin_ana)
    resolution = await engine.resolve("s1", "call_1", Reject(reason="found it"), decider=ANA)
    assert resolution.decided == ["call_1"]
    state = await engine.session("s1", org_id="acme", user_id="ana")
    card = next(p for m in state.messages for p in m.parts if isinstance(p, ApprovalCardPart))
    assert (card.decision, card.decided_by) == ("reject", "ana")


async def test_four_eyes_with_two_approvals_says_it_needs_three_people():
    policies = {"destructive": DecisionPolicy(roles={"it-admin"}, four_eyes=True, approvals=2)}
    engine = engine_for(call("laptops.wipe", laptop="L-7"), policies=policies)
    await suspend(engine)
    admins = {
        name: Decider(user_id=name, roles=frozenset({"it-admin"}), org_id="acme")
        for name in ("ana", "bo", "cy")
    }
    with pytest.raises(DecisionNotAllowedError) as own:
        await engine.resolve("s1", "call_1", Approve(), decider=admins["ana"])
    assert str(own.value) == (
        "laptops.wipe needs four eyes: ana requested the call and may not approve it; two "
        "other people must approve it (three people in all, with the requester)."
    )
    assert not (await engine.resolve("s1", "call_1", Approve(), decider=admins["bo"])).ready
    with pytest.raises(DecisionNotAllowedError, match=r"none of them the requester \(three"):
        await engine.resolve("s1", "call_1", Approve(), decider=admins["bo"])
    assert (await engine.resolve("s1", "call_1", Approve(), decider=admins["cy"])).ready
    assert policies["destructive"].describe() == (
        "roles: it-admin; four eyes; 2 approvals, not the requester's (three people)"
    )


async def test_two_approvals_from_two_people_run_the_call_once():
    engine = engine_for(call("laptops.wipe", laptop="L-7"))
    await suspend(engine)
    first = await engine.resolve("s1", "call_1", Approve(by="forged"), decider=BO)
    assert (first.decided, first.pending) == ([], ["call_1"])
    with pytest.raises(DecisionNotAllowedError, match="bo already approved it \\(1 of 2\\)"):
        await engine.resolve("s1", "call_1", Approve(), decider=BO)
    card = await card_of(engine)
    proposal = args_digest("laptops.wipe", {"laptop": "L-7", "reason": "lost"})
    # `by` is the decider's; the approval is of the exact arguments proposed
    assert card.approvals == [CardApproval(by="bo", at=1_000.0, args_digest=proposal)]
    second = await engine.resolve("s1", "call_1", Approve(), decider=CY)
    assert (second.decided, second.pending) == (["call_1"], [])
    assert wiped == []
    events = [e async for e in engine.resume("s1", org_id="acme", user_id="ana")]
    assert events[-1].type == "run-completed"
    assert wiped == ["L-7"]
    state = await engine.session("s1", org_id="acme", user_id="ana")
    card = next(p for m in state.messages for p in m.parts if isinstance(p, ApprovalCardPart))
    assert (card.decision, card.decided_by) == ("approve", "cy")
    assert [a.by for a in card.approvals or []] == ["bo", "cy"]


async def test_a_rejection_by_an_allowed_decider_decides_a_call_that_needs_two_approvals():
    engine = engine_for(call("laptops.wipe", laptop="L-7"))
    await suspend(engine)
    await engine.resolve("s1", "call_1", Approve(), decider=BO)
    resolution = await engine.resolve("s1", "call_1", Reject(reason="no"), decider=CY)
    assert resolution.ready
    [e async for e in engine.resume("s1", org_id="acme", user_id="ana")]
    assert wiped == []


async def test_an_amendment_is_a_new_proposal_that_needs_its_own_approvals():
    engine = engine_for(call("laptops.wipe", laptop="L-7"))
    await suspend(engine)
    await engine.resolve("s1", "call_1", Approve(), decider=BO)  # the proposal: reason lost
    amended = Approve(amended_args={"reason": "stolen"})  # cy amends: a new proposal
    assert not (await engine.resolve("s1", "call_1", amended, decider=CY)).ready
    card = await card_of(engine)
    assert current_args(card) == {"laptop": "L-7", "reason": "stolen"}
    assert approved_by(card) == ["cy"]  # bo approved other arguments: his does not count
    # bo may now approve the new arguments, naming them: then they run
    same = Approve(digest=current_digest(card))
    assert (await engine.resolve("s1", "call_1", same, decider=BO)).ready
    [e async for e in engine.resume("s1", org_id="acme", user_id="ana")]
    assert wiped == ["L-7"]
    state = await engine.session("s1", org_id="acme", user_id="ana")
    card = next(p for m in state.messages for p in m.parts if isinstance(p, ApprovalCardPart))
    assert card.amended_args == {"laptop": "L-7", "reason": "stolen"}
    assert card.args_digest == args_digest("laptops.wipe", card.amended_args)


async def test_an_approval_of_the_proposal_after_an_amendment_is_refused_as_stale():
    engine = engine_for(call("laptops.wipe", laptop="L-7"))
    await suspend(engine)
    proposal = current_digest(await card_of(engine))
    await engine.resolve("s1", "call_1", Approve(amended_args={"reason": "stolen"}), decider=BO)
    before = await engine.store.load("s1")
    for stale in (Approve(), Approve(digest=proposal), Approve(digest="0" * 64)):
        with pytest.raises(ArgumentsChangedError, match="was amended by bo") as refused:
            await engine.resolve("s1", "call_1", stale, decider=CY)
        assert refused.value.current_args == {"laptop": "L-7", "reason": "stolen"}
        assert '"reason" ' not in str(refused.value) and 'reason: "lost" -> "stolen"' in str(
            refused.value
        )
    assert await engine.store.load("s1") == before  # nothing recorded
    # a rejection on what the decider saw is recorded all the same: it runs nothing
    assert (await engine.resolve("s1", "call_1", Reject(digest=proposal), decider=CY)).ready
    [e async for e in engine.resume("s1", org_id="acme", user_id="ana")]
    assert wiped == []


async def test_an_approval_whose_arguments_are_exactly_the_current_ones_counts():
    engine = engine_for(call("laptops.wipe", laptop="L-7"))
    await suspend(engine)
    await engine.resolve("s1", "call_1", Approve(amended_args={"reason": "stolen"}), decider=BO)
    with pytest.raises(ArgumentsChangedError):  # other arguments, on a stale view: refused
        await engine.resolve("s1", "call_1", Approve(amended_args={"reason": "x"}), decider=CY)
    same = Approve(amended_args={"reason": "stolen"})  # the same change names the same args
    assert (await engine.resolve("s1", "call_1", same, decider=CY)).ready
    [e async for e in engine.resume("s1", org_id="acme", user_id="ana")]
    assert wiped == ["L-7"]


async def test_the_amounts_attack_never_runs_what_the_second_approver_did_not_see():
    """Issue 31: bo amends 500 -> 999999; cy, who saw 500, approves: never 999999."""
    store = MemoryStore()
    pay_log: list[float] = []

    @tool(name="pay", permission="destructive", amendable=["amount"])
    def pay(to: str, amount: float) -> str:
        """Pay someone."""
        pay_log.append(amount)
        return "paid"

    engine = Engine(
        Domain(agents=[Agent("desk", tools=[pay])], policies={"destructive": ADMINS}),
        store=store,
        runtime=Runtime(
            model=ScriptedModel([[call("pay", to="x", amount=500)], "Done."]),
            ids=sequential_ids(),
            clock=lambda: 1_000.0,
        ),
    )
    await suspend(engine)
    seen = current_digest(await card_of(engine))  # cy's page, loaded now
    await engine.resolve("s1", "call_1", Approve(amended_args={"amount": 999999}), decider=BO)
    for decision in (Approve(), Approve(digest=seen), Approve(amended_args={"amount": 500})):
        try:
            resolution = await engine.resolve("s1", "call_1", decision, decider=CY)
        except ArgumentsChangedError:
            continue
        assert not resolution.ready  # an approval of 500 is a new proposal, never 999999
    card = await card_of(engine)
    assert pay_log == [] and card.decision is None
    assert (current_args(card)["amount"], approved_by(card)) == (999999, ["bo"])  # all refused


async def test_a_tools_own_policy_wins_over_the_domains_default():
    engine = engine_for(call("laptops.lock", laptop="L-7"), policies={"write": ADMINS})
    await suspend(engine)
    with pytest.raises(DecisionNotAllowedError, match="needs the role helpdesk; bo has none"):
        await engine.resolve("s1", "call_1", Approve(), decider=BO)
    assert (await engine.resolve("s1", "call_1", Approve(), decider=CY)).ready


async def test_without_a_policy_only_the_requester_decides():
    engine = engine_for(call("laptops.rename", laptop="L-7", name="x"))
    await suspend(engine)
    with pytest.raises(DecisionNotAllowedError, match="only ana, who requested the call"):
        await engine.resolve("s1", "call_1", Approve(), decider=CY)
    assert (await engine.resolve("s1", "call_1", Approve(), decider=ANA)).ready


async def test_a_policy_needs_a_decider_and_another_organisation_sees_no_session():
    engine = engine_for(call("laptops.wipe", laptop="L-7"))
    await suspend(engine)
    with pytest.raises(DecisionNotAllowedError, match="pass decider=Decider"):
        await engine.resolve("s1", "call_1", Approve(), org_id="acme", user_id="ana")
    with pytest.raises(SessionNotFoundError):
        await engine.resolve("s1", "call_1", Approve(), decider=EVE)
    with pytest.raises(UserError, match="not both"):
        await engine.resolve("s1", "call_1", Approve(), decider=BO, org_id="acme")


class BarrierStore(MemoryStore):
    """Two loads of s1 return only once both have read it: both decide on the same state."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.loaded = 0
        self.both = asyncio.Event()
        self.conflicts = 0

    async def load(self, session_id: str) -> Any:
        record = await super().load(session_id)
        if self.armed and self.loaded < 2:
            self.loaded += 1
            if self.loaded == 2:
                self.both.set()
            await self.both.wait()
        return record

    async def save(self, record: Any) -> Any:
        try:
            return await super().save(record)
        except ConflictError:
            self.conflicts += 1
            raise


async def test_approvals_racing_from_two_engines_over_one_store_both_count():
    store = BarrierStore()
    engine = engine_for(call("laptops.wipe", laptop="L-7"), store=store)
    other = engine_for(call("laptops.wipe", laptop="L-7"), store=store)  # another process
    await suspend(engine)
    store.armed = True
    first, second = await asyncio.gather(
        engine.resolve("s1", "call_1", Approve(), decider=BO),
        other.resolve("s1", "call_1", Approve(), decider=CY),
    )
    assert store.conflicts == 1  # the later save lost the compare-and-swap, and decided again
    assert sorted([first.ready, second.ready]) == [False, True]  # exactly one completed it
    state = await engine.session("s1", org_id="acme", user_id="ana")
    decided = next(p for m in state.messages for p in m.parts if isinstance(p, ApprovalCardPart))
    assert sorted(a.by or "" for a in decided.approvals or []) == ["bo", "cy"]
    [e async for e in engine.resume("s1", org_id="acme", user_id="ana")]
    assert wiped == ["L-7"]


def test_a_card_stored_before_policies_loads_without_approvals():
    stored = (
        '[{"id":"m1","role":"assistant","parts":[{"type":"approval","tool_call_id":"c1",'
        '"tool_name":"laptops.wipe","args":{"laptop":"L-7"},"decision":"approve"}]}]'
    )
    [message] = MESSAGES.validate_json(stored)
    card = message.parts[0]
    assert isinstance(card, ApprovalCardPart) and card.approvals is None


def test_policies_that_cannot_work_fail_when_they_are_declared():
    with pytest.raises(ToolDefinitionError, match="write roles=\\{'it-admin'\\}"):
        DecisionPolicy(roles="it-admin")  # type: ignore[arg-type]
    with pytest.raises(ToolDefinitionError, match="can never be met"):
        DecisionPolicy(approvals=0)
    with pytest.raises(ToolDefinitionError, match="nobody decides this tool's calls"):
        tool(name="laptops.list", decision_policy=ADMINS)(lambda: [])
    with pytest.raises(UserError, match="keyed by tool permission"):
        Domain(agents=[Agent("desk", tools=[wipe])], policies={"admin": ADMINS})


async def test_each_approval_of_a_two_approval_call_is_audited():
    engine = engine_for(call("laptops.wipe", laptop="L-7"))
    await suspend(engine)
    await engine.resolve("s1", "call_1", Approve(amended_args={"reason": "stolen"}), decider=BO)
    (first,) = await engine.store.audit("acme")  # the card still waits: its first approval
    assert (first.who, first.decision) == ("bo", "approve")
    assert (first.amended_before, first.amended_after) == ({"reason": "lost"}, {"reason": "stolen"})
    await engine.resolve("s1", "call_1", Approve(amended_args={"reason": "stolen"}), decider=CY)
    [e async for e in engine.resume("s1", org_id="acme", user_id="ana")]
    entries = await engine.store.audit("acme")
    stolen = args_digest("laptops.wipe", {"laptop": "L-7", "reason": "stolen"})
    assert [e.args_digest for e in entries[:2]] == [stolen, stolen]  # what each approved
    assert [(e.kind, e.who, e.decision) for e in entries] == [
        ("decision", "bo", "approve"),
        ("decision", "cy", "approve"),
        ("call", "ana", None),
    ]
    assert verify(entries) == []


async def test_the_terminal_card_shows_the_arguments_that_run_and_decides_on_their_digest():
    """`handrail chat` and the demo draw a card as it stands, and name its digest."""
    from rich.console import Console

    from handrail._cards import approval_card, ask_decision

    engine = engine_for(call("laptops.wipe", laptop="L-7"))
    await suspend(engine)
    await engine.resolve("s1", "call_1", Approve(amended_args={"reason": "stolen"}), decider=BO)
    card = await card_of(engine)
    console = Console(width=100, record=True)
    console.print(approval_card(card))
    drawn = console.export_text()
    assert "stolen" in drawn and "lost" in drawn  # the value that runs, and what it was
    assert 'changed from the agent\'s proposal: reason "lost" → "stolen"' in drawn
    assert "approved with these arguments by: bo" in drawn
    decision = ask_decision(card, lambda _: "y", by="cy")
    assert decision == Approve(by="cy", digest=current_digest(card))
    assert (await engine.resolve("s1", "call_1", decision, decider=CY)).ready
