"""The window's Notify field (Apprise URLs for the runs it starts, kept with the form's values) and
its desktop notification when a run it follows diverges or ends while the window is not in front.

The offscreen platform has no system tray, so the tray is a recorder of showMessage calls (the
one stand-in here; the run, the engine's message to a real HTTP server and the window are real)."""
from __future__ import annotations

from typing import Any

import pytest
from app_helpers import discard, run_to_end, start
from test_app_run_tree import DIVERGING

import testkit
from app.model.notes import Note


class Tray:
    """Records showMessage(title, message, icon, ms) as a system tray would show it."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str]] = []

    def showMessage(self, title: str, message: str, *_: Any) -> None:  # noqa: N802 - Qt's name
        self.messages.append((title, message))


@pytest.fixture()
def server():
    """A real HTTP server on 127.0.0.1 keeping every JSON body posted (testkit.json_server)."""
    with testkit.json_server("app") as served:
        yield served


def test_no_tray_no_notification_and_nothing_fails(qtbot, make_window):
    from PySide6.QtWidgets import QSystemTrayIcon
    w = make_window()
    if not QSystemTrayIcon.isSystemTrayAvailable():  # offscreen: no tray
        assert w.desktop_notices.tray is None
    w.desktop_notices.tray = None
    w.desktop_notices.away = lambda: True
    w.desktop_notices.on_alerts([Note("run_failed", 3, 1, "boom")])
    assert w.desktop_notices.shown == []


@pytest.mark.slow
def test_a_run_the_window_starts_notifies_apprise_and_the_desktop(qtbot, make_window, tmp_path, server):
    url, received = server
    run = str(tmp_path / "watched")
    w = make_window()
    tray, notices = Tray(), w.desktop_notices
    notices.tray = tray
    notices.away = lambda: True  # the window is not the active one
    start(w, task=str(DIVERGING), epochs=1, micro_batch=8, accum=2, max_steps=12, run_dir=run,
          task_args={"bad_from": 7, "bad_until": 9, "dropout": 0}, notify=(url,))
    assert w.controls.values()[0]["notify"] == (url,)  # the form's field, kept with its last values
    run_to_end(qtbot, w)
    titles = [t for t, _m in tray.messages]
    assert titles == ["Run watched diverges", "Run watched reached max steps"], tray.messages
    assert tray.messages[0][1].startswith("step 7: ")
    [body] = received  # the engine's own message, through Apprise, from the run the window started
    assert body["title"] == "Headroom: run watched reached its step limit" and f":{run}" in body["message"]

    w.open_run(run)  # the same run's folder read again: its past, not news
    qtbot.wait(200)
    w.tick()
    assert len(tray.messages) == 2
    notices.away = lambda: False  # in front: the alerts panel says it, no notification
    notices.on_alerts([Note("run_failed", 3, 1, "boom")])
    assert len(tray.messages) == 2
    discard(w)
