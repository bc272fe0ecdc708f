"""What the engine reads from and writes to a run folder's files is input (issue 31): a sharded
checkpoint's .metadata and values are never unpickled as code; a link put in a run folder is never
written through; headroom-export replaces only a regular file; a copied folder is not a live run;
of two checkpoints of one name the newer is taken and said; a refusal writes nothing; a damaged
sharded checkpoint is one `error:` line naming the file, exit 2. Real run folders: one 2-rank
--strategy fsdp run under torchrun (gloo, CPU) made once, and a one-process run, both copied per
test."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from engine_in_process import copy_run, engine
from testkit import ROOT, isolated_env, run_cli

TASK = os.path.join(ROOT, "tests", "faults", "ckpt_task.py")
BASE = ("--task", TASK, "--device", "cpu", "--micro-batch", "4", "--accum", "1")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def torchrun(n: int, *args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*TORCHRUN, "--nproc-per-node", str(n), "-m", "engine", *map(str, args)], cwd=ROOT,
                          env={**os.environ, **isolated_env(cwd), "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=400)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 ranks, --strategy fsdp, finished at step 3: checkpoints/last/ (step 3) and step-2/."""
    base = tmp_path_factory.mktemp("sharded")
    r = torchrun(2, *BASE, "--strategy", "fsdp", "--max-steps", "3", "--checkpoint-every", "2",
                 "--run-dir", base / "run", cwd=base)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert (base / "run" / "checkpoints" / "last" / ".metadata").is_file()
    return base / "run"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("plain")
    r = engine(*BASE, "--max-steps", "4", "--run-dir", base / "run", env=isolated_env(base))
    assert r.returncode == 0, r.stderr[-2000:]
    return base / "run"


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith(("[", "note:"))]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def export(*args: object) -> subprocess.CompletedProcess:
    return run_cli("engine.export", *args, timeout=300)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(folder: Path) -> dict[str, str]:
    """Every file's digest (a link, a folder: "-"); not the lock file, nor the -wal and -shm files
    SQLite makes for any reader of run.db (run.db itself is compared)."""
    return {str(p.relative_to(folder)): (digest(p) if p.is_file() and not p.is_symlink() else "-")
            for p in sorted(folder.rglob("*"))
            if p.name != ".writer.lock" and (p.is_symlink() or p.name not in ("run.db-wal", "run.db-shm"))}


def status_and_events(run: Path) -> tuple[str, list[str]]:
    db = sqlite3.connect(run / "run.db")
    try:
        info = {k: json.loads(v) for k, v in db.execute("SELECT key, value FROM run")} if _has(db, "run") else {}
        kinds = [k for (k,) in db.execute("SELECT kind FROM events ORDER BY id")]
    finally:
        db.close()
    return str(info.get("status")), kinds


