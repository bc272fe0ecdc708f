"""The axes while the plots follow a run: x grows by a fifth at a time, y only when the data
leaves it or fills a small part of it, so the axes (the dearest thing to paint) are redrawn
now and then rather than on every frame."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pyqtgraph as pg

from app.model.outliers import fences

from .parts import PlotSet, Series, nice_ceiling

ENDED_MARGIN = 0.015  # of the x span, past the last point of an ended run: its last marker stays inside


def follow_x(loss_plot: pg.PlotItem, leads: list[Series], refit: bool, live: bool = True) -> None:
    """x from the first step (or 0) to a round number a fifth past the last step while a run
    goes on (room to grow into, so the axis is not redrawn every frame); for a run that has
    ended, to its last point: nothing more will come, and the room past it would read as steps
    still to happen (or that vanished when accumulation was raised)."""
    lasts = [s.x_last for s in leads if s.x_last is not None]
    firsts = [s.x_first for s in leads if s.x_first is not None]
    if not lasts:
        loss_plot.setXRange(0, 100, padding=0)
        return
    lo = min(0.0, min(firsts))
    last = max(lasts)
    (cx0, cx1), _ = loss_plot.getViewBox().viewRange()
    if not live:
        hi = last + ENDED_MARGIN * max(last - lo, 1.0)
        if refit or abs(cx1 - hi) > 1e-9 * max(abs(hi), 1.0) or cx0 != lo:
            loss_plot.setXRange(lo, hi, padding=0)
        return
    if refit or last > cx1 or cx1 > 2.5 * max(last, 20) or cx0 != lo:
        loss_plot.setXRange(lo, nice_ceiling(max(last * 1.2, last + 5)), padding=0)


def inside(ys: list[np.ndarray], bounds: Optional[tuple[float, float]]) -> list[np.ndarray]:
    """The values of each curve within bounds ("Ignore outliers": the outliers stay drawn, past
    the axis' edge)."""
    if bounds is None:
        return ys
    lo, hi = bounds
    kept = [y[(y >= lo) & (y <= hi)] for y in ys]
    return kept if any(len(y) for y in kept) else ys


def log_y(p: pg.PlotItem) -> bool:
    """The plot's y axis is logarithmic (its own setting: log_scale.py and pyqtgraph's menu set it)."""
    return bool(p.ctrl.logYCheck.isChecked())


def shown_y(p: pg.PlotItem, own: list[Any], robust: bool) -> list[np.ndarray]:
    """The y values a plot's range holds: those of every curve drawn on it that bounds its view
    (pyqtgraph's addedItems: everything not added with ignoreBounds, such as the validation
    points, the runs compared, the planned lr), as given, never as pyqtgraph maps them for a
    log axis. "Ignore outliers": the plot's own curves (`own`: the raw one first, a Series, then
    what is derived from it, such as its EMA, which a spike drags up for many steps after, and
    the same run's steps thrown away, as Series or items) within the raw curve's fences; any
    other curve within its own fences (another run's loss is not an outlier of this one's)."""
    own_items = {id(getattr(s, "item", s)) for s in own}
    mine: list[np.ndarray] = []
    others: list[np.ndarray] = []
    for item in p.getViewBox().addedItems:
        if not isinstance(item, pg.PlotDataItem) or not item.isVisibleTo(p):
            continue
        _x, y = item.getOriginalDataset()
        if y is None or not len(y):
            continue
        (mine if id(item) in own_items else others).append(np.asarray(y, dtype=np.float64))
    if not robust:
        return mine + others
    raw = np.asarray(own[0].y_shown, dtype=np.float64) if own else np.empty(0)
    return inside(mine, fences(raw) if len(raw) else None) + [inside([y], fences(y))[0] for y in others]


def follow_y(p: pg.PlotItem, ys: list[np.ndarray], log: bool, from_zero: bool, refit: bool) -> None:
    """y around what the plot shows, with 8% to spare; kept while the data fits it well."""
    if not ys:
        return
    y = np.concatenate(ys)
    if log:
        y = y[y > 0]
        y = np.log10(y) if len(y) else y
    y = y[np.isfinite(y)]
    if not len(y):
        return
    lo, hi = float(y.min()), float(y.max())
    if from_zero:
        lo = 0.0
    _, (cy0, cy1) = p.getViewBox().viewRange()
    span = hi - lo
    if not refit and lo >= cy0 and hi <= cy1 and (cy1 - cy0) <= 3.0 * max(span, 1e-12) + 1e-300:
        return
    pad = 0.08 * span if span > 0 else (abs(hi) * 0.5 if hi else 1.0)
    new_lo, new_hi = lo - pad, hi + pad
    if not log and lo >= 0 and new_lo < 0:
        new_lo = 0.0
    p.setYRange(new_lo, new_hi, padding=0)


def follow(plots: PlotSet, own: dict[int, list[Any]], leads: list[Series], *, memory_shown: bool, refit: bool,
           robust: bool = False, live: bool = True, only: Optional[pg.PlotItem] = None) -> None:
    """Every plot's ranges (`only`: that plot's y alone). `own`: each plot's own curves, by
    id(plot), the raw one first (shown_y); `leads`: the curves whose ends set x (the loss and
    the runs compared)."""
    if only is None:
        follow_x(plots.loss, leads, refit, live)
    for p in plots.all:
        if (only is not None and p is not only) or (p is plots.mem and not memory_shown):
            continue
        from_zero = p in (plots.mem, plots.stack)
        follow_y(p, shown_y(p, own.get(id(p), []), robust and not from_zero), log=log_y(p), from_zero=from_zero,
                 refit=refit)
