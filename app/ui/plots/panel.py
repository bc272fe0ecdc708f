"""Live plots (pyqtgraph): loss, gradient norm, lr, GPU memory, throughput.

Every plot shares one x axis, chosen in the toolbar: optimizer step, samples seen, tokens
seen or wall time (app/model/x_axis.py; the other runs overlaid on the loss follow it too).
The lr plot also shows the engine's planned lr ahead of the run, dashed (planned_lr.py).
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
short canvas, and a plot with nothing to show is one line under the plots (fold.py).

The canvas and everything drawn on it come from build.py as one record, kept as `parts`; the
panel connects them to its own slots. A theme switch draws everything on a new canvas, built as
the first (set_theme).
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
from app.model.x_axis import BY_KEY, DEFAULT_AXIS, axis_or_default, columns, nearest
from app.ui.theme import palette

from .build import IDLE_NOTE, CanvasParts, build_canvas
from .fold import TPUT_EMPTY
from .hover import PlotHover
from .log_scale import LogScales
from .outliers_choice import OutliersChoice
from .parts import PlotCanvas, Series
from .point_menu import PointMenu
from .ranges import follow
from .readback import curve_data
from .rollbacks import RollbackMarks
from .scalars import ScalarsPlot
from .titles import set_titles
from .toolbar import PlotToolbar

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
        self.outliers_box = tb.outliers_box
        self.outliers = OutliersChoice(self.outliers_box, self._outliers_toggled)
        self.fit_button.clicked.connect(self.fit)
        self.x_axis_box.currentIndexChanged.connect(lambda _i: self.set_x_axis(self.x_axis_box.currentData()))
        self.smoothing = tb.smoothing.weight()
        tb.smoothing.changed.connect(self.set_smoothing)
        lay = self._layout = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.toolbar)
        self.scalars = ScalarsPlot(self.pal)  # what a framework logged: hidden until the run has any
        lay.addWidget(self.scalars)
        self.hover = PlotHover(self, self)  # hover values (its lines go on the plots in _show_parts())
        self.parts = self._new_parts()  # the canvas and all drawn on it (build.py), under the toolbar
        lay.insertWidget(1, self.canvas, 1)
        self._show_parts()

    # -- construction --------------------------------------------------------------------
    @property
    def canvas(self) -> PlotCanvas:
        return self.parts.canvas

    @property
    def rollbacks(self) -> RollbackMarks:  # (whether the run shown is a fork: app/ui/runs/tree_views.py)
        return self.parts.rollbacks

    def _new_parts(self, old: Optional[CanvasParts] = None) -> CanvasParts:
        return build_canvas(self.pal, self.point_menu, self.hint, self.steps_to_x, old)

    def _show_parts(self) -> None:
        """Connect a canvas just built to the panel and draw it as the panel stands (not a run's data yet)."""
        ps = self.parts.plot_set
        self.canvas.resized.connect(self._fit_room)
        for p in ps.all:
            # Not setXLink: pyqtgraph links plots of different widths by screen position, so the
            # half-width plots would show half the steps. Same step range on every plot instead.
            p.getViewBox().sigXRangeChanged.connect(self._sync_x)
            p.getViewBox().sigRangeChangedManually.connect(self._user_moved)
        self._set_downsampling()
        self._set_titles()
        self.log_scales.attach(ps)
        self._fit_room()
        self._show_x_labels()
        self.parts.loss_note.show_text(IDLE_NOTE)
        self.hover.attach()

    def resizeEvent(self, ev) -> None:  # noqa: N802 - Qt name
        super().resizeEvent(ev)
        self._fit_room()

    def _fit_room(self) -> None:
        """Lay the plots out for the canvas' height now and what has nothing to show (fold.py)."""
        parts = self.parts
        parts.fold.update(self.canvas.height() if self.isVisible() else 0, self.window().height(),
                          {"mem": parts.memory.empty_line(), "stack": parts.stack.empty_line(),
                           "tput": "" if parts.series[6].x_last is not None else TPUT_EMPTY}, self.canvas.width())

    def _set_titles(self) -> None:
        parts = self.parts
        set_titles(parts.plot_set, self.pal, self.model, parts.planned, parts.overlays, parts.rollbacks)

    # -- data ----------------------------------------------------------------------------
    def set_model(self, model: Optional[RunModel]) -> None:
        if model is not self.model:
            self.parts.rollbacks.set_fork(None)  # the new run says whether it is a fork (RunTreeViews)
        self.model = model
        if model is not None:
            model.metrics.set_smoothing(self.smoothing)
        self._version = -1
        self._reset_marks()
        self.follow = True
        self.refresh(force=True)

    def _reset_marks(self) -> None:
        """Draw every curve and mark again at the next refresh (a new model, axis or offsets)."""
        self.parts.marks.reset()
        self.parts.rollbacks.reset()
        self.parts.planned.reset()
        self.parts.validation.reset()
        self.parts.stack.key = ()
        for s in self.parts.every_series():
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
        for s in self.parts.every_series():
            s.item.setDownsampling(auto=even, method="peak")

    def _show_x_labels(self) -> None:
        label = BY_KEY[self.axis].label
        for p in self.parts.plot_set.all:
            p.getAxis("bottom").set_key(self.axis)
        self.parts.plot_set.loss.setLabel("bottom", label)  # once: the plots under it count the same (fold.py)

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
        self.parts.plot_set.loss.setXRange(float(x0), float(x1))

    def set_smoothing(self, weight: float) -> None:
        """The weight of every smoothed curve, this run's and the compared runs' (app/model/smoothing.py)."""
        if self.toolbar.smoothing.weight() != weight:
            self.toolbar.smoothing.set_weight(weight)  # comes back here
            return
        self.smoothing = weight
        if self.model is not None:
            self.model.metrics.set_smoothing(weight)
        self.parts.overlays.set_smoothing(weight)
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
            follow(self.parts.plot_set, self.parts.y_series, [], memory_shown=self.parts.memory.shown, refit=True,
                   robust=self.ignore_outliers, only=getattr(self.parts.plot_set, plot))
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
            for p in self.parts.plot_set.all:
                if p.getViewBox() is vb or (p is self.parts.plot_set.mem and not self.parts.memory.shown):
                    continue
                p.setXRange(float(rng[0]), float(rng[1]), padding=0)
        finally:
            self._syncing_x = False
        if not self._updating and not self.follow:
            self.refresh()

    def _visible(self) -> tuple[Optional[float], Optional[float], int]:
        vb = self.parts.plot_set.loss.getViewBox()
        width = max(100, int(vb.width()) or 600)
        if self.follow:
            return None, None, width
        (x0, x1), _ = vb.viewRange()
        return float(x0), float(x1), width

    def refresh(self, force: bool = False, refit: bool = False) -> bool:
        """Bring the plots up to date with the model. Cheap when nothing changed."""
        model, parts = self.model, self.parts
        if model is None:
            return False
        self.scalars.set_run(model.info.get("run_dir") if isinstance(model.info.get("run_dir"), str) else None,
                             model.pushed_scalars)
        self.scalars.refresh(self.steps_to_x, self.axis, force=force)
        buf = model.metrics
        x0, x1, width = self._visible()
        range_key = (x0, x1, width, self.follow)
        if not force and not self.stale and buf.version == self._version and range_key == self._range_key \
                and not parts.validation.stale(model) and not parts.marks.stale(model) \
                and not parts.planned.stale(model) and not parts.rollbacks.stale(model):
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
            parts.series[1].show_column(INLIER_EMA if self.ignore_outliers else "loss_ema")
            for s in parts.series:
                if all_plots or s in parts.every_frame or s in parts.turns[self._turn]:
                    s.update(buf, x0, x1, width, axis)
            parts.overlays.update(x0, x1, width, axis, inliers=self.ignore_outliers)
            if all_plots or self._turn == 1:
                parts.memory.update(model, buf, x0, x1, width, axis)
                parts.stack.update(model, buf, x0, x1, width, axis)
                self._fit_room()  # a plot with nothing to show gives its room to the others
            parts.validation.update(model, self.steps_to_x)
            legend_had = (parts.planned.curve is not None, len(parts.planned.changes))
            if all_plots or self._turn == 0 or parts.planned.stale(model):  # with the lr plot's turn
                parts.planned.update(model, axis)
            marks_changed = parts.marks.update(model, parts.memory.shown)
            marks_changed = parts.rollbacks.update(model, parts.memory.shown) or marks_changed
            if marks_changed or legend_had != (parts.planned.curve is not None, len(parts.planned.changes)):
                self._set_titles()
            unit = "tokens/s" if buf.counts_tokens() else "samples/s"
            if unit != self._tput_unit:
                self._tput_unit = unit
                parts.plot_set.tput.setLabel("left", unit)
            if self.follow:  # each y range holds every curve on its plot (ranges.py: the runs compared too)
                follow(parts.plot_set, parts.y_series, parts.series[:1] + parts.overlays.series("loss"),
                       memory_shown=parts.memory.shown, refit=refit or force, robust=self.ignore_outliers,
                       live=self.live)
            self.scalars.match_x(*parts.plot_set.loss.getViewBox().viewRange()[0])
            if len(buf) > 0 or parts.overlays.entries:
                parts.loss_note.show_text("")
            else:
                parts.loss_note.show_text(STARTING_NOTE if self.live else IDLE_NOTE)
        finally:
            self._updating = False
            self.refresh_cost = 0.8 * self.refresh_cost + 0.2 * (time.perf_counter() - t_start)
        for fn in self.on_updated:
            fn()
        return True

    def frame_cost(self) -> float:
        """Seconds one update of the plots costs the GUI thread (refresh + paint), moving average."""
        return self.refresh_cost + self.canvas.paint_cost

    # -- runs compared ----------------------------------------------------------------------
    @property
    def overlays(self) -> dict[str, tuple[MetricsBuffer, pg.PlotDataItem, Series]]:
        return self.parts.overlays.entries

    def add_overlay(self, name: str, buf: MetricsBuffer, run_dir: str = "",
                    val: Optional[tuple[np.ndarray, np.ndarray]] = None) -> None:
        """Another run over this one (Compare: app/ui/plots/overlays.py; val: its validation
        (steps, values)); with its folder, its scalars too."""
        buf.set_smoothing(self.smoothing)
        self.parts.overlays.add(name, buf, val)
        if run_dir:
            self.scalars.add_compared(name, run_dir, buf, self.parts.overlays.runs[name].color)
        self.toolbar.show_clear_compare(True)
        self._set_downsampling()
        self._set_titles()
        self.follow = True
        self.refresh(force=True, refit=True)

    def remove_overlay(self, name: str, refresh: bool = True) -> None:
        self.scalars.remove_compared(name)
        if self.parts.overlays.remove(name):
            self.toolbar.show_clear_compare(bool(self.parts.overlays.entries))
            self._set_titles()
            if refresh:
                self.refresh(force=True, refit=True)

    def clear_overlays(self) -> None:
        for name in list(self.overlays):
            self.remove_overlay(name)

    # -- reading back --------------------------------------------------------------------
    def curve_data(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """What a curve currently shows (x, y), for tests and export (names: readback.py)."""
        return curve_data(self.parts, name)

    def gpu_mode(self) -> Optional[str]:
        return self.parts.memory.mode

    def set_theme(self, theme: str) -> None:
        """Draw the plots in the other palette: on a new canvas, built as the first one was (build.py
        says why). What it shows comes back from what outlives a canvas (the model, x axis, log
        scales, smoothing and toolbar are the panel's) and from the three things a canvas holds
        that no model says: the runs compared and the fork point (build_canvas carries them over)
        and the zoom (kept here)."""
        zoom = None if self.follow else [p.getViewBox().viewRange() for p in self.parts.plot_set.all]
        self.theme, self.pal = theme, palette(theme)
        self.scalars.set_palette(self.pal)
        self._tput_unit = ""
        old = self.parts
        self.parts = self._new_parts(old)
        self._layout.replaceWidget(old.canvas, self.canvas)
        old.canvas.hide()
        old.canvas.deleteLater()
        self._show_parts()
        self.set_model(self.model)
        if zoom is not None:
            self._updating = True
            try:
                for p, (xr, yr) in zip(self.parts.plot_set.all, zoom):
                    p.setRange(xRange=xr, yRange=yr, padding=0)
            finally:
                self._updating = False
            self.follow = False
            self.refresh(force=True)
