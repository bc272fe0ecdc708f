"""--screenshot: a path that cannot be written is bad input at start (exit 2); one that fails at
the end of the run exits 1. One error line either way."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from app_folders import damaged_run
from app_helpers import ROOT
from app_tasks import slow_task

APP = [sys.executable, "-m", "app"]


# -- a screenshot that cannot be written -------------------------------------------------------
def _one_error(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.parametrize("where", ["missing-folder", "read-only-folder", "a-folder"])
def test_a_screenshot_path_that_cannot_be_written_is_bad_input_at_start(tmp_path, where):
    run_dir = damaged_run(tmp_path / "run")
    path = {"missing-folder": "/nonexistent/dir/x.png", "read-only-folder": "/proc/headroom-x.png",
            "a-folder": str(tmp_path)}[where]
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    t0 = time.monotonic()
    r = subprocess.run(APP + ["--open", str(run_dir), "--screenshot", path, "--quit-when-done"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=90)
    assert r.returncode == 2, r.stderr
    assert "--screenshot" in _one_error(r)
    assert time.monotonic() - t0 < 30


@pytest.mark.slow
def test_a_screenshot_that_fails_at_the_end_exits_1(tmp_path):
    shots = tmp_path / "shots"
    shots.mkdir()
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.Popen(APP + ["--task", slow_task(tmp_path, 4.0), "--micro-batch", "4", "--accum", "1",
                                   "--max-steps", "3", "--device", "cpu", "--run-dir", str(tmp_path / "run"),
                                   "--autostart", "--quit-when-done", "--screenshot", str(shots / "x.png")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "headroom.log"
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and "start: " in log.read_text()):  # the path was checked: the run goes
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        shots.rmdir()
        shots.write_text("a file where the folder was")  # the folder cannot be made again either
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert "--screenshot" in _one_error(r)
