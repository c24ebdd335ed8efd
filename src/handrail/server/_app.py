"""`create_app`: the Starlette app of an engine: sessions, turns, event streams, decisions."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import re
from collections.abc import AsyncGenerator, AsyncIterator, Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pydantic_core
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from .._deadlines import CLIENT_GRACE
from .._redact import log_failure
from ..apps import AppTarget, open_app
from ..audit import AuditEntry
from ..engine import Engine
from ..exceptions import SessionCorruptError, SessionNotFoundError, UserError
from ..messages import MESSAGES
from ..policy import DecisionPolicy, policy_for
from ..state import RunState
from ..store import SessionRecord, session_id_for
from ..tools import Tool
from ..worker import Worker
from ._agui import agui_operation
from ._api import Api
from ._auth import Authenticator, Caller
from ._bodies import (
    MAX_NUMBER,
    AgentBody,
    AuditBody,
    AuditQuery,
    AuditVerifyBody,
    CallOutcomeBody,
    ClientQuery,
    DecidedBody,
    DecidedItem,
    DecidedQuery,
    DecisionPolicyBody,
    DomainBody,
    EventsQuery,
    InterruptBody,
    ListQuery,
    MeBody,
    MessagesBody,
    MessagesQuery,
    PendingBody,
    PendingCardPart,
    PendingQuery,
    ResolutionBody,
    ResolveBody,
    SessionBody,
    SessionsBody,
    SessionSummaryBody,
    ToolBody,
    TurnAccepted,
    TurnBody,
)
from ._errors import EXCEPTION_HANDLERS, ApiError, App
from ._headers import SecurityHeaders, request_id
from ._limits import Limits
from ._openapi import Operation, openapi
from ._page import Titles, call_outcome, verify_trail
from ._runs import Runs
from ._sse import EventStream, error_frame, frame
from ._ui_stream import ui_stream_operations

__all__ = ["create_app"]

_log = logging.getLogger("handrail.server")

STATIC = Path(__file__).parent / "static"
"""The web page's files, served at `/` when the directory exists."""

M = TypeVar("M", bound=BaseModel)
AUDIT_ROLES: frozenset[str] = frozenset({"auditor"})
"""The roles that may read the audit trail by default (`create_app(audit_roles=...)`)."""
_WRITE = 65_536
"""Bytes of events a stream writes at once, at most (plus one event): a client that does not
read holds up the next write, so the server buffers about this much for it."""


