"""The mouse wheel over an unfocused spin box or list scrolls the Controls panel and changes
no setting; once the field has the focus (a click, Tab) the wheel steps it."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication, QScrollArea


def wheel(target, notches: int = -1) -> None:
    """A wheel turn over the middle of a field (where Qt hands it: a spin box's line edit passes
    the wheel on to the spin box)."""
    pos = QPointF(target.rect().center())
    ev = QWheelEvent(pos, QPointF(target.mapToGlobal(pos.toPoint())), QPoint(0, 0), QPoint(0, 120 * notches),
                     Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(target, ev)


@pytest.mark.slow
def test_the_wheel_over_an_unfocused_field_changes_nothing(qtbot, make_window):
    w = make_window()
    w.resize(1024, 640)  # the Controls panel scrolls
    c = w.controls
    c.accum.setValue(4)
    c.lr_schedule.setCurrentIndex(c.lr_schedule.findData("constant"))
    w.controls.task.setFocus()
    qtbot.wait(50)
    bar = w.controls_dock.findChild(QScrollArea).verticalScrollBar()  # the panel's (Apply is pinned under it)
    before = bar.value()
    for field in (c.accum, c.micro_batch, c.epochs, c.lr_schedule):
        assert field.focusPolicy() == Qt.FocusPolicy.StrongFocus
        wheel(field)
    assert c.accum.value() == 4 and c.lr_schedule.currentData() == "constant"
    assert bar.value() != before or bar.maximum() == 0  # the panel scrolled instead
    c.accum.setFocus()
    qtbot.wait(50)
    assert c.accum.hasFocus()
    wheel(c.accum, notches=1)
    assert c.accum.value() == 5  # focused: the wheel steps it, as usual
