"""A task that fails to load is a dialog, not a crash, and the app stays usable; an error
inside the engine thread reaches the GUI as a dialog with the message (traceback in the log)."""
from __future__ import annotations

import os

import pytest
from app_helpers import run_button, run_to_end, start
from app_tasks import broken_task, tiny_task


@pytest.mark.slow
def test_bad_task_file_shows_an_error_and_the_app_stays_usable(qtbot, make_window, tmp_path):
    w = make_window()
    start(w, task=broken_task(tmp_path))
    outcome = run_to_end(qtbot, w, 60)
    assert outcome["status"] == "bad_input"
    title, message = w.last_error
    assert title == "Could not start the run"
    assert "broken.py" in message and "syntax error" in message and "line 3" in message
    assert "Traceback" not in message
    assert len(w.dialogs) == 1 and w.dialogs[0].isVisible()
    assert run_button(w, "start").isEnabled() and w.controls.state == "idle"
    assert not os.path.exists(tmp_path / "runs") or not os.listdir(tmp_path / "runs")  # nothing written
    w.dialogs[0].accept()
    qtbot.wait(50)
    # Still usable: the same window trains mlp.
    start(w, task="mlp", max_steps=3, epochs=1)
    outcome = run_to_end(qtbot, w, 90)
    assert outcome["status"] == "finished" and w.model.step == 3


@pytest.mark.slow
def test_error_in_the_engine_thread_is_a_dialog_with_the_message(qtbot, make_window, tmp_path):
    # 1024 samples, 2 micro-batches a step: loss call 5 raises, in step 3.
    task = tiny_task(tmp_path, raise_at=5)
    w = make_window()
    start(w, task=task, epochs=1, run_dir=str(tmp_path / "run"))
    outcome = run_to_end(qtbot, w, 60)
    assert outcome["status"] == "failed"
    title, message = w.last_error
    assert title == "The run failed"
    assert "RuntimeError: boom in the task's loss" in message
    assert "Traceback" not in message and "headroom.log" in message
    log = (tmp_path / "headroom.log").read_text()
    assert "Traceback" in log and "boom in the task's loss" in log
    assert w.model.state == "failed" and "run_failed" in w.alerts.kinds()
    assert w.model.step == 2
    assert run_button(w, "start").isEnabled()
