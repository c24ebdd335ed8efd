"""`RunState`: a session's conversation and everything a run carries between steps.

`RunState.dump()` is the stored form of a session (JSON-compatible, with a `schema_version`);
`RunState.load()` rebuilds it, pending cards and their decisions included, so a suspended
run resumes after a restart exactly where it stopped. A store keeps the messages apart from
the rest (`dump(messages=False)`, `dump_messages`): a save writes the messages that changed,
and a load may start at a window of the history (`RunState.base`).

Schema versions:
    1: messages, context store, usage, turn counters, dedup and cache, pending progress;
       later (still 1: the new keys are optional) scratch messages, route, domain state,
       compaction summary, the capture counter, the suspended turn's span (`progress.trace`).
    2: the messages may be stored apart (no `messages` key: they are given to `load`, from
       position `base` on); `turn_start` says where the turn in progress began. A version 1
       state loads as version 2, its messages all to be written again. Later (still 2: the
       key is optional) `scratch_at`, where each agent's scratch goes when the turn ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal, NotRequired

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

from ._tool_result import ToolResult
from .context import ContextStore
from .exceptions import UserError
from .messages import MESSAGES, ApprovalCardPart, Message, TextPart, ToolCallPart
from .models import Usage

__all__ = ["Failure", "Progress", "RouteChoice", "RunState", "Summary"]

SCHEMA_VERSION = 2


@dataclass(kw_only=True, slots=True)
class Summary:
    """A compaction summary of the start of a conversation: stored with the session.

    Written by `handrail.compaction` (which exports it too); part of the state, so the state
    does not depend on how it is made.

    JSON in and out with `pydantic.TypeAdapter(Summary)` (or inside the session's own adapter).
    """

    text: str
    """The summary, as the summarizer wrote it."""
    upto: str
    """The id of the last message it covers (the message just before a user turn)."""
    messages: int
    """How many messages it covers: the first `messages` of the history."""
    tokens: int
    """Its size in tokens, for the model it was written for."""
    kept: list[str] = field(default_factory=list)
    """The outputs of never-evicted tools (`Retention(evict=False)`) from the turns it
    covers, each as `name(args): text the model read`: the view shows them after the
    summary, word for word."""


@dataclass(kw_only=True, slots=True)
class Progress:
    """Where a turn in flight is: it resumes exactly there after a suspension or a crash."""

    agent: str
    """The agent whose loop is running (or suspended)."""
    message_id: str = ""
    """The assistant message whose calls were dispatched last (the turn continues it)."""
    iterations: int = 0
    """Model calls the agent has made this turn."""
    calls_made: int = 0
    """Tool calls the agent had made this turn (for `min_tool_calls`)."""
    nudged: bool = False
    """Whether the `min_tool_calls` nudge was already sent."""
    retried_output: bool = False
    """Whether invalid structured output was already sent back once."""
    route: list[str] | None = None
    """The agents of the turn's route, when an engine runs one."""
    step: int = 0
    """The index of `agent` in `route`."""
    status: Literal["running", "suspended"] = "running"
    """`running` while a worker drives the turn (still so after a crash: the turn is then
    recovered), `suspended` while it waits for decisions or for its resumption."""
    trace: str = ""
    """The suspended turn's span as a W3C `traceparent`, when it was traced: the trace of its
    resumption links to it (`handrail.tracing`)."""


@dataclass(kw_only=True, slots=True)
class Failure:
    """Why the session's last turn failed (`run-failed` with reason `error`)."""

    error_type: str
    """The class of the exception that failed it (`ModelHTTPError`). What it said stays in
    the operator's log, under `reference`: it may quote a key, a host or the system prompt,
    and a session's stored form is exported and handed around."""
    reference: str
    """The reference the failure is logged under, with its traceback (the user was shown it)."""
    at: float
    """When, in seconds since the epoch."""


@dataclass(kw_only=True, slots=True)
class RouteChoice:
    """Which route a turn took, and why."""

    route: str
    """The route's name."""
    reason: str = ""
    """The supervisor's reason, or why the default route was taken instead."""
    hints: dict[str, str] = field(default_factory=dict)
    """Agent name -> the supervisor's note for that agent (it reads it before it starts)."""
    fallback: bool = False
    """The supervisor's output did not parse or named an unknown route: the default was used."""


@dataclass(kw_only=True, slots=True)
class RunState:
    """The state a run reads and changes: what a session stores between turns.

    `run_agent` changes it in place and hands it back in its result.
    """

    messages: list[Message] = field(default_factory=list)
    """The conversation: the session's whole history, or, loaded from a store with a
    compaction summary, the part of it from position `base` on."""
    base: int = 0
    """The position in the session's history of `messages[0]`: the messages before it are
    stored but not loaded (the compaction `summary` stands for them). Positions, like
    `Summary.messages`, count from the start of the history."""
    turn_start: int = 0
    """The position of the first message of the turn in progress (or of the last turn): a
    message before it is never changed again, so a save need not write it."""
    clean: int = 0
    """Messages at positions below this one are stored as they are in `messages`: the next
    save writes the messages from here on (not stored; set by `load` and `mark_saved`)."""
    context: ContextStore = field(default_factory=ContextStore)
    """The context store (`var:` persists across turns; `tool:`/`call:` is this turn's)."""
    usage: Usage = field(default_factory=Usage)
    """What the session's model calls have cost."""
    session_id: str | None = None
    """The session, when there is one."""
    org_id: str | None = None
    """The caller's organisation: scope comes from the session, never from the model."""
    user_id: str | None = None
    """The caller."""
    roles: frozenset[str] = field(default_factory=frozenset)
    """The caller's roles, as the latest turn was given them (`Engine.submit(roles=...)`):
    what `tools_for` chooses the turn's tools from; stored, so a resumed turn keeps them."""
    run_id: str = ""
    """The current run."""
    turn: int = 0
    """How many user turns the session has had."""
    turn_iterations: int = 0
    """Model calls made this turn, across agents (the per-turn cap counts these)."""
    approvals: int = 0
    """Calls that asked for approval this turn (`max_approvals_per_turn` counts these)."""
    turn_calls: dict[str, ToolCallPart] = field(default_factory=dict)
    """This turn's calls by canonical (name, arguments): duplicates reuse their result."""
    tool_cache: dict[str, tuple[float, ToolResult]] = field(default_factory=dict)
    """Idempotent tools' results by canonical call, with their expiry time."""
    scratch: dict[str, list[Message]] = field(default_factory=dict)
    """Agent name -> the messages of this turn that agent keeps out of the conversation
    (`Agent(scratch=True)`, the supervisor): what it saw besides the conversation, what it
    called, what it said before its answer. When the turn ends (not when it suspends) they
    move into `messages` where the agent started its work (`scratch_at`), marked
    `Message.scratch`, so the history reads in the order things happened; a model never
    sees them."""
    scratch_at: dict[str, int] = field(default_factory=dict)
    """Agent name -> the position in the history where its scratch goes when the turn ends:
    where the conversation stood when the agent started. An agent that runs twice in a turn
    keeps its first place (its scratch is one list)."""
    route: RouteChoice | None = None
    """The route this turn took, and why (the supervisor's decision, or the fallback)."""
    summary: Summary | None = None
    """The compaction summary of the start of the conversation (see `handrail.compaction`)."""
    domain_state: Any = None
    """The domain's typed state (`Domain(initial_state=...)`): tools read and change it as
    `ctx.state`; stored with the session as JSON."""
    turn_context: Any = None
    """The per-turn context the application passed with the turn (`submit(context=...)`):
    the page, the record the user is on, the locale. Validated against
    `Domain(context_model=...)` (a dict without one); tools read it as `ctx.turn_context`,
    bindings as `sys:context.<field>`. Stored with the session, so a resumed turn has it;
    the model never sees it unless the application puts it in the instructions."""
    call_ids: set[str] = field(default_factory=set)
    """Every tool call id of the loaded messages: a new call whose id is taken (some servers
    number their calls per response) gets a fresh one, so the tool-call log never mixes two
    calls; when the messages before `base` are not loaded, every new call gets a fresh one.
    Rebuilt by `load`."""
    captures: int = 0
    """How many calls capture mode has recorded in this session: the next one's local index
    (it only grows, so temporary ids never repeat; see `handrail.capture`)."""
    pending: dict[str, ApprovalCardPart] = field(default_factory=dict)
    """The pending map: tool call id -> the card waiting for a decision. An index over the
    undecided cards in `messages` (they are the record), rebuilt by `load`."""
    progress: Progress | None = None
    """Where the turn in flight is (running, or suspended); None between turns."""
    failure: Failure | None = None
    """Why the last turn failed with an error, if it did (cleared when the next one starts):
    what `handrail sessions show` shows, with the reference the user was given."""
    client_connected: bool = False
    """Whether a client that can run `client` tools is attached to this run (not stored:
    set by whoever drives the run). Without one, a client tool fails fast."""

    def sys_values(self, now: float) -> dict[str, Any]:
        """The `sys:` values of the context store for a run starting at `now` (epoch seconds).

        Only the scope that is set is included, so values given to the `ContextStore`
        directly are kept when the state has none.
        """
        scope = {"org_id": self.org_id, "user_id": self.user_id, "session_id": self.session_id}
        values: dict[str, Any] = {k: v for k, v in scope.items() if v is not None}
        values["now"] = datetime.fromtimestamp(now, tz=UTC).isoformat()
        # Always set: a turn without a context never reads the one of a turn before it.
        values["context"] = None if self.turn_context is None else _jsonable(self.turn_context)
        return values

    def new_turn(self) -> None:
        """Start a user turn: clear what is turn-scoped; its messages start at the end.

        A scratch still held from a turn stored before scratch moved when its turn ended goes
        to the history first (see `end_turn`), so nothing is lost.
        """
        self.turn += 1
        self.failure = None
        self.keep_scratch()
        self.turn_start = self.base + len(self.messages)
        self.turn_iterations = 0
        self.approvals = 0
        self.turn_calls.clear()
        self.route = None
        self.context.new_turn()

    def all_messages(self) -> Iterator[Message]:
        """The conversation's messages, then every agent's scratch messages."""
        yield from self.messages
        for messages in self.scratch.values():
            yield from messages

    def find_message(self, message_id: str) -> Message:
        """The latest message (of a scratch list or the conversation) with this id."""
        for messages in (*self.scratch.values(), self.messages):
            for message in reversed(messages):
                if message.id == message_id:
                    return message
        raise KeyError(message_id)

    def end_turn(self) -> None:
        """End a turn: file its scratch; drop what was only for it (its outputs, its dedup).

        A suspended turn keeps them until it ends.
        """
        self.keep_scratch()
        self.progress = None
        self.turn_calls.clear()
        self.context.new_turn()

    def start_scratch(self, agent: str) -> None:
        """Note that `agent` starts work in scratch now: its scratch goes here in the history.

        An agent already noted this turn keeps its place.
        """
        self.scratch_at.setdefault(agent, self.base + len(self.messages))

    def keep_scratch(self) -> None:
        """Move the turn's scratch into the history, each agent's where it started its work.

        The messages are marked `Message.scratch` (people see them; models never do), so the
        history reads in the order things happened: the person's message, the supervisor's
        scratch, each agent of the route in turn (a scratch agent's messages, the next one's
        handoff and messages, ...), the answer. They go at or after the turn's start, so a
        save writes them with the turn's other messages and older rows never change. A
        message also published (a scratch agent's answer, last in its route) stays where it
        was published. A scratch with no place (stored before places were kept) goes last.
        """
        if not self.scratch:
            self.scratch_at.clear()
            return
        end = self.base + len(self.messages)
        start = max(self.base, min(self.turn_start, end))
        published = {m.id for m in self.messages[start - self.base :]}
        moves = sorted(
            (
                (max(start, min(self.scratch_at.get(agent, end), end)), order, messages)
                for order, (agent, messages) in enumerate(self.scratch.items())
            ),
            key=lambda move: (move[0], move[1]),
        )
        for position, _, messages in reversed(moves):  # later places first: earlier stay put
            # Marked copies: a message a model was given stays as it was given.
            kept = [replace(m, scratch=True) for m in messages if m.id not in published]
            index = position - self.base
            self.messages[index:index] = kept
            self.clean = min(self.clean, position)
        self.scratch.clear()
        self.scratch_at.clear()

    @property
    def suspended(self) -> bool:
        """Whether the turn is waiting for decisions or for its resumption."""
        return self.progress is not None and self.progress.status == "suspended"

    @property
    def window(self) -> int:
        """Where a load for a turn may start reading messages.

        The first message after the compaction summary, or the turn in progress's first,
        whichever is earlier.
        """
        covered = self.summary.messages if self.summary is not None else 0
        return max(0, min(covered, self.turn_start, self.base + len(self.messages)))

    def changed_from(self) -> int:
        """The position of the first message a save must write: those before are as stored.

        Messages before the turn in progress never change. Every writer works on the turn's
        own messages: the loop appends them and `_repair` closes the last one; dispatch
        stamps the calls and adds the cards of `progress.message_id`'s message, and so does
        recovery (`reconcile`); a batch card goes on the turn's last message and its report
        on that card; compaction works on copies. Decisions and expiry stamp waiting cards,
        so a card still waiting counts too, wherever it is.
        """
        end = self.base + len(self.messages)
        start = min(self.clean, end)
        waiting = {id(card) for card in self.pending.values()}
        for messages in self.scratch.values():  # stored with the document, not as rows
            waiting.difference_update(
                id(p) for m in messages for p in m.parts if isinstance(p, ApprovalCardPart)
            )
        index = len(self.messages)
        while waiting and index > 0:
            index -= 1
            for part in self.messages[index].parts:
                if id(part) in waiting:
                    waiting.discard(id(part))
                    start = min(start, self.base + index)
        return start

    def mark_saved(self) -> None:
        """Note that the messages are stored as they are now (a store saved them).

        From then on, only the turn in progress's messages may change (none, between turns).
        """
        end = self.base + len(self.messages)
        self.clean = end if self.progress is None else min(end, self.turn_start)

    def dump_messages(self, start: int = 0) -> list[dict[str, Any]]:
        """The messages from position `start` of the history on, as JSON-compatible data.

        Raises:
            UserError: `start` is before `base` (those messages are not loaded).
        """
        if start < self.base:
            raise UserError(
                f"cannot dump messages from position {start}: this state holds them from "
                f"{self.base} on (load the session with its whole history)"
            )
        return MESSAGES.dump_python(self.messages[start - self.base :], mode="json")  # type: ignore[no-any-return]

    def dump(self, *, messages: bool = True) -> dict[str, Any]:
        """The state as JSON-compatible data: the stored form of a session.

        Args:
            messages: include the messages (from `base` on); False: the rest only, the small
                part of a session that changes from step to step (a store keeps the messages
                apart, see `dump_messages`).
        """
        doc: _Doc = {
            "schema_version": SCHEMA_VERSION,
            "base": self.base,
            "turn_start": self.turn_start,
            "context": self.context.dump(),
            "usage": self.usage,
            "session_id": self.session_id,
            "org_id": self.org_id,
            "user_id": self.user_id,
            "roles": sorted(self.roles),
            "run_id": self.run_id,
            "turn": self.turn,
            "turn_iterations": self.turn_iterations,
            "approvals": self.approvals,
            "turn_calls": {key: part.id for key, part in self.turn_calls.items()},
            "tool_cache": [(k, t, r) for k, (t, r) in self.tool_cache.items()],
            "progress": self.progress,
            "scratch": self.scratch,
            "route": self.route,
            "domain_state": self.domain_state,
            "summary": self.summary,
        }
        if self.turn_context is not None:
            doc["turn_context"] = _jsonable(self.turn_context)
        if messages:
            doc["messages"] = self.messages
        if self.captures:
            doc["captures"] = self.captures
        if self.scratch_at:
            doc["scratch_at"] = self.scratch_at
        if self.failure is not None:
            doc["failure"] = self.failure
        return _DOC.dump_python(doc, mode="json")  # type: ignore[no-any-return]

    @classmethod
    def load(
        cls,
        data: dict[str, Any],
        *,
        messages: list[dict[str, Any]] | None = None,
        base: int = 0,
        max_context_bytes: int = 1_000_000,
    ) -> RunState:
        """Rebuild a state from `dump()` output (after a JSON round trip, if any).

        Args:
            data: what `dump` gave: with its messages, or without them (then give them).
            messages: the messages stored apart (`dump_messages`), from position `base` on;
                empty when `data` holds them (a version 1 state always does).
            base: the position in the history of `messages[0]`.
            max_context_bytes: the context store's size cap.

        Raises:
            UserError: `data` is not a dumped state, or was written by a newer handrail.
        """
        version = data.get("schema_version") if isinstance(data, dict) else None
        if version not in (1, SCHEMA_VERSION):
            newer = isinstance(version, int) and version > SCHEMA_VERSION
            raise UserError(
                f"cannot load a session state with schema_version={version!r}: this handrail "
                f"reads versions 1 to {SCHEMA_VERSION}" + ("; upgrade handrail" if newer else "")
            )
        inline = "messages" in data
        if inline and messages:
            raise UserError(
                "not a stored session state: its messages are both in the document and "
                "given apart (messages=): give them one way"
            )
        if inline:
            base = data.get("base", 0) if version == SCHEMA_VERSION else 0
        try:
            doc = _DOC.validate_python(data)
            loaded = doc["messages"] if inline else MESSAGES.validate_python(messages or [])
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            loc = list(first["loc"])
            if "messages" not in data and loc and isinstance(loc[0], int):
                loc = ["messages", base + loc[0], *loc[1:]]  # a message stored apart
            where = ".".join(str(p) for p in loc)
            more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
            raise UserError(
                f"not a stored session state: at {where}: {first['msg']}{more}"
            ) from None
        if not isinstance(base, int) or base < 0:
            raise UserError(f"not a stored session state: base={base!r}")
        end = base + len(loaded)
        if version == 1:  # migrated: the turn in progress began at the last person's message
            starts = [i for i, m in enumerate(loaded) if _starts_turn(m)]
            turn_start = starts[-1] if starts else 0
        else:
            turn_start = min(doc.get("turn_start", 0), end)
        state = cls(
            messages=loaded,
            base=base,
            turn_start=turn_start,
            context=ContextStore.load(doc["context"], max_bytes=max_context_bytes),
            usage=doc["usage"],
            session_id=doc["session_id"],
            org_id=doc["org_id"],
            user_id=doc["user_id"],
            roles=frozenset(doc.get("roles", ())),
            run_id=doc["run_id"],
            turn=doc["turn"],
            turn_iterations=doc["turn_iterations"],
            approvals=doc["approvals"],
            tool_cache={k: (t, r) for k, t, r in doc["tool_cache"]},
            progress=doc["progress"],
            scratch=doc.get("scratch", {}),
            scratch_at=doc.get("scratch_at", {}),
            route=doc.get("route"),
            domain_state=doc.get("domain_state"),
            turn_context=doc.get("turn_context"),
            summary=doc.get("summary"),
            captures=doc.get("captures", 0),
            failure=doc.get("failure"),
        )
        if inline:  # messages that came inside the document are all to be written
            state.clean = base
        else:
            state.mark_saved()
        parts = {
            p.id: p for m in state.all_messages() for p in m.parts if isinstance(p, ToolCallPart)
        }
        state.call_ids = set(parts)
        state.turn_calls = {
            key: parts[call_id] for key, call_id in doc["turn_calls"].items() if call_id in parts
        }
        state.pending = _undecided(state.all_messages())
        return state


def _starts_turn(message: Message) -> bool:
    """A person's message (not the engine's synthetic one) opens a user turn."""
    return message.role == "user" and any(
        isinstance(p, TextPart) and not p.synthetic for p in message.parts
    )


def _undecided(messages: Iterable[Message]) -> dict[str, ApprovalCardPart]:
    pending: dict[str, ApprovalCardPart] = {}
    for message in messages:
        for part in message.parts:
            if isinstance(part, ApprovalCardPart):
                if part.decision is None:
                    pending[part.tool_call_id] = part
                else:
                    pending.pop(part.tool_call_id, None)
    return pending


class _Doc(TypedDict):
    schema_version: int
    base: NotRequired[int]
    turn_start: NotRequired[int]
    messages: NotRequired[list[Message]]
    context: dict[str, Any]
    usage: Usage
    session_id: str | None
    org_id: str | None
    user_id: str | None
    roles: NotRequired[list[str]]
    run_id: str
    turn: int
    turn_iterations: int
    approvals: int
    turn_calls: dict[str, str]
    tool_cache: list[tuple[str, float, ToolResult]]
    progress: Progress | None
    scratch: NotRequired[dict[str, list[Message]]]
    scratch_at: NotRequired[dict[str, int]]
    route: NotRequired[RouteChoice | None]
    domain_state: NotRequired[Any]
    turn_context: NotRequired[Any]
    summary: NotRequired[Summary | None]
    captures: NotRequired[int]
    failure: NotRequired[Failure]


_DOC: TypeAdapter[_Doc] = TypeAdapter(_Doc)

_ANY: TypeAdapter[Any] = TypeAdapter(Any)


def _jsonable(value: Any) -> Any:
    """A per-turn context (a pydantic model, a dict) as JSON-compatible data."""
    return _ANY.dump_python(value, mode="json")
