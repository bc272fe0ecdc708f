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

Torch-free: the app reads run folders with `RunReader` without loading torch.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sqlite3
import threading
import time
from typing import Any, Callable, Iterable, Optional

from . import limits
from .commands import Command, command_from_json
from .config import ConfigError
from .events import Event, StepMetrics

DB_NAME = "run.db"
SCHEMA_VERSION = 2  # 2: discarded_metrics; commands may be 'expired'


# -- the schema, derived from StepMetrics -----------------------------------------------------
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


_STEP_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(StepMetrics))
METRIC_TYPES: dict[str, str] = {f.name: _sql_type(f.name, f.type) for f in dataclasses.fields(StepMetrics)}
METRIC_TYPES["time"] = "REAL"  # when the row was recorded, added by the store
METRIC_COLUMNS: tuple[str, ...] = _STEP_FIELDS + ("time",)
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
])


class StoreError(ConfigError):
    pass


def _json_default(o: Any) -> Any:
    return repr(o)


# -- the one boundary every value crosses --------------------------------------------------------
_INT64 = 2**63


def _text(s: str) -> str:
    """A str SQLite can store. Surrogates cannot be UTF-8: those os.fsdecode makes of bytes
    that are not UTF-8 (a run folder's name) are shown as the byte, \\xNN; any other lone
    surrogate as \\udNNN. Everything else is kept as it is."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return "".join(c if not 0xD800 <= ord(c) <= 0xDFFF
                       else f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF
                       else f"\\u{ord(c):04x}" for c in s)


def _bindable(v: Any) -> Any:
    """Any Python value -> one SQLite takes without refusing the row."""
    if v is None or type(v) is float:
        return v
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        if -_INT64 <= v < _INT64:
            return v
        try:
            return float(v)  # a counter past 64 bits: kept as a (rounded) REAL
        except OverflowError:
            return math.copysign(math.inf, v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, str):
        return _text(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    for cast in (int, float):  # numpy / torch scalars
        try:
            if cast is int and not float(v).is_integer():
                continue
            return _bindable(cast(v))
        except (TypeError, ValueError, OverflowError):
            pass
    return _text(limits.quote(v, 200))


def _row(args: Iterable[Any]) -> tuple:
    return tuple(_bindable(a) for a in args)


def _is_busy(e: BaseException) -> bool:
    text = str(e).lower()
    return "locked" in text or "busy" in text


# -- the writer ------------------------------------------------------------------------------------
class RunStore:
    """The engine's writer: one per run folder (see engine/runlock.py), used from the
    training thread; its flusher thread is internal.

    `on_problem(message)` is called at most once per episode of trouble (run.db busy, a
    disk error, rows dropped), from whichever thread noticed it — it must be quick and
    thread-safe (e.g. append to a list the training loop turns into an event). `problem`
    holds the current trouble, or None."""

    STALL_FLUSH = 1.0  # seconds a row may wait in memory before the flusher writes it
    FLUSHER_BUSY_MS = 1000  # how long the flusher waits for run.db's write lock per try
    CHECKPOINT_EVERY = 10.0  # seconds between WAL checkpoints (the only fsyncs), on the flusher
    MAX_BUFFERED = 1_000_000  # metrics rows kept in memory while run.db takes none (~0.5 GB)
    SLOW_WRITE = 0.25  # seconds: a write on the training thread slower than this ...
    SLOW_BACKGROUND = 30.0  # ... leaves writing to the flusher for this long

    def __init__(self, run_dir: str, commit_interval: float = 1.0,
                 on_problem: Optional[Callable[[str], None]] = None) -> None:
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, DB_NAME)
        self.commit_interval = commit_interval
        self.on_problem = on_problem
        self.problem: Optional[str] = None
        self._reported = False
        self._dropped = 0
        self._cond = threading.Condition()  # guards the queue and the counters below
        self._ops: list[tuple] = []  # ordered writes not yet on disk
        self._queued = 0  # ops queued so far (a sequence number)
        self._written = 0  # ops on disk so far
        self._since: Optional[float] = None  # monotonic time the oldest queued op was queued
        self._metric_rows = 0
        self._in_flight: dict[int, int] = {}  # command row id -> seq of its mark (not yet on disk)
        self._expired_upto = 0  # command rows up to this id belong to an earlier engine
        self._db_lock = threading.Lock()  # the write connection
        self._ready = False  # schema created and migrated
        self._last_commit = time.monotonic()
        self._last_checkpoint = time.monotonic()
        self._closing = False
        self._closed = False
        self._urge = False  # commit() is waiting: the flusher writes now
        self._background_until = 0.0  # monotonic time until which only the flusher writes (slow disk)
        self._backoff, self._retry_at = 0.0, 0.0  # after a disk error: the flusher's next try
        self._read_db: Optional[sqlite3.Connection] = None
        try:
            self._db = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA busy_timeout = 2000")
            self._setup()
        except sqlite3.Error as e:
            if not _is_busy(e):
                raise StoreError(f"could not open {self.path}: {e}") from None
            self._report(f"run.db is held by another program ({e}); rows are kept in memory until it is free")
        self._flusher = threading.Thread(target=self._flush_loop, name="headroom-store", daemon=True)
        self._flusher.start()

    # -- schema ---------------------------------------------------------------------------------
    def _setup(self) -> None:
        db = self._db
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints (fsyncs) run on the flusher only
        db.execute("BEGIN IMMEDIATE")
        try:
            for stmt in SCHEMA.split(";\n"):
                db.execute(stmt)
            have = self._columns("metrics")
            for c in METRIC_COLUMNS:  # an older run.db: add what the engine now records
                if c not in have:
                    db.execute(f"ALTER TABLE metrics ADD COLUMN {c} {METRIC_TYPES[c]}")
                    have[c] = METRIC_TYPES[c]
            have_d = self._columns("discarded_metrics")
            for c, t in list(have.items()) + [("discarded_at", "REAL"), ("reason", "TEXT")]:
                if c not in have_d:
                    db.execute(f'ALTER TABLE discarded_metrics ADD COLUMN "{c}" {t}')
            self._moved_cols = ",".join(f'"{c}"' for c in have)
            db.execute("INSERT OR REPLACE INTO run VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        self._ready = True

    def _columns(self, table: str) -> dict[str, str]:
        return {r[1]: (r[2] or "") for r in self._db.execute(f"PRAGMA table_info({table})")}

    # -- queueing (any thread; never touches the disk) -------------------------------------------
    def _push(self, *ops: tuple) -> int:
        with self._cond:
            if self._closed:
                raise StoreError(f"{self.path}: the store is closed")
            if not self._ops:
                self._since = time.monotonic()
            self._ops.extend(ops)
            self._queued += len(ops)
            self._metric_rows += sum(1 for op in ops if op[0] == "m")
            return self._queued

    def set_info(self, **items: Any) -> None:
        self._push(*[("x", "INSERT OR REPLACE INTO run VALUES (?, ?)",
                      _row((k, json.dumps(v, default=_json_default)))) for k, v in items.items()])

    def record(self, event: Event) -> None:
        """Queue a step's metrics (written when a second has passed since the last write);
        queue and write any other event at once."""
        now = time.time()
        if isinstance(event, StepMetrics):  # the hot path: one tuple, no asdict()
            if self._metric_rows >= self.MAX_BUFFERED:
                self._dropped += 1
                self._report(f"run.db has taken no rows for a long time: {self.MAX_BUFFERED} rows are waiting "
                             "in memory; newer steps are not kept")
                return
            self._push(("m", _row(getattr(event, c) for c in _STEP_FIELDS) + (now,)))
            if time.monotonic() - self._last_commit >= self.commit_interval:
                self._try_write()
            return
        ops = []
        if event.kind == "epoch_end":
            ops.append(("x", "INSERT OR REPLACE INTO epochs VALUES (?,?,?,?,?,?)",
                        _row((event.epoch, event.step, event.train_loss, event.val_loss, event.seconds, now))))
        data = {k: v for k, v in event.to_dict().items() if k not in ("step", "epoch", "kind")}
        ops.append(("x", "INSERT INTO events (time, step, epoch, kind, message, data) VALUES (?,?,?,?,?,?)",
                    _row((now, event.step, event.epoch, event.kind, event.message(),
                          json.dumps(data, default=_json_default)))))
        self._push(*ops)
        # Events are rare: write now, so no write transaction (and its lock) stays open
        # through the next steps, however slow, and blocks send_command from another process.
        self._try_write()

    def discard_after(self, step: int, reason: str) -> None:
        """Metrics rows past `step` (a resume from a checkpoint at `step`) move to
        `discarded_metrics` with the time and `reason`; nothing is deleted."""
        self._push(("discard", int(step), _bindable(str(reason))))
        self._try_write()

    def truncate_after(self, step: int) -> None:
        """Older name of discard_after (rows are moved, never deleted)."""
        self.discard_after(step, f"superseded: the run resumed from its checkpoint at step {step}")

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
            self._push(("x", "UPDATE commands SET status = 'expired', note = ? "
                             "WHERE id <= ? AND status IN ('pending', 'received')", _row((note, upto))))
            self._try_write()
        return upto

    # -- writing -------------------------------------------------------------------------------
    def _try_write(self, force: bool = False) -> None:
        """On the caller's thread, only if it costs nothing: the connection free, run.db's
        write lock free (busy_timeout 0), run.db not known to be in trouble and not slow.
        Otherwise the flusher writes the rows. A write that turns out slow (a slow disk)
        hands all writing to the flusher for a while: the training thread stops paying."""
        now = time.monotonic()
        if not force and (self.problem is not None or now < self._background_until or now < self._retry_at):
            return
        t = time.monotonic()
        self._write(busy_ms=0, block=False)
        took = time.monotonic() - t
        if took > self.SLOW_WRITE:
            self._background_until = time.monotonic() + self.SLOW_BACKGROUND

    def _write(self, busy_ms: int, block: bool) -> bool:
        """Write everything queued, in one transaction. True if the queue is on disk."""
        if not self._db_lock.acquire(blocking=block):
            return False
        db = self._db
        ops: list[tuple] = []
        try:
            if not self._ops and self._ready:
                return True
            db.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
            if not self._ready:
                self._setup()
            db.execute("BEGIN IMMEDIATE")  # the write lock first: a failed try copies nothing
            with self._cond:
                ops = list(self._ops)
            try:
                self._apply(ops)
            except (sqlite3.OperationalError, sqlite3.InterfaceError, sqlite3.ProgrammingError) as e:
                if isinstance(e, sqlite3.OperationalError):
                    raise
                self._retry_isolated(ops)  # a value SQLite refused: find it, keep the rest
            except sqlite3.DatabaseError as e:
                if type(e) is sqlite3.DatabaseError:  # damaged file: keep the rows, retry
                    raise
                self._retry_isolated(ops)  # an integrity error: one row's fault
            except Exception:
                self._retry_isolated(ops)
            db.execute("COMMIT")
        except sqlite3.Error as e:
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            if not _is_busy(e):  # a full disk, an I/O error: each retry rewrites every row, so back off
                self._backoff = min(10.0, max(0.5, self._backoff * 2))
                self._retry_at = time.monotonic() + self._backoff
            if block:  # the flusher waited and still could not: that is worth saying, once
                what = "is held by another program" if _is_busy(e) else "cannot be written"
                self._report(f"run.db {what} ({limits.one_line(e, 120)}); rows are kept in memory and "
                             "written when it can take them")
            return False
        except Exception as e:  # not SQLite's: a bug; keep the rows, say it once
            self._report(f"run.db writer: {type(e).__name__}: {limits.one_line(e, 120)}")
            return False
        finally:
            self._db_lock.release()
        now = time.monotonic()
        with self._cond:
            del self._ops[:len(ops)]
            self._written += len(ops)
            self._metric_rows -= sum(1 for op in ops if op[0] == "m")
            self._since = now if self._ops else None
            self._urge = False
            self._backoff, self._retry_at = 0.0, 0.0
            self._in_flight = {r: q for r, q in self._in_flight.items() if q > self._written}
            if not self._ops and self._reported and not self._dropped:
                self.problem, self._reported = None, False  # a new episode may be reported again
            self._cond.notify_all()
        self._last_commit = now
        return True

    def _retry_isolated(self, ops: list[tuple]) -> None:
        """Inside the open transaction, after a non-transient error: undo, then write op by op,
        each in a savepoint, leaving out (and reporting) only the ones SQLite refuses."""
        db = self._db
        db.execute("ROLLBACK")
        db.execute("BEGIN IMMEDIATE")
        bad = 0
        for op in ops:
            db.execute("SAVEPOINT one")
            try:
                self._apply([op])
            except sqlite3.OperationalError:
                raise
            except Exception:
                bad += 1
                db.execute("ROLLBACK TO one")
            db.execute("RELEASE one")
        if bad:
            self._report(f"run.db refused {bad} rows as written; the others are saved")

    def _apply(self, ops: list[tuple]) -> None:
        db = self._db
        now = time.time()
        i = 0
        while i < len(ops):
            op = ops[i]
            if op[0] == "m":
                j = i
                while j < len(ops) and ops[j][0] == "m":
                    j += 1
                self._insert_metrics([o[1] for o in ops[i:j]], now)
                i = j
                continue
            if op[0] == "x":
                db.execute(op[1], op[2])
            elif op[0] == "discard":
                db.execute(f"INSERT INTO discarded_metrics ({self._moved_cols}, discarded_at, reason) "
                           f"SELECT {self._moved_cols}, ?, ? FROM metrics WHERE step > ?", (now, op[2], op[1]))
                db.execute("DELETE FROM metrics WHERE step > ?", (op[1],))
            i += 1

    def _insert_metrics(self, rows: list[tuple], now: float) -> None:
        """Insert step rows; a step already on disk (or twice in this batch) keeps its
        earlier row in discarded_metrics, reason 'superseded'."""
        db = self._db
        cols = ",".join(METRIC_COLUMNS)
        latest: dict[Any, tuple] = {}
        earlier: list[tuple] = []
        for r in rows:
            if r[0] in latest:
                earlier.append(latest[r[0]])
            latest[r[0]] = r
        steps = [s for s in latest if isinstance(s, int)]
        if steps:
            (n,) = db.execute("SELECT count(*) FROM metrics WHERE step BETWEEN ? AND ?",
                              (min(steps), max(steps))).fetchone()
            if n:
                db.executemany(f"INSERT INTO discarded_metrics ({self._moved_cols}, discarded_at, reason) "
                               f"SELECT {self._moved_cols}, ?, 'superseded' FROM metrics WHERE step = ?",
                               [(now, s) for s in steps])
        if earlier:
            marks = ",".join("?" * (len(METRIC_COLUMNS) + 2))
            db.executemany(f"INSERT INTO discarded_metrics ({cols}, discarded_at, reason) VALUES ({marks})",
                           [r + (now, "superseded") for r in earlier])
        marks = ",".join("?" * len(METRIC_COLUMNS))
        db.executemany(f"INSERT OR REPLACE INTO metrics ({cols}) VALUES ({marks})", list(latest.values()))

    def _flush_loop(self) -> None:
        tick = min(0.1, self.STALL_FLUSH / 4)
        while True:
            with self._cond:
                self._cond.wait(timeout=tick)
                closing = self._closing
                now = time.monotonic()
                stalled = self._since is not None and (
                    self._urge or now - self._since >= self.STALL_FLUSH
                    or (now < self._background_until and now - self._since >= self.commit_interval / 2))
            if closing:
                return
            try:
                if (stalled or (self.problem is not None and self._since is not None)) \
                        and time.monotonic() >= self._retry_at:
                    self._write(busy_ms=self.FLUSHER_BUSY_MS, block=True)
                if time.monotonic() - self._last_checkpoint >= self.CHECKPOINT_EVERY:
                    self._wal_checkpoint()
            except Exception as e:  # never let the flusher die: report and go on
                self._report(f"run.db writer: {type(e).__name__}: {limits.one_line(e, 120)}")

    def _wal_checkpoint(self) -> None:
        self._last_checkpoint = time.monotonic()
        with self._db_lock:
            try:
                self._db.execute("PRAGMA busy_timeout = 0")
                self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error:
                pass  # a reader holds it back: the next one will do

    def commit(self, timeout: float = 2.0) -> bool:
        """Write everything queued so far; True once it is on disk. Waits at most `timeout`
        (not at all while run.db is known to be in trouble): the caller is the training
        thread, which must not wait on the disk for long. Never raises."""
        if self._written >= self._queued and self._ready:
            return True
        target = self._queued
        # One try even in trouble (it costs nothing if the lock is taken), not on a slow disk.
        self._try_write(force=time.monotonic() >= self._background_until)
        if self._written >= target or self.problem is not None or timeout <= 0:
            return self._written >= target
        with self._cond:
            self._urge = True  # the flusher: write now
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._written >= target, timeout=timeout)
            return self._written >= target

    @property
    def unwritten(self) -> int:
        """How many queued writes are not on disk yet."""
        return self._queued - self._written

    def _report(self, message: str) -> None:
        with self._cond:
            if self._reported:
                return
            self._reported = True
            self.problem = message
        if self.on_problem is not None:
            try:
                self.on_problem(message)
            except Exception:
                pass

    # -- commands from other processes -------------------------------------------------------
    def _reader(self) -> sqlite3.Connection:
        if self._read_db is None:
            self._read_db = sqlite3.connect(self.path, timeout=0.05, check_same_thread=False)
        return self._read_db

    def pending_commands(self) -> list[tuple[int, Optional[Command], str]]:
        """(row id, command or None if invalid, error) for each pending row, oldest first,
        at most limits.MAX_COMMANDS_PER_POLL a call. Rows are input from other programs:
        no row content (text where a number belongs, NULLs, blobs, megabytes, invalid
        UTF-8) makes this raise, and a busy or unreadable run.db gives [] for now."""
        self._try_write()
        big = limits.MAX_COMMAND_BYTES
        with self._cond:
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
        seq = self._push(("x", "UPDATE commands SET status = ?, applied_step = ?, note = ? WHERE id = ?",
                          _row((status, step, limits.one_line(note), row_id))))
        with self._cond:
            if seq > self._written:
                self._in_flight[row_id] = seq
        self._try_write()  # release the write lock at once (see record)

    # -- the end -------------------------------------------------------------------------------
    def close(self, timeout: float = 60.0) -> bool:
        """Write what is queued (retrying for up to `timeout` while run.db is busy), then
        close. True if everything reached disk; else the loss is reported through on_problem."""
        if self._closed:
            return self._written >= self._queued
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._flusher.join(timeout=5)
        deadline = time.monotonic() + timeout
        ok = self._write(busy_ms=self.FLUSHER_BUSY_MS, block=True)
        while not ok and time.monotonic() < deadline:
            time.sleep(0.2)
            ok = self._write(busy_ms=self.FLUSHER_BUSY_MS, block=True)
        with self._cond:
            self._closed = True
            lost = self._queued - self._written
        if lost or self._dropped:
            self._reported = False
            self._report(f"run.db: {lost + self._dropped} writes could not be saved "
                         f"({self.problem or 'run.db stayed busy'})")
        with self._db_lock:
            for db in (self._read_db, self._db):
                try:
                    if db is not None:
                        db.close()
                except sqlite3.Error:
                    pass
        return not lost and not self._dropped


def send_command(run_dir: str, command: Command) -> int:
    """Queue a command for a run in another process. Returns the row id."""
    path = os.path.join(run_dir, DB_NAME)
    if not os.path.isfile(path):
        raise StoreError(f"{run_dir} is not a run folder (no {DB_NAME})")
    try:
        db = sqlite3.connect(path, timeout=10)
    except sqlite3.Error as e:
        raise StoreError(f"{path}: {e}") from None
    try:
        cur = db.execute("INSERT INTO commands (time, kind, payload) VALUES (?,?,?)",
                         (time.time(), command.kind, command.to_json()))
        db.commit()
        return int(cur.lastrowid)
    except sqlite3.Error as e:
        raise StoreError(f"could not queue {command.kind} in {path}: {e}") from None
    finally:
        db.close()


def _uri(path: str, mode: str = "ro") -> str:
    from urllib.parse import quote
    return f"file:{quote(os.fsencode(os.path.abspath(path)))}?mode={mode}"


def _decode(b: bytes) -> str:
    return b.decode("utf-8", "replace")  # text another program wrote that is not UTF-8


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
            self._db = sqlite3.connect(_uri(self.path), uri=True, timeout=5, check_same_thread=False)
            self._db.text_factory = _decode
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
            db = sqlite3.connect(_uri(tmp), uri=True, check_same_thread=False)
            db.text_factory = _decode
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except (OSError, sqlite3.DatabaseError):
            return False
        self._db, self._salvage_path = db, tmp
        self.problems.append(f"run.db is damaged ({error}): showing what could be read")
        return True

    def _present(self, table: str) -> set[str]:
        try:
            return {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
        except sqlite3.DatabaseError:
            return set()

    def _select(self, table: str, wanted: Iterable[str]) -> str:
        """The select list for `wanted`: columns this file has, NULL for those it lacks (a run
        written by an older engine)."""
        have = self._present(table)
        return ",".join(f'"{c}"' if c in have else "NULL" for c in wanted)

    def info(self) -> dict[str, Any]:
        out = {}
        for k, v in self._query("SELECT key, value FROM run"):
            try:
                out[k] = json.loads(v)
            except (TypeError, ValueError, RecursionError):
                out[k] = v
        return out

    def metrics(self, after_step: int = -1) -> list[dict[str, Any]]:
        rows = self._query(f"SELECT {self._select('metrics', METRIC_COLUMNS)} FROM metrics "
                           "WHERE step > ? ORDER BY step", (after_step,))
        return [dict(zip(METRIC_COLUMNS, r)) for r in rows]

    def discarded(self) -> list[dict[str, Any]]:
        """Metrics rows a resume or a rerun of a step superseded, in the order they were moved,
        each with `discarded_at` and `reason`. Empty for runs written before they were kept."""
        if not self._present("discarded_metrics"):
            return []
        cols = METRIC_COLUMNS + DISCARD_COLUMNS
        rows = self._query(f"SELECT {self._select('discarded_metrics', cols)} FROM discarded_metrics ORDER BY rowid")
        return [dict(zip(cols, r)) for r in rows]

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
            except (TypeError, ValueError, RecursionError):
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
