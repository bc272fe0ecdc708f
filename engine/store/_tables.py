"""run.db's tables, derived from the `StepMetrics` dataclass, and the SQL that fills them.

- The metrics columns are StepMetrics' fields (plus `time`, when the row was recorded), each
  typed from its annotation, so a new field reaches disk with no edit here.
- `migrate` opens a run.db for writing: WAL, the tables, and for an older file the columns
  it lacks (`metrics` and `discarded_metrics` alike).
- `apply_ops` turns the writer's queued operations into SQL inside the writer's transaction;
  nothing is deleted: superseded metrics rows move to `discarded_metrics`.

Torch-free (the app loads it through engine.store before torch).
"""
from __future__ import annotations

import dataclasses
import re
import sqlite3
import time
from typing import Any

from engine.declarations.config import ConfigError
from engine.declarations.events import StepMetrics

DB_NAME = "run.db"
SCHEMA_VERSION = 3  # 2: discarded_metrics; commands may be 'expired'. 3: scalars


class StoreError(ConfigError):
    """run.db cannot be opened, read or written as asked (one line, like ConfigError)."""


def _sql_type(name: str, annotation: Any) -> str:
    """'int' / 'Optional[int]' / 'bool' -> INTEGER, 'float' / 'Optional[float]' -> REAL, 'str' -> TEXT.
    (The annotations are strings: events.py has `from __future__ import annotations`.)"""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    t = text.replace(" ", "").replace("typing.", "")
    m = re.fullmatch(r"Optional\[(\w+)\]|(\w+)\|None|None\|(\w+)|(\w+)", t)
    base = next((g for g in m.groups() if g), "") if m else ""
    sql = {"int": "INTEGER", "bool": "INTEGER", "float": "REAL", "str": "TEXT"}.get(base)
    if sql is None:
        raise TypeError(f"StepMetrics.{name}: type {text!r} has no run.db column type "
                        "(use int, float, bool or str, optionally Optional[...])")
    return sql


STEP_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(StepMetrics))
METRIC_TYPES: dict[str, str] = {f.name: _sql_type(f.name, f.type) for f in dataclasses.fields(StepMetrics)}
METRIC_TYPES["time"] = "REAL"  # when the row was recorded, added by the store
METRIC_COLUMNS: tuple[str, ...] = STEP_FIELDS + ("time",)
DISCARD_COLUMNS = ("discarded_at", "reason")


def _metrics_table(name: str, step_key: bool) -> str:
    cols = [f"step INTEGER{' PRIMARY KEY' if step_key else ''}"]
    cols += [f"{c} {METRIC_TYPES[c]}" for c in METRIC_COLUMNS if c != "step"]
    if not step_key:
        cols += ["discarded_at REAL", "reason TEXT"]
    return f"CREATE TABLE IF NOT EXISTS {name} ({', '.join(cols)});"


SCHEMA = "\n".join([
    "CREATE TABLE IF NOT EXISTS run (key TEXT PRIMARY KEY, value TEXT);",
    _metrics_table("metrics", step_key=True),
    _metrics_table("discarded_metrics", step_key=False),
    "CREATE TABLE IF NOT EXISTS epochs (epoch INTEGER PRIMARY KEY, step INTEGER, train_loss REAL, val_loss REAL,"
    " seconds REAL, time REAL);",
    "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL, step INTEGER,"
    " epoch INTEGER, kind TEXT, message TEXT, data TEXT);",
    "CREATE TABLE IF NOT EXISTS commands (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL, kind TEXT,"
    " payload TEXT, status TEXT DEFAULT 'pending', applied_step INTEGER, note TEXT);",
    # What a framework logs besides the loss (accuracy, eval_* ...): one row per value; an older
    # run.db gets the table when opened for writing (migrate), a reader of one without it reads none.
    "CREATE TABLE IF NOT EXISTS scalars (step INTEGER, epoch INTEGER, name TEXT, value REAL, time REAL);",
    "CREATE INDEX IF NOT EXISTS scalars_name_step ON scalars (name, step);",
])
SCALAR_COLUMNS = ("step", "epoch", "name", "value", "time")


