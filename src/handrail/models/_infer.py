"""`infer`: a model from one string, so a command line or a config file can name it.

- `openai:gpt-4o-mini`: `OpenAIModel("gpt-4o-mini")`, the key from `OPENAI_API_KEY`;
- `openai-responses:gpt-5`: `OpenAIResponsesModel("gpt-5")` (the Responses API), the key
  from `OPENAI_API_KEY`;
- `anthropic:claude-sonnet-4-6`: `AnthropicModel("claude-sonnet-4-6")`, the key from
  `ANTHROPIC_API_KEY`;
- `openai-compatible:qwen2.5:7b@http://127.0.0.1:11434/v1`: `OpenAIModel` on that server,
  the key from `OPENAI_COMPATIBLE_API_KEY` when it is set (local servers take none).

For the compatible spelling the model name comes first (it may contain `:`, as Ollama's
tags do) and the server's base URL after the first `@`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..exceptions import ConfigError

if TYPE_CHECKING:
    from . import Model
    from .openai import OpenAIModel

__all__ = ["PROVIDERS", "as_model", "infer"]

PROVIDERS = ("openai", "anthropic", "openai-compatible", "openai-responses")
"""The provider prefixes `infer` knows."""

COMPATIBLE_KEY_VARIABLE = "OPENAI_COMPATIBLE_API_KEY"


def infer(spec: str) -> Model:
    """The model a string names: `provider:model` (see the module docstring for spellings).

    Raises:
        ConfigError: an unknown provider (the message lists the known ones), a missing API
            key (naming the variable to set), or a provider whose extra is not installed.
    """
    provider, colon, rest = spec.strip().partition(":")
    if not colon or not rest:
        raise ConfigError(
            f"Model {spec!r}: write it as provider:model, e.g. openai:gpt-4o-mini "
            f"(providers: {', '.join(PROVIDERS)})."
        )
    if provider == "openai":
        return _openai()(rest)
    if provider == "openai-responses":
        try:
            from .openai_responses import OpenAIResponsesModel
        except ImportError as exc:
            raise ConfigError(str(exc)) from None
        return OpenAIResponsesModel(rest)
    if provider == "anthropic":
        try:
            from .anthropic import AnthropicModel
        except ImportError as exc:
            raise ConfigError(str(exc)) from None
        return AnthropicModel(rest)
    if provider == "openai-compatible":
        name, at, base_url = rest.partition("@")
        if not at or not name or not base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"Model {spec!r}: write an OpenAI-compatible model as "
                f"openai-compatible:MODEL@BASE_URL, e.g. "
                f"openai-compatible:qwen2.5:7b@http://127.0.0.1:11434/v1"
            )
        return _openai()(
            name,
            base_url=base_url,
            api_key=os.environ.get(COMPATIBLE_KEY_VARIABLE) or "unused",
            provider="openai-compatible",
        )
    raise ConfigError(
        f"Model {spec!r}: unknown provider {provider!r}; known providers: {', '.join(PROVIDERS)}."
    )


def as_model(model: Model | str, *, where: str) -> Model:
    """`model` itself, or the model a string names (`infer`); anything else is refused now.

    Args:
        model: a model, or a string such as `"openai:gpt-4o-mini"`.
        where: what was given the model (`"Runtime(model=...)"`), for the error.

    Raises:
        ConfigError: `model` is neither a model nor a string `infer` understands (the message
            says which), or its provider's extra or API key is missing.
    """
    if isinstance(model, str):
        return infer(model)
    # Duck-typed: an isinstance check against the runtime-checkable protocol costs ~10 µs,
    # and a model is resolved on every turn.
    if not callable(getattr(model, "stream", None)) or not hasattr(model, "name"):
        raise ConfigError(
            f"{where}: {model!r} is not a model. Pass a model (OpenAIModel(...), "
            f"OpenAIResponsesModel(...), AnthropicModel(...), ScriptedModel(...)) or a string "
            f"that handrail.models.infer reads, such as 'openai:gpt-4o-mini'."
        )
    return model


def _openai() -> type[OpenAIModel]:
    try:
        from .openai import OpenAIModel
    except ImportError as exc:
        raise ConfigError(str(exc)) from None
    return OpenAIModel
