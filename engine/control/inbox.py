"""Where commands come in: the in-process queue, run.db's `commands` table and, under
torchrun, rank 0's broadcast. One component, read by the run loop at boundaries only.

`poll()` takes new commands off the queue (cheap: every step) and run.db (at most once
a second unless forced); `take()` hands the pending batch to the boundary that applies
it. A stop is noticed at once: it sets the stop flag the loop checks between
micro-batches.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import asdict
from typing import Any, Callable, Optional

from engine import distributed as D
from engine.declarations.commands import Command, SettingCommand, Stop, command_from_json
from engine.declarations.events import CommandReceived, CommandRefused, Event
from engine.store import RunStore

Pending = tuple[Command, Optional[int]]  # (command, run.db row id or None)


def applies_at(cmd: Command) -> str:
    """'now' (stop), 'step' (a setting asked for the next step) or 'epoch'."""
    if not cmd.at_epoch_boundary:
        return "now"
    return "step" if isinstance(cmd, SettingCommand) and cmd.at == "step" else "epoch"


class CommandInbox:
    def __init__(self, commands: "queue.Queue[Command]", stop: threading.Event, ctx: D.DistContext,
                 emit: Callable[[Event], None], db_interval: float = 1.0) -> None:
        self.queue = commands
        self.device: Any = None  # where torchrun's collectives run: set once the run's device is known
        self.stop = stop
        self.ctx = ctx
        self.emit = emit
        self.store: Optional[RunStore] = None  # set once the run folder is open (rank 0)
        self.db_interval = db_interval
        self._pending: list[Pending] = []
        self._last_db_poll = 0.0

    def poll(self, step: int, epoch: int, next_epoch: int, force: bool = False) -> None:
        """Collect new commands; `next_epoch` is the epoch a setting would apply from."""
        fresh: list[Pending] = []
        while self.queue.qsize():  # (no exception raised and caught on every step when empty)
            try:
                fresh.append((self.queue.get_nowait(), None))
            except queue.Empty:
                break
        now = time.monotonic()
        if self.store is not None and (force or now - self._last_db_poll >= self.db_interval):
            self._last_db_poll = now
            for row_id, cmd, err in self.store.pending_commands():
                if cmd is None:
                    self.store.mark_command(row_id, "refused", step, err)
                    self.emit(CommandRefused(step, epoch, command=f"row {row_id}", reason=err))
                    continue
                self.store.mark_command(row_id, "received", step)
                fresh.append((cmd, row_id))
        for cmd, _ in fresh:
            applies = applies_at(cmd)
            self.emit(CommandReceived(step, epoch, command=cmd.kind, payload=asdict(cmd), applies=applies,
                                      target_epoch=next_epoch if applies == "epoch" else None))
        self._pending.extend(fresh)
        if self.ctx.enabled and force:
            self._share(step)
        if (fresh or (self.ctx.enabled and force)) and any(isinstance(c, Stop) for c, _ in self._pending):
            self.stop.set()

    def _share(self, step: int) -> None:
        """Rank 0's commands, broadcast as JSON, so every rank applies the same ones; and
        a stop asked of any rank stops all of them."""
        rows = [(c.kind, c.to_json()) for c, _ in self._pending] if self.ctx.is_main else None
        rows = D.broadcast_object(rows, self.ctx)
        if not self.ctx.is_main:
            self._pending = [(command_from_json(k, p), None) for k, p in rows]
        if D.any_rank(self.stop.is_set(), self.ctx, self.device):
            self.stop.set()

    def take(self, at: str = "epoch") -> list[Pending]:
        """The pending commands to apply at this boundary: at an epoch boundary all of them,
        at a step boundary those that asked for the next step."""
        if at == "epoch":
            batch, self._pending = self._pending, []
            return batch
        batch = [(c, r) for c, r in self._pending if applies_at(c) == "step"]
        self._pending = [(c, r) for c, r in self._pending if applies_at(c) != "step"]
        return batch

    def has_step_commands(self) -> bool:
        return any(applies_at(c) == "step" for c, _ in self._pending)

    def mark(self, row_id: Optional[int], note: str, step: int) -> None:
        """Record in run.db what became of a command read from it."""
        if self.store is not None and row_id is not None:
            self.store.mark_command(row_id, "refused" if note else "applied", step, note)

    def close(self, step: int, epoch: int) -> None:
        """The run ends: no row read from run.db stays "received". A stop asked for is what
        ended it (applied); anything else still pending never came to apply (refused, saying so)."""
        left, self._pending = self._pending, []
        for cmd, row_id in left:
            if isinstance(cmd, Stop):
                self.mark(row_id, "", step)
                continue
            reason = f"the run ended at step {step} before it applied"
            self.mark(row_id, reason, step)
            if row_id is not None:
                self.emit(CommandRefused(step, epoch, command=cmd.kind, reason=reason))
