"""One command's life, from its arrival to its outcome: the part every run that steers shares.

A command arrives (run.db's `commands` row, or the in-process queue), is received (the row
marked, a command_received event saying when it applies), waits for the boundary it asked
for (the next step, or the start of an epoch), and ends applied or refused (the row marked,
a command_refused event saying why). A pause holds the run in a short sleep-and-look wait.

Two sides steer with it and keep only how they apply a setting: the engine's Trainer
(engine.steering.inbox and .boundaries, its settings through engine.declarations.rules) and
the plain-loop and framework integrations (engine.integrations._loop_steering, which hand
settings to the user's loop). Torch-free: only declarations and the store.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterator, Optional

from engine.declarations.commands import Command, Pause, Stop
from engine.declarations.events import CommandReceived, CommandRefused, Event
from engine.store import RunStore

# How long a paused run sleeps between two looks at its commands: short enough that a resume
# feels immediate, long enough that a paused run costs no CPU.
PAUSE_POLL_S = 0.05


@dataclass(eq=False)  # identity: the same command sent twice is two commands
class Received:
    """A command between its arrival and its outcome."""
    cmd: Command
    row: Optional[int] = None  # its run.db `commands` row id; None: the in-process queue (or rank 0's copy)
    due: Optional[int] = None  # the epoch at whose start it applies; None: the next step boundary


def while_paused(paused: Callable[[], bool]) -> Iterator[None]:
    """The turns of a paused wait: each a short sleep, after which the caller looks at its
    commands again (a resume or a stop among them ends the wait through `paused`)."""
    while paused():
        time.sleep(PAUSE_POLL_S)
        yield


class Lifecycle:
    """The commands of one run: receipt, deferral, pause, and the applied or refused mark.

    `emit` writes an event (the Trainer's also reaches the app's queue); `store` is the run's
    RunStore once its folder is open (None before, after, and on ranks other than 0)."""

    def __init__(self, emit: Callable[[Event], None], store: Optional[RunStore] = None) -> None:
        self.emit = emit
        self.store = store
        self.pending: list[Received] = []  # received, waiting for their boundary
        self.rows_read = 0  # rows the last read_rows found, refused ones too (a full batch may leave more)

    # -- arrival --------------------------------------------------------------------------------------
    def read_rows(self, step: int, epoch: int, refuse_all: str = "") -> list[Received]:
        """run.db's new rows, each marked received; a malformed one is refused as it stands,
        and every one with `refuse_all` when this run takes no commands at all."""
        store = self.store
        if store is None:
            return []
        fresh: list[Received] = []
        rows = store.pending_commands()  # hostile or malformed rows come back as errors
        self.rows_read = len(rows)
        for row_id, cmd, err in rows:
            if cmd is None:
                store.mark_command(row_id, "refused", step, err)
                self.emit(CommandRefused(step, epoch, command=f"row {row_id}", reason=err))
            elif refuse_all:
                self.refuse(Received(cmd, row_id), refuse_all, step, epoch)
            else:
                store.mark_command(row_id, "received", step)
                fresh.append(Received(cmd, row_id))
        return fresh

    def announce(self, item: Received, step: int, epoch: int, applies: str,
                 target_epoch: Optional[int] = None) -> None:
        """command_received: the app shows "pending: applies at epoch N" (or at the next step)."""
        self.emit(CommandReceived(step, epoch, command=item.cmd.kind, payload=asdict(item.cmd), applies=applies,
                                  target_epoch=target_epoch))

    # -- waiting for a boundary ------------------------------------------------------------------------
    def defer(self, item: Received, epoch: Optional[int]) -> None:
        """`item` waits for the start of `epoch` (None: the next step boundary)."""
        item.due = epoch
        self.pending.append(item)

    def take(self, epoch: Optional[int] = None) -> list[Received]:
        """What applies now, oldest first: at a step boundary (epoch None) what asked for the next
        step; at the start of `epoch`, also what waited for it."""
        now = [r for r in self.pending if r.due is None or (epoch is not None and r.due <= epoch)]
        if now:
            self.pending = [r for r in self.pending if not any(r is n for n in now)]
        return now

    def take_all(self) -> list[Received]:
        everything, self.pending = self.pending, []
        return everything

    def has_step_commands(self) -> bool:
        return any(r.due is None for r in self.pending)

    def next_due(self) -> Optional[int]:
        """The first epoch something waits for (None: nothing waits for an epoch)."""
        return min((r.due for r in self.pending if r.due is not None), default=None)

    # -- pause and resume ------------------------------------------------------------------------------
    def pause_or_resume(self, item: Received, paused: bool, step: int, epoch: int, on_pause: Event,
                        on_resume: Event, idle_resume: str = "") -> bool:
        """A Pause or a Resume against the run's `paused`: the event of an actual change, the row
        applied; a resume with nothing paused is refused with `idle_resume` when that is given
        (said, not dropped: the sender sees why nothing happened). Returns the new `paused`."""
        if isinstance(item.cmd, Pause):
            if not paused:
                self.emit(on_pause)
            self.applied(item, step)
            return True
        if paused:
            self.emit(on_resume)
        elif idle_resume:
            self.refuse(item, idle_resume, step, epoch)
            return False
        self.applied(item, step)
        return False

    # -- the outcome -----------------------------------------------------------------------------------
    def applied(self, item: Received, step: int) -> None:
        self.settle(item, "", step)

    def refuse(self, item: Received, reason: str, step: int, epoch: int) -> None:
        """Refused, saying why: a command_refused event and the row marked."""
        self.emit(CommandRefused(step, epoch, command=item.cmd.kind, reason=reason))
        self.settle(item, reason, step)

    def settle(self, item: Received, note: str, step: int) -> None:
        """The row's mark alone ('' applied, else refused with `note`), for a refusal whose event
        was already written (engine.declarations.rules writes its own)."""
        if self.store is not None and item.row is not None:
            self.store.mark_command(item.row, "refused" if note else "applied", step, note)

    def end(self, step: int, epoch: int, left: list[Received], why: Callable[[Received], str]) -> None:
        """The run ends: no row stays "received". A stop is what ended it (applied); anything else
        never came to apply (refused with `why`; an in-process command ends silently, its sender
        sees the run end)."""
        for item in left:
            if isinstance(item.cmd, Stop):
                self.applied(item, step)
            elif item.row is not None:
                self.refuse(item, why(item), step, epoch)
