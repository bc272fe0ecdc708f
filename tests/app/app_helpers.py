"""Helpers for the app tests (imported by name: conftest.py is not importable twice in one run)."""
from __future__ import annotations

import os
from typing import Any, Callable

import testkit
from testkit import ROOT  # noqa: F401 - re-exported: the app tests import it from here

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from app.core import compat  # noqa: E402,F401 - before any widget is painted (see app/core/compat.py)

# A run of mlp that takes about a second per epoch on a small CPU: 4096 samples, 128 per window (32 steps an epoch).
FAST = {"task": "mlp", "micro_batch": 64, "accum": 2, "lr": 1e-3, "clip": 1.0, "device": "cpu"}  # 32 steps an epoch
# 128 steps an epoch: for a test that Stops or Applies "at the next step" once the window has seen a
# few steps, and asserts it landed within the epoch. The engine does not wait for the window, which
# sees steps a frame or more late: 32-step epochs left too little room (CI missed by up to 57 steps).
LONG_EPOCHS = {"micro_batch": 16}


def wait_until(qtbot: Any, cond: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    """Process Qt events until cond() holds (testkit.wait_until, polling every 20 ms)."""
    testkit.wait_until(cond, timeout, what, pause=lambda: qtbot.wait(20))


def run_to_end(qtbot: Any, window: Any, timeout: float = 120.0) -> dict:
    """Wait for the window's run to end (its thread cleaned up) and return the outcome."""
    wait_until(qtbot, lambda: not window.runner.is_busy() and window.run_outcome is not None, timeout,
               "the run to end")
    qtbot.wait(50)
    window.tick()
    return window.run_outcome


def run_button(window: Any, name: str) -> Any:
    """The toolbar button of a Run action ("start", "pause", "resume", "stop"): the one place the
    window shows it as a button."""
    from app.ui.actions import toolbar_button
    return toolbar_button(window.run_toolbar, getattr(window.run_actions, name))


def start(window: Any, **config: Any) -> None:
    """Fill the form (and the flags the form has no widget for) and press Start."""
    cfg = {**FAST, **config}
    window.base_config.update({k: v for k, v in cfg.items()
                               if k in ("max_steps", "seed", "run_dir", "nonfinite", "optimizer")})
    window.controls.set_values(cfg)
    assert window.start_run(), window.last_error


def open_comparing(window: Any, shown: str, *compared: str) -> None:
    """Open `shown` and tick `compared` in Run history's Compare, as a user does."""
    for path in (shown, *compared):
        window.history.add_extra(path)
    window.history.refresh()
    assert window.open_run(shown)
    for path in compared:
        window.history.set_checked(path, True)


def discard(window: Any) -> None:
    """Close an idle window (saving its preferences, as quitting does) and delete it now. A window
    only closed lives on until the test ends: the next window's stylesheet polished all its widgets
    again and its event filters saw every event, which made a second window take twice as long."""
    from PySide6.QtCore import QEvent
    from PySide6.QtWidgets import QApplication
    assert not window.runner.is_busy(), "discard is for a window whose run has ended"
    assert window.close(), "the window did not close"
    window.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
