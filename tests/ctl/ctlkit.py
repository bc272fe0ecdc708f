"""What the headroom-ctl tests share: a live engine run to steer, headroom-ctl's command line, a
follow stream read as it comes, and run.db's own rows and events to compare the stream with."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from engine.ctl.protocol import rows_of
from engine.store import RunReader, StoreError, runlock
from testkit import ROOT, run_cli, subprocess_env, wait_until

PY = sys.executable
# The builtin mlp with small windows, paced (paced_mlp.py): a step every ~40 ms on an idle machine,
# ~0.1 s on a busy one; the tests stop it, so --epochs only keeps it going until they do.
PACED_MLP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paced_mlp.py")
ENGINE_ARGS = ("--task", PACED_MLP, "--micro-batch", "8", "--accum", "2", "--epochs", "200", "--seed", "3")


def ctl(*args: Any, env: Optional[dict[str, str]] = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m engine.ctl args...` as a user runs it."""
    return run_cli("engine.ctl", *args, env=env, timeout=timeout)


def records(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


class LiveRun:
    """`python -m engine` training the (paced) mlp into run_dir until stopped."""

    def __init__(self, run_dir: str, *extra: str) -> None:
        self.run_dir = run_dir
        self.log = open(run_dir + ".log", "w")
        self.proc = subprocess.Popen([PY, "-m", "engine", *ENGINE_ARGS, "--run-dir", run_dir, *extra], cwd=ROOT,
                                     env=subprocess_env(), stdout=self.log, stderr=subprocess.STDOUT)

    def wait_live(self, rows: int = 1) -> None:
        """Until the engine holds the folder and has committed `rows` rows."""
        def ready() -> bool:
            assert self.proc.poll() is None, f"the engine ended: {open(self.run_dir + '.log').read()[-2000:]}"
            if runlock.holder(self.run_dir) is None or not os.path.exists(os.path.join(self.run_dir, "run.db")):
                return False
            try:
                return len(db_rows(self.run_dir)) >= rows
            except StoreError:  # run.db made, its tables not yet
                return False
        wait_until(ready, timeout=180, what=f"{rows} rows of a live run", interval=0.1)

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Stream:
    """A `follow --json` (or any command) read line by line in a thread as it writes."""

    def __init__(self, argv: list[str], env: Optional[dict[str, str]] = None) -> None:
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=subprocess_env(env), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.records: list[dict[str, Any]] = []
        self.stderr = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @classmethod
    def follow(cls, run: str, *args: Any, env: Optional[dict[str, str]] = None) -> "Stream":
        return cls([PY, "-m", "engine.ctl", "follow", "--json", *map(str, args), "--", run], env)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.endswith("\n"):  # a line cut by a kill is not a record
                self.records.append(json.loads(line))

    def rows(self) -> list[dict[str, Any]]:
        return replay(self.records)[0]

    def kill(self) -> None:
        self.proc.kill()
        self.finish()

    def finish(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()
        return code

    def cursor(self) -> tuple[int, Optional[int]]:
        """Where a broken stream goes on: the step after the last row, the last event id."""
        rows, events = replay(self.records)
        return (rows[-1]["step"] + 1 if rows else 0), (events[-1]["id"] if events else None)


@contextmanager
def followed_live_run(run_dir: str, follow: Callable[[str], "Stream"]) -> Iterator[LiveRun]:
    """A live run with 3 rows written, its `whole` a follow started as soon as the engine
    held the folder (so it saw every row from the first); both ended afterwards."""
    run = LiveRun(run_dir)
    try:
        run.wait_live(rows=0)
        run.whole = follow(run_dir)
        run.wait_live(rows=3)
        yield run
    finally:
        run.end()
        if run.__dict__.get("whole") is not None and run.whole.proc.poll() is None:
            run.whole.kill()


def replay(recs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows and events a client holds after these records (a rewind drops later rows)."""
    rows: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for r in recs:
        if r["kind"] == "rows":
            rows += rows_of(r)
        elif r["kind"] == "event":
            events.append(r["event"])
        elif r["kind"] == "rewind":
            rows = [x for x in rows if x["step"] <= r["to_step"]]
    return rows, events


def db_rows(run_dir: str) -> list[dict[str, Any]]:
    reader = RunReader(run_dir)
    try:
        return reader.metrics()
    finally:
        reader.close()


def db_events(run_dir: str) -> list[dict[str, Any]]:
    reader = RunReader(run_dir)
    try:
        return reader.events()
    finally:
        reader.close()


def written_run(run_dir: str, steps: int, status: str = "finished") -> str:
    """A run folder written through the store's API, no training: `steps` rows and an event."""
    from engine.declarations.events import CheckpointSaved, StepMetrics
    from engine.store import RunStore
    os.makedirs(run_dir, exist_ok=True)
    store = RunStore(run_dir)
    store.set_info(status=status, task="mlp", config={"accum": 2, "micro_batch": 8, "lr": 1e-3, "clip": 1.0})
    for s in range(1, steps + 1):
        store.record(StepMetrics(s, 1, loss=1.0 / s, grad_norm=0.5, clipped=False, lr=1e-3, accum=2, clip=1.0,
                                 micro_batch=8, samples=16, tokens=16, step_time=0.01, throughput=1600.0,
                                 nonfinite=False, scaler_skipped=False))
    store.record(CheckpointSaved(steps, 1, path=os.path.join(run_dir, "checkpoints", "last.pt")))
    store.close()
    return run_dir


def hold_lock(run_dir: str) -> subprocess.Popen:
    """A process that holds run_dir's writer lock and writes nothing: a live run with no new rows
    (paused, or stalled in a slow data loader)."""
    proc = subprocess.Popen([PY, "-c", "import sys, time\nfrom engine.store import runlock\n"
                             "lock = runlock.acquire(sys.argv[1])\nprint('locked', flush=True)\ntime.sleep(300)\n",
                             run_dir], cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc
