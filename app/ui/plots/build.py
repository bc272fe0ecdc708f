"""Building the plot panel's canvas: its plots, curves and parts, returned as one record.

Everything drawn on the canvas is made here, on a new canvas each time: at the start, and again
for a theme switch (PlotPanel.set_theme), so the light and the dark canvas are made by the same
code and none of the old one's state (a plot folded out of its layout) is reused. Not
canvas.clear() and a rebuild on the same canvas: pyqtgraph's clear() raised on a plot folded out
of the grid and left the plot area blank. Nor a restyle in place: every part (curves, markers,
fills, labels, the runs compared, the hover lines) would have to re-pen each item it made, and one
that forgot would keep the old theme's colours; a new canvas draws every part in the new palette
by construction.

This module knows nothing of the panel: the panel (panel.py) calls build_canvas, puts the canvas
in its layout, connects it to its own slots and keeps the record (`PlotPanel.parts`). What
outlives a canvas is the panel's (its model, axis, log scales, toolbar); a new canvas goes on
with the old one's runs compared and fork point (build_canvas), and its zoom (set_theme)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

from app.ui.theme import Palette

from .fold import PlotFold
from .marks import PlotMarks
from .mem_stack import MemoryStack
from .memory import MemoryPlot
from .note import PlotNote
from .overlays import Overlays
from .parts import PlotCanvas, PlotSet, Series, adopt_menus, make_plots
from .planned_lr import PlannedLr
from .point_menu import PointMenu, PointViewBox
from .rollbacks import RollbackMarks
from .validation import ValidationDots

IDLE_NOTE = "Press Start (F5) to train, or open a run folder (Ctrl+O)"


@dataclass(frozen=True)
class Curves:
    """The run's own curves, one item each (the memory plot's are MemoryPlot's)."""
    loss_raw: pg.PlotDataItem
    loss_ema: pg.PlotDataItem
    val: pg.PlotDataItem  # validation, one point an epoch
    grad_norm: pg.PlotDataItem
    clip: pg.PlotDataItem  # the clip threshold
    clipped: pg.PlotDataItem  # clipped steps, as dots
    lr: pg.PlotDataItem
    tput: pg.PlotDataItem
    tput_ema: pg.PlotDataItem


@dataclass(frozen=True)
class CanvasParts:
    """One canvas and everything drawn on it; the panel keeps the record of the canvas it shows."""
    canvas: PlotCanvas
    plot_set: PlotSet
    fold: PlotFold
    curves: Curves
    memory: MemoryPlot
    stack: MemoryStack
    marks: PlotMarks
    rollbacks: RollbackMarks
    planned: PlannedLr
    overlays: Overlays
    validation: ValidationDots  # the validation loss, one dot an epoch (curves.val)
    loss_note: PlotNote  # what the empty loss plot says (how to start, or that a run starts)
    series: list[Series]  # the curves fed from the run's columns, in Curves' order (val: by epoch)
    every_frame: list[Series]  # the loss: redrawn every frame
    turns: tuple[list[Series], list[Series]]  # the small plots' curves, redrawn in turns
    # Each plot's own curves, the raw one first: "Ignore outliers" ranges them (and the steps a
    # rollback threw away, the same run's) within the raw curve's fences (ranges.py). By id(plot).
    y_series: dict[int, list[Series]]

    def every_series(self) -> list[Series]:
        """Every curve fed from a column: the run's, its memory's and memory by kind's, the runs compared."""
        return self.series + self.memory.series + self.stack.device + self.overlays.series()


