"""The checkpoints of a run that its forks continue from, so retention never removes them.

A fork records its parent in its run table: key `parent` = {run_dir, checkpoint, step,
changed} (run_tree.fork_origin), written with its `config` when it starts. Forks are looked
for where runs live together: the run folders beside this one (the same parent folder, the
runs root). Only the `parent` and `config` rows of each run.db are read, read-only; a folder
that is not a run, or whose run.db cannot be read (locked, damaged, another program's), names
nothing. A fork kept somewhere else is not seen: fork into the runs root, or keep all epoch
checkpoints (--keep-epoch-checkpoints all).

Looked up at every checkpoint that prunes, so `ForkFinder` reads a run.db once it is final
(its `config` row is there: the parent row, if any, came in the same write and never
changes); a folder made or replaced since is read again. Torch-free: file names and SQLite.
"""
from __future__ import annotations

import json
import os
import sqlite3
from typing import Any, Optional
from urllib.parse import quote

from engine.store import DB_NAME

# What a run.db says of its parent: (final, the parent record or None).
Read = tuple[bool, Optional[dict[str, Any]]]


def read_parent(db_path: str) -> Read:
    """(whether the run table is written, its `parent` record) of the run whose run.db is
    `db_path`; (False, None) if it cannot be read."""
    try:
        # mode=ro: never create or change another run's file (a live one may be writing it)
        db = sqlite3.connect(f"file:{quote(os.fsencode(db_path))}?mode=ro", uri=True, timeout=0.2)
    except (sqlite3.Error, OSError):
        return False, None
    try:
        rows = dict(db.execute("SELECT key, value FROM run WHERE key IN ('parent', 'config')").fetchall())
        parent = json.loads(rows["parent"]) if "parent" in rows else None
    except (sqlite3.Error, TypeError, ValueError, RecursionError):
        return False, None
    finally:
        db.close()
    return "config" in rows, parent if isinstance(parent, dict) else None


def _same_folder(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # the recorded folder is gone, or its name no longer resolves
        return os.path.realpath(a) == os.path.realpath(b)


class ForkFinder:
    """The checkpoint names (epoch-N, step-S, last) of `run_dir` that a run folder beside it
    forked from (`named()`)."""

    def __init__(self, run_dir: str) -> None:
        self.here = os.path.abspath(run_dir)
        self._final: dict[tuple[str, int], Optional[str]] = {}  # (run.db, its inode) -> the name it forked from

    def named(self) -> set[str]:
        try:
            entries = list(os.scandir(os.path.dirname(self.here)))
        except OSError:
            return set()
        names: set[str] = set()
        for entry in entries:
            db_path = os.path.join(entry.path, DB_NAME)
            try:
                key = (db_path, os.stat(db_path).st_ino)
            except OSError:  # not a run folder
                continue
            if entry.path == self.here:
                continue
            if key in self._final:
                which = self._final[key]
            else:
                final, parent = read_parent(db_path)
                which = self._ours(parent)
                if final:
                    self._final[key] = which
            if which is not None:
                names.add(which)
        return names

    def _ours(self, parent: Optional[dict[str, Any]]) -> Optional[str]:
        """The checkpoint a parent record names, if it names this run."""
        which, folder = (parent or {}).get("checkpoint"), (parent or {}).get("run_dir")
        if isinstance(which, str) and isinstance(folder, str) and _same_folder(folder, self.here):
            return which
        return None


def named_by_forks(run_dir: str) -> set[str]:
    """The checkpoint names of `run_dir` that a run folder beside it forked from (read afresh)."""
    return ForkFinder(run_dir).named()
