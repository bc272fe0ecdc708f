"""The window's layout through the real window: what a relaunch restores (preferences
round-tripped), a laptop-sized window, and plots that never widen the window."""
from __future__ import annotations

import time
from typing import Any

import pytest
from app_helpers import discard, wait_until
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage, QPainter

from app.model.metrics import MetricsBuffer
from app.ui.shell.layout import MIN_PLOT_HEIGHT, plot_share


def settle(qtbot: Any, w: Any, timeout: float = 20.0) -> None:
    """Until the plots are built and the window's geometry has stopped changing."""
    wait_until(qtbot, lambda: w._plots is not None and w._plots.isVisible(), timeout, "the plots")
    last, same, deadline = None, 0, time.monotonic() + timeout
    while same < 4:
        assert time.monotonic() < deadline, "the layout never settled"
        qtbot.wait(40)
        now = (w.size().toTuple(), w.centralWidget().geometry().getRect(), w.alerts_dock.geometry().getRect(),
               w.controls_dock.geometry().getRect(), w.plots.canvas.ci.geometry().getRect())
        same = same + 1 if now == last else 0
        last = now


def plot_height_share(w: Any) -> float:
    return plot_share(w)[0]


@pytest.mark.slow
@pytest.mark.parametrize("size", [(1024, 640), (1440, 900)])
def test_second_launch_restores_plots_that_fill_the_window(qtbot, make_window, size):
    w1 = make_window(restore_settings=True)
    w1.resize(*size)
    settle(qtbot, w1)
    assert plot_height_share(w1) >= MIN_PLOT_HEIGHT
    discard(w1)
    w2 = make_window(restore_settings=True)  # a second launch: everything as saved
    settle(qtbot, w2)
    assert w2.dock_layout.restored  # the user's layout, not the default one
    assert plot_height_share(w2) >= MIN_PLOT_HEIGHT, (w2.size(), w2.centralWidget().geometry())
    assert w2.plots.parts.loss_note.isVisible() and "Press Start" in w2.plots.parts.loss_note.toPlainText()
    assert w2.plots.parts.plot_set.loss.getViewBox().height() > 80  # the hint is drawn in a plot, not a strip


@pytest.mark.slow
def test_a_dock_resized_by_the_user_comes_back_at_its_size(qtbot, make_window):
    w1 = make_window(restore_settings=True)
    w1.resize(780, 740)  # inside the test screen (800 x 800): restoreGeometry keeps it as it is
    settle(qtbot, w1)
    w1.resizeDocks([w1.alerts_dock], [220], Qt.Orientation.Vertical)
    w1.resizeDocks([w1.controls_dock], [250], Qt.Orientation.Horizontal)
    settle(qtbot, w1)
    alerts_h, controls_w = w1.alerts_dock.height(), w1.controls_dock.width()
    assert alerts_h > 150 and abs(controls_w - 250) < 10
    discard(w1)
    w2 = make_window(restore_settings=True)
    settle(qtbot, w2)
    assert w2.size().toTuple() == (780, 740)
    assert abs(w2.alerts_dock.height() - alerts_h) <= 4 and abs(w2.controls_dock.width() - controls_w) <= 4
    assert plot_height_share(w2) >= MIN_PLOT_HEIGHT


@pytest.mark.slow
def test_a_saved_layout_that_hides_the_plots_is_not_restored(qtbot, make_window):
    w1 = make_window(restore_settings=True)
    w1.resize(780, 780)
    settle(qtbot, w1)
    w1.resizeDocks([w1.alerts_dock], [560], Qt.Orientation.Vertical)  # the Alerts dock fills the window
    settle(qtbot, w1)
    assert plot_height_share(w1) < MIN_PLOT_HEIGHT
    discard(w1)
    w2 = make_window(restore_settings=True)
    settle(qtbot, w2)
    assert not w2.dock_layout.restored
    assert plot_height_share(w2) >= MIN_PLOT_HEIGHT


def overlapping_labels(axis: Any) -> list[tuple[str, str]]:
    """Pairs of tick labels of a pyqtgraph axis whose rectangles overlap, as it would draw them."""
    img = QImage(10, 10, QImage.Format.Format_ARGB32)
    p = QPainter(img)
    try:
        specs = axis.generateDrawSpecs(p)
    finally:
        p.end()
    texts = specs[2] if specs else []
    out = []
    for i, (r1, _f1, t1) in enumerate(texts):
        for r2, _f2, t2 in texts[i + 1:]:
            if r1.intersects(r2):
                out.append((t1, t2))
    return out


