"""How long a run has trained, and since when, across the segments a continued run is made of.

A run continued with --resume is one run in one folder, trained in segments: each engine that
takes the folder writes a `run_started` event when it starts and `run_finished` or `run_failed`
when it ends (the run table's `started` and `finished` keys hold the last segment's only, so
Run history showed a continued run's last segment, and the status bar's elapsed time started
again at 0). A segment whose process died says no end: it ended at the last row it wrote,
which its caller reads (the row times the app holds, or run.db's) and gives as the mark's
`last_row_before`. The time between two segments is not training time, so a run's
`seconds` is the sum of its segments, and its start is the first one's.

Times are input from disk: each is read with app/model/stored.py's `number`, and a mark
without one is left out. Qt-free.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from .stored import number

STARTED = "run_started"
ENDED = ("run_finished", "run_failed")
MARK_KINDS = (STARTED,) + ENDED


@dataclass(frozen=True)
class Mark:
    """A run_started, run_finished or run_failed event's kind and time; for a run_started, the
    time of the last row written before it (where a segment that said no end ended)."""
    kind: str
    time: object
    last_row_before: object = None


@dataclass(frozen=True)
class Segment:
    started: float
    ended: Optional[float]  # None: no end said (still going, or its process died after its last row)


@dataclass(frozen=True)
class RunTime:
    segments: tuple[Segment, ...] = ()

    @property
    def first_started(self) -> Optional[float]:
        return self.segments[0].started if self.segments else None

    @property
    def last_started(self) -> Optional[float]:
        return self.segments[-1].started if self.segments else None

    @property
    def continued(self) -> bool:
        return len(self.segments) > 1

    @property
    def open(self) -> bool:
        """The last segment said no end (it is going, or its process died)."""
        return bool(self.segments) and self.segments[-1].ended is None

    def seconds(self, until: Optional[float] = None) -> Optional[float]:
        """Seconds trained, every segment together; an open last segment counts up to `until`
        (now, for a run going; its last row's time for one whose process died), and is left out
        without it. None when no segment can be counted (none started, or the one there is open
        with no `until`)."""
        spans = [max(0.0, end - s.started) for s in self.segments
                 for end in (s.ended if s.ended is not None else until,) if end is not None]
        return sum(spans) if spans else None


def run_time(marks: Iterable[Mark]) -> RunTime:
    """The segments of a run from its marks, in the order they were written."""
    segments: list[Segment] = []
    start: Optional[float] = None  # the open segment's start
    for m in marks:
        t = number(m.time, None)
        if t is None:
            continue
        if m.kind == STARTED:
            if start is not None:  # the segment before said no end: it ended at its last row
                last = number(m.last_row_before, None)
                segments.append(Segment(start, min(t, max(start, last)) if last is not None else start))
            start = t
        elif m.kind in ENDED and start is not None:
            segments.append(Segment(start, max(start, t)))
            start = None
    if start is not None:
        segments.append(Segment(start, None))
    return RunTime(tuple(segments))


def single(started: object, finished: object) -> RunTime:
    """A run known only by its run table's `started` and `finished` (a listing from another
    machine): one segment; a `finished` from before `started` is an earlier segment's, not its end."""
    s, f = number(started, None), number(finished, None)
    if s is None:
        return RunTime()
    return RunTime((Segment(s, f if f is not None and f >= s else None),))
