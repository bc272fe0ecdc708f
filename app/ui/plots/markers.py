"""Vertical markers on the plots, one MarkerSet per kind (settings changed, non-finite steps,
rollbacks, a fork's point, a continued run), all drawn by one MarkerLayout per set of plots:

- on each plot, markers of one kind closer than MIN_GAP_PX at its current zoom are one marker
  with a count ("NaN \u00d712"; a strip along the plot's edge shades the steps it holds), merged again whenever the
  plot's x range or size changes (crowd.merge);
- the labels on a plot, of every kind, never overlap and never leave it: each goes on the side of
  its line where it fits, in the first free row in its kind's order of rows, the more important
  kinds first; a label with no room left is left out (crowd.place), its marker keeps its text
  as a tooltip.

Lines are pooled per plot and kind: merging again moves lines and changes their texts rather
than making new items, and nothing is done where the groups did not change (a pan).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QPen

from .crowd import Box, merge, place, row_order
from .parts import PlotSet

MIN_GAP_PX = 8.0  # markers of a kind closer than this merge
MIN_ROW_PX = 14.0  # a label's row: its height (with its fill's margin), at least this
TOP_PX = 3.0  # above the first row
MAX_TIP_LINES = 12
# A merged marker shades the steps it holds in a strip along the plot's edge where its kind's
# labels go (a band the plot's height would tint the whole curve when a run is non-finite throughout).
STRIP_TOP, STRIP_BOTTOM = (0.95, 1.0), (0.0, 0.05)
TIMES = "\u00d7"


@dataclass
class Marked:
    """What one kind marks, sorted by x: places on the x axis shown, their steps, and for each
    its label on the loss plot, on the small plots, and the word a group counts it by."""
    x: np.ndarray = field(default_factory=lambda: np.empty(0))
    step: np.ndarray = field(default_factory=lambda: np.empty(0))
    text: list[str] = field(default_factory=list)
    short: list[str] = field(default_factory=list)
    word: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.x)

    def sorted(self) -> "Marked":
        order = np.argsort(self.x, kind="stable")
        if len(order) and (order[:-1] > order[1:]).any():
            return Marked(self.x[order], self.step[order], [self.text[i] for i in order],
                          [self.short[i] for i in order], [self.word[i] for i in order])
        return self


@dataclass
class _Pool:
    """The items one kind has on one plot."""
    lines: list[pg.InfiniteLine] = field(default_factory=list)
    bands: list[pg.LinearRegionItem] = field(default_factory=list)
    used: int = 0
    key: tuple = ()


def label_of(line: pg.InfiniteLine) -> Optional[pg.InfLineLabel]:
    """A line's label (pyqtgraph gives a line made without one no `label` at all)."""
    return getattr(line, "label", None)


@dataclass(frozen=True)
class MarkerStyle:
    """How one kind of marker looks and where it goes."""
    kind: str
    pen: QPen
    color: str  # its labels' text
    fill: str  # its labels' background
    z: float
    plots: Callable[[PlotSet], Sequence[pg.PlotItem]]  # the plots it is drawn on now
    labelled: Callable[[PlotSet, pg.PlotItem], bool]  # whether its markers carry labels on a plot
    prefer: str  # the rows its labels try first: "top", "middle" or "bottom"
    many: str  # what a group of mixed words counts
    rank: int  # the order labels are placed in (lower first: they win a contested row)


