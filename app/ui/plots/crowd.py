"""Markers that crowd a plot, worked out in pixels (Qt-free; app/ui/plots/markers.py draws them).

- merge: markers of one kind closer than the gap to the one before them make one group, drawn
  as one marker with a count ("NaN x12"); a task non-finite every 97th micro-batch draws a few
  markers at any zoom, never a wall of lines. Groups are chains, so the markers drawn are at
  least the gap apart.
- place: each label takes the first row, in its own order of rows, where it overlaps no label
  placed before it (labels are placed in order of importance); a label with no free row is
  left out (its marker still says it: the hover readout, the line's tooltip).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

LABEL_GAP_PX = 6.0  # the least room between two labels in a row


def merge(px: np.ndarray, min_gap: float) -> list[tuple[int, int]]:
    """Groups of sorted positions `px`: (first, last) indexes (inclusive) of each run of
    positions closer than min_gap to the one before."""
    n = len(px)
    if n == 0:
        return []
    breaks = np.flatnonzero(np.diff(np.asarray(px, dtype=np.float64)) >= min_gap) + 1
    firsts = np.concatenate(([0], breaks))
    lasts = np.concatenate((breaks - 1, [n - 1]))
    return list(zip(firsts.tolist(), lasts.tolist()))


@dataclass(frozen=True)
class Box:
    """A label to place: its line at x (px), its size, on which side of the line it goes, and
    the rows it may take, best first."""
    x: float
    width: float
    right: bool
    rows: Sequence[int]

    def span(self) -> tuple[float, float]:
        return (self.x, self.x + self.width) if self.right else (self.x - self.width, self.x)


def place(boxes: Sequence[Box], gap: float = LABEL_GAP_PX) -> list[Optional[int]]:
    """The row each label takes (None: left out), placing them in the order given."""
    taken: dict[int, list[tuple[float, float]]] = {}
    out: list[Optional[int]] = []
    for b in boxes:
        lo, hi = b.span()
        row = next((r for r in b.rows if all(hi + gap <= a or lo >= z + gap for a, z in taken.get(r, ()))), None)
        if row is not None:
            taken.setdefault(row, []).append((lo, hi))
        out.append(row)
    return out


def row_order(prefer: str, n: int) -> list[int]:
    """Rows 0 (top) .. n-1 in the order a kind of label tries them: "top", "bottom" or "middle"."""
    rows = list(range(n))
    if prefer == "bottom":
        return rows[::-1]
    if prefer == "middle":
        return sorted(rows, key=lambda r: (abs(r - (n - 1) / 2), r))
    return rows
