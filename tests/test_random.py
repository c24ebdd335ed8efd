"""`handrail._random.token_hex`: ids from the OS's generator, a block at a time."""

from __future__ import annotations

import os
import re

import pytest

from handrail._random import token_hex
from handrail.runtime import random_ids


def test_hex_of_the_asked_length_and_never_repeated() -> None:
    tokens = [token_hex(8) for _ in range(5000)]  # past a block of 4 KiB, several times
    assert all(re.fullmatch(r"[0-9a-f]{16}", t) for t in tokens)
    assert len(set(tokens)) == len(tokens)
    assert len(token_hex(6)) == 12
    assert len(token_hex(5000)) == 10000  # more than a block: read at once


def test_random_ids_use_it() -> None:
    assert re.fullmatch(r"msg_[0-9a-f]{16}", random_ids("msg"))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_hands_out_the_parents_bytes() -> None:
    token_hex(8)  # the parent holds a block with bytes still unused
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, " ".join(token_hex(8) for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    parent = [token_hex(8) for _ in range(4)]
    assert len(child) == 4 and not set(child) & set(parent)
