"""Peak (min/max) pyramid over a growable column, updated incrementally.

Level k holds, for each bucket of FACTOR**k consecutive points, the smallest and
the largest finite value (NaN where the bucket has none). To draw points i0..i1 in
at most `target` points, take the finest level whose buckets over that span number
at most target/2 and interleave min and max: the same picture pyqtgraph's 'peak'
downsampling gives, without touching a million points on every frame. Appending m
points costs O(m) plus one bucket per level.
"""
from __future__ import annotations

import numpy as np

from .growable import GrowableArray

FACTOR = 4
MIN_LEVEL_SIZE = 64  # no level coarser than needed to bring a curve under this many buckets


def _reduce(values_min: np.ndarray, values_max: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group consecutive FACTOR entries (the last group may be short) into min and max."""
    m = len(values_min)
    pad = (-m) % FACTOR
    if pad:
        values_min = np.concatenate([values_min, np.full(pad, np.nan, dtype=values_min.dtype)])
        values_max = np.concatenate([values_max, np.full(pad, np.nan, dtype=values_max.dtype)])
    return (np.fmin.reduce(values_min.reshape(-1, FACTOR), axis=1),
            np.fmax.reduce(values_max.reshape(-1, FACTOR), axis=1))


class PeakPyramid:
    def __init__(self, source: GrowableArray) -> None:
        self.source = source
        # Levels keep the column's precision (float32 columns: float32 levels, half the bytes).
        self.dtype = source.dtype if np.issubdtype(source.dtype, np.floating) else np.dtype(np.float64)
        self.levels: list[tuple[GrowableArray, GrowableArray]] = []  # level k+1 at index k
        self._done = 0  # source points already folded in

    def reset(self) -> None:
        self.levels = []
        self._done = 0

    def update(self) -> None:
        n = len(self.source)
        if n < self._done:  # the source was truncated
            self.reset()
        if n == self._done:
            return
        y = self.source.view()
        if y.dtype != self.dtype:
            y = y.astype(self.dtype)
        # Level 1 from the raw values, from the start of the bucket that was still open.
        prev_done, prev_min, prev_max = self._done, y, y
        bucket = 1
        k = 0
        while True:
            bucket *= FACTOR
            prev_len = len(prev_min)
            if k >= len(self.levels):
                if prev_len <= MIN_LEVEL_SIZE:
                    break
                size = max(16, prev_len // FACTOR + 1)
                self.levels.append((GrowableArray(size, self.dtype), GrowableArray(size, self.dtype)))
                prev_done = 0  # a new level is built from everything below it
            lo_arr, hi_arr = self.levels[k]
            start = (prev_done // FACTOR) * FACTOR  # first entry of the open bucket below
            mins, maxs = _reduce(prev_min[start:prev_len], prev_max[start:prev_len])
            first_bucket = start // FACTOR
            prev_done_here = len(lo_arr)
            lo_arr.set_tail(first_bucket, mins)
            hi_arr.set_tail(first_bucket, maxs)
            prev_done = min(prev_done_here, first_bucket)
            prev_min, prev_max = lo_arr.view(), hi_arr.view()
            k += 1
        del self.levels[k:]
        self._done = n

    def decimate(self, i0: int, i1: int, target: int) -> tuple[np.ndarray, np.ndarray]:
        """(indices into the source, values) covering source[i0:i1] in at most ~target points.

        Each bucket gives two points: its minimum at the bucket's first entry and its
        maximum at its last, so x = x_column[indices] spans the data end to end.
        """
        n = len(self.source)
        i0, i1 = max(0, i0), min(n, i1)
        if i1 <= i0:
            return np.empty(0, dtype=np.int64), np.empty(0)
        count = i1 - i0
        target = max(4, int(target))
        if count <= target or not self.levels:
            return np.arange(i0, i1), self.source.view()[i0:i1]
        bucket, level = 1, -1
        for k in range(len(self.levels)):
            bucket *= FACTOR
            level = k
            if count / bucket <= target / 2:
                break
        lo_arr, hi_arr = self.levels[level]
        b0, b1 = i0 // bucket, min(len(lo_arr), -(-i1 // bucket))
        lo, hi = lo_arr.view()[b0:b1], hi_arr.view()[b0:b1]
        values = np.empty(2 * len(lo), dtype=lo.dtype)
        values[0::2] = lo
        values[1::2] = hi
        starts = np.arange(b0, b1, dtype=np.int64) * bucket
        idx = np.empty(2 * len(starts), dtype=np.int64)
        idx[0::2] = starts
        idx[1::2] = np.minimum(starts + bucket - 1, n - 1)
        return idx, values
