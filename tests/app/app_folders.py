"""Run folders the app tests make: an engine-made run.db damaged the way other programs leave
one, a process that holds a folder's writer lock, and a folder's files and sizes."""
from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from engine.declarations.events import EpochEnd, RunFinished, RunStarted, StepMetrics
from engine.store import RunStore

# Holds the writer lock of argv[1] (argv[2]: the repository) until killed; prints 'locked' first.
LOCKER = "import sys, time\nsys.path.insert(0, sys.argv[2])\nfrom engine.store import runlock\n" \
         "lock = runlock.acquire(sys.argv[1])\nprint('locked', flush=True)\ntime.sleep(120)\n"


def tree(folder: Path) -> dict[str, int]:
    """Files and sizes, but SQLite's -wal/-shm, which any reader of a WAL database may create."""
    return {os.path.relpath(os.path.join(b, f), folder): os.path.getsize(os.path.join(b, f))
            for b, _, fs in os.walk(folder) for f in fs if not f.endswith(("-wal", "-shm"))}


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
