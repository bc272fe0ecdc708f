"""Validators: a value the engine would refuse cannot be typed in the first place. The bounds
come from engine/declarations/limits.py (`for_range`), the one declaration the flags and commands use."""
from __future__ import annotations

import math
import re
from typing import Optional

from PySide6.QtCore import QObject
from PySide6.QtGui import QValidator

from engine.declarations.limits import Range

# What a user may be half-way through typing: "", "1", "1.", "1e", "1e-", ".5", ...
_PARTIAL = re.compile(r"^\+?(\d*\.?\d*)([eE][+-]?\d*)?$")
_INT_PARTIAL = re.compile(r"^\+?\d*$")
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
_DEVICE_PARTIAL = re.compile(r"^(a|au|aut|auto|c|cp|cpu|cu|cud|cuda|cuda:|cuda:\d+)?$")


class FloatValidator(QValidator):
    """A finite number >= minimum (and <= maximum, or < it with maximum_open), decimal or 1e-3
    notation, locale-free."""

    def __init__(self, minimum: float = 0.0, maximum: float = math.inf, allow_minimum: bool = True,
                 parent: Optional[QObject] = None, maximum_open: bool = False) -> None:
        super().__init__(parent)
        self.minimum, self.maximum, self.allow_minimum = minimum, maximum, allow_minimum
        self.maximum_open = maximum_open

    def value_ok(self, v: float) -> bool:
        if not math.isfinite(v) or v > self.maximum or (self.maximum_open and v >= self.maximum):
            return False
        return v >= self.minimum if self.allow_minimum else v > self.minimum

    def validate(self, text: str, pos: int):  # noqa: D401 - Qt signature
        t = text.strip()
        if not t:
            return QValidator.State.Intermediate, text, pos
        if not _PARTIAL.match(t):
            return QValidator.State.Invalid, text, pos
        try:
            v = float(t)
        except ValueError:
            return QValidator.State.Intermediate, text, pos  # "1e", "." ...
        if self.value_ok(v):
            return QValidator.State.Acceptable, text, pos
        if v > self.maximum or not math.isfinite(v):
            return QValidator.State.Invalid, text, pos
        return QValidator.State.Intermediate, text, pos  # e.g. "0" on the way to "0.001"

    def fixup(self, text: str) -> str:
        return text.strip()


class IntValidator(QValidator):
    """A whole number from minimum to maximum, any size (QIntValidator stops at 2**31 - 1)."""

    def __init__(self, minimum: int, maximum: int, parent: Optional[QObject] = None) -> None:
        super().__init__(parent)
        self.minimum, self.maximum = minimum, maximum

    def validate(self, text: str, pos: int):  # noqa: D401 - Qt signature
        t = text.strip()
        if not t:
            return QValidator.State.Intermediate, text, pos
        if not _INT_PARTIAL.match(t) or len(t) > len(str(self.maximum)) + 1:
            return QValidator.State.Invalid, text, pos
        if t == "+":
            return QValidator.State.Intermediate, text, pos
        v = int(t)
        if v > self.maximum:
            return QValidator.State.Invalid, text, pos
        return (QValidator.State.Acceptable if v >= self.minimum else QValidator.State.Intermediate), text, pos

    def fixup(self, text: str) -> str:
        return text.strip()


def for_range(r: Range, parent: Optional[QObject] = None) -> QValidator:
    """The validator of a setting's declared range (engine/declarations/limits.py)."""
    if r.kind is int:
        return IntValidator(int(r.low), int(r.high), parent)
    return FloatValidator(float(r.low), float(r.high), parent=parent, maximum_open=r.high_open)


class DeviceValidator(QValidator):
    """auto, cpu, cuda or cuda:N (what engine.declarations.config.check_device_name accepts)."""

    def validate(self, text: str, pos: int):
        t = text.strip()
        if _DEVICE.match(t):
            return QValidator.State.Acceptable, text, pos
        if _DEVICE_PARTIAL.match(t):
            return QValidator.State.Intermediate, text, pos
        return QValidator.State.Invalid, text, pos


def parse_float(text: str) -> Optional[float]:
    try:
        v = float(text.strip())
    except ValueError:
        return None
    return v if math.isfinite(v) else None
