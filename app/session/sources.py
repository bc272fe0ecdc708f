"""Where a run's data comes from: the in-process engine's EventBuffer, or a run folder's run.db.

Both give the session the same thing on each timer tick: new items in order (steps, as
metrics rows with the time each was recorded, or as StepColumns pieces of a run.db read, and
notes), and both take commands (an in-process queue, or run.db's `commands` table) and a
stop (a flag the engine thread checks every micro-batch, or a Stop row). Qt-free.
"""
from __future__ import annotations

import os
import socket
import sqlite3
import time
from typing import Any, Callable, Optional, Protocol

import numpy as np

from app.core.runs import writer_of
from app.model.metrics import STEP_COLUMNS, MetricsBuffer, StepColumns
from app.model.notes import Note
from engine.declarations import checkpoint_names as ckpt_names
from engine.declarations.commands import Command, Stop
from engine.declarations.events import EventBuffer, StepMetrics
from engine.store import RunReader, StoreError, send_command

from .rundb import LAZY_ABOVE, RunDbColumns, metric_columns, read_steps


class Source(Protocol):
    live: bool  # the engine thread of this window (True) or a run folder (False)
    step_get: Callable[[Any, str], Any]  # how to read a field of a step item

    @property
    def run_dir(self) -> Optional[str]: ...

    @property
    def writer(self) -> Optional[dict[str, Any]]:  # {pid, host} of the process writing the run, if live
        ...

    def poll(self, force: bool = False) -> list[Any]: ...

    def send(self, command: Command) -> None: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...


class LiveSource:
    """The run this window started: events drained from the worker's EventBuffer."""

    live = True
    step_get: Callable[[Any, str], Any] = staticmethod(dict.get)  # steps come as rows, like run.db's

    def __init__(self, buffer: EventBuffer, send: Callable[[Command], None],
                 stop: Optional[Callable[[], None]] = None) -> None:
        self.buffer = buffer
        self._send = send
        self._stop = stop
        self.run_dir: Optional[str] = None  # known once the engine has prepared the run
        self.writer = {"pid": os.getpid(), "host": socket.gethostname()}  # this process writes it

    def poll(self, force: bool = False) -> list[Any]:
        """Steps as rows with the time the engine emitted them (run.db's rows carry the time
        they were recorded), notes with theirs: a drain of many steps at once (a busy GUI, a
        fast run) keeps each step's own time for the wall-time axis."""
        return [dict(vars(e), time=t) if isinstance(e, StepMetrics) else Note.from_event(e, t)
                for t, e in self.buffer.drain_stamped()]

    def send(self, command: Command) -> None:
        self._send(command)

    def stop(self) -> None:
        """The worker's stop flag: the trainer stops at the next micro-batch, even inside an
        epoch or before its first step (a Stop command would wait for the next step)."""
        if self._stop is not None:
            self._stop()
        else:
            self._send(Stop())

    def close(self) -> None:
        pass


