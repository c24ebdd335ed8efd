"""A fake model-provider server on 127.0.0.1: OpenAI Chat Completions and Responses, Anthropic.

The real SDKs talk to it over real HTTP, so the tests exercise the wire protocols (status
codes, headers, chunked Server-Sent Events, connections cut midway) rather than a fake client.
A test scripts the replies to its next requests, in order, and reads back what was sent:

```python
fake.script(openai_stream([openai_chunk(content="Hi")], usage=openai_usage(5, 1)))
... run the model ...
assert fake.requests[0].body["messages"][-1] == {"role": "user", "content": "Hello"}
```

The Responses API's streams are built from output items (`responses_message`,
`responses_call`, `responses_reasoning`, or any item with `responses_item`) by
`responses_stream`, which numbers their events and ends them with the terminal event:

```python
fake.script(responses_stream([responses_message("Hi")], usage=responses_usage(5, 1)))
```

Replies: `Json` (any status, any headers), `Stream` (SSE frames, optionally cut after some, or
ended early inside a line or a character, cleanly or by closing the connection), `Hang` (no
response until the client gives up) and `Drop` (the connection closes at once).
The server checks what the real APIs check before anything else (the API key headers, and
tool names against the pattern both APIs enforce), answering as they would. With
`fake.strict_arguments = True` it also checks, as vLLM, SGLang and llama-server do, that every
call in the history has arguments that are a JSON object (400 otherwise).

Azure OpenAI's content filter adds chunks of its own to a Chat Completions stream, built by
`azure_prompt_filter` (the first chunk, no choices), `azure_annotation` (a choice with no
delta, with the verdict; `finish_reason="content_filter"` for a block) and `azure_chunk` (an
ordinary chunk carrying its verdict), byte for byte as Azure sends them (compact JSON).
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "AZURE_SAFE",
    "RESPONSES_MODEL",
    "Drop",
    "FakeProviders",
    "Hang",
    "Json",
    "Recorded",
    "ResponsesItem",
    "Stream",
    "anthropic_error",
    "anthropic_message",
    "anthropic_stream",
    "anthropic_tool_use_whole",
    "azure_annotation",
    "azure_chunk",
    "azure_prompt_filter",
    "azure_stream",
    "openai_chunk",
    "openai_completion",
    "openai_error",
    "openai_stream",
    "openai_usage",
    "responses_call",
    "responses_code_interpreter",
    "responses_item",
    "responses_message",
    "responses_object",
    "responses_reasoning",
    "responses_stream",
    "responses_usage",
    "responses_web_search",
    "sse",
    "with_frame",
]

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass
class Json:
    """A JSON reply.

    `truncate`: send only this many bytes of the body. The body then ends cleanly (its
    `content-length` says so), or, with `cut`, the `content-length` announces all of it and the
    connection closes early.
    """

    body: Any
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    truncate: int | None = None
    cut: bool = False


@dataclass
class Stream:
    """A Server-Sent Events reply, sent with chunked transfer encoding.

    `cut_after`: close the connection (no final chunk) after this many frames.
    `chunk_size`: send the body in HTTP chunks of this many bytes instead of one a frame, so
    reads end mid-line and mid-character.
    `truncate`: send only this many bytes of the body (of the frames `cut_after` keeps), so it
    ends mid-line or mid-character; the body then ends cleanly (with its final chunk), or,
    with `cut`, the connection closes without it.
    """

    frames: Sequence[bytes]
    cut_after: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    chunk_size: int | None = None
    truncate: int | None = None
    cut: bool = False

    def ending_inside(self, text: str, *, cut: bool) -> Stream:
        """This stream, ending one byte into the first `text` of its body.

        That byte is inside `text`'s first character when it is more than one byte long in
        UTF-8 (`"é"`, `"☔"`). `cut`: close the connection there instead of ending the body.
        """
        body = b"".join(self.frames)
        at = body.find(text.encode())
        if at < 0:
            raise ValueError(f"{text!r} is not in the stream")
        return replace(self, truncate=at + 1, cut=cut)


@dataclass
class Hang:
    """Read the request, then answer nothing until the client gives up (or `seconds` pass)."""

    seconds: float = 10.0


@dataclass
class Drop:
    """Read the request, then close the connection without a byte of response."""


Reply = Json | Stream | Hang | Drop


@dataclass
class Recorded:
    """A request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


