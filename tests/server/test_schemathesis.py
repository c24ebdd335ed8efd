"""A bounded schemathesis run against the OpenAPI document, on a live server: no 500s.

Each operation gets `max_examples` generated requests (derandomized: the same ones every
run), sent with a valid API key to uvicorn in a thread. Operations on a session are sent to a
fresh real session (a random id would only ever answer 404), except the event stream, which
on a session with no finished turn waits for one by design.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
import uvicorn
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.testclient import TestClient

from handrail.demo.support_desk import build_scenario
from handrail.server import Limits, create_app

from .conftest import ANA, authenticator

# No 5xx, and what is answered (status, type, body) matches the document.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    response_schema_conformance,
    content_type_conformance,
]

# Thousands of requests from one key in seconds: no rate limit here (tests/server/test_limits.py).
app = create_app(
    build_scenario().engine,
    authenticator=authenticator(),
    static_dir=None,
    limits=Limits(rate=None),
)
schema = schemathesis.openapi.from_dict(TestClient(app).get("/openapi.json").json())


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[str, _Errors]]:
    """The support desk's app under uvicorn in a thread; its URL, and the errors it logs."""
    errors = _Errors()
    loggers = [logging.getLogger(n) for n in ("handrail.server", "uvicorn.error")]
    for logger in loggers:
        logger.addHandler(errors)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():  # uvicorn offers no event to wait on
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", errors
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        for logger in loggers:
            logger.removeHandler(errors)


@schema.parametrize()
@hypothesis.settings(
    max_examples=30,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(hypothesis.HealthCheck),
)
def test_no_request_makes_a_server_error(case: Any, live: tuple[str, _Errors]) -> None:
    url, _ = live
    if "session_id" in (case.path_parameters or {}) and not case.path.endswith("/events"):
        created = requests.post(f"{url}/sessions", headers=ANA, timeout=10)
        case.path_parameters["session_id"] = created.json()["id"]
    case.call_and_validate(base_url=url, headers=ANA, checks=CHECKS, timeout=10)


def test_and_nothing_failed_in_the_background(live: tuple[str, _Errors]) -> None:
    """The turns those requests started ran without an error logged (run after the above)."""
    _, errors = live
    while app.state.runs._tasks:
        time.sleep(0.01)  # a failure in the background is logged, not answered
    assert [r.getMessage() for r in errors.records] == []
