"""The server's log lines: a control character from outside never starts a line of its own."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from handrail.server import escape_logs


@pytest.fixture
def output() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        escape_logs()
        yield stream
    finally:
        root.removeHandler(handler)


def test_a_message_with_control_characters_stays_on_its_line(output: io.StringIO) -> None:
    forged = "ok\nINFO:     127.0.0.1 - admin logged in\r\x1b[31m"
    logging.getLogger("handrail.server").error("the provider said %s", forged)
    lines = output.getvalue().splitlines()
    said = r"ok\x0aINFO:     127.0.0.1 - admin logged in\x0d\x1b[31m"
    assert lines == [f"handrail.server: the provider said {said}"]


def test_a_traceback_keeps_its_lines_and_escapes_the_rest(output: io.StringIO) -> None:
    try:
        try:
            raise KeyError("first\nforged")
        except KeyError as error:
            raise ValueError("bad\nforged line") from error
    except ValueError:
        logging.getLogger("handrail.runs").exception("a turn failed")
    text = output.getvalue()
    assert "Traceback (most recent call last):\n" in text  # its own lines are kept
    assert "ValueError: bad\\x0aforged line" in text
    assert "KeyError: 'first\\nforged'" in text  # its repr escapes it already
    assert "The above exception was the direct cause of the following exception:" in text
    assert "\nforged" not in text


def test_a_plain_message_is_left_as_it_is(output: io.StringIO) -> None:
    logging.getLogger("handrail.server").warning("closed %d connections", 3)
    assert output.getvalue() == "handrail.server: closed 3 connections\n"
