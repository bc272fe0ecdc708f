"""Work-arounds for bugs in the Qt bindings, each detected before it is applied.

PySide6 6.12 on CPython 3.11: every call to a C++ method that returns void (QPainter.setPen,
QPen.setWidth, ...) hands back None without taking a reference to it. From Python 3.12 on,
None is immortal and this is harmless; on 3.11 None's reference count falls by one per call
until CPython aborts with "Fatal Python error: none_dealloc" (after a minute or two of live
plotting, or at exit). When the drop is measured here, None gets a reference count it
cannot run out of. None is a static object that is never freed, so nothing else changes.
"""
from __future__ import annotations

import sys

BALLAST = 1 << 48  # at a million void calls a second: nine years


def none_refcount_drops() -> int:
    """How far None's reference count falls over 100 calls of a void Qt method."""
    from PySide6.QtCore import QPoint
    p = QPoint()
    before = sys.getrefcount(None)
    for _ in range(100):
        p.setX(1)
    return before - sys.getrefcount(None)


def _add_ballast(obj: object) -> bool:
    import ctypes
    offset = 2 * ctypes.sizeof(ctypes.c_void_p) if hasattr(sys, "getobjects") else 0  # Py_TRACE_REFS builds
    field = ctypes.c_ssize_t.from_address(id(obj) + offset)
    before = sys.getrefcount(obj)
    field.value += BALLAST
    if sys.getrefcount(obj) - before != BALLAST:  # not where we thought: undo, change nothing
        field.value -= BALLAST
        return False
    return True


def guard_none_refcount() -> bool:
    """Apply the ballast if the bug is present on this interpreter. Returns True if applied.

    None and True/False (True leaks the same way, through pyqtgraph's overrides of virtual
    methods): objects CPython 3.11 allocates statically and never frees, so their count
    must never reach zero.
    """
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    if none_refcount_drops() < 50:
        return False
    ok = _add_ballast(None)
    if ok:
        for obj in (True, False):
            _add_ballast(obj)
    return ok


APPLIED = guard_none_refcount()
