"""What a framework logged besides the loss (run.db's `scalars`: accuracy, F1, eval_loss ...),
as the app keeps it: per name, the steps and values, read on from where the last read stopped.
Qt-free; the Scalars plot (app/ui/plots/scalars.py) and the CSV export read it."""
from __future__ import annotations

import math
import os
from typing import Any, Iterable, Mapping, Optional

import numpy as np

from engine.store import DB_NAME, RunReader, StoreError

# What the plot does not pick by itself (the other plots show it, or it is bookkeeping).
BOOKKEEPING = {"loss", "learning_rate", "lr", "grad_norm", "epoch", "step", "total_flos", "train_loss"}
BOOKKEEPING_SUFFIXES = ("_runtime", "_per_second", "_flos")
DEFAULT_PICKS = 3


def _number(v: Any) -> Optional[float]:
    try:
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return x if math.isfinite(x) else None


class Scalars:
    """The scalars of one run folder (none for a folder without the table, or no folder)."""

    def __init__(self, run_dir: Optional[str]) -> None:
        self.run_dir = run_dir
        self._reader: Optional[RunReader] = None
        self._rowid = 0
        self._data: dict[str, tuple[list[int], list[float]]] = {}
        self.version = 0  # grows when rows were added

    def poll(self) -> bool:
        """Read the rows written since the last poll. True if there were any. Never raises: a
        folder that cannot be read has none (yet)."""
        if not self.run_dir or not os.path.isfile(os.path.join(self.run_dir, DB_NAME)):
            return False
        try:
            if self._reader is None:
                self._reader = RunReader(self.run_dir)
            rows = self._reader.scalars(after_rowid=self._rowid)
        except StoreError:
            return False
        for r in rows:
            self._rowid = max(self._rowid, int(r["rowid"]))
        return self.add(rows)

    def add(self, rows: Iterable[Mapping[str, Any]]) -> bool:
        """Rows {step, name, value, ...} in the order logged: read here, or pushed by a follow of
        a run on another machine (headroom-ctl's `scalars` records). True if any was kept."""
        kept = False
        for r in rows:
            name, step, value = r.get("name"), r.get("step"), _number(r.get("value"))
            if not isinstance(name, str) or not isinstance(step, int) or isinstance(step, bool) or value is None:
                continue  # a damaged row
            steps, values = self._data.setdefault(name, ([], []))
            steps.append(step)
            values.append(value)
            kept = True
        if kept:
            self.version += 1
        return kept

    def names(self) -> list[str]:
        return sorted(self._data)

    def arrays(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one scalar, in the order logged; empty if unknown."""
        steps, values = self._data.get(name, ([], []))
        return np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)

    def default_picks(self) -> list[str]:
        """What the plot shows before the user picks: the evaluations' own metrics first
        (eval_accuracy, eval_f1, ...), then the others, leaving out bookkeeping."""
        names = [n for n in self.names() if n not in BOOKKEEPING and not n.endswith(BOOKKEEPING_SUFFIXES)]
        names.sort(key=lambda n: (n == "eval_loss", not n.startswith(("eval_", "val_")), n))
        return names[:DEFAULT_PICKS]

    def by_step(self) -> dict[int, dict[str, float]]:
        """{step: {name: the last value logged at that step}} (the CSV export's rows)."""
        out: dict[int, dict[str, float]] = {}
        for name, (steps, values) in self._data.items():
            for s, v in zip(steps, values):
                out.setdefault(s, {})[name] = v
        return out

    def close(self) -> None:
        if self._reader is not None:
            try:
                self._reader.close()
            except Exception:
                pass
            self._reader = None


class ScalarRows:
    """Scalars a follow brought (a run on another machine), in the order logged: one item of a
    source's poll, which the session hands to its model (RunModel.pushed_scalars)."""

    def __init__(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self.rows = tuple(rows)


def read_scalars(run_dir: Optional[str]) -> Scalars:
    """A run folder's scalars, read once."""
    s = Scalars(run_dir)
    s.poll()
    s.close()
    return s
