"""What a run folder says about its run, in one record: the row of the window's run table and
of `headroom-ctl runs` (here, or on a server, where the record travels as JSON and is read
back with `from_record`). One reader for both, so the two show the same status, columns
and size. Torch-free.

A summary is read with a few small queries (the run table, the events that mark segments
and endings, the last row, the epochs), never the whole metrics table: the window lists
every run of the runs folder every few seconds.
"""
from __future__ import annotations

import os
import sqlite3
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Optional

from engine.declarations.settings import LIVE_SETTINGS

from . import labels as run_labels
from . import runlock, stored
from ._reader import RunReader
from ._tables import DB_NAME, StoreError


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
    status: str  # running, finished, failed, interrupted, stopped, unknown (run.db's, or interrupted: no writer)
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
    live: bool = False  # a process holds the folder's writer lock now
    # What it was and did: the live settings at its end (or now), its schedule, its ranks.
    settings: dict[str, Any] = field(default_factory=dict)
    schedule: str = ""
    world_size: int = 1
    epochs: Optional[int] = None  # finished epochs
    best_val: Optional[float] = None
    final_val: Optional[float] = None
    size: Optional[int] = None  # bytes on disk (labels.folder_bytes)
    labels: run_labels.Labels = run_labels.Labels()

    @property
    def effective_batch(self) -> Optional[int]:
        """Samples per optimizer step: micro-batch x accumulation x ranks."""
        mb, acc = self.settings.get("micro_batch"), self.settings.get("accum")
        if isinstance(mb, int) and isinstance(acc, int) and mb > 0 and acc > 0:
            return mb * acc * max(1, self.world_size)
        return None

    def to_record(self) -> dict[str, Any]:
        """As JSON: `headroom-ctl runs`' record (labels as a dict, rollbacks as lists)."""
        out = asdict(self)
        out["labels"] = self.labels.to_dict()
        out["rollbacks"] = [list(asdict(r).values()) for r in self.rollbacks]
        out["marks"] = [list(m) for m in self.marks]
        return out


def _num(v: Any) -> Optional[float]:
    return stored.number(v, None) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) and abs(v) < stored.INT64 else None


def _text(v: Any) -> Optional[str]:
    return v if isinstance(v, str) else None


def from_record(r: dict[str, Any], path: Optional[str] = None) -> RunSummary:
    """A summary back from its JSON (another machine's, of any version: what is missing or of
    another shape is left at its default, never an error). `path`: as this side names it."""
    rollbacks = []
    given_rollbacks, given_marks = r.get("rollbacks"), r.get("marks")
    for row in given_rollbacks if isinstance(given_rollbacks, list) else []:
        if isinstance(row, list) and len(row) == 3 and _int(row[0]) is not None and _int(row[1]) is not None:
            rollbacks.append(RolledBackRow(int(row[0]), int(row[1]), str(row[2])))
    marks = tuple((m[0], m[1], m[2]) for m in (given_marks if isinstance(given_marks, list) else [])
                  if isinstance(m, list) and len(m) == 3 and isinstance(m[0], str))
    settings = r.get("settings")
    return RunSummary(
        path=path if path is not None else str(r.get("path") or ""), name=str(r.get("name") or "?"),
        task=str(r.get("task") or "?"), status=str(r.get("status") or "unknown"), started=stored.moment(r.get("started")),
        steps=_int(r.get("steps", r.get("step"))), finished=stored.moment(r.get("finished")),
        finish_reason=_text(r.get("finish_reason")), nonfinite_mode=_text(r.get("nonfinite_mode")),
        rollbacks=tuple(rollbacks), final_loss=_num(r.get("final_loss", r.get("loss"))), marks=marks,
        last_row=_num(r.get("last_row")), live=r.get("live") is True,
        settings={k: v for k, v in settings.items() if isinstance(k, str)} if isinstance(settings, dict) else {},
        schedule=str(r.get("schedule") or ""), world_size=_int(r.get("world_size")) or 1, epochs=_int(r.get("epochs")),
        best_val=_num(r.get("best_val")), final_val=_num(r.get("final_val")), size=_int(r.get("size")),
        labels=run_labels.from_dict(r.get("labels")))


def live_settings(info: dict[str, Any], events: Iterable[dict[str, Any]], last: dict[str, Any]) -> dict[str, Any]:
    """The live settings now: the config's, then each change the engine applied, then the last
    row's values for those every row records."""
    raw = info.get("config")
    config: dict[str, Any] = raw if isinstance(raw, dict) else {}
    out = {s.name: config.get(s.name) for s in LIVE_SETTINGS}
    for e in events:
        if e.get("kind") == "settings_applied":
            for name, _old, new in stored.changes(stored.event_data(e).get("changes")):
                if name in out:
                    out[name] = new
    for s in LIVE_SETTINGS:
        if s.per_step and last.get(s.name) is not None:
            out[s.name] = last[s.name]
    return out


