"""A run folder another process writes is shown live and never given a second writer; commands
that cannot reach a run folder (read-only, deleted) say why and change nothing. Real SQLite,
real widgets offscreen, real subprocesses."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from app_folders import LOCKER, tree
from app_helpers import FAST, ROOT, run_to_end, start, wait_until

from engine.store import runlock

pytestmark = pytest.mark.slow  # a writer in another process, real runs

HOST = socket.gethostname()
APP = [sys.executable, "-m", "app"]

# A writer in another process: holds the folder's writer lock like any engine and writes a
# step every 50 ms through the engine's own store. run.db's `pid` is argv[2] (a dead pid
# stands for a writer on another host of a shared mount: no local process has it).
WRITER = r'''
import os, sys, time
sys.path.insert(0, sys.argv[3])
from engine.store import runlock
from engine.declarations.config import TrainConfig
from engine.declarations.events import RunStarted, StepMetrics
from engine.store import RunStore
run_dir, info_pid = sys.argv[1], int(sys.argv[2]) or os.getpid()
os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
lock = runlock.acquire(run_dir)
store = RunStore(run_dir)
cfg = TrainConfig(task="mlp", micro_batch=64, accum=2, lr=1e-3, clip=1.0, device="cpu", epochs=3).to_dict()
store.set_info(config=cfg, task="mlp", device="cpu", device_name="cpu", world_size=1, status="running",
               pid=info_pid, started=time.time())
store.record(RunStarted(0, 1, run_dir=run_dir, task="mlp", device="cpu", device_name="cpu", torch_version="-",
                        world_size=1, resumed=False, config=cfg))
store.commit()
step = 0
while True:
    step += 1
    store.record(StepMetrics(step, 1, loss=2.0 / step, grad_norm=0.5, clipped=False, lr=1e-3, accum=2, clip=1.0,
                             micro_batch=64, samples=128, tokens=128, step_time=0.01, throughput=12800.0,
                             nonfinite=False, scaler_skipped=False))
    store.commit()
    if step == 3:
        print("ready", flush=True)
    time.sleep(0.05)
'''


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@contextmanager
def writer(run_dir: Path, info_pid: int | None = None):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir), str(info_pid or 0), str(ROOT)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


# -- a live run is shown as live, and never gets a second writer ---------------------------
def test_a_folder_another_process_writes_is_followed_live_and_names_its_writer(qtbot, make_window, tmp_path):
    run_dir = tmp_path / "shared"
    with writer(run_dir, info_pid=dead_pid()) as proc:  # run.db's pid is no process here: only the lock says live
        w = make_window()
        assert w.open_run(str(run_dir))
        assert w.ui_state() == "training" and w.session.remote
        assert w.live_label.text() == f"live: pid {proc.pid} on {HOST}"
        assert w.live_label.isVisible()
        first = w.model.step
        wait_until(qtbot, lambda: w.model.step >= first + 5, 20, "the app to follow run.db as it grows")
        proc.kill()
        proc.wait()
        # The writer is gone (its lock went with it): run.db still says running, so: interrupted.
        wait_until(qtbot, lambda: w.model.state == "interrupted", 20, "the app to see the writer gone")
        assert w.live_label.text() == ""
    assert w.last_error is None


def test_start_or_resume_of_a_live_folder_is_refused_naming_its_writer(qtbot, make_window, tmp_path):
    run_dir = tmp_path / "shared"
    with writer(run_dir) as proc:
        w = make_window({"resume": str(run_dir), "epochs": 3})
        w.controls.set_values(FAST)
        before = set(tree(run_dir))  # the writer's run.db grows meanwhile: no file of ours appears
        assert not w.start_run()  # refused at once: no engine thread, no torch, nothing written
        assert not w.runner.is_busy() and w.ui_state() == "idle"
        title, message = w.last_error
        assert "live" in title and f"pid {proc.pid}" in message and HOST in message
        assert len(w.dialogs) == 1
        assert runlock.holder(str(run_dir))["pid"] == proc.pid
        assert set(tree(run_dir)) == before
        # The same from the command line: one error line, exit 2.
        env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
        r = subprocess.run(APP + ["--resume", str(run_dir), "--autostart", "--quit-when-done"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and f"pid {proc.pid}" in lines[0], r.stderr
        assert runlock.holder(str(run_dir))["pid"] == proc.pid


def test_opening_a_folder_whose_writer_has_not_made_run_db_yet_names_it(qtbot, make_window, tmp_path):
    run_dir = tmp_path / "setting-up"
    run_dir.mkdir()
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(run_dir), str(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout.readline().strip() == "locked"
        w = make_window()
        assert not w.open_run(str(run_dir))
        assert len(w.dialogs) == 1 and f"pid {locker.pid}" in w.last_error[1] and "again" in w.last_error[1]
    finally:
        locker.kill()
        locker.wait()


def test_the_window_shows_its_own_run_live_without_refusing_itself(qtbot, make_window, tmp_path):
    w = make_window()
    run_dir = tmp_path / "own"
    start(w, epochs=50, run_dir=str(run_dir))
    wait_until(qtbot, lambda: w.model.step >= 3, 90, "a few steps")
    w.tick()
    assert w.live_label.text() == f"live: pid {os.getpid()} on {HOST}"
    assert runlock.holder(str(run_dir))["pid"] == os.getpid()  # the engine thread holds the lock
    assert w.last_error is None
    w.stop_run()
    assert run_to_end(qtbot, w, 60)["reason"] == "stopped"
    assert w.live_label.text() == "" and runlock.holder(str(run_dir)) is None


# -- commands that cannot reach a run folder --------------------------------------------------
@contextmanager
def read_only_view(folder: Path, view: Path):
    """`view`: the folder as a read-only mount shows it (root: a read-only bind mount;
    others: the folder itself with its write bits off, which the writer's open files ignore)."""
    if os.geteuid() == 0:
        view.mkdir()
        r = subprocess.run(f"mount --bind '{folder}' '{view}' && mount -o remount,ro,bind '{view}'", shell=True,
                           capture_output=True, text=True)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", str(view)], capture_output=True)
            pytest.skip(f"no read-only bind mount here: {r.stderr.strip()}")
        try:
            yield view
        finally:
            subprocess.run(["umount", "-l", str(view)], capture_output=True)
    else:
        modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")]}
        for p in modes:
            p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            yield folder
        finally:
            for p, m in modes.items():
                p.chmod(m)


def _commands_say_why_once_and_change_nothing(qtbot, w):
    c = w.controls
    assert w.ui_state() == "training" and w.stop_action.isEnabled() and w.pause_action.isEnabled()
    w.stop_action.trigger()  # the Qt slot itself: an exception there fails the test (pytest-qt)
    assert len(w.dialogs) == 1 and w.ui_state() == "training", w.ui_state()
    assert "Could not stop" in w.last_error[0]
    assert not w.session.sent
    w.pause_action.trigger()
    assert len(w.dialogs) == 2 and w.ui_state() == "training"
    assert "Could not pause" in w.last_error[0]
    c.accum.setValue(4)
    wait_until(qtbot, lambda: w.apply_action.isEnabled(), 5, "Apply to be enabled")
    w.apply_action.trigger()
    assert len(w.dialogs) == 3 and w.ui_state() == "training"
    assert "Could not send" in w.last_error[0]
    assert w.session.pending.get("accum") is None or w.session.pending.get("accum").status.value != "sent"
    assert not w.session.sent


def test_stop_pause_apply_on_a_read_only_run_folder_say_why_and_change_nothing(qtbot, make_window, tmp_path):
    run_dir = tmp_path / "shared"
    with writer(run_dir), read_only_view(run_dir, tmp_path / "mnt") as view:
        w = make_window()
        assert w.open_run(str(view))
        _commands_say_why_once_and_change_nothing(qtbot, w)
        assert "readonly" in w.last_error[1] or "read-only" in w.last_error[1], w.last_error


def test_stop_pause_apply_on_a_deleted_run_folder_say_why_and_change_nothing(qtbot, make_window, tmp_path):
    run_dir = tmp_path / "gone"
    with writer(run_dir):
        w = make_window()
        assert w.open_run(str(run_dir))
        shutil.rmtree(run_dir)  # the writer goes on through its open files
        _commands_say_why_once_and_change_nothing(qtbot, w)
        assert "not a run folder" in w.last_error[1], w.last_error