class MarkerSet:
    """One kind of marker (see the module doc), drawn in its style."""

    def __init__(self, style: MarkerStyle) -> None:
        self.style = style
        self.kind, self.pen, self.color, self.fill, self.z = style.kind, style.pen, style.color, style.fill, style.z
        self.plots, self.labelled, self.prefer = style.plots, style.labelled, style.prefer
        self.many, self.rank = style.many, style.rank
        self.marked = Marked()
        self.version = 0
        self.pools: dict[int, _Pool] = {}
        self.layout: Optional["MarkerLayout"] = None

    def set_marked(self, marked: Marked) -> None:
        """What to mark from now on (drawn at once, merged at each plot's zoom)."""
        self.marked = marked.sorted()
        self.version += 1
        if self.layout is not None:
            self.layout.redraw()

    def lines(self) -> list[tuple[pg.PlotItem, pg.InfiniteLine]]:
        """The lines drawn now, plot by plot (a merged group is one line)."""
        if self.layout is None:
            return []
        out = []
        for p in self.layout.plots.all:
            pool = self.pools.get(id(p))
            if pool is not None:
                out += [(p, line) for line in pool.lines[:pool.used]]
        return out

    def group_text(self, i: int, j: int, short: bool) -> str:
        """The label of markers i..j (one marker: its own)."""
        m = self.marked
        if i == j:
            return m.short[i] if short else m.text[i]
        words = set(m.word[i:j + 1])
        word = words.pop() if len(words) == 1 else self.many
        return f"{word} {TIMES}{j - i + 1}"

    def group_tip(self, i: int, j: int) -> str:
        m = self.marked
        rows = [f"step {int(m.step[k])}: {m.text[k]}" for k in range(i, min(j + 1, i + MAX_TIP_LINES))]
        if j + 1 - i > MAX_TIP_LINES:
            rows.append(f"... {j + 1 - i - MAX_TIP_LINES} more, to step {int(m.step[j])}")
        return "\n".join(rows)

    # -- drawing ----------------------------------------------------------------------------
    def draw(self, ps: PlotSet, plot: pg.PlotItem) -> None:
        """Merge and draw this kind on one plot at its current zoom (nothing if that changed nothing)."""
        pool = self.pools.setdefault(id(plot), _Pool())
        shown = plot in self.plots(ps)
        vb = plot.getViewBox()
        (x0, x1), _ = vb.viewRange()
        width = float(vb.width())
        m = self.marked
        if not shown or not len(m) or width <= 1 or not x1 > x0:
            groups: list[tuple[int, int]] = []
        else:
            scale = width / (x1 - x0)
            margin = MIN_GAP_PX / scale
            i0 = int(np.searchsorted(m.x, x0 - margin, side="left"))
            i1 = int(np.searchsorted(m.x, x1 + margin, side="right"))
            groups = [(i0 + a, i0 + b) for a, b in merge((m.x[i0:i1] - x0) * scale, MIN_GAP_PX)]
        labelled = shown and self.labelled(ps, plot)
        key = (self.version, tuple(groups), labelled)
        if key == pool.key:
            return
        pool.key = key
        for k, (i, j) in enumerate(groups):
            line = self._line(plot, pool, k, labelled)
            line.setValue(float(m.x[i]))
            if labelled:
                line.label.setFormat(self.group_text(i, j, short=plot is not ps.loss).replace("{", "{{")
                                     .replace("}", "}}"))
            line.setToolTip(self.group_tip(i, j))
            line.show()
            band = self._band(plot, pool, k)
            if j > i:
                band.setRegion((float(m.x[i]), float(m.x[j])))
                band.setToolTip(self.group_tip(i, j))
                band.show()
            else:
                band.hide()
        for line in pool.lines[len(groups):]:
            line.hide()
        for band in pool.bands[len(groups):]:
            band.hide()
        pool.used = len(groups)

    def _line(self, plot: pg.PlotItem, pool: _Pool, k: int, labelled: bool) -> pg.InfiniteLine:
        while len(pool.lines) <= k:
            line = pg.InfiniteLine(pos=0.0, angle=90, pen=self.pen, movable=False, label="" if labelled else None,
                                   labelOpts={"position": 0.9, "color": self.color, "fill": pg.mkBrush(self.fill),
                                              "anchors": [(0, 0.5), (0, 0.5)]})
            line.setZValue(self.z)
            plot.addItem(line, ignoreBounds=True)
            pool.lines.append(line)
        line = pool.lines[k]
        label = label_of(line)
        if labelled and label is None:  # made unlabelled: labelled from now on
            line.label = label = pg.InfLineLabel(line, text="", position=0.9, color=self.color,
                                                 fill=pg.mkBrush(self.fill), anchors=[(0, 0.5), (0, 0.5)])
        if label is not None:
            label.setVisible(labelled)
        return line

    def _band(self, plot: pg.PlotItem, pool: _Pool, k: int) -> pg.LinearRegionItem:
        while len(pool.bands) <= k:
            color = pg.mkColor(self.color)
            color.setAlpha(110)
            band = pg.LinearRegionItem(values=(0, 1), movable=False, brush=pg.mkBrush(color), pen=pg.mkPen(None),
                                       span=STRIP_TOP if self.prefer == "top" else STRIP_BOTTOM)
            band.setZValue(self.z - 30)
            plot.addItem(band, ignoreBounds=True)
            pool.bands.append(band)
        return pool.bands[k]

    def clear(self) -> None:
        """Take every item off its plot (the plots are kept)."""
        if self.layout is not None:
            for p in self.layout.plots.all:
                pool = self.pools.pop(id(p), None)
                for item in (pool.lines + pool.bands) if pool else []:
                    p.removeItem(item)
        self.pools.clear()


