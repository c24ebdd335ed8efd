"""The collector of a served engine: tuned, and held off while turns are starting."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from handrail.server import _gc, tune_gc

from .conftest import Server


def _gate_loads(server: Server) -> tuple[asyncio.Event, asyncio.Event]:
    """Make the store's loads wait for the returned `go`; `loading` is set when one waits."""
    store = server.scenario.engine.store
    load = store.load
    loading, go = asyncio.Event(), asyncio.Event()

    async def gated(session_id: str) -> Any:
        loading.set()
        await go.wait()
        return await load(session_id)

    store.load = gated  # type: ignore[method-assign]
    return loading, go


async def test_young_collections_wait_for_the_first_events_of_starting_turns(
    server: Server,
) -> None:
    tune_gc()
    session_id = await server.new_session()
    loading, go = _gate_loads(server)
    submitted = asyncio.create_task(server.submit(session_id))
    await loading.wait()  # the turn is starting: no first event yet
    assert gc.get_threshold() == _gc.HELD
    go.set()
    await submitted  # its first event is logged
    await asyncio.sleep(0)  # and the pass after, the collector is as tuned again
    assert gc.get_threshold() == _gc.TUNED
    await server.join(session_id)


async def test_a_collector_the_server_did_not_tune_is_left_as_it_is(server: Server) -> None:
    gc.set_threshold(700, 10, 10)
    session_id = await server.new_session()
    loading, go = _gate_loads(server)
    submitted = asyncio.create_task(server.submit(session_id))
    await loading.wait()
    assert gc.get_threshold() == (700, 10, 10)
    go.set()
    await submitted
    await server.join(session_id)
    assert gc.get_threshold() == (700, 10, 10)


async def test_a_turn_that_fails_to_start_releases_the_collector(server: Server) -> None:
    tune_gc()
    response = await server.client.post(
        "/sessions/no-such-session/turns",
        json={"text": "hello"},
        headers={"Authorization": "Bearer key-ana"},
    )
    assert response.status_code == 404
    await asyncio.sleep(0)
    assert gc.get_threshold() == _gc.TUNED
