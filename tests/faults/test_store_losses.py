"""The store says when it loses something (issue 23): run.db deleted while the engine trains is
written back at the end with every row; rows run.db cannot take for good are counted at the end,
the exit code is not 0, and the run's status does not stay "running" where it can be saved.
The real engine (a task that deletes run.db, in this process; RLIMIT_FSIZE for a WAL that cannot
grow, in a process of its own) and the real RunStore."""
from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys

import pytest

from engine.declarations.events import StepMetrics
from engine.store import RunReader, RunStore
from engine_in_process import engine
from testkit import ROOT, subprocess_env

HERE = os.path.join(ROOT, "tests", "faults")
TASK = os.path.join(HERE, "ckpt_task.py")
RUN = ("--task", TASK, "--device", "cpu", "--micro-batch", "8", "--accum", "1", "--epochs", "2")  # 64 steps


def sm(step: int) -> StepMetrics:
    return StepMetrics(step, 1, loss=0.5, grad_norm=1.0, clipped=False, lr=1e-3, accum=2, clip=1.0, micro_batch=4,
                       samples=8, tokens=8, step_time=0.01, throughput=800.0, nonfinite=False, scaler_skipped=False)


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if not line.startswith("[")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def gone(run_dir) -> None:
    for name in ("run.db", "run.db-wal", "run.db-shm"):
        try:
            os.unlink(os.path.join(run_dir, name))
        except FileNotFoundError:
            pass


def test_a_run_db_deleted_under_the_store_is_written_back_with_every_row(tmp_path):
    notes: list[str] = []
    store = RunStore(str(tmp_path), on_problem=notes.append)
    store.set_info(status="running")
    for i in range(1, 11):
        store.record(sm(i))
    assert store.commit()
    gone(tmp_path)
    for i in range(11, 21):
        store.record(sm(i))
    store.set_info(status="finished")
    assert store.close() and store.lost == ""
    reader = RunReader(str(tmp_path))
    assert [m["step"] for m in reader.metrics()] == list(range(1, 21)) and reader.info()["status"] == "finished"
    assert any("deleted" in n and "written back" in n for n in notes), notes
    db = sqlite3.connect(str(tmp_path / "run.db"))
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()


def test_a_run_db_deleted_with_its_folder_is_counted_as_lost(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    store = RunStore(str(run_dir))
    for i in range(1, 6):
        store.record(sm(i))
    assert store.commit()
    gone(run_dir)
    run_dir.rmdir()  # the user removed the run
    assert not store.close()
    assert store.lost.startswith("5 step rows") and "deleted with its folder" in store.lost, store.lost
    assert not run_dir.exists()  # never made again behind the user's back


@pytest.mark.slow  # trains (in this process)
def test_the_engine_writes_back_a_run_db_deleted_while_it_trains(tmp_path):
    run_dir = tmp_path / "run"
    r = engine(*RUN, "--task-arg", "delete_at=10", "--task-arg", f"folder={run_dir}", "--run-dir", run_dir)
    assert r.returncode == 0, r.stderr
    assert "run.db was deleted while the run wrote it: written back at the end of the run" in r.stderr, r.stderr
    reader = RunReader(str(run_dir))
    assert [m["step"] for m in reader.metrics()] == list(range(1, 65))  # before: no run.db at all
    assert reader.info()["status"] == "finished" and len(reader.epochs()) == 2
    assert any("deleted" in e["message"] for e in reader.events(kinds={"store_problem"}))


def schema_bytes(tmp_path) -> int:
    """The size of a new run.db once its tables are made (the WAL folded in)."""
    folder = tmp_path / "probe"
    folder.mkdir()
    RunStore(str(folder)).close()
    return os.path.getsize(folder / "run.db")


@pytest.mark.slow  # the rlimit: a process of its own
def test_rows_run_db_cannot_take_for_good_are_counted_and_the_exit_code_says_so(tmp_path):
    run_dir = tmp_path / "run"
    limit = schema_bytes(tmp_path) + 3000  # run.db's WAL can hardly grow: the rows stay in memory
    r = subprocess.run([sys.executable, os.path.join(HERE, "fsize.py"), str(limit), *RUN, "--run-dir", str(run_dir)],
                       env=subprocess_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    line = one_error_line(r.stderr)
    assert r.returncode == 1, r.stderr  # before: "run completed", exit 0
    assert line.startswith("error: run completed: 64 steps, but run.db did not take everything: "), line
    reader = RunReader(str(run_dir))
    on_disk = len(reader.metrics())
    missing = int(re.search(r"(\d+) step rows", line).group(1))
    assert missing == 64 - on_disk and missing > 0, line  # the count is what is missing
    info = reader.info()
    assert info.get("status") == "finished"  # not left "running": saved on its own
    assert "did not reach run.db" in info["store_lost"] and line.endswith("the run's status was saved")
    assert json.dumps(info["store_lost"])  # plain text, for the app
