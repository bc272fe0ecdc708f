"""Closing the window while its run trains asks (Stop and quit / Cancel), with "Don't ask
again" kept in the preferences and File > "Ask before closing during a run" to turn it back
on; Ctrl+Q asks the same; a window without the user's preferences (tests) never asks."""
from __future__ import annotations

import os

import pytest
from app_helpers import discard, run_to_end, start, wait_until
from PySide6.QtWidgets import QMessageBox


@pytest.mark.slow
def test_closing_during_a_run_asks_and_dont_ask_again_is_kept(qtbot, make_window, tmp_path):
    w = make_window(restore_settings=True)
    run = tmp_path / "run"
    start(w, epochs=50, run_dir=str(run))
    wait_until(qtbot, lambda: w.model.step >= 3, 90, "a few steps")
    assert not w.close()  # asked, not closed
    box = w.close_question.box
    assert box is not None and box.isVisible() and "Stop it" in box.text()
    assert w.is_running()
    box.button(QMessageBox.StandardButton.Cancel).click()  # Cancel: it goes on
    assert w.isVisible() and w.is_running() and w.close_question.box is None
    w.app_actions.quit.trigger()  # Ctrl+Q asks the same
    box = w.close_question.box
    assert box is not None
    w.close_question.dont_ask.setChecked(True)
    w.close_question.stop_button.click()  # Stop and quit
    wait_until(qtbot, lambda: not w.isVisible() and not w.runner.is_busy(), 30, "the window to close")
    assert os.path.exists(run / "checkpoints" / "last.pt")  # stopped with a checkpoint
    assert not w.app_actions.ask_close.isChecked()
    discard(w)
    # The next launch does not ask; the File menu's check turns it back on.
    w2 = make_window(restore_settings=True)
    assert not w2.app_actions.ask_close.isChecked()
    start(w2, epochs=50, run_dir=str(tmp_path / "run2"))
    wait_until(qtbot, lambda: w2.model.step >= 2, 90, "a few steps")
    assert w2.close() and not w2.runner.is_busy()  # closed at once, the run stopped
    w2.app_actions.ask_close.setChecked(True)
    discard(w2)
    assert make_window(restore_settings=True).close_question.enabled()


@pytest.mark.slow
def test_a_window_without_the_users_preferences_never_asks(qtbot, make_window, tmp_path):
    w = make_window()  # restore_settings=False: tests, benchmarks
    start(w, epochs=50, run_dir=str(tmp_path / "run"))
    wait_until(qtbot, lambda: w.model.step >= 2, 90, "a few steps")
    assert w.close() and w.close_question.box is None
    run_to_end(qtbot, w, 30)
