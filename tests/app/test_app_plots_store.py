"""The plots hold the data the store holds: live, reopened from the folder, and overlaid."""
from __future__ import annotations

import numpy as np
import pytest
from app_helpers import discard, run_to_end, start

from engine.store import RunReader

pytestmark = pytest.mark.slow  # real runs in the window


def _store(run_dir):
    reader = RunReader(str(run_dir))
    rows, epochs = reader.metrics(), reader.epochs()
    reader.close()
    return rows, epochs


def _check_plots_match(w, rows, epochs):
    steps = np.array([r["step"] for r in rows], float)
    for curve, col in (("loss", "loss"), ("grad_norm", "grad_norm"), ("lr", "lr"), ("throughput", "throughput")):
        x, y = w.plots.curve_data(curve)
        assert np.array_equal(x, steps), curve
        assert np.array_equal(y, np.array([r[col] for r in rows], float)), curve
    x, y = w.plots.curve_data("val")
    assert np.array_equal(x, [e["step"] for e in epochs])
    assert np.allclose(y, [e["val_loss"] for e in epochs], rtol=0, atol=0)
    x, y = w.plots.curve_data("clipped")
    clipped = [r for r in rows if r["clipped"]]
    assert np.array_equal(x, [r["step"] for r in clipped])
    assert np.array_equal(y, [r["grad_norm"] for r in clipped])


def test_plots_hold_what_run_db_holds(qtbot, make_window, tmp_path):
    w = make_window()
    run_dir = tmp_path / "run"
    start(w, epochs=2, clip=1.5, run_dir=str(run_dir))
    run_to_end(qtbot, w)
    rows, epochs = _store(run_dir)
    assert len(rows) == 64 and len(epochs) == 2
    assert any(r["clipped"] for r in rows)
    _check_plots_match(w, rows, epochs)

    # Overlay: run 1's smoothed loss on the loss plot of a window showing run 2.
    run2 = tmp_path / "run2"
    start(w, epochs=1, lr=3e-3, run_dir=str(run2))
    run_to_end(qtbot, w)
    w.set_overlay(str(run_dir), True)
    assert "run" in w.plots.overlays
    buf, item, _series = w.plots.overlays["run"]
    x, y = item.getData()
    assert np.array_equal(x, [r["step"] for r in rows])
    assert np.allclose(y, buf.view("loss_ema"))
    assert ">run</span>" in w.plots.parts.plot_set.loss.titleLabel.text  # the run compared, named in the legend
    w.set_overlay(str(run_dir), False)
    assert not w.plots.overlays

    # The same folder opened in another window shows the same (the first one deleted: see discard).
    discard(w)
    w2 = make_window()
    assert w2.open_run(str(run_dir))
    _check_plots_match(w2, rows, epochs)
    assert w2.model.state == "finished" and w2.ui_state() == "viewing"
    assert w2.plots.gpu_mode() == "cpu"


def test_a_long_run_is_drawn_from_a_few_thousand_points(qtbot, make_window):
    """Peak decimation keeps every extreme: the drawn curve spans the data's min and max. The
    steps go in as one array per column, as a run folder's read hands them over (300,000 rows as
    dicts took 10 s to ingest on a loaded machine, and how they go in is not what is checked)."""
    from app.model.metrics import StepColumns
    from app.model.runmodel import RunModel
    w = make_window()
    n = 300_000
    rng = np.random.default_rng(0)
    loss = np.abs(rng.standard_normal(n)).cumsum() / np.arange(1, n + 1)
    loss[123_45] = 50.0  # one spike
    model = RunModel()
    same = {"epoch": 1, "grad_norm": 1.0, "lr": 1e-3, "accum": 1, "clip": 0.0, "micro_batch": 1, "samples": 1,
            "tokens": 1, "clipped": 0, "nonfinite": 0, "throughput": 1.0, "step_time": 0.01, "time": 0.0}
    columns = {"step": np.arange(1, n + 1, dtype=float), "loss": loss, **{k: np.full(n, float(v)) for k, v in same.items()}}
    model.ingest([StepColumns(columns)])
    w.model = model
    w.plots.set_model(model)
    x, y = w.plots.curve_data("loss")
    assert len(x) <= 4 * w.plots.parts.plot_set.loss.getViewBox().width() + 8
    assert y.max() == 50.0 and y.min() == loss.min()
    assert x[0] == 1 and x[-1] == n


def test_resumed_run_continues_the_plots(qtbot, make_window, tmp_path):
    """--resume DIR in the app: the plots show the steps run.db already has, then the new ones."""
    run_dir = tmp_path / "run"
    w = make_window()
    start(w, epochs=1, max_steps=6, run_dir=str(run_dir))
    assert run_to_end(qtbot, w)["reason"] == "max_steps"
    discard(w)
    w2 = make_window(base_config={"resume": str(run_dir), "max_steps": 14, "epochs": 1})
    assert w2.start_run(), w2.last_error
    assert list(w2.plots.curve_data("loss")[0]) == [1, 2, 3, 4, 5, 6]  # history, before the engine starts
    outcome = run_to_end(qtbot, w2)
    assert outcome["reason"] == "max_steps"
    rows, _epochs = _store(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 15))
    x, y = w2.plots.curve_data("loss")
    assert np.array_equal(x, np.arange(1, 15)) and np.array_equal(y, [r["loss"] for r in rows])
    assert w2.model.info.get("resumed") is True
    # Start again: a new run, not a second resume of the same folder.
    assert w2.start_run()
    assert w2.runner.config.resume is None
    w2.stop_run()
    run_to_end(qtbot, w2)
