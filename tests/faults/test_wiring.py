"""Issue 12 end to end, through the engine's command line (engine.cli.main, in this process; the
run lock's other holder is a real second process): what needs the trainer to call the run lock,
the orphan sweep and the command expiry."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.declarations.commands import SetAccum
from engine.store import RunReader, runlock, send_command
from engine_in_process import copy_run, engine, trained
from testkit import ROOT

TASK = os.path.join(ROOT, "tests", "faults", "fault_task.py")


cli = engine


@pytest.fixture(scope="module")
def finished_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished 1-epoch run for the module, made once; each test resumes a copy of it."""
    home = tmp_path_factory.mktemp("finished")
    run_dir = home / "run"
    trained(home, "--task", TASK, "--epochs", "1", "--micro-batch", "8", "--accum", "2", "--run-dir", str(run_dir))
    return run_dir


@pytest.fixture
def finished_run(finished_template: Path, tmp_path: Path) -> Path:
    """This test's own copy of the finished run."""
    return copy_run(finished_template, tmp_path / "run")


def tree(folder):
    """Files and sizes, but SQLite's -wal/-shm, which any reader of a WAL database may create."""
    return {os.path.relpath(os.path.join(b, f), folder): os.path.getsize(os.path.join(b, f))
            for b, _, fs in os.walk(folder) for f in fs if not f.endswith(("-wal", "-shm"))}


@pytest.mark.slow  # the other writer: a process of its own
def test_resume_of_a_run_another_process_writes_is_refused_naming_it(finished_run):
    run_dir = finished_run
    holder = subprocess.Popen([sys.executable, "-c", f"import sys, time\nsys.path.insert(0, {str(ROOT)!r})\n"
                               "from engine.store import runlock\nlock = runlock.acquire(sys.argv[1])\n"
                               "print('locked', flush=True)\ntime.sleep(60)\n", str(run_dir)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = tree(run_dir)
        r = cli("--resume", str(run_dir), "--epochs", "2")
        assert r.returncode == 2
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and f"pid {holder.pid}" in lines[0], r.stderr
        assert tree(run_dir) == before  # nothing written
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow  # trains (in this process)
def test_a_resumed_run_removes_a_killed_writers_temporary_files_and_holds_the_lock_while_it_runs(finished_run):
    run_dir = finished_run
    orphan = run_dir / "checkpoints" / ".tmp-killed.pt"
    orphan.write_bytes(b"half a checkpoint")
    r = cli("--resume", str(run_dir), "--epochs", "2")
    assert r.returncode == 0, r.stderr
    assert not orphan.exists()
    assert runlock.holder(str(run_dir)) is None  # released at the end
    assert os.path.exists(run_dir / runlock.LOCK_NAME)


@pytest.mark.slow  # trains (in this process)
def test_a_command_sent_to_a_dead_run_expires_when_it_is_resumed(finished_run):
    run_dir = finished_run
    send_command(str(run_dir), SetAccum(3))
    r = cli("--resume", str(run_dir), "--epochs", "2")
    assert r.returncode == 0, r.stderr
    reader = RunReader(str(run_dir))
    assert [c["status"] for c in reader.commands()] == ["expired"]
    assert {m["accum"] for m in reader.metrics()} == {2}
