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
from typing import Any, Callable, Optional

from engine import distributed
from engine.declarations.commands import Command, SettingCommand, Stop, command_from_json
from engine.declarations.events import Event
from engine.store import RunStore

from .lifecycle import Lifecycle, Received


def applies_at(cmd: Command) -> str:
    """'now' (stop), 'step' (a setting asked for the next step) or 'epoch'."""
    if not cmd.at_epoch_boundary:
        return "now"
    return "step" if isinstance(cmd, SettingCommand) and cmd.at == "step" else "epoch"


class CommandInbox:
    """The Trainer's arrivals: the queue and run.db into the shared lifecycle (engine.steering.lifecycle),
    each received command due at the next step (at="step") or at the start of the next epoch."""

    def __init__(self, commands: "queue.Queue[Command]", stop: threading.Event, ctx: distributed.DistContext,
                 emit: Callable[[Event], None], db_interval: float = 1.0) -> None:
        self.queue = commands
        self.device: Any = None  # where torchrun's collectives run: set once the run's device is known
        self.stop = stop
        self.ctx = ctx
        self.life = Lifecycle(emit)
        self.db_interval = db_interval
        self._last_db_poll = 0.0

    @property
    def store(self) -> Optional[RunStore]:  # set once the run folder is open (rank 0), None after
        return self.life.store

    @store.setter
    def store(self, store: Optional[RunStore]) -> None:
        self.life.store = store

    def poll(self, step: int, epoch: int, next_epoch: int, force: bool = False) -> None:
        """Collect new commands; `next_epoch` is the epoch a setting would apply from."""
        fresh: list[Received] = []
        while self.queue.qsize():  # (no exception raised and caught on every step when empty)
            try:
                fresh.append(Received(self.queue.get_nowait()))
            except queue.Empty:
                break
        now = time.monotonic()
        if self.store is not None and (force or now - self._last_db_poll >= self.db_interval):
            self._last_db_poll = now
            fresh.extend(self.life.read_rows(step, epoch))
        for item in fresh:
            applies = applies_at(item.cmd)
            self.life.announce(item, step, epoch, applies, next_epoch if applies == "epoch" else None)
            self.life.defer(item, None if applies == "step" else next_epoch)
        if self.ctx.enabled and force:
            self._share(step, next_epoch)
        if (fresh or (self.ctx.enabled and force)) and any(isinstance(r.cmd, Stop) for r in self.life.pending):
            self.stop.set()

    def _share(self, step: int, next_epoch: int) -> None:
        """Rank 0's commands, broadcast as JSON, so every rank applies the same ones; and
        a stop asked of any rank stops all of them."""
        rows = [(r.cmd.kind, r.cmd.to_json()) for r in self.life.pending] if self.ctx.is_main else None
        rows = distributed.broadcast_object(rows, self.ctx)
        if not self.ctx.is_main:
            copies = [command_from_json(k, p) for k, p in rows]
            self.life.pending = [Received(c, None, None if applies_at(c) == "step" else next_epoch) for c in copies]
        if distributed.any_rank(self.stop.is_set(), self.ctx, self.device):
            self.stop.set()

    def take(self, at: str = "epoch") -> list[Received]:
        """The pending commands to apply at this boundary: at an epoch boundary all of them,
        at a step boundary those that asked for the next step."""
        return self.life.take_all() if at == "epoch" else self.life.take()

    def has_step_commands(self) -> bool:
        return self.life.has_step_commands()

    def close(self, step: int, epoch: int) -> None:
        """The run ends: no row read from run.db stays "received". A stop asked for is what
        ended it (applied); anything else still pending never came to apply (refused, saying so)."""
        self.life.end(step, epoch, self.life.take_all(),
                      lambda item: f"the run ended at step {step} before it applied")
