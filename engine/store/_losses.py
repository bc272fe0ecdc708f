"""What run.db lost, said in words, and run.db put back when it was deleted under the writer
(behind engine.store._writer.StoreWriter). Torch-free.

- `file_identity` / `changed`: run.db deleted or replaced while the engine writes it. SQLite
  goes on writing the open (unlinked) file, so without a check the run ends "completed" with
  no run.db in its folder.
- `put_back`: the open connection still sees every row: VACUUM INTO writes them to a new
  run.db at the same path, once the engine's other connections to the old file are closed
  (the end of the run), so no stale -wal of the old file is ever read into the new one.
- `describe`: the writes that did not reach disk, counted by what they are.
"""
from __future__ import annotations

import os
import sqlite3
from typing import Any, Optional

Identity = Optional[tuple[int, int]]  # (st_dev, st_ino) of run.db, or None if there is none


def file_identity(path: str) -> Identity:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def changed(path: str, identity: Identity) -> Optional[str]:
    """Why the file at `path` is no longer the one opened as `identity`, or None."""
    if identity is None:
        return None
    now = file_identity(path)
    if now == identity:
        return None
    if now is None:
        if not os.path.isdir(os.path.dirname(path) or "."):
            return "run.db was deleted with its folder while the run wrote it"
        return "run.db was deleted while the run wrote it"
    return "run.db was replaced by another file while the run wrote it"


def put_back(db: sqlite3.Connection, path: str) -> Optional[str]:
    """Write what the open connection `db` holds (a run.db deleted under it) to a new file at
    `path`; None once done, else why not. Only when nothing is at `path` (never over another
    file) and its folder exists; stale -wal and -shm files of the old run.db go first."""
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        return "its folder is gone"
    if os.path.lexists(path):
        return "another file is there now"
    tmp = os.path.join(folder, f".{os.path.basename(path)}.restore-{os.getpid()}")
    try:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        db.execute("VACUUM INTO ?", (tmp,))
        for suffix in ("-wal", "-shm"):  # the deleted file's, if they were left: never read into the new one
            try:
                os.unlink(path + suffix)
            except FileNotFoundError:
                pass
        os.rename(tmp, path)
    except (sqlite3.Error, OSError) as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return f"{type(e).__name__}: {e}"
    return None


_KINDS = (("m", "step rows"), ("p", "epoch rows"), ("e", "events"), ("x", "other writes"))


def kind_of(op: tuple[Any, ...]) -> str:
    """'m' a metrics row, 'p' an epochs row, 'e' an events row, 'x' anything else (the run
    table, command marks, discards)."""
    if op[0] == "m":
        return "m"
    sql = str(op[1]) if op[0] == "x" else ""
    if sql.startswith("INSERT INTO events"):
        return "e"
    if sql.startswith("INSERT OR REPLACE INTO epochs"):
        return "p"
    return "x"


def describe(counts: dict[str, int]) -> str:
    """'38 step rows, 5 events and 2 other writes' (only the kinds there are)."""
    parts = [f"{counts[k]} {words}" for k, words in _KINDS if counts.get(k)]
    if not parts:
        return "nothing"
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