class FakeProviders:
    """The server: start once, `reset()` between tests, `close()` at the end."""

    def __init__(self) -> None:
        self.strict_arguments = False
        """Answer 400 to a history whose calls' arguments are not JSON objects (as vLLM)."""
        self.requests: list[Recorded] = []
        self._replies: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The server's base URL (what the Anthropic SDK takes)."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def openai_url(self) -> str:
        """The base URL the OpenAI SDK takes."""
        return self.url + "/v1"

    def script(self, *replies: Reply) -> None:
        """Queue the replies to the next requests, in order."""
        with self._lock:
            self._replies.extend(replies)

    @property
    def unplayed(self) -> int:
        """Replies scripted but not requested yet."""
        with self._lock:
            return len(self._replies)

    def reset(self) -> None:
        """Forget the requests and the replies left."""
        with self._lock:
            self.requests.clear()
            self._replies.clear()
            self.strict_arguments = False

    def close(self) -> None:
        """Stop the server (and release every hanging reply)."""
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _record(self, recorded: Recorded) -> None:
        with self._lock:
            self.requests.append(recorded)

    def _next(self, recorded: Recorded) -> Reply:
        with self._lock:
            self.requests.append(recorded)
            if self._replies:
                return self._replies.popleft()
        return Json(
            {"error": {"message": "fake server: no reply was scripted for this request"}},
            status=400,
        )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_fake: FakeProviders

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        body = json.loads(raw) if raw else None
        headers = {k.lower(): v for k, v in self.headers.items()}
        fake = self.server_fake
        refusal = _refusal(self.path, headers, body)
        if refusal is None and fake.strict_arguments:
            refusal = _strict_arguments(self.path, body)
        if refusal is not None:
            fake._record(Recorded("POST", self.path, headers, body))
            self._json(refusal)
            return
        reply = fake._next(Recorded("POST", self.path, headers, body))
        try:
            if isinstance(reply, Json):
                self._json(reply)
            elif isinstance(reply, Stream):
                self._stream(reply)
            elif isinstance(reply, Hang):
                fake._stop.wait(reply.seconds)
                self.close_connection = True
            else:
                self._drop()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _json(self, reply: Json) -> None:
        payload = json.dumps(reply.body, ensure_ascii=False).encode()
        sent = payload if reply.truncate is None else payload[: reply.truncate]
        self.send_response(reply.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload if reply.cut else sent)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(sent)
        if reply.cut:
            self._drop()

    def _stream(self, reply: Stream) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("cache-control", "no-cache")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        frames = reply.frames if reply.cut_after is None else reply.frames[: reply.cut_after]
        if reply.truncate is not None:
            frames = [b"".join(frames)[: reply.truncate]]
        if reply.chunk_size is not None:
            body, size = b"".join(frames), reply.chunk_size
            frames = [body[i : i + size] for i in range(0, len(body), size)]
        write = self.wfile.write
        for frame in frames:
            write(b"%x\r\n%s\r\n" % (len(frame), frame))
        self.wfile.flush()
        if reply.cut_after is not None or reply.cut:
            self._drop()
            return
        write(b"0\r\n\r\n")

    def _drop(self) -> None:
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True


