"""Changing accumulation, lr and clip while mlp trains: pending until the epoch boundary, then applied
there exactly (events and run.db agree), and marked on every plot."""
from __future__ import annotations

import pytest
from app_helpers import run_button, run_to_end, start, wait_until

from engine.store import RunReader

pytestmark = pytest.mark.slow  # real runs changed while they train


def test_changes_apply_exactly_at_the_next_epoch_boundary(qtbot, make_window, tmp_path):
    w = make_window()
    run_dir = tmp_path / "run"
    start(w, epochs=3, run_dir=str(run_dir))
    assert w.controls.state in ("starting", "training")
    # Before the run starts its Apply is off; the live fields stay editable.
    wait_until(qtbot, lambda: len(w.model.epochs) >= 1, 90, "the first epoch to end")
    c = w.controls
    assert c.engine == {"micro_batch": 64, "accum": 2, "lr": 1e-3, "clip": 1.0, "lr_scaling": "none",
                        "checkpointing": False, "epochs": 3}  # max steps: none (no limit), not shown
    c.accum.setValue(4)
    c.lr.setText("0.002")
    c.clip.setText("0.5")
    assert c.apply_button.isEnabled()
    w.apply_changes()
    # The engine says when the changes apply (command_received): wait for its word, then take it.
    wait_until(qtbot, lambda: all("applies at epoch" in c.status_text(n) for n in ("accum", "lr", "clip")), 30,
               "the engine to take the changes in")
    expected = w.session.pending.get("accum").target_epoch
    for name in ("accum", "lr", "clip"):
        assert f"applies at epoch {expected}" in c.status_text(name), c.status_text(name)
        assert c.fields[name].property("pending") is True
    assert not c.apply_button.isEnabled()  # nothing left to send

    outcome = run_to_end(qtbot, w)
    assert outcome["status"] == "finished" and outcome["reason"] == "completed"

    applied = [n for n in w.model.notes if n.kind == "settings_applied"]
    assert len(applied) == 1
    note = applied[0]
    assert note.epoch == expected  # the first epoch trained with the new values
    changes = {name: (old, new) for name, old, new in note.data["changes"]}
    assert changes == {"accum": (2, 4), "lr": (1e-3, 2e-3), "clip": (1.0, 0.5)}
    for name in ("accum", "lr", "clip"):
        assert c.status_text(name).startswith("applied"), c.status_text(name)
        assert f"from epoch {expected}" in c.status_text(name)
        assert c.fields[name].property("pending") is False

    # run.db: every step before that epoch has the old values, every step from it the new ones.
    reader = RunReader(str(run_dir))
    rows = reader.metrics()
    events = reader.events(kinds=["settings_applied"])
    reader.close()
    assert len(events) == 1 and events[0]["step"] == note.step
    before = [r for r in rows if r["epoch"] < expected]
    after = [r for r in rows if r["epoch"] >= expected]
    assert before and after
    assert before[-1]["step"] == note.step  # applied right after the last step of the epoch before
    assert all((r["accum"], r["lr"], r["clip"]) == (2, 1e-3, 1.0) for r in before)
    assert all((r["accum"], r["lr"], r["clip"]) == (4, 2e-3, 0.5) for r in after)
    # 4096 samples: 32 windows of 64 x 2 before, 16 windows of 64 x 4 after.
    assert sum(1 for r in rows if r["epoch"] == 1) == 32
    assert sum(1 for r in rows if r["epoch"] == expected) == 16

    # One labelled marker on every plot (the memory plot says "no GPU" on this machine).
    p = w.plots
    assert p.gpu_mode() == "cpu"
    marked = {id(plot) for plot, _line in p.parts.marks.marker_lines}
    for plot in (p.parts.plot_set.loss, p.parts.plot_set.norm, p.parts.plot_set.lr, p.parts.plot_set.tput):
        assert id(plot) in marked
    lines = [line for plot, line in p.parts.marks.marker_lines]
    assert all(abs(line.value() - (note.step + 0.5)) < 1e-9 for line in lines)
    loss_label = next(line.label.toPlainText() for plot, line in p.parts.marks.marker_lines
                      if plot is p.parts.plot_set.loss)
    assert "accum 2\u21924" in loss_label and "clip 1\u21920.5" in loss_label and "lr 0.001\u21920.002" in loss_label


def test_pause_then_change_then_unpause(qtbot, make_window, tmp_path):
    w = make_window()
    start(w, epochs=3, micro_batch=32, run_dir=str(tmp_path / "run"))  # 64 steps an epoch
    wait_until(qtbot, lambda: w.model.step >= 3, 90, "a few steps")
    w.pause_run()
    assert w.ui_state() == "pausing"
    assert run_button(w, "resume").isEnabled() and not run_button(w, "pause").isEnabled()
    wait_until(qtbot, lambda: w.model.state == "paused", 90, "the pause")
    paused_after = next(n.epoch for n in w.model.notes if n.kind == "paused")  # the epoch it finished
    paused_step = w.model.step
    assert paused_step == 64 * paused_after
    assert w.ui_state() == "paused"
    w.controls.accum.setValue(1)
    w.apply_changes()
    wait_until(qtbot, lambda: "applies at" in w.controls.status_text("accum"), 30, "the engine to take it in")
    assert f"applies at epoch {paused_after + 1} (now: the run is paused)" in w.controls.status_text("accum")
    wait_until(qtbot, lambda: w.controls.status_text("accum").startswith("applied"), 30, "the change while paused")
    qtbot.wait(300)
    assert w.model.step == paused_step  # still paused: the change applied without training
    w.resume_run()
    outcome = run_to_end(qtbot, w)
    assert outcome["reason"] == "completed"
    kinds = [n.kind for n in w.model.notes]
    assert kinds.index("paused") < kinds.index("settings_applied") < kinds.index("unpaused")
    assert "lr_hint" in w.alerts.kinds()  # accumulation changed, lr not: the engine suggests one
    accum = w.model.metrics.view("accum")
    epoch = w.model.metrics.view("epoch")
    assert set(accum[epoch <= paused_after]) == {2} and set(accum[epoch > paused_after]) == {1}


def test_engine_refusal_is_shown(qtbot, make_window, tmp_path):
    """A micro-batch larger than the data set passes the validator but the engine refuses it."""
    w = make_window()
    start(w, epochs=2, run_dir=str(tmp_path / "run"))
    wait_until(qtbot, lambda: w.model.step >= 2, 90, "a few steps")
    w.controls.micro_batch.setValue(100_000)
    w.apply_changes()
    wait_until(qtbot, lambda: w.controls.status_text("micro_batch").startswith("refused"), 90, "the refusal")
    assert "larger than the data set" in w.controls.status_text("micro_batch")
    assert w.controls.micro_batch.value() == 64  # back to what the engine has
    assert "command_refused" in w.alerts.kinds()
    if w.session.state.is_live:  # the refusal is what is checked: the rest of the two epochs is not needed
        w.stop_run()
    assert run_to_end(qtbot, w)["status"] == "finished"  # the run went on after it
