"""The pieces the plot panel is built of: the canvas that times its paints, one curve fed
from a metrics column, the six plots, and their styling (where each plot goes: fold.py)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtWidgets import QGraphicsItem, QWidget

from app.core import compat  # noqa: F401 - before any plotting (PySide6 6.12 + Python 3.11)
from app.model.metrics import MetricsBuffer
from app.model.x_axis import DEFAULT_AXIS, columns
from app.ui.theme import Palette

from .axis_items import XAxisItem
from .fitting import FittingPlot, YAxisItem

GIB = float(2 ** 30)
MIN_DATA_PX = 28  # the least height a plot keeps for its curves
pg.setConfigOptions(antialias=False, foreground="#334155", background="#ffffff")


class PlotCanvas(pg.GraphicsLayoutWidget):
    """GraphicsLayoutWidget that times its paints (the window paces updates by them) and
    reports each one (for the latency benchmark). `paint_listeners`: the list to call, shared
    with the canvas this one replaces (a theme switch builds a new canvas: plots/build.py).
    `resized`: its size changed (the plots are laid out again for it: fold.py)."""

    resized = Signal()

    def __init__(self, paint_listeners: Optional[list[Callable[[float], None]]] = None) -> None:
        super().__init__()
        self.paint_listeners: list[Callable[[float], None]] = paint_listeners if paint_listeners is not None else []
        self.last_paint: float = 0.0
        self.paint_cost: float = 0.0  # seconds, moving average

    def resizeEvent(self, ev):  # noqa: N802 - Qt name
        super().resizeEvent(ev)
        self.resized.emit()

    def paintEvent(self, ev):  # noqa: N802 - Qt name
        t0 = time.perf_counter()
        super().paintEvent(ev)
        self.last_paint = time.perf_counter()
        self.paint_cost = 0.8 * self.paint_cost + 0.2 * (self.last_paint - t0)
        for fn in self.paint_listeners:
            fn(self.last_paint)


class Series:
    """One curve fed from a buffer column (y) against the chosen x axis (app/model/x_axis.py)."""

    def __init__(self, item: pg.PlotDataItem, column: str, scale: float = 1.0, mode: str = "peak",
                 buffer: Optional[MetricsBuffer] = None) -> None:
        self.item = item
        self.column = column
        self.scale = scale
        self.mode = mode
        self.buffer = buffer  # None: the panel's main run
        self.dots = column == "clipped_y"  # points, not a line
        self.key: tuple = ()
        self.y_shown = np.empty(0)
        self.x_last: Optional[float] = None
        self.x_first: Optional[float] = None

    def show_column(self, column: str) -> None:
        """Draw another column of the buffer from the next update on."""
        if column != self.column:
            self.column, self.key = column, ()

    def update(self, buf: MetricsBuffer, x0: Optional[float], x1: Optional[float], width_px: int,
               axis: str = DEFAULT_AXIS) -> None:
        """x0, x1: the visible span in the axis' units (None: all of it)."""
        buf = self.buffer or buf
        # Clipped steps change only when a step is clipped: keyed on their count, not on every step.
        version = len(buf.clipped_x) if self.column == "clipped_y" else buf.version
        key = (id(buf), version, x0, x1, width_px, axis)
        if key == self.key:
            return
        self.key = key
        cols = columns(buf)
        # Every axis is non-decreasing along the rows, so the visible span is still two searchsorted.
        xs = cols.clipped(axis) if self.column == "clipped_y" else cols.values(axis)
        m = len(xs)
        if m == 0:
            self.item.setData([], [])
            self.y_shown = np.empty(0)
            self.x_first = self.x_last = None
            return
        self.x_first, self.x_last = float(xs[0]), float(xs[-1])
        if x0 is None or x1 is None:
            i0, i1 = 0, m
        else:
            i0 = max(0, int(np.searchsorted(xs, x0, side="left")) - 1)
            i1 = min(m, int(np.searchsorted(xs, x1, side="right")) + 1)
        idx, y = buf.pyramid(self.column).decimate(i0, i1, max(200, 2 * width_px))
        if self.mode == "max" and len(idx) != (i1 - i0):
            idx, y = idx[1::2], y[1::2]  # bucket maxima: memory headroom errs on the safe side
        x = xs[idx]
        if self.scale != 1.0:
            y = y / self.scale
        self.y_shown = y
        if self.dots:  # a tiny segment per point: Qt drops zero-length ones, round caps make it a dot
            xd = np.repeat(x, 2)
            xd[1::2] += 1e-4
            self.item.setData(xd, np.repeat(y, 2), connect="pairs")
        else:
            self.item.setData(x, y, connect="finite")


