"""A 1-D numpy array that grows by doubling: the storage under every metrics column and
every level of the min/max pyramid (its own module so both import it, neither the other)."""
from __future__ import annotations

from typing import Any

import numpy as np


class GrowableArray:
    """A 1-D float64 array with amortised O(1) appends: capacity doubles when full."""

    def __init__(self, capacity: int = 1024, dtype: Any = np.float64) -> None:
        self._data = np.empty(max(1, int(capacity)), dtype=dtype)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def capacity(self) -> int:
        return len(self._data)

    def _reserve(self, n: int) -> None:
        if n > len(self._data):
            cap = len(self._data)
            while cap < n:
                cap *= 2
            grown = np.empty(cap, dtype=self._data.dtype)
            grown[: self._n] = self._data[: self._n]
            self._data = grown

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
