"""A drive's hold on its session's lease, the per-session lock, a lease lost to another process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable

from ..exceptions import SessionBusyError, StoreError
from ..store import SessionRecord
from ._core import EngineCore, Hold
from ._events import RunLog

_log = logging.getLogger("handrail.engine")


class Leases:
    """The leases this engine's drives hold, and the lock each session is driven under."""

    __slots__ = ("core",)

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    @contextlib.asynccontextmanager
    async def leased(
        self, session_id: str, log: RunLog | None = None
    ) -> AsyncIterator[tuple[Hold, SessionRecord | None]]:
        """Hold the session's lease (one worker drives a session), renewed while held.

        Yields the drive's hold and the session as read (`None`: there is none). The read
        writes nothing: the lease is taken by the drive's first write, in its transaction,
        with the compare-and-swap on the version it read (`Saving.save`), before anything a second
        driver must not repeat (a side effect, a model call). A session this engine has just
        claimed (`claim`, `reclaim`) is held already. Renewed every `lease_ttl / 3` once held.
        """
        core = self.core
        store, owner, ttl = core.store, core.lease_owner, core.lease_ttl
        core.lost.discard(session_id)  # (this process's drives of a session take turns)
        claimed = core.claimed.pop(session_id, None)
        # A claim still fresh holds the lease for long enough: renewed from now on, in time.
        held = claimed is not None and time.monotonic() - claimed < ttl / 3
        try:
            loaded = await store.load(session_id)
        except Exception as error:
            loaded = await core.retry(
                error,
                lambda: store.load(session_id),
                session_id,
                "load the session",
                left="Nothing was done: try again once the store answers.",
            )
        # A timer until the lease is due for renewal, and a task only then: most turns end
        # before, and a task each (with its cancellation) was a cost of every turn's start.
        loop = asyncio.get_running_loop()
        renewal: asyncio.Task[None] | None = None
        timer: asyncio.TimerHandle | None = None
        holding = True  # False once the drive is over: no renewal may start or go on after

        async def stop() -> None:
            nonlocal holding
            holding = False
            if timer is not None:
                timer.cancel()
            if renewal is not None:
                renewal.cancel()
                await asyncio.wait([renewal])

        def start() -> None:  # the lease is held at the store from now on
            nonlocal timer
            if holding:
                timer = loop.call_later(ttl / 3, due)

        def due() -> None:
            nonlocal renewal
            if holding:
                renewal = loop.create_task(renew())

        async def renew() -> None:
            nonlocal timer
            try:
                renewed = await store.acquire_lease(session_id, owner, ttl)
            except Exception as error:  # the store is away: try again soon, the lease holds
                _log.warning(
                    "handrail engine %s: renewing the lease on session %r failed (%s: %s); "
                    "trying again",
                    owner,
                    session_id,
                    type(error).__name__,
                    error,
                )
                if holding:
                    timer = loop.call_later(ttl / 10, due)
                return
            if renewed:
                if holding:
                    timer = loop.call_later(ttl / 3, due)
            else:
                self.lose(session_id)

        hold = core.holds[session_id] = Hold(stop, start, log)
        if held:
            hold.take()
        try:
            yield hold, loaded
        finally:
            if core.holds.get(session_id) is hold:
                del core.holds[session_id]
            await stop()
            # Not taken (the drive wrote nothing), or given back by its last save: done.
            if (hold.held or hold.early) and not hold.released:
                try:
                    try:
                        await store.release_lease(session_id, owner)
                    except Exception as error:
                        release = lambda: store.release_lease(session_id, owner)  # noqa: E731
                        await core.retry(error, release, session_id, "release the lease")
                except Exception as error:  # it lapses after `lease_ttl`, as a dead worker's does
                    _log.warning(
                        "handrail engine %s: could not release the lease on session %r (%s); it "
                        "lapses in %g s",
                        owner,
                        session_id,
                        error,
                        ttl,
                    )

    async def take_early(self, session_id: str, version: int) -> None:
        """Take the lease of a session whose turn is marked running, before recovering it.

        Such a turn was cut off (its worker died: its lease lapsed or was given back), or
        another process drives it right now (it holds the lease). Only the lease tells the
        two apart, so a recovery asks for it first, before it says it recovers anything or
        reads the tool-call log: one write, where the other drives write none before their
        first save (a recovery is rare; a worker woken for a session another process drives
        is not, and must not cry "cut off"). Its first save still carries the lease.

        The lease taken, the session must still be at `version` (the one read): a turn that
        ended (its lease given back with its last save) between the read and the lease is
        read again, not recovered.

        Raises:
            Taken: the lease is another's: the session is left to it, nothing written.
            Stale: the session was saved since it was read at `version`: read it again.
        """
        core = self.core
        hold = core.holds.get(session_id)
        if hold is None or hold.held or hold.early:
            return  # held already (a claim), or no drive of this engine's (nothing to hold)
        store, owner, ttl = core.store, core.lease_owner, core.lease_ttl
        taken = await core.retrying(
            lambda: store.acquire_lease(session_id, owner, ttl), session_id, "take the lease"
        )
        if not taken:
            _log.debug(
                "handrail engine %s: session %r is driven by another process; left to it",
                owner,
                session_id,
            )
            raise Taken("the lease is another's", session_id=session_id)
        hold.take(early=True)  # given back when the drive ends, whatever happens next
        now = await core.retrying(
            lambda: store.summary(session_id), session_id, "read the session's version"
        )
        if now is None or now.version != version:
            raise Stale(f"saved since it was read at version {version}", session_id=session_id)

    def lose(self, session_id: str) -> None:
        """Another process took this session's lease (`reclaim`): stop, and write nothing more.

        The turn is interrupted; its saves and side effects are refused from now on, so the
        process that holds the lease is the only one that acts.
        """
        _log.warning(
            "handrail engine %s: the lease on session %r was taken over; stopping its turn",
            self.core.lease_owner,
            session_id,
        )
        self.core.lost.add(session_id)
        self.core.interrupt(session_id)

    def lost_lease(self, session_id: str) -> SessionBusyError:
        return SessionBusyError(
            f"Session {session_id!r}: this process ({self.core.lease_owner}) lost its lease to "
            f"another one, so it acts no more for it; the other process goes on."
        )

    def lock(self, session_id: str) -> asyncio.Lock:
        lock = self.core.locks.get(session_id)
        if lock is None:
            lock = self.core.locks[session_id] = asyncio.Lock()
        return lock

    async def check_lease(self, session_id: str) -> None:
        """Refuse to act for a session whose lease this process no longer holds."""
        core = self.core
        if session_id in core.lost:
            raise self.lost_lease(session_id)
        store, owner, ttl = core.store, core.lease_owner, core.lease_ttl
        held = await core.retrying(
            lambda: store.acquire_lease(session_id, owner, ttl),
            session_id,
            "check the lease before a side effect",
        )
        if not held:
            core.lost.add(session_id)
            raise self.lost_lease(session_id)

    def note_claimed(self, session_ids: Iterable[str]) -> None:
        core, at = self.core, time.monotonic()
        for session_id in session_ids:
            core.claimed[session_id] = at
        if len(core.claimed) > 10_000:  # claimed and never driven: forget the stale ones
            stale = [s for s, t in core.claimed.items() if at - t >= core.lease_ttl / 3]
            for session_id in stale:
                del core.claimed[session_id]


class Stale(StoreError):
    """A drive's first write found the session saved since the drive read it; nothing written.

    Nothing the drive did mattered yet (its first write comes before any side effect or
    model call, and its events were held back), so it reads the session again and starts
    over.
    """


class Taken(StoreError):
    """A drive's first write found the session's lease another worker's; nothing written.

    Raised through the turn as a store's failure is (so the turn stops right there), and
    handed to the caller as `SessionBusyError`.
    """


def busy(session_id: str) -> SessionBusyError:
    return SessionBusyError(
        f"Session {session_id!r} is being driven by another worker right now; wait for its "
        f"run to end (or for its lease to expire if that worker died)."
    )
