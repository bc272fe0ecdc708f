"""The runs folder: what run folders it holds, and whether the process writing one is alive.
Torch-free. Where the folder is and what the built-in tasks are called come from
`engine.declarations.paths`, which both packages share.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Optional

from engine.store import DB_NAME, RunReader, StoreError, runlock


def is_run_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, DB_NAME))


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


@dataclass(frozen=True)
class RolledBackRow:
    """A rolled_back event's where and why (enough to say how a run gave up)."""
    to_step: int
    from_step: int
    reason: str


@dataclass
class RunSummary:
    path: str
    name: str
    task: str
    status: str  # running, finished, failed, interrupted, unknown
    started: Optional[float]
    steps: Optional[int]
    finished: Optional[float] = None  # wall clock of its end
    finish_reason: Optional[str] = None  # run_finished's reason, or run_failed's error
    nonfinite_mode: Optional[str] = None  # its --nonfinite
    rollbacks: tuple[RolledBackRow, ...] = ()
    final_loss: Optional[float] = None
    # Where its segments start and end, as run.db says (a run continued with --resume has one per
    # engine that took the folder): (kind, time, time of the last row before it) of each
    # run_started, run_finished and run_failed event, in order, as stored (app/model/run_time.py
    # reads them); and the time of its last row (where a segment that said no end ended).
    marks: tuple[tuple[str, Any, Any], ...] = ()
    last_row: Any = None

    def label(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.started)) if self.started else "?"
        steps = f", {self.steps} steps" if self.steps else ""
        return f"{self.name}  [{self.task}, {self.status}{steps}]  {when}"


def summarize(path: str) -> Optional[RunSummary]:
    try:
        reader = RunReader(path)
    except StoreError:
        return None
    try:
        info = reader.info()
    except StoreError:
        info = {}
    try:
        ending = _ending_rows(reader)
    finally:
        reader.close()
    status = str(info.get("status") or "unknown")
    if status == "running" and not is_live(path, info):
        status = "interrupted"
    started, finished = info.get("started"), info.get("finished")
    steps = info.get("step")
    raw_cfg = info.get("config")
    cfg = raw_cfg if isinstance(raw_cfg, dict) else {}
    return RunSummary(path=os.path.abspath(path), name=os.path.basename(os.path.normpath(path)),
                      task=str(info.get("task") or "?"), status=status,
                      started=float(started) if isinstance(started, (int, float)) else None,
                      steps=int(steps) if isinstance(steps, int) else None,
                      finished=float(finished) if isinstance(finished, (int, float)) else None,
                      nonfinite_mode=str(cfg.get("nonfinite") or "") or None, **ending)


def _ending_rows(reader: RunReader) -> dict[str, Any]:
    """How the run ended and when its segments ran, from its events (run_started, run_finished,
    run_failed, rolled_back) and its last row, read with a few small queries; {} for a run.db
    that cannot say."""
    import json
    import sqlite3
    out: dict[str, Any] = {}
    try:
        db = reader.connection
        rows = db.execute("SELECT kind, data, time FROM events WHERE kind IN ('run_started', 'run_finished', "
                          "'run_failed', 'rolled_back') ORDER BY id").fetchall()
        out["marks"] = _marks(db, [(kind, t) for kind, _d, t in rows if kind != "rolled_back"])
        rolled: list[RolledBackRow] = []
        for kind, raw, _t in rows:
            if kind == "run_started":  # a continued run: how an earlier segment ended is not how the run did
                out.pop("finish_reason", None)
                continue
            try:
                data = json.loads(raw) if raw else {}
            except (TypeError, ValueError):
                data = {}
            if not isinstance(data, dict):
                continue
            if kind == "rolled_back":
                try:
                    rolled.append(RolledBackRow(int(data["to_step"]), int(data["from_step"]), str(data.get("reason"))))
                except (KeyError, TypeError, ValueError):
                    continue
            else:
                out["finish_reason"] = str(data.get("reason" if kind == "run_finished" else "error") or "")
        out["rollbacks"] = tuple(rolled)
        last = db.execute("SELECT loss FROM metrics ORDER BY step DESC LIMIT 1").fetchone()
        if last is not None and isinstance(last[0], (int, float)):
            out["final_loss"] = float(last[0])
        if out["marks"] and out["marks"][-1][0] == "run_started":  # the last segment said no end (yet)
            out["last_row"] = _last_row_before(db, None)
    except (sqlite3.Error, AttributeError):
        return out
    return out


def _marks(db: Any, marks: list[tuple[str, Any]]) -> tuple[tuple[str, Any, Any], ...]:
    """Each mark with, for a run_started after a segment that said no end (its process died),
    the time of the last row written before it: one query each, only for those."""
    out = []
    for i, (kind, t) in enumerate(marks):
        before = _last_row_before(db, t) if kind == "run_started" and i and marks[i - 1][0] == "run_started" else None
        out.append((kind, t, before))
    return tuple(out)


def _last_row_before(db: Any, t: Any) -> Any:
    """The newest `time` of a metrics row, kept or discarded (a resume sets apart the rows past
    its checkpoint: they were trained all the same), before `t` (None: of all)."""
    import sqlite3
    newest = None
    for table in ("metrics", "discarded_metrics"):
        try:
            sql = f"SELECT max(time) FROM {table}" + (" WHERE time < ?" if t is not None else "")
            (v,) = db.execute(sql, (t,) if t is not None else ()).fetchone()
        except (sqlite3.Error, OverflowError, ValueError, TypeError):  # no such table; a time sqlite cannot bind
            continue
        if isinstance(v, (int, float)) and (newest is None or v > newest):
            newest = v
    return newest


def list_runs(root: str, extra: tuple[str, ...] = ()) -> list[RunSummary]:
    """Run folders directly under `root`, plus `extra` folders, newest first."""
    paths: list[str] = []
    try:
        with os.scandir(root) as it:
            for entry in it:
                if entry.is_dir() and is_run_dir(entry.path):
                    paths.append(entry.path)
    except OSError:
        pass
    seen = {os.path.abspath(p) for p in paths}
    for p in extra:
        if os.path.abspath(p) not in seen and is_run_dir(p):
            paths.append(p)
            seen.add(os.path.abspath(p))
    out = [s for s in (summarize(p) for p in paths) if s is not None]
    out.sort(key=lambda s: s.started or 0.0, reverse=True)
    return out
