"""Models for scenarios: built fresh from a `ModelSpec`, and counted as they are called.

`build_model` makes a new model for each scenario (a script is never shared by two
scenarios). `CountingModel` wraps any model and adds each call and its reported tokens to a
`Tally`: model calls are counted where they happen, not guessed from events.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pydantic_core

from ..messages import TextPart, ToolCallPart
from ..models import Model, ModelChunk, ModelRequest, ModelResponse, Usage, infer
from ..models.function import FunctionModel, Step, call
from ..models.scripted import ScriptedModel
from ._load import import_target
from ._suite import ModelSpec, StepPart, UsageSpec

__all__ = ["CountingModel", "Tally", "build_model", "close", "unplayed"]


@dataclass(kw_only=True, slots=True)
class Tally:
    """Model calls and reported tokens, added up over a scenario's models."""

    calls: int = 0
    """Model calls made."""
    tokens: int | None = None
    """Input plus output tokens, or None while no answer reported any."""


class CountingModel:
    """A model that counts each call (and the tokens it reports) into a tally.

    Args:
        inner: the model that answers.
        tally: where calls and tokens are added up (shared by a scenario's models).
        usage: tokens to report for each answer instead of the inner model's (for scripted
            and function models, which report none).
    """

    def __init__(self, inner: Model, tally: Tally, usage: UsageSpec | None = None) -> None:
        self.inner = inner
        self.tally = tally
        self.usage = usage

    @property
    def name(self) -> str:
        """The inner model's name."""
        return self.inner.name

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Stream the inner model's answer, counting the call and its tokens."""
        self.tally.calls += 1
        async for chunk in self.inner.stream(request):
            if isinstance(chunk, ModelResponse):
                if self.usage is not None:
                    usage = Usage(
                        requests=1,
                        input_tokens=self.usage.input_tokens,
                        output_tokens=self.usage.output_tokens,
                    )
                    chunk = dataclasses.replace(chunk, usage=usage)
                tokens = chunk.usage.input_tokens + chunk.usage.output_tokens
                if tokens or self.usage is not None:
                    self.tally.tokens = (self.tally.tokens or 0) + tokens
            yield chunk


def build_model(spec: ModelSpec, tally: Tally, where: str) -> CountingModel:
    """A new model as `spec` says, counted into `tally`.

    Raises:
        ConfigError: a real model that cannot be made (unknown provider, missing key or extra).
        SuiteError: a function target that does not import.
    """
    inner: Model
    if spec.scripted is not None:
        inner = ScriptedModel([_step(parts) for parts in spec.scripted])
    elif spec.function is not None:
        function: Callable[[ModelRequest], Any] = import_target(spec.function, where)
        inner = FunctionModel(function, name="function")
    else:
        assert spec.name is not None
        inner = infer(spec.name)
    return CountingModel(inner, tally, spec.usage)


def unplayed(model: Model) -> str | None:
    """Why a scripted model's script was not played to its end, or None if it was."""
    inner = model.inner if isinstance(model, CountingModel) else model
    if isinstance(inner, ScriptedModel) and inner.remaining:
        played = len(inner.calls)
        return (
            f"the scripted model played {played} of {played + inner.remaining} steps "
            f"(the agent stopped early, or the script has steps too many)"
        )
    return None


async def close(model: Model) -> None:
    """Close a real model's HTTP client, if it has one."""
    inner = model.inner if isinstance(model, CountingModel) else model
    aclose = getattr(inner, "aclose", None)
    if aclose is not None:
        await aclose()


def _step(parts: list[StepPart]) -> Step:
    out: list[str | TextPart | ToolCallPart] = []
    for part in parts:
        if part.call is not None:
            out.append(call(part.call, part.args, id=part.id))
        elif part.text is not None:
            out.append(part.text)
        else:
            out.append(pydantic_core.to_json(part.output).decode())
    return out[0] if len(out) == 1 else out
