"""run.db: the run's SQLite store (WAL), written by the engine as it trains.

Rows are buffered in memory and committed at least once a second, and always
before a checkpoint is written, so a crash loses at most the last second and the
steps in `metrics` never run ahead of what a checkpoint can resume.
Torch-free: the app reads run folders with `RunReader` without loading torch.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any, Iterable, Optional

from .commands import Command, command_from_json
from .config import ConfigError
from .events import Event, StepMetrics

DB_NAME = "run.db"
SCHEMA_VERSION = 1

METRIC_COLUMNS = (
    "step", "epoch", "loss", "grad_norm", "lr", "accum", "clip", "micro_batch", "samples", "tokens",
    "nonfinite", "scaler_skipped", "clipped", "step_time", "throughput",
    "mem_allocated", "mem_reserved", "mem_peak", "mem_used", "mem_total", "time",
)

_STEP_FIELDS = METRIC_COLUMNS[:-1]  # all but "time", which the store adds

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS run (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS metrics (
    step INTEGER PRIMARY KEY, epoch INTEGER, loss REAL, grad_norm REAL, lr REAL, accum INTEGER,
    clip REAL, micro_batch INTEGER, samples INTEGER, tokens INTEGER, nonfinite INTEGER,
    scaler_skipped INTEGER, clipped INTEGER, step_time REAL, throughput REAL,
    mem_allocated INTEGER, mem_reserved INTEGER, mem_peak INTEGER, mem_used INTEGER,
    mem_total INTEGER, time REAL);
CREATE TABLE IF NOT EXISTS epochs (
    epoch INTEGER PRIMARY KEY, step INTEGER, train_loss REAL, val_loss REAL, seconds REAL, time REAL);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL, step INTEGER, epoch INTEGER,
    kind TEXT, message TEXT, data TEXT);
CREATE TABLE IF NOT EXISTS commands (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL, kind TEXT, payload TEXT,
    status TEXT DEFAULT 'pending', applied_step INTEGER, note TEXT);
"""


class StoreError(ConfigError):
    pass


def _json_default(o: Any) -> Any:
    return repr(o)


