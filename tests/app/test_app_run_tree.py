"""The run tree in the app (issue 13), on real engine runs:

- "Fork from here..." on a plot point opens the fork dialog at the nearest checkpoint at or
  before that step, prefilled from the run; the fork starts through the Start path and its
  run.db has the parent link, with the changed settings from its first row;
- the run history shows the fork under its parent with what it changed, lists a run's
  checkpoints (a fork from one of them), and compares a run with its family, each branch
  drawn from its fork point on the samples axis;
- a run made with --nonfinite rollback shows a marker on every plot at each rollback and the
  steps it threw away greyed, opened from its folder and followed live.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from app_helpers import run_to_end, start, wait_until

from engine.store import RunReader
from engine_in_process import engine
from testkit import ROOT

# The task of tests/engine/test_run_tree.py: NaN windows on purpose (steps bad_from..bad_until-1).
DIVERGING = ROOT / "tests" / "engine" / "diverging_task.py"
ROLLBACK_ARGS = dict(epochs=1, micro_batch=8, accum=2, lr=0.01,
                     task_args={"bad_from": 7, "bad_until": 10, "dropout": 0})


def _parent_run(qtbot, w, run_dir: str) -> None:
    """12 steps of mlp (128 samples each) with a step checkpoint every 4 steps."""
    w.base_config["checkpoint_every"] = 4
    start(w, epochs=1, max_steps=12, run_dir=run_dir)
    assert run_to_end(qtbot, w)["status"] == "finished"


def _x_of_step(w, step: int) -> float:
    return float(w.plots.steps_to_x(np.array([step], dtype=np.float64))[0])


@pytest.mark.slow
def test_fork_from_a_plot_point_records_its_parent_and_change(qtbot, make_window, tmp_path):
    w = make_window()
    parent = str(tmp_path / "parent")
    _parent_run(qtbot, w, parent)
    assert sorted(os.listdir(os.path.join(parent, "checkpoints"))) == ["last.pt", "step-4.pt", "step-8.pt"]
    # Right-click the loss plot at step 10: the menu names the step, the dialog the checkpoint.
    menu = w.plots.point_menu
    assert menu.remember(_x_of_step(w, 10)) == 10
    action = menu.actions[0]
    assert action.text() == "Fork from step 10..." and action.isEnabled()
    action.trigger()
    dlg = w.tree.forks.dialog
    assert dlg is not None and dlg.isVisible()
    assert "step-8" in dlg.where.text() and "nearest checkpoint at or before step 10" in dlg.where.text()
    assert dlg.prefill["lr"] == pytest.approx(1e-3) and dlg.prefill["accum"] == 2 and dlg.prefill["max_steps"] == 12
    assert dlg.widgets["accum"].value() == 2 and dlg.widgets["micro_batch"].value() == 64
    assert dlg.edits() == {} and "No change" in dlg.summary.text()
    dlg.set_field("lr", 5e-4)
    dlg.set_field("accum", 4)
    dlg.set_field("max_steps", 14)
    assert dlg.edits() == {"lr": 5e-4, "accum": 4, "max_steps": 14}
    assert "lr 0.0005" in dlg.summary.text() and "accum 4" in dlg.summary.text()
    dlg.ok_button.click()
    assert w.last_error is None, w.last_error
    assert w.tree.forks.started["fork"] == f"{parent}@step-8"
    assert run_to_end(qtbot, w)["status"] == "finished"

    child = w.model.info["run_dir"]
    assert os.path.dirname(child) == str(tmp_path / "runs") and child != parent  # a new folder
    reader = RunReader(child)
    info, rows = reader.info(), reader.metrics()
    reader.close()
    assert info["parent"] == {"run_dir": parent, "checkpoint": "step-8", "step": 8,
                              "changed": {"lr": 5e-4, "accum": 4, "max_steps": 14}}
    assert rows[0]["step"] == 9 and rows[-1]["step"] == 14  # the parent's step counter goes on
    assert all(r["accum"] == 4 and r["lr"] == pytest.approx(5e-4) for r in rows)  # from its first row
    assert w.controls.accum.value() == 4  # the form shows what the fork trains with

    # On the samples axis the fork goes on from the parent's 8 x 128 samples at step 8, where a
    # line on every plot says where it came from.
    w.plots.set_x_axis("samples")
    x, _y = w.plots.curve_data("loss")
    assert x[0] == 8 * 128 + 4 * 64 and x[-1] == 8 * 128 + 6 * 4 * 64
    lines = w.plots.rollbacks.fork_lines
    assert {id(p) for p, _l in lines} >= {id(w.plots.parts.plot_set.loss), id(w.plots.parts.plot_set.stack)}
    label = next(line.label.toPlainText() for p, line in lines if p is w.plots.parts.plot_set.loss)
    assert "fork of parent @step-8" in label and 8 * 128 < lines[0][1].value() < x[0]


@pytest.mark.slow
def test_history_shows_the_tree_lists_checkpoints_and_compares_a_family(qtbot, make_window, tmp_path):
    w = make_window()
    parent = str(tmp_path / "parent")
    _parent_run(qtbot, w, parent)
    w.history.refresh()
    w.history.select(parent)
    names = [c.name for c in w.history.checkpoints_shown()]
    assert names == ["last", "step-8", "step-4"]  # newest first: last.pt at step 12, where the run stopped
    assert w.history.checkpoints_shown()[0].label == "last (step 12)"
    # Fork from a checkpoint picked in the list.
    w.history.checkpoint_list.setCurrentRow(names.index("step-4"))
    w.history.fork_button.click()
    dlg = w.tree.forks.dialog
    assert "step-4" in dlg.where.text() and "nearest" not in dlg.where.text()
    dlg.set_field("clip", 0.25)
    dlg.ok_button.click()
    run_to_end(qtbot, w)
    child = w.model.info["run_dir"]
    assert RunReader(child).info()["parent"]["changed"] == {"clip": 0.25}

    w.history.refresh()
    top = w.history.item_for(parent)
    kid = w.history.item_for(child)
    assert top is not None and kid is not None and kid.parent() is top  # child under its parent
    assert top.parent() is None and top.text(2) == ""
    assert kid.text(2) == "@step-4: clip 0.25"

    # Compare with family: the child shown, its parent overlaid, each from where it starts.
    w.plots.set_x_axis("samples")
    w.history.select(child)
    w.history.family_button.click()
    assert w.history.checked == {parent}
    buf, item, _s = w.plots.overlays["parent"]
    assert item.xData[0] == 128 and item.xData[-1] == 12 * 128
    x, _y = w.plots.curve_data("loss")
    assert x[0] == 5 * 128  # the fork's first step, right after the parent's step 4


def _cli(*args: str) -> None:
    """The engine's command line, in this process (engine_in_process): the run folder is what matters."""
    r = engine("--device", "cpu", *args)
    assert r.returncode == 0, r.stderr