class FolderSource:
    """A run folder, finished or still training in another process: polls run.db.

    Live is what engine.store.runlock says: a process holds the folder's writer lock (`writer`:
    its pid and host, from the lock file). A folder written by an engine that did not lock
    (older runs, a file system without locks) falls back to run.db's status and pid."""

    live = False
    step_get: Callable[[Any, str], Any] = staticmethod(dict.get)
    POLL_S = 0.5

    def __init__(self, run_dir: str, lazy: bool = True) -> None:
        """lazy: a large read holds only what the plots draw (False: every column, e.g. the
        history of a run this window resumes, which its own steps then continue)."""
        self.run_dir = run_dir
        self.lazy = lazy
        self.reader = RunReader(run_dir)  # raises StoreError (a ConfigError) if not a run folder
        self.info = self.reader.info()
        self.writer: Optional[dict[str, Any]] = None  # {pid, host, started} of the live writer
        self._have: Optional[set[str]] = None  # the metrics table's columns
        self._loader = RunDbColumns(run_dir)
        self._last_step = -1
        self._last_event = 0
        self._next_poll = 0.0
        self.running = self._is_running()

    def _is_running(self) -> bool:
        self.writer = writer_of(self.run_dir, self.info)
        return self.writer is not None

    def interrupted(self) -> bool:
        """run.db says running, but no process is writing it (killed, or crashed)."""
        return self.info.get("status") == "running" and not self.running

    def _read_steps(self) -> Optional[StepColumns]:
        """New steps from run.db. A large read (a long run opened) holds what the plots draw;
        the other columns are read when first asked for (lazy=True, the default)."""
        db = getattr(self.reader, "connection", None)  # a salvaged copy for a damaged file
        if db is None:  # a RunReader without one: the slow way, every column
            rows = self.reader.metrics(after_step=self._last_step)
            buf = MetricsBuffer(max(16, len(rows)))
            buf.extend_records(rows, dict.get)
            return StepColumns({c: buf.view(c) for c in STEP_COLUMNS}) if len(buf) else None
        try:
            if self._have is None:
                self._have = metric_columns(db)
            read = read_steps(db, self._last_step, self._have, problems=self.reader.problems,
                              lazy_above=LAZY_ABOVE if self.lazy else 1 << 62)
        except sqlite3.Error as e:
            raise StoreError(f"{self.reader.path}: {e}") from None
        if read is None:
            return None
        for name in read.nulls:
            self._loader.knows_null(name, self._last_step, read.last_step)
        # Every row read is in run.db: the loader can read any column left out, now or later
        # (a column a large read left out stays out while the run is followed).
        return StepColumns(read.columns, loader=self._loader, counts_tokens=read.counts_tokens)

    def poll(self, force: bool = False) -> list[Any]:
        """New steps (StepColumns pieces) and notes since the last poll, in order, at most
        every POLL_S unless forced."""
        now = time.monotonic()
        if not force and now < self._next_poll:
            return []
        self._next_poll = now + self.POLL_S
        before = self._last_step
        try:
            # Events first: a rollback among them went back past rows read before, and the rows
            # read after them are the new ones from there on (a rollback after this read shows
            # in the next poll's events).
            events = self.reader.events(after_id=self._last_event)
            back = self._rolled_back_to(events, before)
            if back is not None:
                self._last_step = back
            steps = self._read_steps()
            if events or steps is not None:
                self.info = self.reader.info()
        except StoreError:
            self._last_step = before
            return []
        self.running = self._is_running()
        step_col = steps.steps() if steps is not None else np.empty(0, dtype=np.int64)
        if len(step_col):
            self._last_step = int(step_col[-1])
        if events:
            self._last_event = int(events[-1]["id"])
        notes = [Note.from_row(e) for e in events]
        # Merge by step: a note at step s comes after the steps up to s.
        out: list[Any] = []
        i = 0
        for note in notes:
            j = int(np.searchsorted(step_col, note.step, side="right"))
            if j > i and steps is not None:
                out.append(steps.piece(i, j))
                i = j
            out.append(note)
        if steps is not None and i < len(step_col):
            out.append(steps.piece(i, len(step_col)))
        return out

    @staticmethod
    def _rolled_back_to(events: list[dict[str, Any]], last_read: int) -> Optional[int]:
        """The earliest step a rolled_back event among these went back to, if before the last row read."""
        tos = [e["data"].get("to_step") for e in events
               if e.get("kind") == "rolled_back" and isinstance(e.get("data"), dict)]
        tos = [t for t in tos if isinstance(t, int) and not isinstance(t, bool) and t < last_read]
        return min(tos) if tos else None

    def problems(self) -> list[Note]:
        """What this folder lacks or could not be read, as alert rows (shown once, on opening)."""
        notes = [Note("run_damaged", 0, 0, p) for p in self.reader.problems]
        has_last = any(ckpt_names.name_of(p) == "last" for p in ckpt_names.candidates(self.run_dir))
        if not has_last and not self.running:  # a file, or a sharded run's folder
            try:
                info = self.reader.info()
            except StoreError:
                info = {}
            integration = info.get("integration")
            if isinstance(integration, str) and integration:  # a framework's or a plain loop's run
                notes.append(Note("framework_checkpoints", max(self._last_step, 0), 0,
                                  framework_checkpoints(integration, info, self.reader)))
            else:
                notes.append(Note("run_damaged", self._last_step if self._last_step > 0 else 0, 0,
                                  "no checkpoint (checkpoints/last is missing): the plots are all there is; "
                                  "this run cannot be resumed"))
        return notes

    def send(self, command: Command) -> None:
        """A row in run.db's commands table. Raises StoreError (a ConfigError): a folder that is
        read-only (a shared mount), deleted, or whose run.db is damaged."""
        _send(self.run_dir, command)

    def stop(self) -> None:
        _send(self.run_dir, Stop())

    def close(self) -> None:
        try:
            self.reader.close()
        except Exception:
            pass


def framework_checkpoints(integration: str, info: dict[str, Any], reader: RunReader) -> str:
    """Where a run written through engine.integrations keeps its checkpoints: the framework
    writes them (Headroom's Resume and Fork are for engine runs)."""
    who = {"transformers": "The Hugging Face Trainer", "lightning": "Lightning", "loop": "Your training loop"}.get(
        integration, integration)
    how = {"transformers": "resume_from_checkpoint", "lightning": "ckpt_path"}.get(integration)
    where = info.get("checkpoint_dir")
    try:
        saved = [e["data"].get("path") for e in reader.events(kinds=["checkpoint"])]
    except StoreError:
        saved = []
    saved = [p for p in saved if isinstance(p, str) and p]
    if saved:
        said = f"the last in {saved[-1]}"
    elif isinstance(where, str) and where:
        said = f"in {where}"
    else:
        said = "where it saves them"
    resume = f"; resume it the framework's way ({how})" if how else "; resume it from there"
    return f"{who} keeps this run's checkpoints, not Headroom: {said}{resume}"


def _send(run_dir: str, command: Command) -> None:
    try:
        send_command(run_dir, command)
    except sqlite3.Error as e:  # send_command wraps SQLite's errors; what it might miss is the same thing
        raise StoreError(f"could not queue {command.kind} in {run_dir}: {e}") from None
    except OSError as e:
        raise StoreError(f"could not queue {command.kind} in {run_dir}: {e.strerror or e}") from None


def read_metrics(run_dir: str) -> MetricsBuffer:
    """Every step a run folder holds, as a metrics buffer (an overlay of another run). Raises
    StoreError."""
    src = FolderSource(run_dir)  # lazy: an overlay draws the loss; an export of it reads the rest
    try:
        steps = src._read_steps()
    finally:
        src.close()
    buf = MetricsBuffer(16 if steps is None else len(steps))
    if steps is not None:
        buf.extend_columns(steps)
    return buf