def _refusal(path: str, headers: dict[str, str], body: Any) -> Json | None:
    """What the real API answers before looking at the request's content, if anything."""
    tools = body.get("tools", []) if isinstance(body, dict) else []
    if path.startswith("/v1/chat/completions"):
        if not headers.get("authorization", "").startswith("Bearer "):
            return openai_error(401, "You didn't provide an API key.", "invalid_request_error")
        names = [t.get("function", {}).get("name", "") for t in tools]
        kind = openai_error
    elif path.startswith("/v1/responses"):
        if not headers.get("authorization", "").startswith("Bearer "):
            return openai_error(401, "You didn't provide an API key.", "invalid_request_error")
        # Only function tools have names; hosted tools (web_search, ...) are named by type.
        names = [t.get("name", "") for t in tools if t.get("type") == "function"]
        kind = openai_error
    elif path.startswith("/v1/messages"):
        if "x-api-key" not in headers and not headers.get("authorization", "").startswith(
            "Bearer "
        ):
            return anthropic_error(401, "authentication_error", "x-api-key header is required")
        if "anthropic-version" not in headers:
            return anthropic_error(400, "invalid_request_error", "anthropic-version is required")
        names = [t.get("name", "") for t in tools]
        kind = None
        malformed = _anthropic_conversation(
            body.get("messages", []) if isinstance(body, dict) else []
        )
        if malformed is not None:
            return anthropic_error(400, "invalid_request_error", malformed)
    else:
        return Json({"error": {"message": f"fake server: no route {path}"}}, status=404)
    for index, name in enumerate(names):
        if not _TOOL_NAME.match(name):
            message = f"tools.{index}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
            if kind is None:
                return anthropic_error(400, "invalid_request_error", message)
            return openai_error(400, message, "invalid_request_error")
    return None


def _anthropic_conversation(messages: list[Any]) -> str | None:
    """What the Messages API says of a conversation it refuses (its own words), if it does.

    It takes only `user` and `assistant` turns (a system prompt is the top-level `system`),
    and every `tool_use` needs its `tool_result` in the very next (user) turn, and the other
    way round.
    """
    uses: set[str] = set()
    for index, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            return (
                f'messages.{index}.role: Unexpected role "{role}". The Messages API accepts a '
                f'top-level `system` parameter, not "system" as an input message role.'
            )
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        results = {b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"}
        if role == "user" and results - uses:
            return (
                f"messages.{index}: unexpected `tool_use_id` found in `tool_result` blocks: "
                f"{', '.join(sorted(results - uses))}. Each `tool_result` block must have a "
                f"corresponding `tool_use` block in the previous message."
            )
        if uses - results:
            return (
                f"messages.{index}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(sorted(uses - results))}. Each `tool_use` "
                f"block must have a corresponding `tool_result` block in the next message."
            )
        uses = (
            {b.get("id") for b in blocks if b.get("type") == "tool_use"}
            if role == "assistant"
            else set()
        )
    return None


def _strict_arguments(path: str, body: Any) -> Json | None:
    """vLLM's answer to a history whose call arguments are not a JSON object, if it has one.

    vLLM parses the `arguments` of every call in the history (to render its chat template)
    and answers 400 when they are not JSON; the template then needs an object. An empty string
    is refused too, as llama-server and several gateways do.
    """
    if not isinstance(body, dict):
        return None
    found: list[Any] = []
    if path.startswith("/v1/chat/completions"):
        for message in body.get("messages", []):
            for call in message.get("tool_calls") or ():
                found.append(call.get("function", {}).get("arguments"))
    elif path.startswith("/v1/responses") and isinstance(body.get("input"), list):
        found = [i.get("arguments") for i in body["input"] if i.get("type") == "function_call"]
    for arguments in found:
        try:
            value = json.loads(arguments)
        except (TypeError, ValueError) as exc:
            return openai_error(400, f"Invalid tool call arguments: {exc}", "BadRequestError")
        if not isinstance(value, dict):
            return openai_error(400, "Tool call arguments must be a JSON object", "BadRequestError")
    return None


# -- OpenAI Chat Completions ----------------------------------------------------------------


def sse(data: Any, event: str | None = None) -> bytes:
    """One Server-Sent Events frame (`data` is JSON-encoded unless it is a str)."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def openai_usage(
    prompt: int, completion: int, cached: int = 0, *, reasoning: int = 0
) -> dict[str, Any]:
    """A Chat Completions `usage` object."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": reasoning, "audio_tokens": 0},
    }


