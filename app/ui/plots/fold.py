"""Where the plots go on the canvas, and which of them fold away for room.

The loss is the plot a user reads all the time: it keeps at least LOSS_SHARE of the window's
height. The rows under it share the rest: gradient norm | lr, then GPU memory | memory by
kind | throughput. A plot with nothing to show (GPU memory on a CPU run, memory by kind a run
did not record, anything but the loss before a run) is not drawn as an empty frame: it leaves
its row for one line under the plots that says why ("GPU memory: no GPU ..."), and its room
goes to the others. Where the canvas is too short for a row at its readable height (a laptop,
a taller Alerts dock), the row folds away, the lowest first, then gradient norm and lr; they
come back as soon as there is room, and the toolbar's hint says what is folded.

Each placement is worked out from scratch (place_rows: the canvas' and the window's heights and
what is empty) and the plots are laid out anew from it, so nothing depends on what the layout
held before (a theme switch builds a new canvas: build.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from PySide6.QtCore import QRectF, Qt
from PySide6.QtWidgets import QGraphicsLinearLayout, QGraphicsWidget

from app.ui.theme import Palette

from .fitting import ShrinkingTitle
from .parts import PlotSet

LOSS_SHARE = 0.4  # of the window's height: the least the loss plot keeps
ROW_MIN_PX = {"middle": 84, "lower": 100}  # a row of plots is readable from here (title, data, axis)
LINE_PX = 20  # the one line that names the plots with nothing to show
STRETCH = {"loss": 5, "middle": 3, "lower": 3}  # of the rows' heights, past their least
LOWER = ("mem", "stack", "tput")
# The widths in a row: norm twice the lr; the throughput under the lr, as wide, whatever is beside it.
SHARES = {("loss",): (1,), ("norm", "lr"): (2, 1), ("mem", "stack", "tput"): (1, 1, 1), ("mem", "stack"): (1, 1),
          ("mem", "tput"): (2, 1), ("stack", "tput"): (2, 1), ("mem",): (1,), ("stack",): (1,), ("tput",): (1,)}
SEPARATOR = "   \u00b7   "
NAMES = {"norm": "gradient norm", "lr": "lr", "mem": "memory", "stack": "memory", "tput": "throughput"}
FOLDED_TIP = ("Folded away while the plots are short, so the loss keeps a readable height: make them taller "
              "(a larger window, a smaller Alerts dock) to see them")
TPUT_EMPTY = "Throughput: shown from the first step"


@dataclass(frozen=True)
class Placement:
    rows: tuple[tuple[str, ...], ...]  # the plots of each row, top to bottom (the loss alone first)
    line: str  # the one line under the plots ("": none)
    folded: tuple[str, ...]  # plots left out for room (not the empty ones)
    loss_min: int  # px


def place_rows(canvas_h: int, window_h: int, empty: Mapping[str, str], margins: int = 8,
               spacing: int = 8) -> Placement:
    """The rows to place on a canvas `canvas_h` tall in a window `window_h` tall. `empty`: plot
    name -> the line that says why it has nothing to show (those plots are not placed). A
    canvas of height 0 (not laid out yet) gets every row."""
    lower = tuple(n for n in LOWER if n not in empty)
    line = SEPARATOR.join(empty[n] for n in LOWER if n in empty)
    full: list[tuple[str, ...]] = [("loss",), ("norm", "lr")] + ([lower] if lower else [])
    if canvas_h <= 0:
        return Placement(tuple(full), line, (), 0)
    room = canvas_h - margins
    loss_min = max(0, min(math.ceil(LOSS_SHARE * window_h), room))

    def need(rows: list[tuple[str, ...]], with_line: bool) -> int:
        px = loss_min + sum(ROW_MIN_PX["middle" if r == ("norm", "lr") else "lower"] for r in rows[1:])
        gaps = len(rows) - 1 + int(with_line)
        return px + (LINE_PX if with_line else 0) + spacing * gaps

    rows, with_line = next(((r, w) for r, w in ((full, bool(line)), (full[:2], False)) if need(r, w) <= room),
                           (full[:1], False))  # the loss alone, as tall as the canvas allows
    placed = {n for r in rows for n in r}
    return Placement(tuple(rows), line if with_line else "", tuple(n for r in full for n in r if n not in placed),
                    loss_min)


def folded_hint(folded: tuple[str, ...]) -> str:
    names = list(dict.fromkeys(NAMES[n] for n in folded))
    return (", ".join(names) + " folded").capitalize() if names else ""


class OneLine(ShrinkingTitle):
    """The line under the plots that names those with nothing to show (clipped, never widening)."""

    def __init__(self, pal: Palette) -> None:
        super().__init__()
        self.pal = pal
        self.setMaximumHeight(LINE_PX)

    def show_text(self, text: str) -> None:
        self.setText(text, color=self.pal.note, size="9pt")


class Line(QGraphicsWidget):
    """Items in a row or a column, each with its share of the room (a layout emptied and filled
    again for each placement: a grid kept the spacing of rows it once had)."""

    def __init__(self, parent: Any, orientation: Qt.Orientation, spacing: float) -> None:
        super().__init__(parent)
        self.lay = QGraphicsLinearLayout(orientation)
        self.lay.setContentsMargins(0, 0, 0, 0)
        self.lay.setSpacing(spacing)
        self.setLayout(self.lay)

    def fill(self, items: list[tuple[Any, int]]) -> None:
        while self.lay.count():
            self.lay.removeAt(0)
        for item, stretch in items:
            self.lay.addItem(item)
            self.lay.setStretchFactor(item, stretch)


class PlotFold:
    """Lays the plots out on the canvas by place_rows, again whenever the placement changes."""

    def __init__(self, canvas: Any, plots: PlotSet, hint: Any, pal: Palette) -> None:
        self.canvas, self.plots, self.hint = canvas, plots, hint
        grid = canvas.ci.layout
        self.spacing = int(grid.verticalSpacing())
        self.column = Line(canvas.ci, Qt.Orientation.Vertical, self.spacing)
        grid.addItem(self.column, 0, 0)
        self.line = OneLine(pal)
        self.rows = {k: Line(self.column, Qt.Orientation.Horizontal, self.spacing) for k in ("middle", "lower")}
        for item in [*plots.all, self.line]:  # each a child of the column: shown once placed
            item.setParentItem(self.column)
        for item in [*plots.all, self.line, *self.rows.values()]:
            item.hide()
        self.placement: Optional[Placement] = None
        self.empty: dict[str, str] = {}
        self.canvas_h = self.window_h = self.canvas_w = 0

    @property
    def folded(self) -> bool:
        """Some plots are folded away for room (not those with nothing to show)."""
        return bool(self.placement and self.placement.folded)

    def update(self, canvas_h: Optional[int] = None, window_h: Optional[int] = None,
               empty: Optional[Mapping[str, str]] = None, canvas_w: Optional[int] = None) -> bool:
        """Lay the plots out again if the sizes or what is empty call for another placement. True if so."""
        if canvas_w is not None and canvas_w != self.canvas_w:
            self.canvas_w = canvas_w
            self._share_widths()
        if canvas_h is not None:
            self.canvas_h = canvas_h
        if window_h is not None:
            self.window_h = window_h
        if empty is not None:
            self.empty = {k: v for k, v in empty.items() if v}
        _left, top, _right, bottom = self.canvas.ci.layout.getContentsMargins()
        placement = place_rows(self.canvas_h, self.window_h, self.empty, int(top + bottom), self.spacing)
        if placement == self.placement:
            return False
        self.placement = placement
        self._place(placement)
        return True

    def _place(self, placement: Placement) -> None:
        shown: set[Any] = {self.column}
        column: list[tuple[Any, int]] = []
        for r, names in enumerate(placement.rows):
            kind = "loss" if names == ("loss",) else "middle" if names == ("norm", "lr") else "lower"
            plots = [getattr(self.plots, n) for n in names]
            for p in plots:  # x values under the loss and under the lowest row (those above share its steps)
                p.getAxis("bottom").setStyle(showValues=kind == "loss" or r == len(placement.rows) - 1)
            if kind == "loss":
                column.append((plots[0], STRETCH[kind]))
            else:
                row = self.rows[kind]
                row.fill([(p, 1) for p in plots])
                column.append((row, STRETCH[kind]))
                shown.add(row)
            shown.update(plots)
        self.plots.loss.setMinimumHeight(placement.loss_min if placement.loss_min else -1)
        if placement.line:
            self.line.show_text(placement.line)
            column.append((self.line, 0))
            shown.add(self.line)
        self.column.fill(column)
        self._share_widths()
        # The canvas sized its layout to the view before this placement (a resize comes first): again now,
        # so a layout that needs less height than the last one is not left as tall as that one.
        for item, layout in ((self.column, self.column.lay), (self.canvas.ci, self.canvas.ci.layout)):
            layout.invalidate()
            item.updateGeometry()  # forget the size hints of the last placement
        self.canvas.ci.setGeometry(QRectF(self.canvas.viewport().rect()))
        for item in [*self.plots.all, self.line, *self.rows.values()]:
            item.setVisible(item in shown)
        self.hint.setText(folded_hint(placement.folded))
        self.hint.setToolTip(FOLDED_TIP if placement.folded else "")

    def _share_widths(self) -> None:
        """Each plot in a row as wide as its share says (SHARES): its preferred width, the row's
        width shared out, so Qt gives each exactly that (its stretch factors share the room out by
        a rule of their own, and a title's length would count too)."""
        if self.placement is None:
            return
        left, _top, right, _bottom = self.canvas.ci.layout.getContentsMargins()
        for names in self.placement.rows:
            room = max(0.0, self.canvas_w - left - right - self.spacing * (len(names) - 1))
            shares = SHARES[names]
            for name, share in zip(names, shares):
                getattr(self.plots, name).setPreferredWidth(max(1.0, room * share / sum(shares)))