class MarkerLayout:
    """Every MarkerSet of one PlotSet: drawn again on a plot when its x range or size changes,
    and its labels placed (see the module doc), in the order of the sets' ranks."""

    def __init__(self, plots: PlotSet) -> None:
        self.plots = plots
        self.sets: list[MarkerSet] = []
        self._label_keys: dict[int, tuple] = {}
        for p in plots.all:
            vb = p.getViewBox()
            vb.sigXRangeChanged.connect(lambda *_a, p=p: self.redraw(p))
            vb.sigResized.connect(lambda *_a, p=p: self.redraw(p))

    def add(self, marker_set: MarkerSet) -> MarkerSet:
        marker_set.layout = self
        self.sets.append(marker_set)
        self.sets.sort(key=lambda s: s.rank)
        return marker_set

    def redraw(self, plot: Optional[pg.PlotItem] = None) -> None:
        for p in ([plot] if plot is not None else self.plots.all):
            for s in self.sets:
                s.draw(self.plots, p)
            self.place_labels(p)

    def place_labels(self, plot: pg.PlotItem) -> None:
        vb = plot.getViewBox()
        (x0, x1), _ = vb.viewRange()
        width, height = float(vb.width()), float(vb.height())
        labels = []
        for s in self.sets:
            pool = s.pools.get(id(plot))
            if pool is not None and pool.key and pool.key[2]:  # drawn, and labelled on this plot
                labels += [(s, line) for line in pool.lines[:pool.used] if label_of(line) is not None]
        key = (x0, x1, width, height, tuple((id(s), s.version, s.pools[id(plot)].key) for s in self.sets
                                            if id(plot) in s.pools))
        if key == self._label_keys.get(id(plot)):
            return
        self._label_keys[id(plot)] = key
        if not labels or width <= 1 or not x1 > x0:
            return
        scale = width / (x1 - x0)
        rects = [line.label.boundingRect() for _s, line in labels]  # in pixels: a label ignores the zoom
        row_px = max(MIN_ROW_PX, max(r.height() for r in rects) + 1.0)
        n_rows = max(1, int((height - TOP_PX) // row_px))
        boxes = []
        for (s, line), rect in zip(labels, rects):
            px, w = (line.value() - x0) * scale, float(rect.width())
            right, left = px + w <= width, px - w >= 0  # the sides where it fits inside the plot
            boxes.append(Box(px, w, right=right or not left, rows=row_order(s.prefer, n_rows) if right or left else ()))
        for (_s, line), box, row in zip(labels, boxes, place(boxes)):
            label = line.label
            if row is None:
                label.setVisible(False)
                continue
            anchor = (0, 0.5) if box.right else (1, 0.5)
            label.anchors = [anchor, anchor]
            label.setVisible(True)
            label.setPosition(max(0.0, min(1.0, 1.0 - (TOP_PX + (row + 0.5) * row_px) / max(height, 1.0))))


_LAYOUTS: "weakref.WeakKeyDictionary[PlotSet, MarkerLayout]" = weakref.WeakKeyDictionary()


def layout_for(plots: PlotSet) -> MarkerLayout:
    """The one MarkerLayout of a set of plots (settings marks and rollbacks share it)."""
    layout = _LAYOUTS.get(plots)
    if layout is None:
        layout = _LAYOUTS[plots] = MarkerLayout(plots)
    return layout
