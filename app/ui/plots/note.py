"""A note in the middle of a plot's area: what the empty loss plot says (how to start a run, or
that one is starting). It keeps itself in the middle as the plot's range moves."""
from __future__ import annotations

import pyqtgraph as pg


class PlotNote(pg.TextItem):
    """A line of text centred on `plot`'s view, shown while it has any text."""

    def __init__(self, plot: pg.PlotItem, color: str) -> None:
        super().__init__("", color=color, anchor=(0.5, 0.5))
        self.setZValue(50)
        self._view = plot.getViewBox()
        plot.addItem(self, ignoreBounds=True)
        self._view.sigRangeChanged.connect(self._place)

    def show_text(self, text: str) -> None:
        """Say `text` ("": hide the note)."""
        if text == self.toPlainText() and self.isVisible() == bool(text):
            return
        self.setText(text)
        self.setVisible(bool(text))
        self._place()

    def _place(self, *_range: object) -> None:
        if self.isVisible():
            self.setPos(self._view.viewRect().center())
