"""The suite's own guard: a test that reaches off this machine fails."""

from __future__ import annotations

import socket

import pytest


def test_connecting_off_the_machine_fails_the_test():
    with socket.socket() as sock, pytest.raises(RuntimeError, match="must not reach real model"):
        sock.connect(("203.0.113.9", 443))  # TEST-NET-3: never routed


def test_loopback_is_allowed():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.socket() as client:
            client.connect(server.getsockname())
