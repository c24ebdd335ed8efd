"""handrail: an engine for tool-using AI agents that act, safely, headlessly and testably.

```python
from handrail import Agent, tool

@tool(permission="read")
def lookup(order_id: str) -> dict:
    \"\"\"Look up an order.\"\"\"
    ...
```
"""

from __future__ import annotations

from ._loop import AgentResult, AgentRun, Interrupt, run_agent
from .agent import Agent
from .context import ContextStore
from .events import (
    EVENT,
    EVENTS,
    AgentCompleted,
    AgentStarted,
    ApprovalRequired,
    ClientExecRequired,
    Event,
    InputRequired,
    ReasoningDelta,
    RunCompleted,
    RunFailed,
    RunStarted,
    RunSuspended,
    TextDelta,
    ToolCallCompleted,
    ToolCallStarted,
    ToolProgress,
    UsageEvent,
)
from .exceptions import (
    ConfigError,
    ConflictError,
    ContextFullError,
    HandrailError,
    ModelError,
    ModelHTTPError,
    ModelRetry,
    PathError,
    RunError,
    StoreError,
    ToolDefinitionError,
    UserError,
)
from .messages import (
    MESSAGES,
    ApprovalCardPart,
    Message,
    Part,
    ReasoningPart,
    TextPart,
    ToolCallPart,
)
from .models import Model, ModelRequest, ModelResponse, ToolDefinition, Usage
from .runtime import Runtime
from .state import RunState
from .store import MemoryStore, SessionRecord, SessionStore
from .tools import Tool, ToolContext, ToolResult, tool

__version__ = "0.1.0"

__all__ = [
    "EVENT",
    "EVENTS",
    "MESSAGES",
    "Agent",
    "AgentCompleted",
    "AgentResult",
    "AgentRun",
    "AgentStarted",
    "ApprovalCardPart",
    "ApprovalRequired",
    "ClientExecRequired",
    "ConfigError",
    "ConflictError",
    "ContextFullError",
    "ContextStore",
    "Event",
    "HandrailError",
    "InputRequired",
    "Interrupt",
    "MemoryStore",
    "Message",
    "Model",
    "ModelError",
    "ModelHTTPError",
    "ModelRequest",
    "ModelResponse",
    "ModelRetry",
    "Part",
    "PathError",
    "ReasoningDelta",
    "ReasoningPart",
    "RunCompleted",
    "RunError",
    "RunFailed",
    "RunStarted",
    "RunState",
    "RunSuspended",
    "Runtime",
    "SessionRecord",
    "SessionStore",
    "StoreError",
    "TextDelta",
    "TextPart",
    "Tool",
    "ToolCallCompleted",
    "ToolCallPart",
    "ToolCallStarted",
    "ToolContext",
    "ToolDefinition",
    "ToolDefinitionError",
    "ToolProgress",
    "ToolResult",
    "Usage",
    "UsageEvent",
    "UserError",
    "__version__",
    "run_agent",
    "tool",
]
