"""`handrail worker`: drive an app's sessions with no web server, until a signal drains it."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Annotated

import typer

from ..config import Settings
from ..store import MemoryStore
from ..worker import Worker
from ._common import CliError, one_line_errors, run
from ._open import opened_app, where
from ._options import AppInProcess, Dsn, OverDb, Schema

__all__ = ["worker"]


@one_line_errors
def worker(
    target: AppInProcess,
    db: OverDb = None,
    dsn: Dsn = None,
    schema: Schema = "public",
    worker_id: Annotated[
        str | None,
        typer.Option(
            help="This worker's stable name in session leases (a pod or host name, one per "
            "process): restarted under it, the worker takes its turns back at once. Default: "
            "the app's (HANDRAIL_WORKER_ID, else a random one).",
            envvar="HANDRAIL_WORKER_ID",
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option(help="Sessions driven (turns resumed or recovered) at once.", min=1)
    ] = 4,
    sweep_interval: Annotated[
        float,
        typer.Option(
            help="Seconds between sweeps: decided turns nobody resumed, turns whose worker "
            "died, cards past their deadline.",
            min=0.01,
        ),
    ] = 1.0,
    shutdown_grace: Annotated[
        float,
        typer.Option(
            help="On SIGTERM or SIGINT, seconds the turns being driven get to finish; then "
            "they are cut off (their leases given back) and another worker recovers them.",
            min=0,
        ),
    ] = 30.0,
    health_interval: Annotated[
        float,
        typer.Option(help="Seconds between health lines in the log (0: none).", min=0),
    ] = 60.0,
    retention_days: Annotated[
        float | None,
        typer.Option(
            help="Delete finished sessions nobody touched for this many days (default: keep).",
            min=0,
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="The log level (info, warning, ...).")] = "info",
) -> None:
    """Drive an app's sessions with no web server: what `handrail serve` runs besides HTTP.

    Resumes turns decided anywhere (woken by the store, or found by a sweep), recovers turns
    whose worker died, expires cards past their deadline, under the sessions' leases: run as
    many workers as you like on one store (PostgreSQL; SQLite on one machine). SIGTERM or
    SIGINT drains: no new work, the turns being driven finish (for --shutdown-grace
    seconds), the app is closed, exit 0; a second signal stops at once.
    """
    _log_to(log_level)
    # The store and the worker id as every command reads them (flag, else HANDRAIL_*); the
    # sweeps, the grace and the retention the worker's own flags, with its own defaults.
    settings = Settings.resolve(
        {"db": db, "dsn": dsn, "schema": schema, "worker_id": worker_id}
    ).replace(
        sweep_interval=sweep_interval,
        shutdown_grace=shutdown_grace,
        retention_days=retention_days,
    )
    try:
        run(_work(target, settings, concurrency=concurrency, health=health_interval or None))
    except asyncio.CancelledError:  # a second signal: stopped at once
        raise typer.Exit(130) from None


async def _work(target: str, settings: Settings, *, concurrency: int, health: float | None) -> None:
    """`handrail worker`: open the app, run a `Worker` on its store until a signal, drain."""
    log = logging.getLogger("handrail.worker")
    stop = asyncio.Event()
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def signalled(name: str) -> None:
        if stop.is_set():
            log.warning(
                "handrail worker: %s, a second signal: stopping now (turns in flight cut off)", name
            )
            if main is not None:
                main.cancel()
            return
        log.info("handrail worker: %s: draining (a second signal stops at once)", name)
        stop.set()

    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, signalled, sig.name)
    try:
        async with opened_app(target, settings) as engine:
            if isinstance(engine.store, MemoryStore):
                raise CliError(
                    f"{target}'s store is a MemoryStore, which only this process would see: "
                    f"a worker drives the sessions of a store others share. Pass --db FILE or "
                    f"--dsn (PostgreSQL), or give the app such a store."
                )
            worker_ = Worker(
                engine,
                poll_interval=settings.sweep_interval,
                concurrency=concurrency,
                max_backoff=max(300.0, settings.sweep_interval),
                retention=settings.retention,
                health_interval=health,
            )
            log.info(
                "handrail worker %s: started on %s (concurrency %d, sweeps every %g s)",
                engine.lease_owner,
                where(engine.store),
                concurrency,
                settings.sweep_interval,
            )
            await worker_.run(stop, grace=settings.shutdown_grace)
            log.info("handrail worker %s: stopped: %s", engine.lease_owner, worker_.stats.line())
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def _log_to(level: str) -> None:
    """Write handrail's log lines to stderr at `level`, unless the app set up logging."""
    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise CliError(f"--log-level {level!r}: not a level (debug, info, warning, error).")
    if not logging.getLogger().handlers:
        logging.basicConfig(level=number, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("handrail").setLevel(number)
