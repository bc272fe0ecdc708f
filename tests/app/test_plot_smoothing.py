"""Smoothing you can set: the plot toolbar's Smoothing (TensorBoard's debiased EMA, 0 to 0.999)
is the one smoothing of the loss, the throughput and the compared runs; the raw values stay
drawn faintly behind; the weight is kept in the preferences."""
from __future__ import annotations

import numpy as np
import pytest
from app_helpers import discard, open_comparing
from recorded_runs import write_run
from test_smoothing import tensorboard

from app.model.metrics import INLIER_EMA
from app.model.outliers import fences, inliers


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return write_run(root / "a", 120, 1.0, 0), write_run(root / "b", 100, 0.7, 1)


def drawn(item) -> tuple[np.ndarray, np.ndarray]:
    x, y = item.getData()
    return np.asarray(x), np.asarray(y)


@pytest.mark.slow
def test_the_smoothing_control_smooths_the_run_and_the_compared_runs(qtbot, make_window, runs):
    a, b = runs
    w = make_window()
    open_comparing(w, a, b)
    p = w.plots
    control = p.toolbar.smoothing
    assert control.isVisibleTo(p.toolbar) and control.weight() == 0.9  # the app's EMA until now
    control.box.setValue(0.6)  # typed in the spin box
    loss = w.model.metrics.view("loss")
    _x, y = p.curve_data("loss_ema")
    assert np.allclose(y, tensorboard(loss, 0.6), rtol=1e-5)
    _x, raw = p.curve_data("loss")
    assert np.array_equal(raw, loss)  # the raw values stay drawn, behind
    assert p.parts.curves.loss_raw.zValue() <= p.parts.curves.loss_ema.zValue()
    run_b = p.parts.overlays.runs["b"]
    smoothed = {plot: s for plot, s, faint in run_b.curves if not faint}
    faint = {plot: s for plot, s, is_faint in run_b.curves if is_faint}
    assert np.allclose(drawn(smoothed["loss"].item)[1], tensorboard(run_b.buf.view("loss"), 0.6), rtol=1e-5)
    assert np.allclose(drawn(smoothed["norm"].item)[1], tensorboard(run_b.buf.view("grad_norm"), 0.6), rtol=1e-5)
    assert np.array_equal(drawn(faint["loss"].item)[1], run_b.buf.view("loss"))
    assert faint["loss"].item.opts["pen"].color().alpha() < 128  # faintly

    # The slider: the weight follows when the drag rests, and "Ignore outliers" smooths the same way.
    control.slider.setValue(990)
    qtbot.waitUntil(lambda: control.weight() == 0.99, timeout=3000)
    assert w.model.metrics.smoothing == run_b.buf.smoothing == 0.99 and control.box.value() == 0.99
    p.set_ignore_outliers(True)
    _x, y = p.curve_data("loss_ema")
    held = np.where(inliers(loss, fences(loss)), loss, np.nan)  # outliers held as non-finite values are
    assert np.allclose(y, w.model.metrics.view(INLIER_EMA)) and np.allclose(y, tensorboard(held, 0.99), rtol=1e-5)

    # Kept: the next window starts with it (quitting saves no smoothing: it was kept when set).
    discard(w)
    w2 = make_window(restore_settings=True)
    qtbot.waitUntil(lambda: w2._plots is not None, timeout=20000)
    assert w2.plots.toolbar.smoothing.weight() == 0.99
    assert w2.open_run(a) and w2.model.metrics.smoothing == 0.99
