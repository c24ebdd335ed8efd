"""Compaction: the view of a long conversation that fits a model's token budget.

Before a model call, `compact` measures the request (instructions, tool schemas, structured
output schema and messages, with the real tokenizer of `handrail.tokens`). Under budget, the
messages go out as they are, not even copied. Over budget, the model gets a *view*, built in
two steps, each tried only when the previous one is not enough:

1. **Prune** what is stale, outside the current turn: reasoning from earlier turns, and big
   tool outputs older than their tool's retention, shown as their `ToolResult.summary` line.
2. **Summarise**: the oldest user turns are folded into a `Summary`, written by a
   summarizer model call over the dropped messages and the previous summary (a backlog too
   big for one request is folded in a few). The view is then `[summary, recent turns]` (the
   instructions stay the system prompt). The summary is incremental: a stored summary covers
   the history up to `Summary.upto`, and only what follows it is ever summarised.

The stored history is never changed: a pruned message is a copy, and the current turn is
passed through as the very same objects. A tool call cannot be separated from its result
(they are one part), every cut falls at the start of a user turn, and a call still waiting
for a decision pins its turn in the view. The summarizer reads a plain-text transcript, so
no provider rule constrains what it is given.

Summarising everything older than `keep_recent_turns` at once (not just enough to fit) leaves
room for the turns to come, so a long session calls the summarizer once every so many turns,
not before every model call.
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .exceptions import ConfigError, ModelError
from .messages import ApprovalCardPart, Message, Part, ReasoningPart, TextPart, ToolCallPart
from .models import Model, ModelRequest, ModelResponse, ToolDefinition, Usage
from .models._openai_format import tool_arguments
from .models._wire import result_text
from .state import Summary
from .tokens import count_text, count_tokens

__all__ = [
    "KEPT_HEADING",
    "SUMMARIZER_INSTRUCTIONS",
    "SUMMARY_HEADING",
    "Compacted",
    "Compaction",
    "Retention",
    "Summary",
    "compact",
]

SUMMARIZER_INSTRUCTIONS = """\
You compact a conversation between a user and an AI assistant that uses tools. Your summary \
replaces the earlier part of the conversation: the assistant continues from your summary and \
the most recent messages alone, so keep everything it will need.

Keep: what the user wants, asked for and prefers; facts learned, with ids, names, amounts, \
dates and statuses exactly as written; what the assistant did and what each action returned \
(what was changed, sent, refunded or booked, and what failed); decisions made and by whom; \
open questions and what remains to be done.
Leave out greetings, repetition, and the reasoning that led to an answer.

When a summary so far is given, merge the new messages into it and return one summary of the \
whole conversation. Write plain, concise text in the conversation's language; no preamble."""
"""The summarizer's default instructions (its system prompt)."""

SUMMARY_HEADING = "Summary of the earlier conversation, which was compacted to save space:"
"""The first line of the synthetic user message that carries the summary in the view."""

KEPT_HEADING = "Tool outputs from the earlier conversation, kept word for word:"
"""The heading of the never-evicted outputs the summary message carries after the summary."""

