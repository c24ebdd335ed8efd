"""The dispatch pipeline, step by step, through the public API."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from pydantic import BaseModel

from handrail import (
    Agent,
    ApprovalCardPart,
    ModelRetry,
    PathError,
    RunState,
    Runtime,
    ToolCallPart,
    ToolContext,
    ToolResult,
    tool,
)
from handrail.testing import ScriptedModel, call, call_raw, sequential_ids


def stored(data: Any) -> ToolResult:
    """A plain result as the history keeps it: with the summary line derived from it."""
    result = ToolResult(data=data)
    result.summary = result.display_summary()
    return result


async def run(agent: Agent[Any], steps: list[Any], **runtime: Any) -> tuple[list[Any], RunState]:
    """Run one turn with a scripted model; return the events and the state."""
    model = ScriptedModel(steps)
    state = runtime.pop("state", None) or RunState()
    rt = Runtime(model=model, ids=sequential_ids(), **runtime)
    agent_run = agent.run_stream("go", state=state, runtime=rt)
    events = [e async for e in agent_run]
    model.assert_complete()
    return events, state


def calls(state: RunState) -> list[ToolCallPart]:
    return [p for m in state.messages for p in m.tool_calls]


def by_id(state: RunState, call_id: str) -> ToolCallPart:
    return next(p for p in calls(state) if p.id == call_id)


@tool(name="math.add")
def add(a: int, b: int = 0) -> int:
    """Add two numbers."""
    return a + b


@tool(name="text.echo")
async def echo(text: str) -> str:
    """Echo."""
    return text


# -- 1. parse ------------------------------------------------------------------------------


async def test_malformed_arguments_become_a_tool_error_and_the_other_calls_still_run():
    agent = Agent("a", tools=[add, echo])
    _, state = await run(
        agent, [[call_raw("math.add", "a=1, b=2"), call("text.echo", text="hi")], "done"]
    )
    bad, good = calls(state)
    assert bad.status == "failed"
    assert bad.raw_args == "a=1, b=2"  # nothing the model said is lost
    assert bad.result is not None and "not valid JSON" in (bad.result.error or "")
    assert good.status == "completed" and good.result == stored("hi")


@pytest.mark.parametrize(("raw", "kind"), [("[1, 2]", "array"), ('"x"', "string"), ("3", "number")])
async def test_non_object_arguments_are_rejected_naming_what_was_sent(raw: str, kind: str):
    _, state = await run(Agent("a", tools=[add]), [[call_raw("math.add", raw)], "done"])
    error = calls(state)[0].result.error  # type: ignore[union-attr]
    assert error == (
        "Tool 'math.add': the arguments must be a JSON object of named arguments, "
        f"not a JSON {kind}"
    )


async def test_empty_arguments_mean_no_arguments():
    @tool
    def ping() -> str:
        """Ping."""
        return "pong"

    _, state = await run(Agent("a", tools=[ping]), [[call_raw("ping", "")], "done"])
    assert calls(state)[0].result == stored("pong")


# -- 2. domain transform, 3. bind ----------------------------------------------------------


async def test_domain_transform_rewrites_arguments_before_validation():
    def transform(t: Any, args: dict[str, Any]) -> dict[str, Any]:
        return {**args, "b": 100} if t.name == "math.add" else args

    _, state = await run(
        Agent("a", tools=[add]), [[call("math.add", a=1)], "done"], transform_args=transform
    )
    assert calls(state)[0].result == stored(101)


async def test_bound_arguments_come_from_the_session_and_the_model_cannot_widen_them():
    seen: list[str] = []

    @tool(name="orders.list", bindings={"user_id": "sys:user_id"})
    def list_orders(user_id: str, status: str = "open") -> list[str]:
        """List the caller's orders."""
        seen.append(user_id)
        return [f"{user_id}-1"]

    assert "user_id" not in list_orders.definition.parameters["properties"]
    state = RunState(user_id="u-alice")
    _, state = await run(
        Agent("a", tools=[list_orders]),
        [[call("orders.list", user_id="u-mallory", status="open")], "done"],
        state=state,
    )
    assert seen == ["u-alice"]
    assert calls(state)[0].args == {"status": "open"}  # bound values stay out of history


async def test_an_unresolvable_binding_is_a_tool_error():
    @tool(bindings={"cart": "var:cart.id"})
    def checkout(cart: str) -> str:
        """Check out."""
        return cart

    _, state = await run(Agent("a", tools=[checkout]), [[call("checkout")], "done"])
    error = calls(state)[0].result.error  # type: ignore[union-attr]
    assert error is not None and error.startswith("Tool 'checkout' could not bind its arguments:")


# -- 4. normalize and validate -------------------------------------------------------------


