"""Issue 12, "Nothing lost, round 2", the app's side: a live run shown as live and never given
a second writer; commands that cannot reach a run folder; damaged run.db files; a
screenshot that cannot be written; no empty run left by a window closed while its task
loads; SIGTERM while task code blocks. Real SQLite, real widgets offscreen, real
subprocesses and signals."""
from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from engine.store import runlock
from engine.declarations.events import EpochEnd, RunFinished, RunStarted, StepMetrics
from engine.store import RunReader, RunStore

from app_helpers import FAST, ROOT, run_to_end, start, wait_until
from app_tasks import slow_task

HOST = socket.gethostname()
APP = [sys.executable, "-m", "app"]
BLOCKING_TASK = str(ROOT / "tests" / "faults" / "blocking_task.py")

# A writer in another process: holds the folder's writer lock like any engine and writes a
# step every 50 ms through the engine's own store. run.db's `pid` is argv[2] (a dead pid
# stands for a writer on another host of a shared mount: no local process has it).
WRITER = r'''
import os, sys, time
sys.path.insert(0, sys.argv[3])
from engine import runlock
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


LOCKER = "import sys, time\nsys.path.insert(0, sys.argv[2])\nfrom engine import runlock\n" \
         "lock = runlock.acquire(sys.argv[1])\nprint('locked', flush=True)\ntime.sleep(120)\n"


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


def tree(folder: Path) -> dict[str, int]:
    """Files and sizes, but SQLite's -wal/-shm, which any reader of a WAL database may create."""
    return {os.path.relpath(os.path.join(b, f), folder): os.path.getsize(os.path.join(b, f))
            for b, _, fs in os.walk(folder) for f in fs if not f.endswith(("-wal", "-shm"))}


# -- 1. a live run is shown as live, and never gets a second writer ---------------------------
def test_a_folder_another_process_writes_is_followed_live_and_names_its_writer(qtbot, make_window, tmp_path):
    run_dir = tmp_path / "shared"
    with writer(run_dir, info_pid=dead_pid()) as proc:  # run.db's pid is no process here: only the lock says live
        w = make_window()
        assert w.open_run(str(run_dir))
        assert w.ui_state() == "training" and w.session.remote
        assert w.live_text() == f"live: pid {proc.pid} on {HOST}"
        assert w.live_label.isVisible()
        first = w.model.step
        wait_until(qtbot, lambda: w.model.step >= first + 5, 20, "the app to follow run.db as it grows")
        proc.kill()
        proc.wait()
        # The writer is gone (its lock went with it): run.db still says running, so: interrupted.
        wait_until(qtbot, lambda: w.model.state == "interrupted", 20, "the app to see the writer gone")
        assert w.live_text() == ""
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
    assert w.live_text() == f"live: pid {os.getpid()} on {HOST}"
    assert runlock.holder(str(run_dir))["pid"] == os.getpid()  # the engine thread holds the lock
    assert w.last_error is None
    w.stop_run()
    assert run_to_end(qtbot, w, 60)["reason"] == "stopped"
    assert w.live_text() == "" and runlock.holder(str(run_dir)) is None


# -- 2. commands that cannot reach a run folder --------------------------------------------------
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


# -- 3. damaged run.db files ----------------------------------------------------------------------
def damaged_run(run_dir: Path, steps: int = 40) -> Path:
    """A finished run written by the engine's store, then damaged the way other programs (or
    a bad disk) leave a file: text in REAL columns of every table, NULL accum/micro_batch,
    an event row whose step and data are not what they should be."""
    os.makedirs(run_dir / "checkpoints")
    store = RunStore(str(run_dir))
    cfg = {"task": "mlp", "micro_batch": 64, "accum": 2, "lr": 1e-3, "clip": 1.0, "epochs": 2, "device": "cpu"}
    store.set_info(config=cfg, task="mlp", device="cpu", device_name="cpu", world_size=1, status="finished",
                   pid=1, started=time.time() - 60)
    store.record(RunStarted(0, 1, run_dir=str(run_dir), task="mlp", device="cpu", device_name="cpu",
                            torch_version="-", world_size=1, resumed=False, config=cfg))
    for s in range(1, steps + 1):
        e = 1 if s <= steps // 2 else 2
        store.record(StepMetrics(s, e, loss=2.0 / s, grad_norm=0.5, clipped=s % 7 == 0, lr=1e-3, accum=2,
                                 clip=1.0, micro_batch=64, samples=128, tokens=128, step_time=0.01,
                                 throughput=12800.0, nonfinite=False, scaler_skipped=False))
        if s == steps // 2 or s == steps:
            store.record(EpochEnd(s, e, train_loss=1.0, val_loss=0.9, seconds=1.0))
    store.record(RunFinished(steps, 2, reason="completed"))
    store.close()
    db = sqlite3.connect(str(run_dir / "run.db"))
    db.execute("UPDATE metrics SET accum = NULL, micro_batch = NULL WHERE step <= 2")
    db.execute("UPDATE metrics SET loss = 'not a number' WHERE step = 3")
    db.execute("UPDATE metrics SET grad_norm = 'x', lr = 'lr?', throughput = 'fast', time = 'noon' WHERE step = 4")
    db.execute("UPDATE metrics SET epoch = 'one', samples = 'many', step_time = X'00ff' WHERE step = 5")
    db.execute("UPDATE metrics SET clipped = 'yes', clip = 'c' WHERE step = 6")
    db.execute("UPDATE events SET time = 'later', step = 'twenty' WHERE kind = 'epoch_end' AND epoch = 1")
    db.execute("UPDATE events SET data = '[1, 2]' WHERE kind = 'run_finished'")
    db.execute("UPDATE events SET data = '{\"train_loss\": \"abc\", \"val_loss\": \"?\"}' WHERE kind = 'epoch_end' "
               "AND epoch = 2")
    db.execute("UPDATE epochs SET train_loss = 'abc', val_loss = 'def', seconds = 'ghi'")
    db.execute("UPDATE run SET value = 'not json' WHERE key = 'started'")
    db.commit()
    db.close()
    return run_dir


@pytest.mark.parametrize("lazy_above", [1 << 30, 5], ids=["whole-read", "large-read"])
def test_opening_a_damaged_run_db_shows_it_and_never_raises(qtbot, make_window, tmp_path, monkeypatch, lazy_above):
    from app.session import sources
    monkeypatch.setattr(sources, "LAZY_ABOVE", lazy_above, raising=False)  # a long run's path, on a short one
    run_dir = damaged_run(tmp_path / "damaged")
    w = make_window()
    assert w.open_run(str(run_dir))
    w.tick()
    m = w.model.metrics
    assert len(m) == 40 and w.model.step == 40 and w.model.state == "finished"
    loss = m.view("loss")
    assert math.isnan(loss[2]) and loss[3] == pytest.approx(0.5)
    assert math.isnan(m.view("grad_norm")[3]) and math.isnan(m.view("lr")[3]) and math.isnan(m.view("time")[3])
    assert math.isnan(m.view("epoch")[4]) and math.isnan(m.view("step_time")[4])
    assert math.isnan(m.view("accum")[0]) and m.view("accum")[2] == 2
    assert w.model.step_values(0) == {"lr": 1e-3, "clip": 1.0, "micro_batch": None, "accum": None}
    assert np.all(np.isfinite(m.view("samples_seen"))) and m.view("samples_seen")[-1] == 39 * 128
    assert len(w.model.epochs) == 2
    rows = list(m.rows())
    assert len(rows) == 40
    assert w.last_error is None
    w.plots.refresh(force=True)


def test_a_damaged_run_opened_with_quit_when_done_exits(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    run_dir = damaged_run(tmp_path / "damaged")
    r = subprocess.run(APP + ["--open", str(run_dir), "--quit-when-done"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    garbage = tmp_path / "garbage"  # a run that cannot be shown: non-zero, one line
    garbage.mkdir()
    (garbage / "run.db").write_bytes(os.urandom(8192))
    r = subprocess.run(APP + ["--open", str(garbage), "--quit-when-done"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=90)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr


# -- 4. a screenshot that cannot be written -------------------------------------------------------
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


# -- 5. no empty run left by a window closed while its task loads ------------------------------------
def test_closing_while_the_task_loads_leaves_no_empty_run_in_the_history(qtbot, make_window, tmp_path):
    from app.core.runs import list_runs
    runs = tmp_path / "runs"  # HEADROOM_RUNS (the isolated fixture): where the engine names new folders
    w = make_window()
    # Loading takes well over the wait plus the close's JOIN_S (2 s), however loaded the machine.
    start(w, task=slow_task(tmp_path, 6.0))  # no --run-dir: a new folder under the runs folder
    qtbot.wait(300)
    assert not w.close()  # hidden until the thread ends
    with qtbot.waitSignal(w.closed, timeout=60_000):
        pass
    assert w.run_outcome["reason"] == "stopped"
    assert list_runs(str(runs)) == []
    assert not runs.exists() or os.listdir(runs) == []


def _engine_folder(path: Path, rows: int = 0, discarded: int = 0, checkpoint: bool = False, extra: str = "") -> Path:
    """A run folder as the engine leaves it before (or after) its first steps."""
    os.makedirs(path / "checkpoints")
    lock = runlock.acquire(str(path))
    store = RunStore(str(path))
    store.set_info(status="finished", task="mlp")
    for s in range(1, rows + discarded + 1):
        store.record(StepMetrics(s, 1, loss=1.0, grad_norm=1.0, clipped=False, lr=1e-3, accum=1, clip=0.0,
                                 micro_batch=1, samples=1, tokens=1, step_time=0.1, throughput=10.0,
                                 nonfinite=False, scaler_skipped=False))
    if discarded:
        store.discard_after(rows, "superseded")
    store.close()
    lock.release()
    if checkpoint:
        (path / "checkpoints" / "last.pt").write_bytes(b"weights")
    if extra:
        (path / extra).write_text("the user's")
    return path


def test_an_empty_run_folder_is_removed_and_nothing_else_ever_is(tmp_path):
    from app.core.runs import remove_if_empty
    assert remove_if_empty(str(_engine_folder(tmp_path / "empty")))
    assert not (tmp_path / "empty").exists()
    kept = {"one-row": _engine_folder(tmp_path / "one-row", rows=1),
            "discarded-row": _engine_folder(tmp_path / "discarded-row", discarded=1),
            "checkpoint": _engine_folder(tmp_path / "checkpoint", checkpoint=True),
            "user-file": _engine_folder(tmp_path / "user-file", extra="notes.txt")}
    for name, path in kept.items():
        before = tree(path)
        assert not remove_if_empty(str(path)), name
        assert tree(path) == before, name
    held = _engine_folder(tmp_path / "held")  # empty, but another process holds its writer lock: never
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(held), str(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout.readline().strip() == "locked"
        before = tree(held)
        assert not remove_if_empty(str(held)) and tree(held) == before
    finally:
        locker.kill()
        locker.wait()
    assert remove_if_empty(str(held), keep_folder=True) and held.is_dir() and os.listdir(held) == []


# -- 7. SIGTERM while task code blocks ---------------------------------------------------------------
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
    time.sleep(1.5)  # the store's flusher: rows reach run.db within a second
    return proc, run_dir


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
