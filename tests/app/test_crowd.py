"""Markers that crowd, in pixels (app/ui/plots/crowd.py): which merge, and where labels go."""
from __future__ import annotations

import numpy as np

from app.ui.plots.crowd import Box, merge, place, row_order


def test_markers_closer_than_the_gap_merge_and_the_ones_drawn_keep_it():
    px = np.array([0.0, 3, 6, 20, 21, 40, 47.9, 100])
    assert merge(px, 8.0) == [(0, 2), (3, 4), (5, 6), (7, 7)]
    firsts = px[[g[0] for g in merge(px, 8.0)]]
    assert (np.diff(firsts) >= 8.0).all()
    assert merge(np.arange(0, 1000, 5.0), 8.0) == [(0, 199)]  # evenly crowded: one marker, counting all
    assert merge(np.empty(0), 8.0) == []


def test_labels_take_a_free_row_in_their_order_or_are_left_out():
    top, bottom = row_order("top", 3), row_order("bottom", 3)
    assert top == [0, 1, 2] and bottom == [2, 1, 0] and row_order("middle", 3) == [1, 0, 2]
    boxes = [Box(100, 80, True, top), Box(120, 80, True, top), Box(130, 80, True, top), Box(140, 80, True, top),
             Box(300, 80, True, top), Box(300, 40, False, top), Box(10, 30, True, ())]
    rows = place(boxes)
    assert rows[:5] == [0, 1, 2, None, 0]  # three staggered, the fourth has no room, the far one back on top
    assert rows[5] == 1  # left of its line, [260, 300], too near [300, 380] on the first row
    assert rows[6] is None  # fits on neither side of its line
    spans = [(b.span(), r) for b, r in zip(boxes, rows) if r is not None]
    for i, ((lo1, hi1), r1) in enumerate(spans):
        for (lo2, hi2), r2 in spans[i + 1:]:
            assert r1 != r2 or hi1 <= lo2 or hi2 <= lo1
