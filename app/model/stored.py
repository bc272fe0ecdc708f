"""Numbers read from what a run folder stores (its run table, events, parent records): input
from disk, so anything may be there (a string, null, a float infinity that JSON allowed). One
reading for all of them: a number, or the caller's default; never an exception."""
from __future__ import annotations

import math
from typing import Optional


def number(v: object, default: Optional[float] = 0.0) -> Optional[float]:
    """A finite float, or `default`."""
    try:
        f = float(v)  # type: ignore[arg-type]  # any stored value: what float() refuses is caught below
    except (TypeError, ValueError, OverflowError):
        return default
    return f if math.isfinite(f) else default


def whole(v: object, default: int = 0) -> int:
    """An int (a float's whole part), or `default`."""
    if isinstance(v, int):
        return int(v)
    f = number(v, None)
    return default if f is None else int(f)


def measured(v: object) -> float:
    """A step's measured value as a float: NaN where there is none (null, text, anything not a
    number). Infinities are kept: a non-finite loss is what the step measured."""
    try:
        return float(v)  # type: ignore[arg-type]  # any stored value: what float() refuses is caught below
    except (TypeError, ValueError, OverflowError):
        return math.nan