def create_app(
    engine: Engine | None = None,
    *,
    lifespan: str | AppTarget | None = None,
    authenticator: Authenticator,
    max_body_size: int = 1_000_000,
    static_dir: str | os.PathLike[str] | None = STATIC,
    poll_interval: float | None = None,
    ping_interval: float = 15.0,
    send_timeout: float | None = 30.0,
    shutdown_grace: float = 5.0,
    sweep_interval: float | None = None,
    sweep_concurrency: int = 4,
    retention: float | None = None,
    limits: Limits | None = None,
    audit_roles: Collection[str] | None = AUDIT_ROLES,
    client_grace: float = CLIENT_GRACE,
) -> Starlette:
    """The HTTP API of an engine, as an ASGI app (run it with uvicorn: `handrail serve`).

    Give the engine itself, or, for an application that owns async resources (an MCP
    session, a connection pool), `lifespan=` the application as `handrail serve` takes it
    (`handrail.apps`): it is opened in the server's event loop when the app starts, before
    the first request, and closed when it shuts down, after the last turn has stopped.

    ```python
    @asynccontextmanager
    async def ops() -> AsyncIterator[Engine]:
        async with MCPToolset(command="my-fs-server", prefix="fs") as fs:
            yield Engine(Agent("ops", tools=await fs.tools()), store=store)

    app = create_app(lifespan=ops, authenticator=authenticator)  # or lifespan="myapp:ops"
    ```

    Starlette does not run the lifespan of an app mounted in another: enter it from yours
    (`async with api.router.lifespan_context(api): yield`); until then its endpoints
    answer 503.

    Turns run in tasks the app owns (ended at shutdown: interrupted, then after
    `shutdown_grace` seconds cancelled), and every event is logged in the session's event
    log, so a stream can be left and picked up again (`Last-Event-ID`).

    Args:
        engine: runs the turns; its store keeps the sessions and their event logs.
        lifespan: instead of `engine`: what `handrail.apps.open_app` opens (`MODULE:NAME`,
            an `Engine`, a function or coroutine function returning one, or an async
            context-manager function yielding one), opened at start-up, closed at shutdown.
        authenticator: turns each request into its caller (`ApiKeyAuthenticator`, or yours).
        max_body_size: bytes a request body may have; a larger one answers 413.
        static_dir: files served at `/` (the web page), if the directory exists; None: none.
        poll_interval: seconds of quiet after which a stream reads the event log again. Events
            logged by another process sharing the store reach a stream through the store's
            notices (PostgreSQL's LISTEN/NOTIFY), so this is a safety net: None is 60 s on
            PostgreSQL; 1 s on SQLite, whose notices stay within a process (another process
            sharing the file is found by this re-read) and on memory.
        ping_interval: seconds between keep-alive comments on a quiet stream.
        send_timeout: seconds a stream may wait for a slow reader before dropping it (the
            client reconnects with `Last-Event-ID` and misses nothing); None: forever.
        shutdown_grace: seconds running turns get to stop at shutdown.
        sweep_interval: when set, the app runs a `Worker` (sweeps alone: it drives itself what
            its requests decide) every this many seconds, from start-up: what a previous
            process under the engine's worker id drove is taken back at once; turns whose
            worker died are recovered; cards past their deadline expire and their turns go on,
            so the model can finish them; decided turns nobody resumed are resumed. None: no
            sweeps (run a `Worker` elsewhere). `handrail serve` sweeps every second.
        sweep_concurrency: how many sessions the sweeps drive at once.
        retention: with sweeps, finished sessions nobody touched for this many seconds are
            deleted (None: kept).
        limits: what one caller or organisation may use: requests a second, open streams,
            running turns (`Limits()` by default); past them, 429 with `Retry-After`.
        audit_roles: the roles that may read the organisation's audit trail (`GET /audit`,
            its export): a caller needs one of them (`auditor` by default), or gets 403. None:
            every member of the organisation may (its decisions' reasons and amended values
            included).
        client_grace: seconds a `client` call still waits once every stream of its turn
            closed before the turn's end (the app was closed; it may reconnect): then it
            expires (with sweeps), and the model reads that the app was closed.

    Raises:
        UserError: neither or both of `engine` and `lifespan`, or `engine` is not an Engine.
    """
    if (engine is None) == (lifespan is None):
        raise UserError(
            "create_app needs an engine, or lifespan= an application that opens one "
            "(handrail.apps), and not both."
        )
    if engine is not None and not isinstance(engine, Engine):
        raise UserError(
            f"create_app's engine is a {type(engine).__name__}, not an Engine: give an "
            f"application that makes one (a factory, an async context manager, MODULE:NAME) "
            f"as lifespan=, and it is opened when the server starts."
        )
    limits = limits if limits is not None else Limits()

    def runs_of(engine: Engine) -> Runs:
        if getattr(engine.store, "audit_key", True) is None:  # a handrail store without a key
            _log.warning(
                "The engine's store chains the audit trail WITHOUT A KEY: anyone who can write "
                "its database can rewrite the trail undetected. Set HANDRAIL_AUDIT_KEY=ID:SECRET "
                "(`handrail audit keygen`) for every process using the store; docs/audit.md."
            )
        return Runs(
            engine, poll_interval=poll_interval, tick=ping_interval, client_grace=client_grace
        )

    fixed = runs_of(engine) if engine is not None else None
    api = _Api(engine, fixed, authenticator, max_body_size, ping_interval, send_timeout, limits)
    api.audit_roles = None if audit_roles is None else frozenset(audit_roles)
    api.titles = Titles()
    operations = [
        *api.operations(),
        agui_operation(api),  # AG-UI clients: docs/agui.md
        *ui_stream_operations(api),  # the AI SDK's useChat: docs/ai-sdk.md
    ]
    document = openapi(operations, title="handrail", version=_version())
    # Matched in order: the routes every turn takes come first.
    hot = sorted(operations, key=lambda op: op.path.rsplit("/", 1)[-1] not in _HOT)
    routes: list[BaseRoute] = [Route(op.path, op.handler, methods=[op.method]) for op in hot]
    routes.append(Route("/openapi.json", lambda _: JSONResponse(document), methods=["GET"]))
    if static_dir is not None and Path(static_dir).is_dir():
        routes.append(Mount("/", StaticFiles(directory=static_dir, html=True), name="static"))

    @contextlib.asynccontextmanager
    async def opened(app: Starlette) -> AsyncIterator[None]:
        if fixed is not None:
            async with running(fixed.engine, fixed):
                yield
            return
        app.state.open_error = None
        is_open = False
        try:
            async with open_app(lifespan) as engine:
                is_open = True
                runs = runs_of(engine)
                api.open(engine, runs)
                app.state.runs = runs
                try:
                    async with running(engine, runs):
                        yield
                finally:
                    api.open(None, None)
        except Exception as error:
            if not is_open:
                app.state.open_error = error  # `serve` says why the server did not start
            raise

    @contextlib.asynccontextmanager
    async def running(engine: Engine, runs: Runs) -> AsyncIterator[None]:
        stop = asyncio.Event()
        sweeps: asyncio.Task[None] | None = None
        if sweep_interval is not None:
            worker = Worker(
                engine,
                poll_interval=sweep_interval,
                concurrency=sweep_concurrency,
                listen=False,
                grace=sweep_interval,
                max_backoff=max(300.0, sweep_interval),
                retention=retention,
            )
            # At shutdown, a turn the sweeps drive gets the same grace, then is cut off.
            drain = worker.run(stop, grace=shutdown_grace)
            sweeps = asyncio.create_task(drain, name="handrail sweeps")
        try:
            yield
        finally:
            stop.set()
            await runs.aclose(grace=shutdown_grace)
            if sweeps is not None:
                await sweeps

    app = App(
        routes=routes,
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=opened,
        middleware=[Middleware(SecurityHeaders)],
    )
    if fixed is not None:
        app.state.runs = fixed  # (with lifespan=, set once the app is open)
    app.state.limits = limits
    return app


