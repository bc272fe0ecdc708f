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
from dataclasses import fields, is_dataclass
from datetime import datetime
from functools import lru_cache
from types import UnionType
from typing import Any, Optional, Union, get_args, get_origin, get_type_hints

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
    """A finite float (a number, or text that spells one), or `default` (a bool is no number)."""
    if isinstance(v, bool):
        return default
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


def _fits(v: object, tp: Any) -> bool:
    """Whether a decoded JSON value has the shape a declared field type says (a tuple is a JSON
    list; a float field takes an int; an annotation this does not know takes anything)."""
    if tp is Any:
        return True
    if tp is type(None):
        return v is None
    if tp is bool:
        return isinstance(v, bool)
    if tp is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if tp is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if tp is str:
        return isinstance(v, str)
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union or origin is UnionType:
        return any(_fits(v, a) for a in args)
    if tp in (dict, list, tuple) or origin in (dict, list, tuple):
        if not isinstance(v, dict if dict in (tp, origin) else list):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:  # a row: its items each of its type
            # (not its length: an older engine's rows may have fewer items, a newer one's more)
            return isinstance(v, list) and all(_fits(x, a) for x, a in zip(v, args))
        if origin in (tuple, list) and args:
            return isinstance(v, list) and all(_fits(x, args[0]) for x in v)
        return True
    return True


@lru_cache(maxsize=None)
def _declared_fields() -> dict[str, dict[str, Any]]:
    """Each event kind the engine declares (engine/declarations/events.py) -> its data fields' types."""
    from engine.declarations import events
    out: dict[str, dict[str, Any]] = {}
    todo = [events.Event]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls is events.Event or not is_dataclass(cls):
            continue
        hints = get_type_hints(cls)
        out[cls.kind] = {f.name: hints.get(f.name, Any) for f in fields(cls) if f.name not in ("step", "epoch")}
    return out


def declared(kind: object, data: object) -> dict[str, Any]:
    """An event's data as its kind declares it: an object, each field the engine declares for
    `kind` kept only where its value has the declared shape (a count that is text or 1e300,
    a list where a number was written, is left out: a reader's .get() gives its default).
    Fields the declaration does not name, and kinds it does not know (an integration's), are
    kept as they are."""
    out = mapping(data)
    types = _declared_fields().get(kind) if isinstance(kind, str) else None
    if types:
        out = {k: v for k, v in out.items() if k not in types or _fits(v, types[k])}
    return out


def row_data(kind: object, raw: object) -> dict[str, Any]:
    """An events row's `data` column, read: decoded (not JSON: {}), then `declared`."""
    return declared(kind, decoded(raw, {}))


def changes(v: object) -> tuple[tuple[str, Any, Any], ...]:
    """A settings_applied event's `changes`: its (name, old, new) triples whose name is text;
    anything else in them ("x", [1, 2], {"a": 1}, a pair) is left out."""
    if not isinstance(v, (list, tuple)):
        return ()
    return tuple((c[0], c[1], c[2]) for c in v if isinstance(c, (list, tuple)) and len(c) == 3
                 and isinstance(c[0], str))


__all__ = ["INT64", "MAX_DEPTH", "plain", "decoded", "run_value", "number", "whole", "moment", "measured", "mapping", "text",
           "event_data", "changes", "declared", "row_data"]
