"""Other runs' loss (as its EMA) drawn over this run's loss plot, one colour each, on the
plots' x axis (by samples or tokens seen, runs with different accumulation line up)."""
from __future__ import annotations

from typing import Optional

import pyqtgraph as pg

from app.model.metrics import MetricsBuffer
from .parts import Series
from app.ui.theme import Palette


class Overlays:
    def __init__(self, loss_plot: pg.PlotItem, pal: Palette) -> None:
        self.loss_plot = loss_plot
        self.pal = pal
        self.entries: dict[str, tuple[MetricsBuffer, pg.PlotDataItem, Series]] = {}

    def add(self, name: str, buf: MetricsBuffer) -> None:
        self.remove(name)
        color = self.pal.overlay[len(self.entries) % len(self.pal.overlay)]
        item = self.loss_plot.plot(pen=pg.mkPen(color, width=2))
        item.setClipToView(True)
        item.setDownsampling(auto=True, method="peak")
        self.entries[name] = (buf, item, Series(item, "loss_ema", buffer=buf))

    def remove(self, name: str) -> bool:
        entry = self.entries.pop(name, None)
        if entry is None:
            return False
        self.loss_plot.removeItem(entry[1])
        return True

    def series(self) -> list[Series]:
        return [s for _buf, _item, s in self.entries.values()]

    def legend(self) -> list[tuple[str, str, str]]:
        """(colour, glyph, text) for the loss plot's title."""
        return [(self.pal.overlay[i % len(self.pal.overlay)], "\u2501", f"{n} (EMA)")
                for i, n in enumerate(self.entries)]

    def buffers(self) -> list[tuple[str, MetricsBuffer]]:
        return [(n, b) for n, (b, _i, _s) in self.entries.items()]

    def update(self, x0: Optional[float], x1: Optional[float], width: int, axis: str = "step") -> None:
        for buf, _item, s in self.entries.values():
            s.update(buf, x0, x1, width, axis)