# -- opening a file for writing ----------------------------------------------------------------
def table_columns(db: sqlite3.Connection, table: str) -> dict[str, str]:
    """{column: declared type} of `table` as this file has it."""
    return {r[1]: (r[2] or "") for r in db.execute(f"PRAGMA table_info({table})")}


def migrate(db: sqlite3.Connection) -> str:
    """WAL on, the tables created, an older run.db given the columns the engine now records.
    Returns the quoted column list `metrics` has (what a discard moves to discarded_metrics)."""
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints (fsyncs) run on the flusher only
    db.execute("BEGIN IMMEDIATE")
    try:
        for stmt in SCHEMA.split(";\n"):
            db.execute(stmt)
        have = table_columns(db, "metrics")
        for c in METRIC_COLUMNS:  # an older run.db: add what the engine now records
            if c not in have:
                db.execute(f"ALTER TABLE metrics ADD COLUMN {c} {METRIC_TYPES[c]}")
                have[c] = METRIC_TYPES[c]
        have_d = table_columns(db, "discarded_metrics")
        for c, t in list(have.items()) + [("discarded_at", "REAL"), ("reason", "TEXT")]:
            if c not in have_d:
                db.execute(f'ALTER TABLE discarded_metrics ADD COLUMN "{c}" {t}')
        moved_cols = ",".join(f'"{c}"' for c in have)
        db.execute("INSERT OR REPLACE INTO run VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return moved_cols


# -- the queued operations, as SQL ---------------------------------------------------------------
# ("m", row): a metrics row (METRIC_COLUMNS' values); ("x", sql, args): one statement;
# ("discard", step, reason): metrics rows past `step` move to discarded_metrics.
def apply_ops(db: sqlite3.Connection, ops: list[tuple[Any, ...]], moved_cols: str) -> None:
    """Run `ops` in order inside the caller's transaction; runs of metrics rows in one batch."""
    now = time.time()
    i = 0
    while i < len(ops):
        op = ops[i]
        if op[0] == "m":
            j = i
            while j < len(ops) and ops[j][0] == "m":
                j += 1
            insert_metrics(db, [o[1] for o in ops[i:j]], now, moved_cols)
            i = j
            continue
        if op[0] == "x":
            db.execute(op[1], op[2])
        elif op[0] == "discard":
            db.execute(f"INSERT INTO discarded_metrics ({moved_cols}, discarded_at, reason) "
                       f"SELECT {moved_cols}, ?, ? FROM metrics WHERE step > ?", (now, op[2], op[1]))
            db.execute("DELETE FROM metrics WHERE step > ?", (op[1],))
        i += 1


def insert_metrics(db: sqlite3.Connection, rows: list[tuple[Any, ...]], now: float, moved_cols: str) -> None:
    """Insert step rows; a step already on disk (or twice in this batch) keeps its
    earlier row in discarded_metrics, reason 'superseded'."""
    cols = ",".join(METRIC_COLUMNS)
    latest: dict[Any, tuple[Any, ...]] = {}
    earlier: list[tuple[Any, ...]] = []
    for r in rows:
        if r[0] in latest:
            earlier.append(latest[r[0]])
        latest[r[0]] = r
    steps = [s for s in latest if isinstance(s, int)]
    if steps:
        (n,) = db.execute("SELECT count(*) FROM metrics WHERE step BETWEEN ? AND ?",
                          (min(steps), max(steps))).fetchone()
        if n:
            db.executemany(f"INSERT INTO discarded_metrics ({moved_cols}, discarded_at, reason) "
                           f"SELECT {moved_cols}, ?, 'superseded' FROM metrics WHERE step = ?",
                           [(now, s) for s in steps])
    if earlier:
        marks = ",".join("?" * (len(METRIC_COLUMNS) + 2))
        db.executemany(f"INSERT INTO discarded_metrics ({cols}, discarded_at, reason) VALUES ({marks})",
                       [r + (now, "superseded") for r in earlier])
    marks = ",".join("?" * len(METRIC_COLUMNS))
    db.executemany(f"INSERT OR REPLACE INTO metrics ({cols}) VALUES ({marks})", list(latest.values()))
