"""Every error handrail raises, in one tree.

```
HandrailError
├── UserError                  the application developer misused the API
│   ├── ToolDefinitionError    an illegal tool declaration (found when the tool is defined)
│   ├── ConfigError            a bad or missing setting (names the variable or argument to fix)
│   │   └── MissingExtraError  an optional dependency is not installed (names the extra)
│   ├── PathError              a context path that does not parse or does not resolve
│   │   └── ContextFullError   a session-scoped write that does not fit under the size cap
│   ├── InvalidDecisionError   a decision that does not fit its pending call (kind, amendment)
│   ├── HostedToolError        a hosted tool (web search, ...) given to a model that cannot run it
│   ├── TurnSuspendedError     a new message while the session's turn waits for decisions
│   ├── TurnCutOffError        a new message while the session's turn waits to be recovered
│   ├── TurnRefusedError       the app's gate does not let this caller start a turn (its reason)
│   └── SessionNotFoundError   no such session for this caller (another tenant's included)
├── RunError                   a run failed; carries what the run had got to
│   ├── ModelError             the model misbehaved (bad script, exhausted script, bad stream)
│   │   └── IncompleteResponseError  the provider's response ended without its protocol's end
│   ├── ModelHTTPError         a model provider's API failed for good (after retries, or at once)
│   ├── StaleResolutionError   a decision for a call that is unknown, already decided or expired
│   ├── DecisionNotAllowedError  a decision its tool's policy does not allow this decider
│   ├── SessionBusyError       another run is driving (or resuming) the session right now
│   ├── MaxIterationsError     (reserved) an iteration cap was hit where no message can say so
│   └── StoreError             a session store failed, or holds something it cannot read
│       ├── ConflictError      a stale save: someone else saved the session first
│       ├── SessionCorruptError  a stored session that cannot be read (left as it is)
│       ├── RoutingError       a session or organisation no partition of a PartitionedStore takes
│       ├── StoreUnavailableError  the store could not be reached, or was busy: worth retrying
│       └── UnsettledSaveError   a save that would end a session while calls still wait
└── DocumentError              handrail.documents could not ingest, embed or index
    ├── DocumentLoadError      a file that is unsupported or unreadable (names the file)
    └── DocumentIndexError     the embedder or the index failed, or holds what it cannot use
```

Signals from a tool to the engine are not errors and do not inherit from `HandrailError`, so
a broad `except HandrailError` cannot swallow them:

```
ModelRetry        raise inside a tool: the message goes back to the model as a tool error
AskPerson         raise inside a tool: the call waits for a person's answer, then runs again
```

Inside the agent loop failures are data (a `ToolResult` with `ok=False` that the model reads);
these exceptions belong at the edges.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ArgumentsChangedError",
    "AskPerson",
    "ConfigError",
    "ConflictError",
    "ContextFullError",
    "DecisionNotAllowedError",
    "DocumentError",
    "DocumentIndexError",
    "DocumentLoadError",
    "HandrailError",
    "HostedToolError",
    "IncompleteResponseError",
    "InvalidContextError",
    "InvalidDecisionError",
    "MaxIterationsError",
    "MissingExtraError",
    "ModelError",
    "ModelHTTPError",
    "ModelRetry",
    "PathError",
    "RoutingError",
    "RunError",
    "SessionBusyError",
    "SessionCorruptError",
    "SessionNotFoundError",
    "StaleResolutionError",
    "StoreError",
    "StoreUnavailableError",
    "ToolDefinitionError",
    "TurnCutOffError",
    "TurnRefusedError",
    "TurnSuspendedError",
    "UnsettledSaveError",
    "UserError",
]


class HandrailError(Exception):
    """Base of every error handrail raises."""


class UserError(HandrailError):
    """The application developer misused the API: the message names the fix."""


class ToolDefinitionError(UserError):
    """A tool was declared with an illegal combination of options."""


class ConfigError(UserError):
    """A setting is missing or invalid."""


class MissingExtraError(ConfigError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it.

    Also an `ImportError`, so code that guards an optional import with `except ImportError`
    keeps working.

    Attributes:
        extra: the extra to install (`pip install "handrail[<extra>]"`).
    """

    def __init__(self, what: str, *, needs: str, extra: str) -> None:
        super().__init__(f'{what} needs {needs}: pip install "handrail[{extra}]"')
        self.extra = extra