class Address(BaseModel):
    city: str


@tool
def ship(
    qty: int, tags: list[str], address: Address, carrier: str = "ups", note: str = "-"
) -> dict[str, Any]:
    """Ship."""
    return {"qty": qty, "tags": tags, "city": address.city, "carrier": carrier, "note": note}


async def test_near_miss_arguments_are_repaired():
    _, state = await run(
        Agent("a", tools=[ship]),
        [
            [
                call(
                    "ship",
                    qty="3",
                    tags="fragile",
                    address='{"city": "Oslo"}',
                    carrier=" dhl ",
                    note=None,
                )
            ],
            "done",
        ],
    )
    part = calls(state)[0]
    assert part.result == stored(
        {"qty": 3, "tags": ["fragile"], "city": "Oslo", "carrier": " dhl ", "note": "-"}
    )
    assert part.args == {
        "qty": 3,
        "tags": ["fragile"],
        "address": {"city": "Oslo"},
        "carrier": " dhl ",
        "note": "-",
    }


async def test_unrepairable_arguments_list_every_bad_field():
    _, state = await run(
        Agent("a", tools=[ship]),
        [[call("ship", qty="many", address={"town": "x"}, colour="red")], "done"],
    )
    assert calls(state)[0].result.error == (  # type: ignore[union-attr]
        "Tool 'ship': invalid arguments:\n"
        "- qty: Input should be a valid integer, unable to parse string as an integer "
        '(got "many")\n'
        "- tags: Field required\n"
        "- address.city: Field required\n"
        "- colour: not an argument of this tool"
    )


async def test_the_tools_own_normalize_runs_before_validation():
    @tool(normalize=lambda args: {"text": str(args.get("message", args.get("text", "")))})
    def say(text: str) -> str:
        """Say."""
        return text

    _, state = await run(Agent("a", tools=[say]), [[call("say", message="hi")], "done"])
    assert calls(state)[0].result == stored("hi")


async def test_a_failing_normalize_is_a_tool_error_not_a_crash():
    def broken(args: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("x")

    @tool(normalize=broken)
    def say(text: str) -> str:
        """Say."""
        return text

    _, state = await run(Agent("a", tools=[say]), [[call("say", text="hi")], "done"])
    assert calls(state)[0].result.error == "Tool 'say': KeyError: 'x'"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "text",
    [
        "    return x\n",
        "  indented:\n    - yaml\n",
        "Dear Ana,\n\n  thanks.\n\n",
        "\t tab and trailing  ",
        "",
    ],
)
async def test_a_valid_string_argument_reaches_the_tool_byte_exact(text: str):
    received: list[str] = []

    @tool
    def save(body: str, note: str = "") -> str:
        """Save a text."""
        received.append(body)
        return "saved"

    _, state = await run(Agent("a", tools=[save]), [[call("save", body=text)], "done"])
    assert received == [text]
    assert calls(state)[0].args == {"body": text, "note": ""}


async def test_the_model_is_shown_its_own_call_as_it_made_it():
    model = ScriptedModel([[call_raw("math.add", '{"a":"3" }')], "4"])
    await Agent("a", tools=[add]).run("go", runtime=Runtime(model=model))
    (part,) = [p for m in model.calls[1].messages for p in m.tool_calls]
    # Repaired ("3" -> 3) and completed (b=0) for the tool; the model reads what it sent.
    assert part.args == {"a": 3, "b": 0}
    assert part.raw_args == '{"a":"3" }'
    from handrail.models._openai_format import openai_messages, request_tool_names

    names = request_tool_names([], model.calls[1].messages)
    sent = openai_messages(None, model.calls[1].messages, names)
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == '{"a":"3" }'


# -- 5. allow-list and permission ----------------------------------------------------------


async def test_unknown_tool_error_lists_close_names_and_available_tools():
    _, state = await run(Agent("a", tools=[add, echo]), [[call("math.ad", a=1)], "done"])
    assert calls(state)[0].result.error == (  # type: ignore[union-attr]
        "Unknown tool 'math.ad'. Did you mean 'math.add'? Available tools: math.add, text.echo."
    )


async def test_permission_policy_refuses_tools_above_it():
    @tool(permission="draft")
    def draft_reply(text: str) -> str:
        """Draft."""
        return text

    _, state = await run(
        Agent("a", tools=[draft_reply]),
        [[call("draft_reply", text="x")], "done"],
        allowed_permissions=frozenset({"read"}),
    )
    assert calls(state)[0].result.error == (  # type: ignore[union-attr]
        "Tool 'draft_reply' needs permission 'draft', which this run does not allow "
        "(allowed: read)."
    )


# -- 6. dedup and cache --------------------------------------------------------------------