_OUTPUT_TOOL = "final_output"  # a structured-output schema costs about what a tool does
_PROMPT_FRAMING = 32  # tokens of the summarizer prompt's headings and tags
_CLIPPED = " [... clipped: {} tokens in all]"
_UNSETTLED = frozenset({"pending", "running", "waiting"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Retention:
    """How long one tool's big outputs stay in full: by age, by count, or for good.

    An output is shortened to its summary line once it is older than `turns` turns, or once
    it is not among the tool's `last` most recent outputs (the current turn's count too):
    whichever comes first of those given. Neither given: in full until it is summarised.

    Raises:
        ConfigError: a negative number, or `evict=False` with a limit.
    """

    turns: int | None = None
    """The age: turns before the current one an output stays in full (0: only the current
    turn's)."""
    last: int | None = None
    """The count: only the tool's `last` most recent outputs stay in full."""
    evict: bool = True
    """False: the tool's outputs are never shortened, whatever their age or number, and
    when their turn is summarised the summary keeps them word for word (`Summary.kept`)."""

    def __post_init__(self) -> None:
        for name, value in (("turns", self.turns), ("last", self.last)):
            if value is not None and value < 0:
                raise ConfigError(f"Retention({name}={value}): it cannot be negative.")
        if not self.evict and (self.turns is not None or self.last is not None):
            raise ConfigError("Retention(evict=False): an output never evicted has no limits.")

    def expired(self, age: int, rank: int) -> bool:
        """Whether an output is past this retention.

        `age`: the turns back it is; `rank`: 0 for its tool's latest output, 1 for the one
        before, ...
        """
        if not self.evict:
            return False
        return (self.turns is not None and age > self.turns) or (
            self.last is not None and rank >= self.last
        )


@dataclass(kw_only=True, slots=True)
class Compaction:
    """How a conversation is compacted to fit a model's token budget.

    Raises:
        ConfigError: a number is out of range.
    """

    max_tokens: int
    """The budget of a whole request: instructions, tool schemas and messages. Leave a margin
    under the model's context window for its answer (and for the approximation of Anthropic
    counts, see `handrail.tokens`)."""
    keep_recent_turns: int = 2
    """User turns (the current one included) kept as messages when older ones are summarised.
    When they alone do not fit the budget, the oldest of them are summarised too, one turn at
    a time; the current turn never is (0 and 1 both keep just the current turn)."""
    summarizer: Model | None = None
    """The model that writes summaries; None: the model the request is for. Its requests are
    kept within `max_tokens` too, as long as the summary so far leaves room: a long backlog
    is folded in over several calls, and a single message too big for one is clipped."""
    tool_retention: int | None = 1
    """Turns a big tool output stays in full: an output from a turn more than this many turns
    before the current one (0: any earlier turn) is shown as its `ToolResult.summary` line.
    None keeps outputs in full until they are summarised."""
    retention_by_tool: Mapping[str, int | Retention | None] = field(default_factory=dict)
    """`tool_retention` for particular tools, by name: turns (None: in full until
    summarised), or a `Retention` (an age and a count, or never evicted)."""
    big_output_tokens: int = 200
    """Only outputs of more tokens than this are ever replaced by their summary line."""
    instructions: str = SUMMARIZER_INSTRUCTIONS
    """The summarizer's system prompt."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ConfigError(f"Compaction(max_tokens={self.max_tokens}): give a positive budget.")
        checks = {
            "keep_recent_turns": self.keep_recent_turns,
            "big_output_tokens": self.big_output_tokens,
            "tool_retention": self.tool_retention,
            **{
                f"retention_by_tool[{k!r}]": v
                for k, v in self.retention_by_tool.items()
                if not isinstance(v, Retention)
            },
        }
        for name, value in checks.items():
            if value is not None and value < 0:
                raise ConfigError(f"Compaction({name}={value}): it cannot be negative.")
        if not self.instructions.strip():
            raise ConfigError("Compaction(instructions=''): the summarizer needs instructions.")


@dataclass(kw_only=True, slots=True)
class Compacted:
    """What `compact` hands back: the messages to send, and the summary to store."""

    messages: list[Message]
    """The view to send as `ModelRequest.messages`: the request's own list when it fit."""
    summary: Summary | None
    """The summary to store in the session: the one given unless a new one was written."""
    tokens: int
    """The tokens of the request with this view."""
    over_budget: bool = False
    """The view is still over `max_tokens`: what had to be kept (the current turn, calls
    waiting for a decision, the summary) does not fit, or the summarizer failed (`error`).
    The view is the smallest one possible then; sending it may fail at the provider."""
    usage: Usage = field(default_factory=Usage)
    """What the summarizer calls cost (add it to the session's usage)."""
    error: Exception | None = None
    """The summarizer's failure, when it failed: nothing was summarised by the failed call,
    the view falls back to the last summary that was written, and `over_budget` is set."""


async def compact(
    request: ModelRequest,
    *,
    config: Compaction,
    model: Model,
    summary: Summary | None = None,
    base: int = 0,
) -> Compacted:
    """The view of `request.messages` that fits `config.max_tokens`, summarising when needed.

    Args:
        request: the request about to be sent; its messages are the whole stored history.
            Nothing in it is changed.
        config: the budget and the rules.
        model: the model the request is for: tokens are counted for it (by its name, see
            `handrail.tokens.count_tokens`), and it writes the summary unless
            `config.summarizer` is set.
        summary: the summary stored with the session, if any (from an earlier `compact`).
        base: the position in the history of `request.messages[0]`: a session loaded from
            its summary on (`RunState.base`) holds no messages before it. `Summary.messages`
            counts from the start of the history whatever the base.

    Returns:
        The messages to send and the summary to store. A summarizer that fails is not an
        error here: the view falls back to the last good summary, and `error` says why.

    Raises:
        ImportError: the tokenizer is not installed (`pip install "handrail[tokens]"`).
    """
    messages = request.messages
    tools = list(request.tools)
    if request.output_schema is not None:
        tools.append(
            ToolDefinition(name=_OUTPUT_TOOL, description="", parameters=request.output_schema)
        )

    def count(view: list[Message]) -> int:
        return count_tokens(view, model, instructions=request.instructions, tools=tools)

    start = 0 if summary is None else _after(messages, summary, base)
    # Without the messages before `base`, the summary stands for them: never dropped.
    tokens = None if base else _whole(messages, start or 0, count, config.max_tokens)
    if tokens is not None:
        return Compacted(messages=messages, summary=summary, tokens=tokens)
    if start is None and base:  # cannot be placed, but stands for what is not loaded
        start = 0
    if start is None:  # the history no longer holds what it covered: summarise afresh
        summary, start = None, 0

    turns = _Turns(messages, start, config, model)
    view = turns.view(start, summary)
    tokens = count(view)
    if tokens <= config.max_tokens:
        return Compacted(messages=view, summary=summary, tokens=tokens)

    cuts = turns.cuts(config.keep_recent_turns)
    if not cuts:  # nothing more may be summarised
        return Compacted(messages=view, summary=summary, tokens=tokens, over_budget=True)
    # Start at the first cut whose view fits with the summary so far standing in for the new
    # one: one fold, usually. Should the new summary not leave room, one more turn is folded.
    first = next(
        (
            i
            for i, cut in enumerate(cuts[:-1])
            if count(turns.view(cut, summary)) <= config.max_tokens
        ),
        len(cuts) - 1,
    )
    summarizer = config.summarizer if config.summarizer is not None else model
    usage = Usage()
    for cut in cuts[first:]:
        try:
            text = await _summarise(summarizer, config, model, summary, messages[start:cut], usage)
        except _SummarizerFailed as failed:
            return Compacted(
                messages=view,
                summary=summary,
                tokens=tokens,
                over_budget=True,
                usage=usage,
                error=failed.error,
            )
        summary = Summary(
            text=text,
            upto=messages[cut - 1].id,
            messages=base + cut,
            tokens=count_text(text, model),
            kept=[
                *(summary.kept if summary is not None else []),
                *_kept(messages[start:cut], config),
            ],
        )
        start = cut
        view = turns.view(start, summary)
        tokens = count(view)
        if tokens <= config.max_tokens:
            break
    return Compacted(
        messages=view,
        summary=summary,
        tokens=tokens,
        over_budget=tokens > config.max_tokens,
        usage=usage,
    )


class _Turns:
    """The user turns of a history from `start` on: where the view may be cut, and pruned copies.

    What the stored summary covers (before `start`) is out of play.
    """

    __slots__ = (
        "_config",
        "_model",
        "_pruned",
        "current",
        "messages",
        "pinned",
        "ranks",
        "start",
        "starts",
    )

    def __init__(
        self, messages: list[Message], start: int, config: Compaction, model: Model
    ) -> None:
        self.messages = messages
        self.start = start
        tail = range(start, len(messages))
        self.starts = [i for i in tail if _starts_turn(messages[i])]
        # From the current turn's start on, the view is the history itself.
        self.current = self.starts[-1] if self.starts else start
        # No cut may pass a call still waiting for a decision.
        self.pinned = next((i for i in tail if _unsettled(messages[i])), len(messages))
        self._config = config
        self._model = model
        self._pruned: dict[int, Message] = {}
        # Each output's rank among its tool's, the latest first (for `Retention.last`).
        self.ranks: dict[int, int] = {}
        seen: dict[str, int] = {}
        for message in reversed(messages):
            for part in reversed(message.tool_calls):
                self.ranks[id(part)] = seen.get(part.name, 0)
                seen[part.name] = seen.get(part.name, 0) + 1

    def cuts(self, keep: int) -> list[int]:
        """Where the view may start, earliest first: each one a turn's start.

        The first is the start of the `keep`-th most recent turn (or the latest cut a pinned
        message allows); the later ones give up recent turns, down to the current one.
        """
        last = min(self.current, self.pinned)
        ordered = [s for s in self.starts if self.start < s <= last]
        if not ordered:
            return []
        preferred = self.starts[max(len(self.starts) - max(keep, 1), 0)]
        first = next((i for i, s in enumerate(ordered) if s >= preferred), len(ordered) - 1)
        return ordered[first:]

    def view(self, start: int, summary: Summary | None) -> list[Message]:
        """`[summary]`, the messages from `start` to the current turn pruned, the current turn."""
        view = [_summary_message(summary)] if summary is not None else []
        view.extend(self._prune(i) for i in range(start, self.current))
        view.extend(self.messages[self.current :])
        return view

    def _prune(self, index: int) -> Message:
        pruned = self._pruned.get(index)
        if pruned is None:
            age = len(self.starts) - bisect.bisect_right(self.starts, index)
            pruned = self._pruned[index] = _pruned(
                self.messages[index], age, self._config, self._model, self.ranks
            )
        return pruned


def _whole(
    messages: list[Message], start: int, count: Callable[[list[Message]], int], budget: int
) -> int | None:
    """The tokens of the whole request when they are within `budget`, else None.

    A history is counted whole unless part of it is summarised: then the part after the
    summary is counted first, and ever longer suffixes after it, until one is over budget or
    the suffix is the whole history. Any suffix costs at most what the whole does, so a long
    session is never counted much past its budget.
    """
    step = max(len(messages) - start, 1)
    while True:
        tokens = count(messages[start:])
        if tokens > budget:
            return None
        if start == 0:
            return tokens
        start = max(start - step, 0)
        step *= 2


def _after(messages: list[Message], summary: Summary, base: int = 0) -> int | None:
    """Where the history (from position `base` on) goes on after `summary` (None: no fit)."""
    n = summary.messages - base
    if base and n == 0:  # loaded from the summary on: what it covers is not here to check
        return 0 if messages and _starts_turn(messages[0]) else None
    if not (0 < n <= len(messages) and messages[n - 1].id == summary.upto):
        ids = [m.id for m in messages]
        n = ids.index(summary.upto) + 1 if summary.upto in ids else 0
    # A summary ends where a user turn starts (and never covers the current one).
    return n if 0 < n < len(messages) and _starts_turn(messages[n]) else None


def _starts_turn(message: Message) -> bool:
    """A person's message (not the engine's synthetic one) opens a user turn."""
    return message.role == "user" and any(
        isinstance(p, TextPart) and not p.synthetic for p in message.parts
    )


def _unsettled(message: Message) -> bool:
    return any(
        (isinstance(p, ToolCallPart) and p.status in _UNSETTLED)
        or (isinstance(p, ApprovalCardPart) and p.decision is None)
        for p in message.parts
    )


def _pruned(
    message: Message, age: int, config: Compaction, model: Model, ranks: Mapping[int, int]
) -> Message:
    """`message` without its reasoning and with its expired big outputs shortened (a copy)."""
    parts: list[Part] = []
    for part in message.parts:
        if isinstance(part, ReasoningPart):
            continue
        if isinstance(part, ToolCallPart):
            part = _shortened(part, age, config, model, ranks.get(id(part), 0)) or part
        parts.append(part)
    if len(parts) == len(message.parts) and all(map(operator.is_, parts, message.parts)):
        return message
    return dataclasses.replace(message, parts=parts)


def _shortened(
    part: ToolCallPart, age: int, config: Compaction, model: Model, rank: int = 0
) -> ToolCallPart | None:
    """A copy of `part` whose output is its summary line, when retention says so."""
    result = part.result
    if result is None or part.status in _UNSETTLED:
        return None
    retention = config.retention_by_tool.get(part.name, config.tool_retention)
    if not isinstance(retention, Retention):
        retention = Retention(turns=retention)
    if not retention.expired(age, rank):
        return None
    text = result.model_text()
    tokens = count_text(text, model)
    if tokens <= config.big_output_tokens:
        return None
    note = f"[output of {tokens} tokens dropped]"
    # The first line only: a failure's summary is its whole error, which may be long.
    headline = result.summary.strip().partition("\n")[0] if result.summary else ""
    line = f"{headline} {note}" if headline else note
    if len(line) >= len(text):  # a summary line as long as the output saves nothing
        return None
    if result.ok:
        short = dataclasses.replace(result, data=None, markdown=line)
    else:
        short = dataclasses.replace(result, data=None, error=line)
    return dataclasses.replace(part, result=short)


def _kept(messages: list[Message], config: Compaction) -> list[str]:
    """The outputs of never-evicted tools in `messages`, as the summary keeps them."""
    kept = []
    for message in messages:
        for part in message.tool_calls:
            retention = config.retention_by_tool.get(part.name)
            if isinstance(retention, Retention) and not retention.evict and part.result:
                kept.append(f"{part.name}({tool_arguments(part)}): {part.result.model_text()}")
    return kept


def _summary_message(summary: Summary) -> Message:
    text = f"{SUMMARY_HEADING}\n\n{summary.text}"
    if summary.kept:
        text += f"\n\n{KEPT_HEADING}\n" + "\n".join(f"- {line}" for line in summary.kept)
    return Message(
        id=f"summary-{summary.upto}", role="user", parts=[TextPart(text=text, synthetic=True)]
    )


class _SummarizerFailed(Exception):
    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


async def _summarise(
    summarizer: Model,
    config: Compaction,
    model: Model,
    summary: Summary | None,
    dropped: Sequence[Message],
    usage: Usage,
) -> str:
    """The summary so far with `dropped` folded in: one call, or one per chunk that fits."""
    text = summary.text if summary is not None else None
    lines = [line for line in map(_transcript, dropped) if line]
    sizes = [count_text(line, model) for line in lines]
    overhead = count_text(config.instructions, model) + _PROMPT_FRAMING
    i = 0
    while True:
        used = overhead + (count_text(text, model) if text is not None else 0)
        room = max(config.max_tokens - used, config.max_tokens // 4)
        chunk: list[str] = []
        size = 0
        while i < len(lines):
            if chunk and size + sizes[i] > room:
                break
            line = lines[i] if sizes[i] <= room else _clip(lines[i], sizes[i], room, model)
            chunk.append(line)
            size += min(sizes[i], room)
            i += 1
        text = await _ask(summarizer, config.instructions, _prompt(text, chunk), usage)
        if i == len(lines):
            return text


_SPEAKERS = {"user": "User", "assistant": "Assistant", "system": "System"}


def _transcript(message: Message) -> str:
    """A message as the summarizer reads it: its text and its calls with their results."""
    speaker = _SPEAKERS[message.role]
    lines: list[str] = []
    for part in message.parts:
        if isinstance(part, TextPart) and part.text:
            lines.append(f"{speaker}{' (automatic)' if part.synthetic else ''}: {part.text}")
        elif isinstance(part, ToolCallPart):
            text, _ = result_text(part)
            lines.append(f"Tool call {part.name}({tool_arguments(part)}) returned: {text}")
    return "\n".join(lines)


def _clip(line: str, tokens: int, limit: int, model: Model) -> str:
    """The start of a transcript line too big for one summarizer request."""
    marker = _CLIPPED.format(tokens)
    keep = len(line) * limit // tokens
    while keep and count_text(line[:keep] + marker, model) > limit:
        keep = keep * 9 // 10
    return line[:keep] + marker


def _prompt(summary: str | None, chunk: list[str]) -> str:
    messages = "\n".join(chunk) or "(none)"
    if summary is None:
        return f"<conversation>\n{messages}\n</conversation>"
    return (
        f"<summary-so-far>\n{summary}\n</summary-so-far>\n\n"
        f"<new-messages>\n{messages}\n</new-messages>"
    )


async def _ask(summarizer: Model, instructions: str, prompt: str, usage: Usage) -> str:
    request = ModelRequest(
        agent="compaction",
        instructions=instructions,
        messages=[Message(id="compaction", role="user", parts=[TextPart(text=prompt)])],
        tool_choice="none",
    )
    try:
        response: ModelResponse | None = None
        async for chunk in summarizer.stream(request):
            if isinstance(chunk, ModelResponse):
                response = chunk
        if response is None:
            raise ModelError(f"The summarizer {summarizer.name!r} ended without a response.")
    except Exception as exc:  # any failure of the model: the caller falls back
        raise _SummarizerFailed(exc) from exc
    usage.add(response.usage)
    text = "".join(p.text for p in response.parts if isinstance(p, TextPart)).strip()
    if not text:
        raise _SummarizerFailed(ModelError(f"The summarizer {summarizer.name!r} wrote no text."))
    return text
