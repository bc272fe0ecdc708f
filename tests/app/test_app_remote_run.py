"""A run training in another process (the headless engine), opened from its folder: live plots
from run.db, and changes and Stop sent through its commands table."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from app_helpers import ROOT, run_button, wait_until

pytestmark = pytest.mark.slow  # an engine in a subprocess, followed live
PACED_MLP = str(ROOT / "tests" / "ctl" / "paced_mlp.py")


def test_open_a_running_run_and_control_it(qtbot, make_window, tmp_path):
    run_dir, err_path = tmp_path / "remote", tmp_path / "engine.err"
    err_file = open(err_path, "w")  # a file, not a pipe: read whenever the test needs to say why
    # The builtin mlp paced (tests/ctl/paced_mlp.py: 20 ms of sleep a training micro-batch): at full
    # speed it kept a core busy for the whole test, which only needs its steps to keep coming.
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--task", PACED_MLP, "--epochs", "40", "--micro-batch", "64",
                             "--accum", "2", "--device", "cpu", "--lr-schedule", "cosine", "--run-dir", str(run_dir)], cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_file, text=True,
                            env=dict(os.environ), start_new_session=True)  # as headroom-ctl start detaches it
    try:
        deadline = time.monotonic() + 90
        while not (run_dir / "run.db").exists() or not w_ready(run_dir):
            assert proc.poll() is None, err_path.read_text()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        w = make_window()
        assert w.open_run(str(run_dir))
        assert w.session.remote and w.controls.remote, why_not_followed(proc, run_dir, err_path)
        wait_until(qtbot, lambda: w.model.step >= 2 and w.controls.engine.get("accum") == 2, 60, "remote steps")
        assert w.ui_state() == "training" and run_button(w, "stop").isEnabled()
        # The folded Run and schedule lines say the followed run's settings, not the window's form
        # (they read "mlp · fp32 · 3 epochs" and "constant" for this 40-epoch cosine run).
        run_line, schedule_line = w.controls.run_fields.folding.summary, w.controls.schedule.folding.summary
        assert run_line.isVisible() and "40 epochs" in run_line.text(), run_line.text()
        assert schedule_line.text().startswith("cosine"), schedule_line.text()
        w.controls.accum.setValue(4)
        w.apply_changes()
        assert "pending" in w.controls.status_text("accum")
        wait_until(qtbot, lambda: w.controls.status_text("accum").startswith("applied"), 60, "the remote change")
        assert [n for n in w.model.markers if ("accum", 2, 4) in n.changes]
        w.stop_run()
        proc.wait(timeout=30)
        wait_until(qtbot, lambda: w.model.state == "finished", 30, "run_finished from run.db")
        assert w.model.finish_reason == "stopped"
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err_file.close()


def why_not_followed(proc: subprocess.Popen, run_dir, err_path) -> str:
    """What the engine and its folder say when the window does not see the run as live."""
    from engine.store import RunReader, runlock
    code = proc.poll()
    r = RunReader(str(run_dir))
    try:
        info = r.info()
    finally:
        r.close()
    err = err_path.read_text()[-2000:]
    return (f"engine exit code {code}; run.db status {info.get('status')!r}; lock holder "
            f"{runlock.holder(str(run_dir))!r}; engine stderr: {err}")


def w_ready(run_dir) -> bool:
    from engine.store import RunReader
    try:
        r = RunReader(str(run_dir))
        ok = r.info().get("status") == "running" and len(r.metrics()) > 0
        r.close()
        return ok
    except Exception:
        return False