def openai_chunk(
    *,
    content: str | None = None,
    role: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    model: str = "gpt-4o-mini-2024-07-18",
    **extra: Any,
) -> dict[str, Any]:
    """One `chat.completion.chunk` with one choice (extra keys go into the delta)."""
    delta: dict[str, Any] = dict(extra)
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1_763_800_000,
        "model": model,
        "system_fingerprint": "fp_fake",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def openai_stream(
    chunks: Iterable[dict[str, Any]],
    *,
    usage: dict[str, Any] | None = None,
    cut_after: int | None = None,
    headers: dict[str, str] | None = None,
    finish_reason: str | None = "stop",
    done: bool = True,
) -> Stream:
    """A streamed completion: the chunks, the usage chunk (empty choices), `[DONE]`.

    `finish_reason` is sent in a last chunk of its own unless a chunk already carries one
    (None: the stream has none, as a stream that stopped early). `done=False` leaves out
    `[DONE]`.
    """
    chunks = list(chunks)
    finished = any(c["choices"] and c["choices"][0].get("finish_reason") for c in chunks)
    if finish_reason is not None and not finished:
        chunks.append(openai_chunk(finish_reason=finish_reason))
    frames = [sse(c) for c in chunks]
    if usage is not None:
        last = openai_chunk()
        last["choices"] = []
        last["usage"] = usage
        frames.append(sse(last))
    if done:
        frames.append(sse("[DONE]"))
    return Stream(frames, cut_after=cut_after, headers=headers or {})


def openai_completion(
    message: dict[str, Any],
    *,
    finish_reason: str = "stop",
    usage: dict[str, Any] | None = None,
    model: str = "gpt-4o-mini-2024-07-18",
) -> Json:
    """A complete (non-streamed) `chat.completion`."""
    return Json(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 1_763_800_000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "refusal": None, **message},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": usage or openai_usage(10, 5),
            "system_fingerprint": "fp_fake",
        },
        headers={"x-request-id": "req_fake"},
    )


def openai_error(
    status: int, message: str, kind: str, *, headers: dict[str, str] | None = None
) -> Json:
    """An error as OpenAI sends it (with a request id)."""
    return Json(
        {"error": {"message": message, "type": kind, "param": None, "code": None}},
        status=status,
        headers={"x-request-id": f"req_{status}", **(headers or {})},
    )


# -- Azure OpenAI's content filter (Chat Completions) -----------------------------------------

AZURE_SAFE: dict[str, Any] = {
    "hate": {"filtered": False, "severity": "safe"},
    "self_harm": {"filtered": False, "severity": "safe"},
    "sexual": {"filtered": False, "severity": "safe"},
    "violence": {"filtered": False, "severity": "safe"},
}
"""A verdict that passes every category, as Azure writes it."""


def _compact(data: Any) -> str:
    """JSON as Azure writes it: no spaces (the frames below are byte for byte Azure's)."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def azure_prompt_filter(results: dict[str, Any] | None = None) -> str:
    """The first chunk of an Azure stream: the prompt's verdict and no choices."""
    return _compact(
        {
            "id": "",
            "object": "",
            "created": 0,
            "model": "",
            "prompt_filter_results": [
                {"prompt_index": 0, "content_filter_results": results or AZURE_SAFE}
            ],
            "choices": [],
            "usage": None,
        }
    )


