"""Steps a run trained and then threw away: a rollback went back past them, or a resume
superseded them. They stay on screen, greyed (never hidden silently).

Two ways in: a run folder's `discarded_metrics` rows (engine.store.RunReader.discarded(),
read when the folder is opened), and, for a run followed live, the rows the metrics buffer
held past the step the run went back to (the model moves them here before the new branch
replaces them). Kept as segments: one per stretch that was thrown away together, each
with its own steps (two segments may cover the same steps). Qt-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from .stored import measured

# What is kept of a discarded step: enough to draw it where the kept steps are drawn.
KEPT = ("step", "loss", "grad_norm", "lr", "samples", "tokens")


@dataclass
class Segment:
    columns: dict[str, np.ndarray]  # KEPT -> float64 arrays of equal length
    reason: str

    def __len__(self) -> int:
        return len(self.columns["step"])

    @property
    def first_step(self) -> int:
        return int(self.columns["step"][0])

    @property
    def last_step(self) -> int:
        return int(self.columns["step"][-1])


class DiscardedSteps:
    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self.version = 0  # bumps on every change; views compare it

    def __len__(self) -> int:
        return sum(len(s) for s in self.segments)

    def clear(self) -> None:
        if self.segments:
            self.segments = []
            self.version += 1

    def add_columns(self, columns: dict[str, np.ndarray], reason: str = "") -> None:
        """One stretch thrown away together (arrays of equal length, missing ones NaN)."""
        steps = np.asarray(columns.get("step", ()), dtype=np.float64)
        n = len(steps)
        if n == 0:
            return
        cols = {k: (np.asarray(columns[k], dtype=np.float64).copy() if k in columns and columns[k] is not None
                    else np.full(n, math.nan)) for k in KEPT}
        self.segments.append(Segment(cols, reason))
        self.version += 1

    def add_rows(self, rows: Sequence[dict[str, Any]]) -> None:
        """run.db's discarded_metrics rows, in the order they were moved: a new segment where the
        reason changes or the steps go back."""
        group: list[dict[str, Any]] = []
        last: Optional[float] = None
        for r in rows:
            step = measured(r.get("step"))
            if not math.isfinite(step):
                continue
            if group and (str(r.get("reason") or "") != str(group[0].get("reason") or "")
                          or (last is not None and step <= last)):
                self._add_group(group)
                group = []
            group.append(r)
            last = step
        if group:
            self._add_group(group)

    def _add_group(self, rows: Iterable[dict[str, Any]]) -> None:
        rows = list(rows)
        self.add_columns({k: np.array([measured(r.get(k)) for r in rows]) for k in KEPT},
                         str(rows[0].get("reason") or ""))

    def steps(self) -> np.ndarray:
        """Every discarded step, in segment order."""
        if not self.segments:
            return np.empty(0)
        return np.concatenate([s.columns["step"] for s in self.segments])

    def joined(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of every segment end to end, a NaN between two segments so a curve
        drawn with connect='finite' breaks there."""
        if not self.segments:
            return np.empty(0), np.empty(0)
        xs, ys = [], []
        for s in self.segments:
            xs += [s.columns["step"], np.array([math.nan])]
            ys += [s.columns[name], np.array([math.nan])]
        return np.concatenate(xs[:-1]), np.concatenate(ys[:-1])
