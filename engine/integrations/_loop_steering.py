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
from dataclasses import asdict
from typing import Any, Optional

from engine.declarations.commands import Command, Pause, Resume, Stop
from engine.declarations.events import CommandReceived, CommandRefused, LrHint, Resumed, SettingsApplied
from engine.declarations.settings import scale_lr
from ._loop_events import IntegrationError, PausedAtStep

PAUSE_POLL_S = 0.05


class _Handed:
    """A setting command between run.db and the loop: waiting for its epoch, or handed out."""
    __slots__ = ("cmd", "row", "due")

    def __init__(self, cmd: Command, row: Optional[int]) -> None:
        self.cmd, self.row = cmd, row
        self.due: Optional[int] = None  # the epoch it waits for (announced), None: due at the next step


def _plain(v: Any) -> Any:
    if isinstance(v, (int, float, str)) or v is None:
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return repr(v)


class Steering:
    """The commands of one HeadroomRun: run.db's `commands` rows in, marks and events out.

    Sets the run's `paused` and `stop_requested`; writes through the run's store."""

    def __init__(self, run: Any) -> None:  # the HeadroomRun (engine.integrations.loop)
        self.run = run
        self._next_poll = 0.0
        self._ro: Optional[sqlite3.Connection] = None
        self._data_version: Optional[int] = None
        self._handed: list[_Handed] = []  # handed out by the last poll(), not yet decided
        self._waiting: list[_Handed] = []  # for the start of a later epoch
        self._seen_id = 0  # the highest commands row id seen
        self._recheck = False
        self._stop_rows: list[int] = []
        self._lr_set_at = -1  # the step boundary an lr was last applied at (no lr hint beside it)

    @property
    def _store(self) -> Any:  # the run's RunStore, None before start and after the end
        return self.run._store

    def open(self, path: str) -> None:
        """Start watching run.db at `path` (read-only)."""
        self._ro = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5, check_same_thread=False)
        self._data_version = None  # the first poll looks

    def close(self) -> None:
        if self._ro is not None:
            self._ro.close()
            self._ro = None

    def end(self) -> None:
        """The run ends: what is still open is refused, the stop that ended it applied."""
        store = self._store
        assert store is not None
        for h in self._handed:
            self._refuse_handed(h, "the run ended before the loop applied it")
        for h in self._waiting:
            self._refuse_handed(h, f"the run ended before epoch {h.due}")
        self._handed.clear()
        self._waiting.clear()
        for row in self._stop_rows:
            store.mark_command(row, "applied", self.run.step, "")
        self._stop_rows.clear()

    def due(self) -> bool:
        """Whether poll() would look at run.db now."""
        return (not self.run.poll_interval or time.monotonic() >= self._next_poll or bool(self._handed)
                or bool(self._waiting and min(h.due for h in self._waiting) <= self.run.epoch))

    # -- reading --------------------------------------------------------------------------------------
    def poll(self, block_on_pause: bool) -> list[Command]:
        """HeadroomRun.poll: the setting commands due now, oldest first."""
        run = self.run
        if self._store is None:
            return []
        due_epoch = self._waiting and min(h.due for h in self._waiting) <= run.epoch
        if run.poll_interval and not due_epoch:
            now = time.monotonic()
            if now < self._next_poll and not self._handed:
                return []  # the per-step cost between reads: one clock call
            self._next_poll = now + run.poll_interval
        for h in self._handed:
            self._refuse_handed(h, "this training loop does not apply it")
        self._handed = []
        fresh = self._read()
        if run.paused and block_on_pause:
            fresh = self._wait_paused(fresh)
        for h in fresh:
            why = run.refusal(h.cmd) if run.refusal is not None else ""
            if why:
                self._refuse_handed(h, why)
            elif getattr(h.cmd, "at", "step") == "epoch":
                self._wait(h, run.epoch + 1)
            else:
                self._handed.append(h)
        if self._waiting:
            due = [h for h in self._waiting if h.due <= run.epoch]
            if due:
                self._waiting = [h for h in self._waiting if h.due > run.epoch]
                self._handed = due + self._handed
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

    def _read(self) -> list[_Handed]:
        """Pending rows -> settings for the loop; pause, resume and stop are taken care of here."""
        if self._ro is None or not self._changed():
            return []
        run = self.run
        store = self._store
        assert store is not None
        # Our own writes change data_version too: only a new row in `commands` (or rows left
        # from the last read) is worth the store's full read, which also writes what it queued.
        try:
            top = int(self._ro.execute("SELECT max(id) FROM commands").fetchone()[0] or 0)
        except (sqlite3.Error, TypeError, ValueError):
            top = self._seen_id + 1
        if top <= self._seen_id and not self._recheck:
            return []
        rows = store.pending_commands()  # validated rows; hostile or malformed ones come back as errors
        self._seen_id = max(self._seen_id, top)
        self._recheck = bool(rows)
        out: list[_Handed] = []
        for row_id, cmd, err in rows:
            if cmd is None:
                store.mark_command(row_id, "refused", run.step, err)
                store.record(CommandRefused(run.step, run.epoch, command=f"row {row_id}", reason=err))
                continue
            if run.steering:
                store.mark_command(row_id, "refused", run.step, run.steering)
                store.record(CommandRefused(run.step, run.epoch, command=cmd.kind, reason=run.steering))
                continue
            store.mark_command(row_id, "received", run.step)
            if isinstance(cmd, Stop):
                run.stop_requested = True
                run.paused = False
                self._stop_rows.append(row_id)
                self._received(cmd, "now")
            elif isinstance(cmd, Pause):
                if not run.paused:
                    run.paused = True
                    store.record(PausedAtStep(run.step, run.epoch))
                store.mark_command(row_id, "applied", run.step)
            elif isinstance(cmd, Resume):
                if run.paused:
                    run.paused = False
                    store.record(Resumed(run.step, run.epoch))
                    run.reset_timer()
                store.mark_command(row_id, "applied", run.step)
            else:
                out.append(_Handed(cmd, row_id))
        return out

    def _wait_paused(self, fresh: list[_Handed]) -> list[_Handed]:
        run = self.run
        store = self._store
        assert store is not None
        store.commit()
        while run.paused and not run.stop_requested:
            time.sleep(PAUSE_POLL_S)
            self._data_version = None
            fresh.extend(self._read())
        run.reset_timer()
        return fresh

    # -- the table ------------------------------------------------------------------------------------
    def _received(self, cmd: Command, applies: str, target_epoch: Optional[int] = None) -> None:
        run = self.run
        run.record(CommandReceived(run.step, run.epoch, command=cmd.kind, payload=asdict(cmd), applies=applies,
                                   target_epoch=target_epoch))

    def _wait(self, h: _Handed, epoch: int) -> None:
        if h.due != epoch:
            self._received(h.cmd, "epoch", epoch)  # the app shows "pending: applies at epoch N"
        h.due = epoch
        self._waiting.append(h)

    def _take(self, cmd: Command) -> _Handed:
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
        store = run._need_store()
        if h.due is None:
            self._received(cmd, "step")
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
        if h.row is not None:
            store.mark_command(h.row, "applied", run.step, "")

    def _lr_hint(self, changes: dict[str, tuple[Any, Any]]) -> Optional[LrHint]:
        """The engine's hint (engine.declarations.rules): the effective batch changed and the lr did
        not, so say what the linear rule would give. The current micro-batch, accumulation and
        lr are the last step's row's."""
        last = self.run._rows.last
        if ("lr" in changes or self._lr_set_at == self.run.step or last is None
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
        run = self.run
        return LrHint(run.step, run.epoch, accum_old=int(acc_old), accum_new=int(acc_new),
                      suggested_lr=scale_lr(lr, "linear", ratio))

    def refuse(self, cmd: Command, reason: str) -> None:
        self._refuse_handed(self._take(cmd), reason)

    def defer(self, cmd: Command, target_epoch: int) -> None:
        h = self._take(cmd)
        self._wait(h, int(target_epoch))

    def _refuse_handed(self, h: _Handed, reason: str) -> None:
        store = self._store
        if store is None:
            return
        run = self.run
        store.record(CommandRefused(run.step, run.epoch, command=h.cmd.kind, reason=reason))
        if h.row is not None:
            store.mark_command(h.row, "refused", run.step, reason)
