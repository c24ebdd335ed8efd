"""Tracing: OpenTelemetry spans for turns, routing, agents, model calls, tools and suspensions.

Off unless a runtime is given one (`Runtime(tracing=Tracing())`, behind the `otel` extra), so
a run without it pays one `is None` check per step. Spans follow the OpenTelemetry GenAI
semantic conventions where they exist (`invoke_agent {name}`, `chat {model}`,
`execute_tool {name}`, `gen_ai.*` attributes); the turn, the route decision and a suspension
use `handrail.*` names.

Spans are started with their parent given explicitly, never made "current": a run's steps
are async generators that resume in their consumer's context, where a current span set
inside them would leak or fail to detach.

```python
from opentelemetry.sdk.trace import TracerProvider

runtime = Runtime(model=model, tracing=Tracing(TracerProvider()))
```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = ["Tracing"]

AttributeValue = str | bool | int | float | Sequence[str]


class Tracing:
    """Makes handrail's spans with an OpenTelemetry tracer.

    Args:
        provider: the `TracerProvider` to use (default: the global one, as configured by
            the application or an OpenTelemetry distro).

    Raises:
        ImportError: OpenTelemetry is not installed (`pip install "handrail[otel]"`).
    """

    __slots__ = ("_status", "_tracer", "_use")

    def __init__(self, provider: Any = None) -> None:
        try:
            from opentelemetry import trace
        except ImportError as exc:  # pragma: no cover - the dev extra installs it
            raise ImportError('Tracing needs OpenTelemetry: pip install "handrail[otel]"') from exc
        self._tracer: Tracer = trace.get_tracer("handrail", tracer_provider=provider)
        self._use = trace.set_span_in_context
        self._status = trace.Status, trace.StatusCode

    def start(
        self, name: str, parent: Span | None, attributes: Mapping[str, AttributeValue]
    ) -> Span:
        """Start a span under `parent` (a root span when None), without making it current."""
        context = self._use(parent) if parent is not None else None
        return self._tracer.start_span(name, context=context, attributes=attributes)

    def fail(self, span: Span, error: str) -> None:
        """Mark `span` as failed with `error`."""
        status, code = self._status
        span.set_status(status(code.ERROR, error))
