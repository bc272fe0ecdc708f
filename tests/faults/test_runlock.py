"""One writer per run folder (issue 12): an OS lock held for the writer's life, released by the
kernel when the process dies. Real processes and real signals throughout."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from engine.checkpoints import files as ckpt
from engine.declarations.config import ConfigError
from engine.store import runlock
from testkit import ROOT

HOLDER = """
import os, sys, time
sys.path.insert(0, {root!r})
from engine.store import runlock
lock = runlock.acquire(sys.argv[1])
if len(sys.argv) > 2 and sys.argv[2] == "fork":
    child = os.fork()
    if child == 0:          # a DataLoader worker, say: it outlives a SIGKILLed parent for a while
        os.write(1, b"child running\\n")  # (past fork and its at-fork handlers)
        time.sleep(60)
        os._exit(0)
    os.write(1, b"%d\\n" % child)  # whole lines in one write each: parent and child share the pipe
os.write(1, b"locked\\n")
time.sleep(60)
"""


def start_holder(run_dir, *extra):
    p = subprocess.Popen([sys.executable, "-c", HOLDER.format(root=str(ROOT)), str(run_dir), *extra],
                         stdout=subprocess.PIPE, text=True)
    lines = []
    for line in p.stdout:
        lines.append(line.strip())
        if "locked" in lines and ("fork" not in extra or "child running" in lines):
            return p, [l for l in lines if l not in ("locked", "child running")]
    raise AssertionError(f"holder did not lock: {lines}")


def kill(p):
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)


def test_a_second_writer_is_refused_naming_the_holder_and_a_killed_holder_leaves_no_lock(tmp_path):
    holder_proc, _ = start_holder(tmp_path)
    try:
        info = runlock.holder(str(tmp_path))
        assert info is not None and info["pid"] == holder_proc.pid and info["host"] == socket.gethostname()
        with pytest.raises(runlock.RunFolderBusy) as e:
            runlock.acquire(str(tmp_path))
        msg = str(e.value)
        assert isinstance(e.value, ConfigError) and "\n" not in msg
        assert f"pid {holder_proc.pid}" in msg and socket.gethostname() in msg and str(tmp_path) in msg
        assert "started" in msg
    finally:
        kill(holder_proc)
    # SIGKILL: no cleanup code ran, yet the kernel released the lock with the process.
    assert os.path.exists(tmp_path / runlock.LOCK_NAME)
    assert runlock.holder(str(tmp_path)) is None
    lock = runlock.acquire(str(tmp_path))
    assert lock.held and runlock.holder(str(tmp_path))["pid"] == os.getpid()
    lock.release()
    assert runlock.holder(str(tmp_path)) is None


def test_in_one_process_a_second_lock_is_refused_and_release_frees_it(tmp_path):
    lock = runlock.acquire(str(tmp_path))
    with pytest.raises(runlock.RunFolderBusy, match=f"pid {os.getpid()}"):
        runlock.acquire(str(tmp_path), wait=0.1)
    lock.release()
    lock.release()  # idempotent
    with runlock.acquire(str(tmp_path)) as again:
        assert again.held
    assert runlock.holder(str(tmp_path)) is None


def test_holder_of_a_folder_never_locked_is_none_and_creates_nothing(tmp_path):
    assert runlock.holder(str(tmp_path)) is None
    assert runlock.holder(str(tmp_path / "missing")) is None
    assert os.listdir(tmp_path) == []


PROBER = """
import os, sys
sys.path.insert(0, {root!r})
from engine.store import runlock
run_dir, stop = sys.argv[1], sys.argv[2]
probes = held = 0
print("probing", flush=True)
while not os.path.exists(stop):
    probes += 1
    held += runlock.holder(run_dir) is not None
print(probes, held, flush=True)
"""


def test_another_process_probing_holder_never_makes_acquire_fail(tmp_path):
    """The app polls holder() on every folder it shows; a writer starting meanwhile must get in."""
    runlock.acquire(str(tmp_path)).release()  # the lock file exists: every probe takes it, shared, for a moment
    stop = tmp_path / "stop"
    prober = subprocess.Popen([sys.executable, "-c", PROBER.format(root=str(ROOT)), str(tmp_path), str(stop)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert prober.stdout.readline().strip() == "probing"
        # Negative control: an acquire that does not wait out a probe collides with one, so the
        # probes below really contend for the lock.
        collided = False
        deadline = time.monotonic() + 30
        while not collided and time.monotonic() < deadline:
            try:
                runlock.acquire(str(tmp_path), wait=0).release()
            except runlock.RunFolderBusy:
                collided = True
        assert collided, "no probe was ever seen holding the lock file: nothing to test against"
        for _ in range(200):
            runlock.acquire(str(tmp_path)).release()  # never RunFolderBusy: the wait covers a probe
        stop.touch()
        probes, held = map(int, prober.stdout.readline().split())
        assert probes > 0 and held > 0  # it probed all along, and saw this process hold the lock
        assert prober.wait(timeout=10) == 0
    finally:
        stop.touch()
        prober.kill()
        prober.wait()


def test_a_forked_child_does_not_keep_a_killed_writers_lock(tmp_path):
    holder_proc, lines = start_holder(tmp_path, "fork")
    child = int(lines[0])
    try:
        kill(holder_proc)
        os.kill(child, 0)  # the child is still alive ...
        assert runlock.holder(str(tmp_path)) is None  # ... and holds nothing
        runlock.acquire(str(tmp_path)).release()
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_lock_file_says_who_and_when(tmp_path):
    before = time.time()
    lock = runlock.acquire(str(tmp_path))
    data = json.loads((tmp_path / runlock.LOCK_NAME).read_text())
    assert data["pid"] == os.getpid() and before <= data["started"] <= time.time()
    lock.release()


def test_remove_orphans_needs_the_writer_lock_of_that_folder(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / ".tmp-abc.pt").write_bytes(b"x")
    other = tmp_path / "other"
    other.mkdir()
    with runlock.acquire(str(other)) as wrong:
        with pytest.raises(RuntimeError):
            ckpt.remove_orphans(str(tmp_path), wrong)
    released = runlock.acquire(str(tmp_path))
    released.release()
    with pytest.raises(RuntimeError):
        ckpt.remove_orphans(str(tmp_path), released)
    assert (tmp_path / "checkpoints" / ".tmp-abc.pt").exists()
    with runlock.acquire(str(tmp_path)) as lock:
        assert ckpt.remove_orphans(str(tmp_path), lock) == [".tmp-abc.pt"]
