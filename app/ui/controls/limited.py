"""Form fields bounded by the engine's declared ranges (engine/declarations/limits.py), so the app, the
command line and run.db commands accept exactly the same values.

Typing cannot leave the range (the spin box's bounds, the line edit's validator). A value
given from outside the form (the command line, the saved preferences, a script) that is
out of range is never clamped into it: the field keeps it as refused, and the form is
refused with the engine's own line, the one the CLI prints after `error:`.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from PySide6.QtWidgets import QLineEdit, QSpinBox, QWidget

from engine.declarations import limits
from engine.declarations.config import RANGES
from engine.declarations.settings import BY_NAME

from .validators import for_range


def _mark(w: QWidget, refused: str) -> None:
    """Show a refused value: the stylesheet's red "invalid" look, the reason as the tooltip."""
    if w.property("invalid") != bool(refused):
        w.setProperty("invalid", bool(refused))
        w.style().unpolish(w)
        w.style().polish(w)


def engine_refusal(name: str, value: Any) -> str:
    """The engine's one line for `value` of setting `name`, or "" if it is in range."""
    try:
        RANGES[name].check(value)
    except limits.LimitError as e:
        return str(e)
    return ""


def blank_text(name: str) -> str:
    """What a number field says when its text is not a number: its label (else its flag) and
    the range, e.g. 'Clip norm: enter a finite number from 0 to 1000000 (0 = off)'."""
    s, r = BY_NAME.get(name), RANGES[name]
    return f"{s.label if s and s.label else r.flag}: enter {r.describe()}" + (f" ({r.note})" if r.note else "")


def number_text(v: float) -> str:
    """A number for a text field: exact enough to read back as the same value (12 digits)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    if math.isfinite(v) and float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.12g}"


class LimitedSpin(QSpinBox):
    """An integer setting. With `auto_text`, one step below the range means None ("auto")."""

    def __init__(self, name: str, value: Optional[int], auto_text: str = "", parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.name, self.range = name, RANGES[name]
        self.auto = bool(auto_text)
        self.refusal = ""
        self.setRange(int(self.range.low) - (1 if self.auto else 0), int(self.range.high))
        if self.auto:
            self.setSpecialValueText(auto_text)
        self.valueChanged.connect(lambda _v: self._refuse(""))
        self.editingFinished.connect(lambda: self._refuse(""))  # the user took the value shown
        self.set_given(value)

    def set_given(self, value: Any) -> None:
        """Show a value; one out of the engine's range is kept as refused instead."""
        if value is None and self.auto:
            self.setValue(self.minimum())
            self._refuse("")
            return
        refusal = engine_refusal(self.name, value)
        if refusal:
            self._refuse(refusal)
            return
        self.setValue(int(value))
        self._refuse("")

    def given(self) -> Optional[int]:
        """The value (None for "auto"); check problem() first."""
        return None if self.auto and self.value() == self.minimum() else self.value()

    def problem(self) -> str:
        return self.refusal

    def _refuse(self, text: str) -> None:
        self.refusal = text
        _mark(self, text)


class LimitedLine(QLineEdit):
    """A number setting typed as text (floats, and integers past a spin box's 2**31)."""

    def __init__(self, name: str, value: Optional[float], optional: bool = False, blank: str = "",
                 parent: Optional[QWidget] = None) -> None:
        """optional: empty means None (off); blank: what to say when the text is not a number."""
        super().__init__(parent)
        self.name, self.range = name, RANGES[name]
        self.optional = optional
        self.blank = blank or blank_text(name)
        self.setValidator(for_range(self.range, self))
        self.textChanged.connect(lambda _t: _mark(self, self._out_of_range()))
        self.set_given(value)

    def set_given(self, value: Any) -> None:
        """Show a value as it is, even out of range (then problem() says the engine's line)."""
        if value is None:
            self.setText("")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            self.setText(number_text(value))
        else:
            self.setText(str(value))
        _mark(self, self._out_of_range())

    def _parse(self) -> Optional[float]:
        t = self.text().strip()
        try:
            v: Any = int(t) if self.range.kind is int else float(t)
        except ValueError:
            return None
        return v if self.range.kind is int or math.isfinite(v) else None

    def _out_of_range(self) -> str:
        v = self._parse()
        return engine_refusal(self.name, v) if v is not None else ""

    def problem(self) -> str:
        """Why the form cannot use this field now ("" if it can)."""
        if not self.text().strip():
            return "" if self.optional else self.blank
        v = self._parse()
        if v is None:
            return self.blank
        return engine_refusal(self.name, v)

    def given(self) -> Optional[Any]:
        """The value (None when empty, or when there is a problem)."""
        if self.problem() or not self.text().strip():
            return None
        return self._parse()
