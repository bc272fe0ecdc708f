"""A 1-D numpy array that grows by doubling: the storage under every metrics column and
every level of the min/max pyramid (its own module so both import it, neither the other)."""
from __future__ import annotations

from typing import Any

import numpy as np


class GrowableArray:
    """A 1-D array (float64 unless told) with amortised O(1) appends: capacity doubles when full."""

    def __init__(self, capacity: int = 1024, dtype: Any = np.float64) -> None:
        self._data = np.empty(max(1, int(capacity)), dtype=dtype)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def capacity(self) -> int:
        return len(self._data)

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the filled part (what the column really holds)."""
        return self._n * self._data.itemsize

    def _reserve(self, n: int) -> None:
        if n > len(self._data):
            cap = len(self._data)
            while cap < n:
                cap *= 2
            self._grow_to(cap)

    def _grow_to(self, cap: int) -> None:
        grown = np.empty(cap, dtype=self._data.dtype)
        grown[: self._n] = self._data[: self._n]
        self._data = grown

    def reserve(self, n: int) -> None:
        """Room for n values in all, exactly (a bulk load that knows its size: no doubling)."""
        if n > len(self._data):
            self._grow_to(int(n))

    def append(self, value: float) -> None:
        self._reserve(self._n + 1)
        self._data[self._n] = value
        self._n += 1

    def extend(self, values: Any) -> None:
        values = np.asarray(values, dtype=self._data.dtype)
        m = len(values)
        if m == 0:
            return
        self._reserve(self._n + m)
        self._data[self._n: self._n + m] = values
        self._n += m

    def extend_from(self, base: np.ndarray, i0: int, i1: int) -> None:
        """Append base[i0:i1]. Reading a run folder hands its columns over in pieces (cut at
        the events between them): when this array is empty and `base` is a whole array of its
        dtype, `base` becomes the storage, and later pieces of it that follow on need no copy."""
        if i1 <= i0:
            return
        if self._data is base and self._n == i0:
            self._n = i1
            return
        if (self._n == 0 and i0 == 0 and base.ndim == 1 and base.dtype == self._data.dtype
                and base.base is None and base.flags.c_contiguous and base.flags.writeable):
            self._data, self._n = base, i1
            return
        self.extend(base[i0:i1])

    def set_tail(self, start: int, values: Any) -> None:
        """Overwrite from `start` on (start <= len) and set the length to start + len(values)."""
        values = np.asarray(values, dtype=self._data.dtype)
        end = start + len(values)
        self._reserve(end)
        self._data[start:end] = values
        self._n = end

    def view(self) -> np.ndarray:
        return self._data[: self._n]

    def clear(self) -> None:
        self._n = 0
