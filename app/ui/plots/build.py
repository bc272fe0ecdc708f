"""Building the plot panel's canvas: its plots, curves and parts (one function).

Everything drawn on the canvas, and every connection to it, is made here, on a new canvas each
time: at the start, and again for a theme switch (PlotPanel.set_theme), so the light and the
dark canvas are made by the same code and none of the old one's state (a plot folded out of
its layout) is reused. What outlives a canvas is the panel's (its model, axis, log scales,
toolbar) and what set_theme hands over (the runs compared, the fork, the zoom)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import pyqtgraph as pg
from PySide6.QtCore import Qt

from .marks import PlotMarks
from .mem_stack import MemoryStack
from .memory import MemoryPlot
from .overlays import Overlays
from .parts import PlotCanvas, Series, adopt_menus, make_plots
from .plan import PlannedLr
from .point_menu import PointViewBox
from .rollbacks import RollbackMarks
from .fold import PlotFold

if TYPE_CHECKING:
    from .panel import PlotPanel

IDLE_NOTE = "Press Start (F5) to train, or open a run folder (Ctrl+O)"


def build(panel: "PlotPanel") -> None:
    """A new canvas in the panel's palette, in place of the one it had (if any), with the
    panel's plots, curves and parts; what each holds is named on the panel, which draws them."""
    pal = panel.pal
    old = panel.canvas
    c = PlotCanvas(old.paint_listeners if old is not None else None)
    if old is None:
        panel.layout().insertWidget(1, c, 1)  # under the toolbar
    else:
        panel.layout().replaceWidget(old, c)
        old.hide()
        old.deleteLater()
    panel.canvas = c
    c.resized.connect(panel._fit_room)
    c.setBackground(pal.background)
    c.ci.setContentsMargins(4, 4, 10, 4)
    c.ci.setSpacing(8)
    panel.point_menu.actions = []

    panel.plot_set = make_plots(lambda: PointViewBox(panel.point_menu), pal)
    ps = panel.plot_set
    for p in ps.all:
        adopt_menus(p, c)  # freed with this canvas
    panel.fold = PlotFold(c, ps, panel.hint, pal)
    panel.loss_plot, panel.norm_plot, panel.lr_plot = ps.loss, ps.norm, ps.lr
    panel.mem_plot, panel.tput_plot, panel.stack_plot = ps.mem, ps.tput, ps.stack
    panel.plots = ps.all
    for p in panel.plots:
        # Not setXLink: pyqtgraph links plots of different widths by screen position, so the
        # half-width plots would show half the steps. Same step range on every plot instead.
        p.getViewBox().sigXRangeChanged.connect(panel._sync_x)
        p.getViewBox().sigRangeChangedManually.connect(panel._user_moved)

    panel.loss_raw = panel.loss_plot.plot(pen=pg.mkPen(pal.loss, width=1))
    panel.loss_ema = panel.loss_plot.plot(pen=pg.mkPen(pal.ema, width=2))
    panel.val_item = panel.loss_plot.plot(pen=pg.mkPen(pal.val, width=1.5, style=Qt.PenStyle.DashLine),
                                        symbol="o", symbolSize=7, symbolBrush=pal.val, symbolPen=pal.val)
    panel.norm_item = panel.norm_plot.plot(pen=pg.mkPen(pal.norm, width=1))
    panel.clip_item = panel.norm_plot.plot(pen=pg.mkPen(pal.clip, width=1.5, style=Qt.PenStyle.DashLine))
    # Clipped steps as dots: tiny segments with a wide round pen, one path for all of
    # them (a ScatterPlotItem costs ~5 ms a frame per thousand points in Python).
    dot = pg.mkPen(pal.clipped, width=5)
    dot.setCapStyle(Qt.PenCapStyle.RoundCap)
    panel.clipped_item = panel.norm_plot.plot(pen=dot)
    panel.lr_item = panel.lr_plot.plot(pen=pg.mkPen(pal.lr, width=1.5))
    panel.tput_item = panel.tput_plot.plot(pen=pg.mkPen(pal.throughput_raw, width=1))
    panel.tput_ema = panel.tput_plot.plot(pen=pg.mkPen(pal.throughput, width=2))
    panel.memory = MemoryPlot(panel.plot_set, pal)
    panel.mem_total, panel.mem_used, panel.headroom_fill = panel.memory.total, panel.memory.used, panel.memory.fill
    panel.stack = MemoryStack(panel.plot_set, pal)
    panel.marks = PlotMarks(panel.plot_set, pal)
    panel.marks.to_x = panel.steps_to_x
    panel.rollbacks = RollbackMarks(panel.plot_set, pal)
    panel.rollbacks.to_x = panel.steps_to_x
    panel.planned = PlannedLr(panel.lr_plot, pal)
    panel._overlays = Overlays(ps, pal)

    panel.series = [
        Series(panel.loss_raw, "loss"), Series(panel.loss_ema, "loss_ema"),
        Series(panel.norm_item, "grad_norm"), Series(panel.clip_item, "clip_line"),
        Series(panel.clipped_item, "clipped_y"), Series(panel.lr_item, "lr"),
        Series(panel.tput_item, "throughput"), Series(panel.tput_ema, "throughput_ema"),
    ]
    panel.mem_series = panel.memory.series
    panel._every_frame = panel.series[0:2]
    panel._turns = (panel.series[2:6], panel.series[6:8])  # norm/clip/clipped/lr, then throughput (+ memory)
    # Each plot's own curves, the raw one first: "Ignore outliers" ranges them (and the steps a
    # rollback threw away, the same run's) within the raw curve's fences (ranges.py).
    panel._y_series = {id(panel.loss_plot): panel.series[0:2] + [panel.rollbacks.loss],
                      id(panel.norm_plot): panel.series[2:5] + [panel.rollbacks.norm],
                      id(panel.lr_plot): panel.series[5:6], id(panel.tput_plot): panel.series[6:8],
                      id(panel.mem_plot): panel.mem_series}
    for s in panel.series:  # (the memory plots are not clipped: memory.py)
        s.item.setClipToView(True)
    panel._set_downsampling()
    panel._set_titles()

    panel.loss_note = pg.TextItem("", color=pal.note, anchor=(0.5, 0.5))
    panel.loss_note.setZValue(50)
    panel.loss_plot.addItem(panel.loss_note, ignoreBounds=True)
    panel.loss_plot.getViewBox().sigRangeChanged.connect(lambda *_: panel._place_notes())
    panel.loss_plot.setRange(xRange=(0, 100), yRange=(0, 1), padding=0)
    for p in (panel.norm_plot, panel.lr_plot, panel.tput_plot):
        p.setYRange(0, 1, padding=0)
    panel.memory.set_mode("none")
    panel.log_scales.attach(ps)
    panel._fit_room()
    panel._show_x_labels()
    panel._show_loss_note(IDLE_NOTE)
    panel.hover.attach()
