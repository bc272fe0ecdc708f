"""Plot parts that fit whatever room the window leaves them.

- ShrinkingTitle: a plot's title with its legend inline. pyqtgraph's LabelItem makes its
  text's width the plot's minimum width, so a long legend (a Compare with five runs) made
  the plots wider than the window and the window grew by itself. This one keeps a small
  minimum: narrower than its text, it shows the start (the title) and clips the rest.
- YAxisItem: a left axis that writes the true values (no SI prefix: pyqtgraph's prefix for
  values beyond 1e24 said "(x1e+27)" beside ticks already scaled, 2e+09 for 2e+36) and
  labels only as many ticks as fit the plot's height (about one per LABEL_PX pixels), so
  the labels of a short plot never overlap; on a log scale, the ticks of log_ticks.py (decades,
  1-2-5, or round values, as the room allows) instead of pyqtgraph's, which piled up.
"""
from __future__ import annotations

import math
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGraphicsItem

from .log_ticks import log_label, log_tick_levels

MIN_TITLE_WIDTH = 60.0
TITLE_PX = 20  # the title row (pyqtgraph's is 30): a short plot keeps more of its height for data
LABEL_PX = 22.0  # a tick label and the gap to the next


class ShrinkingTitle(pg.LabelItem):
    def __init__(self, parent: Any = None) -> None:
        super().__init__("", parent=parent, size="11pt")  # as PlotItem's own title
        self.setFlag(QGraphicsItem.GraphicsItemFlag.ItemClipsChildrenToShape)
        self.item.document().setDocumentMargin(1)
        self.updateMin()

    def updateMin(self) -> None:  # noqa: N802 - pyqtgraph name
        super().updateMin()
        h = self.itemRect().height()
        self.setMinimumWidth(MIN_TITLE_WIDTH)
        self._sizeHint[Qt.SizeHint.MinimumSize] = (MIN_TITLE_WIDTH, h)
        self.updateGeometry()

    def resizeEvent(self, ev: Any) -> None:  # noqa: N802 - pyqtgraph name
        # Too narrow: the start (the plot's name) stays in view, the legend's end is clipped.
        self.opts["justify"] = "left" if self.itemRect().width() > self.rect().width() else "center"
        super().resizeEvent(ev)

    def is_clipped(self) -> bool:
        return self.itemRect().width() > self.rect().width() + 0.5


def use_shrinking_title(plot: pg.PlotItem) -> None:
    """Put a ShrinkingTitle where the plot's own title was (hidden until setTitle)."""
    old = plot.titleLabel
    plot.layout.removeItem(old)
    if old.scene() is not None:
        old.scene().removeItem(old)
    new = ShrinkingTitle(parent=plot)
    plot.layout.addItem(new, 0, 1)
    plot.titleLabel = new
    plot.setTitle(None)


class FittingPlot(pg.PlotItem):
    """A PlotItem with a ShrinkingTitle in a TITLE_PX row."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        use_shrinking_title(self)

    def setTitle(self, title: Any = None, **args: Any) -> None:  # noqa: N802 - pyqtgraph name
        super().setTitle(title, **args)
        if title is not None:
            self.titleLabel.setMaximumHeight(TITLE_PX)
            self.layout.setRowFixedHeight(0, TITLE_PX)


def _nicer(spacing: float) -> float:
    """The next of 1, 2, 5 x 10^k above spacing."""
    exp = math.floor(math.log10(spacing))
    m = spacing / 10 ** exp
    for nxt in (2.0, 5.0, 10.0):
        if nxt > m * (1 + 1e-9):
            return nxt * 10 ** exp
    return 20.0 * 10 ** exp


def fmt_true(v: float, spacing: float) -> str:
    """A tick's value as it is: 0.25, 1200, 2e+36, 1.5e-05."""
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-3:
        digits = max(1, min(4, math.ceil(math.log10(abs(v) / spacing)) + 1)) if spacing > 0 else 3
        return f"{v:.{digits}g}"
    places = max(0, math.ceil(-math.log10(spacing))) if spacing > 0 else 3
    return f"{v:.{min(places, 6)}f}"


class YAxisItem(pg.AxisItem):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("left", *args, **kwargs)
        self.enableAutoSIPrefix(False)

    def tickSpacing(self, minVal: float, maxVal: float, size: float):  # noqa: N802, N803 - pyqtgraph names
        levels = super().tickSpacing(minVal, maxVal, size)
        span = abs(maxVal - minVal)
        if not levels or span <= 0 or not math.isfinite(span) or self._tickSpacing is not None:
            return levels
        room = max(1, int(size // LABEL_PX))
        major = float(levels[0][0])
        while major > 0 and span / major > room:
            major = _nicer(major)
        minors = [(float(m), 0.0) for m, _ in levels[1:]
                  if 0 < m < major and span / m <= room and abs(major / m - round(major / m)) < 1e-6]
        return [(major, 0.0)] + minors[:1]

    def tickValues(self, minVal: float, maxVal: float, size: float):  # noqa: N802, N803 - pyqtgraph names
        if self.logMode:
            return log_tick_levels(min(minVal, maxVal), max(minVal, maxVal), size, LABEL_PX)
        return super().tickValues(minVal, maxVal, size)

    def tickStrings(self, values: list[float], scale: float, spacing: Any) -> list[str]:  # noqa: N802 - pyqtgraph's name
        if self.logMode:  # a level without spacing is the unlabelled multiples (log_ticks.py)
            return [] if spacing is None else [log_label(v) for v in values]
        return [fmt_true(v * scale, spacing * scale) for v in values]
