"""What is on disk is what happened (issue 12): run.db takes rows on time, a busy or slow run.db
never ends a run, no string makes SQLite refuse a row, nothing is deleted on resume, and the
schema follows StepMetrics. Real SQLite, real processes where the process is the point (SIGKILL,
rlimits, another program holding run.db); the engine's runs otherwise in this process (engine_in_process.engine)."""
from __future__ import annotations

import inspect
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from typing import Optional

import pytest

from engine.checkpoints import files as ckpt
from engine.declarations.commands import SetAccum, Stop
from engine.declarations.events import CheckpointSaved, EpochEnd, StepMetrics
from engine.store import METRIC_COLUMNS, RunReader, RunStore, send_command
from engine_in_process import engine
from testkit import ROOT, subprocess_env, wait_until

TASK = os.path.join(ROOT, "tests", "faults", "fault_task.py")


def sm(step: int, epoch: int = 1, **kw) -> StepMetrics:
    base = dict(loss=0.5, grad_norm=1.0, clipped=False, lr=1e-3, accum=2, clip=1.0, micro_batch=4, samples=8,
                tokens=8, step_time=0.01, throughput=800.0, nonfinite=False, scaler_skipped=False)
    base.update(kw)
    return StepMetrics(step, epoch, **base)


def on_disk(run_dir) -> list[int]:
    db = sqlite3.connect(os.path.join(run_dir, "run.db"))
    try:
        return [r[0] for r in db.execute("SELECT step FROM metrics ORDER BY step")]
    finally:
        db.close()


