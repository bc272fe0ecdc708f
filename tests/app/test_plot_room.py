"""The plots fit a laptop: the loss keeps at least 40% of the window's height (at 1366 x 768 it
was 92 px tall), and a plot with nothing to show ("GPU memory: no GPU" on a CPU machine kept
~80 px) is one line under the plots, its room given to the others (app/ui/plots/fold.py)."""
from __future__ import annotations

from typing import Any

import pytest
from PySide6.QtCore import Qt
from recorded_runs import gpu_run, plot_run
from test_window_layout import settle

from app.ui.plots.fold import LOSS_SHARE, place_rows


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    return plot_run(tmp_path_factory.mktemp("runs") / "cpu")


def fits(w: Any) -> None:
    """The loss plot at least 40% of the window's height; every plot inside the canvas."""
    panel = w.plots
    loss = panel.parts.plot_set.loss
    assert loss.height() >= LOSS_SHARE * w.height() - 1, (w.size(), loss.height())
    assert panel.canvas.ci.height() <= panel.canvas.viewport().height() + 1
    for p in panel.parts.plot_set.all:
        if p.isVisible():
            bottom = p.mapToItem(panel.canvas.ci, p.boundingRect().bottomLeft()).y()
            assert bottom <= panel.canvas.ci.height() + 1, p.titleLabel.text


@pytest.mark.slow
@pytest.mark.parametrize("size", [(1024, 640), (1366, 768)])
def test_the_loss_keeps_its_room_on_a_laptop(qtbot, make_window, cpu_run, size):
    w = make_window()
    w.resize(*size)
    w.use_default_layout()
    assert w.open_run(cpu_run)
    settle(qtbot, w)
    assert w.size().toTuple() == size
    fits(w)
    assert w.plots.parts.plot_set.norm.isVisible() and w.plots.parts.plot_set.lr.isVisible()
    w.resizeDocks([w.alerts_dock], [w.alerts_dock.height() + 80], Qt.Orientation.Vertical)  # a taller Alerts dock
    settle(qtbot, w)
    assert w.size().toTuple() == size
    fits(w)
    assert "folded" in w.plots.hint.text()  # what gave way says so


@pytest.mark.slow
def test_a_plot_with_nothing_to_show_is_one_line(qtbot, make_window, cpu_run):
    w = make_window()
    w.resize(1440, 900)
    settle(qtbot, w)
    panel = w.plots
    line = panel.parts.fold.line
    # Before a run: memory and throughput have nothing to show yet.
    ps = panel.parts.plot_set
    assert not any(p.isVisible() for p in (ps.mem, ps.stack, ps.tput))
    assert line.isVisible() and "during a run" in line.text
    assert w.open_run(cpu_run)
    settle(qtbot, w)
    # A CPU run: no GPU memory (one line), memory by kind and throughput drawn.
    ps = panel.parts.plot_set
    assert not ps.mem.isVisible() and ps.stack.isVisible() and ps.tput.isVisible()
    assert line.isVisible() and "GPU memory: no GPU" in line.text and line.height() <= 24
    assert "Memory by kind" not in line.text and "Throughput" not in line.text
    fits(w)


@pytest.mark.slow
def test_a_gpu_run_shows_its_memory_beside_memory_by_kind_and_throughput(qtbot, make_window, tmp_path):
    """At 1440 x 900 every plot of a GPU run is drawn, the loss at 40%; the headroom fills
    reach the run's last step (they were drawn as the curves were clipped to the range before
    the first fit: the first 100 steps)."""
    w = make_window()
    w.resize(1440, 900)
    assert w.open_run(gpu_run(tmp_path / "gpu"))
    settle(qtbot, w)
    panel = w.plots
    assert all(p.isVisible() for p in panel.parts.plot_set.all)
    assert not panel.parts.fold.line.isVisible() and not panel.hint.text()
    fits(w)
    for fill in (panel.parts.memory.fill, panel.parts.stack.headroom):
        assert fill.isVisible() and fill.path().boundingRect().right() >= 299, fill.path().boundingRect()


def test_rows_fold_lowest_first_and_the_loss_keeps_its_share() -> None:
    cpu = {"mem": "GPU memory: no GPU"}
    full = place_rows(600, 900, cpu)
    assert full.rows == (("loss",), ("norm", "lr"), ("stack", "tput")) and full.line and not full.folded
    assert full.loss_min == 360
    short = place_rows(356, 640, cpu)
    assert short.rows == (("loss",), ("norm", "lr")) and short.folded == ("stack", "tput") and not short.line
    shorter = place_rows(300, 640, cpu)
    assert shorter.rows == (("loss",),) and shorter.folded == ("norm", "lr", "stack", "tput")
    assert shorter.loss_min == 256
    assert place_rows(200, 640, cpu).loss_min == 192  # a canvas under 40% of the window: all of it
    everything_empty = place_rows(600, 900, {"mem": "a", "stack": "b", "tput": "c"})
    assert everything_empty.rows == (("loss",), ("norm", "lr")) and everything_empty.line == "a   \u00b7   b   \u00b7   c"
    assert place_rows(0, 900, cpu).rows == full.rows  # not laid out yet: everything