async def test_identical_call_later_in_the_turn_reuses_the_result_and_is_marked():
    runs: list[int] = []

    @tool
    def count(n: int) -> int:
        """Count."""
        runs.append(n)
        return n

    events, state = await run(
        Agent("a", tools=[count]),
        [[call("count", n=1)], [call("count", n=1), call("count", n=2)], "done"],
    )
    assert runs == [1, 2]
    assert by_id(state, "call_2").reused_from == "call_1"
    assert by_id(state, "call_2").result == stored(1)
    completed = [e for e in events if e.type == "tool-call-completed"]
    assert [e.reused_from for e in completed] == [None, "call_1", None]


async def test_when_every_call_keeps_repeating_the_model_is_asked_for_its_answer():
    # (tests/test_reuse.py has the rest: a repeat alone never stops the model acting)
    model = ScriptedModel([[call("math.add", a=1)]] * 4 + ["done"])
    agent = Agent("a", tools=[add])
    await agent.run("go", runtime=Runtime(model=model))
    assert [r.tool_choice for r in model.calls] == ["auto", "auto", "auto", "auto", "none"]


async def test_identical_calls_in_one_response_run_once():
    runs: list[int] = []

    @tool
    async def count(n: int) -> int:
        """Count."""
        runs.append(n)
        return n

    _, state = await run(
        Agent("a", tools=[count]), [[call("count", n=1), call("count", n=1)], "done"]
    )
    assert runs == [1]
    first, second = calls(state)
    assert (second.reused_from, second.result) == ("call_1", first.result)


async def test_a_failed_call_is_not_reused():
    attempts: list[int] = []

    @tool
    def flaky(n: int) -> int:
        """Flaky."""
        attempts.append(n)
        if len(attempts) == 1:
            raise RuntimeError("try again")
        return n

    _, state = await run(
        Agent("a", tools=[flaky]), [[call("flaky", n=1)], [call("flaky", n=1)], "done"]
    )
    assert attempts == [1, 1]
    assert by_id(state, "call_2").result == stored(1)


class Reservations:
    """A tiny booking system: what the model reads changes when it writes."""

    def __init__(self) -> None:
        self.status = {"R1": "active"}
        self.seats = 0
        self.log: list[str] = []


def reservation_tools(db: Reservations) -> list[Any]:
    @tool(name="reservations.get")
    def get(ref: str) -> str:
        """Read a reservation."""
        db.log.append(f"get {ref}")
        return db.status[ref]

    @tool(name="reservations.cancel", permission="write", approval="auto")
    def cancel(ref: str) -> str:
        """Cancel a reservation (frees its seat)."""
        db.log.append(f"cancel {ref}")
        db.status[ref] = "cancelled"
        db.seats += 1
        return "cancelled"

    @tool(name="reservations.book", permission="write", approval="auto")
    def book(name: str) -> str:
        """Book a seat."""
        db.log.append(f"book {name}")
        if not db.seats:
            return "not enough seats"  # in band: the call itself succeeded
        db.seats -= 1
        return "booked"

    return [get, cancel, book]


async def test_a_side_effect_ends_the_reuse_of_earlier_reads():
    db = Reservations()
    _, state = await run(
        Agent("a", tools=reservation_tools(db)),
        [
            [call("reservations.get", ref="R1")],
            [call("reservations.cancel", ref="R1")],
            [call("reservations.get", ref="R1")],
            "done",
        ],
    )
    # The second read runs: the cancel may have changed what the first one said.
    assert db.log == ["get R1", "cancel R1", "get R1"]
    third = calls(state)[2]
    assert (third.reused_from, third.result) == (None, stored("cancelled"))


async def test_a_side_effect_in_the_same_response_ends_the_reuse_too():
    db = Reservations()
    _, state = await run(
        Agent("a", tools=reservation_tools(db)),
        [
            [call("reservations.get", ref="R1")],
            [call("reservations.cancel", ref="R1"), call("reservations.get", ref="R1")],
            "done",
        ],
    )
    assert db.log.count("get R1") == 2
    assert calls(state)[2].reused_from is None


async def test_a_write_that_failed_in_band_is_tried_again_when_the_model_retries_it():
    db = Reservations()
    _, state = await run(
        Agent("a", tools=reservation_tools(db)),
        [
            [call("reservations.book", name="ana")],  # no seat: fails, in band
            [call("reservations.cancel", ref="R1")],  # frees one
            [call("reservations.book", name="ana")],  # the same call again: it must run
            "done",
        ],
    )
    assert db.log == ["book ana", "cancel R1", "book ana"]
    first, _, again = calls(state)
    assert first.result == stored("not enough seats")
    assert (again.status, again.reused_from, again.result) == (
        "completed",
        None,
        stored("booked"),
    )