def _assert_rollback_shown(w) -> None:
    p = w.plots
    assert w.model.rollbacks and w.model.rollbacks[0].to_step == 6 and w.model.rollbacks[0].reason == "nonfinite"
    on = {id(plot) for plot, _line in p.rollbacks.lines}
    ps = p.parts.plot_set
    for plot in (ps.loss, ps.norm, ps.lr, ps.tput, ps.stack):
        assert id(plot) in on  # a marker on every plot (the memory plot says "no GPU" here)
    assert all(abs(line.value() - 6.5) < 1e-9 for _plot, line in p.rollbacks.lines[:5])
    label = next(line.label.toPlainText() for plot, line in p.rollbacks.lines if plot is p.parts.plot_set.loss)
    assert "rolled back to 6" in label and "nonfinite" in label
    x, y = p.curve_data("discarded_loss")
    steps = set(x[np.isfinite(x)].astype(int))
    assert {7, 8} <= steps  # the windows thrown away, greyed, never hidden
    bands = [band.getRegion() for plot, band in p.rollbacks.bands if plot is p.parts.plot_set.loss]
    assert bands and bands[0][0] == 6.5 and bands[0][1] >= 8.5  # shaded even where their loss is NaN
    kept = p.curve_data("loss")[0]
    assert list(kept) == sorted(set(kept)) and 7 in kept  # the kept branch trained steps 7.. again
    title = p.parts.plot_set.loss.titleLabel.text
    assert "rollback" in title and "discarded steps" in title
    assert "rolled_back" in w.alerts.kinds()


