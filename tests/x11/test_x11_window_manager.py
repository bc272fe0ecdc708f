"""The X11 phase's ground: under a real X server the window manager frames the window at the size
asked (the frame does not count into it), the window is exposed and active, and keys typed reach
the field that has the focus. Offscreen, the same window is at its size, exposed and active too."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QLineEdit
from x11_window import on_x11

pytestmark = pytest.mark.x11


def test_the_window_is_shown_active_at_the_size_asked_and_takes_keys(qtbot, window):
    w = window(size=(1024, 640))
    assert w.size().toTuple() == (1024, 640)
    assert w.windowHandle().isExposed()
    assert QApplication.activeWindow() is w
    if on_x11():  # the window manager's frame (title bar, borders) comes on top of the client area
        frame = w.frameGeometry()
        assert frame.height() > w.height() and frame.width() >= w.width(), (frame, w.geometry())
    field = w.controls.findChild(QLineEdit, "task_args")
    qtbot.mouseClick(field, Qt.MouseButton.LeftButton)
    assert field.hasFocus()
    qtbot.keyClicks(field, "a=1")
    assert field.text() == "a=1"
