"""What the window sends is only what the user changed, against the run's current values.

A run steered by another client (headroom-ctl) and then opened in the window: the form shows the
run's live settings as the run has them now (from its own rows and settings_applied events), not
the values it started with; changing one field sends that field alone, and the other client's
changes stay. The same for a window opened again on a run the window itself had steered, and for
a change another client makes while the window follows the run (the form follows it, and a field
the user is editing keeps the user's value). The issue's reproduction, through the real window
and a real engine in another process.
"""
from __future__ import annotations

import os
import sys
from typing import Any

import pytest
from app_helpers import ROOT, discard, wait_until

sys.path.insert(0, os.path.join(ROOT, "tests", "ctl"))
from ctlkit import LiveRun, ctl  # noqa: E402 - after the sys.path set-up above

pytestmark = pytest.mark.slow  # an engine in another process, steered by two clients

# The run: micro-batch 4 x accumulation 16, lr 0.001, clip 1 (the engine's default clip).
RUN_ARGS = ("--micro-batch", "4", "--accum", "16", "--lr", "0.001", "--clip", "1", "--device", "cpu")


def applied_rows(run_dir: str) -> list[list[Any]]:
    """run.db's settings_applied changes, oldest first: [[name, old, new], ...] per event."""
    from engine.store import RunReader
    r = RunReader(run_dir)
    try:
        return [e["data"]["changes"] for e in r.events(kinds=["settings_applied"])]
    finally:
        r.close()


def form(w: Any) -> dict[str, Any]:
    return {n: w.controls.live.field_value(n) for n in ("micro_batch", "accum", "lr", "clip")}


def apply_and_wait(qtbot: Any, w: Any, name: str, n_before: int, run_dir: str) -> list[list[Any]]:
    """Apply the form's edits at the next step and return the settings_applied change they made.
    At the next step, not the epoch's end: micro-batch 4 makes an epoch 1,024 micro-batches, and
    waiting for two epoch ends took 90 of the test's 130 s on a loaded machine. When a change
    lands is not what is checked here; what it sends is."""
    w.controls.set_apply_when("step")
    w.apply_changes()
    wait_until(qtbot, lambda: w.controls.status_text(name).startswith("applied"), 60, f"{name} applied")
    rows = applied_rows(run_dir)
    assert len(rows) == n_before + 1, rows
    return rows[-1]


def test_one_edit_sends_one_change_on_a_run_another_client_steered(qtbot, make_window, tmp_path):
    run_dir = str(tmp_path / "R")
    engine = LiveRun(run_dir, *RUN_ARGS)
    try:
        engine.wait_live(rows=2)
        r = ctl("set", run_dir, "lr=5e-4", "accum=32", "--at", "step", "--wait")
        assert r.returncode == 0, r.stderr
        before = applied_rows(run_dir)
        assert sorted(map(tuple, before[-1])) == [("accum", 16, 32), ("lr", 0.001, 0.0005)]

        # Opened in the window: the form holds what the run trains with now.
        w = make_window()
        assert w.open_run(run_dir)
        assert w.session.remote
        assert form(w) == {"micro_batch": 4, "accum": 32, "lr": 0.0005, "clip": 1.0}, form(w)
        assert "changed since its start" in w.form_sync.banner.label.text()
        # The field's note is the run's own: applied, by another client, not by the lr scaling rule.
        assert w.controls.status_text("lr").startswith("applied: 0.0005"), w.controls.status_text("lr")
        assert "lr scaling rule" not in w.controls.status_text("lr")
        assert w.controls.edits() == {}

        # One field changed: one change sent, the other client's changes kept.
        w.controls.clip.setText("3")
        assert w.controls.edits() == {"clip": 3.0}
        assert apply_and_wait(qtbot, w, "clip", len(before), run_dir) == [["clip", 1.0, 3.0]]
        discard(w)

        # Opened again after the window quit: the window's own change and the other client's show.
        w2 = make_window()
        assert w2.open_run(run_dir)
        assert form(w2) == {"micro_batch": 4, "accum": 32, "lr": 0.0005, "clip": 3.0}, form(w2)

        # Another client changes accumulation while the user edits the lr (not applied yet): the
        # untouched field follows the run, the user's edit stays the user's.
        w2.controls.lr.setText("0.0002")
        n = len(applied_rows(run_dir))
        r = ctl("set", run_dir, "accum=8", "--at", "step", "--wait")
        assert r.returncode == 0, r.stderr
        wait_until(qtbot, lambda: w2.controls.live.field_value("accum") == 8, 30, "the form to follow accum 8")
        assert w2.controls.live.field_value("lr") == 0.0002
        assert w2.controls.edits() == {"lr": 0.0002}
        assert apply_and_wait(qtbot, w2, "lr", n + 1, run_dir) == [["lr", 0.0005, 0.0002]]
        assert form(w2) == {"micro_batch": 4, "accum": 8, "lr": 0.0002, "clip": 3.0}
    finally:
        ctl("stop", run_dir)
        engine.end()
