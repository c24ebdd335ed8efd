"""One worker of the fleet test: `python fleet_worker.py DSN SCHEMA EFFECTS`.

It runs a `Worker` over the shared PostgreSQL store (resuming what others resolved,
recovering what dead workers left) and, like a support desk, decides pending cards of random
suspended sessions. SIGTERM stops it cleanly; the test also kills one with SIGKILL.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crash_worker import build, decide
from handrail import Worker
from handrail.exceptions import HandrailError
from handrail.store import PostgresStore


async def desk(engine: object, effects: Path, stop: asyncio.Event) -> None:
    """Decide the pending cards of a few random suspended sessions, again and again."""
    from handrail import Engine

    assert isinstance(engine, Engine)
    while not stop.is_set():
        suspended = await engine.store.list(status="suspended", limit=50)
        for summary in random.sample(suspended, min(5, len(suspended))):
            try:
                state = await engine.session(summary.id)
                for call_id, card in list(state.pending.items()):
                    await engine.resolve(summary.id, call_id, decide(card, summary.id, effects))
            except HandrailError:
                pass  # another desk decided first, or the session moved on
        await asyncio.sleep(random.uniform(0.005, 0.03))


async def main(dsn: str, schema: str, effects: str) -> None:
    store = await PostgresStore.connect(dsn, schema=schema, pool_size=4)
    engine = build(store, Path(effects), lease_ttl=1.0)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    try:
        await asyncio.gather(
            Worker(engine, poll_interval=0.2).run(stop), desk(engine, Path(effects), stop)
        )
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
