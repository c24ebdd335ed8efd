"""Suite-wide guards: no test reaches a real model provider (or anything off this machine)."""

from __future__ import annotations

import gc
import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

import pytest

_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex


def _local(address: Any) -> bool:
    if not isinstance(address, tuple):  # a Unix socket path
        return True
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it would need DNS, which is not local
        return False


def _guarded_connect(self: socket.socket, address: Any) -> None:
    if not _local(address):
        raise RuntimeError(
            f"A test tried to connect to {address!r}: tests must not reach real model providers "
            f"or the network. Use handrail.testing.ScriptedModel / FunctionModel, or a fake "
            f"server on 127.0.0.1."
        )
    return _connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    if not _local(address):
        _guarded_connect(self, address)
    return _connect_ex(self, address)


@pytest.fixture(autouse=True, scope="session")
def _no_network() -> Iterator[None]:
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]
    yield
    socket.socket.connect = _connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _connect_ex  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _gc_as_it_was() -> Iterator[None]:
    """`handrail serve` tunes the garbage collector (`tune_gc`): undo it after a test."""
    threshold = gc.get_threshold()
    yield
    if gc.get_threshold() != threshold:
        gc.set_threshold(*threshold)
        gc.unfreeze()
