"""The bottom axis of every plot, written in the units of the chosen x axis: steps as plain
numbers, samples and tokens as 12k / 1.5M, wall time as m:ss on whole-clock ticks."""
from __future__ import annotations

import math

import pyqtgraph as pg

from app.model.x_axis import DEFAULT_AXIS, fmt_clock

CLOCK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 4 * 3600, 6 * 3600, 12 * 3600,
               24 * 3600)
PX_PER_TICK = 90  # about one labelled tick per 90 pixels


def fmt_count(v: float, spacing: float) -> str:
    """12000 -> '12k', 1500000 -> '1.5M' (as many decimals as the tick spacing needs)."""
    for size, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= size or (v == 0 and spacing >= size):
            places = max(0, math.ceil(-math.log10(spacing / size))) if spacing > 0 else 0
            return f"{v / size:.{min(places, 3)}f}{suffix}"
    places = max(0, math.ceil(-math.log10(spacing))) if spacing > 0 else 0
    return f"{v:.{min(places, 6)}f}"


class XAxisItem(pg.AxisItem):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__("bottom", *args, **kwargs)
        self.key = DEFAULT_AXIS
        self.enableAutoSIPrefix(False)

    def set_key(self, key: str) -> None:
        if key != self.key:
            self.key = key
            self.picture = None
            self.update()

    def tickSpacing(self, minVal: float, maxVal: float, size: float):  # noqa: N802, N803 - pyqtgraph names
        if self.key != "time":
            return super().tickSpacing(minVal, maxVal, size)
        span = max(maxVal - minVal, 1e-9)
        want = max(2.0, size / PX_PER_TICK)
        major = next((s for s in CLOCK_STEPS if span / s <= want), CLOCK_STEPS[-1] * math.ceil(span / want / 86400))
        minor = next((s for s in reversed(CLOCK_STEPS) if s < major and major % s == 0), major)
        return [(float(major), 0.0), (float(minor), 0.0)]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:  # noqa: N802 - pyqtgraph's name
        if self.key == "time":
            return [fmt_clock(v * scale) for v in values]
        if self.key in ("samples", "tokens"):
            return [fmt_count(v * scale, spacing * scale) for v in values]
        return super().tickStrings(values, scale, spacing)
