"""run.db's write queue and its flusher thread (behind engine.store.RunStore).

- Rows reach disk on time. The training thread queues operations and writes them itself when
  that costs it nothing (the connection free, run.db's write lock free: busy_timeout 0, no
  fsync on that path); a small flusher thread writes whatever has waited a second, so rows
  land within about a second even while the training thread is stalled in task code.
- A busy or slow run.db never ends a run: rows stay in memory until the store can take
  them, the trouble is reported once through `on_problem`, and training goes on.
- What is lost is said: `close` returns False and `lost` counts what did not reach disk (the
  run's status is saved alone where the rest cannot be). A run.db deleted under the writer is
  seen within a second and written back at the end from the open connection (_losses.py).

What the operations are and how they become SQL: engine.store._tables. Torch-free.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from typing import Any, Callable, Optional

from engine.declarations import limits

from . import _losses
from ._tables import StoreError, apply_ops, migrate


def is_busy(e: BaseException) -> bool:
    text = str(e).lower()
    return "locked" in text or "busy" in text


class StoreWriter:
    """The queue of writes to one run.db and the thread that empties it when the caller does not.

    Any thread may queue (`push`, `push_metrics`); `try_write` writes on the caller's thread
    only when that is free. `on_problem(message)` is called at most once per episode of
    trouble (run.db busy, a disk error, rows dropped), from whichever thread noticed it.
    `problem` holds the current trouble, or None."""

    STALL_FLUSH = 1.0  # seconds a row may wait in memory before the flusher writes it
    FLUSHER_BUSY_MS = 1000  # how long the flusher waits for run.db's write lock per try
    CHECKPOINT_EVERY = 10.0  # seconds between WAL checkpoints (the only fsyncs), on the flusher
    MAX_BUFFERED = 1_000_000  # metrics rows kept in memory while run.db takes none (~0.5 GB)
    SLOW_WRITE = 0.25  # seconds: a write on the training thread slower than this ...
    SLOW_BACKGROUND = 30.0  # ... leaves writing to the flusher for this long
    FILE_CHECK_EVERY = 1.0  # seconds between checks that run.db is still the file opened
    DISK_RETRY = 5.0  # seconds close() retries a run.db that fails for another reason than busy

    def __init__(self, path: str, commit_interval: float = 1.0,
                 on_problem: Optional[Callable[[str], None]] = None) -> None:
        self.path = path
        self.commit_interval = commit_interval
        self.on_problem = on_problem
        self.problem: Optional[str] = None
        self._reported = False
        self._dropped = 0
        self._cond = threading.Condition()  # guards the queue and the counters below
        self._ops: list[tuple[Any, ...]] = []  # ordered writes not yet on disk
        self._queued = 0  # ops queued so far (a sequence number)
        self.written = 0  # ops on disk so far
        self._since: Optional[float] = None  # monotonic time the oldest queued op was queued
        self._metric_rows = 0
        self._db_lock = threading.Lock()  # the write connection
        self._ready = False  # schema created and migrated
        self._moved_cols = ""
        self._last_commit = time.monotonic()
        self._last_checkpoint = time.monotonic()
        self._closing = False
        self._closed = False
        self._urge = False  # commit() is waiting: the flusher writes now
        self._background_until = 0.0  # monotonic time until which only the flusher writes (slow disk)
        self._backoff, self._retry_at = 0.0, 0.0  # after a disk error: the flusher's next try
        self._last_error, self._last_busy = "", True  # the newest failed write, and whether it was busy
        self._identity: _losses.Identity = None  # run.db's (dev, inode) as opened
        self._gone: Optional[str] = None  # why run.db is not the file opened any more
        self._file_checked = time.monotonic()
        self._on_disk = {"m": 0, "p": 0, "e": 0, "x": 0}  # writes that reached run.db, by kind (_losses.kind_of)
        self.lost = ""  # after close(): what did not reach disk, in words ("" = nothing)
        try:
            self._db = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA busy_timeout = 2000")
            self._setup()
        except sqlite3.Error as e:
            if not is_busy(e):
                raise StoreError(f"could not open {self.path}: {e}") from None
            self.report(f"run.db is held by another program ({e}); rows are kept in memory until it is free")
        self._flusher = threading.Thread(target=self._flush_loop, name="headroom-store", daemon=True)
        self._flusher.start()

    def _setup(self) -> None:
        self._moved_cols = migrate(self._db)
        self._identity = _losses.file_identity(self.path)
        self._ready = True

    # -- queueing (any thread; never touches the disk) -------------------------------------------
    def push(self, *ops: tuple[Any, ...]) -> int:
        """Queue `ops` in order; returns the sequence number of the last (on disk once
        `written` reaches it)."""
        return self._enqueue(ops, sum(1 for op in ops if op[0] == "m"))

    def _enqueue(self, ops: tuple[Any, ...], metric_rows: int) -> int:
        with self._cond:
            if self._closed:
                raise StoreError(f"{self.path}: the store is closed")
            if not self._ops:
                self._since = time.monotonic()
            self._ops.extend(ops)
            self._queued += len(ops)
            self._metric_rows += metric_rows
            return self._queued

    def push_metrics(self, row: tuple[Any, ...]) -> None:
        """Queue one metrics row (the hot path); written when commit_interval has passed
        since the last write. Past MAX_BUFFERED rows waiting, the row is dropped (reported)."""
        if self._metric_rows >= self.MAX_BUFFERED:
            self._dropped += 1
            self.report(f"run.db has taken no rows for a long time: {self.MAX_BUFFERED} rows are waiting "
                        "in memory; newer steps are not kept")
            return
        self._enqueue((("m", row),), 1)  # push() without counting the metrics rows
        if time.monotonic() - self._last_commit >= self.commit_interval:
            self.try_write()

    @property
    def unwritten(self) -> int:
        """How many queued writes are not on disk yet."""
        return self._queued - self.written

    # -- writing -------------------------------------------------------------------------------
    def try_write(self, force: bool = False) -> None:
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
        ops: list[tuple[Any, ...]] = []
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
                apply_ops(db, ops, self._moved_cols)
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
            self._last_error, self._last_busy = limits.one_line(e, 120), is_busy(e)
            if not is_busy(e):  # a full disk, an I/O error: each retry rewrites every row, so back off
                self._backoff = min(10.0, max(0.5, self._backoff * 2))
                self._retry_at = time.monotonic() + self._backoff
            if block:  # the flusher waited and still could not: that is worth saying, once
                what = "is held by another program" if is_busy(e) else "cannot be written"
                self.report(f"run.db {what} ({limits.one_line(e, 120)}); rows are kept in memory and "
                            "written when it can take them")
            return False
        except Exception as e:  # not SQLite's: a bug; keep the rows, say it once
            self.report(f"run.db writer: {type(e).__name__}: {limits.one_line(e, 120)}")
            return False
        finally:
            self._db_lock.release()
        now = time.monotonic()
        with self._cond:
            del self._ops[:len(ops)]
            self.written += len(ops)
            for op in ops:
                self._on_disk[_losses.kind_of(op)] += 1
            self._metric_rows -= sum(1 for op in ops if op[0] == "m")
            self._since = now if self._ops else None
            self._urge = False
            self._backoff, self._retry_at = 0.0, 0.0
            if not self._ops and self._reported and not self._dropped:
                self.problem, self._reported = None, False  # a new episode may be reported again
            self._cond.notify_all()
        self._last_commit = now
        return True

    def _retry_isolated(self, ops: list[tuple[Any, ...]]) -> None:
        """Inside the open transaction, after a non-transient error: undo, then write op by op,
        each in a savepoint, leaving out (and reporting) only the ones SQLite refuses."""
        db = self._db
        db.execute("ROLLBACK")
        db.execute("BEGIN IMMEDIATE")
        bad = 0
        for op in ops:
            db.execute("SAVEPOINT one")
            try:
                apply_ops(db, [op], self._moved_cols)
            except sqlite3.OperationalError:
                raise
            except Exception:
                bad += 1
                db.execute("ROLLBACK TO one")
            db.execute("RELEASE one")
        if bad:
            self.report(f"run.db refused {bad} rows as written; the others are saved")

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
                if time.monotonic() - self._file_checked >= self.FILE_CHECK_EVERY:
                    self._watch_file()
            except Exception as e:  # never let the flusher die: report and go on
                self.report(f"run.db writer: {type(e).__name__}: {limits.one_line(e, 120)}")

    def _wal_checkpoint(self, mode: str = "PASSIVE") -> None:
        """PASSIVE: the flusher's, every CHECKPOINT_EVERY. TRUNCATE: close() after a write that
        failed for want of room: the WAL's pages move into run.db and the WAL file shrinks to
        nothing, which may be the room the last writes need."""
        self._last_checkpoint = time.monotonic()
        with self._db_lock:
            try:
                self._db.execute("PRAGMA busy_timeout = 0")
                self._db.execute(f"PRAGMA wal_checkpoint({mode})")
            except sqlite3.Error:
                pass  # a reader holds it back: the next one will do

    def _watch_file(self) -> None:
        """run.db deleted or replaced under the open connection: said at once (the rows go on
        to the open file, and close() writes them back to the folder)."""
        self._file_checked = time.monotonic()
        if self._gone is not None or not self._ready:
            return
        why = _losses.changed(self.path, self._identity)
        if why is None:
            return
        self._gone = why  # not report(): said even during another episode of trouble
        self._say(f"{why}; the engine keeps every row and writes run.db back when the run ends")

    def commit(self, timeout: float = 2.0) -> bool:
        """Write everything queued so far; True once it is on disk. Waits at most `timeout`
        (not at all while run.db is known to be in trouble). Never raises."""
        if self.written >= self._queued and self._ready:
            return True
        target = self._queued
        # One try even in trouble (it costs nothing if the lock is taken), not on a slow disk.
        self.try_write(force=time.monotonic() >= self._background_until)
        if self.written >= target or self.problem is not None or timeout <= 0:
            return self.written >= target
        with self._cond:
            self._urge = True  # the flusher: write now
            self._cond.notify_all()
            self._cond.wait_for(lambda: self.written >= target, timeout=timeout)
            return self.written >= target

    def report(self, message: str) -> None:
        """Say `message` through on_problem, once per episode of trouble."""
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

    # -- the end -------------------------------------------------------------------------------
    def close(self, timeout: float = 60.0) -> bool:
        """Write what is queued (retrying for up to `timeout` while run.db is busy, DISK_RETRY
        seconds while it fails otherwise), then close. True if everything reached disk; else
        `lost` says what did not (also through on_problem), and the run's status is saved
        alone if it can be. A run.db deleted during the run is written back here."""
        if self._closed:
            return not self.lost
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._flusher.join(timeout=5)
        self._watch_file()
        start = time.monotonic()
        ok = self._write(busy_ms=self.FLUSHER_BUSY_MS, block=True)
        while not ok and time.monotonic() - start < (timeout if self._last_busy else min(timeout, self.DISK_RETRY)):
            if not self._last_busy:
                self._wal_checkpoint("TRUNCATE")
            time.sleep(0.2)
            ok = self._write(busy_ms=self.FLUSHER_BUSY_MS, block=True)
        with self._cond:
            self._closed = True
            left = list(self._ops)
        self.lost = self._losses(left)
        if self.lost:
            self._reported = False
            self.report(f"run.db: {self.lost}")
        with self._db_lock:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
        return not self.lost

    def _losses(self, left: list[tuple[Any, ...]]) -> str:
        """What did not reach the folder's run.db, in words ("" = nothing). Writes the run's
        status alone where the rest could not be written, and puts a deleted run.db back."""
        counts = {"m": self._dropped, "p": 0, "e": 0, "x": 0}
        for op in left:
            counts[_losses.kind_of(op)] += 1
        text = ""
        with self._db_lock:
            if left or self._dropped:
                cause = self._last_error or ("run.db stayed busy" if self._last_busy else "it could not be written")
                text = f"{_losses.describe(counts)} did not reach run.db ({cause})"
                info = [op for op in left if op[0] == "x" and str(op[1]).startswith("INSERT OR REPLACE INTO run")]
                if info and self._write_alone(info + [("x", "INSERT OR REPLACE INTO run VALUES (?, ?)",
                                                       ("store_lost", json.dumps(text)))]):
                    text += "; the run's status was saved"
            if self._gone is not None:
                why_not = _losses.put_back(self._db, self.path)
                if why_not is not None:  # everything written since the open went to the deleted file
                    every = {k: counts[k] + self._on_disk[k] for k in counts}
                    return f"{_losses.describe(every)} are not in the folder ({self._gone}; not written back: {why_not})"
                self._say(f"{self._gone}: written back at the end of the run" + ("" if text else ", every row in it"))
        return text

    def _write_alone(self, ops: list[tuple[Any, ...]]) -> bool:
        """`ops` (the run table's rows) in a transaction of their own: small enough to fit where
        the whole queue did not."""
        try:
            self._db.execute(f"PRAGMA busy_timeout = {int(self.FLUSHER_BUSY_MS)}")
            self._db.execute("BEGIN IMMEDIATE")
            apply_ops(self._db, ops, self._moved_cols)
            self._db.execute("COMMIT")
            return True
        except Exception:
            try:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            return False

    def _say(self, message: str) -> None:
        if self.on_problem is not None:
            try:
                self.on_problem(message)
            except Exception:
                pass
