"""SIGTERM to the app while task code blocks: the app exits 130 within seconds (twice: at once),
one error line, the run marked interrupted and its lock released."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from app_helpers import ROOT

import testkit
from engine.store import RunReader, runlock

pytestmark = pytest.mark.slow  # the app in a subprocess, signalled

APP = [sys.executable, "-m", "app"]
BLOCKING_TASK = str(ROOT / "tests" / "faults" / "blocking_task.py")


# -- SIGTERM while task code blocks ---------------------------------------------------------------
def _blocked_app(tmp_path: Path):
    mark = tmp_path / "blocked"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HEADROOM_FAULT_BLOCK_AFTER": "60",
           "HEADROOM_FAULT_BLOCK_MARK": str(mark)}
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(APP + ["--task", BLOCKING_TASK, "--micro-batch", "8", "--accum", "2", "--epochs", "5",
                                   "--device", "cpu", "--workers", "0", "--run-dir", str(run_dir), "--autostart"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not mark.exists():  # __getitem__ is blocked now (an hour's sleep), after some steps
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the task never blocked"
        time.sleep(0.05)
    # The store's flusher commits the rows so far within a second, with the training thread blocked.
    testkit.wait_until(lambda: _rows_on_disk(run_dir), 30, "the steps before the block in run.db")
    return proc, run_dir


def _rows_on_disk(run_dir: Path) -> int:
    if not (run_dir / "run.db").exists():
        return 0
    reader = RunReader(str(run_dir))
    try:
        return len(reader.metrics())
    finally:
        reader.close()


def _ended(proc, run_dir, seconds):
    try:
        out, err = proc.communicate(timeout=seconds)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "QThread" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    reader = RunReader(str(run_dir))
    try:
        assert len(reader.metrics()) > 0 and reader.info()["status"] == "interrupted"
    finally:
        reader.close()
    assert runlock.holder(str(run_dir)) is None


def test_sigterm_twice_while_task_code_blocks_exits_within_seconds(tmp_path):
    proc, run_dir = _blocked_app(tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _ended(proc, run_dir, 15)
    assert time.monotonic() - t0 < 10


def test_one_sigterm_while_task_code_blocks_exits_a_few_seconds_later(tmp_path):
    proc, run_dir = _blocked_app(tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _ended(proc, run_dir, 20)
    assert time.monotonic() - t0 < 12