def azure_annotation(
    results: dict[str, Any] | None = None,
    *,
    finish_reason: str | None = None,
    offsets: tuple[int, int, int] = (44, 44, 198),
) -> str:
    """An annotation chunk: a choice with the verdict on text already sent, and no `delta`.

    `finish_reason="content_filter"` with a `filtered: true` verdict is Azure's block of the
    answer (its asynchronous filter); `[DONE]` follows at once.
    """
    check, start, end = offsets
    return _compact(
        {
            "id": "",
            "object": "",
            "created": 0,
            "model": "",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": finish_reason,
                    "content_filter_results": results or AZURE_SAFE,
                    "content_filter_offsets": {
                        "check_offset": check,
                        "start_offset": start,
                        "end_offset": end,
                    },
                }
            ],
            "usage": None,
        }
    )


def azure_chunk(
    *,
    content: str | None = None,
    role: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    results: dict[str, Any] | None = None,
) -> str:
    """An ordinary chunk of an Azure stream, its choice carrying the verdict on its text."""
    chunk = openai_chunk(
        content=content,
        role=role,
        tool_calls=tool_calls,
        finish_reason=finish_reason,
        model="gpt-4o-2024-11-20",
    )
    chunk["choices"][0]["content_filter_results"] = {} if results is None else results
    chunk["usage"] = None
    return _compact(chunk)


def azure_stream(chunks: Iterable[str], *, usage: dict[str, Any] | None = None) -> Stream:
    """An Azure stream: the chunks as given (no finish is added), the usage chunk, `[DONE]`."""
    frames = [sse(chunk) for chunk in chunks]
    if usage is not None:
        last = openai_chunk(model="gpt-4o-2024-11-20")
        last["choices"] = []
        last["usage"] = usage
        frames.append(sse(_compact(last)))
    frames.append(sse("[DONE]"))
    return Stream(frames, headers={"apim-request-id": "req_fake"})


# -- OpenAI Responses -----------------------------------------------------------------------


@dataclass
class ResponsesItem:
    """One output item of a response: as `response.output_item.added` announces it, the events
    that build it (without their indexes, which `responses_stream` numbers), and as it is done
    (in `response.output_item.done` and in the terminal event's `response.output`)."""

    added: dict[str, Any]
    events: list[dict[str, Any]]
    done: dict[str, Any]


def responses_item(
    done: dict[str, Any],
    *,
    added: dict[str, Any] | None = None,
    events: Sequence[dict[str, Any]] = (),
) -> ResponsesItem:
    """Any output item (`added` defaults to `done` marked `in_progress`)."""
    if added is None:
        added = {**done, "status": "in_progress"} if "status" in done else dict(done)
    return ResponsesItem(added=added, events=list(events), done=done)


def responses_message(
    *pieces: str,
    id: str = "msg_1",
    annotations: list[dict[str, Any]] | None = None,
    status: str = "completed",
) -> ResponsesItem:
    """An assistant `message` item whose `output_text` streams as `pieces`."""
    text = "".join(pieces)
    empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    whole = {"type": "output_text", "text": text, "annotations": annotations or [], "logprobs": []}
    events: list[dict[str, Any]] = [
        {"type": "response.content_part.added", "content_index": 0, "part": empty}
    ]
    events += [
        {"type": "response.output_text.delta", "content_index": 0, "delta": p, "logprobs": []}
        for p in pieces
    ]
    events += [
        {"type": "response.output_text.done", "content_index": 0, "text": text, "logprobs": []},
        {"type": "response.content_part.done", "content_index": 0, "part": whole},
    ]
    item = {"id": id, "type": "message", "role": "assistant"}
    return ResponsesItem(
        added={**item, "status": "in_progress", "content": []},
        events=events,
        done={**item, "status": status, "content": [whole]},
    )


def responses_call(
    call_id: str, name: str, *pieces: str, id: str | None = None, status: str = "completed"
) -> ResponsesItem:
    """A `function_call` item whose arguments stream as `pieces`."""
    arguments = "".join(pieces)
    item = {"id": id or f"fc_{call_id}", "type": "function_call", "call_id": call_id, "name": name}
    events: list[dict[str, Any]] = [
        {"type": "response.function_call_arguments.delta", "delta": p} for p in pieces
    ]
    if status == "completed":
        events.append({"type": "response.function_call_arguments.done", "arguments": arguments})
    return ResponsesItem(
        added={**item, "status": "in_progress", "arguments": ""},
        events=events,
        done={**item, "status": status, "arguments": arguments},
    )