async def test_identical_writes_are_never_folded_into_one():
    db = Reservations()
    db.seats = 2
    _, state = await run(
        Agent("a", tools=reservation_tools(db)),
        [[call("reservations.book", name="ana")], [call("reservations.book", name="ana")], "done"],
    )
    assert db.log == ["book ana", "book ana"]
    assert [p.reused_from for p in calls(state)] == [None, None]


async def test_a_failed_read_in_the_same_response_is_not_reused_by_its_twin():
    attempts: list[int] = []

    @tool
    async def flaky(n: int) -> int:
        """Flaky."""
        attempts.append(n)
        if len(attempts) == 1:
            raise RuntimeError("try again")
        return n

    events, state = await run(
        Agent("a", tools=[flaky]), [[call("flaky", n=1), call("flaky", n=1)], "done"]
    )
    assert attempts == [1, 1]
    first, second = calls(state)
    assert (first.status, second.status, second.reused_from) == ("failed", "completed", None)
    assert [e.type for e in events].count("tool-call-started") == 2


@pytest.mark.parametrize("where", ["tool", "runtime"])
async def test_reuse_can_be_turned_off_by_the_tool_or_the_runtime(where: str):
    readings: list[int] = []

    @tool(dedup=where != "tool")
    def sensor(name: str) -> int:
        """Read a sensor (its value changes by itself)."""
        readings.append(len(readings))
        return len(readings)

    model = ScriptedModel([[call("sensor", name="t")], [call("sensor", name="t")], "done"])
    runtime = Runtime(model=model, dedup=where != "runtime")
    result = await Agent("a", tools=[sensor]).run("go", runtime=runtime)
    assert readings == [0, 1]
    assert [p.reused_from for p in calls(result.state)] == [None, None]
    assert [r.tool_choice for r in model.calls] == ["auto", "auto", "auto"]


async def test_tool_calls_made_when_asked_for_none_are_not_run():
    runs: list[int] = []

    @tool(name="math.add")
    def counted(a: int, b: int = 0) -> int:
        """Add."""
        runs.append(a)
        return a + b

    model = ScriptedModel(
        [
            [call("math.add", a=1)],
            [call("math.add", a=1)],  # a repeat: reused, and the model is asked to answer
            [call("math.add", a=2)],  # it calls a tool anyway: not run
            "3, I think.",
        ]
    )
    runtime = Runtime(model=model, max_reused_responses=1)
    run_ = Agent("a", tools=[counted]).run_stream("go", runtime=runtime)
    events = [e async for e in run_]
    assert runs == [1]
    assert [r.tool_choice for r in model.calls] == ["auto", "auto", "none", "none"]
    refused = calls(run_.result.state)[2]
    assert refused.status == "failed"
    assert "Not run: this request asked for an answer without tool calls" in (
        refused.result.error or ""  # type: ignore[union-attr]
    )
    completed = [e for e in events if e.type == "tool-call-completed"]
    assert completed[-1].tool_call_id == refused.id and not completed[-1].ok
    started = [e.tool_call_id for e in events if e.type == "tool-call-started"]
    assert refused.id not in started
    assert run_.result.output == "3, I think."


async def test_idempotent_results_are_cached_across_turns_until_they_expire():
    now = [1000.0]
    runs: list[str] = []

    @tool(idempotent=True, cache_ttl=60)
    def rate(currency: str) -> float:
        """Exchange rate."""
        runs.append(currency)
        return 1.1

    agent = Agent("a", tools=[rate])
    state = RunState()
    steps = [[call("rate", currency="EUR")], "ok"] * 3
    model = ScriptedModel(steps)
    rt = Runtime(model=model, clock=lambda: now[0])
    await agent.run("1", state=state, runtime=rt)
    now[0] += 30
    await agent.run("2", state=state, runtime=rt)
    now[0] += 31
    await agent.run("3", state=state, runtime=rt)
    assert runs == ["EUR", "EUR"]
    assert [p.cached for p in calls(state)] == [False, True, False]


# -- 7. execute ----------------------------------------------------------------------------


async def test_sync_tools_run_in_a_worker_thread_and_async_ones_on_the_loop():
    threads: dict[str, str] = {}

    @tool
    def blocking() -> str:
        """Sync."""
        threads["sync"] = threading.current_thread().name
        return "s"

    @tool
    async def nonblocking() -> str:
        """Async."""
        threads["async"] = threading.current_thread().name
        return "a"

    await run(
        Agent("a", tools=[blocking, nonblocking]), [[call("blocking"), call("nonblocking")], "ok"]
    )
    assert threads["async"] == threading.current_thread().name
    assert threads["sync"] != threads["async"]


