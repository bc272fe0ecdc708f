"""Ticks of a logarithmic y axis that stay readable on a short plot.

pyqtgraph labels every 2..9 multiple between the decades once fewer than three decades are in
view, so a span under a decade piled up "9·10⁻⁵ 8·10⁻⁵ 7·10⁻⁵ ..." over each other. Here the
labels are chosen by the room they have (at least `label_px` apart): the decades (every 2nd,
5th ... on a short axis), with as many 5s and 2s between them as fit; where that gives fewer
than two labels (a span under a decade), evenly spaced round values (0.30, 0.35, 0.40). The
other multiples of each decade are ticks and grid lines without a label (a level whose
spacing is None, as pyqtgraph's own minor level). A label half past an end of the axis is not
drawn (pyqtgraph), so only the values inside by half a label count.

Positions are log10 of the values (pyqtgraph's log mode); the functions are Qt-free.
"""
from __future__ import annotations

import math
from typing import Optional

Level = tuple[Optional[float], list[float]]  # (None: not labelled, else 1.0; positions)

DECADE_STEPS = (1, 2, 5, 10, 20, 50, 100, 200, 500)
MINOR_PX = 3.0  # the least gap between unlabelled ticks (denser ones are left out)
EDGE_PX = 8.0  # half a label: pyqtgraph leaves out a label that would reach past the plot's end


def _multiples(lo: float, hi: float, mults: tuple[int, ...]) -> list[float]:
    out = []
    for e in range(math.floor(lo) - 1, math.ceil(hi) + 1):
        for m in mults:
            x = e + math.log10(m)
            if lo - 1e-9 <= x <= hi + 1e-9:
                out.append(x)
    return out


def _minor(lo: float, hi: float, px: float, labelled: list[float]) -> list[Level]:
    if px * math.log10(10 / 9) < MINOR_PX:
        return []
    rest = [x for x in _multiples(lo, hi, tuple(range(1, 10))) if all(abs(x - y) > 1e-9 for y in labelled)]
    return [(None, rest)] if rest else []


def log_tick_levels(lo: float, hi: float, size_px: float, label_px: float) -> list[Level]:
    """Tick levels for a log axis showing log10 values lo..hi on `size_px` pixels: one labelled
    level, then the unlabelled rest. Labelled: the decades (every k-th where they are close),
    then as many 5s and 2s between as keep their distance; if that makes fewer than two, round
    values evenly spaced, if they make two."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo or size_px <= 0:
        return []
    px = size_px / (hi - lo)  # pixels per decade
    margin = min(EDGE_PX / px, (hi - lo) / 2)
    ilo, ihi = lo + margin, hi - margin  # a label nearer an end than that is not drawn (pyqtgraph)
    k = next((s for s in DECADE_STEPS if s * px >= label_px), DECADE_STEPS[-1])
    labelled = [float(d) for d in range(math.ceil(ilo - 1e-9), math.floor(ihi + 1e-9) + 1) if d % k == 0]
    if k == 1:
        for m in (5, 2):
            for x in _multiples(ilo, ihi, (m,)):
                if all(abs(x - y) * px >= label_px for y in labelled):
                    labelled.append(x)
        labelled.sort()
    if len(labelled) < 2:
        even = _even(ilo, ihi, px, label_px)
        if len(even) >= 2 or not labelled:
            labelled = even
    return [(1.0, labelled)] + _minor(lo, hi, px, labelled)


def _even(lo: float, hi: float, px: float, label_px: float) -> list[float]:
    """Round values a step apart (1, 2 or 5 x 10^k) from the bottom of lo..hi up, as far as
    they keep label_px apart (they close up toward the top: the scale is logarithmic), with the
    smallest step that gives two; where none does, the one round value there is."""
    a, b = 10 ** lo, 10 ** hi
    least = a * (10 ** (label_px / px) - 1)  # no smaller step keeps the two lowest labels apart
    one: list[float] = []
    for exp in range(math.floor(math.log10(least)), math.floor(math.log10(b)) + 2):
        for m in (1, 2, 5):
            step = m * 10.0 ** exp
            first, last = math.ceil(a / step - 1e-9), math.floor(b / step + 1e-9)
            kept: list[float] = []
            for i in range(first, last + 1):
                v = i * step
                if v <= 0 or (kept and math.log10(v / kept[-1]) * px < label_px):
                    break
                kept.append(v)
            if len(kept) >= 2:
                return [math.log10(v) for v in kept]
            if kept and not one:
                one = [math.log10(kept[0])]
    return one


def log_label(x: float) -> str:
    """The value at log10 position x in as few digits as say it: 0.001, 0.35, 20; below 0.001
    and from 1e5 up with an exponent, as the linear axes write them: 1e-4, 2.5e-5, 1e6."""
    v = 10.0 ** x
    plain = 1e-3 <= abs(v) < 1e5
    text = ""
    for digits in range(1, 7):
        text = f"{v:.{digits}g}" if not plain else f"{v:.{max(0, digits - 1 - math.floor(math.log10(abs(v))))}f}"
        if abs(float(text) - v) <= 1e-6 * abs(v):
            break
    if plain:
        return text
    mant, _e, exp = f"{float(text):e}".partition("e")
    mant = mant.rstrip("0").rstrip(".")
    return f"{mant}e{'-' if exp.startswith('-') else ''}{exp.lstrip('+-').lstrip('0') or '0'}"
