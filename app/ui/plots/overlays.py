"""Other runs drawn over this one's plots (Run history's Compare), one colour each, on the plots'
x axis (by samples or tokens seen, runs with different accumulation line up): on the loss plot
their smoothed loss over their raw loss drawn faintly, and their validation points; their
gradient norm (smoothed, raw faintly), lr and throughput (smoothed, raw faintly) on those
plots. The smoothing is the panel's one weight (app/model/smoothing.py), set on each compared
run's buffer; "Ignore outliers" draws their loss smoothed over the inliers, as the run's own.
Memory stays the run's own: another run's memory on this machine's plot would read as this
run's headroom."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from app.model.metrics import INLIER_EMA, MetricsBuffer
from app.model.x_axis import columns
from app.ui.theme import Palette

from .parts import PlotSet, Series

FAINT_ALPHA = 70  # of 255: a compared run's raw values behind its smoothed curve
SMOOTHED_LOSS = "loss_ema"
# What each compared run draws: (plot, column, faint). The loss's smoothed column follows
# "Ignore outliers" (INLIER_EMA) as the run's own does.
DRAWN: tuple[tuple[str, str, bool], ...] = (
    ("loss", "loss", True), ("loss", SMOOTHED_LOSS, False),
    ("norm", "grad_norm", True), ("norm", "grad_norm_ema", False),
    ("lr", "lr", False),
    ("tput", "throughput", True), ("tput", "throughput_ema", False),
)
PLOTS = ("loss", "norm", "lr", "tput")


@dataclass
class Compared:
    """One run compared: its steps, colour, validation points and curves."""
    name: str
    buf: MetricsBuffer
    color: str
    val_steps: np.ndarray
    val_values: np.ndarray
    curves: list[tuple[str, Series, bool]] = field(default_factory=list)  # (plot name, curve, faint)
    val_item: Optional[pg.PlotDataItem] = None
    val_key: tuple = ()

    def series(self, plot: str) -> list[Series]:
        return [s for p, s, _f in self.curves if p == plot]


class Overlays:
    def __init__(self, plots: PlotSet, pal: Palette) -> None:
        self.plots = plots
        self.pal = pal
        self.runs: dict[str, Compared] = {}
        self.inliers = False  # the loss drawn smoothed over its inliers ("Ignore outliers")

    def _plot(self, name: str) -> pg.PlotItem:
        return getattr(self.plots, name)

    def add(self, name: str, buf: MetricsBuffer, val: Optional[tuple[np.ndarray, np.ndarray]] = None) -> None:
        """Draw another run (its validation points: (steps, values), from its epochs)."""
        self.remove(name)
        used = {r.color for r in self.runs.values()}  # a colour no run compared now has, while there is one
        colors = self.pal.overlay
        color = next((c for c in colors if c not in used), colors[len(self.runs) % len(colors)])
        steps, values = val if val is not None else (np.empty(0), np.empty(0))
        run = Compared(name, buf, color, np.asarray(steps, float), np.asarray(values, float))
        faint = pg.mkColor(color)
        faint.setAlpha(FAINT_ALPHA)
        for plot_name, column, is_faint in DRAWN:
            plot = self._plot(plot_name)
            pen = pg.mkPen(faint, width=1) if is_faint else pg.mkPen(color, width=2 if plot_name == "loss" else 1.5)
            item = plot.plot(pen=pen)
            item.setZValue(-2 if is_faint else 2)  # faint ones behind the run's own curves, smoothed ones over
            item.setClipToView(True)
            item.setDownsampling(auto=True, method="peak")
            run.curves.append((plot_name, Series(item, column, buffer=buf), is_faint))
        run.val_item = self.plots.loss.plot(pen=pg.mkPen(color, width=1.2, style=Qt.PenStyle.DashLine), symbol="o",
                                            symbolSize=6, symbolBrush=color, symbolPen=color)
        run.val_item.setZValue(3)
        self.runs[name] = run

    def remove(self, name: str) -> bool:
        run = self.runs.pop(name, None)
        if run is None:
            return False
        for plot_name, s, _f in run.curves:
            self._plot(plot_name).removeItem(s.item)
        if run.val_item is not None:
            self.plots.loss.removeItem(run.val_item)
        return True

    @property
    def entries(self) -> dict[str, tuple[MetricsBuffer, pg.PlotDataItem, Series]]:
        """name -> (its buffer, its smoothed loss curve, that curve's Series)."""
        out = {}
        for name, run in self.runs.items():
            s = next(s for p, s, faint in run.curves if p == "loss" and not faint)
            out[name] = (run.buf, s.item, s)
        return out

    def series(self, plot: Optional[str] = None) -> list[Series]:
        """Every compared run's curves on one plot (by its name in PlotSet; None: on all)."""
        return [s for run in self.runs.values() for p, s, _f in run.curves if plot is None or p == plot]

    def by_plot(self) -> dict[int, list[Series]]:
        """id(plot) -> the compared curves on it, for the ranges of the plots but the loss (ranges.follow
        takes the loss plot's apart: they lead its x range too)."""
        return {id(self._plot(p)): self.series(p) for p in PLOTS if p != "loss"}

    def legend(self, plot: str = "loss") -> list[tuple[str, str, str]]:
        """(colour, glyph, text) for a plot's title: each compared run by name."""
        return [(run.color, "\u2501", run.name) for run in self.runs.values() if run.series(plot)]

    def buffers(self) -> list[tuple[str, MetricsBuffer, tuple[np.ndarray, np.ndarray]]]:
        """(name, buffer, validation points) of each run: what add() takes to draw them again."""
        return [(n, r.buf, (r.val_steps, r.val_values)) for n, r in self.runs.items()]

    def set_smoothing(self, weight: float) -> None:
        for run in self.runs.values():
            if run.buf.set_smoothing(weight):
                for _p, s, _f in run.curves:
                    s.key = ()

    def update(self, x0: Optional[float], x1: Optional[float], width: int, axis: str = "step",
               inliers: Optional[bool] = None) -> None:
        if inliers is not None:
            self.inliers = inliers
        smoothed = INLIER_EMA if self.inliers else SMOOTHED_LOSS
        for run in self.runs.values():
            for plot_name, s, faint in run.curves:
                if plot_name == "loss" and not faint:
                    s.show_column(smoothed)
                s.update(run.buf, x0, x1, width, axis)
            self._update_val(run, axis)

    @staticmethod
    def _update_val(run: Compared, axis: str) -> None:
        cols = columns(run.buf)
        key = (axis, run.buf.version, tuple(sorted(cols.offsets.items())))
        if key == run.val_key or run.val_item is None:
            return
        run.val_key = key
        ok = np.isfinite(run.val_steps) & np.isfinite(run.val_values)
        steps, values = run.val_steps[ok], run.val_values[ok]
        run.val_item.setData(cols.at_steps(axis, steps) if len(steps) else steps, values)
