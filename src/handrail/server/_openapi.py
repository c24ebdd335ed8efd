"""The OpenAPI document, made from the same table of operations as the routes."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import Response

from ..events import EVENT
from ._bodies import ErrorBody

__all__ = ["Operation", "openapi"]

_REF = "#/components/schemas/{model}"
_ERRORS = {
    401: "No valid API key",
    403: "The caller may not do this, and the message names the rule: the call's decision "
    "policy does not let it make this decision (nothing was recorded), or reading the audit "
    "trail needs a role it lacks",
    404: "No such session for this caller (another tenant's included)",
    409: "The session is not in a state for this (the message says why)",
    413: "The body is too large",
    415: "The body is not sent as JSON (Content-Type: application/json)",
    422: "The request is invalid (`details` says where)",
    429: "Past a limit of the caller or its organisation (`Retry-After` says when to retry)",
    500: "The session cannot be read (session_corrupt), or the server failed (internal_error)",
    503: "The session store failed",
}


@dataclass(frozen=True, slots=True)
class Operation:
    """One endpoint: its route, its handler, and what the OpenAPI document says about it."""

    method: str
    path: str
    handler: Callable[[Request], Awaitable[Response]]
    summary: str
    status: int = 200
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    errors: tuple[int, ...] = ()
    stream: bool = False
    stream_on_accept: bool = False  # with `Accept: text/event-stream`, 200 and the events
    foreign_events: str | None = None
    """A stream of another protocol's events (named here), not handrail's: no event numbers."""
    no_content: str | None = None
    """When the operation may also answer 204 (and why)."""
    ndjson: str | None = None
    """What the operation answers with `Accept: application/x-ndjson` (JSON lines), if it can."""


def openapi(operations: list[Operation], *, title: str, version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `operations` (and of `/openapi.json` itself)."""
    models: set[type[BaseModel]] = {ErrorBody}
    for op in operations:
        models.update(m for m in (op.body, op.response) if m is not None)
    refs, defs = models_json_schema(
        [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)], ref_template=_REF
    )
    schemas = dict(defs.get("$defs", {}))
    event = EVENT.json_schema(ref_template=_REF)
    schemas.update(event.pop("$defs", {}))
    schemas["Event"] = event

    def ref(model: type[BaseModel]) -> dict[str, Any]:
        return refs[(model, "validation")]

    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        responses: dict[str, Any] = {str(op.status): _success(op, ref)}
        if op.no_content is not None:
            responses["204"] = {"description": op.no_content}
        if op.stream_on_accept:
            responses["200"] = {
                "description": "With `Accept: text/event-stream`: this turn's events, as "
                "Server-Sent Events (`id` is the event's number, `data` the event)",
                "content": {"text/event-stream": {"schema": {"$ref": _REF.format(model="Event")}}},
            }
        errors = {401, 429, 500, 503, *op.errors}
        if op.body is not None:
            errors |= {413, 415, 422}
        if op.query is not None or "{" in op.path:
            errors.add(422)  # a bad query parameter, or a session id no store could hold
        for status in sorted(errors):
            responses[str(status)] = {
                "description": _ERRORS[status],
                "content": {"application/json": {"schema": ref(ErrorBody)}},
            }
        operation: dict[str, Any] = {
            "operationId": op.handler.__name__,
            "summary": op.summary,
            "parameters": _parameters(op),
            "responses": responses,
        }
        if op.body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": ref(op.body)}},
            }
        paths.setdefault(op.path, {})[op.method.lower()] = operation
    paths["/openapi.json"] = {
        "get": {
            "operationId": "openapi",
            "summary": "This document",
            "security": [],
            "responses": {"200": {"description": "The OpenAPI document"}},
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"apiKey": []}],
    }


def _success(op: Operation, ref: Callable[[type[BaseModel]], dict[str, Any]]) -> dict[str, Any]:
    if op.stream and op.foreign_events is not None:
        return {
            "description": f"Server-Sent Events: {op.foreign_events}",
            "content": {"text/event-stream": {"schema": {"type": "object"}}},
        }
    if op.stream:
        return {
            "description": "Server-Sent Events: `id` is the event's number, `data` the event",
            "content": {"text/event-stream": {"schema": {"$ref": _REF.format(model="Event")}}},
        }
    if op.status == 204:
        return {"description": "Done"}
    schema = ref(op.response) if op.response is not None else {"type": "object"}
    content: dict[str, Any] = {"application/json": {"schema": schema}}
    if op.ndjson is not None:
        content["application/x-ndjson"] = {"schema": {"type": "string"}}
        return {"description": f"{op.summary}; {op.ndjson}", "content": content}
    return {"description": op.summary, "content": content}


def _parameters(op: Operation) -> list[dict[str, Any]]:
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"\{(\w+)\}", op.path)
    ]
    if op.query is not None:
        schema = op.query.model_json_schema(ref_template=_REF)
        required = set(schema.get("required", ()))
        for name, field in schema["properties"].items():
            parameters.append(
                {
                    "name": name,
                    "in": "query",
                    "required": name in required,
                    "description": field.get("description", ""),
                    "schema": {k: v for k, v in field.items() if k != "description"},
                }
            )
    if op.stream and op.foreign_events is None:
        parameters.append(
            {
                "name": "Last-Event-ID",
                "in": "header",
                "required": False,
                "description": "Resume after this event (what EventSource sends on reconnect).",
                "schema": {"type": "string"},
            }
        )
    return parameters