@pytest.mark.slow
def test_rollback_markers_and_discarded_steps_for_a_run_opened_and_live(qtbot, make_window, tmp_path):
    task = DIVERGING
    folder = str(tmp_path / "roll")
    _cli("--task", str(task), "--epochs", "1", "--micro-batch", "8", "--accum", "2", "--checkpoint-every", "2",
         "--task-arg", "bad_from=7", "--task-arg", "bad_until=10", "--task-arg", "dropout=0",
         "--nonfinite", "rollback", "--lr", "0.01",
         "--run-dir", folder)
    w = make_window()
    assert w.open_run(folder)
    _assert_rollback_shown(w)
    reader = RunReader(folder)
    discarded = {int(d["step"]) for d in reader.discarded()}
    kept = [r["step"] for r in reader.metrics()]
    reader.close()
    x, _y = w.plots.curve_data("discarded_loss")
    assert set(x[np.isfinite(x)].astype(int)) == discarded  # exactly what run.db kept apart
    assert list(w.model.metrics.view("step")) == kept  # and every row it kept

    # The same run trained in the window: the rows it replaces move to the greyed curve.
    w.base_config.update(checkpoint_every=2, nonfinite="rollback")
    start(w, task=str(task), run_dir=str(tmp_path / "live"), **ROLLBACK_ARGS)
    wait_until(qtbot, lambda: not w.runner.is_busy(), 120, "the run to end")
    run_to_end(qtbot, w)
    _assert_rollback_shown(w)
    assert "rolled back from step 8 to step 6" in w.model.discarded.segments[0].reason


def test_lineage_reads_checkpoints_settings_and_offsets_from_run_folders(tmp_path):
    """Qt-free: which checkpoint a step forks from, the settings a run had at a step (its config
    and the events that changed them), and where a fork's axes begin (its parents' counts)."""
    from app.model import lineage
    from engine.declarations.events import (
        CheckpointSaved,
        EpochEnd,
        OomRecovered,
        RolledBack,
        SettingsApplied,
        StepMetrics,
    )
    from engine.store import RunStore

    run = tmp_path / "run"
    os.makedirs(run / "checkpoints")
    for name in ("step-4.pt", "epoch-1.pt", "last.pt", "step-12.pt", ".tmp-x.pt", "notes.txt"):
        (run / "checkpoints" / name).write_bytes(b"")
    store = RunStore(str(run))
    cfg = {"task": "mlp", "micro_batch": 64, "accum": 2, "lr": 1e-3, "clip": 1.0, "lr_scaling": "none"}
    store.set_info(config=cfg)
    for s in range(1, 13):
        store.record(StepMetrics(s, 1 + (s > 8), loss=1.0, grad_norm=1.0, clipped=False, lr=1e-3, accum=2, clip=1.0,
                                 micro_batch=64, samples=100 + s, tokens=1000, step_time=0.1, throughput=1.0,
                                 nonfinite=False, scaler_skipped=False))
    store.record(EpochEnd(8, 1, train_loss=1.0, val_loss=None, seconds=1.0))
    store.record(SettingsApplied(5, 1, changes=(("accum", 2, 4), ("lr", 1e-3, 2e-3)), at="step", from_step=6))
    store.record(OomRecovered(9, 2, old_micro_batch=64, old_accum=4, new_micro_batch=32, new_accum=8))
    store.record(RolledBack(10, 2, from_step=11, to_step=10, reason="spike", new_lr=1e-3, windows_skipped=1))
    store.record(CheckpointSaved(12, 2, path=str(run / "checkpoints" / "last.pt")))
    store.close()

    cps = lineage.checkpoints(str(run))
    assert [(c.name, c.step) for c in cps] == [("step-4", 4), ("epoch-1", 8), ("step-12", 12), ("last", 12)]
    assert lineage.nearest(cps, 3) is None and lineage.nearest(cps, 7).name == "step-4"
    assert lineage.nearest(cps, 12).name == "step-12"  # a numbered file (it never changes) before last.pt
    assert cps[1].spec(str(run)) == f"{run}@epoch-1" and cps[1].label == "epoch-1 (step 8)"
    assert lineage.settings_at(str(run), 5, cfg) == {"micro_batch": 64, "accum": 2, "lr": 1e-3, "clip": 1.0,
                                                     "lr_scaling": "none"}
    assert lineage.settings_at(str(run), 8, cfg)["accum"] == 4 and lineage.settings_at(str(run), 8, cfg)["lr"] == 2e-3
    late = lineage.settings_at(str(run), 12, cfg)
    assert (late["micro_batch"], late["accum"], late["lr"]) == (32, 8, 1e-3)

    form = lineage.fork_config({**cfg, "run_dir": "x", "resume": None, "fork": "y@last", "find_micro_batch": True},
                               {"lr": 5e-4}, cps[0].spec(str(run)))
    assert form == {**cfg, "lr": 5e-4, "fork": f"{run}@step-4", "fork_changes": ("lr",)}  # the edit, recorded

    child = tmp_path / "child"
    os.makedirs(child)
    store = RunStore(str(child))
    store.set_info(config=cfg, parent={"run_dir": str(run), "checkpoint": "step-4", "step": 4, "changed": {"lr": 5e-4}})
    store.close()
    offsets = lineage.axis_offsets(str(child))  # the parent's first 4 steps
    assert offsets["samples"] == 101 + 102 + 103 + 104 and offsets["tokens"] == 4000 and offsets["time"] >= 0
    nodes = lineage.build_tree([str(run), str(child)])
    assert nodes[str(run)].children == [str(child)] and lineage.family(str(child), nodes) == [str(run)]
    assert lineage.fork_text(nodes[str(child)].parent) == "@step-4: lr 0.0005"


