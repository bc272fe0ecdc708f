"""`python -m app`: bad flags are one error line and exit 2; --screenshot writes a PNG;
the window shows without importing torch."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from app_helpers import ROOT
from app_tasks import broken_task
from PySide6.QtGui import QImage

from testkit import isolated_env


def _app(*args, env_extra=None, timeout=120):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("args, words", [
    (["--lr", "-1"], "--lr"),
    (["--lr", "abc"], "--lr"),
    (["--accum", "0"], "--accum"),
    (["--task", "nope"], "unknown task"),
    (["--task", "missing/file.py"], "no such file"),
    (["--bogus"], "unrecognized"),
    (["--quit-when-done"], "--autostart"),
    (["--precision", "fp8"], "--precision"),
])
def test_bad_flags_are_one_error_line_and_exit_2(args, words):
    r = _app(*args, timeout=30)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], r.stderr
    assert r.stdout == ""


@pytest.mark.slow
def test_a_task_file_that_fails_to_load_exits_2_when_scripted(tmp_path):
    r = _app("--task", broken_task(tmp_path), "--autostart", "--quit-when-done")
    assert r.returncode == 2, r.stderr
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: task file") and "syntax error" in err[0], r.stderr


@pytest.fixture(scope="module")
def screenshot_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """`python -m app --autostart --quit-when-done --screenshot`: its result, the PNG and the run
    folder it trained, which test_open_a_run_folder_and_screenshot_it opens (no engine run of its own)."""
    base = tmp_path_factory.mktemp("screenshot")
    shot, run_dir = base / "shot.png", base / "run"
    r = _app("--task", "mlp", "--epochs", "1", "--max-steps", "6", "--micro-batch", "64", "--device", "cpu",
             "--autostart", "--quit-when-done", "--screenshot", str(shot), "--run-dir", str(run_dir),
             env_extra=isolated_env(base))
    return r, shot, run_dir


@pytest.mark.slow
def test_screenshot_writes_a_png_of_the_window(screenshot_run):
    r, shot, _run_dir = screenshot_run
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "Fatal" not in r.stderr, r.stderr
    img = QImage(str(shot))
    assert not img.isNull() and (img.width(), img.height()) == (1440, 900)
    # not a blank image: many distinct colours
    colours = {img.pixel(x, y) for x in range(0, 1440, 37) for y in range(0, 900, 29)}
    assert len(colours) > 10


def test_window_shows_before_torch_loads():
    r = _app(env_extra={"HEADROOM_STARTUP_PROBE": "1"}, timeout=60)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("shown "))
    assert "torch_loaded 0" in line, line


@pytest.mark.slow
def test_open_a_run_folder_and_screenshot_it(tmp_path, screenshot_run):
    r, _shot, run_dir = screenshot_run  # a finished run folder: the one the app trained above
    assert r.returncode == 0, r.stderr
    shot = tmp_path / "opened.png"
    r = _app("--open", str(run_dir), "--screenshot", str(shot), "--quit-when-done")
    assert r.returncode == 0, r.stderr
    assert not QImage(str(shot)).isNull()
    r = _app("--open", str(tmp_path / "nothing-here"), "--quit-when-done", timeout=30)
    assert r.returncode == 2 and r.stderr.startswith("error: --open") and "no run.db" in r.stderr
