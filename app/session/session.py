"""The run session: one run the window shows, where its data comes from, where it stands,
and the commands sent to it. Qt-free, so its state machine is tested without a window.

    begin() ──> STARTING ──run_started / a step──> TRAINING ──pause()──> PAUSING ──paused──> PAUSED
                   │                                  │  <──────────────resumed──────────────┘
                   └──────── stop() ──> STOPPING <────┘
    run_finished ──> FINISHED        run_failed ──> FAILED
    the engine thread ends first, or the form was refused ──> IDLE
    a run folder whose process is gone without finishing ──> INTERRUPTED

Each method returns an Update saying what changed; the Qt adapter (signals.py) turns it
into typed signals for the views.
"""
from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from app.model.metrics import StepColumns
from app.model.notes import Note
from app.model.pending import PendingChanges
from app.model.runmodel import Delta, RunModel
from app.model.scalars import ScalarRows, Scalars
from app.model.state import RunState
from engine.declarations.commands import SETTING_COMMANDS, Command, Pause, Stop, Unpause, command_for
from engine.declarations.config import ConfigError
from engine.declarations.events import Event, StepMetrics
from engine.declarations.settings import LIVE_NAMES

from .rules import Allowed, allowed
from .sources import FolderSource, Source

# A command's outcome; held back a frame when its receipt came in the same batch (see receipt_cut).
OUTCOME_KINDS = ("settings_applied", "command_refused")
# What sending a command to a run folder raises when it cannot (StoreError is a ConfigError).
SEND_ERRORS = (ConfigError, OSError, sqlite3.Error)


def _reason(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:500]


@dataclass(frozen=True)
class SentCommand:
    command: Command
    step: int  # the last step the window had seen when it was sent
    time: float


@dataclass
class Update:
    """What a call on the session changed."""
    delta: Delta = field(default_factory=Delta)
    state: bool = False  # the run state changed
    pending: list[str] = field(default_factory=list)  # live fields whose pending change moved on
    engine_values: dict[str, Any] = field(default_factory=dict)  # what the engine has (the form follows)
    reset: bool = False  # a new, empty run model: views start over
    error: str = ""  # a command could not reach the run: why (nothing was sent, the state is as it was)

    def __bool__(self) -> bool:
        return bool(self.delta or self.state or self.pending or self.engine_values or self.reset or self.error)

    def absorb(self, later: "Update") -> None:
        self.delta.absorb(later.delta)
        self.state |= later.state
        self.pending += [n for n in later.pending if n not in self.pending]
        self.engine_values.update(later.engine_values)
        self.reset |= later.reset
        self.error = self.error or later.error


def live_label(writer: dict[str, Any]) -> str:
    """'live: pid N on HOST' from a writer lock's note (either part may be missing)."""
    pid, host = writer.get("pid"), writer.get("host")
    who = f"pid {pid}" if pid is not None else "another process"
    return f"live: {who} on {host}" if host else f"live: {who}"


def receipt_cut(items: Sequence[Any]) -> int:
    """Where to cut a batch so that a command's receipt and its outcome are not shown in the
    same frame. The engine can take a command in and apply it at once (while paused it does
    both in one go); the receipt says when the change applies, and that deserves one frame on
    screen before "applied" replaces it. Items from the cut on wait for the next poll."""
    received = False
    for i, item in enumerate(items):
        kind = item.kind if isinstance(item, (Note, Event)) else None
        if kind == "command_received":
            received = True
        elif received and kind in OUTCOME_KINDS:
            return i
    return len(items)