def _has(db: sqlite3.Connection, table: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE name=?", (table,)).fetchone() is not None


class Boom:
    """What a crafted file holds: unpickled as code, it leaves a file at `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


# -- 1. nothing read from a run folder is run --------------------------------------------------

def craft_metadata(folder: Path, marker: Path) -> None:
    (folder / ".metadata").write_bytes(pickle.dumps(Boom(marker)))


def craft_value(folder: Path, marker: Path) -> None:
    """The optimizer's lr (a non-tensor value, which torch.distributed.checkpoint itself reads with
    weights_only=False) replaced by a pickled call: appended to a shard, the metadata pointing there."""
    import io

    import torch
    meta = pickle.loads((folder / ".metadata").read_bytes())
    key = next(k for k in meta.storage_data if k.fqn == "optimizer.param_groups.0.lr")
    info = meta.storage_data[key]
    buf = io.BytesIO()
    torch.save(Boom(marker), buf)
    shard = folder / info.relative_path
    offset = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(buf.getvalue())
    info.offset, info.length = offset, len(buf.getvalue())
    (folder / ".metadata").write_bytes(pickle.dumps(meta))


@pytest.mark.parametrize("craft", [craft_metadata, craft_value], ids=["metadata", "value"])
def test_a_crafted_sharded_checkpoint_runs_no_code(sharded: Path, tmp_path: Path, craft) -> None:
    run = copy_run(sharded, tmp_path / "run")
    marker = tmp_path / "ran-code"
    for name in ("last", "step-2"):
        craft(run / "checkpoints" / name, marker)
    before = tree(run)
    attempts = {
        "export": export(run, tmp_path / "out.pt"),
        "resume": engine("--resume", run, "--max-steps", "5", env=isolated_env(tmp_path)),
        "fork": engine(*BASE, "--fork", run, "--run-dir", tmp_path / "fork", "--max-steps", "5",
                       env=isolated_env(tmp_path)),
    }
    for what, r in attempts.items():
        assert not marker.exists(), f"{what} ran code from the checkpoint"
        assert r.returncode == 2, (what, r.stderr[-2000:])
        line = one_error_line(r.stderr)
        assert "refused" in line and "never runs code" in line and "checkpoints" in line, (what, line)
    assert tree(run) == before and not (tmp_path / "out.pt").exists() and not (tmp_path / "fork").exists()


# -- 7. a damaged sharded checkpoint -----------------------------------------------------------

def cut_metadata(folder: Path) -> str:
    data = (folder / ".metadata").read_bytes()
    (folder / ".metadata").write_bytes(data[: len(data) // 3])
    return str(folder / ".metadata")


def missing_shard(folder: Path) -> str:
    shard = sorted(folder.glob("*.distcp"))[-1]
    shard.unlink()
    return str(shard)


def short_shard(folder: Path) -> str:
    shard = sorted(folder.glob("*.distcp"))[-1]
    shard.write_bytes(shard.read_bytes()[:100])
    return str(shard)


@pytest.mark.parametrize("damage", [cut_metadata, missing_shard, short_shard])
def test_a_damaged_sharded_checkpoint_is_one_line_naming_the_file(sharded: Path, tmp_path: Path, damage) -> None:
    run = copy_run(sharded, tmp_path / "run")
    named = [damage(run / "checkpoints" / name) for name in ("last", "step-2")]
    before = tree(run)
    for what, r in {
        "export": export(run, tmp_path / "out.pt"),
        "resume": engine("--resume", run, "--max-steps", "5", env=isolated_env(tmp_path)),
        "fork": engine(*BASE, "--fork", f"{run}@step-2", "--run-dir", tmp_path / "fork", "--max-steps", "5",
                       env=isolated_env(tmp_path)),
    }.items():
        assert r.returncode == 2, (what, r.stderr[-3000:])
        line = one_error_line(r.stderr)
        assert any(n in line for n in named), (what, line)
    assert tree(run) == before and not (tmp_path / "fork").exists() and not (tmp_path / "out.pt").exists()


# -- 2. a link in a run folder is never written through ---------------------------------------

@pytest.mark.parametrize("name", [".writer.lock", "run.db-wal", "checkpoints/last.pt"])
def test_a_link_in_the_run_folder_is_refused_and_not_written_through(finished: Path, tmp_path: Path,
                                                                      name: str) -> None:
    run = copy_run(finished, tmp_path / "run")
    outside = tmp_path / "outside.txt"
    outside.write_text("someone else's file\n")
    (run / name).unlink(missing_ok=True)
    (run / name).symlink_to(outside)
    before = tree(run)
    r = engine("--resume", run, "--max-steps", "6", env=isolated_env(tmp_path))
    assert r.returncode == 2, r.stderr[-2000:]
    line = one_error_line(r.stderr)
    assert "symbolic link" in line and name.split("/")[-1] in line, line
    assert outside.read_text() == "someone else's file\n"
    assert tree(run) == before and (run / name).is_symlink()


# -- 3. headroom-export's OUT -----------------------------------------------------------------

def test_export_replaces_only_a_regular_file(finished: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "keep.txt").write_text("mine")
    for out in (str(models), str(models) + os.sep):
        r = export(finished, out)
        assert r.returncode == 2, r.stderr
        assert "folder" in one_error_line(r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"] and (models / "keep.txt").read_text() == "mine"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # a special file, as /dev/null is: never replaced by a regular file
    link = tmp_path / "link.pt"
    (tmp_path / "target.pt").write_text("not a checkpoint")
    link.symlink_to(tmp_path / "target.pt")
    for out, words in ((fifo, "special file"), (link, "symbolic link")):
        r = export(finished, out)
        assert r.returncode == 2 and words in one_error_line(r.stderr), r.stderr
    assert fifo.is_fifo() and link.is_symlink() and (tmp_path / "target.pt").read_text() == "not a checkpoint"
    plain = tmp_path / "weights.pt"
    plain.write_text("an older export")
    r = export(finished, plain)
    assert r.returncode == 0, r.stderr
    import torch
    assert torch.load(plain, weights_only=True)["step"] == 4


# -- 4. liveness is the lock --------------------------------------------------------------------

def test_a_copied_folder_is_not_a_live_run(finished: Path, tmp_path: Path) -> None:
    from engine.store import RunReader, RunStore, runlock
    from engine.store.summary import summarize
    run = copy_run(finished, tmp_path / "run")  # copied without .writer.lock
    other = subprocess.Popen(["sleep", "120"])
    try:
        store = RunStore(str(run))
        store.set_info(status="running", pid=other.pid)  # as the copied run.db said while it trained
        store.close()
        reader = RunReader(str(run))
        info = reader.info()
        reader.close()
        assert runlock.writer(str(run), info) is None
        assert summarize(str(run)).live is False
        status = run_cli("engine.ctl", "status", run, timeout=120)
        assert f"pid {other.pid}" not in status.stdout, status.stdout
        follow = run_cli("engine.ctl", "follow", run, timeout=60)  # ends: nobody writes the folder
        assert follow.returncode in (0, 1), follow.stderr
    finally:
        other.kill()
        other.wait()


# -- 5. of last.pt and last/, the newer ---------------------------------------------------------

def test_of_two_checkpoints_of_one_name_the_newer_is_taken_and_said(sharded: Path, tmp_path: Path) -> None:
    run = copy_run(sharded, tmp_path / "run")
    older = tmp_path / "step-2.pt"
    assert export(f"{run}@step-2", older).returncode == 0
    shutil.copy(older, run / "checkpoints" / "last.pt")  # a crash between writing last/ and removing last.pt
    r = export(run, tmp_path / "out.pt")
    assert r.returncode == 0 and "last.pt" in r.stderr and "newer" in r.stderr, r.stderr
    import torch
    assert torch.load(tmp_path / "out.pt", weights_only=True)["step"] == 3
    r = engine("--resume", run, "--max-steps", "4", env=isolated_env(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "newer" in r.stdout + r.stderr
    db = sqlite3.connect(run / "run.db")
    try:
        again = db.execute("SELECT count(*) FROM discarded_metrics WHERE step = 3").fetchone()[0]
    finally:
        db.close()
    assert again == 0  # continued from step 3: step 3 was not trained again


# -- 6. a refusal writes nothing ----------------------------------------------------------------

def test_a_refused_resume_on_three_ranks_leaves_the_finished_run_as_it_was(sharded: Path, tmp_path: Path) -> None:
    run = copy_run(sharded, tmp_path / "run")
    before, (status, kinds) = tree(run), status_and_events(run)
    r = torchrun(3, "--resume", run, "--strategy", "fsdp", "--device", "cpu", cwd=tmp_path)
    assert r.returncode != 0 and "does not split over 3 ranks" in r.stdout + r.stderr, r.stderr[-3000:]
    assert status == "finished" and status_and_events(run) == (status, kinds)  # no run_failed, still finished
    assert tree(run) == before
    assert not (run / ".writer.lock").exists()  # the copy had none: none made
    assert "error: checkpoint" in r.stderr, r.stderr[-3000:]  # one line naming it (torchrun's own report follows)


def test_a_fork_refused_after_loading_leaves_no_folder(sharded: Path, tmp_path: Path) -> None:
    """A shard whose bytes are garbage (the metadata and sizes are right) is refused only when
    read: the fork's folder is made after that, so there is none."""
    run = copy_run(sharded, tmp_path / "run")
    for shard in (run / "checkpoints" / "step-2").glob("*.distcp"):
        shard.write_bytes(b"\0" * shard.stat().st_size)
    fork = tmp_path / "fork"
    r = engine(*BASE, "--fork", f"{run}@step-2", "--run-dir", fork, "--max-steps", "5", env=isolated_env(tmp_path))
    assert r.returncode == 2, r.stderr[-3000:]
    one_error_line(r.stderr)
    assert not fork.exists()


def test_a_refused_torchrun_start_leaves_no_folder(sharded: Path, tmp_path: Path) -> None:
    run = copy_run(sharded, tmp_path / "run")
    for shard in (run / "checkpoints" / "step-2").glob("*.distcp"):
        shard.write_bytes(b"\0" * shard.stat().st_size)
    fork = tmp_path / "fork"
    r = torchrun(2, *BASE, "--strategy", "fsdp", "--fork", f"{run}@step-2", "--run-dir", fork, "--max-steps", "5",
                 cwd=tmp_path)
    assert r.returncode != 0, r.stderr[-3000:]
    assert not fork.exists(), sorted(str(p) for p in fork.rglob("*"))
