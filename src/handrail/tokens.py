"""Counting the tokens of a request before it is sent, offline, with real BPE tokenizers.

```python
count_tokens(state.messages, "openai:gpt-4o-mini", instructions=agent.instructions)
```

The request is rendered exactly as the provider adapter would send it (`_openai_format`,
`_anthropic_format`), then counted:

- **OpenAI** (and OpenAI-compatible servers): `tiktoken` with `o200k_base` for current models
  (gpt-4o, gpt-4.1, gpt-4.5, gpt-5, o1/o3/o4, and any name it does not know) and
  `cl100k_base` for gpt-4 and gpt-3.5. Messages cost OpenAI's documented 3 tokens each plus 3
  to prime the reply; tool schemas are counted with the formula of OpenAI's cookbook ("How
  to count tokens with tiktoken", section 7). On the cookbook's examples this matches the
  API exactly (124 and 101 tokens on gpt-4o; 129 and 105 on gpt-4). Tool calls inside the
  history are counted as their name and arguments plus 3, an estimate of ours.
- **Anthropic**: its tokenizer is not public, so this is an approximation: `cl100k_base`
  counts of the same content, 4 tokens per request and 3 a message for the framing, and
  when tools are given Anthropic's documented tool-use system prompt (346 tokens) plus each
  tool's JSON definition less 12. The constants were fitted to Anthropic's documented
  token-counting examples (14 tokens for a system prompt and one message, 403 with one
  tool), which the estimate therefore matches exactly; that shows the framing is right,
  not that Claude's tokenizer agrees with `cl100k_base` on your text, which could not be
  measured here. With thinking enabled the API adds tokens of its own that the estimate
  does not see (its documented example is 88 tokens; the estimate says 74, 16% low). For
  Claude Opus 4.7 and later models, which Anthropic documents to use about 30% more tokens
  for the same text, content counts are multiplied by 1.3. Treat Anthropic counts as
  estimates and keep a margin.

The encodings' rank files come from the `bpe-openai` package (installed with
`handrail[tokens]`, which the `openai` and `anthropic` extras include), are checked against
the SHA-256 that tiktoken itself expects, and are loaded once, on first use.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pydantic_core

from .exceptions import ConfigError, MissingExtraError
from .messages import Message
from .models import Model, ToolDefinition
from .models._anthropic_format import anthropic_messages, anthropic_tools
from .models._openai_format import openai_messages, openai_tools, request_tool_names

if TYPE_CHECKING:
    import tiktoken

__all__ = ["count_text", "count_tokens", "encoding_name"]

EncodingName = Literal["o200k_base", "cl100k_base"]

# The encodings as tiktoken defines them (tiktoken_ext/openai_public.py), with the SHA-256 of
# their rank files: the files are read from bpe-openai and must be the very same.
_ENCODINGS: dict[str, tuple[str, str, dict[str, int]]] = {
    "o200k_base": (
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
        {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    ),
    "cl100k_base": (
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",  # noqa: E501
        {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
}

_CL100K_MODELS = re.compile(r"^(gpt-4(?!o|\.)|gpt-3\.5|text-embedding-(3|ada))")
_NEWER_CLAUDE = re.compile(r"^claude-(?:[a-z]+-)?(\d+)(?:-(\d{1,2}))?(?:-|$)")
_OPENAI_PER_MESSAGE = 3
_OPENAI_PRIMING = 3
_OPENAI_PER_CALL = 3
_ANTHROPIC_BASE = 4
_ANTHROPIC_PER_MESSAGE = 3
_ANTHROPIC_TOOL_PROMPT = 346
_ANTHROPIC_PER_TOOL = -12
_NEWER_CLAUDE_FACTOR = 1.3


def count_tokens(
    messages: Sequence[Message],
    model: str | Model,
    *,
    instructions: str | None = None,
    tools: Sequence[ToolDefinition] = (),
) -> int:
    """The prompt tokens a request would cost: its messages, instructions and tool schemas.

    Args:
        messages: the conversation (tool results ride inside their call parts).
        model: a model, or its name with or without a provider prefix (`gpt-4o-mini`,
            `openai:gpt-4o-mini`, `anthropic:claude-sonnet-4-6`, `claude-opus-4-7`).
        instructions: the system prompt.
        tools: the tools the model is told about.

    Raises:
        MissingExtraError: the tokenizer is not installed (`pip install "handrail[tokens]"`).
    """
    provider, name = _split(model)
    names = request_tool_names(tools, messages)
    if provider == "anthropic":
        return _anthropic(messages, name, instructions, tools, names)
    encoding = _encoding(encoding_name(name))
    total = _OPENAI_PRIMING
    for message in openai_messages(instructions, messages, names):
        total += _OPENAI_PER_MESSAGE + _len(encoding, message["role"])
        total += _content_tokens(encoding, message.get("content"))
        for call in message.get("tool_calls", ()):
            function = call["function"]
            total += _OPENAI_PER_CALL + _len(encoding, function["name"])
            total += _len(encoding, function["arguments"])
    if tools:
        total += _openai_tools(encoding, openai_tools(tools, names), encoding.name)
    return total


def count_text(text: str, model: str | Model) -> int:
    """The tokens of one text for `model` (no message framing)."""
    provider, name = _split(model)
    if provider == "anthropic":
        return _scaled(_len(_encoding("cl100k_base"), text), name)
    return _len(_encoding(encoding_name(name)), text)


def encoding_name(model: str) -> EncodingName:
    """The tiktoken encoding of an OpenAI model name (`o200k_base` for any unknown name)."""
    return "cl100k_base" if _CL100K_MODELS.match(model) else "o200k_base"


def _split(model: str | Model) -> tuple[str, str]:
    spec = model if isinstance(model, str) else model.name
    provider, _, name = spec.partition(":")
    if not name:
        provider, name = ("anthropic" if spec.startswith("claude") else "openai"), spec
    if provider == "openai-compatible":
        name = name.partition("@")[0]
    return provider, name


def _len(encoding: tiktoken.Encoding, text: str) -> int:
    return len(encoding.encode_ordinary(text)) if text else 0


def _content_tokens(encoding: tiktoken.Encoding, content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return _len(encoding, content)
    return sum(_len(encoding, part.get("text", "")) for part in content)


def _openai_tools(encoding: tiktoken.Encoding, tools: list[dict[str, Any]], name: str) -> int:
    """OpenAI's cookbook formula for the tokens of function definitions."""
    func_init = 7 if name == "o200k_base" else 10
    prop_init, prop_key, enum_init, enum_item, func_end = 3, 3, -3, 3, 12
    total = func_end
    for tool in tools:
        function = tool["function"]
        description = (function.get("description") or "").removesuffix(".")
        total += func_init + _len(encoding, f"{function['name']}:{description}")
        properties = function.get("parameters", {}).get("properties", {})
        if properties:
            total += prop_init
        for key, schema in properties.items():
            total += prop_key
            if "enum" in schema:
                total += enum_init
                for item in schema["enum"]:
                    total += enum_item + _len(encoding, str(item))
            kind = schema.get("type", "object")
            described = (schema.get("description") or "").removesuffix(".")
            total += _len(encoding, f"{key}:{kind}:{described}")
            nested = {k: v for k, v in schema.items() if k not in ("type", "description", "enum")}
            if nested:  # beyond the cookbook: nested schemas, counted as their JSON
                total += _len(encoding, pydantic_core.to_json(nested).decode())
    return total


