"""Live plots (pyqtgraph): loss, gradient norm, lr, GPU memory, throughput.

Every plot shares one x axis, chosen in the toolbar: optimizer step, samples seen, tokens
seen or wall time (app/model/x_axis.py; the other runs overlaid on the loss follow it too).
The lr plot also shows the engine's planned lr ahead of the run, dashed (plan.py).
Under GPU memory, memory by kind (mem_stack.py); on every plot, rollbacks and the steps
they threw away (rollbacks.py); in every plot's right-click menu, "Fork from here..."
(point_menu.py: the panel's `fork_requested` says the step).

Each curve is drawn from the metrics buffer's numpy columns through a min/max
pyramid (app/model/decimate.py): only the visible span, in about two points per pixel,
reaches pyqtgraph, which also has setDownsampling(auto=True, mode='peak') and
setClipToView(True) on. The window calls `refresh()` from its ~30 Hz timer; nothing
here is driven by a signal per step.

Ranges: while "following" (the default, and after "Fit all") the panel sets the axes
itself, in steps (x grows by a fifth at a time, y only when the data leaves it or
fills a small part of it), so the axes, whose text is the dearest thing to paint, are
redrawn now and then rather than on every frame; they are cached as pixmaps between.
Zooming or panning with the mouse stops following. Each y range holds every curve drawn on
its plot (ranges.py), on the plot's own scale: the loss, the gradient norm and the lr each
have a log scale of their own (log_scale.py).

Room: the loss keeps at least 40% of the window's height; the rows under it fold away on a
short canvas, and a plot with nothing to show is one line under the plots (fold.py). A theme
switch draws everything on a new canvas, built as the first (build.py, set_theme).
"""
from __future__ import annotations

import math
import time
from typing import Callable, Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtWidgets import QVBoxLayout, QWidget

from app.model.metrics import INLIER_EMA, MetricsBuffer
from app.model.runmodel import RunModel
from .build import IDLE_NOTE, build
from .fold import TPUT_EMPTY
from .hover import PlotHover
from .log_scale import LogScales
from .outliers_choice import OutliersChoice
from .parts import PlotCanvas, Series
from .point_menu import PointMenu
from .ranges import follow
from .readback import curve_data
from .scalars import ScalarsPlot
from .titles import set_titles
from .toolbar import PlotToolbar
from app.ui.theme import palette
from app.model.x_axis import BY_KEY, DEFAULT_AXIS, axis_or_default, columns, nearest

STARTING_NOTE = "Starting: loading torch and the task..."


