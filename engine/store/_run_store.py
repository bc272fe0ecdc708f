"""run.db: the run's SQLite store (WAL), written by the engine as it trains.

What is on disk is what happened:

- Nothing is deleted. Metrics rows a resume supersedes move to `discarded_metrics` (with
  when and why); a step recorded twice keeps its first row there too.
- Rows reach disk on time. The training thread queues rows and writes them itself when
  that costs it nothing (the connection free, run.db's write lock free: busy_timeout 0, no
  fsync on that path); a small flusher thread writes whatever has waited a second, so rows
  land within about a second even while the training thread is stalled in task code.
- A busy or slow run.db never ends a run: rows stay in memory until the store can take
  them, the trouble is reported once through `on_problem`, and training goes on.
- Every value passes one function (`_bindable`) on its way to SQLite: strings with
  surrogates (a run folder whose name is not UTF-8), ints past 64 bits, bools and numpy
  scalars become values SQLite takes, so no row is ever refused.
- The metrics columns are derived from the `StepMetrics` dataclass; an older run.db gets
  the columns it lacks when opened for writing, and `RunReader` reads only the columns a
  file has (NULL for the others), so old runs open and new fields reach disk unedited.

The parts, each with one job:

- engine.store._tables: the tables (derived from StepMetrics; `scalars` for what a framework
  logs), migration, the SQL of each write;
- engine.store._values: the sanitising of values (`_bindable`);
- engine.store._writer: the write queue and its flusher thread (`StoreWriter`);
- engine.store._reader: `RunReader` and `send_command`, for other processes;
- here: `RunStore`, the writer the trainer and the integrations use, and every public name.

Torch-free: the app reads run folders with `RunReader` without loading torch.
"""
from __future__ import annotations

import json
import operator
import os
import sqlite3
import time
from typing import Any, Callable, Mapping, Optional

from engine.declarations import limits
from engine.declarations.commands import Command, command_from_json
from engine.declarations.config import ConfigError
from engine.declarations.events import EpochEnd, Event, StepMetrics

from ._reader import RunReader, send_command
from ._tables import (
    DB_NAME,
    DISCARD_COLUMNS,
    METRIC_COLUMNS,
    METRIC_TYPES,
    SCALAR_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    StoreError,
)
from ._tables import STEP_FIELDS as _STEP_FIELDS
from ._values import bindable as _bindable
from ._values import json_default as _json_default
from ._values import plain_row as _plain_row
from ._values import row as _row
from ._writer import StoreWriter

__all__ = ["RunStore", "RunReader", "send_command", "StoreError", "StoreWriter", "DB_NAME", "SCHEMA",
           "SCHEMA_VERSION", "METRIC_COLUMNS", "METRIC_TYPES", "DISCARD_COLUMNS", "SCALAR_COLUMNS"]

_step_values = operator.attrgetter(*_STEP_FIELDS)  # a StepMetrics' values, in column order
MAX_SCALAR_NAME = 200  # characters of a scalar's name kept


