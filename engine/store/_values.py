"""The one boundary every value crosses on its way into run.db.

Strings with surrogates (a run folder whose name is not UTF-8), ints past 64 bits, bools
and numpy / torch scalars become values SQLite takes, so no row is ever refused for a value.
Torch-free.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

from engine.declarations import limits

_INT64 = 2**63


def json_default(o: Any) -> Any:
    """json.dumps' fallback for values JSON has no type for: their repr."""
    return repr(o)


def text(s: str) -> str:
    """A str SQLite can store. Surrogates cannot be UTF-8: those os.fsdecode makes of bytes
    that are not UTF-8 (a run folder's name) are shown as the byte, \\xNN; any other lone
    surrogate as \\udNNN. Everything else is kept as it is."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return "".join(c if not 0xD800 <= ord(c) <= 0xDFFF
                       else f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF
                       else f"\\u{ord(c):04x}" for c in s)


def bindable(v: Any) -> Any:
    """Any Python value -> one SQLite takes without refusing the row."""
    if v is None or type(v) is float:
        return v
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        if -_INT64 <= v < _INT64:
            return v
        try:
            return float(v)  # a counter past 64 bits: kept as a (rounded) REAL
        except OverflowError:
            return math.copysign(math.inf, v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, str):
        return text(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    for cast in (int, float):  # numpy / torch scalars
        try:
            if cast is int and not float(v).is_integer():
                continue
            return bindable(cast(v))
        except (TypeError, ValueError, OverflowError):
            pass
    return text(limits.quote(v, 200))


def row(args: Iterable[Any]) -> tuple[Any, ...]:
    """A row of bindable values."""
    return tuple(bindable(a) for a in args)


_PLAIN = frozenset({float, bool, type(None)})  # sqlite3 binds these as they are (a bool as 0/1)


def plain_row(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """`row(values)`, fast when every value is already plain (floats, bools, None, ints within
    64 bits: a metrics row, every step): the tuple itself, with no call per value."""
    for v in values:
        t = type(v)
        if t in _PLAIN or (t is int and -_INT64 <= v < _INT64):
            continue
        return row(values)
    return values