class PathError(UserError):
    """A context-store path does not parse, or does not resolve against the data.

    Attributes:
        path: the whole path that failed.
        segment: the segment at which it failed, when there is one.
    """

    def __init__(self, message: str, *, path: str, segment: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.segment = segment


class ContextFullError(PathError):
    """A session-scoped value does not fit under the context store's size cap."""


class InvalidContextError(UserError):
    """A per-turn context that does not fit the domain's `context_model`; nothing was stored.

    `field` names the first field at fault (dotted, `record.id`), or is empty when the
    context as a whole is wrong (not a JSON object).
    """

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class InvalidDecisionError(UserError):
    """A decision that does not fit its pending call; nothing was recorded.

    For example `approve` on a call that waits for an answer, an amended argument that is not
    amendable, or amended arguments that do not validate. The message names what to change.
    """


class HostedToolError(UserError):
    """A hosted tool (`web_search()`, ...) was given to a model that cannot run it.

    Raised by the model before any request is sent; the message names the model and a model
    that can run the tool.
    """


class TurnSuspendedError(UserError):
    """A new message for a session whose turn is suspended; nothing changed.

    The turn must end first: decide its pending calls, then resume it. The exception carries
    the facts, and each edge says what to do in its own terms (the server names its
    endpoints, the CLI its commands); the message is the library's.

    Attributes:
        session_id: the session.
        pending: the calls that wait for a decision (empty: all decided, the turn not yet
            resumed).
    """

    def __init__(self, session_id: str | None, pending: tuple[str, ...]) -> None:
        turn = f"The turn of session {session_id!r}" if session_id is not None else "The turn"
        if pending:
            what = (
                f"{turn} is suspended, waiting on {', '.join(pending)}: decide each call with "
                f"engine.resolve(session_id, tool_call_id, decision), then continue the turn "
                f"with engine.resume(session_id)"
            )
        else:
            what = (
                f"{turn} is suspended, its calls all decided: continue it with "
                f"engine.resume(session_id)"
            )
        super().__init__(f"{what}, before sending a new message.")
        self.session_id = session_id
        self.pending = pending


class TurnCutOffError(UserError):
    """A new message for a session whose previous turn was cut off while it ran; nothing changed.

    A crash or a stopped worker left the turn unfinished; it must be recovered first (from the
    tool-call log), which a `Worker` does by itself. The message is the library's; each edge
    words it its own way.

    Attributes:
        session_id: the session.
    """

    def __init__(self, session_id: str | None) -> None:
        session = f"Session {session_id!r}" if session_id is not None else "The session"
        super().__init__(
            f"{session}: the previous turn was cut off while it ran (a crash, or a worker that "
            f"stopped): recover it with engine.recover(session_id) (a Worker does so by "
            f"itself) before sending a new message."
        )
        self.session_id = session_id


class TurnRefusedError(UserError):
    """The app's gate does not let this caller start a turn; nothing was stored.

    The message is the gate's reason, as the app wrote it for the caller (`handrail.gate`).
    The server answers it 403 `turn_refused`.

    Attributes:
        reason: the gate's reason.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SessionNotFoundError(UserError):
    """No session with this id belongs to the caller (another tenant's looks the same).

    The library's message names the scope it looked in and how a session is found (with the
    `org_id=`/`user_id=` it was created with); the server's answer says only that its caller
    has no such session, never whether another one has (`http_message` in `handrail.server`).

    Attributes:
        session_id: the session looked for, when known.
    """

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id

    @classmethod
    def for_caller(cls, session_id: str) -> SessionNotFoundError:
        """No session `session_id` for the caller: the server's words (another's looks the same)."""
        return cls(f"No session {session_id!r} for this caller.", session_id=session_id)


class RunError(HandrailError):
    """A run failed.

    Attributes:
        state: what the run had got to (the messages so far), when known.
    """

    def __init__(self, message: str, *, state: Any = None) -> None:
        super().__init__(message)
        self.state = state


class ModelError(RunError):
    """The model produced something the engine cannot use (or a test script ran out)."""


class IncompleteResponseError(ModelError):
    """A model's response ended before the provider finished it, so nothing of it is acted on.

    For example an OpenAI stream that stops without a `finish_reason` (and without `[DONE]`),
    an Anthropic stream without `message_stop`, or a body cut inside a character. The retry
    policy sends the request again while nothing of the response has reached the caller;
    after that, the turn ends `run-failed` with this error.

    Attributes:
        provider: which provider's response it was.
        missing: what the response lacked, in words (`"message_stop"`, `"finish_reason"`).
        attempts: how many requests were made.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        missing: str,
        attempts: int = 1,
        state: Any = None,
    ) -> None:
        super().__init__(message, state=state)
        self.provider = provider
        self.missing = missing
        self.attempts = attempts


