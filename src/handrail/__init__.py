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

from typing import TYPE_CHECKING, Any

from ._agent_spec import ToolsFor, TurnInfo, by_role, render_tool_menu
from ._deadlines import Deadlines
from ._loop import AgentResult, AgentRun, Interrupt, run_agent
from .agent import Agent
from .audit import AuditEntry
from .capture import ApplyReport, CapturedAction, HeadlessResult, apply, temp_id
from .compaction import Compaction
from .context import ContextStore
from .domain import Domain, RouteDecision
from .engine import Engine, PendingCard, PendingPage, Resolution
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
    ToolCallDelta,
    ToolCallStarted,
    ToolProgress,
    UsageEvent,
)
from .exceptions import (
    ArgumentsChangedError,
    AskPerson,
    ConfigError,
    ConflictError,
    ContextFullError,
    DecisionNotAllowedError,
    DocumentError,
    DocumentIndexError,
    DocumentLoadError,
    HandrailError,
    HostedToolError,
    IncompleteResponseError,
    InvalidContextError,
    InvalidDecisionError,
    MissingExtraError,
    ModelError,
    ModelHTTPError,
    ModelRetry,
    PathError,
    RoutingError,
    RunError,
    SessionBusyError,
    SessionCorruptError,
    SessionNotFoundError,
    StaleResolutionError,
    StoreError,
    StoreUnavailableError,
    ToolDefinitionError,
    TurnCutOffError,
    TurnRefusedError,
    TurnSuspendedError,
    UnsettledSaveError,
    UserError,
)
from .gate import TurnRequest
from .messages import (
    MESSAGES,
    ApprovalCardPart,
    CardApproval,
    Message,
    Part,
    ReasoningPart,
    TextPart,
    ToolCallPart,
)
from .models import Model, ModelRequest, ModelResponse, ToolDefinition, Usage
from .policy import Decider, DecisionPolicy
from .runtime import Runtime, build_runtime
from .state import RouteChoice, RunState
from .store import MemoryStore, PartitionedStore, SessionRecord, SessionStore
from .suspension import DECISION, ActionChoice, Answer, Approve, ClientResult, Decision, Reject
from .tools import (
    HostedTool,
    Tool,
    ToolContext,
    ToolErrorCode,
    ToolResult,
    code_execution,
    tool,
    web_fetch,
    web_search,
)
from .worker import Worker, WorkerStats

if TYPE_CHECKING:
    from .store import PostgresStore, SqliteStore

__version__ = "0.1.0"

__all__ = [
    "DECISION",
    "EVENT",
    "EVENTS",
    "MESSAGES",
    "ActionChoice",
    "Agent",
    "AgentCompleted",
    "AgentResult",
    "AgentRun",
    "AgentStarted",
    "Answer",
    "ApplyReport",
    "ApprovalCardPart",
    "ApprovalRequired",
    "Approve",
    "ArgumentsChangedError",
    "AskPerson",
    "AuditEntry",
    "CapturedAction",
    "CardApproval",
    "ClientExecRequired",
    "ClientResult",
    "Compaction",
    "ConfigError",
    "ConflictError",
    "ContextFullError",
    "ContextStore",
    "Deadlines",
    "Decider",
    "Decision",
    "DecisionNotAllowedError",
    "DecisionPolicy",
    "DocumentError",
    "DocumentIndexError",
    "DocumentLoadError",
    "Domain",
    "Engine",
    "Event",
    "HandrailError",
    "HeadlessResult",
    "HostedTool",
    "HostedToolError",
    "IncompleteResponseError",
    "InputRequired",
    "Interrupt",
    "InvalidContextError",
    "InvalidDecisionError",
    "MemoryStore",
    "Message",
    "MissingExtraError",
    "Model",
    "ModelError",
    "ModelHTTPError",
    "ModelRequest",
    "ModelResponse",
    "ModelRetry",
    "Part",
    "PartitionedStore",
    "PathError",
    "PendingCard",
    "PendingPage",
    "PostgresStore",
    "ReasoningDelta",
    "ReasoningPart",
    "Reject",
    "Resolution",
    "RouteChoice",
    "RouteDecision",
    "RoutingError",
    "RunCompleted",
    "RunError",
    "RunFailed",
    "RunStarted",
    "RunState",
    "RunSuspended",
    "Runtime",
    "SessionBusyError",
    "SessionCorruptError",
    "SessionNotFoundError",
    "SessionRecord",
    "SessionStore",
    "SqliteStore",
    "StaleResolutionError",
    "StoreError",
    "StoreUnavailableError",
    "TextDelta",
    "TextPart",
    "Tool",
    "ToolCallCompleted",
    "ToolCallDelta",
    "ToolCallPart",
    "ToolCallStarted",
    "ToolContext",
    "ToolDefinition",
    "ToolDefinitionError",
    "ToolErrorCode",
    "ToolProgress",
    "ToolResult",
    "ToolsFor",
    "TurnCutOffError",
    "TurnInfo",
    "TurnRefusedError",
    "TurnRequest",
    "TurnSuspendedError",
    "UnsettledSaveError",
    "Usage",
    "UsageEvent",
    "UserError",
    "Worker",
    "WorkerStats",
    "__version__",
    "apply",
    "build_runtime",
    "by_role",
    "code_execution",
    "render_tool_menu",
    "run_agent",
    "temp_id",
    "tool",
    "web_fetch",
    "web_search",
]

_LAZY = ("PostgresStore", "SqliteStore")


def __getattr__(name: str) -> Any:
    # The stores' modules load on first use: neither `import handrail` nor a program that
    # keeps its sessions in memory imports sqlite3 or psycopg. Without the `postgres` extra
    # the name still resolves; making a `PostgresStore` raises `MissingExtraError`.
    if name in _LAZY:
        from . import store

        value = getattr(store, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
