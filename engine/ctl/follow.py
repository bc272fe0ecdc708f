"""`follow`: every metrics row and event of a run folder from a step on, as the engine commits
them, until the run ends.

The stream is resumable exactly: its cursor is (the last step received, the last event id
received). Rows come in step order past the step, in `rows` records of up to PAGE rows; events in id order past the id (or, on a
first follow from step N, those at step N or later). A client whose stream broke starts
again with `--from-step LAST+1 --after-event ID` and receives nothing twice and misses
nothing. Rows the client holds that a rollback or a resume superseded (run.db moves them to
discarded_metrics) are a `rewind` record, after which the rows from that step come again; a
follow that goes on after a crash and a resume is told too (the rows moved after its last event).

The end: the run ends when no process holds its writer lock (engine/store/runlock.py). The
engine releases the lock after its last commit, so the read that follows the lock's release
is complete, and the stream ends with an `end` record.

On a server, behind ssh, this runs without a terminal, and OpenSSH does not signal a command
that has none when its client goes away. So the follow notices by itself: it writes a
heartbeat every second while nothing else comes (the write fails with EPIPE once sshd has
closed the channel) and, with `watch_parent`, ends when its parent (the sshd session) is
gone. Torch-free.
"""
from __future__ import annotations

import os
import time
from collections import deque
from typing import Any, Callable, Iterator, Optional

from engine.declarations import limits
from engine.store import METRIC_COLUMNS, RunReader, StoreError, runlock, stored

from .local import open_run
from .protocol import CtlError

POLL_S = 0.25  # how often run.db is read (the engine commits about once a second)
HEARTBEAT_S = 1.0  # the longest silence: how soon a follow whose client went away finds out
PAGE = 2000  # rows read at once (and sent in one record) while catching up with a long run
COLUMNS = list(METRIC_COLUMNS)
SCALAR_COLUMNS = ("step", "epoch", "name", "value", "time")  # of a `scalars` record (run.db's scalars table)
STEP = COLUMNS.index("step")