def responses_reasoning(
    *summaries: Sequence[str], encrypted: str = "gAAAAB-encrypted==", id: str = "rs_1"
) -> ResponsesItem:
    """A `reasoning` item: each summary part streams as its pieces; `encrypted_content` comes
    whole with `response.output_item.done` (as OpenAI documents)."""
    events: list[dict[str, Any]] = []
    done: list[dict[str, Any]] = []
    for index, pieces in enumerate(summaries):
        text = "".join(pieces)
        part = {"type": "summary_text", "text": text}
        events.append(
            {
                "type": "response.reasoning_summary_part.added",
                "summary_index": index,
                "part": {"type": "summary_text", "text": ""},
            }
        )
        events += [
            {"type": "response.reasoning_summary_text.delta", "summary_index": index, "delta": p}
            for p in pieces
        ]
        events += [
            {"type": "response.reasoning_summary_text.done", "summary_index": index, "text": text},
            {"type": "response.reasoning_summary_part.done", "summary_index": index, "part": part},
        ]
        done.append(part)
    return ResponsesItem(
        added={"id": id, "type": "reasoning", "summary": []},
        events=events,
        done={"id": id, "type": "reasoning", "summary": done, "encrypted_content": encrypted},
    )


def responses_web_search(
    id: str,
    query: str,
    urls: Sequence[str] = (),
    *,
    status: str = "completed",
) -> ResponsesItem:
    """A `web_search_call` item: its `action` (the query and, as `include` asks, the sources
    found) and the events that mark its progress."""
    action: dict[str, Any] = {"type": "search", "query": query}
    if urls:
        action["sources"] = [{"type": "url", "url": url} for url in urls]
    events = [
        {"type": f"response.web_search_call.{step}"}
        for step in ("in_progress", "searching", "completed")
    ]
    return ResponsesItem(
        added={"id": id, "type": "web_search_call", "status": "in_progress"},
        events=events if status == "completed" else events[:2],
        done={"id": id, "type": "web_search_call", "status": status, "action": action},
    )


def responses_code_interpreter(
    id: str, code: Sequence[str], logs: str, *, container: str = "cntr_fake"
) -> ResponsesItem:
    """A `code_interpreter_call` item: its code streams as `code`; its `outputs` (as
    `include` asks) are the logs."""
    whole = "".join(code)
    item = {"id": id, "type": "code_interpreter_call", "container_id": container}
    events: list[dict[str, Any]] = [{"type": "response.code_interpreter_call.in_progress"}]
    events += [{"type": "response.code_interpreter_call_code.delta", "delta": p} for p in code]
    events += [
        {"type": "response.code_interpreter_call_code.done", "code": whole},
        {"type": "response.code_interpreter_call.interpreting"},
        {"type": "response.code_interpreter_call.completed"},
    ]
    return ResponsesItem(
        added={**item, "status": "in_progress", "code": "", "outputs": None},
        events=events,
        done={
            **item,
            "status": "completed",
            "code": whole,
            "outputs": [{"type": "logs", "logs": logs}],
        },
    )


def responses_usage(
    input: int, output: int, *, cached: int = 0, reasoning: int = 0
) -> dict[str, Any]:
    """A Responses API `usage` object."""
    return {
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input + output,
    }


RESPONSES_MODEL = "gpt-5-2025-08-07"