async def test_streaming_tools_report_progress_and_their_last_value_is_the_output():
    @tool
    async def export(rows: int):  # type: ignore[no-untyped-def]
        """Export rows."""
        for done in range(1, rows + 1):
            yield {"done": done, "of": rows}
        yield ToolResult(data={"exported": rows}, summary=f"{rows} rows")

    events, state = await run(Agent("a", tools=[export]), [[call("export", rows=2)], "ok"])
    progress = [e.progress for e in events if e.type == "tool-progress"]
    assert progress == [{"done": 1, "of": 2}, {"done": 2, "of": 2}]
    assert calls(state)[0].result == ToolResult(data={"exported": 2}, summary="2 rows")


async def test_a_tool_exception_becomes_an_error_result_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
):
    @tool
    def explode() -> None:
        """Boom."""
        raise ValueError("the warehouse API is down")

    with caplog.at_level(logging.ERROR, logger="handrail"):
        events, state = await run(
            Agent("a", tools=[explode]),
            [[call("explode")], "sorry"],
            state=RunState(session_id="s1"),
        )
    error = calls(state)[0].result.error or ""  # type: ignore[union-attr]
    assert error.startswith("ValueError: the warehouse API is down (reference ")
    reference = error.removesuffix(")").rsplit(" ", 1)[1]
    assert events[-1].type == "run-completed"
    # Logged once, with its traceback, the session, the call and the same reference.
    (record,) = caplog.records
    assert (record.name, record.levelname) == ("handrail.tools", "ERROR")
    assert record.getMessage() == (
        f"Tool 'explode' raised (reference {reference}, session 's1', call call_1): "
        f"ValueError: the warehouse API is down"
    )
    assert (record.reference, record.session_id, record.call_id, record.tool) == (  # type: ignore[attr-defined]
        reference,
        "s1",
        "call_1",
        "explode",
    )
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert 'in explode\n    raise ValueError("the warehouse API is down")' in caplog.text


async def test_model_retry_sends_its_message_back_as_is():
    @tool
    def lookup(order_id: str) -> str:
        """Lookup."""
        raise ModelRetry(f"No order {order_id}; order ids look like A1042.")

    _, state = await run(Agent("a", tools=[lookup]), [[call("lookup", order_id="x")], "ok"])
    assert calls(state)[0].result.error == "No order x; order ids look like A1042."  # type: ignore[union-attr]


async def test_a_timeout_fails_only_its_own_call():
    @tool(timeout=0.01)
    async def slow() -> str:
        """Slow."""
        await asyncio.sleep(10)
        return "never"

    _, state = await run(
        Agent("a", tools=[slow, echo]), [[call("slow"), call("text.echo", text="x")], "ok"]
    )
    slow_part, echo_part = calls(state)
    assert slow_part.status == "failed"
    assert (slow_part.result.error or "").startswith("Tool 'slow' timed out after 0.01 s")  # type: ignore[union-attr]
    assert echo_part.status == "completed"


async def test_output_is_validated_against_the_output_type():
    class Out(BaseModel):
        total: int

    @tool(output_type=Out)
    def total() -> dict[str, Any]:
        """Total."""
        return {"total": "many"}

    _, state = await run(Agent("a", tools=[total]), [[call("total")], "ok"])
    error = calls(state)[0].result.error  # type: ignore[union-attr]
    assert error is not None and error.startswith(
        "Tool 'total' returned output that does not match its output type"
    )


# -- parallelism ---------------------------------------------------------------------------


async def test_independent_calls_run_in_parallel():
    both_started = asyncio.Event()
    started: list[str] = []

    @tool
    async def meet(name: str) -> str:
        """Waits until both calls have started: only possible when they run together."""
        started.append(name)
        if len(started) == 2:
            both_started.set()
        await asyncio.wait_for(both_started.wait(), 1)
        return name

    _, state = await run(
        Agent("a", tools=[meet]), [[call("meet", name="x"), call("meet", name="y")], "ok"]
    )
    assert [p.result.data for p in calls(state)] == ["x", "y"]  # type: ignore[union-attr]


async def test_sequential_tools_run_alone_in_the_models_order():
    log: list[str] = []

    @tool
    async def work(name: str) -> str:
        """Parallel work."""
        log.append(f"start {name}")
        await asyncio.sleep(0.001)
        log.append(f"end {name}")
        return name

    @tool(sequential=True)
    async def migrate(name: str) -> str:
        """Must run alone."""
        log.append(f"start {name}")
        await asyncio.sleep(0.001)
        log.append(f"end {name}")
        return name

    _, state = await run(
        Agent("a", tools=[work, migrate]),
        [
            [
                call("work", name="a"),
                call("work", name="b"),
                call("migrate", name="M"),
                call("work", name="c"),
            ],
            "ok",
        ],
    )
    m = log.index("start M")
    assert log[m + 1] == "end M"
    assert set(log[:m]) == {"start a", "start b", "end a", "end b"}
    assert log[m + 2 :] == ["start c", "end c"]
    assert [p.result.data for p in calls(state)] == ["a", "b", "M", "c"]  # type: ignore[union-attr]


