"""The keyboard: Help > Keyboard shortcuts lists every shortcut the window has (read from its
actions, whose keys come from app/core/shortcuts.py); the window's shortcuts work while a field
of the Controls panel has the focus, also where the platform gives the field the same key (X11:
Ctrl+E is a line edit's "end of line"); after Ctrl+Return (Apply) the focus leaves the field."""
from __future__ import annotations

import pytest
from app_helpers import wait_until
from live_folder import LiveFolder
from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QFileDialog

from app.core.shortcuts import SHORTCUTS
from engine.declarations.commands import setting_change


class LikeX11(QObject):
    """What a line edit does with Ctrl+E on X11 (its "end of line"), on any platform: it claims
    the key (ShortcutOverride) before a shortcut sees it. The offscreen platform's fields claim
    none of the window's keys; a real X server's do (tests/x11)."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.keys = keys
        self.claimed = 0

    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:  # noqa: N802 - Qt name
        if ev.type() == QEvent.Type.ShortcutOverride and QKeySequence(ev.keyCombination()).toString() in self.keys:
            self.claimed += 1
            ev.accept()
            return True
        return False


def press(widget, keys: str) -> None:
    """The keys (one QKeySequence, as SHORTCUTS writes it) typed into `widget`."""
    combo = QKeySequence(keys)[0]
    QTest.keyClick(widget, combo.key(), combo.keyboardModifiers())


def test_help_lists_every_shortcut_of_the_window(qtbot, make_window):
    w = make_window()
    dlg = w.show_shortcuts()
    assert dlg.isVisible() and w.app_actions.shortcuts in w.menuBar().actions()[-1].menu().actions()
    shown = {keys for _menu, _what, keys in dlg.texts()}
    native = {QKeySequence(k).toString(QKeySequence.SequenceFormat.NativeText) for k in SHORTCUTS.values()}
    assert native <= shown  # every key of app/core/shortcuts.py
    with_keys = {a.text().replace("&", "").removesuffix("...") for a in w.findChildren(QAction)
                 if not a.shortcut().isEmpty()}
    assert with_keys == {what for _menu, what, _keys in dlg.texts()}  # and every action that has one, once
    assert ("File", "Export metrics (CSV)", "Ctrl+E") in dlg.texts()
    dlg.close()


@pytest.mark.slow
def test_shortcuts_work_in_a_field_and_apply_leaves_it(qtbot, make_window, tmp_path, monkeypatch):
    run = LiveFolder(tmp_path / "live")  # a run another process trains: the form steers it
    try:
        w = make_window()
        w.activateWindow()
        assert w.open_run(run.run_dir)
        wait_until(qtbot, lambda: w.ui_state() == "training" and w.model.step == 20, 20, "the live run")
        asked: list[str] = []

        def cancelled(_parent, caption, *_a, **_k):  # the file dialog the action opens, cancelled
            asked.append(caption)
            return "", ""
        monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(cancelled))
        c = w.controls
        for field in (c.lr, c.accum):  # a line edit, a spin box
            claim = LikeX11((SHORTCUTS["export_csv"],))
            field.installEventFilter(claim)
            field.setFocus()
            qtbot.waitUntil(field.hasFocus)
            before = len(asked)
            press(QApplication.focusWidget(), SHORTCUTS["export_csv"])  # Ctrl+E: Export metrics
            press(QApplication.focusWidget(), SHORTCUTS["export_png"])  # Ctrl+Shift+E: Export plots
            assert asked[before:] == ["Export metrics", "Export plots"], (field.objectName(), asked)
            assert claim.claimed == 0  # the field never got to claim the window's key
            theme = w.theme
            press(QApplication.focusWidget(), SHORTCUTS["theme"])  # Ctrl+T
            assert w.theme != theme and field.hasFocus()
            field.removeEventFilter(claim)

        c.lr.setFocus()
        qtbot.waitUntil(c.lr.hasFocus)
        c.lr.selectAll()
        QTest.keyClicks(c.lr, "0.0005")
        assert w.apply_action.isEnabled(), c.edits()
        press(c.lr, SHORTCUTS["apply"])  # Ctrl+Return in the field: Apply
        assert not c.lr.hasFocus() and not w.controls_dock.isAncestorOf(QApplication.focusWidget())
        QTest.keyClicks(w, "7")  # typing on edits nothing that was sent
        assert c.lr.text() == "0.0005"
        sent = [setting_change(s.command) for s in w.session.sent]
        assert [(setting.name, value) for setting, value in filter(None, sent)] == [("lr", 0.0005)]
    finally:
        run.end()
