"""An optional dependency that is missing: a `MissingExtraError` naming the extra to install."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = [
    # (modules hidden, what the user does, the extra, the message)
    (
        ["openai"],
        "from handrail.models.openai import OpenAIModel",
        "openai",
        'OpenAIModel needs openai: pip install "handrail[openai]"',
    ),
    (
        ["openai"],
        "from handrail.models.openai_responses import OpenAIResponsesModel",
        "openai",
        'OpenAIResponsesModel needs openai: pip install "handrail[openai]"',
    ),
    (
        ["anthropic"],
        "from handrail.models.anthropic import AnthropicModel",
        "anthropic",
        'AnthropicModel needs anthropic: pip install "handrail[anthropic]"',
    ),
    (
        ["uvicorn"],
        "import handrail.server",
        "server",
        'handrail.server needs starlette and uvicorn: pip install "handrail[server]"',
    ),
    (
        ["opentelemetry"],
        "from handrail.tracing import Tracing\nTracing()",
        "otel",
        'Tracing needs OpenTelemetry: pip install "handrail[otel]"',
    ),
    (
        ["tiktoken"],
        "from handrail.tokens import count_tokens\ncount_tokens([], 'openai:gpt-4o')",
        "tokens",
        'count_tokens needs tiktoken and bpe-openai: pip install "handrail[tokens]"',
    ),
]


@pytest.mark.parametrize(("hidden", "action", "extra", "message"), CASES)
def test_a_missing_extra_is_named(hidden: list[str], action: str, extra: str, message: str) -> None:
    body = "\n".join(f"    {line}" for line in action.splitlines())
    code = (
        "import sys\n"
        + "".join(f"sys.modules[{name!r}] = None  # as if not installed\n" for name in hidden)
        + "from handrail import ConfigError, MissingExtraError\n"
        "try:\n"
        f"{body}\n"
        "except MissingExtraError as error:\n"
        "    assert isinstance(error, ImportError) and isinstance(error, ConfigError)\n"
        "    print(error.extra)\n"
        "    print(error)\n"
        "else:\n"
        "    print('no error')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [extra, message]
