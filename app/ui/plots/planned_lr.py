"""The planned learning rate ahead of the run, dashed on the lr plot, from the engine's
`lr_planned` events (the schedule over samples seen, sent at the start and again whenever
the peak changes), with a triangle where the peak was changed.

The engine gives the curve in samples seen. On the samples axis it is drawn as it is; on the
step, tokens and wall-time axes its part ahead of the run is placed at the run's current rate
(x per sample over its last steps, app/model/x_axis.py), so it moves when accumulation or speed
changes. Before the first step only the samples axis can show it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from app.model.runmodel import RunModel
from app.model.x_axis import columns
from app.ui.theme import Palette


@dataclass(frozen=True)
class PlannedCurve:
    samples: np.ndarray  # the curve's x: samples seen
    lr: np.ndarray
    samples_now: float  # where the run was when this curve was made
    peak: float
    schedule: str


def curve_of(data: dict) -> Optional[PlannedCurve]:
    """An lr_planned note's data as a PlannedCurve (None if it carries no usable curve)."""
    try:
        pts = np.asarray(data.get("curve") or (), dtype=np.float64).reshape(-1, 2)
    except (TypeError, ValueError):
        return None
    pts = pts[np.isfinite(pts).all(axis=1)]
    if not len(pts):
        return None
    order = np.argsort(pts[:, 0], kind="stable")
    return PlannedCurve(pts[order, 0], pts[order, 1], float(data.get("samples_now") or 0.0),
                float(data.get("peak") or 0.0), str(data.get("schedule") or ""))


class PlannedLr:
    def __init__(self, lr_plot: pg.PlotItem, pal: Palette) -> None:
        self.plot = lr_plot
        pen = pg.mkPen(pal.planned, width=2, style=Qt.PenStyle.CustomDashLine)
        pen.setDashPattern([3, 3])
        self.item = lr_plot.plot(pen=pen)
        self.item.setZValue(-1)  # under the trained lr where they meet
        self.peaks = lr_plot.plot(pen=None, symbol="t1", symbolSize=11, symbolBrush=pal.marker, symbolPen=pal.marker)
        self.peaks.setZValue(25)
        self.reset()

    def reset(self) -> None:
        """A new model: read its notes from the start."""
        self.curve: Optional[PlannedCurve] = None
        self.changes: list[tuple[float, float]] = []  # (samples seen, new lr) where the peak changed
        self._notes = 0
        self._key: tuple = ()
        self.y_shown = np.empty(0)
        self.item.setData([], [])
        self.peaks.setData([], [])

    def stale(self, model: RunModel) -> bool:
        return len(model.notes) != self._notes

    def _read(self, model: RunModel) -> bool:
        notes = model.notes
        if len(notes) < self._notes:
            self.reset()
        changed = False
        for note in notes[self._notes:]:
            if note.kind != "lr_planned":
                continue
            curve = curve_of(note.data)
            if curve is None:
                continue
            if self.curve is not None and curve.peak != self.curve.peak:
                self.changes.append((curve.samples_now, float(np.interp(curve.samples_now, curve.samples, curve.lr))))
            self.curve = curve
            changed = True
        self._notes = len(notes)
        return changed

    def update(self, model: RunModel, axis: str) -> None:
        """Draw the latest curve from the last trained sample on, and the peak changes."""
        self._read(model)
        buf = model.metrics
        key = (id(buf), buf.version, axis, id(self.curve), len(self.changes))
        if key == self._key:
            return
        self._key = key
        curve = self.curve
        if curve is None:
            self.item.setData([], [])
            self.peaks.setData([], [])
            self.y_shown = np.empty(0)
            return
        cols = columns(buf)
        seen = cols.values("samples")
        start = max(float(seen[-1]) if len(seen) else 0.0, curve.samples_now)
        ahead = curve.samples > start
        xs = np.concatenate(([start], curve.samples[ahead]))
        ys = np.concatenate(([np.interp(start, curve.samples, curve.lr)], curve.lr[ahead]))
        x = cols.samples_to_x(axis, xs)
        if x is None or not ahead.any():
            self.item.setData([], [])
            self.y_shown = np.empty(0)
        else:
            self.item.setData(x, ys)
            self.y_shown = ys
        if self.changes:
            px = cols.samples_to_x(axis, np.array([s for s, _ in self.changes]))
            if px is not None:
                self.peaks.setData(px, np.array([lr for _, lr in self.changes]))
                return
        self.peaks.setData([], [])

    def data(self) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.item.getData()
        return (np.asarray(x if x is not None else []), np.asarray(y if y is not None else []))
