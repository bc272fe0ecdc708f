"""After a divergence: the loss axis writes the true values (no SI prefix applied twice), and
"Ignore outliers" (on by itself after non-finite steps) ranges y on the curve, not the spike."""
from __future__ import annotations

import math

import pytest

from engine.declarations.events import StepMetrics
from engine.store import RunStore

SPIKE = 2e36


def diverged_run(path) -> str:
    path.mkdir(parents=True)
    store = RunStore(str(path))
    store.set_info(status="finished", task="mlp", device="cpu", config={"nonfinite": "skip", "epochs": 3})
    for s in range(1, 121):
        loss = SPIKE * (1 + (s % 3)) if 60 <= s <= 62 else (float("nan") if s == 63 else 2.0 / (1 + s / 20))
        store.record(StepMetrics(s, 1 + s // 50, loss=loss, grad_norm=1.0 + (s % 3), clipped=False, lr=1e-3,
                                 accum=4, clip=0.0, micro_batch=16, samples=64, tokens=64, step_time=0.01,
                                 throughput=1000.0, nonfinite=s == 63, scaler_skipped=False))
    store.close()
    return str(path)


def tick_texts(axis) -> list[str]:
    lo, hi = axis.range
    out = []
    for spacing, values in axis.tickValues(lo, hi, max(axis.height(), 200)):
        out += axis.tickStrings(values, axis.autoSIPrefixScale * axis.scale, spacing)
    return out


@pytest.mark.slow
def test_a_spike_neither_flattens_the_curve_nor_mislabels_the_axis(qtbot, make_window, tmp_path):
    w = make_window()
    assert w.open_run(diverged_run(tmp_path / "diverged"))
    p = w.plots
    assert p.ignore_outliers  # on by itself: the run has a non-finite step
    (_x0, _x1), (lo, hi) = p.parts.plot_set.loss.getViewBox().viewRange()
    assert hi < 5 and lo >= 0  # the curve's own scale: 2.0 down to 0.3
    p.set_ignore_outliers(False)
    (_x0, _x1), (lo, hi) = p.parts.plot_set.loss.getViewBox().viewRange()
    assert hi >= 3 * SPIKE  # the whole spike
    axis = p.parts.plot_set.loss.getAxis("left")
    assert "x1e" not in axis.labelString() and "(x" not in axis.labelString()
    texts = tick_texts(axis)
    assert texts and all(t.endswith("e+36") or t == "0" for t in texts), texts
    values = [float(t) for t in texts]
    assert max(values) > SPIKE and all(math.isfinite(v) for v in values)  # the true values, as they are
    p.set_ignore_outliers(True)  # the user's choice is kept (not set by itself again)
    assert p.outliers.chosen and p.ignore_outliers


@pytest.mark.slow
def test_ignoring_outliers_keeps_the_ema_on_the_curve(qtbot, make_window, tmp_path):
    """The EMA drawn with "Ignore outliers" leaves the spike out, as the y range does: the
    plain EMA, with 2e36 folded in, stays above every real loss for the rest of the run."""
    from app.ui.plots.readback import curve_data as curve
    w = make_window()
    assert w.open_run(diverged_run(tmp_path / "diverged"))
    p = w.plots
    assert p.ignore_outliers
    (_x0, _x1), (lo, hi) = p.parts.plot_set.loss.getViewBox().viewRange()
    x, ema = curve(p.parts, "loss_ema")
    after = ema[x > 64]
    assert len(after) and lo <= after.min() and after.max() <= hi  # on the plot, every step after the spike
    x_raw, raw = curve(p.parts, "loss")
    assert abs(after[-1] - raw[x_raw == x[-1]][0]) < 0.2  # and it follows the loss there
    p.set_ignore_outliers(False)  # negative control: the plain EMA, dragged up by the spike
    x, ema = curve(p.parts, "loss_ema")
    assert ema[x > 64].min() > 1e30
