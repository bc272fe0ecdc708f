"""The console failing never ends training, an error is always one line, and a second Ctrl-C or
SIGTERM ends a run at once even while task code blocks (issue 12). Real processes and signals;
the one-line errors, which need neither, from the command line run in this process (engine_in_process.engine)."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from engine.store import RunReader
from engine_in_process import engine
from testkit import ROOT, subprocess_env

TASK = os.path.join(ROOT, "tests", "faults", "fault_task.py")
BLOCKING = os.path.join(ROOT, "tests", "faults", "blocking_task.py")
RUN = ["--micro-batch", "8", "--accum", "2", "--epochs", "1"]  # 16 steps


def env(**extra):
    return subprocess_env(extra)


def steps_in(run_dir) -> list[int]:
    return [m["step"] for m in RunReader(str(run_dir)).metrics()]


def error_lines(stderr: str) -> list[str]:
    return [l for l in stderr.splitlines() if l.startswith("error:")]


# -- the console -------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("how", ["stdout_full", "stdout_closed", "stderr_closed", "both_closed"])
def test_a_failing_console_never_ends_training(tmp_path, how):
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "engine", "--task", TASK, *RUN, "--run-dir", str(run_dir), "--json"]
    kw: dict = dict(cwd=ROOT, env=env(), timeout=180)
    if how == "stdout_full":
        with open("/dev/full", "w") as full:
            r = subprocess.run(args, stdout=full, stderr=subprocess.PIPE, text=True, **kw)
        assert "Traceback" not in r.stderr and not error_lines(r.stderr), r.stderr
    else:
        close = {"stdout_closed": (1,), "stderr_closed": (2,), "both_closed": (1, 2)}[how]
        r = subprocess.run(args, capture_output=True, preexec_fn=lambda: [os.close(fd) for fd in close], **kw)
    assert r.returncode == 0
    assert steps_in(run_dir) == list(range(1, 17))  # every row landed
    assert RunReader(str(run_dir)).events(kinds={"run_finished"})
    db = sqlite3.connect(str(run_dir / "run.db"))  # nothing printed into run.db through a reused fd 1 or 2
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_bad_input_with_stderr_closed_still_exits_2_and_writes_nothing(tmp_path):
    r = subprocess.run([sys.executable, "-m", "engine", "--accum", "0", "--run-dir", str(tmp_path / "run")],
                       cwd=ROOT, env=env(), capture_output=True, preexec_fn=lambda: os.close(2), timeout=120)
    assert r.returncode == 2
    assert not (tmp_path / "run").exists()


# -- one error line ------------------------------------------------------------------------------
def test_an_error_with_many_lines_is_one_capped_line(tmp_path):
    task = tmp_path / "task.py"
    task.write_text("def build_task(seed):\n    raise RuntimeError('no data\\n  in line two\\n\\n' + 'x' * 5000)\n")
    r = engine("--task", str(task), "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no data in line two" in lines[0], r.stderr
    assert len(lines[0]) <= 420
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # trains (in this process)
def test_a_run_failing_with_a_many_line_message_prints_one_error_line(tmp_path):
    run_dir = tmp_path / "run"
    r = engine("--task", BLOCKING, *RUN, "--run-dir", str(run_dir), env={"HEADROOM_FAULT_RAISE_AFTER": "5"})
    assert r.returncode == 1
    errors = error_lines(r.stderr)
    assert len(errors) == 1 and "the loss failed at line one at line two" in errors[0] and len(errors[0]) <= 420
    assert all(l.startswith(("error:", "[")) for l in r.stderr.splitlines()), r.stderr  # no stray lines
    assert "Traceback" not in r.stderr
    assert steps_in(run_dir) == [1, 2]  # the steps before the failure are kept


# -- Ctrl-C / SIGTERM twice --------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_ends_a_run_blocked_in_getitem_at_once(tmp_path, sig):
    run_dir = tmp_path / "run"
    mark = tmp_path / "blocked"
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--task", BLOCKING, *RUN, "--run-dir", str(run_dir),
                             "--json"], cwd=ROOT, env=env(HEADROOM_FAULT_BLOCK_AFTER="40",
                                                          HEADROOM_FAULT_BLOCK_MARK=str(mark)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.exists(), "the data set never blocked"
        time.sleep(0.3)
        proc.send_signal(sig)
        time.sleep(1.5)
        assert proc.poll() is None  # the first asks for a stop at the next step: the data set still blocks
        proc.send_signal(sig)
        t = time.monotonic()
        proc.wait(timeout=20)
        took = time.monotonic() - t
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert took < 5, took
    reader.join(timeout=5)
    seen = [json.loads(l)["step"] for l in out if json.loads(l)["kind"] == "step"]
    assert seen == list(range(1, len(seen) + 1)) and seen  # steps done before the data set blocked
    errors = error_lines(err)
    assert len(errors) == 1 and "interrupted twice" in errors[0] and "Traceback" not in err, err
    assert steps_in(run_dir) == seen  # what the store held is on disk
    assert RunReader(str(run_dir)).info()["status"] == "interrupted"
    db = sqlite3.connect(str(run_dir / "run.db"))
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