class ModelHTTPError(RunError):
    """A model provider's API failed, and retrying could not help (or did not).

    Raised at once for a request the provider refuses (400, 401, 403, 404, 422), and after the
    retry policy gave up for one it could not serve (429, 5xx, a connection error, a timeout).
    An error event inside a stream (Anthropic's `overloaded_error`, the Responses API's
    `response.failed` or `error`; `status` None) is such a failure too, and is not retried
    once the stream has produced output: its partial text stays in the history and the run
    fails with this error. A stream whose body is cut or ends early is an
    `IncompleteResponseError` instead.

    Attributes:
        status: the HTTP status, or `None` when no response came (connection error, timeout).
        provider: which provider failed (`openai`, `anthropic`, `openai-compatible`,
            `openai-responses`).
        request_id: the provider's id for the request, to quote to its support.
        message: what the provider said, verbatim.
        attempts: how many requests were made.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None,
        provider: str,
        request_id: str | None = None,
        attempts: int = 1,
        state: Any = None,
    ) -> None:
        what = f"HTTP {status}" if status is not None else "no response"
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        request = f" (request id {request_id})" if request_id else ""
        super().__init__(f"{provider}: {what}{tries}: {message}{request}", state=state)
        self.status = status
        self.provider = provider
        self.request_id = request_id
        self.message = message
        self.attempts = attempts


class StaleResolutionError(RunError):
    """A decision for a call that is not pending: unknown, already decided, or expired.

    Nothing changed: a tool is never run twice, however often it is resolved.

    Attributes:
        tool_call_id: the call the decision was for.
    """

    def __init__(self, message: str, *, tool_call_id: str) -> None:
        super().__init__(message)
        self.tool_call_id = tool_call_id


class ArgumentsChangedError(StaleResolutionError):
    """A decision made on arguments that are no longer the call's current ones.

    Another approver amended the call (a new proposal) after the decider looked at it, or the
    decision named no digest and the arguments are no longer the model's proposal. Nothing
    was recorded: look at the card again (its `args`, `changes` and `digest`) and decide on
    what it shows now.

    Attributes:
        tool_call_id: the call the decision was for.
        digest: the digest of the call's current arguments (name it to decide on them).
        current_args: the call's current arguments.
    """

    def __init__(
        self, message: str, *, tool_call_id: str, digest: str, current_args: dict[str, Any]
    ) -> None:
        super().__init__(message, tool_call_id=tool_call_id)
        self.digest = digest
        self.current_args = current_args


class DecisionNotAllowedError(RunError):
    """A decision the call's policy does not allow this decider; nothing was recorded.

    The message names the rule broken: a role the decider lacks, four eyes (the requester may
    not approve their own call), an approval the same person already gave, or a call without
    a policy that only its requester decides (`handrail.policy`).

    Attributes:
        tool_name: the tool whose policy refused the decision.
    """

    def __init__(self, message: str, *, tool_name: str) -> None:
        super().__init__(message)
        self.tool_name = tool_name


class SessionBusyError(RunError):
    """Another run is driving the session (or resuming its suspended turn) right now.

    Nothing changed. Wait for that run's events, or try again once it has ended.
    """


class MaxIterationsError(RunError):
    """An iteration cap was reached where the run cannot end with a message."""


class StoreError(RunError):
    """A session store failed, or holds something it cannot read (the message names the fix).

    Attributes:
        session_id: the session concerned, when there is one.
    """

    def __init__(self, message: str, *, session_id: str | None = None, state: Any = None) -> None:
        super().__init__(message, state=state)
        self.session_id = session_id


class SessionCorruptError(StoreError):
    """A stored session (or one of its log rows) that this handrail cannot read.

    The row is left as it is. The message names the session and the fix: restore it from a
    backup or an export, or delete it (deleting never needs to read it).
    """


class RoutingError(StoreError):
    """A `PartitionedStore` cannot tell which partition a call belongs to; nothing was written.

    Its routing function raised or named no partition for the organisation, a session id to
    write names no partition (and the store has no `default`), or a session's id places it in
    another partition than its organisation's route (a session never moves between
    partitions). The message names the organisation or session and the fix.

    Attributes:
        session_id: the session concerned, when there is one.
        org_id: the organisation that was routed, when there is one.
        key: the partition the route or the id named, when there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        org_id: str | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__(message, session_id=session_id)
        self.org_id = org_id
        self.key = key


