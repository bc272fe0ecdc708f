"""Values read from what a run folder stores (its run table, events and their data, parent
records): input from disk, so anything may be there (a string, null, a list where an object
was meant, an int past 64 bits, a float infinity that JSON allowed). One reading for all of
them, shared by the app (app/model/stored.py) and headroom-ctl: a value of the wanted shape,
or the caller's default; never an exception. Torch-free.

Two layers. `plain` and `decoded` are the boundary: RunReader hands out every run-table value
and event `data` through them, so what any reader gets is JSON-shaped and bounded (no int
past 64 bits, which SQLite cannot bind and Qt cannot convert; no nesting past MAX_DEPTH). The
accessors below (number, whole, moment, mapping, text, changes, event_data) then read one
value as the shape a caller wants, or the caller's default."""
from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any, Optional

INT64 = 2**63
MAX_DEPTH = 32  # deeper than anything the engine writes: junk, cut off (None) below this


def plain(v: object, depth: int = 0) -> Any:
    """A decoded JSON value made safe to hand on: dicts (string keys only), lists, str, bool,
    None, ints within 64 bits and floats (an int past 64 bits becomes the float it rounds to,
    infinities kept: a non-finite loss is a value); anything else, or deeper than MAX_DEPTH, None."""
    if v is None or isinstance(v, (str, bool, float)):
        return v
    if isinstance(v, int):
        if -INT64 <= v < INT64:
            return v
        try:
            return float(v)
        except OverflowError:
            return math.inf if v > 0 else -math.inf
    if depth >= MAX_DEPTH:
        return None
    if isinstance(v, dict):
        return {k: plain(x, depth + 1) for k, x in v.items() if isinstance(k, str)}
    if isinstance(v, (list, tuple)):
        return [plain(x, depth + 1) for x in v]
    return None


def decoded(raw: object, default: Any = None) -> Any:
    """A stored JSON text as a plain value; `default` for NULL or text that is not JSON."""
    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw).decode("utf-8", "replace")
    if not isinstance(raw, str) or not raw:
        return default
    try:
        return plain(json.loads(raw))
    except (ValueError, RecursionError):  # not JSON; nested past what the parser takes
        return default


def run_value(raw: object) -> Any:
    """A run-table value as stored: its JSON decoded (plain), else the text itself (an older or
    damaged file's), else the plain value SQLite held (a number, None)."""
    if isinstance(raw, str):
        return decoded(raw, raw)
    if isinstance(raw, (bytes, bytearray)):
        return decoded(raw, bytes(raw).decode("utf-8", "replace"))
    return plain(raw)


def number(v: object, default: Optional[float] = 0.0) -> Optional[float]:
    """A finite float, or `default`."""
    try:
        f = float(v)  # type: ignore[arg-type]  # any stored value: what float() refuses is caught below
    except (TypeError, ValueError, OverflowError):
        return default
    return f if math.isfinite(f) else default


def whole(v: object, default: int = 0) -> int:
    """An int within 64 bits (a float's whole part), or `default`: a step, a count, a size that
    SQLite can bind and Qt can show (1e300 or 2**70 is not one)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return int(v) if -INT64 <= v < INT64 else default
    f = number(v, None)
    return default if f is None or not -INT64 <= f < INT64 else int(f)


def moment(v: object) -> Optional[float]:
    """A wall-clock time (seconds since the epoch) that a calendar holds, or None: 1e300,
    -1e300 or 'yesterday' is no date to show, sort by or subtract."""
    f = number(v, None)
    if f is None:
        return None
    try:
        datetime.fromtimestamp(f)  # years 1 to 9999, as the app and headroom-ctl print dates
    except (OverflowError, OSError, ValueError):
        return None
    return f


def measured(v: object) -> float:
    """A step's measured value as a float: NaN where there is none (null, text, anything not a
    number). Infinities are kept: a non-finite loss is what the step measured."""
    try:
        return float(v)  # type: ignore[arg-type]  # any stored value: what float() refuses is caught below
    except (TypeError, ValueError, OverflowError):
        return math.nan


def mapping(v: object) -> dict[str, Any]:
    """An object's string keys and their values ({} for a list, text, a number, null)."""
    return {k: x for k, x in v.items() if isinstance(k, str)} if isinstance(v, dict) else {}


def text(v: object) -> Optional[str]:
    """Text as stored; None for anything else (a number, a list, null)."""
    return v if isinstance(v, str) else None


def event_data(event: object) -> dict[str, Any]:
    """An event row's `data` as an object ({} when it holds anything else)."""
    return mapping(event.get("data")) if isinstance(event, dict) else {}


def changes(v: object) -> tuple[tuple[str, Any, Any], ...]:
    """A settings_applied event's `changes`: its (name, old, new) triples whose name is text;
    anything else in them ("x", [1, 2], {"a": 1}, a pair) is left out."""
    if not isinstance(v, (list, tuple)):
        return ()
    return tuple((c[0], c[1], c[2]) for c in v if isinstance(c, (list, tuple)) and len(c) == 3
                 and isinstance(c[0], str))


__all__ = ["INT64", "MAX_DEPTH", "plain", "decoded", "run_value", "number", "whole", "moment", "measured", "mapping", "text",
           "event_data", "changes"]
