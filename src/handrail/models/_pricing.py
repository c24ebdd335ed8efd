"""What model calls cost in money: list prices of the models handrail names, and `Usage` -> USD.

```python
price = price_of("openai:gpt-4o-mini")  # None for a model whose price is not in the table
cost = price.cost(usage) if price is not None else None
```

The table holds the providers' standard list prices (USD per million tokens, no batch or
volume discount), as published in November 2026, for the models handrail's docs and examples
name. A model not in it (another model, a dated snapshot, a model served elsewhere through
`openai-compatible:`, a test double) has no price: `price_of` returns None, never a guess.
Pass a `Price` of your own where yours differ.

How the tokens are counted: `Usage.input_tokens` is every prompt token, of which
`cached_tokens` were read from the provider's cache (charged at the cached rate); output
tokens include reasoning tokens. Anthropic's cache writes are inside `input_tokens` and are
charged here at the plain input rate (Anthropic charges them 1.25x), so for a request that
writes the cache the cost is a slight underestimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._base import Usage

__all__ = ["PRICES", "Price", "price_of"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Price:
    """A model's price, in USD per million tokens."""

    input: float
    """A prompt token (not from the cache)."""
    output: float
    """An output token (reasoning tokens included)."""
    cached_input: float | None = None
    """A prompt token read from the provider's cache (None: charged as `input`)."""

    def cost(self, usage: Usage) -> float:
        """What `usage` cost, in USD."""
        cached = min(usage.cached_tokens, usage.input_tokens)
        cached_rate = self.input if self.cached_input is None else self.cached_input
        return (
            (usage.input_tokens - cached) * self.input
            + cached * cached_rate
            + usage.output_tokens * self.output
        ) / 1_000_000


_OPENAI = {
    "gpt-4o-mini": Price(input=0.15, cached_input=0.075, output=0.60),
    "gpt-4o": Price(input=2.50, cached_input=1.25, output=10.00),
    "gpt-4.1": Price(input=2.00, cached_input=0.50, output=8.00),
    "gpt-4.1-mini": Price(input=0.40, cached_input=0.10, output=1.60),
    "gpt-4.1-nano": Price(input=0.10, cached_input=0.025, output=0.40),
    "gpt-5": Price(input=1.25, cached_input=0.125, output=10.00),
    "gpt-5-mini": Price(input=0.25, cached_input=0.025, output=2.00),
    "gpt-5-nano": Price(input=0.05, cached_input=0.005, output=0.40),
    "o4-mini": Price(input=1.10, cached_input=0.275, output=4.40),
}
_ANTHROPIC = {
    "claude-sonnet-4-6": Price(input=3.00, cached_input=0.30, output=15.00),
    "claude-opus-4-7": Price(input=5.00, cached_input=0.50, output=25.00),
}
PRICES: dict[str, Price] = (
    {f"openai:{name}": price for name, price in _OPENAI.items()}
    | {f"openai-responses:{name}": price for name, price in _OPENAI.items()}
    | {f"anthropic:{name}": price for name, price in _ANTHROPIC.items()}
)
"""Model name (`provider:model`, as `Model.name` gives it) -> its list price."""


def price_of(model: str) -> Price | None:
    """The list price of the model named `model` (`"openai:gpt-4o-mini"`), or None if unknown."""
    return PRICES.get(model)
