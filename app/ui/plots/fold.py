"""Plots that fold away when the plot area is short: below FOLD_BELOW_PX of height, GPU
memory, memory by kind and throughput leave the layout, so the loss, the gradient norm and
the lr keep a readable height (a 1024 x 640 laptop window); they come back as soon as
there is room. The toolbar's hint says what is folded."""
from __future__ import annotations

from typing import Any

import pyqtgraph as pg

from .parts import PlotSet

FOLD_BELOW_PX = 430  # the canvas' height
FOLDED_HINT = "Memory, throughput folded"
FOLDED_TIP = ("GPU memory, memory by kind and throughput are folded away while the plots are short: make them "
              "taller (a larger window, a smaller Alerts dock) to see them")


class PlotFold:
    def __init__(self, canvas: pg.GraphicsLayoutWidget, plots: PlotSet, hint: Any) -> None:
        self.canvas, self.hint = canvas, hint
        grid = canvas.ci.layout
        self.places: list[tuple[pg.PlotItem, tuple[int, int, int, int]]] = []
        for p in (plots.mem, plots.stack, plots.tput):
            for i in range(grid.count()):
                if grid.itemAt(i) is p:
                    r, c, rs, cs = self._cell(grid, i)
                    self.places.append((p, (r, c, rs, cs)))
        self.folded = False

    @staticmethod
    def _cell(grid: Any, index: int) -> tuple[int, int, int, int]:
        item = grid.itemAt(index)
        for r in range(grid.rowCount()):
            for c in range(grid.columnCount()):
                if grid.itemAt(r, c) is item:
                    rs = sum(1 for r2 in range(r, grid.rowCount()) if grid.itemAt(r2, c) is item)
                    cs = sum(1 for c2 in range(c, grid.columnCount()) if grid.itemAt(r, c2) is item)
                    return r, c, rs, cs
        raise LookupError("item not in the grid")

    def update(self, height: int) -> bool:
        """Fold or unfold for a canvas this tall; True if that changed anything."""
        fold = 0 < height < FOLD_BELOW_PX
        if fold == self.folded:
            return False
        self.folded = fold
        grid = self.canvas.ci.layout
        for p, (r, c, rs, cs) in self.places:
            if fold:
                grid.removeItem(p)
                p.hide()
            else:
                grid.addItem(p, r, c, rs, cs)
                p.show()
        grid.invalidate()
        self.hint.setText(FOLDED_HINT if fold else "")
        self.hint.setToolTip(FOLDED_TIP if fold else "")
        return True
