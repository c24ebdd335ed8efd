"""The engine's concerns, one module each; `handrail.engine.Engine` is the facade over them.

Each concern is an object holding what it needs (`EngineCore`, the state they share, and the
concerns below it), made once by the facade; a session id goes down them, never back up:

- `_retry`: which store failures pass (`transient`), and how calls are retried (`StoreRetry`).
- `_core`: what every concern shares (the store, the runtime, the lease owner, the
  bookkeeping of this process's drives, a drive's `Hold`) and its store calls, made again
  while they fail for a moment.
- `_leases`: a drive's hold on its session's lease, the per-session lock, a lease lost.
- `_saving`: loading a session (in the caller's scope) and saving it (compare-and-swap, with
  the lease, the tool-call log and the wake-up in one write).
- `_journal`: a run's checkpoints and tool-call log under the engine.
- `_batches`: a headless turn's batch card: proposing it, applying it once decided.
- `_turns`: driving a turn (new, resumed, recovered, advanced) and the event log.
- `_headless`: runs with nobody present (`run_headless`, `apply`).
- `_deciding`: recording decisions (`resolve`, `resolve_many`) with their audit entries.
- `_chores`: the fleet's sweeps (`advance_due`, `reclaim`, `expire_due`, `client_left`,
  `prune`).
"""
