"""Memory by kind, under the GPU memory plot: the bytes of the parameters, the gradients, the
optimizer state and (on CUDA) the activations of each step, stacked, from the metrics
columns mem_params, mem_grads, mem_optimizer and mem_activations. On a GPU the device's
total and what is used on it are drawn too, with the headroom between them filled as on the
plot above. On the CPU the three persistent kinds alone (there is no activation figure). A run
that records none of them: empty_line() says so, and the plot gives its room to the others
(fold.py).

Drawn from the columns' min/max pyramids: where a pixel holds several steps each kind
shows its largest value there, so the top errs on the high side; where every step has its
own point (a short run, or zoomed in) the top is exactly the sum of the kinds.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from app.model.metrics import MetricsBuffer
from app.model.runmodel import RunModel
from app.model.x_axis import columns
from app.ui.theme import Palette

from .parts import GIB, PlotSet, Series, legend

LAYERS = (("mem_params", "params"), ("mem_grads", "grads"), ("mem_optimizer", "optimizer"),
          ("mem_activations", "activations"))
UNITS = ((GIB, "GiB"), (2.0 ** 20, "MiB"), (2.0 ** 10, "KiB"), (1.0, "B"))


def unit_for(peak_bytes: float) -> tuple[float, str]:
    """The largest binary unit that keeps the peak at 1 or more (GiB down to bytes)."""
    for scale, name in UNITS:
        if peak_bytes >= scale:
            return scale, name
    return 1.0, "B"


class MemoryStack:
    def __init__(self, plots: PlotSet, pal: Palette) -> None:
        self.plots, self.pal = plots, pal
        p = plots.stack
        p.setClipToView(False)  # as the GPU memory plot's: its headroom fill is drawn from unclipped curves
        self.layers: list[pg.PlotDataItem] = []
        for i, color in enumerate(pal.mem_kinds):
            fill = pg.mkColor(color)
            fill.setAlpha(150)
            item = p.plot(pen=pg.mkPen(color, width=1), fillLevel=0.0, brush=pg.mkBrush(fill))
            item.setZValue(-i)  # each layer's curve is the sum up to it: the tallest goes behind
            self.layers.append(item)
        self.total = p.plot(pen=pg.mkPen(pal.mem_total, width=1.5))
        self.used = p.plot(pen=pg.mkPen(pal.mem_used, width=1, style=Qt.PenStyle.DashLine))
        self.headroom = pg.FillBetweenItem(self.used, self.total, brush=pg.mkBrush(*pal.headroom))
        p.addItem(self.headroom)
        self.device = [Series(self.total, "mem_total", GIB, "max"), Series(self.used, "mem_used", GIB, "max")]
        self.y_shown = np.empty(0)  # the top of the stack as drawn, for the y range
        self.x_last: Optional[float] = None
        self.x_first: Optional[float] = None
        self.kinds: tuple[str, ...] = ()  # the kinds the run records
        self.scale, self.unit = GIB, "GiB"
        self.gpu = False
        self.key: tuple = ()
        self.steps = 0  # of the run drawn
        self._title_key: tuple = ()

    def empty_line(self) -> str:
        """Why there is nothing to show, in one line ("": there is)."""
        if self.kinds:
            return ""
        return "Memory by kind: not recorded by this run" if self.steps else "Memory by kind: shown during a run"

    def series(self) -> list:
        """What the y range follows: the stack's top and the device lines."""
        return [self] + (self.device if self.gpu else [])

    def update(self, model: RunModel, buf: MetricsBuffer, x0: Optional[float], x1: Optional[float], width: int,
               axis: str) -> None:
        key = (id(buf), buf.version, x0, x1, width, axis)
        if key == self.key:
            return
        self.key = key
        n = self.steps = len(buf)
        held = [c for c, _ in LAYERS if n and np.isfinite(buf.view(c)[-min(n, 64):]).any()]
        self.gpu = buf.has_gpu_memory()
        if not held:
            self._clear()
            self._set_title()
            return
        self.kinds = tuple(held)
        xs = columns(buf).values(axis)
        i0, i1 = (0, n) if x0 is None or x1 is None else (max(0, int(np.searchsorted(xs, x0, side="left")) - 1),
                                             min(n, int(np.searchsorted(xs, x1, side="right")) + 1))
        target = max(200, 2 * width)
        idx: Optional[np.ndarray] = None
        tops: list[np.ndarray] = []
        running: Optional[np.ndarray] = None
        for col, _name in LAYERS:
            if col not in held:
                tops.append(np.empty(0))
                continue
            ix, y = buf.pyramid(col).decimate(i0, i1, target)
            if len(ix) != (i1 - i0):  # buckets: each kind's largest value in each
                ix, y = ix[1::2], y[1::2]
            y = np.nan_to_num(np.asarray(y, dtype=np.float64), nan=0.0)
            idx = ix if idx is None else idx
            running = y if running is None else running + y[:len(running)]
            tops.append(running.copy())
        assert idx is not None and running is not None
        self.scale, self.unit = (GIB, "GiB") if self.gpu else unit_for(float(running.max()) if len(running) else 0.0)
        x = xs[idx][:len(running)]
        for item, top in zip(self.layers, tops):
            if len(top):
                item.setData(x, top / self.scale)
                item.setVisible(True)
            else:
                item.setData([], [])
                item.setVisible(False)
        self.y_shown = running / self.scale
        self.x_first, self.x_last = (float(xs[0]), float(xs[-1])) if len(xs) else (None, None)
        for s in self.device:
            s.item.setVisible(self.gpu)
            if self.gpu:
                s.update(buf, x0, x1, width, axis)
        self.headroom.setVisible(self.gpu)
        self._set_title()

    def _clear(self) -> None:
        for item in self.layers + [self.total, self.used]:
            item.setData([], [])
        self.headroom.setVisible(False)
        self.y_shown = np.empty(0)
        self.kinds = ()

    def _set_title(self) -> None:
        key = (self.kinds, self.gpu, self.unit)
        if key == self._title_key:
            return
        self._title_key = key
        pal = self.pal
        names = dict(LAYERS)
        entries = [(c, "\u2588", names[k]) for (k, _), c in zip(LAYERS, pal.mem_kinds) if k in self.kinds]
        if self.gpu:
            entries += [(pal.mem_total, "\u2501", "device total"), (pal.mem_used, "\u2505", "used"),
                        ("#%02x%02x%02x" % tuple(pal.headroom[:3]), "\u2588", "headroom")]
        where = "" if self.gpu or not self.kinds else " (CPU: no activation figure)"
        self.plots.stack.setTitle(legend("Memory by kind" + where, entries, pal.foreground))
        self.plots.stack.setLabel("left", self.unit)

    def stacked(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(x, y) of each layer's top as drawn, in the plot's unit (for tests and export)."""
        out = []
        for item in self.layers:
            x, y = item.getData()
            out.append((np.asarray(x if x is not None else []), np.asarray(y if y is not None else [])))
        return out