def _make_curves(plots: PlotSet, pal: Palette) -> Curves:
    # Clipped steps as dots: tiny segments with a wide round pen, one path for all of
    # them (a ScatterPlotItem costs ~5 ms a frame per thousand points in Python).
    dot = pg.mkPen(pal.clipped, width=5)
    dot.setCapStyle(Qt.PenCapStyle.RoundCap)
    dash = Qt.PenStyle.DashLine
    return Curves(
        loss_raw=plots.loss.plot(pen=pg.mkPen(pal.loss, width=1)),
        loss_ema=plots.loss.plot(pen=pg.mkPen(pal.ema, width=2)),
        val=plots.loss.plot(pen=pg.mkPen(pal.val, width=1.5, style=dash),
                            symbol="o", symbolSize=7, symbolBrush=pal.val, symbolPen=pal.val),
        grad_norm=plots.norm.plot(pen=pg.mkPen(pal.norm, width=1)),
        clip=plots.norm.plot(pen=pg.mkPen(pal.clip, width=1.5, style=dash)),
        clipped=plots.norm.plot(pen=dot),
        lr=plots.lr.plot(pen=pg.mkPen(pal.lr, width=1.5)),
        tput=plots.tput.plot(pen=pg.mkPen(pal.throughput_raw, width=1)),
        tput_ema=plots.tput.plot(pen=pg.mkPen(pal.throughput, width=2)))


def build_canvas(pal: Palette, point_menu: PointMenu, hint: QLabel, to_x: Callable[[np.ndarray], np.ndarray],
                 old: Optional[CanvasParts] = None) -> CanvasParts:
    """A new canvas in `pal`, with the plots, curves and parts; in place of `old`, it goes on with
    old's paint listeners, runs compared and fork point (the caller swaps the widgets).
    `point_menu`: every plot's right-click "Fork from here..."; `hint`: the toolbar's line that
    names what is folded away (fold.py); `to_x`: step positions on the current x axis (where the
    marks and rollbacks go)."""
    c = PlotCanvas(old.canvas.paint_listeners if old is not None else None)
    c.setBackground(pal.background)
    c.ci.setContentsMargins(4, 4, 10, 4)
    c.ci.setSpacing(8)
    point_menu.actions = []
    ps = make_plots(lambda: PointViewBox(point_menu), pal)
    for p in ps.all:
        adopt_menus(p, c)  # freed with this canvas
    fold = PlotFold(c, ps, hint, pal)
    curves = _make_curves(ps, pal)
    memory, stack = MemoryPlot(ps, pal), MemoryStack(ps, pal)  # (in the order their items stack)
    marks, rollbacks = PlotMarks(ps, pal), RollbackMarks(ps, pal)
    marks.to_x = rollbacks.to_x = to_x
    planned, overlays = PlannedLr(ps.lr, pal), Overlays(ps, pal)
    cv = curves
    series = [Series(cv.loss_raw, "loss"), Series(cv.loss_ema, "loss_ema"), Series(cv.grad_norm, "grad_norm"),
              Series(cv.clip, "clip_line"), Series(cv.clipped, "clipped_y"), Series(cv.lr, "lr"),
              Series(cv.tput, "throughput"), Series(cv.tput_ema, "throughput_ema")]
    for s in series:  # (the memory plots are not clipped: memory.py)
        s.item.setClipToView(True)
    y_series = {id(ps.loss): series[0:2] + [rollbacks.loss], id(ps.norm): series[2:5] + [rollbacks.norm],
                id(ps.lr): series[5:6], id(ps.tput): series[6:8], id(ps.mem): memory.series}

    loss_note = PlotNote(ps.loss, pal.note)
    ps.loss.setRange(xRange=(0, 100), yRange=(0, 1), padding=0)
    for p in (ps.norm, ps.lr, ps.tput, ps.stack):  # the loss plot's steps (as PlotPanel._sync_x keeps them;
        p.setXRange(0, 100, padding=0)             # the memory plot's only while it shows memory)
    for p in (ps.norm, ps.lr, ps.tput):
        p.setYRange(0, 1, padding=0)
    memory.set_mode("none")
    if old is not None:
        rollbacks.fork = old.rollbacks.fork
        for args in old.overlays.buffers():
            overlays.add(*args)
    return CanvasParts(
        canvas=c, plot_set=ps, fold=fold, curves=curves, memory=memory, stack=stack,
        marks=marks, rollbacks=rollbacks, planned=planned, overlays=overlays,
        validation=ValidationDots(curves.val), loss_note=loss_note, series=series, every_frame=series[0:2],
        turns=(series[2:6], series[6:8]),  # norm/clip/clipped/lr, then throughput (+ memory)
        y_series=y_series)
