"""An exception raised in a slot of the window (an action's handler, a signal's lambda) is not a
traceback on a terminal the user never sees: headroom.log has the traceback, the Alerts panel a
row that says it, and the window goes on (app/core/logs.py: one sys.excepthook, installed once)."""
from __future__ import annotations

import sys

import pytest


def boom() -> None:
    raise ValueError("Could not determine index of item <FittingPlot>")


def window_errors(w) -> list[str]:
    return [message for kind, _step, message in w.alerts.rows() if kind == "window_error"]


@pytest.mark.slow
@pytest.mark.qt_no_exception_capture  # the window's hook is the one under test, not pytest-qt's
def test_an_exception_in_a_slot_is_logged_and_alerted_and_the_window_goes_on(qtbot, make_window, tmp_path):
    w = make_window()
    hook = sys.excepthook
    closed = make_window()
    assert sys.excepthook is hook and getattr(hook, "headroom_hook", False)  # once, not per window or slot
    closed.close()
    w.app_actions.fit.triggered.connect(lambda *_: boom())
    w.app_actions.fit.trigger()  # PySide6 hands the exception to sys.excepthook and returns
    log = (tmp_path / "headroom.log").read_text(encoding="utf-8")
    assert "uncaught exception" in log and "Traceback" in log and "in boom" in log
    errors = window_errors(w)
    assert len(errors) == 1 and "ValueError: Could not determine index" in errors[0], w.alerts.rows()
    assert str(tmp_path / "headroom.log") in errors[0]  # where the details are
    assert window_errors(closed) == []  # a closed window is told nothing
    # The window goes on: its actions work, and so does its timer's tick.
    w.app_actions.log_scale.trigger()
    assert w.log_action.isChecked()
    w.app_actions.fit.triggered.disconnect()
    w.app_actions.fit.triggered.connect(lambda *_: w.plots.fit())
    w.app_actions.fit.trigger()
    w.tick()
    assert len(window_errors(w)) == 1
