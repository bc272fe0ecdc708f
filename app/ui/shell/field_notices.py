"""A field says what it refused. Typing into a number field goes through the engine's range
(app/ui/controls/limited.py): a keystroke that would leave it ("-" in a learning rate, a
letter) is not taken. That used to happen without a word ("-0.5" became 0.5, "abc" nothing).
Now the field shows, in a tooltip at the field, what was not taken and the range it keeps
to; and a learning rate of 0, which is in range, is said to train nothing.

One application event filter remembers the last key pressed in a line edit; the line edit's
inputRejected signal (its validator refused that key) then says so. Every field of the
Controls panel is covered, present and future, without the fields knowing.

A notice about a field's value follows the value at every change, however it is set (typed, a
loaded run's settings, Reset to defaults): the learning-rate-0 notice used to be said on a
keystroke only, and stayed up as the tooltip after the value was no longer 0."""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QEvent, QObject, QPoint
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QAbstractSpinBox, QFormLayout, QLabel, QLineEdit, QToolTip, QWidget

from app.model.fields import words
from engine.declarations.config import RANGES

LR_ZERO = "Learning rate 0: the weights will not change (the run trains nothing)"


def field_of(edit: QLineEdit) -> QWidget:
    """The setting's widget: a spin box for its inner line edit, else the line edit."""
    parent = edit.parentWidget()
    return parent if isinstance(parent, QAbstractSpinBox) else edit


def form_label(field: QWidget) -> str:
    """The text beside the field in its form ('Learning rate'), or ''."""
    holder = field.parentWidget()
    lay = holder.layout() if holder is not None else None
    if isinstance(lay, QFormLayout):
        label = lay.labelForField(field)
        if isinstance(label, QLabel):
            return label.text().replace("&", "")
    return ""


def refusal_text(field: QWidget, typed: str) -> str:
    name = str(getattr(field, "name", "") or "")
    label = form_label(field) or (words(name) if name else "This field")
    rule = RANGES[name].describe() if name in RANGES else "a valid value"
    shown = repr(typed) if typed.strip() else "that key"
    return f"{label[:1].upper()}{label[1:]}: {shown} not taken. It takes {rule}."


class FieldNotices(QObject):
    def __init__(self, root: QWidget) -> None:
        """root: the panel whose fields are watched (their line edits' rejected input)."""
        super().__init__(root)
        self.root = root
        self.last = ""  # the last notice shown (tests read it)
        self.shown = ""  # the notice up now ("" when none is)
        self._typed: dict[int, str] = {}
        self._hooked: set[int] = set()
        self.hook()
        lr = getattr(root, "lr", None)
        if isinstance(lr, QLineEdit):
            lr.textChanged.connect(lambda _t: self._lr_zero(lr))  # every change: typed or set

    def hook(self) -> None:
        """Watch every line edit under the panel (call again after fields are added)."""
        for edit in self.root.findChildren(QLineEdit):
            if id(edit) in self._hooked:
                continue
            self._hooked.add(id(edit))
            edit.installEventFilter(self)
            edit.inputRejected.connect(lambda e=edit: self._rejected(e))

    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:  # noqa: N802 - Qt name
        if ev.type() == QEvent.Type.KeyPress and isinstance(ev, QKeyEvent):
            self._typed[id(obj)] = ev.text()
        return False

    def _rejected(self, edit: QLineEdit) -> None:
        self.say(field_of(edit), refusal_text(field_of(edit), self._typed.get(id(edit), "")))

    def _lr_zero(self, edit: QLineEdit) -> None:
        """Say the notice while the value is 0; take it down as soon as it is not (a half-typed
        "0." is still 0; "0.001" is not; "" is no value at all)."""
        try:
            zero = float(edit.text()) == 0.0
        except ValueError:
            zero = False
        if zero:
            if self.shown != LR_ZERO:
                self.say(edit, LR_ZERO)
        elif self.shown == LR_ZERO:
            self.unsay()

    def say(self, field: QWidget, text: str, where: Optional[QPoint] = None) -> None:
        self.last = self.shown = text
        if field.isVisible():  # a tooltip at a hidden field would show at the screen's corner
            QToolTip.showText(where or field.mapToGlobal(QPoint(0, field.height())), text, field)

    def unsay(self) -> None:
        """Take down the notice up now (only ours: another widget's tooltip is left alone)."""
        if QToolTip.isVisible() and QToolTip.text() == self.shown:
            QToolTip.hideText()
        self.shown = ""