class RunSession:
    def __init__(self) -> None:
        self.model = RunModel()
        self.pending = PendingChanges()
        self.source: Optional[Source] = None
        self.state = RunState.IDLE
        self.sent: list[SentCommand] = []  # this run's commands, in the order sent
        self.engine_alive = False  # this window's engine thread runs (it outlives run_finished a moment)
        self._backlog: list[Any] = []
        self._seen_epoch = 0  # the epoch of the last steps seen; 0 until the run's first steps
        self._was_lost = False  # connection_lost at the last poll
        self._peak_lr: Optional[float] = None  # the lr setting, from lr_planned (a schedule's peak)
        self._on_note: dict[str, Callable[[Note, Update], None]] = {
            "run_started": self._run_started, "paused": self._paused, "unpaused": self._unpaused,
            "resumed": self._unpaused,  # what older versions called unpaused
            "run_finished": lambda n, u: self._set(RunState.FINISHED, u),
            "run_failed": lambda n, u: self._set(RunState.FAILED, u),
            "command_received": self._command_received, "settings_applied": self._settings_applied,
            "command_refused": self._command_refused, "oom_recovered": self._oom_recovered,
            "micro_batch_found": self._micro_batch_found, "lr_planned": self._lr_planned,
        }

    # -- reading -------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """No other run may start: one is going, or this window's engine thread is ending."""
        return self.state.is_live or self.engine_alive

    @property
    def remote(self) -> bool:
        """Following a run another process trains: commands go through its run.db."""
        return isinstance(self.source, FolderSource) and self.source.running

    @property
    def viewing(self) -> bool:
        """Showing a run folder's data with no run going."""
        return not self.state.is_live and isinstance(self.source, FolderSource) and len(self.model.metrics) > 0

    @property
    def writer(self) -> Optional[dict[str, Any]]:
        """{pid, host, ...} of the process writing the run shown: this one for a run of this
        window, the holder of the folder's writer lock for a run folder; None if none."""
        w = getattr(self.source, "writer", None) if self.source is not None else None
        return w if isinstance(w, dict) else None

    def live_text(self) -> str:
        """'live: pid N on HOST' while the run shown is going, '' otherwise."""
        w = self.writer
        text = live_label(w) if w is not None and self.state.is_live else ""
        if text and self.connection_lost:  # a run on another machine
            text += " (connection lost: reconnecting...)"
        return text

    @property
    def connection_lost(self) -> bool:
        """A run on another machine is going and the follow has lost it (reconnecting): what the
        window shows may be behind the run."""
        return self.state.is_live and getattr(self.source, "connection", "") == "reconnecting"

    def connection_text(self) -> str:
        """'connection lost: reconnecting, last row at step N' while connection_lost, else ''."""
        if not self.connection_lost:
            return ""
        return f"connection lost: reconnecting, last row at step {self.model.step:,}" if self.model.step else \
            "connection lost: reconnecting"

    def view_state(self) -> str:
        """The run state as the controls show it: a live state ('reconnecting' while the
        connection to a run on another machine is lost), 'viewing' or 'idle'."""
        if self.connection_lost:
            return "reconnecting"
        if self.state.is_live:
            return self.state.value
        return "viewing" if self.viewing else "idle"

    def allowed(self, edits_ready: bool, gpus: int, min_gpus: int, checkpoint: bool = False) -> Allowed:
        return allowed(self.state, self.busy, edits_ready, gpus, min_gpus, checkpoint)

    # -- beginning -----------------------------------------------------------------------
    def reset(self) -> Update:
        """Forget the last run: a new model, no source, nothing pending."""
        if self.source is not None:
            self.source.close()
        self.source = None
        self.model = RunModel()
        self.model.state = self.state
        u = Update(reset=True, pending=self.pending.clear())
        self.sent = []
        self._backlog = []
        self._seen_epoch = 0
        self._peak_lr = None
        self.engine_alive = False
        self._set(RunState.IDLE, u)
        return u

    def begin(self, source: Optional[Source], engine: bool = False, history: Sequence[Any] = (),
              history_get: Callable[[Any, str], Any] = dict.get) -> Update:
        """A run this window starts: in its own engine thread (engine=True), or under torchrun
        (source None until its run.db exists). `history`: what a resumed run's run.db holds so
        far, shown before the engine starts (data only: its state and settings are the old run's)."""
        u = self.reset()
        if history:
            u.delta.absorb(self.model.ingest(history, history_get))
        self.source = source
        self.engine_alive = engine
        self._set(RunState.STARTING, u)
        return u

    def open(self, source: FolderSource) -> Update:
        """Show a run folder, finished or training in another process."""
        u = self.reset()
        self.source = source
        u.absorb(self._ingest(source.poll(force=True) + source.problems(), source.step_get))
        if not self.model.info:
            self.model.info = dict(source.info)
        u.delta.absorb(self.model.add_discarded(self._discarded(source)))
        if source.running and not self.state.is_live:
            self._set(RunState.TRAINING, u)  # a run that has not said run_started yet
        self._settle_folder(u)
        return u

    @staticmethod
    def _discarded(source: FolderSource) -> list[dict[str, Any]]:
        """The folder's discarded_metrics rows (steps a rollback or a resume threw away)."""
        reader = getattr(source, "reader", None)
        try:
            return list(reader.discarded()) if reader is not None else []
        except SEND_ERRORS:  # StoreError: a damaged run.db shows what it can
            return []

    # -- following -----------------------------------------------------------------------
    def poll(self, force: bool = False, flush: bool = False) -> Update:
        """New items from the source into the model and the state machine. `flush`: take the
        whole backlog at once (the run is over: there is no next frame to wait for)."""
        src = self.source
        if src is None:
            return Update()
        items = self._backlog + src.poll(force)
        self._backlog = []
        if not flush:
            cut = receipt_cut(items)
            items, self._backlog = items[:cut], items[cut:]
        u = self._ingest(items, src.step_get)
        if isinstance(src, FolderSource) and any(n.kind == "rolled_back" for n in u.delta.notes):
            self.model.discarded.clear()  # what the other process threw away is in its run.db: show that
            u.delta.absorb(self.model.add_discarded(self._discarded(src)))
        self._settle_folder(u)
        if self.connection_lost != self._was_lost:  # the views show the connection as a state
            self._was_lost = self.connection_lost
            u.state = True
        return u

    def _settle_folder(self, u: Update) -> None:
        """A run folder whose process is gone while the session thinks the run is going: read
        what it wrote last, then trust run.db's status (killed or crashed: interrupted)."""
        src = self.source
        if not isinstance(src, FolderSource) or src.running or self._backlog:
            return
        if self.state.is_live:
            u.absorb(self._ingest(src.poll(force=True), src.step_get))
        if self.state.is_live or (self.state is RunState.IDLE and len(self.model.metrics)):
            status = src.info.get("status")
            self._set(RunState.INTERRUPTED if src.interrupted() else
                      RunState.FAILED if status == "failed" else RunState.FINISHED, u)

    def _ingest(self, items: Sequence[Any], get: Callable[[Any, str], Any]) -> Update:
        """Items in order: each note moves the state machine as it comes, between the steps
        around it (a pause note after the steps of its epoch, say)."""
        u = Update()
        bulk = sum(len(i) for i in items if isinstance(i, StepColumns))
        if bulk:  # a run folder's read, in pieces between its notes: room for all of it once
            self.model.metrics.reserve(bulk)
        run: list[Any] = []
        for item in items:
            if isinstance(item, (StepMetrics, dict, StepColumns)):
                run.append(item)
                continue
            if isinstance(item, ScalarRows):  # a follow's scalars: the model keeps them for the Scalars plot
                if self.model.pushed_scalars is None:
                    self.model.pushed_scalars = Scalars(None)
                self.model.pushed_scalars.add(item.rows)
                continue
            if run:
                self._steps(run, get, u)
                run = []
            note = item if isinstance(item, Note) else Note.from_event(item)
            u.delta.absorb(self.model.ingest([note]))
            handler = self._on_note.get(note.kind)
            if handler is not None:
                handler(note, u)
        if run:
            self._steps(run, get, u)
        return u

    def _steps(self, records: list[Any], get: Callable[[Any, str], Any], u: Update) -> None:
        d = self.model.ingest(records, get)
        u.delta.absorb(d)
        if not d.steps:
            return
        # What the run trains with now is what its last row says it trained with: every row
        # records the per-step settings (a resumed run restores them from its checkpoint, which
        # run_started's config does not show; another client's change shows here too). Only
        # news reaches the form (set_engine), so a value is not put back on every frame.
        values = self.model.step_values(len(self.model.metrics) - 1)
        if self._peak_lr is not None:  # a schedule's rows carry the lr it gave, not the setting (its peak)
            values.pop("lr", None)
        u.engine_values.update(self.pending.set_engine(values))
        if self.state in (RunState.IDLE, RunState.STARTING, RunState.PAUSED):
            self._set(RunState.TRAINING, u)
        if self.model.epoch != self._seen_epoch:
            self._seen_epoch = self.model.epoch
            u.pending += self.pending.epoch_reached(self.model.epoch)

    # -- the engine's notes --------------------------------------------------------------
    def _run_started(self, note: Note, u: Update) -> None:
        cfg = note.data.get("config")
        cfg = cfg if isinstance(cfg, dict) else {}
        u.engine_values.update(self.pending.set_engine({n: cfg.get(n) for n in LIVE_NAMES}))
        if self.state not in (RunState.PAUSING, RunState.STOPPING):
            self._set(RunState.TRAINING, u)

    def _paused(self, note: Note, u: Update) -> None:
        if self.state is not RunState.STOPPING:
            self._set(RunState.PAUSED, u)

    def _unpaused(self, note: Note, u: Update) -> None:
        if self.state is not RunState.STOPPING:
            self._set(RunState.TRAINING, u)

    def _command_received(self, note: Note, u: Update) -> None:
        d = note.data
        u.pending += self.pending.received(str(d.get("command")), dict(d.get("payload") or {}),
                                           str(d.get("applies")), d.get("target_epoch"),
                                           paused=self.state is RunState.PAUSED)

    def _settings_applied(self, note: Note, u: Update) -> None:
        d = note.data
        u.pending += self.pending.applied(d.get("changes") or (), note.step, note.epoch, d.get("by_rule") or ())

    def _command_refused(self, note: Note, u: Update) -> None:
        u.pending += self.pending.refused(str(note.data.get("command")), str(note.data.get("reason")))

    def _oom_recovered(self, note: Note, u: Update) -> None:
        d = note.data
        u.engine_values.update(self.pending.set_engine({"micro_batch": d.get("new_micro_batch"),
                                                        "accum": d.get("new_accum")}))

    def _lr_planned(self, note: Note, u: Update) -> None:
        """The lr setting is the schedule's peak (engine/declarations/schedule.py): the form shows that."""
        peak = note.data.get("peak")
        if isinstance(peak, (int, float)) and not isinstance(peak, bool):
            self._peak_lr = float(peak)
            u.engine_values.update(self.pending.set_engine({"lr": self._peak_lr}))

    def _micro_batch_found(self, note: Note, u: Update) -> None:
        d = note.data
        u.engine_values.update(self.pending.set_engine({"micro_batch": d.get("micro_batch"),
                                                        "accum": d.get("accum")}))

    # -- commands ------------------------------------------------------------------------
    # A command that cannot reach the run (its folder read-only, deleted, run.db damaged)
    # changes nothing here: Update.error says why, and the state stays what it was.
    def pause(self) -> Update:
        u = Update()
        if self.source is not None and self.state in (RunState.STARTING, RunState.TRAINING):
            u.error = self._try_send(Pause())
            if not u.error:
                self._set(RunState.PAUSING, u)
        return u

    def resume(self) -> Update:
        """Unpause; a run already paused stays PAUSED until the engine says it is unpaused."""
        u = Update()
        if self.source is not None and self.state in (RunState.PAUSING, RunState.PAUSED):
            u.error = self._try_send(Unpause())
            if not u.error and self.state is RunState.PAUSING:
                self._set(RunState.TRAINING, u)
        return u

    def stop(self) -> Update:
        """Stop at the next micro-batch (this window's engine) or step (run.db). With no source
        yet (a torchrun launch still starting) the state says so and the caller acts."""
        u = Update()
        if not self.state.is_live or self.state is RunState.STOPPING:
            return u
        if self.source is not None:
            try:
                self.source.stop()
            except SEND_ERRORS as e:
                u.error = _reason(e)
                return u
            self.sent.append(SentCommand(Stop(), self.model.step, time.time()))
        self._set(RunState.STOPPING, u)
        return u

    def apply(self, edits: dict[str, Any], at: str = "epoch") -> tuple[Update, str]:
        """Send the edited live settings, in the fixed field order, to apply at the next "epoch"
        or "step" boundary. Returns the update and, if the run could not be reached, why (the
        rest is not sent)."""
        u = Update()
        if self.source is None or not self.state.is_live or self.state is RunState.STOPPING:
            return u, ""
        for name in LIVE_NAMES:
            if name not in edits:
                continue
            try:
                cmd = command_for(name, edits[name], at)
            except ConfigError as e:  # the form let through a value the command refuses
                u.pending += self.pending.refused(SETTING_COMMANDS[name].kind, str(e))
                continue
            err = self._try_send(cmd)
            if err:
                u.error = err
                return u, err
            u.pending += self.pending.sent(name, edits[name], self.model.epoch)
        return u, ""

    def send(self, command: Command) -> Update:
        """A setting command with no field of its own in the form (activation checkpointing,
        precision: the "what fits" table's choices). The engine's receipt, outcome or refusal
        come back as its events (a refusal in the alerts); Update.error: it could not be sent."""
        u = Update()
        if self.source is not None and self.state.is_live and self.state is not RunState.STOPPING:
            u.error = self._try_send(command)
        return u

    def _send(self, command: Command) -> None:
        assert self.source is not None
        self.source.send(command)
        self.sent.append(SentCommand(command, self.model.step, time.time()))

    def _try_send(self, command: Command) -> str:
        """Send; '' if it went, else why not."""
        try:
            self._send(command)
        except SEND_ERRORS as e:
            return _reason(e)
        return ""

    # -- endings -------------------------------------------------------------------------
    def engine_stopped(self) -> Update:
        """This window's engine thread has ended: everything it emitted is in, and a run still
        'going' now never trained a step or never said it ended."""
        u = self.poll(flush=True)
        self.engine_alive = False
        if self.state.is_live:
            self._set(RunState.IDLE, u)
        u.state = True  # busy changed
        return u

    def close(self) -> None:
        if self.source is not None:
            self.source.close()

    def not_started(self) -> Update:
        """The form or the task was refused, or torchrun ended before the run began."""
        u = Update()
        self._set(RunState.IDLE, u)
        return u

    def _set(self, state: RunState, u: Update) -> None:
        if state is self.state:
            return
        was_live, self.state = self.state.is_live, state
        self.model.state = state
        u.state = True
        if was_live and not state.is_live:  # the run ended before these reached a boundary
            u.pending += self.pending.run_ended()
