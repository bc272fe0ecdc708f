"""The theme switch (Ctrl+T) redraws the plots in every layout and keeps what they show.

It used to clear the plot canvas and build it again: with memory and throughput folded away
(always at 1024 x 640) pyqtgraph's clear() raised "Could not determine index of item" and the
plot area stayed blank in both themes until a restart; unfolded, it lost the zoom and every
log scale but the loss's."""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from app_helpers import open_comparing
from PySide6.QtGui import QColor, QImage
from recorded_runs import plot_run
from test_window_layout import settle


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A run, and a fork of it with a higher loss (compared with it, it is drawn over it)."""
    root = tmp_path_factory.mktemp("runs")
    parent = plot_run(root / "parent")
    fork = plot_run(root / "fork", scale=1.5, parent={"run_dir": parent, "checkpoint": "step-40", "step": 40,
                                                      "changed": {"lr": 1e-4}})
    return parent, fork


def colour_pixels(panel: Any, colour: str, tolerance: int = 40) -> int:
    """Pixels of the plot canvas, as painted, within `tolerance` of a colour in each channel."""
    img = panel.canvas.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    a = np.frombuffer(img.constBits(), np.uint8).reshape(img.height(), img.bytesPerLine() // 4, 4)[:, :img.width(), :3]
    c = QColor(colour)
    want = np.array([c.blue(), c.green(), c.red()], dtype=np.int16)  # RGB32 is B, G, R, A in memory
    return int((np.abs(a.astype(np.int16) - want).max(axis=2) <= tolerance).sum())


def drawn(panel: Any) -> None:
    """The plot area shows the run: its background is the theme's, the loss curve and its EMA
    are painted in the theme's colours."""
    assert panel.canvas.backgroundBrush().color().name() == panel.pal.background
    curves = panel.parts.curves
    for item in (curves.loss_raw, curves.loss_ema, curves.grad_norm, curves.lr):
        x, y = item.getOriginalDataset()
        assert y is not None and len(y) > 50 and item.isVisible()
    assert colour_pixels(panel, panel.pal.ema) > 150, panel.theme  # the EMA, a line across the plot
    assert colour_pixels(panel, panel.pal.background, 6) > 0.5 * panel.canvas.width() * panel.canvas.height()


def summary(a: Any) -> tuple:
    """An array as its length, ends and sum (what two drawings of one curve share exactly)."""
    if a is None or not len(a):
        return ()
    a = np.asarray(a, float)
    return (len(a), *(f"{v:.9g}" for v in (a[0], a[-1], np.nansum(a))))


def shown(panel: Any) -> dict[str, Any]:
    """What the plots show, colours aside: each plot's place, title, labels, scale and ranges, and
    everything visible on it (each curve's data, each line's place and label, each note)."""
    out: dict[str, Any] = {"hint": panel.hint.text(), "follow": panel.follow}
    for name in ("loss", "norm", "lr", "mem", "stack", "tput"):
        p = getattr(panel.parts.plot_set, name)
        items = []
        for it in p.items:
            if not it.isVisibleTo(p):
                continue
            kind = type(it).__name__
            if hasattr(it, "getOriginalDataset"):
                items.append((kind, *map(summary, it.getOriginalDataset())))
            elif hasattr(it, "label") and hasattr(it, "value"):  # InfiniteLine
                items.append((kind, round(float(it.value()), 6), it.label.toPlainText() if it.label else ""))
            elif hasattr(it, "toPlainText"):
                items.append((kind, it.toPlainText()))
            elif hasattr(it, "getRegion"):
                items.append((kind, tuple(round(v, 6) for v in it.getRegion())))
            else:
                items.append((kind,))
        out[name] = {"placed": p.isVisible(), "title": re.sub("<[^>]+>", "", p.titleLabel.text),
                     "left": p.getAxis("left").labelText, "bottom": p.getAxis("bottom").labelText,
                     "log": p.ctrl.logYCheck.isChecked(),
                     "range": np.round(np.array(p.getViewBox().viewRange(), float), 6).tolist(),
                     "items": sorted(items, key=repr)}
    return out


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Where two of shown()'s answers differ, each as a path and the two values."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in differences(a.get(k), b.get(k), f"{where}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r:.200} != {b!r:.200}"]


def switch_theme(qtbot: Any, w: Any) -> None:
    """Ctrl+T as a user does it: the window's Dark theme action."""
    w.theme_action.trigger()
    settle(qtbot, w)


def zoom_in(panel: Any) -> None:
    """Zoom into the middle of the loss plot as its mouse wheel does (ViewBox.wheelEvent): the
    plots stop following."""
    vb = panel.parts.plot_set.loss.getViewBox()
    vb.scaleBy((0.6, 0.6), center=vb.viewRect().center())
    vb.sigRangeChangedManually.emit([True, True])


def same(before: dict[str, Any], panel: Any) -> None:
    diffs = differences(before, shown(panel))
    assert not diffs, "\n".join(diffs)


@pytest.mark.slow
def test_theme_switch_draws_the_plots_folded_or_not_and_keeps_what_they_show(qtbot, make_window, runs):
    """At 1024 x 640 (memory and throughput folded away), a fork viewed with its parent
    compared, log scales on two plots, outliers ignored, zoomed in: Ctrl+T draws it all dark,
    the same things; unfolded (1440 x 900), Ctrl+T draws it light again."""
    parent, fork = runs
    w = make_window()
    w.resize(1024, 640)
    open_comparing(w, fork, parent)  # Compare
    settle(qtbot, w)
    panel = w.plots
    assert panel.overlays and panel.rollbacks.fork is not None
    assert "folded" in panel.hint.text()  # memory and throughput folded away
    assert not panel.parts.plot_set.tput.isVisible()
    w.log_action.trigger()  # the loss's (View menu, Ctrl+L)
    panel.parts.plot_set.lr.ctrl.logYCheck.setChecked(True)  # the lr's: Plot Options > Transforms > Log Y in its menu
    panel.outliers_box.setChecked(True)
    zoom_in(panel)
    assert not panel.follow
    panel.refresh()  # the curves drawn for the span zoomed into (as the next pan or new step does)
    before = shown(panel)
    assert before["loss"]["log"] and before["lr"]["log"] and not before["norm"]["log"]
    drawn(panel)
    switch_theme(qtbot, w)
    assert w.theme == "dark" and w.plots.theme == "dark"
    drawn(w.plots)
    same(before, w.plots)
    w.resize(1440, 900)
    settle(qtbot, w)
    assert w.plots.parts.plot_set.tput.isVisible() and not w.plots.hint.text()  # unfolded
    before = shown(w.plots)
    switch_theme(qtbot, w)
    assert w.plots.theme == "light"
    drawn(w.plots)
    same(before, w.plots)
    assert w.log_action.isChecked() and w.plots.log_box.isChecked()
