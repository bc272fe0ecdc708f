"""The run table's columns, declared once: a key (kept in preferences), a title, a tip, the text of
a run's cell and the value it sorts by (numbers as numbers, an empty cell last), and whether
it shows before the user chooses. A run's row is its summary (engine/store/summary.py, the same
as `headroom-ctl runs`), plus what the panel works out: what a fork changed, how long it trained."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QTreeWidgetItem

from app.core.runs import RunSummary
from app.model.epoch_progress import fmt_duration
from app.model.run_time import Mark, RunTime, run_time, single
from app.model.stored import number
from engine.store.labels import fmt_bytes

PATH_ROLE = Qt.ItemDataRole.UserRole
SORT_ROLE = Qt.ItemDataRole.UserRole + 1


@dataclass(frozen=True)
class RunRow:
    """What a row shows: the summary, and what the panel worked out for it."""
    run: RunSummary
    change: str  # what a fork changed ("" : not a fork)
    status: str  # how it ended, as the status bar says it
    seconds: Optional[float]  # time trained, every segment together
    first_started: Optional[float]


def fmt_when(t: Optional[float], pattern: str = "%m-%d %H:%M") -> str:
    try:
        return time.strftime(pattern, time.localtime(t)) if t is not None else ""
    except (OverflowError, ValueError, OSError):  # a time no calendar holds (a damaged run.db)
        return ""


def fmt_loss(v: Optional[float]) -> str:
    return "" if v is None else f"{v:.4g}"


def _count(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else ""


def _lr(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else ""


def _sortable(v: Any) -> Any:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    tip: str
    text: Callable[[RunRow], str]
    sort: Callable[[RunRow], Any]  # a number or a str; None sorts last
    shown: bool = True  # before the user chooses


def _setting(name: str) -> Callable[[RunRow], Any]:
    return lambda r: _sortable(r.run.settings.get(name))


COLUMNS: tuple[Column, ...] = (
    Column("compare", "Compare", "Tick to overlay the run's loss on the plots", lambda r: "", lambda r: None),
    Column("run", "Run", "The run folder's name", lambda r: r.run.name, lambda r: r.run.name.lower()),
    Column("change", "Fork: what changed", "What a fork changed from the checkpoint it came from",
           lambda r: r.change, lambda r: r.change),
    Column("task", "Task", "The task it trained", lambda r: r.run.task, lambda r: r.run.task.lower()),
    Column("status", "Status", "How it ended, or that it trains", lambda r: r.status, lambda r: r.status),
    Column("tags", "Tags", "Its tags (right-click: Edit tags...)", lambda r: ", ".join(r.run.labels.tags),
           lambda r: ", ".join(r.run.labels.tags).lower() or None),
    Column("lr", "lr", "Learning rate (the schedule's peak) at its end, or now",
           lambda r: _lr(r.run.settings.get("lr")), _setting("lr")),
    Column("accum", "Accum", "Accumulation steps at its end, or now",
           lambda r: _count(r.run.settings.get("accum")), _setting("accum")),
    Column("micro_batch", "Micro-batch", "Micro-batch at its end, or now",
           lambda r: _count(r.run.settings.get("micro_batch")), _setting("micro_batch"), shown=False),
    Column("effective_batch", "Eff. batch", "Samples per optimizer step: micro-batch x accumulation x processes",
           lambda r: _count(r.run.effective_batch), lambda r: r.run.effective_batch),
    Column("schedule", "Schedule", "The lr schedule", lambda r: r.run.schedule, lambda r: r.run.schedule or None,
           shown=False),
    Column("best_val", "Best val", "The lowest validation loss of its epochs",
           lambda r: fmt_loss(r.run.best_val), lambda r: r.run.best_val),
    Column("final_val", "Final val", "The validation loss of its last epoch",
           lambda r: fmt_loss(r.run.final_val), lambda r: r.run.final_val, shown=False),
    Column("final_loss", "Final loss", "The training loss of its last step",
           lambda r: fmt_loss(r.run.final_loss), lambda r: r.run.final_loss),
    Column("steps", "Steps", "Optimizer steps", lambda r: _count(r.run.steps), lambda r: r.run.steps),
    Column("duration", "Duration", "Time trained, every segment of a continued run together",
           lambda r: fmt_duration(r.seconds) if r.seconds is not None else "", lambda r: _sortable(r.seconds)),
    Column("size", "Size", "Its folder on disk: run.db and checkpoints", lambda r: fmt_bytes(r.run.size),
           lambda r: r.run.size),
    Column("started", "Started", "When it first started", lambda r: fmt_when(r.first_started),
           lambda r: _sortable(r.first_started)),
    Column("note", "Note", "Its note's first line (right-click: Edit note...)",
           lambda r: (r.run.labels.note.splitlines() or [""])[0], lambda r: r.run.labels.note.lower() or None,
           shown=False),
)
INDEX = {c.key: i for i, c in enumerate(COLUMNS)}


def summary_time(r: RunSummary) -> RunTime:
    """A listed run's segments: from its run.db's events, or (a run on another machine listed
    by an older headroom-ctl) its run table's started and finished."""
    return run_time(Mark(*m) for m in r.marks) if r.marks else single(r.started, r.finished)


def trained_seconds(r: RunSummary, rt: RunTime, now: Optional[float] = None) -> Optional[float]:
    """Every segment together: a run going counts to now, one whose process died to its last row."""
    until = (now or time.time()) if r.status == "running" else number(r.last_row, None)
    return rt.seconds(until)


class RunItem(QTreeWidgetItem):
    """A row that sorts by its columns' values (numbers as numbers), empty cells last."""

    def __lt__(self, other: QTreeWidgetItem) -> bool:
        tree = self.treeWidget()
        col = tree.sortColumn() if tree is not None else 0
        a, b = self.data(col, SORT_ROLE), other.data(col, SORT_ROLE)
        if a is None or b is None:  # empty last, whichever way the column sorts
            descending = tree is not None and tree.header().sortIndicatorOrder() == Qt.SortOrder.DescendingOrder
            return (a is None) == descending and a is not b
        try:
            return bool(a < b)
        except TypeError:
            return str(a) < str(b)


def fill(item: QTreeWidgetItem, row: RunRow) -> None:
    """Set every cell's text and sort value (the Compare box is the panel's)."""
    for i, c in enumerate(COLUMNS):
        if i == 0:
            continue
        text = c.text(row)
        if item.text(i) != text:
            item.setText(i, text)
        item.setData(i, SORT_ROLE, c.sort(row))
    item.setData(INDEX["run"], PATH_ROLE, row.run.path)
