"""The one command lifecycle (engine.steering.lifecycle) on a real run.db: rows received, deferred
to their boundary, paused and resumed, applied or refused, and nothing left "received" at the end.
Then: the Trainer's and the integrations' sides use it, and declare none of its facts again."""
from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.declarations.commands import Pause, SetAccum, SetLr, Stop, Unpause
from engine.declarations.events import CommandReceived, CommandRefused, Event, Paused, Resumed
from engine.steering.lifecycle import PAUSE_POLL_S, Lifecycle, Received, while_paused
from engine.store import RunReader, RunStore, send_command
from testkit import ROOT


@pytest.fixture
def run(tmp_path):
    """A real run store and the lifecycle over it, its events kept."""
    store = RunStore(str(tmp_path))
    events: list[Event] = []

    def emit(event: Event) -> None:
        events.append(event)
        store.record(event)

    life = Lifecycle(emit, store)
    yield tmp_path, store, life, events
    store.close()


def statuses(run_dir) -> dict[int, tuple[str, str]]:
    reader = RunReader(str(run_dir))
    try:
        return {r["id"]: (r["status"], r["note"] or "") for r in reader.commands()}
    finally:
        reader.close()


def test_rows_are_received_deferred_to_their_boundary_and_applied(run):
    run_dir, store, life, events = run
    step_row = send_command(str(run_dir), SetLr(0.5, at="step"))
    epoch_row = send_command(str(run_dir), SetAccum(4))
    fresh = life.read_rows(step=3, epoch=1)
    assert [r.row for r in fresh] == [step_row, epoch_row] and life.rows_read == 2
    for item in fresh:
        at_step = item.cmd.at == "step"
        life.announce(item, 3, 1, "step" if at_step else "epoch", None if at_step else 2)
        life.defer(item, None if at_step else 2)
    assert [e.applies for e in events if isinstance(e, CommandReceived)] == ["step", "epoch"]
    assert life.has_step_commands() and life.next_due() == 2
    [now] = life.take()  # a step boundary: the step's command only
    assert now.row == step_row and not life.has_step_commands()
    assert life.take(epoch=1) == []  # epoch 2 has not begun
    [later] = life.take(epoch=2)
    assert later.row == epoch_row and life.pending == []
    life.applied(now, 4)
    life.refuse(later, "not here", 8, 2)
    store.commit()
    assert statuses(run_dir) == {step_row: ("applied", ""), epoch_row: ("refused", "not here")}
    assert [e.reason for e in events if isinstance(e, CommandRefused)] == ["not here"]


def test_a_malformed_row_and_a_run_that_takes_no_commands_refuse_as_they_read(run):
    run_dir, store, life, events = run
    import sqlite3
    db = sqlite3.connect(run_dir / "run.db")
    db.execute("INSERT INTO commands (time, kind, payload) VALUES (?, 'set_lr', 'not json')", (time.time(),))
    db.commit()
    db.close()
    good = send_command(str(run_dir), SetLr(0.1))
    assert life.read_rows(1, 1, refuse_all="this loop takes no commands") == []
    assert life.rows_read == 2
    store.commit()
    marks = statuses(run_dir)
    assert marks[good] == ("refused", "this loop takes no commands")
    assert [s for s, _ in marks.values()] == ["refused", "refused"]
    refused = [e.command for e in events if isinstance(e, CommandRefused)]
    assert refused[0].startswith("row ") and refused[1] == "set_lr"


def test_pause_and_resume_change_paused_and_an_idle_resume_is_refused_only_when_asked(run):
    run_dir, store, life, events = run
    rows = [send_command(str(run_dir), c) for c in (Pause(), Pause(), Unpause(), Unpause(), Unpause())]
    items = life.read_rows(5, 2)
    paused = False
    for item, idle in zip(items, ("", "", "", "", "nothing is paused")):
        paused = life.pause_or_resume(item, paused, 5, 2, Paused(5, 1), Resumed(5, 2), idle_resume=idle)
    assert not paused
    assert [type(e).__name__ for e in events] == ["Paused", "Unpaused", "CommandRefused"]  # one pause, one resume
    store.commit()
    marks = statuses(run_dir)
    assert [marks[r][0] for r in rows] == ["applied", "applied", "applied", "applied", "refused"]


def test_a_paused_wait_sleeps_between_looks_until_the_state_changes():
    looks = []
    t0 = time.monotonic()
    for _ in while_paused(lambda: len(looks) < 3):
        looks.append(time.monotonic())
    assert len(looks) == 3 and time.monotonic() - t0 >= 3 * PAUSE_POLL_S * 0.9
    assert list(while_paused(lambda: False)) == []  # not paused: no wait at all


def test_at_the_end_a_stop_is_applied_and_the_rest_refused_saying_why(run):
    run_dir, store, life, events = run
    stop = send_command(str(run_dir), Stop())
    accum = send_command(str(run_dir), SetAccum(2))
    items = life.read_rows(7, 3)
    life.defer(items[1], 4)
    queued = Received(SetLr(0.2))  # in process: its sender sees the run end, no event
    life.end(7, 3, [items[0], *life.take_all(), queued], lambda item: f"the run ended before epoch {item.due}")
    store.commit()
    assert statuses(run_dir) == {stop: ("applied", ""), accum: ("refused", "the run ended before epoch 4")}
    assert [(e.command, e.reason) for e in events if isinstance(e, CommandRefused)] == [
        ("set_accum", "the run ended before epoch 4")]


def test_the_core_loads_without_torch():
    code = "import sys, engine.steering.lifecycle; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- one declaration per fact ------------------------------------------------------------------------

SIDES = ("engine/steering", "engine/integrations", "engine/declarations", "engine/trainer")


def assigned_names(name: str) -> list[str]:
    """The modules of the steering sides that assign `name` at module level."""
    found = []
    for side in SIDES:
        for path in sorted((ROOT / side).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in tree.body:
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, ast.AnnAssign) else [])
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    found.append(str(path.relative_to(ROOT)))
    return found


def calls_of(callee: str) -> list[str]:
    """The modules of the steering sides that construct or call `callee` by name."""
    found = []
    for side in SIDES:
        for path in sorted((ROOT / side).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == callee:
                    found.append(str(Path(path).relative_to(ROOT)))
    return found


def test_the_lifecycle_facts_are_declared_once():
    assert assigned_names("PAUSE_POLL_S") == ["engine/steering/lifecycle.py"]
    assert set(calls_of("LrHint")) == {"engine/declarations/rules.py"}  # lr_hint, the engine's and the loops'
    assert set(calls_of("CommandReceived")) == {"engine/steering/lifecycle.py"}  # the receipt
    # the refusal: the lifecycle's, and the rules' own (a batch of settings, refused in one pass)
    assert set(calls_of("CommandRefused")) == {"engine/steering/lifecycle.py", "engine/declarations/rules.py"}
    assert all(path != "engine/integrations/_loop_steering.py" for path in calls_of("mark_command"))
    assert all("time.sleep" not in (ROOT / p).read_text() for p in ("engine/steering/boundaries.py",
                                                                    "engine/integrations/_loop_steering.py"))
