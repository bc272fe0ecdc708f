"""Run history lists the runs under the runs folder (where it is comes from engine.declarations.paths)."""
from __future__ import annotations

import os

from app.core.runs import list_runs


def test_history_lists_runs_newest_first_and_marks_dead_ones(tmp_path):
    import json
    import sqlite3
    root = tmp_path / "runs"
    for name, status, started, pid in (("a", "finished", 1.0, 1), ("b", "running", 2.0, 2**22 + 12345),
                                       ("c", "running", 3.0, os.getpid())):
        d = root / name
        d.mkdir(parents=True)
        db = sqlite3.connect(d / "run.db")
        db.execute("CREATE TABLE run (key TEXT PRIMARY KEY, value TEXT)")
        for k, v in (("status", status), ("started", started), ("pid", pid), ("task", "mlp")):
            db.execute("INSERT INTO run VALUES (?, ?)", (k, json.dumps(v)))
        db.commit()
        db.close()
    (root / "not-a-run").mkdir()
    from engine.store import runlock
    lock = runlock.acquire(str(root / "c"))  # c's writer holds its lock (liveness is the lock, never a pid)
    try:
        runs = list_runs(str(root))
    finally:
        lock.release()
    assert [r.name for r in runs] == ["c", "b", "a"]
    assert [r.status for r in runs] == ["running", "interrupted", "finished"]
    assert [r.status for r in list_runs(str(root))][0] == "interrupted"  # its pid alive, its lock gone: not live
