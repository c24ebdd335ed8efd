"""One model call of the documents' (answer, self-check, extraction, decomposition).

Through handrail's model layer, so the model's own retry policy applies; a reply the provider
did not finish (cut by a token limit, filtered) is never used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

import pydantic_core

from ..messages import Message, TextPart
from ..models import Model, ModelRequest, ModelResponse, Usage

__all__ = ["Turn", "ask_model", "read_json_object"]

Turn: TypeAlias = tuple[Literal["user", "assistant"], str]
"""One earlier message of a conversation: who said it, and what."""


async def ask_model(
    model: Model,
    instructions: str,
    prompt: str,
    usage: Usage | None = None,
    *,
    agent: str = "documents",
    output_schema: dict[str, Any] | None = None,
    history: Sequence[Turn] = (),
) -> tuple[str | None, str | None]:
    """One call: the reply's text, or None and why (the model failed, or did not finish).

    Args:
        model: the model.
        instructions: its system prompt.
        prompt: the (last) user message.
        usage: where the call's tokens are added, if anywhere.
        agent: the name the request carries (a `FunctionModel` tells calls apart by it).
        output_schema: the JSON Schema the reply should fit, for providers that enforce one.
        history: messages before the prompt (a conversation's earlier turns), oldest first.
    """
    messages = [
        Message(id=f"{agent}-{number}", role=role, parts=[TextPart(text=text)])
        for number, (role, text) in enumerate(history)
    ]
    messages.append(Message(id=agent, role="user", parts=[TextPart(text=prompt)]))
    request = ModelRequest(
        agent=agent,
        instructions=instructions,
        messages=messages,
        tool_choice="none",
        output_schema=output_schema,
    )
    response: ModelResponse | None = None
    try:
        async for chunk in model.stream(request):
            if isinstance(chunk, ModelResponse):
                response = chunk
    except Exception as error:  # the model failed for good (after its retries)
        return None, f"the model failed ({type(error).__name__})"
    if response is None:
        return None, "the model ended without a response"
    if usage is not None:
        usage.add(response.usage)
    if response.finish_reason not in (None, "stop"):
        return None, f"the model did not finish its reply ({response.finish_reason})"
    return "".join(p.text for p in response.parts if isinstance(p, TextPart)), None


def read_json_object(text: str) -> Any:
    """The JSON object in a model's reply (a fenced block, or words around it, tolerated).

    Raises:
        ValueError: there is no JSON object in it.
    """
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object in the reply")
    return pydantic_core.from_json(text[start : end + 1])
