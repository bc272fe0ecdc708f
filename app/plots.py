"""Live plots (pyqtgraph): loss, gradient norm, lr, GPU memory, throughput.

Each curve is drawn from the metrics buffer's numpy columns through a min/max
pyramid (app/decimate.py): only the visible span, in about two points per pixel,
reaches pyqtgraph, which also has setDownsampling(auto=True, mode='peak') and
setClipToView(True) on. The window calls `refresh()` from its ~30 Hz timer; nothing
here is driven by a signal per step.

Ranges: while "following" (the default, and after "Fit all") the panel sets the axes
itself, in steps (x grows by a fifth at a time, y only when the data leaves it or
fills a small part of it), so the axes, whose text is the dearest thing to paint, are
redrawn now and then rather than on every frame; they are cached as pixmaps between.
Zooming or panning with the mouse stops following.
"""
from __future__ import annotations

import math
import time
from typing import Callable, Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QCheckBox, QGraphicsItem, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from . import compat  # noqa: F401 - before any plotting (PySide6 6.12 + Python 3.11)
from .metrics import MetricsBuffer
from .runmodel import RunModel
from .theme import Palette, palette

GIB = float(2 ** 30)
MAX_LINE_MARKERS = 200  # non-finite steps drawn as lines; beyond that the alerts panel counts them
pg.setConfigOptions(antialias=False, foreground="#334155", background="#ffffff")


class PlotCanvas(pg.GraphicsLayoutWidget):
    """GraphicsLayoutWidget that times its paints (the window paces updates by them) and
    reports each one (for the latency benchmark)."""

    def __init__(self) -> None:
        super().__init__()
        self.paint_listeners: list[Callable[[float], None]] = []
        self.last_paint: float = 0.0
        self.paint_cost: float = 0.0  # seconds, moving average

    def paintEvent(self, ev):  # noqa: N802 - Qt name
        t0 = time.perf_counter()
        super().paintEvent(ev)
        self.last_paint = time.perf_counter()
        self.paint_cost = 0.8 * self.paint_cost + 0.2 * (self.last_paint - t0)
        for fn in self.paint_listeners:
            fn(self.last_paint)


class Series:
    """One curve fed from a buffer column (y) against the step column (x)."""

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

    def update(self, buf: MetricsBuffer, x0: Optional[float], x1: Optional[float], width_px: int) -> None:
        buf = self.buffer or buf
        # Clipped steps change only when a step is clipped: keyed on their count, not on every step.
        version = len(buf.clipped_x) if self.column == "clipped_y" else buf.version
        key = (id(buf), version, x0, x1, width_px)
        if key == self.key:
            return
        self.key = key
        xs = buf.clipped_x.view() if self.column == "clipped_y" else buf.view("step")
        m = len(xs)
        if m == 0:
            self.item.setData([], [])
            self.y_shown = np.empty(0)
            self.x_first = self.x_last = None
            return
        self.x_first, self.x_last = float(xs[0]), float(xs[-1])
        if x0 is None:
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


def _legend(title: str, entries: list[tuple[str, str, str]], fg: str) -> str:
    """A plot title with its legend inline: [(colour, glyph, text)]."""
    parts = [f"<span style='color:{fg}; font-size:10pt; font-weight:600'>{title}</span>"]
    for color, glyph, text in entries:
        parts.append(f"<span style='color:{color}; font-size:9pt'>&nbsp;&nbsp;{glyph}&nbsp;</span>"
                     f"<span style='color:{fg}; font-size:9pt'>{text}</span>")
    return "".join(parts)


def _nice_ceiling(v: float) -> float:
    """The next of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k at or above v."""
    if v <= 0:
        return 1.0
    exp = math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * 10 ** exp >= v:
            return m * 10 ** exp
    return 10 ** (exp + 1)


def _style_plot(p: pg.PlotItem, y_label: str, pal: Palette) -> None:
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


