"""Compare any metric: a run ticked in Run history's Compare is drawn on every plot it has a metric
for (its loss and validation loss, gradient norm, lr, throughput), in one colour of its own,
named in each of those plots' legends, its range held by the plot; memory stays the run's own."""
from __future__ import annotations

import numpy as np
import pytest
from app_helpers import open_comparing
from recorded_runs import write_run
from test_smoothing import tensorboard


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return write_run(root / "a", 120, 1.0, 0), write_run(root / "b", 100, 0.7, 1), write_run(root / "c", 80, 3.0, 2)


def data(item) -> tuple[np.ndarray, np.ndarray]:
    x, y = item.getData()
    return (np.empty(0), np.empty(0)) if x is None else (np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_compared_runs_are_drawn_on_every_plot_they_have_a_metric_for(qtbot, make_window, runs):
    a, b, c = runs
    w = make_window()
    open_comparing(w, a, b, c)
    p = w.plots
    ps = p.parts.plot_set
    for plot in (ps.loss, ps.norm, ps.lr, ps.tput):  # each compared run named where it is drawn
        assert ">b</span>" in plot.titleLabel.text and ">c</span>" in plot.titleLabel.text, plot.titleLabel.text[:60]
    compared = p.parts.overlays.runs
    assert set(compared) == {"b", "c"} and compared["b"].color != compared["c"].color
    weight = p.toolbar.smoothing.weight()
    ps = p.parts.plot_set
    plots = {"loss": ps.loss, "norm": ps.norm, "lr": ps.lr, "tput": ps.tput}
    want = {"norm": tensorboard(compared["c"].buf.view("grad_norm"), weight), "lr": compared["c"].buf.view("lr"),
            "tput": tensorboard(compared["c"].buf.view("throughput"), weight)}
    for name, plot in plots.items():
        for run in compared.values():
            drawn = [s.item for s in run.series(name)]
            assert drawn and all(item in plot.listDataItems() for item in drawn), (name, run.name)
            assert all(item.opts["pen"].color().name() == run.color for item in drawn)  # its colour on every plot
            assert f">{run.name}</span>" in plot.titleLabel.text  # named in the legend
        if name in want:  # c's values, smoothed as the run's own where they are smoothed
            strong = next(s.item for s in compared["c"].series(name) if s.item.opts["pen"].color().alpha() == 255)
            assert np.allclose(data(strong)[1], want[name], rtol=1e-5), name
            _, (lo, hi) = plot.getViewBox().viewRange()
            assert lo <= np.nanmin(want[name]) and np.nanmax(want[name]) <= hi, name  # c's range is held
    for plot in (p.parts.plot_set.mem, p.parts.plot_set.stack):  # memory is this machine's run's own
        assert ">b</span>" not in plot.titleLabel.text
        assert not any(item in plot.listDataItems() for run in compared.values() for _n, s, _f in run.curves
                       for item in [s.item])
    # b's validation loss at its epochs' ends, on the loss plot.
    vx, vy = data(compared["b"].val_item)
    assert list(vx) == [40, 80] and np.allclose(vy, [0.7 * 2.4 / 3, 0.7 * 2.4 / 5])

    p.set_x_axis("samples")  # every compared curve follows the axis
    xs, _y = data(next(s.item for s in compared["b"].series("norm")))
    assert np.array_equal(xs, compared["b"].buf.view("samples_seen"))
    w.history.set_checked(b, False)  # unticked: off every plot
    assert set(p.parts.overlays.runs) == {"c"}
    assert all(">b</span>" not in plot.titleLabel.text for plot in plots.values())
