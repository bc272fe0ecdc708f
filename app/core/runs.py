"""The runs folder: what run folders it holds, and whether the process writing one is alive.
Torch-free. Where the folder is and what the built-in tasks are called come from
`engine.declarations.paths`, which both packages share.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from engine.store import DB_NAME, runlock, summary

is_run_dir = summary.is_run_dir


# Whether a process is alive, and who writes a run folder: the store's answer (the control CLI
# asks the same question without the app).
pid_alive = runlock.pid_alive
writer_of = runlock.writer


def is_live(path: str, info: Optional[dict[str, Any]] = None) -> bool:
    return writer_of(path, info) is not None


# What an engine writes in a run folder before its first step: nothing else is ever removed.
ENGINE_FILES = (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm", DB_NAME + "-journal", runlock.LOCK_NAME)


def _rows(db_path: str) -> Optional[int]:
    """Metrics rows (kept and discarded) in a run.db; None if it cannot be told."""
    import sqlite3
    from urllib.parse import quote
    try:
        db = sqlite3.connect(f"file:{quote(os.path.abspath(db_path))}?mode=ro", uri=True, timeout=1)
    except sqlite3.Error:
        return None
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        n = 0
        for t in ("metrics", "discarded_metrics"):
            if t in tables:
                n += int(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] or 0)
        return n
    except sqlite3.Error:
        return None
    finally:
        db.close()


def remove_if_empty(path: str, keep_folder: bool = False, own_pid: Optional[int] = None) -> bool:
    """Remove a run folder that holds nothing of a run: no metrics row (kept or discarded), no
    checkpoint, no file an engine does not write before its first step, and no live writer
    (but `own_pid`'s, whose engine thread has ended). Only the engine's files are removed,
    each by name; `keep_folder`: the folder itself stays (it was there before the run).
    Returns True if it removed the run. Anything it cannot be sure of is left as it is."""
    try:
        names = set(os.listdir(path))
    except OSError:
        return False
    held = runlock.holder(path)
    if held is not None and not (own_pid is not None and held.get("pid") == own_pid):
        return False
    ckpt = os.path.join(path, "checkpoints")
    if "checkpoints" in names:
        try:
            if not os.path.isdir(ckpt) or os.listdir(ckpt):
                return False  # a checkpoint, or the start of one
        except OSError:
            return False
    if names - set(ENGINE_FILES) - {"checkpoints"}:
        return False  # someone else's files
    if DB_NAME in names:
        n = _rows(os.path.join(path, DB_NAME))
        if n is None or n > 0:
            return False
    elif names & {DB_NAME + "-wal", DB_NAME + "-journal"}:
        return False  # a journal without its database: not ours to judge
    try:
        for name in ENGINE_FILES:  # the reading above may have made run.db's -wal and -shm again
            try:
                os.unlink(os.path.join(path, name))
            except FileNotFoundError:
                pass
        if "checkpoints" in names:
            os.rmdir(ckpt)
        if not keep_folder:
            os.rmdir(path)
    except OSError:
        return False
    return True


# One reader of what a run folder says, shared with headroom-ctl runs (engine/store/summary.py).
RolledBackRow = summary.RolledBackRow
RunSummary = summary.RunSummary
summarize = summary.summarize
list_runs = summary.list_runs