def _rows(store, steps, loss: float) -> None:
    from engine.declarations.events import StepMetrics
    for st in steps:
        store.record(StepMetrics(st, 1, loss=loss, grad_norm=0.5, clipped=False, lr=1e-3, accum=2, clip=1.0,
                                 micro_batch=8, samples=16, tokens=16, step_time=0.01, throughput=1.0,
                                 nonfinite=False, scaler_skipped=False))


@pytest.mark.slow
def test_a_run_followed_while_another_process_rolls_back_reads_the_new_rows(qtbot, make_window, tmp_path):
    """The window follows a run folder that another process writes; that process rolls back past
    rows the window has read and writes those steps again: the window reads them again (the ones
    they replace go grey, as run.db's discarded_metrics has them), never keeping stale rows."""
    from engine.declarations.events import RolledBack
    from engine.store import RunStore
    folder = tmp_path / "followed"
    os.makedirs(folder / "checkpoints")
    store = RunStore(str(folder))
    store.set_info(config={"task": "mlp"}, task="mlp", device="cpu", status="running")
    _rows(store, range(1, 9), loss=2.0)
    store.close()
    w = make_window()
    assert w.open_run(str(folder))
    assert list(w.model.metrics.view("step")) == list(range(1, 9))
    store = RunStore(str(folder))  # the other process goes back to step 6 and trains 7.. again
    store.discard_after(6, "rolled back from step 8 to step 6 (nonfinite)")
    store.record(RolledBack(6, 1, from_step=8, to_step=6, reason="nonfinite", new_lr=5e-4, windows_skipped=2))
    _rows(store, range(7, 11), loss=1.0)
    store.close()
    w.driver.publish(w.session.poll(force=True))
    m = w.model.metrics
    assert list(m.view("step")) == list(range(1, 11))
    assert list(m.view("loss")[6:]) == [1.0] * 4  # the new rows, not the stale ones
    steps, losses = w.model.discarded.joined("loss")
    assert list(steps) == [7, 8] and list(losses) == [2.0, 2.0]  # as discarded_metrics has them
    w.plots.refresh(force=True)
    x, y = w.plots.curve_data("discarded_loss")
    assert list(x) == [7, 8] and list(y) == [2.0, 2.0]
    assert w.plots.rollbacks.lines and "rolled_back" in w.alerts.kinds()
