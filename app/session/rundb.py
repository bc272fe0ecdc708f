"""run.db's metrics table straight into numpy columns.

Reading is one SELECT, a chunk of rows at a time, each chunk turned into numpy at once and
copied into arrays allocated once (count(*) first), in each column's own dtype
(app/model/metrics.py). A value that is not a number (text in a REAL column, a blob) is
NaN. sqlite3 costs about 0.3 us a row plus 0.1-0.15 us a value, so a large read (a long run
opened) fetches only what the plots and the status bar show (EAGER_COLUMNS, and on a GPU
run MEMORY_COLUMNS), of those only the ones that vary (a column holding one value, or NULL,
all along is found by one scan and filled), the two flag columns through a query for the
rows where they are set, and leaves the others (accum, micro_batch, tokens, step_time,
mem_allocated) to `RunDbColumns`, which reads one when something first asks for it (a CSV
export, the tokens x axis, the ETA of a run followed live). Qt-free.
"""
from __future__ import annotations

import logging
import math
import sqlite3
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from app.model.metrics import COLUMN_DTYPES, STEP_COLUMNS
from engine.store import RunReader, StoreError

log = logging.getLogger("headroom.rundb")

CHUNK = 16384  # rows per fetchmany: a few MB of Python objects at a time
LAZY_ABOVE = 20_000  # a read of more rows than this fetches EAGER_COLUMNS only
EAGER_COLUMNS = ("step", "epoch", "loss", "grad_norm", "clip", "lr", "samples", "throughput", "time",
                 "mem_params", "mem_grads", "mem_optimizer")  # memory by kind: CPU runs record these too
MEMORY_COLUMNS = ("mem_used", "mem_total", "mem_reserved", "mem_peak", "mem_activations")  # GPU: the memory plots
FLAG_COLUMNS = ("clipped", "nonfinite")  # mostly 0: read where set


def metric_columns(db: sqlite3.Connection) -> set[str]:
    """The columns run.db's metrics table has (an older engine wrote fewer)."""
    return {r[1] for r in db.execute("PRAGMA table_info(metrics)")}


def _step_filter(db: sqlite3.Connection) -> str:
    """The WHERE clause for steps after ?: the engine's step is the rowid (always an integer);
    a table someone else made may hold anything there."""
    for r in db.execute("PRAGMA table_info(metrics)"):
        if r[1] == "step" and str(r[2]).upper() == "INTEGER" and r[5] == 1:
            return "WHERE step > ?"
    return "WHERE typeof(step) = 'integer' AND step > ?"