@pytest.mark.slow
def test_window_fits_1024_by_640_and_stays_readable(qtbot, make_window):
    w = make_window()
    w.resize(1024, 640)
    settle(qtbot, w)
    assert w.size().toTuple() == (1024, 640)
    assert w.minimumSizeHint().width() <= 1024 and w.minimumSizeHint().height() <= 640
    assert plot_height_share(w) >= MIN_PLOT_HEIGHT
    panel = w.plots
    assert panel.canvas.ci.width() <= panel.canvas.viewport().width() + 1  # no plot past the right edge
    assert panel.canvas.ci.height() <= panel.canvas.viewport().height() + 1
    for p in panel.parts.plot_set.all:
        for name in ("left", "bottom"):
            ax = p.getAxis(name)
            if ax.isVisible() and ax.style.get("showValues", True):
                assert not overlapping_labels(ax), (p.titleLabel.text, name)
    # Long texts in the status bar and the panels do not widen it either.
    for label in (w.status.state, w.status.progress, w.status.epoch_text, w.status.eta, w.status.device):
        label.setText("Finished (nonfinite: gave up after 3 rollbacks in a row without progress) " * 2)
        label.setVisible(True)
    w.status.epoch_bar.setVisible(True)
    w.history.root_label.setText("Runs folder: " + "/very/long/path" * 30)
    settle(qtbot, w)
    assert w.size().toTuple() == (1024, 640)


@pytest.mark.slow
def test_a_long_compare_legend_never_widens_the_window(qtbot, make_window):
    w = make_window()
    w.resize(1024, 640)
    settle(qtbot, w)
    buf = MetricsBuffer()
    buf.extend_columns({"step": [1.0, 2.0, 3.0], "loss": [2.0, 1.5, 1.2], "samples": [64.0, 128.0, 192.0]})
    for i in range(6):
        w.plots.add_overlay(f"a-run-with-a-rather-long-name-{i:02d}-lr-0.001-accum-8", buf)
    settle(qtbot, w)
    assert w.size().toTuple() == (1024, 640)
    assert w.plots.parts.plot_set.loss.titleLabel.is_clipped()  # the legend is cut, not the plots widened
    assert w.plots.canvas.ci.width() <= w.plots.canvas.viewport().width() + 1


def synthetic_run(path: Any, steps: int = 120) -> str:
    """A finished run folder written through the run store (no torch)."""
    from engine.declarations.events import StepMetrics
    from engine.store import RunStore
    path.mkdir(parents=True, exist_ok=True)
    store = RunStore(str(path))
    store.set_info(status="finished", task="mlp", device="cpu")
    for s in range(1, steps + 1):
        store.record(StepMetrics(s, 1 + s // 50, loss=2.0 / (1 + s / 20), grad_norm=0.5 + s % 3, clipped=False,
                                 lr=1e-3, accum=4, clip=1.0, micro_batch=16, samples=64, tokens=100 + s,
                                 step_time=0.01, throughput=1000.0, nonfinite=False, scaler_skipped=False))
    store.close()
    return str(path)


@pytest.mark.slow
def test_a_scripted_screenshot_shows_the_window_laid_out(qtbot, make_window, tmp_path):
    w1 = make_window(restore_settings=True)  # a saved layout: the screenshot is of a second launch
    w1.resize(780, 740)
    settle(qtbot, w1)
    discard(w1)
    run = synthetic_run(tmp_path / "run")
    # As `python -m app --open RUN --screenshot out.png --quit-when-done` does, with no event
    # processed between the window showing and the screenshot.
    w = make_window(restore_settings=True)
    w.resize(1440, 900)
    w.use_default_layout()
    assert w.open_run(run)
    assert w.screenshot(str(tmp_path / "shot.png"))

    def shape() -> tuple:
        return (w.size().toTuple(), w.centralWidget().geometry().getRect(), w.alerts_dock.geometry().getRect(),
                w.controls_dock.geometry().getRect(), w.plots.canvas.ci.geometry().getRect(),
                round(w.plots.parts.plot_set.loss.getViewBox().height()))
    shot = shape()
    qtbot.wait(1500)  # as a person would see it a moment later
    settle(qtbot, w)
    assert shot == shape()
    assert plot_height_share(w) >= MIN_PLOT_HEIGHT
