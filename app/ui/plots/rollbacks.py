"""Where a run's history branches, on the plots: a labelled line on every plot where the run
went back to a checkpoint (each rolled_back event, like the settings markers), the steps it
threw away drawn greyed on the loss and gradient-norm plots (the model's `discarded` steps:
from the run folder's discarded_metrics when it is opened, or kept as they were replaced
during a live run), so nothing a run trained is hidden without a trace; and, for a fork,
a line at its fork point naming the run and checkpoint it came from; and a line at each step
where the run was continued (a resume: its run_started after steps), as one run's history.
The lines are MarkerSets (markers.py): merged when they crowd, their labels never overlapping."""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from app.model.runmodel import RunModel
from app.ui.theme import Palette

from .markers import Marked, MarkerSet, MarkerStyle, layout_for
from .marks import RANK_CONTINUED, RANK_FORK, RANK_ROLLBACK, every_plot
from .parts import PlotSet

CONTINUED = "continued"


class RollbackMarks:
    def __init__(self, plots: PlotSet, pal: Palette) -> None:
        self.plots, self.pal = plots, pal
        pen = pg.mkPen(pal.discarded, width=1.5)
        self.loss = plots.loss.plot(pen=pen)
        self.norm = plots.norm.plot(pen=pg.mkPen(pal.discarded, width=1))
        for item in (self.loss, self.norm):
            item.setZValue(-5)  # under the kept run's curves
        self.to_x: Callable[[np.ndarray], np.ndarray] = lambda steps: np.asarray(steps, dtype=np.float64)
        self.fork: Optional[tuple[int, str]] = None  # (the parent's step, where from) of a fork shown
        self.memory_shown = False
        fill = pal.background + "d8"
        on_every_plot = every_plot(lambda: self.memory_shown)
        layout = layout_for(plots)
        self.rolled = layout.add(MarkerSet(MarkerStyle(
            "rollback", pg.mkPen(pal.rollback, width=2, style=Qt.PenStyle.DashDotLine), pal.rollback, fill, z=21,
            plots=on_every_plot, labelled=lambda ps, p: True, prefer="middle", many="\u21b6 rollbacks",
            rank=RANK_ROLLBACK)))
        self.forked = layout.add(MarkerSet(MarkerStyle(
            "fork", pg.mkPen(pal.foreground, width=1.5, style=Qt.PenStyle.DotLine), pal.foreground, fill, z=19,
            plots=on_every_plot, labelled=lambda ps, p: p is ps.loss, prefer="bottom", many="forks",
            rank=RANK_FORK)))
        self.continued = layout.add(MarkerSet(MarkerStyle(
            "continued", pg.mkPen(pal.foreground, width=1.5, style=Qt.PenStyle.DashDotDotLine), pal.foreground,
            fill, z=19, plots=on_every_plot, labelled=lambda ps, p: p is ps.loss, prefer="top", many=CONTINUED,
            rank=RANK_CONTINUED)))
        self._resumes: list[int] = []  # the steps a run was continued from (run_started after steps)
        self._scanned = 0  # the model's notes looked at for them
        # Each stretch thrown away, shaded grey where it was (its loss may be NaN: nothing to draw).
        self.bands: list[tuple[pg.PlotItem, pg.LinearRegionItem]] = []
        self._key: tuple = ()

    @property
    def lines(self) -> list[tuple[pg.PlotItem, pg.InfiniteLine]]:
        """The rollback lines drawn now, plot by plot."""
        return self.rolled.lines()

    @property
    def fork_lines(self) -> list[tuple[pg.PlotItem, pg.InfiniteLine]]:
        return self.forked.lines()

    @property
    def continued_lines(self) -> list[tuple[pg.PlotItem, pg.InfiniteLine]]:
        return self.continued.lines()

    def set_fork(self, step: Optional[int], label: str = "") -> None:
        """The run shown is a fork of a checkpoint at `step` (None: it is not)."""
        self.fork = None if step is None else (int(step), label)
        self._key = ()

    def reset(self) -> None:
        self._key = ()
        self._resumes, self._scanned = [], 0

    def _scan(self, model: RunModel) -> bool:
        """Look at the notes that came since the last look for a run continued (a run_started
        after steps: --resume, or Resume in the window; not a fork's start). True if one came."""
        notes = model.notes
        if len(notes) < self._scanned:
            self._resumes, self._scanned = [], 0
        before = len(self._resumes)
        for n in notes[self._scanned:]:
            if n.kind == "run_started" and n.step > 0 and n.data.get("resumed") and not n.data.get("forked_from"):
                self._resumes.append(int(n.step))
        self._scanned = len(notes)
        return len(self._resumes) != before

    def stale(self, model: RunModel) -> bool:
        return (not self._key or self._key[:2] != (len(model.rollbacks), model.discarded.version)
                or len(model.notes) != self._scanned)

    def legend(self, model: RunModel) -> tuple[bool, bool, bool]:
        """(rollbacks shown, discarded steps shown, continued shown), for the loss plot's legend."""
        self._scan(model)
        return bool(model.rollbacks), len(model.discarded) > 0, bool(self._resumes)

    def update(self, model: RunModel, memory_shown: bool) -> bool:
        """Redraw what changed. True if the loss plot's legend changes."""
        resumed = self._scan(model)
        state = (len(model.rollbacks), model.discarded.version, memory_shown, model.metrics.last_step(), self.fork,
                 len(self._resumes))
        if state == self._key:
            return False
        before = self._key
        self._key = state
        self.memory_shown = memory_shown
        if state[:3] != before[:3] or state[4:] != before[4:]:
            self._mark(model)
        elif any(r.to_step + 0.5 > before[3] - 1 for r in model.rollbacks) or any(
                s + 0.5 > before[3] - 1 for s in self._resumes):
            self._mark(model)  # new steps: on a non-step axis the places of the latest move with them
        if len(model.discarded) or not before or before[1] != state[1]:
            self._draw_discarded(model)
        return not before or before[:2] != state[:2] or resumed

    def _mark(self, model: RunModel) -> None:
        """The rollbacks, the fork point and the continued runs, on the axis shown."""
        if self.fork is not None:
            step, where = self.fork
            text = f"\u2387 fork of {where}"
            self.forked.set_marked(Marked(self.to_x(np.array([step + 0.5])), np.array([float(step)]), [text], [text],
                                          ["forks"]))
        else:
            self.forked.set_marked(Marked())
        rb = model.rollbacks
        steps = np.array([r.to_step for r in rb], dtype=np.float64)
        self.rolled.set_marked(Marked(self.to_x(steps + 0.5), steps,
                                      [f"\u21b6 rolled back to {r.to_step} ({r.reason})" for r in rb],
                                      [f"\u21b6 {r.to_step}" for r in rb], ["\u21b6 rollbacks"] * len(rb)))
        resumes = np.array(self._resumes, dtype=np.float64)
        self.continued.set_marked(Marked(self.to_x(resumes + 0.5), resumes, [f"\u21bb {CONTINUED}"] * len(resumes),
                                         [CONTINUED] * len(resumes), [CONTINUED] * len(resumes)))

    def _draw_bands(self, model: RunModel) -> None:
        for plot, band in self.bands:
            plot.removeItem(band)
        self.bands.clear()
        segs = model.discarded.segments
        if not segs:
            return
        edges = self.to_x(np.array([[s.first_step - 0.5, s.last_step + 0.5] for s in segs], dtype=np.float64).ravel())
        fill = pg.mkColor(self.pal.discarded)
        fill.setAlpha(60)
        for i, s in enumerate(segs):
            for p in (self.plots.loss, self.plots.norm):
                band = pg.LinearRegionItem(values=(float(edges[2 * i]), float(edges[2 * i + 1])), movable=False,
                                           brush=pg.mkBrush(fill), pen=pg.mkPen(None))
                band.setZValue(-10)
                band.setToolTip(f"steps {s.first_step}-{s.last_step} discarded: {s.reason}")
                p.addItem(band, ignoreBounds=True)
                self.bands.append((p, band))

    def _draw_discarded(self, model: RunModel) -> None:
        self._draw_bands(model)
        d = model.discarded
        for item, name in ((self.loss, "loss"), (self.norm, "grad_norm")):
            steps, y = d.joined(name)
            if not len(steps):
                item.setData([], [])
                continue
            x = np.full(len(steps), np.nan)
            ok = np.isfinite(steps)
            x[ok] = self.to_x(steps[ok])
            item.setData(x, y, connect="finite")

    def discarded_data(self, name: str = "loss") -> tuple[np.ndarray, np.ndarray]:
        item = self.loss if name == "loss" else self.norm
        x, y = item.getData()
        return np.asarray(x if x is not None else []), np.asarray(y if y is not None else [])
