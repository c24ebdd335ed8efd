"""The garbage collector of a long-running server: cheap, and out of the way of a burst.

`tune_gc` (which `serve` calls) makes young collections rare; `hold`/`release` make them rarer
still while turns are starting (`Runs`), so that a burst of new turns reaches its first events
without the collections its own allocations would set off on the way: they come once the
first events are out, where they delay events of turns already streaming instead.
"""

from __future__ import annotations

import gc

__all__ = ["hold", "release", "tune_gc"]

TUNED = (5_000, 20, 100)
"""The collector's thresholds once tuned: a young collection every 5,000 allocations (net of
deallocations), the middle generation's every 20 of them, the oldest's as Python decides."""
HELD = (100_000, 1, 100)
"""The same while turns are starting: a burst of 200 turns allocates 40,000-55,000 objects
before the last one's first event (bench/server.py, SQLite the most), and a young collection
costs about the same per object whenever it runs, so it may as well run after the first
events. The middle generation is collected every other one of these, so that it stays about
as small as when tuned (it counts young collections, not objects: 20 of 100,000 would let it
grow to two million, and its collections pause the server for hundreds of milliseconds)."""


def tune_gc() -> None:
    """Make the garbage collector cheap for a long-running server (`serve` calls it).

    Freezes what exists now (the engine, the app, imported modules: they live as long as the
    process) out of the collector's sight, and collects the youngest objects every 5,000
    allocations instead of 700: fewer collections under load, each still short. (Not many
    more: the count is allocations minus deallocations, so while old objects are freed the
    young ones pile up past it; at 50,000, single collections paused the server for 25-45 ms
    under 200 concurrent turns, `bench/server.py`.) While turns are starting, young
    collections wait longer (see `hold`).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*TUNED)


def hold() -> None:
    """Put young collections off while turns are starting (`release` when none is).

    Only when the collector is tuned by `tune_gc`: a process that tunes its own is left as it is.
    """
    if gc.get_threshold() == TUNED:
        gc.set_threshold(*HELD)


def release() -> None:
    """Collect young objects as `tune_gc` set, again (the first collection may come at once)."""
    if gc.get_threshold() == HELD:
        gc.set_threshold(*TUNED)
