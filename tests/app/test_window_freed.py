"""A window closed, and a canvas a theme switch replaced, leave no widget behind.

pyqtgraph makes each plot's context menus with no parent, and their connections back to the plot
kept every dropped canvas alive (385 widgets a canvas, out of the garbage collector's sight): every
later stylesheet polished them again, so a theme switch, and every window a test worker made,
grew slower with each canvas dropped before it."""
from __future__ import annotations

import gc

from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication


def widgets_alive() -> int:
    app = QApplication.instance()
    app.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()
    app.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    return len(app.allWidgets())


def test_a_closed_window_and_its_dropped_canvases_are_freed(qtbot, monkeypatch):
    """The app-wide stylesheet is left as it is: each theme switch's setStyleSheet polished every
    widget again (5 of the test's 15 s each on CI) and makes or keeps no widget; the canvas the
    switch replaces, which is what is counted, is made as the app makes it."""
    import app.main_window
    from app.main_window import MainWindow
    monkeypatch.setattr(app.main_window, "apply_stylesheet", lambda theme: None)
    before = widgets_alive()
    w = MainWindow(restore_settings=False, theme="light")
    w.show()
    assert w.plots is not None  # the plots built
    w.set_theme("dark")  # a new canvas: the first one is dropped
    after_one_switch = widgets_alive()
    w.set_theme("light")
    assert widgets_alive() == after_one_switch  # the canvas dropped went
    w.close()
    w.deleteLater()
    del w
    assert widgets_alive() == before