def rows_record(rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    """Metrics rows as one record: the column names once, then each row's values in that order
    (a 100,000-step run is 50 lines, not 100,000 objects repeating 25 keys)."""
    return {"kind": "rows", "columns": COLUMNS, "rows": rows}


def follow(path: str, from_step: int = 0, after_event: Optional[int] = None, *,
           watch_parent: bool = False, idle: Optional[Callable[[], None]] = None,
           poll_s: float = POLL_S, heartbeat_s: float = HEARTBEAT_S) -> Iterator[dict[str, Any]]:
    """The records of `path` from step `from_step` (and past event `after_event`, when given)
    to the run's end. `idle` is called before each wait (the output flushes there)."""
    reader = open_run(path)
    try:
        yield from _Follow(reader, from_step, after_event).records(watch_parent, idle, poll_s, heartbeat_s)
    except StoreError as e:
        raise CtlError(limits.one_line(e)) from None
    finally:
        reader.close()


class _Follow:
    def __init__(self, reader: RunReader, from_step: int, after_event: Optional[int]) -> None:
        self.reader = reader
        self.last_step = from_step - 1
        self.last_event = after_event or 0
        self.from_step = from_step if after_event is None else None  # the first read's event filter
        self.info: Optional[dict[str, Any]] = None
        # Of run.db's discarded_metrics (rows a resume or a rollback superseded, only ever added
        # to), how many the client already knows of: a first follow has no rows, so all; a
        # resumed one, those moved before the last event it received.
        self.discards_known = self._discards_known(after_event)
        self.read_discards = True  # look at discarded_metrics in the next read
        self.scalars_after = 0  # the last rowid of run.db's scalars sent
        self.scalars_from: Optional[int] = from_step  # the first read: scalars at the cursor's step or later

    def records(self, watch_parent: bool, idle: Optional[Callable[[], None]], poll_s: float,
                heartbeat_s: float) -> Iterator[dict[str, Any]]:
        parent = os.getppid()
        quiet_since = time.monotonic()
        caught_up = False
        while True:
            if watch_parent and os.getppid() != parent:
                return  # the ssh session that started us is gone: nobody reads this stream
            info = self.reader.info()
            writer = runlock.writer(self.reader.run_dir, info)  # before the read: see the module's doc
            if writer is None:
                info = self.reader.info()  # the final status, committed before the lock went
            if info != self.info:
                self.info = info
                yield {"kind": "info", "info": info, "live": writer is not None, "writer": writer}
            sent = 0
            for record in self._new():
                sent += 1
                yield record
            if writer is not None and not caught_up:
                caught_up = True  # what the run held when the follow began has all been sent
                yield {"kind": "caught_up", "step": self._run_step()}
            if writer is None:
                yield {"kind": "end", "status": self._final_status(), "step": self._run_step(),
                       "last_event": self.last_event}
                return
            now = time.monotonic()
            if sent:
                quiet_since = now
            elif now - quiet_since >= heartbeat_s:
                quiet_since = now
                yield {"kind": "heartbeat", "time": time.time()}
            if idle is not None:
                idle()
            time.sleep(poll_s)

    def _new(self) -> Iterator[dict[str, Any]]:
        """What was committed since the last read: events first (a rollback among them moves
        the row cursor back), then the rows, each event after the rows up to its step."""
        events = self.reader.events(after_id=self.last_event)
        if events:
            self.last_event = int(events[-1]["id"])
        if self.from_step is not None:
            events = [e for e in events if _step(e) >= self.from_step]
            self.from_step = None
        back = _rolled_back_to(events, self.last_step)
        if self.read_discards or events:  # rows are discarded at a resume or a rollback, each with its event
            discarded = self._superseded_from()
            if discarded is not None and discarded <= self.last_step:
                back = discarded - 1 if back is None else min(back, discarded - 1)
        self.read_discards = False
        if back is not None:
            self.last_step = back
            yield {"kind": "rewind", "to_step": back}
        pending = deque(events)
        batch: list[tuple[Any, ...]] = []
        while True:
            rows = self.reader.metric_values(after_step=self.last_step, limit=PAGE)
            for row in rows:
                while pending and _step(pending[0]) < row[STEP]:
                    if batch:
                        yield rows_record(batch)
                        batch = []
                    yield {"kind": "event", "event": pending.popleft()}
                batch.append(row)
            if rows:
                self.last_step = int(rows[-1][STEP])
            if batch:
                yield rows_record(batch)
                batch = []
            if len(rows) < PAGE:
                break
        while pending:
            yield {"kind": "event", "event": pending.popleft()}
        yield from self._scalars()

    def _scalars(self) -> Iterator[dict[str, Any]]:
        """What a framework logged besides the loss (run.db's scalars) since the last read, in
        `scalars` records of up to PAGE rows, in the order logged."""
        rows = self.reader.scalars(after_rowid=self.scalars_after)
        if rows:
            self.scalars_after = max(self.scalars_after, *(stored.whole(r.get("rowid"), 0) for r in rows))
        if self.scalars_from is not None:
            rows = [r for r in rows if stored.whole(r.get("step"), -1) >= self.scalars_from]
            self.scalars_from = None
        for i in range(0, len(rows), PAGE):
            yield {"kind": "scalars", "columns": list(SCALAR_COLUMNS),
                   "rows": [[r.get(c) for c in SCALAR_COLUMNS] for r in rows[i:i + PAGE]]}

    def _run_step(self) -> Optional[int]:
        """The run's last step as run.db holds it: the cursor's when rows were sent, else the last
        row's (a follow --from-step past the run's end did not reach step from_step - 1)."""
        tail = self.reader.last_metrics(1)
        last = stored.whole(tail[-1].get("step"), -1) if tail else -1
        step = min(self.last_step, last) if self.last_step >= 0 else last
        return step if step >= 0 else None

    def _discards_known(self, after_event: Optional[int]) -> int:
        rows = self.reader.discarded()
        if after_event is None:
            return len(rows)
        seen = self.reader.events(after_id=max(0, after_event - 1))
        when = stored.number(seen[0].get("time"), None) if seen and seen[0].get("id") == after_event else None
        if when is None:  # the client's last event is not there: take none as known (a rewind too many is safe)
            return 0
        known = 0
        for row in rows:  # in the order they were moved
            moved = stored.number(row.get("discarded_at"), None)
            if moved is None or moved > when:
                break
            known += 1
        return known

    def _superseded_from(self) -> Optional[int]:
        """The first step among the rows discarded since the last look (None: none were): rows
        from it on that the client holds are superseded, whatever superseded them."""
        rows = self.reader.discarded()
        fresh, self.discards_known = rows[self.discards_known:], len(rows)
        steps = [stored.whole(r.get("step"), -1) for r in fresh]
        steps = [s for s in steps if s >= 0]
        return min(steps) if steps else None

    def _final_status(self) -> str:
        status = (self.info or {}).get("status") or "unknown"
        return "interrupted" if status == "running" else status  # said running; nobody writes it


def _step(event: dict[str, Any]) -> int:
    step = event.get("step")
    return step if isinstance(step, int) else 0


def _rolled_back_to(events: list[dict[str, Any]], last_read: int) -> Optional[int]:
    """The earliest step a rolled_back event among these went back to, if before the last row read."""
    tos = [e["data"].get("to_step") for e in events
           if e.get("kind") == "rolled_back" and isinstance(e.get("data"), dict)]
    tos = [t for t in tos if isinstance(t, int) and not isinstance(t, bool) and t < last_read]
    return min(tos) if tos else None
