"""The side of run.db other processes use: `RunReader` (read-only, live or finished runs,
damaged files salvaged) and `send_command` (queue a command for a running engine).

`RunReader` reads only the columns a file has (NULL for the others), so runs written by an
older engine open. Torch-free: the app reads run folders with it without loading torch.
"""
from __future__ import annotations

import os
import sqlite3
import time
from typing import Any, Iterable, Optional

from engine.declarations.commands import Command

from . import stored
from ._tables import DB_NAME, DISCARD_COLUMNS, METRIC_COLUMNS, SCALAR_COLUMNS, StoreError


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
        row_id = cur.lastrowid
        assert row_id is not None  # an INSERT's row
        return row_id
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

    @property
    def connection(self) -> sqlite3.Connection:
        """The open read-only connection (for a damaged file, to the salvaged copy), for a
        reader that runs its own column queries over the metrics table (the app's long runs)."""
        return self._db

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
        """The run table, each value as engine/store/stored.py's run_value reads it (JSON-shaped,
        no int past 64 bits): what a caller then reads of it goes through stored's accessors."""
        return {k: stored.run_value(v) for k, v in self._query("SELECT key, value FROM run") if isinstance(k, str)}

    def metrics(self, after_step: int = -1, limit: Optional[int] = None) -> list[dict[str, Any]]:
        """Rows past `after_step`, in step order; at most `limit` of them (a reader that pages
        through a long run instead of holding it all at once)."""
        return [dict(zip(METRIC_COLUMNS, r)) for r in self.metric_values(after_step, limit)]

    def metric_values(self, after_step: int = -1, limit: Optional[int] = None) -> list[tuple[Any, ...]]:
        """metrics(), as tuples in METRIC_COLUMNS order: for a reader that passes a long run on
        (headroom-ctl's follow) without building a dict per row."""
        page = "" if limit is None else f" LIMIT {max(0, int(limit))}"
        return self._query(f"SELECT {self._select('metrics', METRIC_COLUMNS)} FROM metrics "
                           f"WHERE step > ? ORDER BY step{page}", (after_step,))

    def last_metrics(self, count: int = 1) -> list[dict[str, Any]]:
        """The last `count` rows, in step order (a status line, an estimate of the step time),
        without reading the rest of a long run."""
        rows = self._query(f"SELECT {self._select('metrics', METRIC_COLUMNS)} FROM metrics "
                           "ORDER BY step DESC LIMIT ?", (max(0, int(count)),))
        return [dict(zip(METRIC_COLUMNS, r)) for r in reversed(rows)]

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
        wanted = None if kinds is None else set(kinds)
        # data: an object whose declared fields have their declared shapes (stored.row_data): text
        # that is not JSON, a list where an object was written, a count that is 1e300 or text, is
        # read as absent, so no reader has to guess.
        return [dict(id=r[0], time=r[1], step=r[2], epoch=r[3], kind=r[4], message=r[5],
                     data=stored.row_data(r[4], r[6]))
                for r in rows if wanted is None or r[4] in wanted]

    _COMMAND_COLUMNS = ("id", "time", "kind", "payload", "status", "applied_step", "note")

    def scalar_names(self) -> list[str]:
        """The names in the `scalars` table, sorted ([] for a run written before it existed)."""
        if not self._present("scalars"):
            return []
        return sorted(r[0] for r in self._query("SELECT DISTINCT name FROM scalars") if isinstance(r[0], str))

    def scalars(self, names: Optional[Iterable[str]] = None, after_rowid: int = 0) -> list[dict[str, Any]]:
        """`scalars` rows (step, epoch, name, value, time, and `rowid` to read on from), in the
        order they were written; only `names` if given. [] for a run without the table."""
        if not self._present("scalars"):
            return []
        rows = self._query("SELECT rowid, step, epoch, name, value, time FROM scalars WHERE rowid > ? ORDER BY rowid",
                           (after_rowid,))
        wanted = set(names) if names is not None else None
        return [dict(zip(("rowid",) + SCALAR_COLUMNS, r)) for r in rows if wanted is None or r[3] in wanted]

    def commands(self) -> list[dict[str, Any]]:
        cols = self._COMMAND_COLUMNS
        return [dict(zip(cols, r)) for r in self._query(f"SELECT {','.join(cols)} FROM commands ORDER BY id")]

    def command(self, row_id: int) -> Optional[dict[str, Any]]:
        """One row of the commands table (what became of a command sent with send_command), or None."""
        cols = self._COMMAND_COLUMNS
        rows = self._query(f"SELECT {','.join(cols)} FROM commands WHERE id = ?", (int(row_id),))
        return dict(zip(cols, rows[0])) if rows else None

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
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

    def __enter__(self) -> RunReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()
        if self._salvage_path is not None:
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.unlink(self._salvage_path + suffix)
                except OSError:
                    pass
            self._salvage_path = None
