"""The GPU memory plot: used, reserved, peak and total, with the headroom filled between used
and total. On a CPU run, or before a run, there is nothing to show: empty_line() says why in one
line, and the plot gives its room to the others (fold.py)."""
from __future__ import annotations

from typing import Optional

import pyqtgraph as pg
from PySide6.QtCore import Qt

from app.model.metrics import MetricsBuffer
from app.model.runmodel import RunModel
from app.ui.theme import Palette

from .parts import GIB, PlotSet, Series, legend


class MemoryPlot:
    def __init__(self, plots: PlotSet, pal: Palette) -> None:
        self.plots = plots
        self.pal = pal
        p = plots.mem
        # Not clipped to the view: the headroom fill is drawn from its two curves as they were
        # clipped when their data was set and is not drawn again when the view moves (it covered
        # the first 100 steps, the range before the first one set). The curves get only the
        # visible span anyway (Series).
        p.setClipToView(False)
        self.total = p.plot(pen=pg.mkPen(pal.mem_total, width=1.5))
        self.used = p.plot(pen=pg.mkPen(pal.mem_used, width=1.5))
        self.reserved = p.plot(pen=pg.mkPen(pal.mem_reserved, width=1))
        self.peak = p.plot(pen=pg.mkPen(pal.mem_peak, width=1, style=Qt.PenStyle.DotLine))
        self.fill = pg.FillBetweenItem(self.used, self.total, brush=pg.mkBrush(*pal.headroom))
        self.total.sigPlotChanged.disconnect(self.fill.curveChanged)  # total is set first, used next:
        p.addItem(self.fill)                                           # one path update, not two
        self.series = [Series(self.total, "mem_total", GIB, "max"), Series(self.used, "mem_used", GIB, "max"),
                       Series(self.reserved, "mem_reserved", GIB, "max"), Series(self.peak, "mem_peak", GIB, "max")]
        self.mode: Optional[str] = None

    @property
    def shown(self) -> bool:
        """The memory curves are on screen (a GPU run)."""
        return self.mode == "gpu"

    def empty_line(self) -> str:
        """Why there is nothing to show, in one line ("": there is)."""
        return {"cpu": "GPU memory: no GPU (this run trains on the CPU)",
                "none": "GPU memory: shown during a run on a GPU"}.get(self.mode or "none", "")

    def update(self, model: RunModel, buf: MetricsBuffer, x0: Optional[float], x1: Optional[float],
               width: int, axis: str = "step") -> None:
        device = str(model.info.get("device") or "")
        if buf.has_gpu_memory():
            self.set_mode("gpu")
        elif device.startswith("cpu") or len(buf):
            self.set_mode("cpu")
        else:
            self.set_mode("none")
        if self.shown:
            for s in self.series:
                s.update(buf, x0, x1, width, axis)  # the headroom fill follows its two curves by itself

    def set_mode(self, mode: str) -> None:
        """'gpu': memory curves; 'cpu': no GPU (the title says so); 'none': no run yet."""
        if mode == self.mode:
            return
        self.mode = mode
        p, pal = self.plots.mem, self.pal
        gpu = mode == "gpu"
        for s in self.series:
            s.item.setVisible(gpu)
        self.fill.setVisible(gpu)
        for axis in ("left", "bottom"):
            p.showAxis(axis, gpu)
        p.showGrid(x=gpu, y=gpu, alpha=pal.grid_alpha)
        p.setMouseEnabled(x=gpu, y=gpu)
        if gpu:
            p.setTitle(legend("GPU memory", [(pal.mem_used, "\u2501", "used"),
                                             (pal.mem_reserved, "\u2501", "reserved"),
                                             (pal.mem_peak, "\u2505", "peak"), (pal.mem_total, "\u2501", "total"),
                                             ("#%02x%02x%02x" % tuple(pal.headroom[:3]), "\u2588", "headroom")],
                              pal.foreground))
            (x0, x1), _ = self.plots.loss.getViewBox().viewRange()
            p.setXRange(x0, x1, padding=0)
        else:
            p.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
            p.setTitle(legend("GPU memory: no GPU" if mode == "cpu" else "GPU memory", [], pal.foreground))
