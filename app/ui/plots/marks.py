"""Vertical markers of what happened to the run: a labelled dashed one on every plot where
settings changed, a dotted one on the loss and norm plots at each non-finite step ("NaN",
"inf", or "non-finite grad" where the loss itself was finite). Their places are steps, drawn
on the chosen x axis (app/model/x_axis.py); markers of a kind that crowd merge ("NaN \u00d712")
and labels never overlap (markers.py)."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from app.model.metrics import MetricsBuffer
from app.model.runmodel import RunModel
from app.ui.theme import Palette

from .markers import Marked, MarkerSet, MarkerStyle, layout_for
from .parts import PlotSet

# The order labels are placed in (lower first): rare and telling before many and alike.
RANK_FORK, RANK_CONTINUED, RANK_ROLLBACK, RANK_SETTINGS, RANK_NONFINITE = range(5)


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


def every_plot(memory_shown: Callable[[], bool]) -> Callable[[PlotSet], list[pg.PlotItem]]:
    """The plots a run-wide marker goes on: all of them, GPU memory only while it is shown."""
    return lambda ps: [p for p in ps.all if p is not ps.mem or memory_shown()]


def nonfinite_word(loss: float, grad_norm: float) -> str:
    """What a non-finite step's marker says: the loss if it is what went wrong, else the gradient."""
    for v, what in ((loss, ""), (grad_norm, " grad")):
        if math.isnan(v):
            return "NaN" + what
        if math.isinf(v):
            return "inf" + what
    return "non-finite"


class PlotMarks:
    def __init__(self, plots: PlotSet, pal: Palette) -> None:
        self.plots = plots
        self.pal = pal
        self.memory_shown = False
        fill = pal.background + "d8"
        layout = layout_for(plots)
        self.settings = layout.add(MarkerSet(MarkerStyle(
            "settings", pg.mkPen(pal.marker, width=1.5, style=Qt.PenStyle.DashLine), pal.marker, fill, z=20,
            plots=every_plot(lambda: self.memory_shown), labelled=lambda ps, p: True, prefer="top", many="changes",
            rank=RANK_SETTINGS)))
        self.nonfinite = layout.add(MarkerSet(MarkerStyle(
            "nonfinite", pg.mkPen(pal.nonfinite, width=1.5, style=Qt.PenStyle.DotLine), pal.nonfinite, fill, z=15,
            plots=lambda ps: [ps.loss, ps.norm], labelled=lambda ps, p: p is ps.loss, prefer="bottom",
            many="non-finite", rank=RANK_NONFINITE)))
        self._marker_count = -1
        self._nonfinite_count = -1
        self._placed_to = -1.0  # the last step the lines' places were worked out with
        self.to_x: Callable[[np.ndarray], np.ndarray] = lambda steps: np.asarray(steps, dtype=np.float64)

    @property
    def marker_lines(self) -> list[tuple[pg.PlotItem, pg.InfiniteLine]]:
        return self.settings.lines()

    @property
    def nonfinite_lines(self) -> list[tuple[pg.PlotItem, pg.InfiniteLine]]:
        return self.nonfinite.lines()

    def reset(self) -> None:
        """A new model or x axis: draw everything again at the next update."""
        self._marker_count = self._nonfinite_count = -1
        self._placed_to = -1.0

    def stale(self, model: RunModel) -> bool:
        return (len(model.markers) != self._marker_count
                or len(model.metrics.nonfinite_steps) != self._nonfinite_count)

    def update(self, model: RunModel, memory_shown: bool) -> bool:
        """Redraw what changed. True if anything did (the titles' legends follow)."""
        if memory_shown != self.memory_shown:
            self.memory_shown = memory_shown
            self.settings.set_marked(self.settings.marked)  # on the memory plot too, or no longer
        a = self._update_markers(model)
        b = self._update_nonfinite(model.metrics)
        if not (a or b) and float(model.metrics.last_step()) != self._placed_to:
            # A marker after the last step known when it was drawn lies between that step and
            # the next: now the next is here, on a non-step axis its place moves.
            if any(m.step > self._placed_to - 1 for m in model.markers[-8:]):
                self._marker_count = -1
                self._update_markers(model)
        self._placed_to = float(model.metrics.last_step())
        return a or b

    def _update_markers(self, model: RunModel) -> bool:
        if len(model.markers) == self._marker_count:
            return False
        self._marker_count = len(model.markers)
        steps = np.array([m.step for m in model.markers], dtype=np.float64)
        labels = [m.label for m in model.markers]
        self.settings.set_marked(Marked(self.to_x(steps), steps, labels, [short_label(t) for t in labels],
                                        ["changes"] * len(labels)))
        return True

    def _update_nonfinite(self, buf: MetricsBuffer) -> bool:
        steps = np.asarray(buf.nonfinite_steps, dtype=np.float64)
        if len(steps) == self._nonfinite_count:
            return False
        self._nonfinite_count = len(steps)
        rows = np.searchsorted(buf.view("step"), steps) if len(buf) else np.zeros(0, dtype=int)
        rows = np.minimum(rows, max(0, len(buf) - 1))
        loss = buf.view("loss")[rows] if len(buf) else steps * np.nan
        norm = buf.view("grad_norm")[rows] if len(buf) else steps * np.nan
        words = [nonfinite_word(float(v), float(g)) for v, g in zip(loss, norm)]
        self.nonfinite.set_marked(Marked(self.to_x(steps), steps, words, words, words))
        return True
