"""Where a run's history branches, on the plots: a labelled line on every plot where the run
went back to a checkpoint (each rolled_back event, like the settings markers), the steps it
threw away drawn greyed on the loss and gradient-norm plots (the model's `discarded` steps:
from the run folder's discarded_metrics when it is opened, or kept as they were replaced
during a live run), so nothing a run trained is hidden without a trace; and, for a fork,
a line at its fork point naming the run and checkpoint it came from."""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from app.model.runmodel import RunModel
from .parts import PlotSet
from app.ui.theme import Palette


class RollbackMarks:
    def __init__(self, plots: PlotSet, pal: Palette) -> None:
        self.plots, self.pal = plots, pal
        self.lines: list[tuple[pg.PlotItem, pg.InfiniteLine]] = []
        pen = pg.mkPen(pal.discarded, width=1.5)
        self.loss = plots.loss.plot(pen=pen)
        self.norm = plots.norm.plot(pen=pg.mkPen(pal.discarded, width=1))
        for item in (self.loss, self.norm):
            item.setZValue(-5)  # under the kept run's curves
        self.to_x: Callable[[np.ndarray], np.ndarray] = lambda steps: np.asarray(steps, dtype=np.float64)
        self.fork: Optional[tuple[int, str]] = None  # (the parent's step, where from) of a fork shown
        self.fork_lines: list[tuple[pg.PlotItem, pg.InfiniteLine]] = []
        # Each stretch thrown away, shaded grey where it was (its loss may be NaN: nothing to draw).
        self.bands: list[tuple[pg.PlotItem, pg.LinearRegionItem]] = []
        self._key: tuple = ()

    def set_fork(self, step: Optional[int], label: str = "") -> None:
        """The run shown is a fork of a checkpoint at `step` (None: it is not)."""
        self.fork = None if step is None else (int(step), label)
        self._key = ()

    def reset(self) -> None:
        self._key = ()

    def stale(self, model: RunModel) -> bool:
        return not self._key or self._key[:2] != (len(model.rollbacks), model.discarded.version)

    def legend(self, model: RunModel) -> tuple[bool, bool]:
        """(rollbacks shown, discarded steps shown), for the loss plot's legend."""
        return bool(model.rollbacks), len(model.discarded) > 0

    def update(self, model: RunModel, memory_shown: bool) -> bool:
        """Redraw what changed. True if the loss plot's legend changes."""
        state = (len(model.rollbacks), model.discarded.version, memory_shown, model.metrics.last_step(), self.fork)
        if state == self._key:
            return False
        before = self._key
        self._key = state
        if state[:3] != before[:3] or state[4:] != before[4:]:
            self._draw_lines(model, memory_shown)
        elif self.lines:  # new steps: on a non-step axis the places move with them
            xs = self.to_x(np.array([r.to_step + 0.5 for r in model.rollbacks], dtype=np.float64))
            per = len(self.lines) // max(1, len(model.rollbacks))
            for i, x in enumerate(xs):
                for _p, line in self.lines[i * per:(i + 1) * per]:
                    line.setValue(float(x))
        if len(model.discarded) or not before or before[1] != state[1]:
            self._draw_discarded(model)
        return not before or before[:2] != state[:2]

    def _draw_lines(self, model: RunModel, memory_shown: bool) -> None:
        for plot, line in self.lines + self.fork_lines:
            plot.removeItem(line)
        self.lines.clear()
        self.fork_lines.clear()
        if self.fork is not None:
            step, where = self.fork
            x = float(self.to_x(np.array([step + 0.5]))[0])
            for p in self.plots.all:
                if p is self.plots.mem and not memory_shown:
                    continue
                line = pg.InfiniteLine(pos=x, angle=90, pen=pg.mkPen(self.pal.foreground, width=1.5,
                                                                     style=Qt.PenStyle.DotLine),
                                       label=f"\u2387 fork of {where}" if p is self.plots.loss else None,
                                       labelOpts={"position": 0.08, "color": self.pal.foreground,
                                                  "anchors": [(0, 0.5), (0, 0.5)],
                                                  "fill": pg.mkBrush(self.pal.background + "d8")})
                line.setZValue(19)
                p.addItem(line, ignoreBounds=True)
                self.fork_lines.append((p, line))
        pen = pg.mkPen(self.pal.rollback, width=2, style=Qt.PenStyle.DashDotLine)
        xs = self.to_x(np.array([r.to_step + 0.5 for r in model.rollbacks], dtype=np.float64))
        for i, (r, x) in enumerate(zip(model.rollbacks, xs)):
            for p in self.plots.all:
                if p is self.plots.mem and not memory_shown:
                    continue
                label = (f"\u21b6 rolled back to {r.to_step} ({r.reason})" if p is self.plots.loss
                         else f"\u21b6 {r.to_step}")
                line = pg.InfiniteLine(pos=float(x), angle=90, pen=pen, label=label,
                                       labelOpts={"position": 0.55 + 0.12 * (i % 2), "color": self.pal.rollback,
                                                  "anchors": [(0, 0.5), (0, 0.5)],
                                                  "fill": pg.mkBrush(self.pal.background + "d8")})
                line.setZValue(21)
                p.addItem(line, ignoreBounds=True)
                self.lines.append((p, line))

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