def _anthropic(
    messages: Sequence[Message],
    model: str,
    instructions: str | None,
    tools: Sequence[ToolDefinition],
    names: Any,
) -> int:
    encoding = _encoding("cl100k_base")
    system, rendered = anthropic_messages(instructions, messages, names)
    content = _len(encoding, system or "")
    framing = _ANTHROPIC_BASE + _ANTHROPIC_PER_MESSAGE * len(rendered)
    for message in rendered:
        for block in message["content"]:
            kind = block["type"]
            if kind == "text":
                content += _len(encoding, block["text"])
            elif kind == "thinking":
                content += _len(encoding, block["thinking"])
            elif kind == "tool_use":
                content += _len(encoding, block["name"])
                content += _len(encoding, pydantic_core.to_json(block["input"]).decode())
            elif kind == "tool_result":
                content += _len(encoding, block["content"])
    if tools:
        framing += _ANTHROPIC_TOOL_PROMPT
        for tool in anthropic_tools(tools, names):
            definition = pydantic_core.to_json(tool).decode()
            content += _len(encoding, definition) + _ANTHROPIC_PER_TOOL
    return framing + _scaled(content, model)


def _scaled(tokens: int, model: str) -> int:
    """Content tokens for Claude Opus 4.7 and later, whose tokenizer spends about 30% more."""
    match = _NEWER_CLAUDE.match(model)
    if match is None:
        return tokens
    version = (int(match.group(1)), int(match.group(2) or 0))
    return round(tokens * _NEWER_CLAUDE_FACTOR) if version >= (4, 7) else tokens


@cache
def _encoding(name: str) -> tiktoken.Encoding:
    """Load an encoding once: its rank file from bpe-openai, checked against tiktoken's hash."""
    try:
        import tiktoken
    except ImportError as exc:
        raise MissingExtraError(
            "count_tokens", needs="tiktoken and bpe-openai", extra="tokens"
        ) from exc
    digest, pattern, special = _ENCODINGS[name]
    raw = gzip.decompress(_rank_file(name).read_bytes())
    if hashlib.sha256(raw).hexdigest() != digest:
        raise ConfigError(
            f"The {name} rank file shipped by bpe-openai is not the one tiktoken expects "
            f"(SHA-256 mismatch): reinstall it with pip install --force-reinstall bpe-openai."
        )
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in raw.splitlines() if line)
    }
    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special)


def _rank_file(name: str) -> Path:
    # Found without importing bpe_openai: only its data files are used, not its tokenizer.
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError("count_tokens", needs="bpe-openai", extra="tokens")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / f"{name}.tiktoken.gz"