def legend(title: str, entries: list[tuple[str, str, str]], fg: str) -> str:
    """A plot title with its legend inline: [(colour, glyph, text)]."""
    parts = [f"<span style='color:{fg}; font-size:10pt; font-weight:600'>{title}</span>"]
    for color, glyph, text in entries:
        parts.append(f"<span style='color:{color}; font-size:9pt'>&nbsp;&nbsp;{glyph}&nbsp;</span>"
                     f"<span style='color:{fg}; font-size:9pt'>{text}</span>")
    return "".join(parts)


def nice_ceiling(v: float) -> float:
    """The next of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k at or above v."""
    if v <= 0:
        return 1.0
    exp = math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * 10 ** exp >= v:
            return m * 10 ** exp
    return 10 ** (exp + 1)


def style_plot(p: pg.PlotItem, y_label: str, pal: Palette) -> None:
    p.setLabel("left", y_label)
    p.showGrid(x=True, y=True, alpha=pal.grid_alpha)
    p.setDownsampling(auto=True, mode="peak")
    p.setClipToView(True)
    p.getAxis("left").setWidth(64)
    p.setMenuEnabled(True)
    p.hideButtons()
    for axis in ("left", "bottom"):
        ax = p.getAxis(axis)
        ax.setTextPen(pal.foreground)
        ax.setPen(pal.foreground)
        # Axis text is the dearest thing to paint: keep it as a pixmap until the range changes.
        ax.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
    p.getViewBox().disableAutoRange()


@dataclass(frozen=True)
class PlotSet:
    """The panel's six plots: loss on top, then gradient norm and lr, then GPU memory, memory
    by kind and the throughput (fold.py)."""
    loss: pg.PlotItem
    norm: pg.PlotItem
    lr: pg.PlotItem
    mem: pg.PlotItem
    tput: pg.PlotItem
    stack: pg.PlotItem

    @property
    def all(self) -> list[pg.PlotItem]:
        return [self.loss, self.norm, self.lr, self.mem, self.tput, self.stack]


def adopt_menus(plot: pg.PlotItem, owner: QWidget) -> None:
    """Give a plot's context menus a parent. pyqtgraph makes them (its "Plot Options" menu and
    its ViewBox's) with none: each lives as long as its Python object, and its connections back
    to the plot keep the plot alive too, out of the garbage collector's sight. A canvas dropped
    (a theme switch, a window closed) was then never freed, and every later stylesheet (a window
    made, a theme switched) polished its hundreds of widgets again: window tests ran 15 to 20
    times slower late in a worker's run. Owned by `owner`, they go with it."""
    menus = (getattr(plot, "ctrlMenu", None), getattr(plot.getViewBox(), "menu", None))
    for m in menus:
        if isinstance(m, QWidget) and m.parent() is None:
            m.setParent(owner, m.windowFlags())


def make_plots(view_box: Callable[[], pg.ViewBox], pal: Palette) -> PlotSet:
    """The six plots, styled; fold.py places them on the canvas (and folds or collapses them)."""
    def plot() -> pg.PlotItem:
        # A long legend clips, never widens the plots (and the window): app/ui/plots/fitting.py.
        return FittingPlot(axisItems={"bottom": XAxisItem(), "left": YAxisItem()}, viewBox=view_box())
    plots = PlotSet(*(plot() for _ in range(6)))
    for p in plots.all:  # each keeps some room for its data under its title and axis; the rest of the
        p.getViewBox().setMinimumHeight(MIN_DATA_PX)  # height goes by fold.py's rows (not by
        p.getViewBox().setPreferredHeight(MIN_DATA_PX)  # pyqtgraph's preferred sizes)
    for p, label in zip(plots.all, ("loss", "norm", "lr", "GiB", "samples/s", "GiB")):
        style_plot(p, label, pal)
    return plots