class PlotPanel(QWidget):
    """All live plots of one run, plus overlays of other runs' loss."""

    log_scale_changed = Signal(bool)  # the loss plot's log scale
    log_scales_changed = Signal(str, bool)  # any plot's: its name ("loss", "norm", "lr") and the scale
    x_axis_changed = Signal(str)  # the x axis' key (app/model/x_axis.py), when the user or set_x_axis changes it
    fork_requested = Signal(int)  # "Fork from here..." on a plot: the step under the point
    smoothing_changed = Signal(float)  # the smoothing weight (app/model/smoothing.py), when it changes

    def __init__(self, theme: str = "light", parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.pal = palette(theme)
        self.theme = theme
        self.model: Optional[RunModel] = None
        self.live = False  # a run is going (the empty plot says it is starting, not how to start one)
        self.follow = True
        self._version = -1
        self._range_key: tuple = ()
        self._epoch_count = -1
        self._updating = False
        self._turn = 0
        self.stale = False  # some small plot waits for its turn: the next refresh must run
        self.refresh_cost = 0.0
        self._syncing_x = False
        self._tput_unit = ""
        self.log_scales = LogScales(self)  # which plots have a log y axis (the choice outlives a canvas)
        self.log_scales.changed.connect(self._log_changed)
        self.axis = DEFAULT_AXIS
        self.on_updated: list[Callable[[], None]] = []
        self.point_menu = PointMenu(self.x_to_step, self)
        self.point_menu.fork_requested.connect(self.fork_requested)

        self.toolbar = PlotToolbar()
        tb = self.toolbar
        self.log_box, self.fit_button, self.hint, self.x_axis_box = tb.log_box, tb.fit_button, tb.hint, tb.x_axis_box
        self.log_box.toggled.connect(self.set_log_scale)
        self.log_box.setToolTip("Show the loss on a logarithmic y axis (the gradient norm and the lr: "
                                "\"Log scale\" in their right-click menu)")
        self.outliers_box = tb.outliers_box
        self.outliers = OutliersChoice(self.outliers_box, self._outliers_toggled)
        self.fit_button.clicked.connect(self.fit)
        self.x_axis_box.currentIndexChanged.connect(lambda _i: self.set_x_axis(self.x_axis_box.currentData()))
        self.smoothing = tb.smoothing.weight()
        tb.smoothing.changed.connect(self.set_smoothing)
        self.canvas: Optional[PlotCanvas] = None  # made by build(), under the toolbar
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.toolbar)
        self.scalars = ScalarsPlot(self.pal)  # what a framework logged: hidden until the run has any
        lay.addWidget(self.scalars)
        self.hover = PlotHover(self)  # hover values (its lines go on the plots in build())
        self._build()

    # -- construction --------------------------------------------------------------------
    def _build(self) -> None:
        build(self)

    def resizeEvent(self, ev) -> None:  # noqa: N802 - Qt name
        super().resizeEvent(ev)
        self._fit_room()

    def _fit_room(self) -> None:
        """Lay the plots out for the canvas' height now and what has nothing to show (fold.py)."""
        assert self.canvas is not None
        self.fold.update(self.canvas.height() if self.isVisible() else 0, self.window().height(),
                         {"mem": self.memory.empty_line(), "stack": self.stack.empty_line(),
                          "tput": "" if self.series[6].x_last is not None else TPUT_EMPTY}, self.canvas.width())

    def _set_titles(self) -> None:
        set_titles(self.plot_set, self.pal, self.model, self.planned, self._overlays, self.rollbacks)

    # -- notes in the plot area ------------------------------------------------------------
    def _place_notes(self) -> None:
        if self.loss_note.isVisible():
            self.loss_note.setPos(self.loss_plot.getViewBox().viewRect().center())

    def _show_loss_note(self, text: str) -> None:
        if text == self.loss_note.toPlainText() and self.loss_note.isVisible() == bool(text):
            return
        self.loss_note.setText(text)
        self.loss_note.setVisible(bool(text))
        self._place_notes()

    # -- data ----------------------------------------------------------------------------
    def set_model(self, model: Optional[RunModel]) -> None:
        if model is not self.model:
            self.rollbacks.set_fork(None)  # the new run says whether it is a fork (RunTreeViews)
        self.model = model
        if model is not None:
            model.metrics.set_smoothing(self.smoothing)
        self._version = -1
        self._reset_marks()
        self.follow = True
        self.refresh(force=True)

    def _reset_marks(self) -> None:
        """Draw every curve and mark again at the next refresh (a new model, axis or offsets)."""
        self.marks.reset()
        self.rollbacks.reset()
        self.planned.reset()
        self._epoch_count = -1
        self.stack.key = ()
        for s in self.series + self.mem_series + self.stack.device + self._overlays.series():
            s.key = ()

    def axis_offsets_changed(self) -> None:
        """A run's x offsets were set (a fork: app/model/x_axis.py XColumns.set_offsets): redraw all."""
        self._reset_marks()
        self.follow = True
        self.refresh(force=True, refit=True)

    def set_live(self, live: bool) -> None:
        if live != self.live:
            self.live = live
            self.refresh(force=True)

    # -- the x axis ----------------------------------------------------------------------
    def set_x_axis(self, key: str) -> None:
        """Plot every curve against this axis (a key of app/model/x_axis.py; unknown: steps)."""
        key = axis_or_default(key)
        if self.x_axis_box.currentData() != key:
            self.x_axis_box.setCurrentIndex(self.x_axis_box.findData(key))  # comes back here
            return
        if key == self.axis:
            return
        self.axis = key
        self._show_x_labels()
        self._set_downsampling()
        self._reset_marks()
        self.follow = True
        self.refresh(force=True, refit=True)
        self.x_axis_changed.emit(key)

    def _set_downsampling(self) -> None:
        """pyqtgraph's own auto downsampling assumes evenly spaced x (steps): on the other axes it
        would drop points where they are dense, so there only the min/max pyramid thins them
        (it already hands over at most ~2 points per pixel of the visible span)."""
        even = self.axis == "step"
        for s in self.series + self.mem_series + self.stack.device + self._overlays.series():
            s.item.setDownsampling(auto=even, method="peak")

    def _show_x_labels(self) -> None:
        label = BY_KEY[self.axis].label
        for p in self.plots:
            p.getAxis("bottom").set_key(self.axis)
        self.loss_plot.setLabel("bottom", label)  # once: the plots under it count the same (fold.py)

    def steps_to_x(self, steps: np.ndarray) -> np.ndarray:
        """Step positions (12.5: between steps 12 and 13) on the current x axis."""
        if self.model is None:
            return np.asarray(steps, dtype=np.float64)
        return columns(self.model.metrics).at_steps(self.axis, steps)

    def x_to_step(self, x: float) -> Optional[int]:
        """The step drawn nearest x on the current axis (None: no steps)."""
        if self.model is None or not len(self.model.metrics) or not math.isfinite(x):
            return None
        buf = self.model.metrics
        return int(buf.view("step")[nearest(columns(buf).values(self.axis), x)])

    def zoom_to_step(self, step: int) -> None:
        """Show the steps around `step` (an alert clicked), whatever the x axis."""
        n = len(self.model.metrics) if self.model is not None else 0
        half = max(10, n // 50)
        x0, x1 = self.steps_to_x(np.array([step - half, step + half], dtype=np.float64))
        if x1 <= x0:
            x1 = x0 + 1.0
        self.loss_plot.setXRange(float(x0), float(x1))

    def set_smoothing(self, weight: float) -> None:
        """The weight of every smoothed curve, this run's and the compared runs' (app/model/smoothing.py)."""
        if self.toolbar.smoothing.weight() != weight:
            self.toolbar.smoothing.set_weight(weight)  # comes back here
            return
        self.smoothing = weight
        if self.model is not None:
            self.model.metrics.set_smoothing(weight)
        self._overlays.set_smoothing(weight)
        self.refresh(force=True)
        self.smoothing_changed.emit(weight)

    def set_log_scale(self, on: bool) -> None:
        """The loss plot's log scale (the toolbar's box, the View menu's action)."""
        self.set_log("loss", on)

    def set_log(self, plot: str, on: bool) -> None:
        """A log y axis on one plot: "loss", "norm" or "lr" (log_scale.py)."""
        self.log_scales.set(plot, on)

    def _log_changed(self, plot: str, on: bool) -> None:
        """A plot's scale changed (here, in its menu or pyqtgraph's): its y range again, in the new
        scale; the x range (a zoom) stays."""
        if plot == "loss" and self.log_box.isChecked() != on:
            self.log_box.setChecked(on)
        if self.follow:
            self.refresh(force=True, refit=True)
        else:
            follow(self.plot_set, self._y_series, [], memory_shown=self.memory.shown, refit=True,
                   robust=self.ignore_outliers, only=getattr(self.plot_set, plot))
        if plot == "loss":
            self.log_scale_changed.emit(on)
        self.log_scales_changed.emit(plot, on)

    @property
    def ignore_outliers(self) -> bool:
        return self.outliers.on

    def set_ignore_outliers(self, on: bool) -> None:
        self.outliers.choose(on)

    def _outliers_toggled(self) -> None:
        if not self._updating:
            self.outliers.chosen = True
        self.follow = True
        self.refresh(force=True, refit=True)

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
                if p.getViewBox() is vb or (p is self.mem_plot and not self.memory.shown):
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
        self.scalars.set_run(model.info.get("run_dir") if isinstance(model.info.get("run_dir"), str) else None)
        self.scalars.refresh(self.steps_to_x, self.axis, force=force)
        buf = model.metrics
        x0, x1, width = self._visible()
        range_key = (x0, x1, width, self.follow)
        if not force and not self.stale and buf.version == self._version and range_key == self._range_key \
                and len(model.epochs) == self._epoch_count and not self.marks.stale(model) \
                and not self.planned.stale(model) and not self.rollbacks.stale(model):
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
            axis = self.axis
            if self.follow:
                self.outliers.follow_run(model)
            # "Ignore outliers" also draws the EMA without them: a spike folded into it keeps it
            # off the plot for hundreds of steps (app/model/inlier_ema.py).
            self.series[1].show_column(INLIER_EMA if self.ignore_outliers else "loss_ema")
            for s in self.series:
                if all_plots or s in self._every_frame or s in self._turns[self._turn]:
                    s.update(buf, x0, x1, width, axis)
            self._overlays.update(x0, x1, width, axis, inliers=self.ignore_outliers)
            if all_plots or self._turn == 1:
                self.memory.update(model, buf, x0, x1, width, axis)
                self.stack.update(model, buf, x0, x1, width, axis)
                self._fit_room()  # a plot with nothing to show gives its room to the others
            self._update_epochs(model)
            legend_had = (self.planned.plan is not None, len(self.planned.changes))
            if all_plots or self._turn == 0 or self.planned.stale(model):  # with the lr plot's turn
                self.planned.update(model, axis)
            marks_changed = self.marks.update(model, self.memory.shown)
            marks_changed = self.rollbacks.update(model, self.memory.shown) or marks_changed
            if marks_changed or legend_had != (self.planned.plan is not None, len(self.planned.changes)):
                self._set_titles()
            unit = "tokens/s" if buf.counts_tokens() else "samples/s"
            if unit != self._tput_unit:
                self._tput_unit = unit
                self.tput_plot.setLabel("left", unit)
            if self.follow:  # each y range holds every curve on its plot (ranges.py: the runs compared too)
                follow(self.plot_set, self._y_series, self.series[:1] + self._overlays.series("loss"),
                       memory_shown=self.memory.shown, refit=refit or force, robust=self.ignore_outliers,
                       live=self.live)
            self.scalars.match_x(*self.loss_plot.getViewBox().viewRange()[0])
            if len(buf) > 0 or self._overlays.entries:
                self._show_loss_note("")
            else:
                self._show_loss_note(STARTING_NOTE if self.live else IDLE_NOTE)
        finally:
            self._updating = False
            self.refresh_cost = 0.8 * self.refresh_cost + 0.2 * (time.perf_counter() - t_start)
        for fn in self.on_updated:
            fn()
        return True

    def frame_cost(self) -> float:
        """Seconds one update of the plots costs the GUI thread (refresh + paint), moving average."""
        return self.refresh_cost + self.canvas.paint_cost

    def _update_epochs(self, model: RunModel) -> None:
        if len(model.epochs) == self._epoch_count:
            return
        self._epoch_count = len(model.epochs)
        pts = [(step, val) for _e, step, _t, val in model.epochs if val is not None and math.isfinite(val)]
        if pts:
            xs, ys = zip(*pts)
            self.val_item.setData(self.steps_to_x(np.array(xs, float)), np.array(ys, float))
        else:
            self.val_item.setData([], [])

    # -- runs compared ----------------------------------------------------------------------
    @property
    def overlays(self) -> dict[str, tuple[MetricsBuffer, pg.PlotDataItem, Series]]:
        return self._overlays.entries

    def add_overlay(self, name: str, buf: MetricsBuffer, run_dir: str = "",
                    val: Optional[tuple[np.ndarray, np.ndarray]] = None) -> None:
        """Another run over this one (Compare: app/ui/plots/overlays.py; val: its validation
        (steps, values)); with its folder, its scalars too."""
        buf.set_smoothing(self.smoothing)
        self._overlays.add(name, buf, val)
        if run_dir:
            self.scalars.add_compared(name, run_dir, buf, self._overlays.runs[name].color)
        self.toolbar.show_clear_compare(True)
        self._set_downsampling()
        self._set_titles()
        self.follow = True
        self.refresh(force=True, refit=True)

    def remove_overlay(self, name: str, refresh: bool = True) -> None:
        self.scalars.remove_compared(name)
        if self._overlays.remove(name):
            self.toolbar.show_clear_compare(bool(self._overlays.entries))
            self._set_titles()
            if refresh:
                self.refresh(force=True, refit=True)

    def clear_overlays(self) -> None:
        for name in list(self.overlays):
            self.remove_overlay(name)

    # -- reading back --------------------------------------------------------------------
    def curve_data(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """What a curve currently shows (x, y), for tests and export (names: readback.py)."""
        return curve_data(self, name)

    def gpu_mode(self) -> Optional[str]:
        return self.memory.mode

    def set_theme(self, theme: str) -> None:
        """Draw the plots in the other palette: on a new canvas, built as the first one was (build.py).

        Not canvas.clear() and a rebuild on the same canvas: pyqtgraph's clear() raised on a plot
        folded out of the grid and left the plot area blank. Nor a restyle in place: every part
        (curves, markers, fills, labels, the runs compared, the hover lines) would have to re-pen
        each item it made, and one that forgot would keep the old theme's colours. A new canvas
        draws every part in the new palette by construction. What it shows comes back from what
        outlives a canvas (the model, x axis, log scales, smoothing and toolbar are the panel's)
        and from the three things a canvas holds that no model says: the runs compared, the
        fork point and the zoom."""
        compared, fork = self._overlays.buffers(), self.rollbacks.fork
        zoom = None if self.follow else [p.getViewBox().viewRange() for p in self.plot_set.all]
        self.theme, self.pal = theme, palette(theme)
        self.scalars.set_palette(self.pal)
        self._tput_unit = ""
        self._build()
        self.rollbacks.fork = fork
        for args in compared:
            self._overlays.add(*args)
        self._set_downsampling()
        self._set_titles()
        self.set_model(self.model)
        if zoom is not None:
            self._updating = True
            try:
                for p, (xr, yr) in zip(self.plot_set.all, zoom):
                    p.setRange(xRange=xr, yRange=yr, padding=0)
            finally:
                self._updating = False
            self.follow = False
            self.refresh(force=True)