# -- 8 to 11: digest, capture, hooks, stamp ------------------------------------------------


async def test_digest_capture_hooks_and_stamp():
    observed: list[tuple[str, Any]] = []

    @tool(name="orders.lookup", digest=lambda order: {"status": order["status"]})
    def lookup(order_id: str) -> dict[str, Any]:
        """Lookup."""
        return {"id": order_id, "status": "shipped", "items": [{"sku": "S1"}]}

    @tool
    def first_sku(ctx: ToolContext[None]) -> str:
        """Read what the lookup captured."""
        return str(ctx.context.get("tool:orders.lookup.items[0].sku"))

    async def on_result(part: ToolCallPart, result: ToolResult) -> None:
        observed.append((part.name, result.data))

    def redact(part: ToolCallPart, result: ToolResult) -> ToolResult:
        if part.name == "first_sku":
            return ToolResult(data="<redacted>", summary=result.summary)
        return result

    events, state = await run(
        Agent("a", tools=[lookup, first_sku]),
        [[call("orders.lookup", order_id="A1")], [call("first_sku")], "ok"],
        on_tool_result=on_result,
        transform_tool_result=redact,
        clock=lambda: 100.0,
    )
    looked, sku = calls(state)
    assert looked.digest == {"status": "shipped"}
    assert sku.result is not None  # `first_sku` read the capture of `orders.lookup` ...
    with pytest.raises(PathError):  # ... which was turn-scoped: dropped when the turn ended
        state.context.get("call:call_1.id")
    assert observed == [
        ("orders.lookup", {"id": "A1", "status": "shipped", "items": [{"sku": "S1"}]}),
        ("first_sku", "S1"),
    ]
    assert sku.result == stored("<redacted>")
    assert (looked.status, looked.started_at) == ("completed", 100.0)
    assert looked.duration_ms is not None and looked.duration_ms >= 0
    completed = next(e for e in events if e.type == "tool-call-completed")
    assert completed.digest == {"status": "shipped"}


async def test_a_failing_result_hook_is_a_tool_error():
    def broken(part: ToolCallPart, result: ToolResult) -> ToolResult:
        raise RuntimeError("hook bug")

    _, state = await run(
        Agent("a", tools=[echo]),
        [[call("text.echo", text="x")], "ok"],
        transform_tool_result=broken,
    )
    error = calls(state)[0].result.error or ""  # type: ignore[union-attr]
    assert error.startswith("a result hook failed: RuntimeError: hook bug (reference ")


async def test_a_summary_function_writes_the_ui_line_and_its_failure_is_contained():
    @tool(summary=lambda order: f"Order {order['id']}: {order['status']}")
    def lookup(order_id: str) -> dict[str, str]:
        """Lookup."""
        return {"id": order_id, "status": "shipped"}

    @tool(summary=lambda out: out["missing"])
    def other() -> dict[str, str]:
        """Other."""
        return {}

    events, state = await run(
        Agent("a", tools=[lookup, other]), [[call("lookup", order_id="A1"), call("other")], "ok"]
    )
    first, second = calls(state)
    assert first.result.summary == "Order A1: shipped"  # type: ignore[union-attr]
    assert second.result.summary == "(summary failed: KeyError: 'missing')"  # type: ignore[union-attr]
    assert second.status == "completed"
    summaries = {e.tool_call_id: e.summary for e in events if e.type == "tool-call-completed"}
    assert summaries == {
        "call_1": "Order A1: shipped",
        "call_2": "(summary failed: KeyError: 'missing')",
    }


async def test_a_failing_digest_does_not_fail_the_call():
    @tool(digest=lambda out: out["missing"])
    def thing() -> dict[str, int]:
        """Thing."""
        return {"a": 1}

    _, state = await run(Agent("a", tools=[thing]), [[call("thing")], "ok"])
    part = calls(state)[0]
    assert part.status == "completed"
    assert part.digest == {"error": "digest failed: KeyError: 'missing'"}


# -- waiting calls -------------------------------------------------------------------------


class Answer(BaseModel):
    choice: str


