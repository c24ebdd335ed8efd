"""Models: the `Model` protocol and what flows through it.

A model streams a `ModelRequest` into chunks (`TextChunk`, `ReasoningChunk`,
`ToolCallChunk`) and ends the stream with exactly one `ModelResponse` carrying the complete
parts, the usage and the stop reason. Providers live one per module (`models/openai.py`,
`models/openai_responses.py`, `models/anthropic.py`), each behind its extra and loaded
lazily on first use: `from handrail.models import OpenAIModel` needs
`pip install "handrail[openai]"`. `infer`
turns a string such as `"openai:gpt-4o-mini"` into a model; `price_of` gives a model's list
price (a `Price`, which turns a `Usage` into USD), or None when it is not known. The offline
test doubles are
`ScriptedModel` and `FunctionModel` (also exported from `handrail.testing`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..tools._definition import ToolDefinition
from ._base import (
    FinishReason,
    Model,
    ModelChunk,
    ModelRequest,
    ModelResponse,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    Usage,
)
from ._infer import as_model, infer
from ._pricing import Price, price_of

if TYPE_CHECKING:
    from .anthropic import AnthropicModel
    from .openai import OpenAIModel
    from .openai_responses import OpenAIResponsesModel

__all__ = [
    "AnthropicModel",
    "FinishReason",
    "Model",
    "ModelChunk",
    "ModelRequest",
    "ModelResponse",
    "OpenAIModel",
    "OpenAIResponsesModel",
    "Price",
    "ReasoningChunk",
    "TextChunk",
    "ToolCallChunk",
    "ToolDefinition",
    "Usage",
    "as_model",
    "infer",
    "price_of",
]


def __getattr__(name: str) -> Any:
    # The providers import their SDKs: load them only when asked for.
    if name == "OpenAIModel":
        from .openai import OpenAIModel

        return OpenAIModel
    if name == "OpenAIResponsesModel":
        from .openai_responses import OpenAIResponsesModel

        return OpenAIResponsesModel
    if name == "AnthropicModel":
        from .anthropic import AnthropicModel

        return AnthropicModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
