"""Vertical lines on the plots: a labelled dashed one on every plot where settings changed,
a dotted one on the loss and norm plots at each non-finite step. Their places are steps,
drawn on the chosen x axis (app/model/x_axis.py)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from app.model.metrics import MetricsBuffer
from app.model.runmodel import RunModel
from .parts import PlotSet
from app.ui.theme import Palette

MAX_LINE_MARKERS = 200  # non-finite steps drawn as lines; beyond that the alerts panel counts them


def short_label(label: str) -> str:
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


class PlotMarks:
    def __init__(self, plots: PlotSet, pal: Palette) -> None:
        self.plots = plots
        self.pal = pal
        self.marker_lines: list[tuple[pg.PlotItem, pg.InfiniteLine]] = []
        self.nonfinite_lines: list[tuple[pg.PlotItem, pg.InfiniteLine]] = []
        self._marker_count = -1
        self._nonfinite_count = -1
        self._placed_to = -1.0  # the last step the lines' places were worked out with
        self.to_x: Callable[[np.ndarray], np.ndarray] = lambda steps: np.asarray(steps, dtype=np.float64)

    def reset(self) -> None:
        """A new model or x axis: draw everything again at the next update."""
        self._marker_count = self._nonfinite_count = -1
        self._placed_to = -1.0

    def stale(self, model: RunModel) -> bool:
        return (len(model.markers) != self._marker_count
                or len(model.metrics.nonfinite_steps) != self._nonfinite_count)

    def update(self, model: RunModel, memory_shown: bool) -> bool:
        """Redraw what changed. True if anything did (the titles' legends follow)."""
        a = self._update_markers(model, memory_shown)
        b = self._update_nonfinite(model.metrics)
        if not (a or b):
            self._replace_last(model)
        self._placed_to = float(model.metrics.last_step())
        return a or b

    def _replace_last(self, model: RunModel) -> None:
        """A marker after the last step known when it was drawn lies between that step and the
        next: now the next is here, on a non-step axis its place moves."""
        last = self._placed_to
        if not self.marker_lines or float(model.metrics.last_step()) == last:
            return
        steps = np.array([m.step for m in model.markers], dtype=np.float64)
        late = np.nonzero(steps > last - 1)[0]
        if not len(late):
            return
        xs = self.to_x(steps[late])
        per_marker = len(self.marker_lines) // max(1, len(model.markers))
        for i, x in zip(late, xs):
            for _plot, line in self.marker_lines[i * per_marker:(i + 1) * per_marker]:
                line.setValue(float(x))

    def _update_markers(self, model: RunModel, memory_shown: bool) -> bool:
        if len(model.markers) == self._marker_count:
            return False
        self._marker_count = len(model.markers)
        self._clear(self.marker_lines)
        pen = pg.mkPen(self.pal.marker, width=1.5, style=Qt.PenStyle.DashLine)
        xs = self.to_x(np.array([m.step for m in model.markers], dtype=np.float64))
        for i, (m, x) in enumerate(zip(model.markers, xs)):
            position = 0.93 - 0.14 * (i % 3)  # staggered, so markers close together keep readable labels
            for p in self.plots.all:
                if p is self.plots.mem and not memory_shown:
                    continue
                label = m.label if p is self.plots.loss else short_label(m.label)
                line = pg.InfiniteLine(pos=float(x), angle=90, pen=pen, label=label,
                                       labelOpts={"position": position, "color": self.pal.marker,
                                                  # right of the line, or left of it near the right
                                                  # edge (pyqtgraph turns it toward the view's middle)
                                                  "anchors": [(0, 0.5), (1, 0.5)],
                                                  "fill": pg.mkBrush(self.pal.background + "d8")})
                line.setZValue(20)
                p.addItem(line, ignoreBounds=True)
                self.marker_lines.append((p, line))
        return True

    def _update_nonfinite(self, buf: MetricsBuffer) -> bool:
        steps = buf.nonfinite_steps
        if len(steps) == self._nonfinite_count:
            return False
        self._nonfinite_count = len(steps)
        self._clear(self.nonfinite_lines)
        pen = pg.mkPen(self.pal.nonfinite, width=1.5, style=Qt.PenStyle.DotLine)
        shown = steps[-MAX_LINE_MARKERS:]
        xs = self.to_x(np.array(shown, dtype=np.float64))
        for i, s in enumerate(xs):
            for p in (self.plots.loss, self.plots.norm):
                label = "NaN/Inf" if (p is self.plots.loss and i == len(shown) - 1) else None
                line = pg.InfiniteLine(pos=float(s), angle=90, pen=pen, label=label,
                                       labelOpts={"position": 0.08, "color": self.pal.nonfinite,
                                                  "anchors": [(0, 0.5), (1, 0.5)]})
                line.setZValue(15)
                p.addItem(line, ignoreBounds=True)
                self.nonfinite_lines.append((p, line))
        return True

    @staticmethod
    def _clear(lines: list[tuple[pg.PlotItem, pg.InfiniteLine]]) -> None:
        for plot, line in lines:
            plot.removeItem(line)
        lines.clear()
