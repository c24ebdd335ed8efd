"""`python -m bench.compaction`: what compaction costs, and what it saves.

1. A 2,000-message session (500 user turns: a question, a lookup with its output, every
   fifth turn a 900-token document, reasoning, an answer) compacted for the first time into
   a 32,000-token budget, with a scripted summarizer (an instant `FunctionModel` writing a
   ~250-token summary, so the time is handrail's own): wall time (median of rounds), the
   request's tokens before and after, the summarizer calls (the backlog is far bigger than
   one summarizer request may be, so it is folded in over several).
2. The next model call of the same session, one turn later, with the stored summary: the
   summary still leaves room, so no summarizer call: the time of counting and pruning.
3. The no-op path: a request under budget is counted and sent as it is (20 and 200
   messages), in microseconds.

Counting is `handrail.tokens` (tiktoken's o200k_base for gpt-4o), loaded before timing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from handrail import Message, ReasoningPart, TextPart, ToolCallPart, ToolResult
from handrail.compaction import Compacted, Compaction, Summary, compact
from handrail.models import ModelRequest, ToolDefinition
from handrail.testing import FunctionModel
from handrail.tokens import count_tokens

MODEL = FunctionModel(lambda request: "unused", name="openai:gpt-4o")
SUMMARY = " ".join(
    f"Order A{1000 + i} was delivered late and refunded in full; the customer was told."
    for i in range(15)
)
BUDGET = 32_000
TOOLS = [
    ToolDefinition(
        name=name,
        description=description,
        parameters={"type": "object", "properties": {"id": {"type": "string"}}},
    )
    for name, description in [
        ("orders.lookup", "Look an order up by its id."),
        ("docs.read", "Read a help-centre document."),
        ("orders.refund", "Refund part or all of an order."),
    ]
]
DOCUMENT = "\n".join(
    f"{i}. Damaged items are refunded in full within 30 days of delivery; keep the packaging."
    for i in range(50)
)


def turn(t: int) -> list[Message]:
    order = f"A{1000 + t}"
    calls = [
        ToolCallPart(
            id=f"call_{t}",
            name="orders.lookup",
            args={"id": order},
            status="completed",
            result=ToolResult(
                data={"id": order, "status": "delivered", "items": ["cups", "filters"]},
                summary=f"Order {order}: delivered",
            ),
        )
    ]
    if t % 5 == 0:
        calls.append(
            ToolCallPart(
                id=f"doc_{t}",
                name="docs.read",
                args={"id": "refunds"},
                status="completed",
                result=ToolResult(data=DOCUMENT, summary="Refund policy"),
            )
        )
    return [
        Message(
            id=f"u{t}",
            role="user",
            parts=[TextPart(text=f"My order {order} arrived late and a cup was chipped. Help?")],
        ),
        Message(
            id=f"c{t}",
            role="assistant",
            parts=[
                ReasoningPart(text="Look the order up first.", signature="s", provider="openai"),
                *calls,
            ],
        ),
        Message(
            id=f"a{t}",
            role="assistant",
            parts=[TextPart(text=f"Sorry about {order}: it was late, so I refunded the cup.")],
        ),
        Message(id=f"t{t}", role="user", parts=[TextPart(text="Thanks, that's all.")]),
    ]


def session(messages: int) -> list[Message]:
    return [m for t in range(messages // 4) for m in turn(t)][:messages]


def request(messages: list[Message]) -> ModelRequest:
    return ModelRequest(
        agent="support",
        instructions="You help customers with their orders. Be brief and kind.",
        messages=messages,
        tools=TOOLS,
    )


async def median(rounds: int, run: Callable[[], Awaitable[Any]]) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        await run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def main(rounds: int) -> None:
    summarizer = FunctionModel(lambda request: SUMMARY, name="scripted-summarizer")
    config = Compaction(max_tokens=BUDGET, summarizer=summarizer)
    count_tokens([], MODEL)  # load the encoding before timing

    messages = session(2_000)
    before = count_tokens(messages, MODEL, instructions=request(messages).instructions, tools=TOOLS)
    first: Compacted | None = None

    async def compact_first() -> None:
        nonlocal first
        first = await compact(request(messages), config=config, model=MODEL)

    seconds = await median(rounds, compact_first)
    assert first is not None and first.summary is not None and not first.over_budget
    calls = len(summarizer.calls) // rounds
    print(
        f"First compaction, {len(messages):,}-message session into {BUDGET:,} tokens "
        f"(median of {rounds}): {seconds * 1000:.1f} ms; {before:,} -> {first.tokens:,} tokens, "
        f"{len(first.messages)} messages sent, {calls} summarizer calls"
    )

    later = [*messages, *turn(500)]
    stored: Summary = first.summary
    again: Compacted | None = None

    async def compact_again() -> None:
        nonlocal again
        again = await compact(request(later), config=config, model=MODEL, summary=stored)

    summarizer.calls.clear()
    seconds = await median(rounds, compact_again)
    assert again is not None and again.summary is stored and not summarizer.calls
    print(
        f"Next call, one turn later, with the stored summary: {seconds * 1000:.1f} ms; "
        f"{again.tokens:,} tokens, no summarizer call"
    )

    for size in (20, 200):
        small = session(size)
        big_enough = Compaction(max_tokens=1_000_000, summarizer=summarizer)

        async def noop(small: list[Message] = small, config: Compaction = big_enough) -> None:
            result = await compact(request(small), config=config, model=MODEL)
            assert result.messages is small

        seconds = await median(rounds * 20, noop)
        size_tokens = (await compact(request(small), config=big_enough, model=MODEL)).tokens
        print(
            f"No-op, {size}-message request under budget ({size_tokens:,} tokens, all counted): "
            f"{seconds * 1e6:,.0f} µs"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.compaction", description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    asyncio.run(main(parser.parse_args().rounds))
