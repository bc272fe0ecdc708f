"""Stop, window close and Ctrl+C during a run: stopped at the next step, checkpoint written,
thread joined within 2 s, a clean exit."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from app_helpers import ROOT, run_button, run_to_end, start, wait_until
from app_tasks import loading_mark, slow_task

import testkit
from engine.store import RunReader

pytestmark = pytest.mark.slow  # real runs, signals and subprocesses


def _checkpoint_step(run_dir) -> int:
    import torch  # here, not at the top: collecting this file imported torch (3.9 s on CI)
    state = torch.load(os.path.join(run_dir, "checkpoints", "last.pt"), weights_only=True)
    return int(state["step"])


def test_stop_button_ends_the_run_with_a_checkpoint(qtbot, make_window, tmp_path):
    w = make_window()
    run_dir = tmp_path / "run"
    start(w, epochs=50, run_dir=str(run_dir))
    wait_until(qtbot, lambda: w.model.step >= 3, 90, "a few steps")
    assert run_button(w, "stop").isEnabled()
    run_button(w, "stop").click()
    assert w.ui_state() == "stopping"
    outcome = run_to_end(qtbot, w, 30)
    assert outcome == {**outcome, "status": "finished", "reason": "stopped"}
    reader = RunReader(str(run_dir))
    last_step = reader.metrics()[-1]["step"]
    finished = reader.events(kinds=["run_finished"])
    reader.close()
    assert finished and finished[-1]["data"]["reason"] == "stopped"
    assert _checkpoint_step(run_dir) == last_step == w.model.step
    assert w.model.step < 50 * 32
    assert run_button(w, "start").isEnabled() and not run_button(w, "stop").isEnabled()


def test_closing_the_window_during_a_run_joins_within_2s(qtbot, make_window, tmp_path, qtlog):
    w = make_window()
    run_dir = tmp_path / "run"
    start(w, epochs=50, run_dir=str(run_dir))
    wait_until(qtbot, lambda: w.model.step >= 3, 90, "a few steps")
    t0 = time.perf_counter()
    assert w.close()
    took = time.perf_counter() - t0
    assert took < 2.0, took
    assert not w.runner.is_busy() and not w.isVisible()
    assert _checkpoint_step(run_dir) >= 3
    reader = RunReader(str(run_dir))
    assert reader.info()["status"] == "finished"
    assert reader.events(kinds=["run_finished"])[-1]["data"]["reason"] == "stopped"
    reader.close()
    assert not [m for m in qtlog.records if "Destroyed while thread" in m.message]


def test_ctrl_c_in_the_terminal_closes_cleanly(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.Popen([sys.executable, "-m", "app", "--task", "mlp", "--epochs", "50", "--micro-batch", "64",
                             "--accum", "2", "--device", "cpu", "--autostart", "--run-dir", str(run_dir)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.communicate()
            if (run_dir / "run.db").exists():
                try:
                    reader = RunReader(str(run_dir))
                    n = len(reader.metrics())
                    reader.close()
                    if n >= 2:
                        break
                except Exception:
                    pass
            assert time.monotonic() < deadline, "the app never started training"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "QThread" not in err and "Traceback" not in err and "Fatal" not in err, err
    assert _checkpoint_step(run_dir) >= 2


def test_closing_while_the_task_loads_hides_then_closes_when_the_thread_ends(qtbot, make_window, tmp_path, qtlog):
    """The engine thread cannot leave build_task early: the window hides after 2 s, never
    terminates the thread, and closes (quitting the app) once the thread has stopped."""
    w = make_window()
    # The plots built first: built by the event loop while the test waits for the mark, they took
    # most of build_task's 4 s on a loaded machine, and the close came after it had returned.
    assert w.plots is not None
    start(w, task=slow_task(tmp_path, 4.0), run_dir=str(tmp_path / "run"))
    wait_until(qtbot, loading_mark(tmp_path).exists, 60, "the engine thread to be in build_task")
    t0 = time.perf_counter()
    assert not w.close()  # refused for now: the thread is still in build_task
    assert 1.9 < time.perf_counter() - t0 < 4.0
    assert not w.isVisible() and w.runner.is_busy()
    with qtbot.waitSignal(w.closed, timeout=30_000):
        pass
    assert not w.runner.is_busy()
    assert w.run_outcome["reason"] == "stopped"
    assert not (tmp_path / "run" / "checkpoints" / "last.pt").exists()  # stopped before its first step
    assert not [m for m in qtlog.records if "Destroyed while thread" in m.message]


def test_ctrl_c_while_the_task_loads_exits_cleanly(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    # build_task sleeps 3 s: the Ctrl+C comes within a few poll intervals of its start, and the
    # first Ctrl+C waits for it to return (a second would end the app at once).
    proc = subprocess.Popen([sys.executable, "-m", "app", "--task", slow_task(tmp_path, 3.0), "--autostart",
                             "--run-dir", str(tmp_path / "run")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    log = tmp_path / "headroom.log"  # HEADROOM_LOG (the isolated fixture), inherited by the app
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and "start: " in log.read_text()):  # Start pressed: torch loading now
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        testkit.wait_until(loading_mark(tmp_path).exists, 60, "the task to be loading")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "QThread" not in err and "Traceback" not in err and "Fatal" not in err, err
