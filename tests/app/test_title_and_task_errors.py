"""Smaller things seen on screen: "Headroom" once in the window's title (Qt appends the application
display name to a title that does not end with it: "Headroom - run — Headroom"), and a task's
error names the task file's line, in the window's dialog and in the engine's `error:` line."""
from __future__ import annotations

import pytest
from app_helpers import run_to_end, start
from app_tasks import tiny_task
from PySide6.QtWidgets import QApplication
from test_window_layout import synthetic_run

from engine_in_process import engine

BAD_BUILD = """import torch
from engine import Task


def data():
    raise ValueError("no data in /nowhere")


def build_task(seed):
    return Task(model=torch.nn.Linear(2, 2), train_data=data(), loss=None)
"""


def shown_title(title: str) -> str:
    """The title the window manager shows: Qt's rule (QPlatformWindow::formatWindowTitle, used by
    xcb, Wayland and Windows) appends " — " and the display name unless the title ends with it."""
    name = QApplication.applicationDisplayName()
    return title if title.endswith(name) else f"{title} \u2014 {name}"


def line_of(path: str, text: str) -> int:
    return next(i for i, line in enumerate(open(path, encoding="utf-8"), 1) if text in line)


def test_the_title_names_headroom_once(qtbot, make_window, tmp_path):
    before = QApplication.applicationDisplayName()
    QApplication.setApplicationDisplayName("Headroom")  # as app/main.py sets it
    try:
        w = make_window()
        assert shown_title(w.windowTitle()) == "Headroom"
        assert w.open_run(synthetic_run(tmp_path / "run"))
        assert w.windowTitle() == "run - Headroom"
        assert shown_title(w.windowTitle()).count("Headroom") == 1
    finally:
        QApplication.setApplicationDisplayName(before)


@pytest.mark.slow
def test_a_task_error_names_the_task_files_line(qtbot, make_window, tmp_path):
    bad = tmp_path / "bad_build.py"
    bad.write_text(BAD_BUILD)
    where = f"{bad}:{line_of(str(bad), 'raise ValueError')} in data"
    w = make_window()
    start(w, task=str(bad))
    assert run_to_end(qtbot, w, 90)["status"] == "bad_input"
    title, message = w.last_error
    assert "ValueError: no data in /nowhere" in message and where in message, message
    w.dialogs[0].accept()

    task = tiny_task(tmp_path, raise_at=1)  # the loss raises at the first training micro-batch
    start(w, task=task, epochs=1, run_dir=str(tmp_path / "run"))
    assert run_to_end(qtbot, w, 90)["status"] == "failed"
    title, message = w.last_error
    assert title == "The run failed" and "RuntimeError: boom in the task's loss" in message
    assert f"tiny.py:{line_of(task, 'raise RuntimeError')} in loss" in message, message

    # The engine's command line says the same (engine.cli.main in this process: engine_in_process).
    r = engine("--task", str(bad), "--device", "cpu", "--run-dir", str(tmp_path / "cli"))
    assert r.returncode == 2 and r.stderr.startswith("error: ") and where in r.stderr, r.stderr