async def test_gated_human_and_client_calls_wait_while_the_others_run():
    refunds: list[str] = []

    @tool(name="orders.refund", permission="write", amendable=["amount"], prompt="Refund?")
    def refund(order_id: str, amount: float) -> str:
        """Refund."""
        refunds.append(order_id)
        return "r1"

    @tool(executor="human", prompt="Which size?")
    def ask(question: str) -> Answer:
        """Ask the customer."""
        raise AssertionError("never called")

    @tool(executor="client")
    def open_tab(url: str) -> None:
        """Open a browser tab."""

    events, state = await run(
        Agent("a", tools=[refund, ask, open_tab, echo]),
        [
            [
                call("orders.refund", order_id="A1", amount=5),
                call("ask", question="S or M?"),
                call("open_tab", url="https://x"),
                call("text.echo", text="ran"),
            ]
        ],
        state=RunState(client_connected=True),
    )
    types = [e.type for e in events]
    assert types[-1] == "run-suspended"
    assert events[-1].pending == ["call_1", "call_2", "call_3"]
    approval = next(e for e in events if e.type == "approval-required")
    assert (approval.args, approval.amendable, approval.prompt) == (
        {"order_id": "A1", "amount": 5.0},
        ["amount"],
        "Refund?",
    )
    asked = next(e for e in events if e.type == "input-required")
    assert asked.output_schema is not None and asked.output_schema["properties"]["choice"]
    assert any(e.type == "client-exec-required" for e in events)
    assert refunds == []
    statuses = [p.status for p in calls(state)]
    assert statuses == ["waiting", "waiting", "waiting", "completed"]
    cards = [p for p in state.messages[-1].parts if isinstance(p, ApprovalCardPart)]
    assert [(c.tool_call_id, c.kind, c.amendable) for c in cards] == [
        ("call_1", "approval", ["amount"]),
        ("call_2", "elicitation", []),
        ("call_3", "client_exec", []),
    ]


async def test_sys_values_come_from_the_session_scope_and_the_runtime_clock():
    @tool(bindings={"org": "sys:org_id", "now": "sys:now"})
    def whoami(org: str, now: str, extra: str = "") -> str:
        """Who and when."""
        return f"{org} at {now}"

    state = RunState(org_id="acme", user_id="u1")
    _, state = await run(
        Agent("a", tools=[whoami]), [[call("whoami")], "ok"], state=state, clock=lambda: 0.0
    )
    assert calls(state)[0].result == stored("acme at 1970-01-01T00:00:00+00:00")


async def test_a_tool_raising_its_own_timeout_error_is_reported_as_such():
    @tool
    async def fetch() -> str:
        """Fetch."""
        raise TimeoutError("upstream took too long")

    _, state = await run(Agent("a", tools=[fetch]), [[call("fetch")], "ok"])
    assert calls(state)[0].result.error == "TimeoutError: upstream took too long"  # type: ignore[union-attr]


async def test_arguments_named_like_pydantic_internals_reach_the_function():
    @tool
    def export(schema: str, copy: bool = False, model_config: int = 1) -> str:
        """Export."""
        return f"{schema}/{copy}/{model_config}"

    _, state = await run(
        Agent("a", tools=[export]), [[call("export", schema="s", copy=True)], "ok"]
    )
    part = calls(state)[0]
    assert part.result == stored("s/True/1")
    assert part.args == {"schema": "s", "copy": True, "model_config": 1}


async def test_a_partial_is_a_tool_whose_fixed_arguments_the_model_cannot_set():
    import functools

    async def find(customer: str, limit: int) -> list[str]:
        """Find a customer's orders."""
        return [customer] * limit

    find_three = tool(functools.partial(find, limit=3), name="orders.find")
    assert list(find_three.definition.parameters["properties"]) == ["customer"]
    assert find_three.description == "Find a customer's orders."
    _, state = await run(
        Agent("a", tools=[find_three]), [[call("orders.find", customer="c", limit=99)], "ok"]
    )
    assert calls(state)[0].result.error == (  # type: ignore[union-attr]
        "Tool 'orders.find': invalid arguments:\n- limit: not an argument of this tool"
    )


async def test_arguments_given_as_an_object_skip_parsing():
    from handrail.models import ModelRequest, ModelResponse
    from handrail.testing import FunctionModel

    def answer(request: ModelRequest) -> Any:
        if len(request.messages) == 1:
            return ModelResponse(parts=[ToolCallPart(id="c1", name="math.add", args={"a": 2})])
        return "ok"

    result = await Agent("a", tools=[add]).run("go", runtime=Runtime(model=FunctionModel(answer)))
    assert calls(result.state)[0].result == stored(2)