class RunStore:
    """The engine's writer: one per run folder (see engine/store/runlock.py), used from the
    training thread; its flusher thread (engine.store._writer.StoreWriter) is internal.

    `on_problem(message)` is called at most once per episode of trouble (run.db busy, a
    disk error, rows dropped), from whichever thread noticed it — it must be quick and
    thread-safe (e.g. append to a list the training loop turns into an event). `problem`
    holds the current trouble, or None."""

    # The writer's tuning (read here; StoreWriter's are the ones in force).
    STALL_FLUSH = StoreWriter.STALL_FLUSH
    FLUSHER_BUSY_MS = StoreWriter.FLUSHER_BUSY_MS
    CHECKPOINT_EVERY = StoreWriter.CHECKPOINT_EVERY
    MAX_BUFFERED = StoreWriter.MAX_BUFFERED
    SLOW_WRITE = StoreWriter.SLOW_WRITE
    SLOW_BACKGROUND = StoreWriter.SLOW_BACKGROUND

    def __init__(self, run_dir: str, commit_interval: float = 1.0,
                 on_problem: Optional[Callable[[str], None]] = None) -> None:
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, DB_NAME)
        self.commit_interval = commit_interval
        self._in_flight: dict[int, int] = {}  # command row id -> seq of its mark (not yet on disk)
        self._expired_upto = 0  # command rows up to this id belong to an earlier engine
        self._read_db: Optional[sqlite3.Connection] = None
        self._writer = StoreWriter(self.path, commit_interval, on_problem)
        # Told every event recorded, steps included (a run's notifier: engine/trainer/notify.py);
        # it must be cheap and never raise: it runs on the training thread.
        self.listener: Optional[Callable[[Event], None]] = None

    @property
    def on_problem(self) -> Optional[Callable[[str], None]]:
        return self._writer.on_problem

    @on_problem.setter
    def on_problem(self, fn: Optional[Callable[[str], None]]) -> None:
        self._writer.on_problem = fn

    @property
    def problem(self) -> Optional[str]:
        """The current trouble writing run.db, or None."""
        return self._writer.problem

    @property
    def unwritten(self) -> int:
        """How many queued writes are not on disk yet."""
        return self._writer.unwritten

    # -- rows and events -------------------------------------------------------------------------
    def set_info(self, **items: Any) -> None:
        self._writer.push(*[("x", "INSERT OR REPLACE INTO run VALUES (?, ?)",
                      _row((k, json.dumps(v, default=_json_default)))) for k, v in items.items()])

    def record(self, event: Event) -> None:
        """Queue a step's metrics (written when a second has passed since the last write);
        queue and write any other event at once."""
        now = time.time()
        if self.listener is not None:
            self.listener(event)
        if isinstance(event, StepMetrics):  # the hot path: one tuple, no asdict(), no call per value
            self._writer.push_metrics(_plain_row(_step_values(event)) + (now,))
            return
        ops = []
        if isinstance(event, EpochEnd):
            ops.append(("x", "INSERT OR REPLACE INTO epochs VALUES (?,?,?,?,?,?)",
                        _row((event.epoch, event.step, event.train_loss, event.val_loss, event.seconds, now))))
        data = {k: v for k, v in event.to_dict().items() if k not in ("step", "epoch", "kind")}
        ops.append(("x", "INSERT INTO events (time, step, epoch, kind, message, data) VALUES (?,?,?,?,?,?)",
                    _row((now, event.step, event.epoch, event.kind, event.message(),
                          json.dumps(data, default=_json_default)))))
        self._writer.push(*ops)
        # Events are rare: write now, so no write transaction (and its lock) stays open
        # through the next steps, however slow, and blocks send_command from another process.
        self._writer.try_write()

    def log_scalars(self, step: int, epoch: int, values: Mapping[str, Any]) -> int:
        """Queue one `scalars` row per finite number in `values` (name -> value: what a framework
        logs, accuracy, eval_loss, ...); written with the metrics rows, within about a second.
        Names are kept as given (at most MAX_SCALAR_NAME characters); anything that is
        not a finite number is left out. Returns how many rows were queued."""
        now = time.time()
        ops = []
        for name, v in values.items():
            if isinstance(v, bool) or not isinstance(name, str) or not name:
                continue
            try:
                x = float(v)
            except (TypeError, ValueError, OverflowError):
                continue
            if x != x or x in (float("inf"), float("-inf")):
                continue
            ops.append(("x", "INSERT INTO scalars (step, epoch, name, value, time) VALUES (?,?,?,?,?)",
                        _row((int(step), int(epoch), name[:MAX_SCALAR_NAME], x, now))))
        if ops:
            self._writer.push(*ops)
        return len(ops)

    def discard_after(self, step: int, reason: str) -> None:
        """Metrics rows past `step` (a resume from a checkpoint at `step`) move to
        `discarded_metrics` with the time and `reason`; nothing is deleted."""
        self._writer.push(("discard", int(step), _bindable(str(reason))))
        self._writer.try_write()

    def truncate_after(self, step: int) -> None:
        """Older name of discard_after (rows are moved, never deleted)."""
        self.discard_after(step, f"superseded: the run resumed from its checkpoint at step {step}")

    def commit(self, timeout: float = 2.0) -> bool:
        """Write everything queued so far; True once it is on disk. Waits at most `timeout`
        (not at all while run.db is known to be in trouble): the caller is the training
        thread, which must not wait on the disk for long. Never raises."""
        return self._writer.commit(timeout)

    def has_epoch(self, epoch: int) -> bool:
        """Whether run.db holds the `epochs` row of `epoch` (True when it cannot say: a resume
        writes a missing row back only when it is known to be missing)."""
        try:
            return self._reader().execute("SELECT 1 FROM epochs WHERE epoch = ?", (int(epoch),)).fetchone() is not None
        except (sqlite3.Error, OverflowError, ValueError):
            return True

    # -- commands from other processes -------------------------------------------------------
    def _reader(self) -> sqlite3.Connection:
        if self._read_db is None:
            self._read_db = sqlite3.connect(self.path, timeout=0.05, check_same_thread=False)
        return self._read_db

    def expire_pending_commands(self, note: str = "sent to an earlier engine that stopped before it read it") -> int:
        """Commands left 'pending' (or 'received' but never applied) by an earlier engine are
        marked 'expired': call when a new engine takes the run, before it polls. This engine
        never takes them, even before the update reaches disk. Returns the newest row id
        expired (0 if none)."""
        try:
            row = self._reader().execute("SELECT max(id) FROM commands").fetchone()
            upto = int(row[0] or 0)
        except (sqlite3.Error, TypeError, ValueError):
            return 0  # no commands table yet: a new run, nothing to expire
        if upto:
            self._expired_upto = max(self._expired_upto, upto)
            self._writer.push(("x", "UPDATE commands SET status = 'expired', note = ? "
                             "WHERE id <= ? AND status IN ('pending', 'received')", _row((note, upto))))
            self._writer.try_write()
        return upto

    def pending_commands(self) -> list[tuple[int, Optional[Command], str]]:
        """(row id, command or None if invalid, error) for each pending row, oldest first,
        at most limits.MAX_COMMANDS_PER_POLL a call. Rows are input from other programs:
        no row content (text where a number belongs, NULLs, blobs, megabytes, invalid
        UTF-8) makes this raise, and a busy or unreadable run.db gives [] for now."""
        self._writer.try_write()
        big = limits.MAX_COMMAND_BYTES
        written = self._writer.written
        self._in_flight = {r: q for r, q in self._in_flight.items() if q > written}  # marks now on disk
        skip = set(self._in_flight)
        try:
            rows = self._reader().execute(
                "SELECT id, CAST(substr(CAST(kind AS BLOB), 1, 200) AS BLOB), length(CAST(payload AS BLOB)), "
                "CAST(substr(CAST(payload AS BLOB), 1, ?) AS BLOB) FROM commands "
                "WHERE status = 'pending' AND id > ? ORDER BY id LIMIT ?",
                (big + 1, self._expired_upto, limits.MAX_COMMANDS_PER_POLL + len(skip))).fetchall()
        except (sqlite3.Error, OverflowError, ValueError):
            return []
        out: list[tuple[int, Optional[Command], str]] = []
        for row_id, kind, size, payload in rows:
            if row_id in skip:
                continue
            try:
                kind = kind.decode("utf-8", "replace") if isinstance(kind, bytes) else kind
                if isinstance(size, int) and size > big:
                    raise ConfigError(f"command {limits.quote(kind)}: payload is {size} bytes (at most {big})")
                out.append((row_id, command_from_json(kind, payload), ""))
            except ConfigError as e:
                out.append((row_id, None, limits.one_line(e)))
            except Exception as e:  # command_from_json raises ConfigError only; this is a safety net
                out.append((row_id, None, f"unreadable command row ({type(e).__name__})"))
            if len(out) >= limits.MAX_COMMANDS_PER_POLL:
                break
        return out

    def mark_command(self, row_id: int, status: str, step: int, note: str = "") -> None:
        seq = self._writer.push(("x", "UPDATE commands SET status = ?, applied_step = ?, note = ? WHERE id = ?",
                          _row((status, step, limits.one_line(note), row_id))))
        if seq > self._writer.written:
            self._in_flight[row_id] = seq  # pending_commands skips the row until its mark is on disk
        self._writer.try_write()  # release the write lock at once (see record)

    # -- the end -------------------------------------------------------------------------------
    def close(self, timeout: float = 60.0) -> bool:
        """Write what is queued (retrying for up to `timeout` while run.db is busy), then
        close. True if everything reached disk; else the loss is reported through on_problem."""
        if self._read_db is not None:  # first: a run.db deleted during the run is written back by the writer,
            try:                        # and no other connection of ours to the deleted file may outlive it
                self._read_db.close()
            except sqlite3.Error:
                pass
            self._read_db = None
        return self._writer.close(timeout)

    @property
    def lost(self) -> str:
        """After close(): what did not reach disk, in words ("" = nothing)."""
        return self._writer.lost