def responses_object(
    output: Sequence[dict[str, Any]],
    *,
    status: str = "completed",
    usage: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
    error: dict[str, Any] | None = None,
    model: str = RESPONSES_MODEL,
) -> dict[str, Any]:
    """A `response` object (the terminal event's, or a non-streamed body)."""
    return {
        "id": "resp_fake",
        "object": "response",
        "created_at": 1_763_800_000,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": (
            {"reason": incomplete_reason} if incomplete_reason is not None else None
        ),
        "instructions": None,
        "max_output_tokens": None,
        "model": model,
        "output": list(output),
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": "medium", "summary": None},
        "store": False,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "metadata": {},
    }


def responses_stream(
    items: Sequence[ResponsesItem],
    *,
    usage: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
    failed: dict[str, Any] | None = None,
    terminal: bool = True,
    output: Sequence[dict[str, Any]] | None = None,
    cut_after: int | None = None,
    model: str = RESPONSES_MODEL,
) -> Stream:
    """A streamed response as OpenAI sends it: `response.created`, `response.in_progress`,
    each item (`output_item.added`, its events, `output_item.done`), then the terminal event:
    `response.completed`, `response.incomplete` (with `incomplete_reason`) or `response.failed`
    (with `failed`, an error `{code, message}`). Its `response.output` is the items as done
    unless `output` says otherwise. `terminal=False` leaves it out, as a stream that stopped
    early; `cut_after` closes the connection after that many frames.
    """
    events: list[dict[str, Any]] = []
    start = responses_object([], status="in_progress", model=model)
    events.append({"type": "response.created", "response": start})
    events.append({"type": "response.in_progress", "response": start})
    for index, item in enumerate(items):
        item_id = item.done.get("id", f"item_{index}")
        events.append(
            {"type": "response.output_item.added", "output_index": index, "item": item.added}
        )
        events += [{**e, "item_id": item_id, "output_index": index} for e in item.events]
        events.append(
            {"type": "response.output_item.done", "output_index": index, "item": item.done}
        )
    if terminal:
        done = list(output) if output is not None else [item.done for item in items]
        if failed is not None:
            response = responses_object(done, status="failed", error=failed, model=model)
            events.append({"type": "response.failed", "response": response})
        elif incomplete_reason is not None:
            response = responses_object(
                done,
                status="incomplete",
                incomplete_reason=incomplete_reason,
                usage=usage,
                model=model,
            )
            events.append({"type": "response.incomplete", "response": response})
        else:
            response = responses_object(done, usage=usage, model=model)
            events.append({"type": "response.completed", "response": response})
    frames = [sse({**e, "sequence_number": number}, e["type"]) for number, e in enumerate(events)]
    return Stream(frames, cut_after=cut_after, headers={"x-request-id": "req_fake"})


# -- Anthropic Messages ---------------------------------------------------------------------


def anthropic_message(
    content: list[dict[str, Any]],
    *,
    stop_reason: str = "end_turn",
    usage: dict[str, Any] | None = None,
    model: str = "claude-sonnet-4-5-20250929",
) -> Json:
    """A complete (non-streamed) `message`."""
    return Json(
        {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage or {"input_tokens": 10, "output_tokens": 5},
        },
        headers={"request-id": "req_fake"},
    )