_SESSION_ID_MAX = 256
_AUDIT_PAGE = 1000
"""Audit entries an export reads (and writes) at once."""
_HOT = frozenset({"turns", "events", "resolve"})
"""The last step of the paths a turn takes: their routes are matched first."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _session_id(request: Request) -> str:
    """The session id of the path, refused (422) if no store could hold it or a log show it.

    Control characters (a NUL among them: PostgreSQL refuses it, and it would go raw into the
    log) and ids longer than 256 characters are never session ids.
    """
    session_id: str = request.path_params["session_id"]
    if len(session_id) > _SESSION_ID_MAX or _CONTROL.search(session_id):
        raise ApiError(
            422,
            "invalid_request",
            f"Not a session id (control characters, or over {_SESSION_ID_MAX} characters): "
            f"{session_id[:40]!r}.",
        )
    return session_id


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("handrail")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


def _writes(batch: list[tuple[int, dict[str, Any]]]) -> list[bytes]:
    """A batch of logged events as SSE writes of about `_WRITE` bytes each (`[b""]`: none).

    A slow reader holds up the next write, so the server buffers about one write for it.
    """
    writes: list[bytes] = []
    chunk = bytearray()
    for seq, event in batch:
        chunk += frame(seq, pydantic_core.to_json(event))
        if len(chunk) >= _WRITE:
            writes.append(bytes(chunk))
            chunk.clear()
    if chunk or not writes:
        writes.append(bytes(chunk))
    return writes


def _policy_body(
    tool: Tool[Any], policies: Mapping[str, DecisionPolicy]
) -> DecisionPolicyBody | None:
    policy = policy_for(tool.decision_policy, tool.permission, policies)
    if policy is None or not (tool.gated or tool.executor == "human"):
        return None
    return DecisionPolicyBody(
        roles=sorted(policy.roles),
        four_eyes=policy.four_eyes,
        approvals=policy.approvals,
        withdraw=policy.withdraw,
    )


def _json(body: BaseModel, status: int = 200) -> Response:
    return Response(body.model_dump_json(), status_code=status, media_type="application/json")


class _Api(Api):
    """The endpoints: each authenticates, validates, and leaves scope to the engine."""

    audit_roles: frozenset[str] | None = AUDIT_ROLES
    """The roles that may read the audit trail, one of them (None: every member)."""
    titles: Titles
    """The sessions' titles, read once each (`GET /sessions`)."""

    def operations(self) -> list[Operation]:
        """Every endpoint, with what OpenAPI says about it."""
        session = "/sessions/{session_id}"
        return [
            Operation("POST", "/sessions", self.create_session, "Create a session",
                      status=201, response=SessionBody, errors=(403,)),
            Operation("GET", "/sessions", self.list_sessions, "List the caller's sessions",
                      query=ListQuery, response=SessionsBody),
            Operation("GET", session, self.read_session,
                      "Read a session: its messages, pending cards and status",
                      response=SessionBody, errors=(404,)),
            Operation("GET", f"{session}/messages", self.read_messages,
                      "Read a page of the session's history, its earliest messages too",
                      query=MessagesQuery, response=MessagesBody, errors=(404, 422)),
            Operation("DELETE", session, self.delete_session,
                      "Delete a session with its logs", status=204, errors=(404, 409)),
            Operation("GET", f"{session}/export", self.export_session,
                      "Export a session with its logs (for `handrail sessions import`)",
                      errors=(404,)),
            Operation("POST", f"{session}/turns", self.submit_turn,
                      "Send a message: the turn runs in the background (its events stream in "
                      "the answer when it accepts text/event-stream)", status=202,
                      body=TurnBody, query=ClientQuery, response=TurnAccepted,
                      errors=(403, 404, 409, 413, 422), stream_on_accept=True),
            Operation("GET", f"{session}/events", self.stream_events,
                      "Stream the session's events (Server-Sent Events)", query=EventsQuery,
                      stream=True, errors=(404, 422)),
            Operation("POST", f"{session}/resolve", self.resolve,
                      "Decide pending calls (the caller's, or another's of its organisation "
                      "that a decision policy lets it decide); once none is left, the turn "
                      "resumes", body=ResolveBody, query=ClientQuery, response=ResolutionBody,
                      errors=(403, 404, 409, 413, 422)),
            Operation("POST", f"{session}/interrupt", self.interrupt,
                      "Stop the session's running turn", status=202, response=InterruptBody,
                      errors=(404, 409)),
            Operation("GET", "/audit", self.read_audit,
                      "Read the caller's organisation's audit trail (decisions and "
                      "side-effecting calls, hash-chained); needs an audit role (`auditor`)",
                      query=AuditQuery, response=AuditBody, errors=(403,),
                      ndjson="with `Accept: application/x-ndjson`, every entry after `after` "
                      "as JSON lines (an export, streamed a page at a time)"),
            Operation("GET", "/audit/verify", self.verify_audit,
                      "Verify the caller's organisation's audit trail, as `handrail audit "
                      "verify` does (with the server's keys); needs an audit role",
                      response=AuditVerifyBody, errors=(403,)),
            Operation("GET", f"{session}/calls/{{tool_call_id}}", self.call_outcome,
                      "What came of a decided call, for whoever decided it (or the "
                      "session's owner): its status, result or failure",
                      response=CallOutcomeBody, errors=(404, 422)),
            Operation("GET", "/me", self.me,
                      "The caller: organisation, user, roles, and whether it may read the "
                      "audit trail", response=MeBody),
            Operation("GET", "/me/decided", self.list_decided,
                      "The caller's own decisions (and approvals) in its organisation, newest "
                      "first, from the audit trail: no audit role needed; what came of each is "
                      "`GET /sessions/{id}/calls/{call_id}`",
                      query=DecidedQuery, response=DecidedBody, errors=(422,)),
            Operation("GET", "/pending", self.list_pending,
                      "The inbox: the cards of the caller's organisation that it may decide "
                      "(its own sessions' too), with filters; deciding one is a resolve",
                      query=PendingQuery, response=PendingBody),
            Operation("GET", "/domain", self.describe_domain,
                      "The engine's agents and tools (for a UI: the forms of the cards)",
                      response=DomainBody),
        ]  # fmt: skip

    # -- plumbing -------------------------------------------------------------------------

    async def _session(self, request: Request) -> tuple[Caller, str, RunState]:
        """The caller, and the session of the path if the caller may read it (else 404).

        The caller's own sessions, and those of its organisation that wait for a decision
        the caller may make (its decision policy lets the caller's roles decide it): an
        approver reads what they approve, and nothing else.
        """
        caller, session_id, state = await self._reachable(request)
        if state is None:
            state = await self.engine.session(
                session_id, org_id=caller.org_id, user_id=caller.user_id
            )
        return caller, session_id, state

    async def _reachable(self, request: Request) -> tuple[Caller, str, RunState | None]:
        """As `_session`; the state is read only for a caller who is not its user (else None)."""
        caller = await self._caller(request)
        session_id = _session_id(request)
        found = await self.store.summary(session_id)  # never the document: it may be unreadable
        if found is None or found.org_id != caller.org_id:
            raise SessionNotFoundError.for_caller(session_id)
        if found.user_id == caller.user_id:
            return caller, session_id, None
        state = await self.engine.session(session_id, org_id=found.org_id, user_id=found.user_id)
        if not self.engine.decidable(state, caller.decider()):
            raise SessionNotFoundError.for_caller(session_id)
        return caller, session_id, state

    async def _owned(self, request: Request) -> tuple[Caller, str]:
        """As `_session`, without reading the session's state (a turn reads it anyway)."""
        caller = await self._caller(request)
        session_id = _session_id(request)
        found = await self.store.summary(session_id)  # never the document: it may be unreadable
        if found is None or (found.org_id, found.user_id) != caller.who:
            raise SessionNotFoundError.for_caller(session_id)
        return caller, session_id

    @staticmethod
    def _query(request: Request, model: type[M]) -> M:
        if not request.scope["query_string"]:
            return model()  # the defaults (every query parameter is optional)
        for name, value in request.query_params.multi_items():
            if "\x00" in name or "\x00" in value:
                # PostgreSQL cannot hold a NUL in text: refused here, not a store failure.
                raise ApiError(
                    422,
                    "invalid_request",
                    f"{name[:40]!r}: a query parameter cannot hold a NUL character (%00).",
                )
        return model.model_validate(dict(request.query_params))

    def _events_url(self, session_id: str, after: int) -> str:
        return f"/sessions/{session_id}/events?after={after}"

    async def _view(self, session_id: str, state: RunState) -> SessionBody:
        record = await self.store.load(session_id)
        if record is None:  # deleted in between
            raise ApiError(404, "not_found", f"No session {session_id!r} for this caller.")
        title = (await self.titles.of(self.store, [session_id]))[session_id]
        return SessionBody(
            **self._summary(record, title).model_dump(),
            messages=state.messages,
            first=state.base,
            pending=[PendingCardPart.of(card) for card in state.pending.values()],
            scratch=state.scratch,
            context=pydantic_core.to_jsonable_python(state.turn_context),
        )

    def _summary(self, record: Any, title: str | None = None) -> SessionSummaryBody:
        return SessionSummaryBody(
            id=record.id,
            status=record.status,
            running=self.runs.running(record.id),
            created_at=record.created_at,
            updated_at=record.updated_at,
            user_id=record.user_id,
            title=title,
        )

    async def _summaries(self, records: list[Any]) -> list[SessionSummaryBody]:
        """`records` as the API lists them, each with its title."""
        titles = await self.titles.of(self.store, (r.id for r in records))
        return [self._summary(r, titles[r.id]) for r in records]

    # -- sessions -------------------------------------------------------------------------

    async def create_session(self, request: Request) -> Response:
        """`POST /sessions`: a new, empty session of the caller's."""
        caller = await self._caller(request)
        await self.admit(caller, via="http", session_id=None, text=None)
        org_id, user_id = caller.who
        # A store that places sessions by their id (PartitionedStore) prefixes the partition.
        session_id = session_id_for(self.store, org_id, self.engine.runtime.ids("session"))
        state = RunState(session_id=session_id, org_id=org_id, user_id=user_id)
        await self.store.save(
            SessionRecord(
                id=session_id, org_id=org_id, user_id=user_id, data=state.dump(messages=False)
            )
        )
        return _json(await self._view(session_id, state), 201)

    async def list_sessions(self, request: Request) -> Response:
        """`GET /sessions`: a page of the caller's sessions, most recently updated first."""
        caller = await self._caller(request)
        query = self._query(request, ListQuery)
        if query.to_decide:
            return _json(SessionsBody(sessions=await self._to_decide(caller, query)))
        found = await self.store.list(
            org_id=caller.org_id,
            user_id=caller.user_id,
            status=query.status,
            limit=query.limit,
            offset=query.offset,
        )
        return _json(SessionsBody(sessions=await self._summaries(found)))

    async def _to_decide(self, caller: Caller, query: ListQuery) -> list[SessionSummaryBody]:
        """A page of the org's suspended sessions: others' with a call `caller` may decide."""
        found = await self.engine.inbox.sessions(
            caller.org_id, caller.decider(), offset=query.offset, limit=query.limit, own=False
        )
        return await self._summaries(found)

    async def list_pending(self, request: Request) -> Response:
        """`GET /pending`: a page of the cards of the organisation the caller may decide."""
        caller = await self._caller(request)
        query = self._query(request, PendingQuery)
        page = await self.engine.pending(
            caller.org_id,
            caller.decider(),
            tool=query.tool,
            kind=query.kind,
            older_than=query.older_than,
            newer_than=query.newer_than,
            session_id=query.session_id,
            limit=query.limit,
            cursor=query.cursor,
        )
        return _json(PendingBody(cards=page.cards, next=page.next))

    async def read_session(self, request: Request) -> Response:
        """`GET /sessions/{id}`: messages, pending cards, status."""
        _, session_id, state = await self._session(request)
        return _json(await self._view(session_id, state))

    async def read_messages(self, request: Request) -> Response:
        """`GET /sessions/{id}/messages`: a page of the history, oldest first."""
        _, session_id = await self._owned(request)
        query = self._query(request, MessagesQuery)
        rows = await self.store.messages(session_id, before=query.before, limit=query.limit)
        try:
            messages = MESSAGES.validate_python([message for _, message in rows])
        except ValidationError as exc:
            raise SessionCorruptError(
                f"Session {session_id!r}: a stored message cannot be read ({exc.error_count()} "
                f"error(s)). The row is left untouched; restore the session from an export, or "
                f"DELETE the session.",
                session_id=session_id,
            ) from None
        # An empty page has nothing before it: the history is empty, or `before` is 0.
        return _json(MessagesBody(messages=messages, first=rows[0][0] if rows else 0))

    async def delete_session(self, request: Request) -> Response:
        """`DELETE /sessions/{id}`: the session, its logs and its lease."""
        _, session_id = await self._owned(request)
        if self.runs.running(session_id):
            raise ApiError(
                409, "turn_in_progress", "A turn of this session is running: interrupt it first."
            )
        await self.store.delete(session_id)
        self.titles.forget(session_id)
        return Response(status_code=204)

    async def export_session(self, request: Request) -> Response:
        """`GET /sessions/{id}/export`: the session and its logs as one JSON document."""
        _, session_id = await self._owned(request)
        document = await self.store.export(session_id)
        return Response(document, media_type="application/json")

    def _may_audit(self, caller: Caller) -> bool:
        return self.audit_roles is None or bool(self.audit_roles & caller.roles)

    async def _auditor(self, request: Request) -> Caller:
        """The caller, if one of its roles may read the audit trail (else 403)."""
        caller = await self._caller(request)
        roles = self.audit_roles
        if roles is not None and not roles & caller.roles:
            needed = " or ".join(repr(r) for r in sorted(roles))
            has = ", ".join(sorted(caller.roles)) or "none"
            raise ApiError(
                403,
                "audit_role_required",
                f"Reading the audit trail needs the role {needed}; this caller's roles: {has}. "
                f"Give its key the role (roles={min(roles)} in its API key spec, or in the "
                f"token's roles claim)."
                if roles
                else "Reading the audit trail over HTTP is turned off on this server (no "
                "role may: audit_roles is empty); use `handrail audit` on the store.",
            )
        return caller

    async def read_audit(self, request: Request) -> Response:
        """`GET /audit`: the caller's organisation's trail, a page (or every entry, as lines)."""
        caller = await self._auditor(request)
        query = self._query(request, AuditQuery)
        filters: dict[str, Any] = {
            "session_id": query.session_id,
            "tool": query.tool,
            "kind": query.kind,
        }
        accept = request.headers.get("accept", "")
        if "application/x-ndjson" in accept and "application/json" not in accept:
            # The first page is read before the 200: a trail that cannot be read answers an
            # error. Then a page at a time, so an export holds one page, not the trail.
            first = await self.store.audit(
                caller.org_id, after=query.after, limit=_AUDIT_PAGE, **filters
            )
            lines = self._audit_lines(caller.org_id, first, filters)
            return StreamingResponse(lines, media_type="application/x-ndjson")
        found = await self.store.audit(
            caller.org_id, after=query.after, limit=query.limit, **filters
        )
        last = found[-1].seq if len(found) == query.limit else None
        return _json(AuditBody(entries=found, after=last))

    async def _audit_lines(
        self, org_id: str, page: list[AuditEntry], filters: dict[str, Any]
    ) -> AsyncIterator[bytes]:
        """The trail from `page` on as JSON lines, one write a page, read as they are sent.

        A page that cannot be read midway ends the body without its last chunk (the error is
        logged): the client sees a broken transfer, never a short export that looks whole.
        """
        while page:
            yield b"".join(pydantic_core.to_json(e.to_json()) + b"\n" for e in page)
            if len(page) < _AUDIT_PAGE:
                return
            page = await self.store.audit(org_id, after=page[-1].seq, limit=_AUDIT_PAGE, **filters)

    async def verify_audit(self, request: Request) -> Response:
        """`GET /audit/verify`: whether the organisation's trail holds together."""
        caller = await self._auditor(request)
        return _json(await verify_trail(self.store, caller.org_id))

    async def me(self, request: Request) -> Response:
        """`GET /me`: the caller, and what the page may offer it (the audit view)."""
        caller = await self._caller(request)
        body = MeBody(
            org_id=caller.org_id,
            user_id=caller.user_id,
            roles=sorted(caller.roles),
            audit=self._may_audit(caller),
        )
        return _json(body)

    async def list_decided(self, request: Request) -> Response:
        """`GET /me/decided`: the caller's decisions, newest first, with their sessions' users.

        Only the caller's own, in its own organisation: the trail is read for the caller's
        organisation and user (`who`), never for what the query names, and an entry whose
        content names another (its indexed `who` edited outside handrail) is left out. No
        audit role is needed; the rest of an entry (its reason, amended values, digest) is
        not shown.
        """
        caller = await self._caller(request)
        query = self._query(request, DecidedQuery)
        found = await self.store.audit(
            caller.org_id,
            who=caller.user_id,
            kind="decision",
            newest_first=True,
            before=query.before,
            limit=query.limit,
        )
        before = found[-1].seq if len(found) == query.limit else None
        found = [e for e in found if e.who == caller.user_id and e.kind == "decision"]
        session_ids = list(dict.fromkeys(e.session_id for e in found))
        summaries = await asyncio.gather(*(self.store.summary(s) for s in session_ids))
        owners = {
            session_id: summary.user_id
            for session_id, summary in zip(session_ids, summaries, strict=True)
            if summary is not None and summary.org_id == caller.org_id
        }
        items = [
            DecidedItem(
                seq=e.seq,
                session_id=e.session_id,
                tool_call_id=e.tool_call_id,
                tool=e.tool,
                decision=e.decision,
                at=e.at,
                owner=owners.get(e.session_id),
            )
            for e in found
        ]
        return _json(DecidedBody(decisions=items, before=before))

    async def call_outcome(self, request: Request) -> Response:
        """`GET /sessions/{id}/calls/{call_id}`: what came of a call, for who decided it.

        The session's owner reads it, and so does anyone who decided or approved the call
        (a colleague, who cannot read the session once nothing waits for them) or may decide
        it now; anyone else gets the 404 of a session that is not theirs.
        """
        caller = await self._caller(request)
        session_id = _session_id(request)
        call_id: str = request.path_params["tool_call_id"]
        if len(call_id) > _SESSION_ID_MAX or _CONTROL.search(call_id):
            raise ApiError(422, "invalid_request", f"Not a tool call id: {call_id[:40]!r}.")
        found = await self.store.summary(session_id)
        if found is None or found.org_id != caller.org_id:
            raise SessionNotFoundError.for_caller(session_id)
        state = await self.engine.session(session_id, org_id=found.org_id, user_id=found.user_id)
        running = self.runs.running(session_id)
        waiting = state.pending.get(call_id)
        approved_by = PendingCardPart.of(waiting).approved_by if waiting is not None else []
        outcome = call_outcome(
            state, call_id, approved_by=approved_by, session_status=found.status, running=running
        )
        owner = found.user_id == caller.user_id
        if outcome is None:
            if owner:
                raise ApiError(404, "not_found", f"No decision card for call {call_id!r}.")
            raise SessionNotFoundError.for_caller(session_id)
        body, deciders = outcome
        if not (owner or caller.user_id in deciders) and not (
            waiting is not None and self.engine.decidable(state, caller.decider())
        ):
            raise SessionNotFoundError.for_caller(session_id)
        return _json(body)

    async def describe_domain(self, request: Request) -> Response:
        """`GET /domain`: the agents (which keep to scratch) and the tools, with their schemas."""
        await self._caller(request)
        domain = self.engine.domain
        supervisor = domain.supervisor
        agents = [*domain.agents, *([supervisor] if supervisor is not None else [])]
        tools = {name: t for agent in domain.agents for name, t in agent.tools.items()}
        body = DomainBody(
            agents=[
                AgentBody(
                    name=agent.name,
                    scratch=agent.scratch or agent is supervisor,
                    supervisor=agent is supervisor,
                )
                for agent in agents
            ],
            tools=[
                ToolBody(
                    name=t.name,
                    description=t.description,
                    parameters=t.definition.parameters,
                    output_schema=t.output_adapter.json_schema() if t.output_adapter else None,
                    permission=t.permission,
                    executor=t.executor,
                    gated=t.gated,
                    amendable=list(t.amendable),
                    decision_policy=_policy_body(t, domain.policies),
                )
                for t in tools.values()
            ],
        )
        return _json(body)

    # -- turns ----------------------------------------------------------------------------

    async def submit_turn(self, request: Request) -> Response:
        """`POST /sessions/{id}/turns`: start a turn; 202 once it runs, or its event stream.

        With `Accept: text/event-stream` the answer is the turn's events (200, SSE) up to its
        end or suspension: one request instead of two, and the first event comes at once.
        """
        caller = await self._caller(request)
        org_id, user_id = caller.who
        session_id = _session_id(request)
        body = await self._body(request, TurnBody)
        client = self._query(request, ClientQuery).client
        if body.route is not None and body.route not in self.engine.domain.routes:
            routes = ", ".join(self.engine.domain.routes)
            raise ApiError(
                422, "invalid_request", f"route: no route {body.route!r} (routes: {routes})."
            )
        await self.admit(caller, via="http", session_id=session_id, text=body.text)
        run = self.engine.submit(
            session_id,
            body.text,
            org_id=org_id,
            user_id=user_id,
            route=body.route,
            client=client,
            create=False,  # the engine checks the session is the caller's as it loads it
            roles=caller.roles,  # what `tools_for` chooses the turn's tools from
            context=body.context,  # validated here: a bad one is a 422, nothing stored
        )
        self.limits.turn(caller, self.runs.running_for(org_id))
        after = await self.runs.start(session_id, run, caller)
        if "text/event-stream" in request.headers.get("accept", ""):
            # the turn's events, here
            return self._stream(request, session_id, after, forever=False)
        accepted = TurnAccepted(
            session_id=session_id, after=after, events=self._events_url(session_id, after)
        )
        return _json(accepted, 202)

    async def stream_events(self, request: Request) -> Response:
        """`GET /sessions/{id}/events`: the events after `Last-Event-ID`, then live ones."""
        _, session_id = await self._owned(request)
        query = self._query(request, EventsQuery)
        after = query.after
        if after is None:
            last = request.headers.get("last-event-id", "0").strip() or "0"
            # ASCII digits only: `str.isdigit` also takes "²" and other digits `int` refuses.
            if not (last.isascii() and last.isdigit()) or int(last) > MAX_NUMBER:
                raise ApiError(
                    422,
                    "invalid_request",
                    f"Last-Event-ID: not an event number (0 to {MAX_NUMBER}): {last[:40]!r}.",
                )
            after = int(last)
        return self._stream(request, session_id, after, forever=query.follow)

    def _stream(self, request: Request, session_id: str, after: int, *, forever: bool) -> Response:
        """The session's events after `after` as Server-Sent Events (see `Runs.follow`).

        A stream that fails once its 200 is sent (the store went away, a row it cannot read)
        ends with an `error` event naming the request id, never just a cut connection.
        """
        caller: Caller = request.state.caller
        self.limits.check_stream(caller)
        events = self.runs.follow(session_id, after, forever=forever)
        rid = request_id(request.scope)

        async def frames() -> AsyncGenerator[bytes, None]:
            # Counted while it runs: a stream whose client left before it began never counts.
            self.limits.open_stream(caller)
            async with contextlib.aclosing(events):
                try:
                    async for batch in events:  # every event there is now, in few writes
                        for chunk in _writes(batch):
                            if self.limits.stream_wait(caller):
                                async for keep_alive in self._within_bandwidth(caller):
                                    yield keep_alive
                            yield chunk
                            self.limits.sent(caller, len(chunk))
                except Exception as failure:
                    log_failure(
                        _log,
                        f"request {rid}: the event stream failed",
                        failure,
                        reference=rid,
                        request_id=rid,
                        session_id=session_id,
                    )
                    error = {
                        "type": "error",
                        "error": {
                            "type": "stream_failed",
                            "message": "The stream failed on the server; reconnect with "
                            "Last-Event-ID to go on from the last event you had.",
                            "request_id": rid,
                        },
                    }
                    yield error_frame(pydantic_core.to_json(error))
                finally:
                    self.limits.close_stream(caller)

        return EventStream(frames(), ping=self.ping_interval, send_timeout=self.send_timeout)

    async def resolve(self, request: Request) -> Response:
        """`POST /sessions/{id}/resolve`: decide pending calls; the turn resumes when ready."""
        # Scope first: another tenant's request never waits for this session's lock.
        caller, session_id, _ = await self._reachable(request)
        body = (await self._body(request, ResolveBody)).root
        items = body if isinstance(body, list) else [body]
        decisions = {
            item.tool_call_id: dataclasses.replace(item.decision, by=caller.user_id)
            for item in items
        }
        if len(decisions) < len(items):
            raise ApiError(422, "invalid_request", "A tool_call_id is decided twice.")
        client = self._query(request, ClientQuery).client
        resolution, after = await self.runs.resolve(session_id, decisions, caller, client=client)
        # A session's stream is its owner's: a colleague who decided gets no link to follow.
        owner = (resolution.org_id, resolution.user_id) == (caller.org_id, caller.user_id)
        answer = ResolutionBody(
            decided=resolution.decided,
            pending=resolution.pending,
            resumed=after is not None,
            after=after,
            events=self._events_url(session_id, after) if after is not None and owner else None,
        )
        return _json(answer)

    async def interrupt(self, request: Request) -> Response:
        """`POST /sessions/{id}/interrupt`: stop the running turn."""
        _, session_id = await self._owned(request)
        if not self.runs.interrupt(session_id):
            raise ApiError(409, "not_running", "No turn of this session is running here.")
        return _json(InterruptBody(), 202)
