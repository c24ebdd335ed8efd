"""A waiting call is never lost to a crash: real processes, killed with SIGKILL (issue 16).

One model response holds a call that must wait (a gated charge, a question for a person, a
call the client runs) and `shipping.ship`, which runs at once and is not idempotent. The
worker (`tests/crash_cards_worker.py`) is killed around the ship, after the checkpoint that
puts the calls on record and before the suspension is saved; a fresh one takes the session
to the end with `Engine.advance`, deciding the cards as a person would. Whatever the kill
point, the waiting call's card was stored before the ship ran, the fresh worker asks for it
again, the call ends with its real result, the ship happened once and the charge once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from handrail.messages import ApprovalCardPart, ToolCallPart
from handrail.state import RunState
from handrail.store import SqliteStore

WORKER = Path(__file__).with_name("crash_cards_worker.py")
SESSION = "A1"
PLACEHOLDER = "No result yet"

# kind -> the waiting tool, its card's kind, the event that announces it, the decision taken
WAITING = {
    "approval": ("payments.charge", "approval", "approval-required", "approve"),
    "human": ("desk.ask", "elicitation", "input-required", "answer"),
    "client": ("label.print", "client_exec", "client-exec-required", "client_result"),
}
REAL = {"approval": "charged A1", "human": "gift note for A1", "client": "label printed for A1"}
POINTS = ["ship-started", "ship-done", "before-suspend-save"]


def run_worker(db: Path, effects: Path, kind: str, crash_at: str = "") -> tuple[int, str, str]:
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), str(db), str(effects), SESSION, kind, "0.3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CRASH_AT": crash_at},
    )
    out, err = worker.communicate(timeout=60)
    return worker.returncode, out, err


def ledger(effects: Path) -> Counter[str]:
    return Counter(effects.read_text().splitlines() if effects.exists() else [])


def stored(db: Path) -> tuple[str, RunState, dict[str, str]]:
    """The session as the killed worker left it: its status, state and tool-call log."""

    async def read() -> tuple[str, RunState, dict[str, str]]:
        store = SqliteStore(db)
        try:
            record = await store.load(SESSION)
            log = await store.tool_log(SESSION)
        finally:
            await store.close()
        assert record is not None
        state = RunState.load(record.data, messages=record.messages, base=record.messages_from)
        return record.status, state, {e.tool: e.status for e in log}

    return asyncio.run(read())


def line(out: str, prefix: str) -> Any:
    found = [ln[len(prefix) + 1 :] for ln in out.splitlines() if ln.startswith(prefix + " ")]
    assert len(found) == 1, out
    return json.loads(found[0])


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("kind", list(WAITING))
def test_a_waiting_call_survives_a_kill_next_to_the_ship(
    tmp_path: Path, kind: str, point: str
) -> None:
    tool, card_kind, event, decision = WAITING[kind]
    db, effects = tmp_path / "h.db", tmp_path / "effects.txt"

    code, out, err = run_worker(db, effects, kind, crash_at=point)
    assert code == -signal.SIGKILL, (out, err)

    # What the killed worker left: the turn cut off while running (the suspension was never
    # saved), the ship where the kill point says, and the waiting call's card on record.
    status, state, log = stored(db)
    assert status == "active" and state.progress is not None
    assert state.progress.status == "running"
    assert log == {"shipping.ship": "finished" if point == "before-suspend-save" else "started"}
    assert ledger(effects) == ({} if point == "ship-started" else {"ship A1": 1})
    message = state.find_message(state.progress.message_id)
    calls = {p.name: p for p in message.parts if isinstance(p, ToolCallPart)}
    assert calls[tool].status == "waiting"
    cards = [p for p in message.parts if isinstance(p, ApprovalCardPart)]
    assert [(c.tool_name, c.kind, c.decision) for c in cards] == [(tool, card_kind, None)]
    assert list(state.pending) == [calls[tool].id]

    code, out, err = run_worker(db, effects, kind)
    assert code == 0, err
    assert out.splitlines()[-1] == "done completed", out

    # The first `advance` suspended the recovered turn on the waiting call's card again (and
    # on a recovery card for the ship when its result was not logged), and announced them.
    recovered = line(out, "recovered")
    ship_card = [] if point == "before-suspend-save" else [["shipping.ship", "recovery"]]
    assert recovered["outcome"] == "suspended"
    assert recovered["pending"] == [[tool, card_kind], *ship_card]
    announced = [e for e in recovered["events"] if e[0] != "run-started"]
    ship_event = [["approval-required", "shipping.ship", "recovery"]] if ship_card else []
    waiting_event = [event, tool, "approval" if kind == "approval" else None]
    assert announced == [waiting_event, *ship_event, ["run-suspended", None, None]]

    # The ledger: shipped once (never twice, never lost), charged once when approved.
    assert ledger(effects) == {"ship A1": 1, **({"charge A1": 1} if kind == "approval" else {})}

    # The waiting call ended with its real result, and the model read that, never the
    # placeholder; no call was ever settled with the placeholder as its result.
    final = line(out, "final")
    results = {c["name"]: c for c in final["calls"]}
    assert list(results) == [tool, "shipping.ship"]
    assert results[tool] == {
        "name": tool,
        "status": "completed",
        "ok": True,
        "data": REAL[kind],
        "error": None,
    }
    assert not [c for c in final["calls"] if PLACEHOLDER in (c["error"] or "")]
    assert f"{tool} -> {REAL[kind]}" in final["text"]
    assert PLACEHOLDER not in final["text"]
    assert [tool, card_kind, decision] in final["cards"]
    ship = results["shipping.ship"]
    if point == "ship-done":  # it ran before the kill: the person skipped the retry
        assert ship["status"] == "rejected"
        assert ["shipping.ship", "recovery", "reject"] in final["cards"]
    else:  # it never ran (retried once, approved) or its logged result was used
        assert (ship["status"], ship["data"]) == ("completed", "shipped A1")