def anthropic_stream(
    blocks: Sequence[tuple[dict[str, Any], Sequence[dict[str, Any]]]],
    *,
    stop_reason: str = "end_turn",
    usage: dict[str, Any] | None = None,
    output_tokens: int = 5,
    model: str = "claude-sonnet-4-5-20250929",
    cut_after: int | None = None,
    message_stop: bool = True,
) -> Stream:
    """A streamed message: each block is `(content_block_start's block, its deltas)`.

    `message_stop=False` leaves out the last event, as a stream that stopped early.
    """
    start_usage = {"input_tokens": 10, "output_tokens": 1, **(usage or {})}
    frames = [
        sse(
            {
                "type": "message_start",
                "message": {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
            "message_start",
        ),
        sse({"type": "ping"}, "ping"),
    ]
    for index, (block, deltas) in enumerate(blocks):
        frames.append(
            sse(
                {"type": "content_block_start", "index": index, "content_block": block},
                "content_block_start",
            )
        )
        frames.extend(
            sse({"type": "content_block_delta", "index": index, "delta": d}, "content_block_delta")
            for d in deltas
        )
        frames.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    frames.append(
        sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
            "message_delta",
        )
    )
    if message_stop:
        frames.append(sse({"type": "message_stop"}, "message_stop"))
    return Stream(frames, cut_after=cut_after, headers={"request-id": "req_fake"})


def anthropic_tool_use_whole(
    id: str, name: str, input: dict[str, Any], *deltas: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A `tool_use` block whose input comes whole in `content_block_start`, as some gateways
    (LiteLLM, Bedrock and Vertex proxies) stream it; `deltas`: `input_json_delta` pieces after
    it all the same."""
    return (
        {"type": "tool_use", "id": id, "name": name, "input": input},
        [{"type": "input_json_delta", "partial_json": piece} for piece in deltas],
    )


def with_frame(stream: Stream, at: int, frame: bytes) -> Stream:
    """`stream` with one more frame inserted before its frame number `at`."""
    frames = list(stream.frames)
    frames.insert(at, frame)
    return replace(stream, frames=frames)


def anthropic_error(
    status: int, kind: str, message: str, *, headers: dict[str, str] | None = None
) -> Json:
    """An error as Anthropic sends it (with a request id)."""
    return Json(
        {"type": "error", "error": {"type": kind, "message": message}},
        status=status,
        headers={"request-id": f"req_{status}", **(headers or {})},
    )


# -- Anthropic server tools (hosted) ----------------------------------------------------------


def anthropic_server_tool_use(
    id: str, name: str, input: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A `server_tool_use` block as Anthropic streams it: empty input, then JSON in two pieces."""
    text = json.dumps(input)
    middle = len(text) // 2
    return (
        {"type": "server_tool_use", "id": id, "name": name, "input": {}},
        [
            {"type": "input_json_delta", "partial_json": text[:middle]},
            {"type": "input_json_delta", "partial_json": text[middle:]},
        ],
    )


def anthropic_web_search_result(
    tool_use_id: str, sources: Sequence[tuple[str, str]]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A `web_search_tool_result` block (it comes whole, with no deltas)."""
    return (
        {
            "type": "web_search_tool_result",
            "tool_use_id": tool_use_id,
            "content": [
                {
                    "type": "web_search_result",
                    "url": url,
                    "title": title,
                    "encrypted_content": f"EqgfCioIARgB{index}",
                    "page_age": None if index else "April 30, 2025",
                }
                for index, (url, title) in enumerate(sources)
            ],
        },
        [],
    )


def anthropic_web_fetch_result(
    tool_use_id: str, url: str, title: str, text: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A `web_fetch_tool_result` block with the fetched page as a text document."""
    return (
        {
            "type": "web_fetch_tool_result",
            "tool_use_id": tool_use_id,
            "content": {
                "type": "web_fetch_result",
                "url": url,
                "content": {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": text},
                    "title": title,
                },
                "retrieved_at": "2025-08-25T10:30:00Z",
            },
        },
        [],
    )


def anthropic_bash_result(
    tool_use_id: str, stdout: str, stderr: str = "", return_code: int = 0
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A `bash_code_execution_tool_result` block (code execution 20250825)."""
    return (
        {
            "type": "bash_code_execution_tool_result",
            "tool_use_id": tool_use_id,
            "content": {
                "type": "bash_code_execution_result",
                "stdout": stdout,
                "stderr": stderr,
                "return_code": return_code,
                "content": [],
            },
        },
        [],
    )


def anthropic_server_tool_error(
    result_type: str, tool_use_id: str, error_code: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A server tool's result block carrying an error (`web_search_tool_result_error`, ...)."""
    return (
        {
            "type": result_type,
            "tool_use_id": tool_use_id,
            "content": {"type": f"{result_type}_error", "error_code": error_code},
        },
        [],
    )
