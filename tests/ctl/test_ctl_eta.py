"""headroom-ctl status's ETA for a run continued with --resume: the pace of the current segment's
steps past its warm-up, not of a span across the hours between the segments (an ETA of days for a
run an hour from its end), and none from a segment's first steps. Qt-free: a run folder written
by the store, its times set as a run continued an hour after step 20 would have them."""
from __future__ import annotations

import sqlite3

import pytest

from engine.ctl.local import ETA_ROWS, MIN_PACED, WARMUP_STEPS, _eta
from engine.declarations.events import StepMetrics
from engine.store import RunReader, RunStore

T0, PACE, PLANNED = 1_000_000.0, 0.5, 1000


def continued_run(path, steps: int, resumed_after: int = 20) -> tuple[str, float]:
    path.mkdir()
    store = RunStore(str(path))
    store.set_info(status="running", task="mlp", config={"max_steps": PLANNED, "epochs": 1})
    for s in range(1, steps + 1):
        store.record(StepMetrics(s, 1, loss=1.0, grad_norm=1.0, clipped=False, lr=1e-3, accum=1, clip=0.0,
                                 micro_batch=8, samples=8, tokens=8, step_time=PACE, throughput=16.0,
                                 nonfinite=False, scaler_skipped=False))
    store.close()
    resumed = T0 + 3600.0
    db = sqlite3.connect(str(path / "run.db"))
    with db:
        db.execute("UPDATE metrics SET time = ? + step * ? WHERE step <= ?", (T0, PACE, resumed_after))
        db.execute("UPDATE metrics SET time = ? + (step - ?) * ? WHERE step > ?", (resumed, resumed_after, PACE,
                                                                                  resumed_after))
        db.executemany("INSERT INTO events (time, step, epoch, kind, message, data) VALUES (?, ?, 1, 'run_started', "
                       "'', '{}')", [(T0, 0), (resumed, resumed_after)])
    db.close()
    return str(path), resumed


def eta(run_dir: str, since: float):
    reader = RunReader(run_dir)
    try:
        return _eta(reader.info(), reader, reader.last_metrics(ETA_ROWS), since)
    finally:
        reader.close()


def test_the_eta_of_a_continued_run_is_its_new_segments_pace(tmp_path):
    run_dir, resumed = continued_run(tmp_path / "run", 30)
    assert eta(run_dir, resumed) == pytest.approx((PLANNED - 30) * PACE)  # was days: the hour between counted


def test_no_eta_from_a_segments_first_steps(tmp_path):
    run_dir, resumed = continued_run(tmp_path / "run", 20 + WARMUP_STEPS + MIN_PACED)
    assert eta(run_dir, resumed) is None  # one step short: the warm-up is not the pace
    run_dir, resumed = continued_run(tmp_path / "run2", 20 + WARMUP_STEPS + MIN_PACED + 1)
    assert eta(run_dir, resumed) == pytest.approx((PLANNED - 28) * PACE)
