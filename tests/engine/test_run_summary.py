"""engine/store/summary.py: one summary of a run folder for the window's run table and
`headroom-ctl runs`, here and from a server (as JSON and back), whatever the record holds."""
from __future__ import annotations

import json
import sqlite3

from engine.store import labels, runlock
from engine.store.summary import RunSummary, from_record, summarize


def run_folder(path, status="finished", **info):
    path.mkdir(parents=True)
    db = sqlite3.connect(path / "run.db")
    db.execute("CREATE TABLE run (key TEXT PRIMARY KEY, value TEXT)")
    db.execute("CREATE TABLE epochs (epoch INTEGER PRIMARY KEY, step INTEGER, train_loss REAL, val_loss REAL,"
               " seconds REAL, time REAL)")
    db.executemany("INSERT INTO epochs VALUES (?, ?, 1.0, ?, 1.0, 1.0)", [(1, 10, 0.9), (2, 20, 0.7), (3, 30, 0.8)])
    cfg = {"lr": 0.01, "accum": 4, "micro_batch": 8, "lr_schedule": "cosine", "nonfinite": "skip"}
    for k, v in {"status": status, "started": 100.0, "task": "mlp", "config": cfg, "world_size": 2, **info}.items():
        db.execute("INSERT INTO run VALUES (?, ?)", (k, json.dumps(v)))
    db.commit()
    db.close()
    (path / "checkpoints").mkdir()
    (path / "checkpoints" / "last.pt").write_bytes(b"x" * 5000)
    return str(path)


def test_a_summary_survives_the_trip_through_json_as_a_server_sends_it(tmp_path):
    path = run_folder(tmp_path / "r", step=30)
    labels.change(path, add=["base", "sweep"], note="first\nsecond")
    s = summarize(path)
    assert isinstance(s, RunSummary)
    assert (s.settings["lr"], s.settings["accum"], s.effective_batch, s.schedule) == (0.01, 4, 8 * 4 * 2, "cosine")
    assert (s.best_val, s.final_val, s.epochs, s.steps) == (0.7, 0.8, 3, 30)
    assert s.size == sum(f.stat().st_size for f in (tmp_path / "r").rglob("*") if f.is_file())
    assert s.labels.tags == ("base", "sweep") and s.labels.note == "first\nsecond"
    back = from_record(json.loads(json.dumps(s.to_record())), path="host:" + path)
    assert back == RunSummary(**{**s.__dict__, "path": "host:" + path})


def test_any_record_a_server_sends_becomes_a_summary_without_an_error():
    for junk in ({}, {"status": 3, "settings": [1], "labels": "x", "marks": [[1, 2]], "rollbacks": [["a", 1, 2]],
                      "size": 1e300, "started": float("nan"), "world_size": -0.5},
                 {"labels": {"tags": [1, "ok", "x" * 500, "ok"], "note": 5, "archived": "yes"}}):
        s = from_record(junk)
        assert s.status in ("unknown", "3") and s.size is None and s.started is None and s.marks == ()
    assert from_record({"labels": {"tags": [1, "ok", "ok"], "archived": True}}).labels == labels.Labels(("ok",), "", True)
    assert from_record({"step": 7, "loss": 0.5}).steps == 7  # an older server's keys


def test_running_is_what_the_writer_lock_says(tmp_path):
    path = run_folder(tmp_path / "r", status="running")
    s = summarize(path)
    assert (s.status, s.live) == ("interrupted", False)  # run.db says running; nobody writes it
    lock = runlock.acquire(path)
    try:
        s = summarize(path)
        assert (s.status, s.live) == ("running", True)
    finally:
        lock.release()
