"""The app's commands as a training loop sees them (behind `HeadroomRun.poll` and co.).

`Steering` reads the `commands` table at step boundaries (cheaply: `PRAGMA data_version`,
then max(id), and only then RunStore.pending_commands), takes care of pause, resume and
stop itself, and keeps the table of setting commands: handed out to the loop by the last
poll(), or waiting for the start of a later epoch. Each ends applied, refused or deferred;
one the loop leaves untouched is refused at the next poll.
"""
from __future__ import annotations

import sqlite3
import time
from typing import Any, Optional

from engine.declarations.commands import Command, Pause, Resume, Stop
from engine.declarations.events import Event, LrHint, Resumed, SettingsApplied
from engine.declarations.rules import lr_hint
from engine.steering.lifecycle import Lifecycle, Received, while_paused
from engine.store import RunStore

from ._loop_events import IntegrationError, PausedAtStep


def _plain(v: Any) -> Any:
    if isinstance(v, (int, float, str)) or v is None:
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return repr(v)


class Steering:
    """The commands of one HeadroomRun: run.db's `commands` rows in, marks and events out, through
    the engine's command lifecycle (engine.steering.lifecycle); what this side adds is how a
    setting reaches the loop: handed out by poll(), and the loop's apply(), refuse() or defer().

    Sets the run's `paused` and `stop_requested`; writes through the store given to open()."""

    def __init__(self, run: Any) -> None:  # the HeadroomRun (engine.integrations.loop)
        self.run = run
        self.life = Lifecycle(self._emit)  # its pending: the commands waiting for a later epoch
        self._next_poll = 0.0
        self._ro: Optional[sqlite3.Connection] = None
        self._data_version: Optional[int] = None
        self._handed: list[Received] = []  # handed out by the last poll(), not yet decided
        self._seen_id = 0  # the highest commands row id seen
        self._recheck = False
        self._stops: list[Received] = []
        self._lr_set_at = -1  # the step boundary an lr was last applied at (no lr hint beside it)

    def _emit(self, event: Event) -> None:
        if self.life.store is not None:
            self.life.store.record(event)

    def open(self, path: str, store: RunStore) -> None:
        """Start watching run.db at `path` (read-only), writing through `store`."""
        self.life.store = store
        self._ro = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5, check_same_thread=False)
        self._data_version = None  # the first poll looks

    def close(self) -> None:
        self.life.store = None
        if self._ro is not None:
            self._ro.close()
            self._ro = None

    def end(self) -> None:
        """The run ends: what is still open is refused, the stop that ended it applied."""
        assert self.life.store is not None
        handed, self._handed = self._handed, []
        stops, self._stops = self._stops, []
        run = self.run
        self.life.end(run.step, run.epoch, handed + self.life.take_all() + stops,
                      lambda item: "the run ended before the loop applied it" if any(item is h for h in handed)
                      else f"the run ended before epoch {item.due}")

    def _epoch_due(self) -> bool:
        first = self.life.next_due()
        return first is not None and first <= self.run.epoch

    def due(self) -> bool:
        """Whether poll() would look at run.db now."""
        return (not self.run.poll_interval or time.monotonic() >= self._next_poll or bool(self._handed)
                or self._epoch_due())

    # -- reading --------------------------------------------------------------------------------------
    def poll(self, block_on_pause: bool) -> list[Command]:
        """HeadroomRun.poll: the setting commands due now, oldest first."""
        run = self.run
        if self.life.store is None:
            return []
        if run.poll_interval and not self._epoch_due():
            now = time.monotonic()
            if now < self._next_poll and not self._handed:
                return []  # the per-step cost between reads: one clock call
            self._next_poll = now + run.poll_interval
        for h in self._handed:
            self._refuse(h, "this training loop does not apply it")
        self._handed = []
        fresh = self._read()
        if run.paused and block_on_pause:
            fresh = self._wait_paused(fresh)
        for h in fresh:
            why = run.refusal(h.cmd) if run.refusal is not None else ""
            if why:
                self._refuse(h, why)
            elif getattr(h.cmd, "at", "step") == "epoch":
                self._wait(h, run.epoch + 1)
            else:
                self._handed.append(h)
        self._handed = self.life.take(run.epoch) + self._handed  # what waited for this epoch first
        return [h.cmd for h in self._handed]

    def _changed(self) -> bool:
        assert self._ro is not None
        try:
            v = self._ro.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error:
            return True
        if v == self._data_version:
            return False
        self._data_version = v
        return True

    def _read(self) -> list[Received]:
        """Pending rows -> settings for the loop; pause, resume and stop are taken care of here."""
        if self._ro is None or not self._changed():
            return []
        run = self.run
        # Our own writes change data_version too: only a new row in `commands` (or rows left
        # from the last read) is worth the store's full read, which also writes what it queued.
        try:
            top = int(self._ro.execute("SELECT max(id) FROM commands").fetchone()[0] or 0)
        except (sqlite3.Error, TypeError, ValueError):
            top = self._seen_id + 1
        if top <= self._seen_id and not self._recheck:
            return []
        fresh = self.life.read_rows(run.step, run.epoch, refuse_all=run.steering)
        self._seen_id = max(self._seen_id, top)
        self._recheck = bool(self.life.rows_read)
        out: list[Received] = []
        for h in fresh:
            if isinstance(h.cmd, Stop):
                run.stop_requested = True
                run.paused = False
                self._stops.append(h)
                self.life.announce(h, run.step, run.epoch, "now")
            elif isinstance(h.cmd, (Pause, Resume)):
                was = run.paused
                run.paused = self.life.pause_or_resume(h, was, run.step, run.epoch, PausedAtStep(run.step, run.epoch),
                                                       Resumed(run.step, run.epoch))
                if was and not run.paused:
                    run.reset_timer()
            else:
                out.append(h)
        return out

    def _wait_paused(self, fresh: list[Received]) -> list[Received]:
        run = self.run
        assert self.life.store is not None
        self.life.store.commit()
        for _ in while_paused(lambda: run.paused and not run.stop_requested):
            self._data_version = None
            fresh.extend(self._read())
        run.reset_timer()
        return fresh

    # -- the loop's decisions -------------------------------------------------------------------------
    def _wait(self, h: Received, epoch: int) -> None:
        if h.due != epoch:  # the app shows "pending: applies at epoch N"
            self.life.announce(h, self.run.step, self.run.epoch, "epoch", epoch)
        self.life.defer(h, epoch)

    def _take(self, cmd: Command) -> Received:
        """`cmd`'s entry, out of the handed-out list (the loop decides it now)."""
        for h in self._handed:
            if h.cmd is cmd:
                self._handed.remove(h)
                return h
        raise IntegrationError(f"{cmd.kind}: not a command handed out by the last poll() and still open")

    def apply(self, cmd: Command, changes: dict[str, tuple[Any, Any]]) -> None:
        """HeadroomRun.apply: the row applied, a settings_applied event for what changed."""
        h = self._take(cmd)
        run = self.run
        store = run.store
        if h.due is None:
            self.life.announce(h, run.step, run.epoch, "step")
        ch = tuple((k, _plain(o), _plain(n)) for k, (o, n) in changes.items() if o != n)
        if ch:  # what the loop changes now, it changes for the next optimizer step
            store.record(SettingsApplied(run.step, run.epoch, changes=ch, at="step" if h.due is None else "epoch",
                                         from_step=run.step + 1))
            for k, o, n in ch:
                if k == "lr":
                    self._lr_set_at = run.step
                    if isinstance(o, (int, float)) and isinstance(n, (int, float)) and o > 0 and n > 0:
                        run.lr_scale *= n / o  # for a loop that sets its lr every iteration
            hint = self._lr_hint({k: (o, n) for k, o, n in ch})
            if hint is not None:
                store.record(hint)
        self.life.applied(h, run.step)

    def _lr_hint(self, changes: dict[str, tuple[Any, Any]]) -> Optional[LrHint]:
        """The engine's hint (engine.declarations.rules.lr_hint), where the effective batch changed and
        the lr did not. The current micro-batch, accumulation and lr are the last step's row's."""
        run = self.run
        last = run.last_step
        if ("lr" in changes or self._lr_set_at == run.step or last is None
                or not ({"accum", "micro_batch"} & changes.keys())):
            return None
        acc_old, acc_new = changes.get("accum", (last.accum, last.accum))
        mb_old, mb_new = changes.get("micro_batch", (last.micro_batch, last.micro_batch))
        try:
            ratio = (float(mb_new) * float(acc_new)) / (float(mb_old) * float(acc_old))
            lr = float(last.lr)
        except (TypeError, ValueError, ZeroDivisionError):
            return None
        if ratio == 1.0 or not lr > 0:
            return None
        return lr_hint(run.step, run.epoch, int(acc_old), int(acc_new), lr, ratio)

    def refuse(self, cmd: Command, reason: str) -> None:
        self._refuse(self._take(cmd), reason)

    def defer(self, cmd: Command, target_epoch: int) -> None:
        self._wait(self._take(cmd), int(target_epoch))

    def _refuse(self, h: Received, reason: str) -> None:
        if self.life.store is not None:
            self.life.refuse(h, reason, self.run.step, self.run.epoch)