def is_run_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, DB_NAME))


def summarize(path: str) -> Optional[RunSummary]:
    """The summary of the run in `path`; None when it holds no readable run.db."""
    try:
        reader = RunReader(path)
    except StoreError:
        return None
    try:
        try:
            info = reader.info()
        except StoreError:
            info = {}
        read = _read(reader, info)
    finally:
        reader.close()
    live = runlock.writer(path, info) is not None
    steps = _int(info.get("step"))
    last_step = read.pop("steps", None)
    status = str(info.get("status") or "unknown")
    if status == "running" and not live:
        status = "interrupted"
    raw_cfg = info.get("config")
    cfg = raw_cfg if isinstance(raw_cfg, dict) else {}
    return RunSummary(path=os.path.abspath(path), name=os.path.basename(os.path.normpath(path)),
                      task=str(info.get("task") or "?"), status=status, started=stored.moment(info.get("started")),
                      steps=steps if steps is not None else last_step, finished=stored.moment(info.get("finished")),
                      nonfinite_mode=str(cfg.get("nonfinite") or "") or None, live=live,
                      schedule=str(cfg.get("lr_schedule") or ""), world_size=_int(info.get("world_size")) or 1,
                      size=run_labels.folder_bytes(path), labels=run_labels.read(path), **read)


def _read(reader: RunReader, info: dict[str, Any]) -> dict[str, Any]:
    """How the run ended and when its segments ran (its run_started, run_finished, run_failed
    and rolled_back events and its last row), its settings and its epochs: each part as much as
    the run.db can say (a table it lacks or cannot read leaves that part out)."""
    out: dict[str, Any] = {}
    db = reader.connection
    decoded: list[tuple[str, dict[str, Any], Any]] = []
    try:
        rows = db.execute("SELECT kind, data, time FROM events WHERE kind IN ('run_started', 'run_finished', "
                          "'run_failed', 'rolled_back', 'settings_applied') ORDER BY id").fetchall()
        decoded = [(kind, stored.row_data(kind, raw), t) for kind, raw, t in rows]
        out["marks"] = _marks(db, [(kind, t) for kind, _d, t in decoded
                                   if kind in ("run_started", "run_finished", "run_failed")])
    except (sqlite3.Error, AttributeError):
        pass
    rolled: list[RolledBackRow] = []
    for kind, data, _t in decoded:
        if kind == "run_started":  # a continued run: how an earlier segment ended is not how the run did
            out.pop("finish_reason", None)
        elif kind == "rolled_back":
            to, back_from = stored.whole(data.get("to_step"), -1), stored.whole(data.get("from_step"), -1)
            if to >= 0 and back_from >= 0:
                rolled.append(RolledBackRow(to, back_from, str(data.get("reason"))))
        elif kind in ("run_finished", "run_failed"):
            out["finish_reason"] = stored.text(data.get("reason" if kind == "run_finished" else "error")) or ""
    out["rollbacks"] = tuple(rolled)
    last: list[dict[str, Any]] = []
    try:
        last = reader.last_metrics(1)
    except (sqlite3.Error, StoreError):
        pass
    if last:
        out["final_loss"] = _num(last[0].get("loss"))
        out["steps"] = _int(last[0].get("step"))  # a run that trains: its run table says no step yet
    # The lr as set (the schedule's peak, with each change applied), not the last row's point on the schedule.
    row = {k: v for k, v in (last[0] if last else {}).items() if k != "lr"}
    out["settings"] = live_settings(info, ({"kind": k, "data": d} for k, d, _t in decoded), row)
    try:
        epochs = reader.epochs()
    except (sqlite3.Error, StoreError):
        epochs = []
    if epochs:
        vals = [v for v in (_num(e.get("val_loss")) for e in epochs) if v is not None]
        out["epochs"] = _int(epochs[-1].get("epoch"))
        out["best_val"] = min(vals) if vals else None
        out["final_val"] = _num(epochs[-1].get("val_loss"))
    if out.get("marks") and out["marks"][-1][0] == "run_started":  # the last segment said no end (yet)
        out["last_row"] = _last_row_before(db, None)
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


def run_folders(root: str, extra: Iterable[str] = ()) -> list[str]:
    """Run folders directly under `root`, then `extra` folders, each once."""
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
    return paths


def list_runs(root: str, extra: Iterable[str] = ()) -> list[RunSummary]:
    """The runs of `root` and `extra`, newest first."""
    out = [s for s in (summarize(p) for p in run_folders(root, extra)) if s is not None]
    out.sort(key=lambda s: s.started or 0.0, reverse=True)
    return out