class PlotPanel(QWidget):
    """All live plots of one run, plus overlays of other runs' loss."""

    log_scale_changed = Signal(bool)

    def __init__(self, theme: str = "light", parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.pal = palette(theme)
        self.theme = theme
        self.model: Optional[RunModel] = None
        self.follow = True
        self._version = -1
        self._range_key: tuple = ()
        self._marker_count = -1
        self._nonfinite_count = -1
        self._epoch_count = -1
        self._gpu_mode: Optional[str] = None
        self._updating = False
        self._turn = 0
        self.stale = False  # some small plot waits for its turn: the next refresh must run
        self.refresh_cost = 0.0
        self._syncing_x = False
        self._tput_unit = ""
        self._log = False
        self.overlays: dict[str, tuple[MetricsBuffer, pg.PlotDataItem, Series]] = {}
        self.marker_lines: list[tuple[pg.PlotItem, pg.InfiniteLine]] = []
        self.nonfinite_lines: list[tuple[pg.PlotItem, pg.InfiniteLine]] = []
        self.on_updated: list[Callable[[], None]] = []

        bar = QHBoxLayout()
        bar.setContentsMargins(6, 4, 6, 0)
        self.log_box = QCheckBox("Log scale (loss)")
        self.log_box.setToolTip("Show the loss on a logarithmic y axis")
        self.log_box.toggled.connect(self.set_log_scale)
        self.fit_button = QPushButton("Fit all")
        self.fit_button.setToolTip("Show the whole run and follow new steps (zooming with the mouse stops following)")
        self.fit_button.clicked.connect(self.fit)
        self.hint = QLabel("")
        self.hint.setObjectName("hint")
        bar.addWidget(self.log_box)
        bar.addWidget(self.fit_button)
        bar.addStretch(1)
        bar.addWidget(self.hint)

        self.canvas = PlotCanvas()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addLayout(bar)
        lay.addWidget(self.canvas, 1)
        self._build()

    # -- construction --------------------------------------------------------------------
    def _build(self) -> None:
        pal = self.pal
        c = self.canvas
        c.setBackground(pal.background)
        c.ci.setContentsMargins(4, 4, 10, 4)
        c.ci.setSpacing(8)
        self.loss_plot = c.addPlot(row=0, col=0, colspan=2)
        self.norm_plot = c.addPlot(row=1, col=0)
        self.lr_plot = c.addPlot(row=1, col=1)
        self.mem_plot = c.addPlot(row=2, col=0)
        self.tput_plot = c.addPlot(row=2, col=1)
        c.ci.layout.setRowStretchFactor(0, 5)
        c.ci.layout.setRowStretchFactor(1, 3)
        c.ci.layout.setRowStretchFactor(2, 3)
        self.plots = [self.loss_plot, self.norm_plot, self.lr_plot, self.mem_plot, self.tput_plot]
        _style_plot(self.loss_plot, "loss", pal)
        _style_plot(self.norm_plot, "norm", pal)
        _style_plot(self.lr_plot, "lr", pal)
        _style_plot(self.mem_plot, "GiB", pal)
        _style_plot(self.tput_plot, "samples/s", pal)
        self.lr_plot.getAxis("left").enableAutoSIPrefix(False)
        for p in (self.loss_plot, self.mem_plot, self.tput_plot):
            p.setLabel("bottom", "optimizer step")
        for p in (self.norm_plot, self.lr_plot):  # same steps as the plot below them
            p.getAxis("bottom").setStyle(showValues=False)
        for p in self.plots:
            # Not setXLink: pyqtgraph links plots of different widths by screen position, so the
            # half-width plots would show half the steps. Same step range on every plot instead.
            p.getViewBox().sigXRangeChanged.connect(self._sync_x)
            p.getViewBox().sigRangeChangedManually.connect(self._user_moved)
        self._set_titles()

        self.loss_raw = self.loss_plot.plot(pen=pg.mkPen(pal.loss, width=1))
        self.loss_ema = self.loss_plot.plot(pen=pg.mkPen(pal.ema, width=2))
        self.val_item = self.loss_plot.plot(pen=pg.mkPen(pal.val, width=1.5, style=Qt.PenStyle.DashLine),
                                            symbol="o", symbolSize=7, symbolBrush=pal.val, symbolPen=pal.val)
        self.norm_item = self.norm_plot.plot(pen=pg.mkPen(pal.norm, width=1))
        self.clip_item = self.norm_plot.plot(pen=pg.mkPen(pal.clip, width=1.5, style=Qt.PenStyle.DashLine))
        # Clipped steps as dots: tiny segments with a wide round pen, one path for all of
        # them (a ScatterPlotItem costs ~5 ms a frame per thousand points in Python).
        dot = pg.mkPen(pal.clipped, width=5)
        dot.setCapStyle(Qt.PenCapStyle.RoundCap)
        self.clipped_item = self.norm_plot.plot(pen=dot)
        self.lr_item = self.lr_plot.plot(pen=pg.mkPen(pal.lr, width=1.5))
        self.tput_item = self.tput_plot.plot(pen=pg.mkPen(pal.throughput_raw, width=1))
        self.tput_ema = self.tput_plot.plot(pen=pg.mkPen(pal.throughput, width=2))
        self.mem_total = self.mem_plot.plot(pen=pg.mkPen(pal.mem_total, width=1.5))
        self.mem_used = self.mem_plot.plot(pen=pg.mkPen(pal.mem_used, width=1.5))
        self.mem_reserved = self.mem_plot.plot(pen=pg.mkPen(pal.mem_reserved, width=1))
        self.mem_peak = self.mem_plot.plot(pen=pg.mkPen(pal.mem_peak, width=1, style=Qt.PenStyle.DotLine))
        self.headroom_fill = pg.FillBetweenItem(self.mem_used, self.mem_total, brush=pg.mkBrush(*pal.headroom))
        self.mem_total.sigPlotChanged.disconnect(self.headroom_fill.curveChanged)  # total is set first, used
        self.mem_plot.addItem(self.headroom_fill)                                   # next: one path update

        self.series = [
            Series(self.loss_raw, "loss"), Series(self.loss_ema, "loss_ema"),
            Series(self.norm_item, "grad_norm"), Series(self.clip_item, "clip_line"),
            Series(self.clipped_item, "clipped_y"), Series(self.lr_item, "lr"),
            Series(self.tput_item, "throughput"), Series(self.tput_ema, "throughput_ema"),
        ]
        self.mem_series = [Series(self.mem_total, "mem_total", GIB, "max"),
                           Series(self.mem_used, "mem_used", GIB, "max"),
                           Series(self.mem_reserved, "mem_reserved", GIB, "max"),
                           Series(self.mem_peak, "mem_peak", GIB, "max")]
        self._every_frame = self.series[0:2]
        self._turns = (self.series[2:6], self.series[6:8])  # norm/clip/clipped/lr, then throughput (+ memory)
        self._y_series = {id(self.loss_plot): self.series[0:2], id(self.norm_plot): self.series[2:5],
                          id(self.lr_plot): self.series[5:6], id(self.tput_plot): self.series[6:8],
                          id(self.mem_plot): self.mem_series}
        for s in self.series + self.mem_series:
            s.item.setClipToView(True)
            s.item.setDownsampling(auto=True, method="peak")

        self.loss_note = pg.TextItem("", color=pal.note, anchor=(0.5, 0.5))
        self.mem_note = pg.TextItem("", color=pal.note, anchor=(0.5, 0.5))
        for note in (self.loss_note, self.mem_note):
            note.setZValue(50)
        self.loss_plot.addItem(self.loss_note, ignoreBounds=True)
        self.mem_plot.addItem(self.mem_note, ignoreBounds=True)
        self.loss_plot.getViewBox().sigRangeChanged.connect(lambda *_: self._place_notes())
        self.loss_plot.setRange(xRange=(0, 100), yRange=(0, 1), padding=0)
        for p in (self.norm_plot, self.lr_plot, self.tput_plot):
            p.setYRange(0, 1, padding=0)
        self._set_gpu_mode("none")
        self._show_loss_note("Press Start (F5) to train, or open a run folder (Ctrl+O)")

    def _set_titles(self) -> None:
        pal, fg = self.pal, self.pal.foreground
        m = self.model
        extra = []
        if m is not None and m.markers:
            extra.append((pal.marker, "\u2506", "setting applied"))
        if m is not None and m.metrics.nonfinite_steps:
            extra.append((pal.nonfinite, "\u2506", "non-finite step"))
        self.loss_plot.setTitle(_legend("Loss", [(pal.loss, "\u2501", "per step"), (pal.ema, "\u2501", "EMA"),
                                                 (pal.val, "\u25cf", "validation (per epoch)")] + extra
                                        + [(pal.overlay[i % len(pal.overlay)], "\u2501", f"{n} (EMA)")
                                           for i, n in enumerate(self.overlays)], fg))
        self.norm_plot.setTitle(_legend("Gradient norm, before clipping",
                                        [(pal.norm, "\u2501", "norm"), (pal.clip, "\u2505", "clip"),
                                         (pal.clipped, "\u25cf", "clipped")], fg))
        self.lr_plot.setTitle(_legend("Learning rate", [], fg))
        self.tput_plot.setTitle(_legend("Throughput", [(pal.throughput_raw, "\u2501", "per step"),
                                                       (pal.throughput, "\u2501", "EMA")], fg))

    # -- notes in the plot area ------------------------------------------------------------
    def _place_notes(self) -> None:
        for plot, note in ((self.loss_plot, self.loss_note), (self.mem_plot, self.mem_note)):
            if note.isVisible():
                note.setPos(plot.getViewBox().viewRect().center())

    def _show_loss_note(self, text: str) -> None:
        if text == self.loss_note.toPlainText() and self.loss_note.isVisible() == bool(text):
            return
        self.loss_note.setText(text)
        self.loss_note.setVisible(bool(text))
        self._place_notes()

    def _set_gpu_mode(self, mode: str) -> None:
        """'gpu': memory curves; 'cpu': the plot says plainly there is no GPU; 'none': no run yet."""
        if mode == self._gpu_mode:
            return
        self._gpu_mode = mode
        p, pal = self.mem_plot, self.pal
        gpu = mode == "gpu"
        # Without the memory plot's step axis under it, the norm plot shows its own.
        self.norm_plot.getAxis("bottom").setStyle(showValues=not gpu)
        self.norm_plot.setLabel("bottom", "" if gpu else "optimizer step")
        for s in self.mem_series:
            s.item.setVisible(gpu)
        self.headroom_fill.setVisible(gpu)
        for axis in ("left", "bottom"):
            p.showAxis(axis, gpu)
        p.showGrid(x=gpu, y=gpu, alpha=pal.grid_alpha)
        p.setMouseEnabled(x=gpu, y=gpu)
        if gpu:
            p.setTitle(_legend("GPU memory", [(pal.mem_used, "\u2501", "used"),
                                              (pal.mem_reserved, "\u2501", "reserved"),
                                              (pal.mem_peak, "\u2505", "peak"), (pal.mem_total, "\u2501", "total"),
                                              ("#%02x%02x%02x" % tuple(pal.headroom[:3]), "\u2588", "headroom")],
                                  pal.foreground))
            (x0, x1), _ = self.loss_plot.getViewBox().viewRange()
            p.setXRange(x0, x1, padding=0)
            self.mem_note.setVisible(False)
        else:
            p.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
            if mode == "cpu":
                p.setTitle(_legend("GPU memory: no GPU", [], pal.foreground))
                text = "No GPU: this run trains on the CPU,\nso there is no GPU memory to show."
            else:
                p.setTitle(_legend("GPU memory", [], pal.foreground))
                text = "GPU memory shows here\nduring a run on a GPU."
            self.mem_note.setText(text)
            self.mem_note.setVisible(True)
            self.mem_note.setPos(0.5, 0.5)

    # -- data ----------------------------------------------------------------------------
    def set_model(self, model: Optional[RunModel]) -> None:
        self.model = model
        self._version = -1
        self._marker_count = self._nonfinite_count = self._epoch_count = -1
        for s in self.series + self.mem_series:
            s.key = ()
        self.follow = True
        self.refresh(force=True)

    def set_log_scale(self, on: bool) -> None:
        if self.log_box.isChecked() != on:
            self.log_box.setChecked(on)
            return
        self._log = on
        self.loss_plot.setLogMode(y=on)
        self.loss_plot.setLabel("left", "loss (log)" if on else "loss")
        self.follow = True
        self.refresh(force=True)
        self.log_scale_changed.emit(on)

    def fit(self) -> None:
        """Show everything and follow new steps again."""
        self.follow = True
        self.refresh(force=True, refit=True)

    def _user_moved(self, *_args) -> None:
        if not self._updating:
            self.follow = False

    def _sync_x(self, vb: pg.ViewBox, rng: tuple) -> None:
        if self._syncing_x:
            return
        self._syncing_x = True
        try:
            for p in self.plots:
                if p.getViewBox() is vb or (p is self.mem_plot and self._gpu_mode != "gpu"):
                    continue
                p.setXRange(float(rng[0]), float(rng[1]), padding=0)
        finally:
            self._syncing_x = False
        if not self._updating and not self.follow:
            self.refresh()

    def _visible(self) -> tuple[Optional[float], Optional[float], int]:
        vb = self.loss_plot.getViewBox()
        width = max(100, int(vb.width()) or 600)
        if self.follow:
            return None, None, width
        (x0, x1), _ = vb.viewRange()
        return float(x0), float(x1), width

    def refresh(self, force: bool = False, refit: bool = False) -> bool:
        """Bring the plots up to date with the model. Cheap when nothing changed."""
        model = self.model
        if model is None:
            return False
        buf = model.metrics
        x0, x1, width = self._visible()
        range_key = (x0, x1, width, self.follow)
        if not force and not self.stale and buf.version == self._version and range_key == self._range_key \
                and len(model.markers) == self._marker_count and len(model.epochs) == self._epoch_count \
                and len(buf.nonfinite_steps) == self._nonfinite_count:
            return False
        self._updating = True
        t_start = time.perf_counter()
        try:
            # New steps while following: the loss every frame, the small plots in turns (each
            # about 15 times a second at 30 frames), so a frame repaints about half the canvas and
            # blocks the event loop half as long. A forced refresh, or a zoom/pan, updates all.
            all_plots = (force or range_key != self._range_key or not self.follow
                         or buf.version == self._version)  # nothing new: catch up what waited its turn
            self.stale = not all_plots
            self._turn = (self._turn + 1) % 2
            self._version, self._range_key = buf.version, range_key
            for s in self.series:
                if all_plots or s in self._every_frame or s in self._turns[self._turn]:
                    s.update(buf, x0, x1, width)
            for _name, (obuf, _item, s) in self.overlays.items():
                s.update(obuf, x0, x1, width)
            if all_plots or self._turn == 1:
                self._update_gpu(model, buf, x0, x1, width)
            self._update_epochs(model)
            self._update_markers(model)
            self._update_nonfinite(buf)
            unit = "tokens/s" if buf.counts_tokens() else "samples/s"
            if unit != self._tput_unit:
                self._tput_unit = unit
                self.tput_plot.setLabel("left", unit)
            if self.follow:
                self._follow_ranges(refit or force)
            has_data = len(buf) > 0 or bool(self.overlays)
            if has_data:
                self._show_loss_note("")
            elif model.is_live:
                self._show_loss_note("Starting: loading torch and the task...")
            else:
                self._show_loss_note("Press Start (F5) to train, or open a run folder (Ctrl+O)")
        finally:
            self._updating = False
            self.refresh_cost = 0.8 * self.refresh_cost + 0.2 * (time.perf_counter() - t_start)
        for fn in self.on_updated:
            fn()
        return True

    def frame_cost(self) -> float:
        """Seconds one update of the plots costs the GUI thread (refresh + paint), moving average."""
        return self.refresh_cost + self.canvas.paint_cost

    # -- ranges while following ----------------------------------------------------------------
    def _follow_ranges(self, refit: bool) -> None:
        lasts = [s.x_last for s in self.series[:1] + [o[2] for o in self.overlays.values()] if s.x_last is not None]
        firsts = [s.x_first for s in self.series[:1] + [o[2] for o in self.overlays.values()]
                  if s.x_first is not None]
        if lasts:
            lo = min(0.0, min(firsts))
            last = max(lasts)
            (cx0, cx1), _ = self.loss_plot.getViewBox().viewRange()
            if refit or last > cx1 or cx1 > 2.5 * max(last, 20) or cx0 != lo:
                self.loss_plot.setXRange(lo, _nice_ceiling(max(last * 1.2, last + 5)), padding=0)
        else:
            self.loss_plot.setXRange(0, 100, padding=0)
        for p in self.plots:
            if p is self.mem_plot and self._gpu_mode != "gpu":
                continue
            series = list(self._y_series[id(p)])
            if p is self.loss_plot:
                series += [o[2] for o in self.overlays.values()]
            ys = [s.y_shown for s in series if len(s.y_shown)]
            if p is self.loss_plot:
                _x, vy = self.val_item.getData()
                if vy is not None and len(vy):
                    ys.append(np.asarray(vy, float))
            if not ys:
                continue
            y = np.concatenate(ys)
            log = p is self.loss_plot and self._log
            if log:
                y = y[y > 0]
                y = np.log10(y) if len(y) else y
            y = y[np.isfinite(y)]
            if not len(y):
                continue
            lo, hi = float(y.min()), float(y.max())
            if p is self.mem_plot:
                lo = 0.0
            _, (cy0, cy1) = p.getViewBox().viewRange()
            span = hi - lo
            if not refit and lo >= cy0 and hi <= cy1 and (cy1 - cy0) <= 3.0 * max(span, 1e-12) + 1e-300:
                continue
            pad = 0.08 * span if span > 0 else (abs(hi) * 0.5 if hi else 1.0)
            new_lo, new_hi = lo - pad, hi + pad
            if not log and lo >= 0 and new_lo < 0:
                new_lo = 0.0
            p.setYRange(new_lo, new_hi, padding=0)

    def _update_gpu(self, model: RunModel, buf: MetricsBuffer, x0, x1, width) -> None:
        device = str(model.info.get("device") or "")
        if buf.has_gpu_memory():
            self._set_gpu_mode("gpu")
        elif device.startswith("cpu") or len(buf):
            self._set_gpu_mode("cpu")
        else:
            self._set_gpu_mode("none")
        if self._gpu_mode == "gpu":
            for s in self.mem_series:
                s.update(buf, x0, x1, width)  # the headroom fill follows its two curves by itself

    def _update_epochs(self, model: RunModel) -> None:
        if len(model.epochs) == self._epoch_count:
            return
        self._epoch_count = len(model.epochs)
        pts = [(step, val) for _e, step, _t, val in model.epochs if val is not None and math.isfinite(val)]
        if pts:
            xs, ys = zip(*pts)
            self.val_item.setData(np.array(xs, float), np.array(ys, float))
        else:
            self.val_item.setData([], [])

    def _update_markers(self, model: RunModel) -> None:
        if len(model.markers) == self._marker_count:
            return
        self._marker_count = len(model.markers)
        self._set_titles()
        for plot, line in self.marker_lines:
            plot.removeItem(line)
        self.marker_lines = []
        pen = pg.mkPen(self.pal.marker, width=1.5, style=Qt.PenStyle.DashLine)
        for i, m in enumerate(model.markers):
            position = 0.93 - 0.14 * (i % 3)  # staggered, so markers close together keep readable labels
            for p in self.plots:
                if p is self.mem_plot and self._gpu_mode != "gpu":
                    continue
                label = m.label if p is self.loss_plot else _short_label(m.label)
                line = pg.InfiniteLine(pos=m.step, angle=90, pen=pen, label=label,
                                       labelOpts={"position": position, "color": self.pal.marker,
                                                  "anchors": [(0, 0.5), (0, 0.5)],
                                                  "fill": pg.mkBrush(self.pal.background + "d8")})
                line.setZValue(20)
                p.addItem(line, ignoreBounds=True)
                self.marker_lines.append((p, line))

    def _update_nonfinite(self, buf: MetricsBuffer) -> None:
        steps = buf.nonfinite_steps
        if len(steps) == self._nonfinite_count:
            return
        self._nonfinite_count = len(steps)
        self._set_titles()
        for plot, line in self.nonfinite_lines:
            plot.removeItem(line)
        self.nonfinite_lines = []
        pen = pg.mkPen(self.pal.nonfinite, width=1.5, style=Qt.PenStyle.DotLine)
        shown = steps[-MAX_LINE_MARKERS:]
        for i, s in enumerate(shown):
            for p in (self.loss_plot, self.norm_plot):
                label = "NaN/Inf" if (p is self.loss_plot and i == len(shown) - 1) else None
                line = pg.InfiniteLine(pos=s, angle=90, pen=pen, label=label,
                                       labelOpts={"position": 0.08, "color": self.pal.nonfinite,
                                                  "anchors": [(0, 0.5), (0, 0.5)]})
                line.setZValue(15)
                p.addItem(line, ignoreBounds=True)
                self.nonfinite_lines.append((p, line))

    # -- overlays ------------------------------------------------------------------------
    def add_overlay(self, name: str, buf: MetricsBuffer) -> None:
        self.remove_overlay(name, refresh=False)
        color = self.pal.overlay[len(self.overlays) % len(self.pal.overlay)]
        item = self.loss_plot.plot(pen=pg.mkPen(color, width=2))
        item.setClipToView(True)
        item.setDownsampling(auto=True, method="peak")
        self.overlays[name] = (buf, item, Series(item, "loss_ema", buffer=buf))
        self._set_titles()
        self.follow = True
        self.refresh(force=True, refit=True)

    def remove_overlay(self, name: str, refresh: bool = True) -> None:
        entry = self.overlays.pop(name, None)
        if entry is not None:
            self.loss_plot.removeItem(entry[1])
            self._set_titles()
            if refresh:
                self.refresh(force=True, refit=True)

    def clear_overlays(self) -> None:
        for name in list(self.overlays):
            self.remove_overlay(name)

    # -- reading back --------------------------------------------------------------------
    def curve_data(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """What a curve currently shows (x, y), for tests and export."""
        item = {"loss": self.loss_raw, "loss_ema": self.loss_ema, "val": self.val_item, "grad_norm": self.norm_item,
                "clip": self.clip_item, "clipped": self.clipped_item, "lr": self.lr_item,
                "throughput": self.tput_item, "mem_used": self.mem_used, "mem_total": self.mem_total}[name]
        x, y = item.getData()
        x, y = np.asarray(x if x is not None else []), np.asarray(y if y is not None else [])
        if name == "clipped":  # drawn as zero-length segments: each point twice
            x, y = x[::2], y[::2]
        return x, y

    def gpu_mode(self) -> Optional[str]:
        return self._gpu_mode

    def set_theme(self, theme: str) -> None:
        """Rebuild the plots in the other palette (keeps the model and the overlays)."""
        overlays = [(n, b) for n, (b, _i, _s) in self.overlays.items()]
        self.theme, self.pal = theme, palette(theme)
        self.canvas.clear()
        self.overlays.clear()
        self.marker_lines, self.nonfinite_lines = [], []
        self._gpu_mode = None
        self._tput_unit = ""
        self._build()
        for n, b in overlays:
            self.add_overlay(n, b)
        if self._log:
            self.loss_plot.setLogMode(y=True)
            self.loss_plot.setLabel("left", "loss (log)")
        self.set_model(self.model)


def _short_label(label: str) -> str:
    """'accum 4→8, lr 0.001→0.002' -> 'accum 8, lr 0.002' for the small plots."""
    parts = []
    for part in label.split(", "):
        if "\u2192" in part:
            name_old, new = part.rsplit("\u2192", 1)
            name = name_old.rsplit(" ", 1)[0]
            parts.append(f"{name} {new}")
        else:
            parts.append(part)
    return ", ".join(parts)