def hold_write_lock(path, seconds: Optional[float]) -> subprocess.Popen:
    """Another program with an open write transaction on run.db (a backup tool, sqlite3 at a prompt),
    for `seconds`, or (None) until a line is written to its stdin."""
    wait = "sys.stdin.readline()" if seconds is None else f"time.sleep({seconds})"
    code = (f"import sqlite3, sys, time\ndb = sqlite3.connect({str(path)!r}, isolation_level=None, timeout=10)\n"
            "db.execute('BEGIN IMMEDIATE')\n"
            "db.execute(\"INSERT INTO run VALUES ('other program', '1')\")\n"
            f"print('held', flush=True)\n{wait}\ndb.execute('ROLLBACK')\nprint('released', flush=True)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         stdin=subprocess.PIPE if seconds is None else None)
    assert p.stdout.readline().strip() == "held"
    return p


def cli_env(**extra):
    return subprocess_env(extra)


# -- (a) on time ------------------------------------------------------------------------------
def test_rows_reach_disk_within_a_second_while_the_training_thread_is_stalled(tmp_path):
    store = RunStore(str(tmp_path))
    store.commit()
    for i in range(1, 6):
        store.record(sm(i))  # buffered: less than a second since the last commit
    t0 = time.monotonic()
    # The training thread now stalls (task code blocking): no further call into the store.
    while on_disk(tmp_path) != [1, 2, 3, 4, 5] and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    waited = time.monotonic() - t0
    assert on_disk(tmp_path) == [1, 2, 3, 4, 5]
    assert waited < 1.5, waited
    store.close()


# -- (b) busy or slow run.db ---------------------------------------------------------------------
@pytest.mark.slow
def test_a_busy_run_db_never_blocks_or_fails_the_writer_and_is_reported_once(tmp_path):
    problems: list[str] = []
    store = RunStore(str(tmp_path), on_problem=problems.append)
    store.record(sm(1))
    assert store.commit()
    holder = hold_write_lock(tmp_path / "run.db", 4)
    slowest = 0.0
    step = 1
    t_end = time.monotonic() + 3.5
    while time.monotonic() < t_end:  # a training loop at ~50 steps/s with events and commands
        step += 1
        t = time.monotonic()
        store.record(sm(step))
        if step % 20 == 0:
            store.record(EpochEnd(step, 1, train_loss=0.1, val_loss=None, seconds=1.0))
            store.pending_commands()
            store.commit()
        slowest = max(slowest, time.monotonic() - t)
        time.sleep(0.02)
    assert slowest < 2.5, slowest  # commit() waits at most its timeout, once; the rest never wait
    assert len(problems) == 1 and "another program" in problems[0] and "\n" not in problems[0]
    assert store.problem is not None
    assert holder.stdout.readline().strip() == "released"
    holder.wait()
    t0 = time.monotonic()
    while on_disk(tmp_path) != list(range(1, step + 1)) and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    assert on_disk(tmp_path) == list(range(1, step + 1))  # every row, once the lock is free
    assert store.problem is None  # the episode is over: a new one would be reported again
    assert store.close()
    assert len(problems) == 1
    assert len(RunReader(str(tmp_path)).events(kinds={"epoch_end"})) == step // 20


FULL_DISK = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from engine.declarations.events import EpochEnd, StepMetrics
from engine.store import RunStore
problems = []
store = RunStore(sys.argv[1], commit_interval=0.01, on_problem=problems.append)
store.commit()
limit = int(sys.argv[2])  # no file may grow past this: the disk is full
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
slowest = 0.0
for i in range(1, 4001):
    t = time.monotonic()
    store.record(StepMetrics(i, 1, loss=0.5, grad_norm=1.0, clipped=False, lr=1e-3, accum=2, clip=1.0,
                             micro_batch=4, samples=8, tokens=8, step_time=0.01, throughput=800.0,
                             nonfinite=False, scaler_skipped=False))
    if i % 100 == 0:
        store.record(EpochEnd(i, 1, train_loss=0.1, val_loss=None, seconds=1.0))
        store.commit()
    slowest = max(slowest, time.monotonic() - t)
    time.sleep(0.0005)
store.set_info(status="finished")
closed = store.close(timeout=1)
print(json.dumps(dict(problems=problems, slowest=slowest, closed=closed, unwritten=store.unwritten, lost=store.lost)))
"""


def full_disk(tmp_path, limit: int) -> dict:
    r = subprocess.run([sys.executable, "-c", FULL_DISK.format(root=str(ROOT)), str(tmp_path), str(limit)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr  # the old store raised StoreError out of record()
    out = json.loads(r.stdout)
    assert out["slowest"] < 2.5, out["slowest"]  # no call waited on the failing disk but commit()'s own bound
    assert "cannot be written" in out["problems"][0], out["problems"]
    return out


def metrics_and_info(tmp_path) -> tuple[list[int], dict]:
    db = sqlite3.connect(str(tmp_path / "run.db"))
    try:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)  # what is there is whole
        steps = [r[0] for r in db.execute("SELECT step FROM metrics ORDER BY step")]
        return steps, {k: json.loads(v) for k, v in db.execute("SELECT key, value FROM run")}
    finally:
        db.close()


@pytest.mark.slow
def test_a_full_disk_under_run_db_never_ends_the_writer_and_the_end_makes_room(tmp_path):
    """The WAL filled the room run.db has; at the end its pages move into run.db and the WAL
    file is truncated, which is room enough: every row reaches disk (before: 10% of them)."""
    out = full_disk(tmp_path, 400_000)
    assert out["closed"] and out["unwritten"] == 0 and out["lost"] == "", out
    steps, info = metrics_and_info(tmp_path)
    assert steps == list(range(1, 4001)) and info["status"] == "finished"


@pytest.mark.slow
def test_a_disk_full_for_good_says_what_did_not_reach_disk_and_saves_the_status(tmp_path):
    out = full_disk(tmp_path, 100_000)
    assert not out["closed"] and out["unwritten"] > 0, out
    steps, info = metrics_and_info(tmp_path)
    assert steps == list(range(1, len(steps) + 1)) and steps  # a prefix: nothing out of order or torn
    missing = 4000 - len(steps)
    assert f"{missing} step rows" in out["lost"] and "did not reach run.db" in out["lost"], out["lost"]
    assert out["problems"][-1] == f"run.db: {out['lost']}"
    assert info["status"] == "finished" and "did not reach run.db" in info["store_lost"]  # written alone
    assert out["lost"].endswith("the run's status was saved")


@pytest.mark.slow
def test_commands_polling_on_a_busy_run_db_never_waits_or_raises(tmp_path):
    store = RunStore(str(tmp_path))
    store.commit()
    send_command(str(tmp_path), SetAccum(3))
    holder = hold_write_lock(tmp_path / "run.db", 3)
    try:
        t = time.monotonic()
        rows = store.pending_commands()
        assert [(r[0], r[1]) for r in rows] == [(1, SetAccum(3))]
        store.mark_command(1, "received", 0)  # the write waits in memory (the old store: 30 s, then raised)
        assert store.pending_commands() == []  # row 1 is taken, even before its mark is on disk
        assert time.monotonic() - t < 0.5
    finally:
        holder.wait()
    t0 = time.monotonic()
    while store.unwritten and time.monotonic() - t0 < 5:  # the flusher writes it once the lock is free
        time.sleep(0.05)
    assert RunReader(str(tmp_path)).commands()[0]["status"] == "received"
    # Another program breaks the table: polling finds nothing, and says nothing, rather than raise.
    db = sqlite3.connect(str(tmp_path / "run.db"))
    db.execute("ALTER TABLE commands RENAME TO commands_gone")
    db.commit()
    db.close()
    assert store.pending_commands() == []
    store.close()


# The longest the store waits for run.db's write lock in one call while a run trains (the
# flusher's busy_timeout per try, commit()'s default bound), and the longest period of its own
# clock (a WAL checkpoint every CHECKPOINT_EVERY). The old store waited 30 s on the lock, then
# failed the run; this one has no such wait, so another program holds the lock past all of these
# with a margin, and past the end of training: close() must wait for it too.
LOCK_PATIENCE = max(RunStore.FLUSHER_BUSY_MS / 1000, inspect.signature(RunStore.commit).parameters["timeout"].default)
LOCK_HELD = RunStore.CHECKPOINT_EVERY + 2 * LOCK_PATIENCE  # at least; 14 s with today's constants


class LockHolder:
    """Another program takes run.db's write lock at the run's step 2 and lets go once it has held
    it LOCK_HELD seconds and the run has said run_finished (then 2 * LOCK_PATIENCE more: the
    run's close() waits for it), or after `give_up` seconds: a run that waited on the lock would
    never finish while it is held. Sees the run's events (engine_in_process.engine's watch)."""

    def __init__(self, run_dir, give_up: float = 180.0) -> None:
        self.db, self.give_up = run_dir / "run.db", give_up
        self.proc: Optional[subprocess.Popen] = None
        self.held_from = self.released_at = 0.0
        self.step_times: list[float] = []
        self._finished_at: list[float] = []
        self._finished = threading.Event()
        self._releaser = threading.Thread(target=self._release_when_done, daemon=True)

    def __call__(self, event) -> None:
        if event.kind == "step":
            self.step_times.append(time.monotonic())
            if event.step == 2 and self.proc is None:
                self.proc = hold_write_lock(self.db, None)
                self.held_from = time.monotonic()
                self._releaser.start()
        elif event.kind == "run_finished":
            self._finished_at.append(time.monotonic())
            self._finished.set()

    def _release_when_done(self) -> None:
        self._finished.wait(timeout=self.give_up)
        finished_at = self._finished_at[0] if self._finished_at else time.monotonic()
        until = max(self.held_from + LOCK_HELD, finished_at + 2 * LOCK_PATIENCE)
        time.sleep(max(0.0, until - time.monotonic()))
        self.released_at = time.monotonic()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write("release\n")
        self.proc.stdin.flush()

    def run_ended(self) -> None:
        """The engine returned (a run that failed says no run_finished): no more waiting for one."""
        self._finished.set()

    def stop(self) -> None:
        """The holder gone, whatever happened."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.slow
def test_another_program_holding_the_write_lock_longer_than_the_store_waits_never_ends_a_run(tmp_path):
    """The engine in this process; the program holding the lock is a process of its own."""
    run_dir = tmp_path / "run"
    holder = LockHolder(run_dir)
    try:
        r = engine("--task", TASK, "--micro-batch", "8", "--accum", "2", "--epochs", "3", "--run-dir", str(run_dir),
                   "--json", env={"HEADROOM_FAULT_SLOW": "0.1"}, watch=holder)
        holder.run_ended()
        assert holder.proc is not None and holder.proc.stdout.readline().strip() == "released"
    finally:
        holder.stop()
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert holder.released_at - holder.held_from >= LOCK_HELD
    during = [t for t in holder.step_times if holder.held_from < t < holder.released_at]
    assert len(during) > 20  # training went on under the lock ...
    assert max(b - a for a, b in zip(during, during[1:])) < 2 * LOCK_PATIENCE  # ... without waiting on it
    steps = [r["step"] for r in RunReader(str(run_dir)).metrics()]
    assert steps == list(range(1, 16 * 3 + 1))  # and every row landed
    assert RunReader(str(run_dir)).events(kinds={"run_finished"})


# -- (c) strings SQLite would refuse ---------------------------------------------------------
@pytest.mark.slow  # trains (in this process)
def test_a_run_folder_whose_name_is_not_utf8_runs_and_is_recorded(tmp_path):
    run_dir = os.fsdecode(os.fsencode(str(tmp_path)) + b"/run-\xff\xfe")  # surrogates in a str, as argv gives it
    r = engine("--task", TASK, "--micro-batch", "8", "--accum", "2", "--epochs", "1", "--run-dir", run_dir)
    assert r.returncode == 0, r.stderr
    reader = RunReader(run_dir)
    assert [m["step"] for m in reader.metrics()] == list(range(1, 17))
    saved = reader.events(kinds={"checkpoint"})
    assert saved and "run-\\xff\\xfe" in saved[-1]["message"]  # the bytes, shown, not refused


def test_every_value_reaches_sqlite_in_a_form_it_takes(tmp_path):
    store = RunStore(str(tmp_path))
    store.record(sm(1, loss=float("nan"), samples=2**70, tokens=-(2**80)))
    store.record(CheckpointSaved(1, 1, path="/x/\udcff\ud800/last.pt"))
    store.set_info(note="caf\udce9", big=10**400)
    assert store.close()
    reader = RunReader(str(tmp_path))
    m = reader.metrics()[0]
    assert m["loss"] is None and m["samples"] == float(2**70) and m["tokens"] == -float(2**80)
    assert reader.events(kinds={"checkpoint"})[0]["message"] == "checkpoint /x/\\xff\\ud800/last.pt"
    assert reader.info()["note"] == "caf\udce9"  # JSON escapes it: the same string comes back


# -- (e) the schema follows StepMetrics ---------------------------------------------------------
OLD_SCHEMA = """
CREATE TABLE run (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE metrics (step INTEGER PRIMARY KEY, epoch INTEGER, loss REAL, grad_norm REAL, lr REAL, accum INTEGER,
    clip REAL, micro_batch INTEGER, samples INTEGER, tokens INTEGER, nonfinite INTEGER, step_time REAL, time REAL);
CREATE TABLE epochs (epoch INTEGER PRIMARY KEY, step INTEGER, train_loss REAL, val_loss REAL, seconds REAL, time REAL);
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL, step INTEGER, epoch INTEGER, kind TEXT,
    message TEXT, data TEXT);
CREATE TABLE commands (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL, kind TEXT, payload TEXT,
    status TEXT DEFAULT 'pending', applied_step INTEGER, note TEXT);
INSERT INTO metrics (step, epoch, loss, accum) VALUES (1, 1, 2.5, 4), (2, 1, 2.0, 4);
"""


def test_an_old_run_db_opens_for_reading_and_gets_the_new_columns_when_written(tmp_path):
    db = sqlite3.connect(str(tmp_path / "run.db"))
    db.executescript(OLD_SCHEMA)
    db.close()
    rows = RunReader(str(tmp_path)).metrics()
    assert [r["loss"] for r in rows] == [2.5, 2.0] and rows[0]["throughput"] is None
    assert set(rows[0]) == set(METRIC_COLUMNS)
    assert RunReader(str(tmp_path)).discarded() == []  # no such table yet: nothing, not an error
    store = RunStore(str(tmp_path))
    store.discard_after(1, "resumed")
    store.record(sm(2, throughput=123.0, mem_total=7))
    assert store.close()
    db = sqlite3.connect(str(tmp_path / "run.db"))
    cols = {r[1] for r in db.execute("PRAGMA table_info(metrics)")}
    assert set(METRIC_COLUMNS) <= cols
    reader = RunReader(str(tmp_path))
    assert [(r["step"], r["throughput"], r["mem_total"]) for r in reader.metrics()] == [(1, None, None), (2, 123.0, 7)]
    assert [(r["step"], r["loss"], r["reason"]) for r in reader.discarded()] == [(2, 2.0, "resumed")]


NEW_FIELD = """
from __future__ import annotations
import dataclasses, sys
from typing import Optional
sys.path.insert(0, {root!r})
import engine.declarations.events as ev

@dataclasses.dataclass(frozen=True)
class StepMetrics(ev.StepMetrics):
    mem_future: Optional[int] = None
    ratio_future: float = 0.0
    flag_future: bool = False

ev.StepMetrics = StepMetrics   # as if events.py had gained the fields: nothing else edited
import engine.store as store
assert store.METRIC_COLUMNS[-4:] == ("mem_future", "ratio_future", "flag_future", "time"), store.METRIC_COLUMNS
s = store.RunStore(sys.argv[1])
s.record(StepMetrics(1, 1, loss=1.0, grad_norm=1.0, clipped=False, lr=0.1, accum=1, clip=0.0, micro_batch=1,
                     samples=1, tokens=1, step_time=0.1, throughput=1.0, nonfinite=False, scaler_skipped=False,
                     mem_future=12345, ratio_future=0.5, flag_future=True))
assert s.close()
row = store.RunReader(sys.argv[1]).metrics()[0]
print(row["mem_future"], row["ratio_future"], row["flag_future"])
"""


def test_a_new_step_metrics_field_reaches_disk_with_no_other_edit(tmp_path):
    r = subprocess.run([sys.executable, "-c", NEW_FIELD.format(root=str(ROOT)), str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["12345", "0.5", "1"]
    db = sqlite3.connect(str(tmp_path / "run.db"))
    types = {r[1]: r[2] for r in db.execute("PRAGMA table_info(metrics)")}
    assert (types["mem_future"], types["ratio_future"], types["flag_future"]) == ("INTEGER", "REAL", "INTEGER")


# -- resume never destroys ------------------------------------------------------------------
def test_a_step_written_twice_keeps_its_first_row(tmp_path):
    store = RunStore(str(tmp_path))
    store.record(sm(1, loss=1.0))
    store.commit()
    store.record(sm(1, loss=2.0))  # e.g. a rollback reran it
    store.record(sm(2, loss=3.0))
    store.record(sm(2, loss=4.0))
    assert store.close()
    reader = RunReader(str(tmp_path))
    assert [(m["step"], m["loss"]) for m in reader.metrics()] == [(1, 2.0), (2, 4.0)]
    assert sorted((m["step"], m["loss"], m["reason"]) for m in reader.discarded()) == [
        (1, 1.0, "superseded"), (2, 3.0, "superseded")]


@pytest.mark.slow
def test_resume_after_sigkill_moves_the_rows_past_the_checkpoint_aside(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--task", TASK, "--micro-batch", "8", "--accum", "2",
                             "--epochs", "2", "--run-dir", str(run_dir), "--json"], cwd=ROOT,
                            env=cli_env(HEADROOM_FAULT_SLOW="0.1"), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout:
            if json.loads(line)["kind"] == "epoch_end":  # epoch 1's checkpoint is saved
                break
        # Killed in epoch 2 (3 s of it at 0.1 s a micro-batch) once rows past that checkpoint are
        # on disk (within about a second): the rows the resume must move aside.
        wait_until(lambda: any(s > 16 for s in on_disk(run_dir)), timeout=60, what="a step row past step 16")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = {m["step"]: m for m in RunReader(str(run_dir)).metrics()}
    past = sorted(s for s in before if s > 16)
    assert past  # rows the resume will supersede
    r = engine("--resume", str(run_dir))  # the SIGKILL needed a process; the resume does not
    assert r.returncode == 0, r.stderr
    reader = RunReader(str(run_dir))
    assert [m["step"] for m in reader.metrics()] == list(range(1, 33))
    gone = reader.discarded()
    assert [m["step"] for m in gone] == past  # kept, not deleted ...
    assert all(m["loss"] == before[m["step"]]["loss"] and "resumed" in m["reason"] for m in gone)  # ... as they were


EARLIER_ENGINE = """
import sys, time
sys.path.insert(0, {root!r})
from engine.store import RunStore
store = RunStore(sys.argv[1])
store.commit()
print("open", flush=True)
sys.stdin.readline()
rows = store.pending_commands()
store.mark_command(rows[0][0], "received", 5)  # taken in, never applied: the engine is about to be killed
store.commit()
print(len(rows), flush=True)
time.sleep(60)
"""


def test_commands_left_pending_by_an_earlier_engine_expire_when_a_new_one_takes_the_run(tmp_path):
    first = subprocess.Popen([sys.executable, "-c", EARLIER_ENGINE.format(root=str(ROOT)), str(tmp_path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "open"
        send_command(str(tmp_path), SetAccum(3))
        send_command(str(tmp_path), Stop())
        first.stdin.write("go\n")
        first.stdin.flush()
        assert first.stdout.readline().strip() == "2"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    second = RunStore(str(tmp_path))
    assert second.expire_pending_commands("sent to an engine that died") == 2
    assert second.pending_commands() == []  # none of the old rows is taken ...
    send_command(str(tmp_path), SetAccum(5))
    assert [(r[0], r[1]) for r in second.pending_commands()] == [(3, SetAccum(5))]  # ... new ones are
    assert second.close()
    rows = RunReader(str(tmp_path)).commands()
    assert [(r["status"], r["note"]) for r in rows[:2]] == [("expired", "sent to an engine that died")] * 2
    assert rows[2]["status"] == "pending"


# -- (d) checkpoints: orphans and candidates ---------------------------------------------------
WRITER = """
import sys, torch
sys.path.insert(0, {root!r})
from engine.checkpoints import files as ckpt
path = sys.argv[1]
big = torch.zeros(16 * 2**20)
i = 0
while True:
    i += 1
    ckpt.save_atomic({{"model": {{"w": big}}, "step": i}}, path)
    print(i, flush=True)
"""


@pytest.mark.slow
def test_a_sigkill_during_a_checkpoint_write_leaves_an_orphan_the_next_writer_removes(tmp_path):
    from engine.store import runlock
    folder = tmp_path / "checkpoints"
    path = folder / "last.pt"
    for _attempt in range(6):
        p = subprocess.Popen([sys.executable, "-c", WRITER.format(root=str(ROOT)), str(path)], stdout=subprocess.PIPE,
                             text=True)
        try:
            assert p.stdout.readline().strip()  # one checkpoint is complete
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not any(n.startswith(".tmp-") for n in os.listdir(folder)):
                time.sleep(0.002)
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)
        finally:
            if p.poll() is None:
                p.kill()
        orphans = [n for n in os.listdir(folder) if n.startswith(".tmp-")]
        if orphans:
            break
    assert orphans, "never caught the writer mid-write"
    with runlock.acquire(str(tmp_path)) as lock:
        assert sorted(ckpt.remove_orphans(str(tmp_path), lock)) == sorted(orphans)
    assert os.listdir(folder) == ["last.pt"]
    assert ckpt.load(str(path))["step"] >= 1  # the last complete checkpoint is whole


def test_checkpoint_candidates_newest_first_and_load_newest_skips_damaged_ones(tmp_path):
    import torch
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name, step in (("epoch-1.pt", 16), ("epoch-2.pt", 32), ("epoch-10.pt", 160), ("step-40.pt", 40),
                       ("step-7.pt", 7), ("last.pt", 170)):
        torch.save({"model": {}, "step": step}, folder / name)
    (folder / ".tmp-abc.pt").write_bytes(b"half")
    (folder / "notes.txt").write_text("x")
    names = [os.path.basename(p) for p in ckpt.candidates(str(tmp_path))]
    assert names == ["last.pt", "epoch-10.pt", "epoch-2.pt", "epoch-1.pt", "step-40.pt", "step-7.pt"]
    data = (folder / "last.pt").read_bytes()
    (folder / "last.pt").write_bytes(data[: len(data) // 2])
    path, state, skipped = ckpt.load_newest(str(tmp_path))
    assert os.path.basename(path) == "epoch-10.pt" and state["step"] == 160
    assert len(skipped) == 1 and "damaged or truncated" in skipped[0]
    path, state, skipped = ckpt.load_newest(str(tmp_path), matches=lambda s: "past the run" if s["step"] > 100 else None)
    assert os.path.basename(path) == "epoch-2.pt" and len(skipped) == 2
    assert ckpt.load_newest(str(tmp_path / "nothing")) == (None, None, [])


def test_load_newest_never_steps_over_a_checkpoint_with_pickled_code(tmp_path):
    import pickle

    import torch
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    torch.save({"model": {}, "step": 1}, folder / "epoch-1.pt")
    with open(folder / "last.pt", "wb") as f:
        torch.save({"model": {}, "step": 2, "x": os.system}, f, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    with pytest.raises(ckpt.CheckpointRefused):
        ckpt.load_newest(str(tmp_path))