class StoreUnavailableError(StoreError):
    """The store could not be reached, or was too busy to answer: the same call may work later.

    A dropped or refused connection (PostgreSQL's `OperationalError`: a restart, a network
    cut, a terminated backend, an exhausted pool), or a SQLite database locked by another
    process past `busy_timeout`. The stores raise it for exactly these (a refused save, a
    `ConflictError`, an unreadable row are other `StoreError`s, never retried).

    An `Engine` retries it with a back-off (`Engine(store_retry=...)`); when the store stays
    away, the turn is left as a crash at that point leaves it, and this error (naming the
    session) reaches the caller: `engine.advance` (or a `Worker`) finishes the turn once the
    store answers again (see durability.md, "What a store fault does").

    Attributes:
        session_id: the session concerned, when there is one.
        attempts: how many times the engine tried before giving up (1: not retried).
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        attempts: int = 1,
        state: Any = None,
    ) -> None:
        super().__init__(message, session_id=session_id, state=state)
        self.attempts = attempts


class UnsettledSaveError(StoreError):
    """A save refused: it would mark a session `completed` or `failed` while calls still wait.

    A session's undecided cards (approvals, answers, client calls, recovery cards) are calls
    somebody must still settle; a finished session is never driven again, so they would be
    stranded. Nothing was written. It is an engine's bug (or a hand-made record): save the
    session `suspended` (or `active`, for a turn left for recovery) until its cards are
    decided.

    Attributes:
        session_id: the session that was saved.
        status: the status the save asked for.
        pending: the tool call ids of the undecided cards.
    """

    def __init__(self, session_id: str, *, status: str, pending: tuple[str, ...]) -> None:
        super().__init__(
            f"Session {session_id!r} cannot be saved {status!r}: call(s) {', '.join(pending)} "
            f"still wait for a decision (undecided cards), and a {status} session is never "
            f"driven again. Nothing was written: save it 'suspended' until they are decided.",
            session_id=session_id,
        )
        self.status = status
        self.pending = pending


class ConflictError(StoreError):
    """A compare-and-swap save lost: the stored version is not the one the caller loaded.

    Nothing was written. Load the session again, reapply the change, and save that.

    Attributes:
        session_id: the session that was saved.
        expected: the version the caller's record had (0: the session must not exist yet).
        actual: the version in the store, or `None` if the session does not exist.
    """

    def __init__(self, session_id: str, *, expected: int, actual: int | None) -> None:
        if actual is None:
            what = f"was deleted (the save expected version {expected})"
        elif expected == 0:
            what = f"already exists (at version {actual}), so it cannot be created"
        else:
            what = f"was saved by someone else: expected version {expected}, found {actual}"
        super().__init__(
            f"Session {session_id!r} {what}. Nothing was written: load it again, reapply the "
            f"change and save that.",
            session_id=session_id,
        )
        self.expected = expected
        self.actual = actual


class DocumentError(HandrailError):
    """`handrail.documents` could not ingest, embed or index something."""


class DocumentLoadError(DocumentError):
    """A file that is unsupported or cannot be read; the rest of a batch goes on.

    Attributes:
        source: the file (as the batch names it).
    """

    def __init__(self, message: str, *, source: str) -> None:
        super().__init__(message)
        self.source = source


class DocumentIndexError(DocumentError):
    """The embedder or the index failed, or holds something it cannot use (names the fix)."""


class ModelRetry(Exception):
    """Raised by a tool to send `message` back to the model as a recoverable tool error.

    Not a `HandrailError`: it is a signal to the engine, not a failure of the run.

    Args:
        message: what the model reads.
        code: the failed result's `code`, for programs (`"out_of_stock"`); `tool_error` when
            unset.
    """

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class AskPerson(Exception):
    """Raised by a server tool that needs a person's answer before it can finish.

    The call stops and waits, like a `human` tool's: it gets a card of kind `question` with
    `prompt` (an `input-required` event, then `run-suspended`), and the turn suspends once
    the other calls of the response are done. When a person answers (`Answer("...")`, text),
    the tool runs again from the start with the answer in `ctx.answer`; when they decline
    (`Reject`), the call fails with their reason and the model reads it. So raise it before
    any side effect: what ran before it runs again.

    Not a `HandrailError`: it is a signal to the engine, not a failure of the run.

    Args:
        prompt: the question, as the person will read it.
    """

    def __init__(self, prompt: str) -> None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise TypeError("AskPerson needs the question to ask, as a non-empty string")
        super().__init__(prompt)
        self.prompt = prompt
