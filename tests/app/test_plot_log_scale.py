"""Log scale, per plot: the loss, the gradient norm and the lr each have their own (in the plot's
right-click menu; the loss also in the toolbar and the View menu), kept for the next launch;
a log y range holds every curve drawn (the validation points were left out: pyqtgraph hands
back a log axis' values already as log10, and they were taken as log10 again), with Fit all
and Ignore outliers on too; and the ticks are readable (pyqtgraph piled up "9·10⁻⁵ 8·10⁻⁵ ...")."""
from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
from app_helpers import discard, open_comparing
from recorded_runs import plot_run
from test_window_layout import overlapping_labels, settle

from app.ui.plots.fitting import LABEL_PX
from app.ui.plots.log_ticks import log_label, log_tick_levels


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A run whose validation loss (8) sits far above its training loss (1.55 down to 0.05), and
    another run with three times its loss, to compare."""
    root = tmp_path_factory.mktemp("runs")
    return plot_run(root / "a"), plot_run(root / "b", scale=3.0)


def menu_log_action(plot: Any) -> Any:
    """The "Log scale" check in a plot's right-click menu."""
    found = [a for a in plot.getViewBox().menu.actions() if a.text() == "Log scale"]
    assert len(found) == 1 and found[0].isCheckable(), [a.text() for a in plot.getViewBox().menu.actions()]
    return found[0]


def outside_range(plot: Any) -> list[tuple[str, float]]:
    """Values of the curves drawn on a log plot that its y range leaves out (name of the item, value)."""
    _, (y0, y1) = plot.getViewBox().viewRange()
    out = []
    for item in plot.getViewBox().addedItems:
        if not hasattr(item, "getOriginalDataset") or not item.isVisibleTo(plot):
            continue
        _x, y = item.getOriginalDataset()
        y = np.asarray(y if y is not None else [], float)
        y = y[np.isfinite(y) & (y > 0)]
        out += [(type(item).__name__, float(v)) for v in y if not y0 <= math.log10(v) <= y1]
    return out


@pytest.mark.slow
def test_a_log_loss_range_holds_the_validation_points_and_the_runs_compared(qtbot, make_window, runs):
    a, b = runs
    w = make_window()
    open_comparing(w, a, b)  # Compare
    settle(qtbot, w)
    panel = w.plots
    panel.log_box.click()  # the toolbar's Log scale (loss)
    panel.outliers_box.setChecked(True)
    panel.fit_button.click()
    settle(qtbot, w)
    assert panel.parts.plot_set.loss.ctrl.logYCheck.isChecked() and w.log_action.isChecked()
    _x, val = panel.parts.curves.val.getOriginalDataset()
    assert val is not None and len(val) == 3
    assert not outside_range(panel.parts.plot_set.loss)  # the validation points at 8, the compared run's loss
    assert panel.parts.plot_set.loss.getAxis("left").labelText == "loss (log)"


@pytest.mark.slow
def test_each_plot_has_its_own_log_scale_and_the_next_launch_keeps_it(qtbot, make_window, runs):
    w = make_window(restore_settings=True)
    assert w.open_run(runs[0])
    settle(qtbot, w)
    panel = w.plots
    menu_log_action(panel.parts.plot_set.norm).trigger()  # right-click the gradient norm: Log scale
    settle(qtbot, w)
    ps = panel.parts.plot_set
    assert ps.norm.ctrl.logYCheck.isChecked() and ps.norm.getAxis("left").labelText == "norm (log)"
    assert not ps.loss.ctrl.logYCheck.isChecked() and not ps.lr.ctrl.logYCheck.isChecked()
    assert not w.log_action.isChecked()  # the loss's switch is the loss's alone
    assert not outside_range(panel.parts.plot_set.norm)  # its three decades, ranged in the log scale
    menu_log_action(panel.parts.plot_set.lr).trigger()
    menu_log_action(panel.parts.plot_set.lr).trigger()  # on, and off again
    assert not panel.parts.plot_set.lr.ctrl.logYCheck.isChecked()
    discard(w)
    w2 = make_window(restore_settings=True)  # the next launch
    settle(qtbot, w2)
    p2 = w2.plots
    assert p2.parts.plot_set.norm.ctrl.logYCheck.isChecked() and menu_log_action(p2.parts.plot_set.norm).isChecked()
    assert not p2.parts.plot_set.lr.ctrl.logYCheck.isChecked() and not p2.parts.plot_set.loss.ctrl.logYCheck.isChecked()


@pytest.mark.slow
def test_log_ticks_are_readable_on_a_laptop(qtbot, make_window, runs):
    """At 1024 x 640 the gradient norm and lr plots are short: on a log scale (here through
    pyqtgraph's own Plot Options > Transforms > Log Y, the same choice) their labels do not
    overlap, the lr's (within a decade) are round values, not every multiple."""
    w = make_window()
    w.resize(1024, 640)
    assert w.open_run(runs[0])
    settle(qtbot, w)
    panel = w.plots
    for p in (panel.parts.plot_set.loss, panel.parts.plot_set.norm, panel.parts.plot_set.lr):
        p.ctrl.logYCheck.setChecked(True)
    panel.fit()
    settle(qtbot, w)
    for p in (panel.parts.plot_set.loss, panel.parts.plot_set.norm, panel.parts.plot_set.lr):
        ax = p.getAxis("left")
        assert ax.logMode and not overlapping_labels(ax), p.titleLabel.text
    assert panel.log_scales.on == {"loss": True, "norm": True, "lr": True} and w.log_action.isChecked()


def test_log_tick_labels_keep_their_distance() -> None:
    """Whatever the span and the height, the labelled ticks are LABEL_PX apart, inside the axis
    by half a label, written distinctly; a span with room for them gets at least two."""
    rng = random.Random(7)
    for _ in range(1500):
        lo = rng.uniform(-12, 6)
        hi = lo + 10 ** rng.uniform(-3, 1.5)
        size = rng.uniform(30, 600)
        levels = log_tick_levels(lo, hi, size, LABEL_PX)
        labelled = [v for spacing, values in levels if spacing is not None for v in values]
        px = size / (hi - lo)
        assert all(lo <= v <= hi for v in labelled)
        assert all((b - a) * px >= LABEL_PX - 1e-6 for a, b in zip(labelled, labelled[1:])), (lo, hi, size)
        texts = [log_label(v) for v in labelled]
        assert len(set(texts)) == len(texts), (lo, hi, size, texts)
        if size >= 100 and hi - lo >= 0.05:
            assert len(labelled) >= 2, (lo, hi, size)


def test_log_tick_labels_read_as_numbers() -> None:
    assert [log_label(math.log10(v)) for v in (1e-4, 2.5e-5, 0.001, 0.35, 20, 1e6)] == \
        ["1e-4", "2.5e-5", "0.001", "0.35", "20", "1e6"]
    # A span under a decade: 1-2-5 values where they fit, never every multiple.
    levels = log_tick_levels(math.log10(0.25), math.log10(2.6), 200, LABEL_PX)
    assert [log_label(v) for v in levels[0][1]] == ["0.5", "1", "2"]
