"""Showing the real window as a person gets it, on either platform: under X11 (QT_QPA_PLATFORM=xcb,
a window manager running: `make test-x11`) the window manager decides when the window is
mapped, exposed, active and what size it really has; offscreen, Qt does at once. And what the
window shows, read back as pixels and rectangles; and a window that lasts for a module's tests.

Imported by name (`from x11_window import ...`): tests/x11 is on sys.path for its test files.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import numpy as np
import pytest
from PySide6.QtCore import QPoint, QRect
from PySide6.QtGui import QColor, QGuiApplication, QImage
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QAbstractScrollArea, QWidget

import testkit

SIZE_TIMEOUT_S = 5.0  # the window manager answers a resize in milliseconds; a loaded machine, later


def on_x11() -> bool:
    return QGuiApplication.platformName() == "xcb"


def wait_until(cond: Any, timeout: float = 20.0, what: str = "") -> Any:
    """Process Qt events until cond() holds (testkit.wait_until, polling every 20 ms)."""
    return testkit.wait_until(cond, timeout, what, pause=lambda: QTest.qWait(20))


def wait_quietly(cond: Any, timeout: float) -> bool:
    """Process Qt events until cond() holds or `timeout` passes; the caller asserts (and says why)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        QTest.qWait(20)
    return True


def show_active(w: QWidget, size: Optional[tuple[int, int]] = None) -> None:
    """Show `w` (at `size`: its client area, what QWidget.resize sets; the window manager's frame
    comes on top), wait until it is exposed, then activate it and wait until it is the active
    window: under a window manager a key click reaches a window's shortcuts only then."""
    if size is not None:
        w.resize(*size)
    w.show()
    assert QTest.qWaitForWindowExposed(w, 10_000), "the window was never exposed"
    w.raise_()
    w.activateWindow()
    assert QTest.qWaitForWindowActive(w, 10_000), "the window never became the active one"
    if size is not None:  # the window manager's answer to the resize (the test asserts what it got)
        wait_quietly(lambda: w.size().toTuple() == tuple(size), SIZE_TIMEOUT_S)


def settle(w: Any, timeout: float = 20.0) -> None:
    """Until the plots are built and the window's geometry (its docks, the plots) has stopped changing."""
    wait_until(lambda: w._plots is not None and w._plots.isVisible(), timeout, "the plots")
    last, same, deadline = None, 0, time.monotonic() + timeout
    while same < 4:
        assert time.monotonic() < deadline, "the layout never settled"
        QTest.qWait(40)
        now = (w.size().toTuple(), w.centralWidget().geometry().getRect(), w.alerts_dock.geometry().getRect(),
               w.controls_dock.geometry().getRect(), w.plots.canvas.ci.geometry().getRect())
        same = same + 1 if now == last else 0
        last = now


def rect_in(widget: QWidget, ancestor: QWidget) -> QRect:
    """`widget`'s rectangle in `ancestor`'s coordinates."""
    return QRect(widget.mapTo(ancestor, QPoint(0, 0)), widget.size())


def shown_whole(widget: QWidget, window: QWidget) -> bool:
    """Visible, inside the window, and inside every scroll area's viewport around it (not scrolled
    away, not below the fold)."""
    if not widget.isVisible() or not window.rect().contains(rect_in(widget, window)):
        return False
    parent = widget.parentWidget()
    while parent is not None and parent is not window:
        if isinstance(parent, QAbstractScrollArea):
            vp = parent.viewport()
            if not vp.rect().contains(rect_in(widget, vp)):
                return False
        parent = parent.parentWidget()
    return True


def text_cut(label: Any) -> bool:
    """The label's text is wider than the room it has (it is elided, or clipped)."""
    return label.fontMetrics().horizontalAdvance(label.text()) > label.contentsRect().width()


def pixels(widget: QWidget, part: Optional[QWidget] = None) -> np.ndarray:
    """The widget as painted now, or the part of it where a child (`part`) is: an (h, w, 3) RGB
    array. A child is grabbed through its window, with what its parents paint under it (a child
    grabbed alone has no background where it paints none: undefined pixels)."""
    shot = widget.grab() if part is None else widget.grab(rect_in(part, widget))
    img = shot.toImage().convertToFormat(QImage.Format.Format_RGB888)
    arr = np.frombuffer(img.constBits(), np.uint8, img.sizeInBytes()).reshape(img.height(), img.bytesPerLine())
    return arr[:, : img.width() * 3].reshape(img.height(), img.width(), 3).copy()  # img's memory goes with img


def near(rgb: np.ndarray, colour: str, tolerance: int = 24) -> np.ndarray:
    """Mask of the pixels within `tolerance` of `colour` in every channel."""
    c = QColor(colour)
    want = np.array([c.red(), c.green(), c.blue()], dtype=np.int16)
    return (np.abs(rgb.astype(np.int16) - want) <= tolerance).all(axis=-1)


def colours(rgb: np.ndarray) -> int:
    """How many distinct colours a picture has (1: nothing drawn on a plain background)."""
    return len(np.unique(rgb.reshape(-1, 3), axis=0))


def inside_screen(w: QWidget, widgets: Iterable[QWidget] = ()) -> list[str]:
    """What is outside the available area of the window's screen: the window's frame, or a widget."""
    screen = w.screen().availableGeometry()
    out = []
    if not screen.contains(w.frameGeometry()):
        out.append(f"window frame {w.frameGeometry().getRect()} outside the screen {screen.getRect()}")
    for child in widgets:
        if child.isVisible() and not screen.contains(QRect(child.mapToGlobal(QPoint(0, 0)), child.size())):
            out.append(f"{child.objectName() or type(child).__name__} outside the screen {screen.getRect()}")
    return out


@contextlib.contextmanager
def lasting_window(base: Path, size: tuple[int, int]) -> Iterator[Any]:
    """A window for several tests in turn (a module-scoped fixture: one window, not one a test),
    shown at `size`, its preferences, runs folder and log under `base`, closed at the end."""
    from app.main_window import MainWindow
    with pytest.MonkeyPatch.context() as mp:
        for k, v in testkit.isolated_env(base).items():
            mp.setenv(k, v)
        w = MainWindow(base_config={}, restore_settings=False)
        try:
            show_active(w, size)
            yield w
        finally:
            w.close()
            if w.runner.is_busy():
                assert w.runner.join(10.0), "engine thread did not stop"
            w.deleteLater()