async def test_a_provider_tool_called_as_a_function_is_not_run_nor_stamped_as_run():
    from handrail import web_search

    _, state = await run(Agent("a", tools=[web_search()]), [[call("web_search", query="x")], "ok"])
    part = calls(state)[0]
    assert (part.status, part.executor) == ("failed", "provider")
    assert part.result == ToolResult.failure(
        "Tool 'web_search' is run by the model provider, not called as a function: this call "
        "did not run. Use the tool the provider offers under that name.",
        code="not_available",
    )


async def test_identical_side_effecting_calls_in_one_response_are_each_asked_for():
    @tool(permission="write")
    def send(to: str) -> str:
        """Send."""
        return to

    events, state = await run(
        Agent("a", tools=[send]), [[call("send", to="x"), call("send", to="x")]]
    )
    # Two sends are two sends: a write is never folded into another, each needs its decision.
    asked = [e.tool_call_id for e in events if e.type == "approval-required"]
    assert asked == ["call_1", "call_2"]
    assert [p.status for p in calls(state)] == ["waiting", "waiting"]
    assert not [e for e in events if e.type == "tool-call-started"]


async def test_a_sequential_call_first_then_parallel_ones():
    log: list[str] = []

    @tool(sequential=True)
    async def first() -> str:
        """First."""
        log.append("first")
        return "1"

    @tool
    async def later(n: int) -> int:
        """Later."""
        log.append(f"later {n}")
        return n

    await run(
        Agent("a", tools=[first, later]),
        [[call("first"), call("later", n=1), call("later", n=2)], "ok"],
    )
    assert log[0] == "first"
    assert sorted(log[1:]) == ["later 1", "later 2"]


async def test_a_sync_result_observer_and_model_progress_are_supported():
    seen: list[str] = []

    class Step(BaseModel):
        done: int

    @tool
    async def job():  # type: ignore[no-untyped-def]
        """Job."""
        yield Step(done=1)
        yield "finished"

    events, _ = await run(
        Agent("a", tools=[job]),
        [[call("job")], "ok"],
        on_tool_result=lambda part, result: seen.append(part.name),
    )
    assert seen == ["job"]
    assert [e.progress for e in events if e.type == "tool-progress"] == [{"done": 1}, "finished"]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"qty": 1, "tags": "not json [", "address": {"city": "x"}}, None),
        (
            {"qty": None, "tags": ["a"], "address": {"city": "x"}},
            "- qty: Input should be a valid integer (got null)",
        ),
        (
            {"qty": 1, "tags": ["a"], "address": "Oslo"},
            '- address: Input should be a valid dictionary or instance of Address (got "Oslo")',
        ),
        (
            {"qty": True, "tags": ["a"], "address": {"city": 3}},
            "- address.city: Input should be a valid string (got 3)",
        ),
    ],
)
async def test_repair_edge_cases(args: dict[str, Any], error: str | None):
    _, state = await run(Agent("a", tools=[ship]), [[call("ship", args)], "ok"])
    result = calls(state)[0].result
    assert result is not None
    if error is None:
        assert result.ok and result.data["tags"] == ["not json ["]
    else:
        assert error in (result.error or "")


async def test_a_repair_that_still_fails_reports_the_remaining_problems():
    _, state = await run(
        Agent("a", tools=[ship]), [[call("ship", qty="x", tags="t", address={"city": "c"})], "ok"]
    )
    assert calls(state)[0].result.error == (  # type: ignore[union-attr]
        "Tool 'ship': invalid arguments:\n"
        '- qty: Input should be a valid integer, unable to parse string as an integer (got "x")'
    )


@pytest.mark.parametrize(("raw", "kind"), [("null", "null"), ("true", "boolean")])
async def test_null_and_boolean_arguments_are_named(raw: str, kind: str):
    _, state = await run(Agent("a", tools=[add]), [[call_raw("math.add", raw)], "done"])
    assert (calls(state)[0].result.error or "").endswith(f"not a JSON {kind}")  # type: ignore[union-attr]


async def test_warnings_a_normalize_returns_reach_the_model_with_the_result():
    def upper(args: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        fixed = str(args["order_id"]).upper()
        return {**args, "order_id": fixed}, [f"order_id {args['order_id']!r} read as {fixed!r}"]

    @tool(normalize=upper)
    def status(order_id: str) -> str:
        """An order's status."""
        return f"{order_id}: shipped"

    _, state = await run(Agent("a", tools=[status]), [[call("status", order_id="a1")], "ok"])
    (part,) = calls(state)
    assert part.args == {"order_id": "A1"}
    assert part.result is not None and part.result.warnings == ["order_id 'a1' read as 'A1'"]
    assert part.result.model_text() == ("A1: shipped\n\nWarnings:\n- order_id 'a1' read as 'A1'")
    assert RunState.load(state.dump()).messages[-2].tool_calls[0].result == part.result