def _number(v: Any) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        try:
            return float(v)
        except OverflowError:
            return math.copysign(math.inf, v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return math.nan
    return math.nan


def _block(chunk: list[tuple], width: int) -> np.ndarray:
    """Rows as a float64 matrix, NULL as NaN; the slow way only for a chunk holding text."""
    try:
        a = np.array(chunk, dtype=np.float64)
        if a.shape == (len(chunk), width):
            return a
    except (TypeError, ValueError, OverflowError):
        pass
    return np.array([[_number(v) for v in row] for row in chunk], dtype=np.float64).reshape(len(chunk), width)


def _fetch(db: sqlite3.Connection, names: Sequence[str], sql: str, args: tuple, n: Optional[int],
           chunk: int, problems: Optional[list[str]]) -> tuple[int, list[np.ndarray]]:
    """Rows of `names` from `sql` into arrays of n (or, n unknown, growing) rows. A table
    damaged part way gives the rows before the damage and a line in `problems`."""
    arrays = [np.empty(n if n is not None else chunk, dtype=COLUMN_DTYPES.get(c, np.float64)) for c in names]
    pos = 0

    def put(rows: list[tuple]) -> None:
        nonlocal pos, arrays
        block = _block(rows, len(names))
        end = pos + len(rows)
        if end > len(arrays[0]):  # n unknown (or, never trusted, more rows than counted)
            grown = []
            for a in arrays:
                g = np.empty(max(end, 2 * len(a)), dtype=a.dtype)
                g[:pos] = a[:pos]
                grown.append(g)
            arrays = grown
        for j, a in enumerate(arrays):
            a[pos:end] = block[:, j]
        pos = end

    try:
        cur = db.execute(sql, args)
        while True:
            rows = cur.fetchmany(chunk)
            if not rows:
                break
            put(rows)
    except sqlite3.DatabaseError as e:
        if isinstance(e, sqlite3.OperationalError) and "malformed" not in str(e) or problems is None:
            raise  # busy, locked: the caller tries again later
        # Damaged pages: fetchmany drops the rows of the chunk it was in; read that part row by row.
        start = int(arrays[0][pos - 1]) if pos else None
        try:
            again = sql.replace("step > ?", "step > ? AND step > ?", 1)
            cur = db.execute(again, args + ((start if start is not None else args[0]),))
            for row in cur:
                put([row])
        except sqlite3.DatabaseError:
            pass
        note = f"metrics: only the first {pos} rows could be read ({e})"
        if note not in problems:
            problems.append(note)
    return pos, arrays


def _same(a: Any, b: Any) -> bool:
    return a == b or (a is None and b is None)


def _constants(db: sqlite3.Connection, where: str, after_step: int, names: Sequence[str], first: int,
               last: int) -> dict[str, Optional[float]]:
    """The columns among `names` that hold one value (or NULL) in every row after after_step,
    found without reading them row by row: a few rows spread over the run say which might;
    one scan that stops at the first row where any of those differs confirms them (or drops
    the ones that differ there, and looks again from that row)."""
    if not names:
        return {}
    probe = sorted({int(v) for v in np.linspace(first, last, 33)})
    cols = ", ".join(f'"{c}"' for c in names)
    rows = db.execute(f"SELECT {cols} FROM metrics WHERE step IN ({','.join('?' * len(probe))})", probe).fetchall()
    if not rows:
        return {}
    ref = rows[0]
    cand = {c: ref[j] for j, c in enumerate(names)
            if (ref[j] is None or isinstance(ref[j], (int, float))) and all(_same(r[j], ref[j]) for r in rows)}
    start = after_step
    while cand:
        keys = list(cand)
        differs = ", ".join(f'"{c}" IS NOT ?' for c in keys)
        cond = " OR ".join(f'"{c}" IS NOT ?' for c in keys)
        values = [cand[c] for c in keys]
        row = db.execute(f"SELECT step, {differs} FROM metrics {where} AND ({cond}) ORDER BY step LIMIT 1",
                         [*values, start, *values]).fetchone()
        if row is None:
            return {c: (None if v is None else float(v)) for c, v in cand.items()}
        for c, d in zip(keys, row[1:]):
            if d:
                del cand[c]
        start = int(row[0]) - 1  # the others held up to here: look on from this row
    return {}


@dataclass
class StepsRead:
    columns: dict[str, np.ndarray]  # the steps read, by column
    partial: bool  # a large read: only EAGER_COLUMNS, MEMORY_COLUMNS and the flags
    counts_tokens: Optional[bool] = None  # a partial read: whether the loss counts tokens (tokens left out)
    nulls: frozenset = frozenset()  # columns left out because no row read holds a value in them
    last_step: int = -1


def read_steps(db: sqlite3.Connection, after_step: int = -1, have: Optional[Iterable[str]] = None,
               chunk: int = CHUNK, problems: Optional[list[str]] = None,
               lazy_above: int = LAZY_ABOVE) -> Optional[StepsRead]:
    """The steps after `after_step` (None if there are none). A partial read (a large one)
    holds EAGER_COLUMNS, MEMORY_COLUMNS and the flags, but not the ones that are NULL in
    every row (`nulls`); the caller hands the rest to a RunDbColumns. Raises sqlite3.Error for
    a file that cannot be read (busy, not a database)."""
    have = set(have) if have is not None else metric_columns(db)
    if "step" not in have:
        return None
    where = _step_filter(db)
    began = False
    if not db.in_transaction:
        db.execute("BEGIN")  # one snapshot for the count and the rows
        began = True
    try:
        n: Optional[int]
        first = last = 0
        try:
            n, first, last = db.execute(f"SELECT count(*), min(step), max(step) FROM metrics {where}",
                                        (after_step,)).fetchone()
            n = int(n or 0)
            if n == 0:
                return None
        except sqlite3.DatabaseError as e:
            if isinstance(e, sqlite3.OperationalError) and "malformed" not in str(e):
                raise
            n = None  # a damaged table: read what can be read
        partial = n is not None and n > lazy_above
        known: dict[str, Optional[float]] = {}
        if partial:
            names = [c for c in EAGER_COLUMNS + MEMORY_COLUMNS if c in have]
            known = _constants(db, where, after_step, names[1:], int(first), int(last))
            names = [c for c in names if c not in known]
        else:
            names = [c for c in STEP_COLUMNS if c in have]
        if names[0] != "step":
            names.remove("step")
            names.insert(0, "step")
        select = ", ".join(f'"{c}"' for c in names)
        pos, arrays = _fetch(db, names, f"SELECT {select} FROM metrics {where} ORDER BY step", (after_step,),
                             n, chunk, problems)
        out = {c: (a if pos == len(a) else a[:pos].copy()) for c, a in zip(names, arrays)}
        nulls = frozenset(c for c, v in known.items() if v is None)  # no GPU, say: read as NaN when asked
        for c, v in known.items():
            if v is not None:
                out[c] = np.full(pos, v, dtype=COLUMN_DTYPES.get(c, np.float64))
        counts_tokens: Optional[bool] = None
        if partial and pos:
            out.update(_flags(db, where, after_step, have, out["step"], chunk,
                              problems if problems is not None else []))
            if "tokens" in have:
                counts_tokens = db.execute(
                    f"SELECT 1 FROM metrics {where} AND tokens IS NOT samples AND tokens IS NOT NULL "
                    "AND samples IS NOT NULL LIMIT 1", (after_step,)).fetchone() is not None
    finally:
        if began and db.in_transaction:
            try:
                db.execute("COMMIT")  # a read: nothing to keep (a damaged file may refuse even this)
            except sqlite3.Error:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
    if pos == 0:
        return None
    return StepsRead(out, partial, counts_tokens, nulls if partial else frozenset(), int(out["step"][-1]))


def _flags(db: sqlite3.Connection, where: str, after_step: int, have: set[str], steps: np.ndarray,
           chunk: int, problems: list[str]) -> dict[str, np.ndarray]:
    """clipped and nonfinite as whole columns, from the rows where either is set (0 elsewhere,
    NULL included)."""
    flags = [c for c in FLAG_COLUMNS if c in have]
    out = {c: np.zeros(len(steps), dtype=COLUMN_DTYPES[c]) for c in flags}
    if not flags:
        return out
    cond = " OR ".join(f'("{c}" IS NOT 0 AND "{c}" IS NOT NULL)' for c in flags)
    cols = ", ".join(f'"{c}"' for c in flags)
    sql = f"SELECT step, {cols} FROM metrics {where} AND ({cond}) ORDER BY step"
    pos, arrays = _fetch(db, ["step", *flags], sql, (after_step,), None, chunk, problems)
    if pos:
        at = np.searchsorted(steps, arrays[0][:pos])
        ok = (at < len(steps)) & (steps[np.minimum(at, len(steps) - 1)] == arrays[0][:pos])
        for c, a in zip(flags, arrays[1:]):
            out[c][at[ok]] = a[:pos][ok]
    return out


class RunDbColumns:
    """Reads a column of a run folder's metrics when first asked (the model's ColumnLoader):
    a run opened for viewing holds only what its plots draw until something needs more.
    Opens run.db afresh each time (the window may have moved on to another run); a folder
    gone or unreadable gives NaN."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.null_through: dict[str, int] = {}  # column -> NULL in every row up to this step

    def knows_null(self, name: str, since: int, through: int) -> None:
        """A read found `name` NULL in every row after `since` up to `through`: those steps are
        not asked for (a run without a GPU opened: its memory columns are NaN at no cost)."""
        if since < 0 or self.null_through.get(name, -2) >= since:
            self.null_through[name] = max(through, self.null_through.get(name, through))

    def _read(self, sql: str, args: tuple, names: Sequence[str]) -> tuple[int, list[np.ndarray]]:
        reader = RunReader(self.run_dir)
        try:
            db = getattr(reader, "connection", None)  # a salvaged copy for a damaged file
            if db is None:  # a RunReader without one: its rows, the slow way
                rows = [r for r in reader.metrics(after_step=int(args[0]) - 1) if r["step"] <= args[1]]
                block = _block([(r["step"], r.get(names[-1])) for r in rows], 2) if rows else np.empty((0, 2))
                return len(rows), [block[:, 0].astype(np.int64), block[:, 1]]
            if names[-1] not in metric_columns(db):  # an older engine did not record it
                return 0, [np.empty(0, dtype=np.int64), np.empty(0)]
            return _fetch(db, names, sql, args, None, CHUNK, list(reader.problems))
        finally:
            reader.close()

    def column(self, name: str, steps: np.ndarray) -> np.ndarray:
        """`name` at each of `steps` (NaN where run.db has no such row or value)."""
        out = np.full(len(steps), math.nan, dtype=COLUMN_DTYPES.get(name, np.float64))
        lo = int(np.searchsorted(steps, self.null_through[name], side="right")) if name in self.null_through else 0
        ask = steps[lo:]
        if not len(ask):
            return out
        try:
            pos, (db_steps, values) = self._read(
                f'SELECT step, "{name}" FROM metrics WHERE step >= ? AND step <= ? ORDER BY step',
                (int(ask[0]), int(ask[-1])), ("step", name))
        except (StoreError, sqlite3.Error, OSError) as e:
            log.warning("%s: cannot read column %s: %s", self.run_dir, name, e)
            return out
        if pos:
            db_steps, values = db_steps[:pos], values[:pos]
            at = np.minimum(np.searchsorted(db_steps, ask), pos - 1)
            ok = db_steps[at] == ask
            out[lo:][ok] = values[at[ok]]
        return out

    def value(self, name: str, step: int) -> float:
        v = self.column(name, np.asarray([step], dtype=np.int64))
        return float(v[0])
