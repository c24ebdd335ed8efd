"""`python -m bench.providers`: what the provider adapters cost, and how fast tokens are counted.

1. Adapter overhead: a 5,000-chunk streamed answer from the fake provider server (tests/),
   read once through the bare SDK (`async for chunk in stream`, reading each delta) and once
   through handrail's adapter (`async for chunk in model.stream(request)`, which also builds
   the final response). Alternating rounds, median of each; target: the adapter takes at most
   10% more wall time than the bare SDK loop.
2. Token counting: `count_tokens` over a 200-message history (text, tool calls and results),
   after the encoding is loaded; tokens per second, median of rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from tests.fake_providers import (
    FakeProviders,
    Stream,
    anthropic_stream,
    openai_chunk,
    openai_stream,
    openai_usage,
)

from handrail import Message, TextPart, ToolCallPart, ToolResult
from handrail.models import ModelRequest
from handrail.models.anthropic import AnthropicModel
from handrail.models.openai import OpenAIModel
from handrail.models.retry import RetryPolicy
from handrail.tokens import count_tokens

CHUNKS = 5_000
TARGET = 1.10
REQUEST = ModelRequest(
    agent="bench",
    instructions="Be brief.",
    messages=[Message(id="m1", role="user", parts=[TextPart(text="Tell me a long story.")])],
)


def openai_reply() -> Stream:
    chunks = [openai_chunk(content=f"word{i} ") for i in range(CHUNKS)]
    stream = openai_stream(chunks, usage=openai_usage(20, CHUNKS))
    stream.chunk_size = 1 << 16
    return stream


def anthropic_reply() -> Stream:
    deltas = [{"type": "text_delta", "text": f"word{i} "} for i in range(CHUNKS)]
    stream = anthropic_stream([({"type": "text", "text": ""}, deltas)], output_tokens=CHUNKS)
    stream.chunk_size = 1 << 16
    return stream


async def timed(run: Callable[[], Awaitable[int]]) -> float:
    started = time.perf_counter()
    count = await run()
    elapsed = time.perf_counter() - started
    assert count >= CHUNKS, count
    return elapsed


async def compare(
    fake: FakeProviders,
    reply: Callable[[], Stream],
    raw: Callable[[], Awaitable[int]],
    adapted: Callable[[], Awaitable[int]],
    rounds: int,
) -> tuple[float, float]:
    bare: list[float] = []
    handrail: list[float] = []
    for _ in range(2):  # warm up connections, imports and caches
        fake.script(reply(), reply())
        await raw()
        await adapted()
    for _ in range(rounds):
        fake.script(reply(), reply())
        bare.append(await timed(raw))
        handrail.append(await timed(adapted))
    return statistics.median(bare), statistics.median(handrail)


async def openai_overhead(fake: FakeProviders, rounds: int) -> tuple[float, float]:
    model = OpenAIModel("gpt-4o-mini", api_key="k", base_url=fake.openai_url, retry=RetryPolicy())
    client = model.client

    async def raw() -> int:
        count = 0
        stream = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "Tell me a long story."}],
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                count += 1
        return count

    async def adapted() -> int:
        return sum([1 async for _ in model.stream(REQUEST)])

    try:
        return await compare(fake, openai_reply, raw, adapted, rounds)
    finally:
        await model.aclose()


async def anthropic_overhead(fake: FakeProviders, rounds: int) -> tuple[float, float]:
    model = AnthropicModel("claude-sonnet-4-6", api_key="k", base_url=fake.url)
    client = model.client

    async def raw() -> int:
        count = 0
        stream = await client.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=4096,
            messages=[{"role": "user", "content": "Tell me a long story."}],
            stream=True,
        )
        async for event in stream:
            if event.type == "content_block_delta":
                count += 1
        return count

    async def adapted() -> int:
        return sum([1 async for _ in model.stream(REQUEST)])

    try:
        return await compare(fake, anthropic_reply, raw, adapted, rounds)
    finally:
        await model.aclose()


def history(size: int = 200) -> list[Message]:
    messages: list[Message] = []
    for i in range(size // 2):
        messages.append(
            Message(
                id=f"u{i}",
                role="user",
                parts=[
                    TextPart(
                        text=f"Question {i}: my order A{1000 + i} arrived late and one cup was "
                        "chipped. Can you check what happened and what you can do about it?"
                    )
                ],
            )
        )
        call = ToolCallPart(
            id=f"c{i}",
            name="orders.lookup",
            args={"order_id": f"A{1000 + i}"},
            status="completed",
            result=ToolResult(
                data={"order": f"A{1000 + i}", "status": "delivered", "items": ["cups", "filters"]}
            ),
        )
        messages.append(
            Message(
                id=f"a{i}",
                role="assistant",
                parts=[
                    TextPart(
                        text="I'm sorry to hear that. I looked your order up: it was delivered "
                        "two days late, and damaged items are refunded in full."
                    ),
                    call,
                ],
            )
        )
    return messages


def token_throughput(rounds: int) -> tuple[int, float]:
    messages = history()
    tokens = count_tokens(messages, "gpt-4o-mini")  # loads the encoding
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        count_tokens(messages, "gpt-4o-mini")
        times.append(time.perf_counter() - started)
    return tokens, tokens / statistics.median(times)


def row(name: str, bare: float, adapted: float) -> None:
    ratio = adapted / bare
    mark = "✓" if ratio <= TARGET else "✗"
    print(
        f"{name:<10} bare SDK {bare * 1000:7.1f} ms   handrail {adapted * 1000:7.1f} ms   "
        f"ratio {ratio:.3f}  {mark} ≤ {TARGET:.2f}"
    )


async def main(rounds: int) -> None:
    fake = FakeProviders()
    try:
        print(f"Adapter overhead, one {CHUNKS:,}-chunk streamed answer (median of {rounds}):")
        row("openai", *await openai_overhead(fake, rounds))
        row("anthropic", *await anthropic_overhead(fake, rounds))
    finally:
        fake.close()
    tokens, per_second = token_throughput(rounds)
    print(
        f"Token counting, 200-message history ({tokens:,} tokens, gpt-4o-mini): "
        f"{per_second:,.0f} tokens/s ({tokens / per_second * 1000:.2f} ms a count)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.providers", description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    asyncio.run(main(parser.parse_args().rounds))