class RunStore:
    """The engine's writer. One instance, on the training thread."""

    def __init__(self, run_dir: str, commit_interval: float = 1.0) -> None:
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, DB_NAME)
        self.commit_interval = commit_interval
        self._db = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._db.execute("INSERT OR REPLACE INTO run VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        self._db.commit()
        self._metrics: list[tuple] = []
        self._last_commit = time.monotonic()

    # -- writing ---------------------------------------------------------------------------
    def set_info(self, **items: Any) -> None:
        self._db.executemany("INSERT OR REPLACE INTO run VALUES (?, ?)",
                             [(k, json.dumps(v, default=_json_default)) for k, v in items.items()])

    def record(self, event: Event) -> None:
        """Buffer a step's metrics (committed when a second has passed since the last commit);
        write and commit any other event at once."""
        now = time.time()
        if isinstance(event, StepMetrics):  # the hot path: one tuple, no asdict()
            self._metrics.append(tuple(_plain(getattr(event, c)) for c in _STEP_FIELDS) + (now,))
        else:
            self._flush_metrics()
            if event.kind == "epoch_end":
                self._db.execute("INSERT OR REPLACE INTO epochs VALUES (?,?,?,?,?,?)",
                                 (event.epoch, event.step, event.train_loss, event.val_loss,
                                  event.seconds, now))
            data = {k: v for k, v in event.to_dict().items() if k not in ("step", "epoch", "kind")}
            self._db.execute("INSERT INTO events (time, step, epoch, kind, message, data) VALUES (?,?,?,?,?,?)",
                             (now, event.step, event.epoch, event.kind, event.message(),
                              json.dumps(data, default=_json_default)))
            # Events are rare: commit now, so no write transaction (and its lock) stays open
            # through the next steps, however slow, and blocks send_command from another process.
            self.commit()
        if time.monotonic() - self._last_commit >= self.commit_interval:
            self.commit()

    def _flush_metrics(self) -> None:
        if self._metrics:
            cols = ",".join(METRIC_COLUMNS)
            marks = ",".join("?" * len(METRIC_COLUMNS))
            # REPLACE: a resumed run supersedes rows logged after its checkpoint.
            self._db.executemany(f"INSERT OR REPLACE INTO metrics ({cols}) VALUES ({marks})", self._metrics)
            self._metrics.clear()

    def commit(self) -> None:
        try:
            self._flush_metrics()
            self._db.commit()
        except sqlite3.Error as e:
            raise StoreError(f"could not write {self.path}: {e}") from None
        self._last_commit = time.monotonic()

    def truncate_after(self, step: int) -> None:
        """On resume: rows past the checkpoint's step are superseded by the rerun."""
        self._db.execute("DELETE FROM metrics WHERE step > ?", (step,))
        self.commit()

    # -- commands from other processes -------------------------------------------------------
    def pending_commands(self) -> list[tuple[int, Optional[Command], str]]:
        """(row id, command or None if invalid, error) for each pending row, oldest first."""
        self.commit()
        rows = self._db.execute(
            "SELECT id, kind, payload FROM commands WHERE status = 'pending' ORDER BY id").fetchall()
        out = []
        for row_id, kind, payload in rows:
            try:
                out.append((row_id, command_from_json(kind, payload), ""))
            except ConfigError as e:
                out.append((row_id, None, str(e)))
        return out

    def mark_command(self, row_id: int, status: str, step: int, note: str = "") -> None:
        self._db.execute("UPDATE commands SET status = ?, applied_step = ?, note = ? WHERE id = ?",
                         (status, step, note, row_id))
        self.commit()  # release the write lock at once (see record)

    def close(self) -> None:
        try:
            self.commit()
        finally:
            self._db.close()


def _plain(v: Any) -> Any:
    if isinstance(v, bool):
        return int(v)
    return v


def send_command(run_dir: str, command: Command) -> int:
    """Queue a command for a run in another process. Returns the row id."""
    path = os.path.join(run_dir, DB_NAME)
    if not os.path.isfile(path):
        raise StoreError(f"{run_dir} is not a run folder (no {DB_NAME})")
    db = sqlite3.connect(path, timeout=10)
    try:
        cur = db.execute("INSERT INTO commands (time, kind, payload) VALUES (?,?,?)",
                         (time.time(), command.kind, command.to_json()))
        db.commit()
        return int(cur.lastrowid)
    finally:
        db.close()


class RunReader:
    """Read-only view of a run folder, live or finished. Used by the app and tests."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, DB_NAME)
        self.problems: list[str] = []  # what could not be read, for the user
        self._salvage_path: Optional[str] = None
        if not os.path.isfile(self.path):
            raise StoreError(f"{run_dir} is not a run folder (no {DB_NAME})")
        try:
            # mode=ro: never create or change the file; WAL readers still see live commits.
            self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5,
                                       check_same_thread=False)
            self._db.execute("SELECT count(*) FROM run").fetchone()
        except sqlite3.DatabaseError as e:
            if "locked" in str(e) or "no such table" in str(e) or not self._salvage(str(e)):
                raise StoreError(f"{self.path} cannot be read: {e}") from None

    def _salvage(self, error: str) -> bool:
        """A truncated run.db (a full disk, a copy cut short): SQLite refuses the whole file when
        its header promises more pages than there are. Read a private copy whose header is
        corrected to the pages that exist; tables on the missing pages come back short."""
        import shutil
        import struct
        import tempfile
        try:
            with open(self.path, "rb") as f:
                data = bytearray(f.read())
            if len(data) < 100 or not data.startswith(b"SQLite format 3\x00"):
                return False
            page = struct.unpack(">H", data[16:18])[0]
            page = 65536 if page == 1 else page
            data = data[: len(data) // page * page]
            data[28:32] = struct.pack(">I", len(data) // page)
            fd, tmp = tempfile.mkstemp(prefix="headroom-salvage-", suffix=".db")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            wal = self.path + "-wal"
            if os.path.exists(wal):
                shutil.copyfile(wal, tmp + "-wal")
            db = sqlite3.connect(f"file:{tmp}?mode=ro", uri=True, check_same_thread=False)
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except (OSError, sqlite3.DatabaseError):
            return False
        self._db, self._salvage_path = db, tmp
        self.problems.append(f"run.db is damaged ({error}): showing what could be read")
        return True

    def info(self) -> dict[str, Any]:
        out = {}
        for k, v in self._query("SELECT key, value FROM run"):
            try:
                out[k] = json.loads(v)
            except (TypeError, ValueError):
                out[k] = v
        return out

    def metrics(self, after_step: int = -1) -> list[dict[str, Any]]:
        cols = ",".join(METRIC_COLUMNS)
        rows = self._query(f"SELECT {cols} FROM metrics WHERE step > ? ORDER BY step", (after_step,))
        return [dict(zip(METRIC_COLUMNS, r)) for r in rows]

    def epochs(self) -> list[dict[str, Any]]:
        cols = ("epoch", "step", "train_loss", "val_loss", "seconds")
        rows = self._query(f"SELECT {','.join(cols)} FROM epochs ORDER BY epoch")
        return [dict(zip(cols, r)) for r in rows]

    def events(self, after_id: int = 0, kinds: Optional[Iterable[str]] = None) -> list[dict[str, Any]]:
        rows = self._query("SELECT id, time, step, epoch, kind, message, data FROM events WHERE id > ? ORDER BY id",
                           (after_id,))
        out = []
        for r in rows:
            if kinds is not None and r[4] not in kinds:
                continue
            try:
                data = json.loads(r[6]) if r[6] else {}
            except ValueError:
                data = {}
            out.append(dict(id=r[0], time=r[1], step=r[2], epoch=r[3], kind=r[4], message=r[5], data=data))
        return out

    def commands(self) -> list[dict[str, Any]]:
        cols = ("id", "time", "kind", "payload", "status", "applied_step", "note")
        return [dict(zip(cols, r)) for r in self._query(f"SELECT {','.join(cols)} FROM commands ORDER BY id")]

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        rows: list[tuple] = []
        try:
            for row in self._db.execute(sql, args):  # row by row: a damaged table gives what it has
                rows.append(row)
        except sqlite3.DatabaseError as e:
            if self._salvage_path is None or "malformed" not in str(e):
                raise StoreError(f"{self.path}: {e}") from None
            table = sql.split(" FROM ")[1].split()[0]
            note = f"{table}: only the first {len(rows)} rows could be read ({e})"
            if note not in self.problems:
                self.problems.append(note)
        return rows

    def close(self) -> None:
        self._db.close()
        if self._salvage_path is not None:
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.unlink(self._salvage_path + suffix)
                except OSError:
                    pass
            self._salvage_path = None
