"""The training engine's run loop: epochs, windows, boundaries, stop.

One optimizer step is one accumulation window. Read `_train_epochs` top to bottom:
the policy cuts the epoch into windows, `step_window` trains one (accumulate.py does
the micro-batches, step.py the optimizer step), `_report` turns its numbers into
metrics and alerts, and commands are applied only at boundaries, so no window is
ever split between two settings. Set-up is setup.py (run when the Trainer is made),
checkpoints run_state.py, the run's end closing.py, commands engine.steering (inbox, rules, boundaries; lr, the one
writer of the optimizer's learning rate), alerts watchers.py. No Qt here.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Callable, Optional, Sequence

import torch

from engine import distributed
from engine.accumulation import sampling
from engine.accumulation.accumulate import StopRequested, train_window
from engine.accumulation.oom import free_memory, halved, is_oom, smaller_shape
from engine.accumulation.step import InFlight, WindowNumbers
from engine.declarations.commands import Command, Stop
from engine.declarations.config import TrainConfig
from engine.declarations.events import (
    CheckpointSaved,
    EpochEnd,
    Event,
    LrPlanned,
    MemorySnapshot,
    OomRecovered,
    RunFailed,
    RunFinished,
    StoreProblem,
)
from engine.declarations.outcome import (
    CheckpointFailed,
    NonFiniteStop,
    OutOfMemoryStop,
    RunResult,
    StepNotRedoable,
    TrainingError,
)
from engine.declarations.paths import resolve_task_spec
from engine.declarations.settings import LENGTH_NAMES, LiveSettings, scaled_to_reference
from engine.distributed.world import keep_effective_batch
from engine.memory.what_fits.forecast import MemoryModel
from engine.steering.boundaries import Boundaries
from engine.steering.inbox import CommandInbox
from engine.store import RunStore
from engine.tasks.task import Task

from . import closing, notify, opening, run_state
from .autopilot import MAX_IN_A_ROW, Autopilot, roll_back
from .evaluate import validation_loss
from .failure import failure_message, failure_report, is_peer_failure
from .finder import NothingFits, find_micro_batch
from .progress import Progress
from .report import Launched, skip_events, skip_kind, step_metrics
from .saving import Checkpointer
from .settings_flow import SettingsFlow
from .setup import RunParts, build
from .watchers import BatchNormWatcher, Watcher, run_watchers


class Trainer(SettingsFlow):
    """One run: built when the Trainer is made (setup.build: everything that can fail on bad
    input, before the run folder holds anything), trained by run()."""

    def __init__(self, config: TrainConfig, task: Optional[Task] = None,
                 sink: Optional[Callable[[Event], None]] = None,
                 commands: Optional["queue.Queue[Command]"] = None,
                 dist_ctx: Optional[distributed.DistContext] = None, *, db_interval: float = 1.0) -> None:
        config = config.validate()
        urls = notify.notify_urls(config.notify)
        # before torchrun's group forms: every rank refuses a bad URL alike
        notify.checked(urls, "--notify" if config.notify else notify.ENV)
        self.notifier: Optional[notify.Notifier] = None  # rank 0, once the run is built
        self.config = config.with_(task=resolve_task_spec(config.task))  # resumable from any folder
        self.sink = sink
        self.commands: "queue.Queue[Command]" = commands if commands is not None else queue.Queue()
        self.ctx = dist_ctx if dist_ctx is not None else distributed.from_env()
        self._stop = threading.Event()
        self._stop_agreed = False  # under torchrun: a stop every rank knows about (see _report)
        self._step_commands_agreed = False  # under torchrun: rank 0 holds commands for the next step
        self._feed_index = 0  # the window's place in the epoch's current windows (the feeder's position)
        self.store: Optional[RunStore] = None  # rank 0, from run() until the run ends
        self.progress = Progress()
        self.settings = LiveSettings.from_config(self.config)
        self.memory_model = MemoryModel()
        self.autopilot: Optional[Autopilot] = None  # --nonfinite rollback / --spike-factor
        self._in_flight: deque[Launched] = deque()
        self._losses: list[float] = []  # the loss of every applied step, for RunResult
        self._store_problems: list[str] = []  # from the store's flusher thread, emitted by this one
        try:
            self.parts = parts = build(self.config, task, self.ctx)
        except BaseException:  # refused: under torchrun every rank that refused too leaves the group together
            distributed.leave_refused(self.ctx)
            raise
        self.saver = Checkpointer(parts)
        self._store_lost = ""  # what run.db did not take, said at the end (RunResult.store_lost)
        self.inbox = CommandInbox(self.commands, self._stop, self.ctx, self._emit, db_interval=db_interval)
        self.inbox.device = parts.device
        parts.window.commands_waiting = self.inbox.has_step_commands
        self.boundaries = Boundaries(self.inbox, parts.rules(), self._emit)
        self.watchers: list[Watcher] = run_watchers(parts, self.memory_model)
        if urls and self.ctx.is_main:
            self.notifier = notify.Notifier(urls, parts.run_dir)

    # -- control from other threads -------------------------------------------------------
    def send(self, command: Command) -> None:
        """Thread-safe. Settings and pause apply at the next epoch boundary, stop at the next step."""
        self.commands.put(command)
        if isinstance(command, Stop):
            self._stop.set()

    def request_stop(self) -> None:
        """Thread-safe and signal-safe: stop after the current micro-batch, with a checkpoint."""
        self._stop.set()

    def _open(self, parts: RunParts) -> None:
        """Open the run folder (rank 0) and continue from the checkpoint, if any (opening.py)."""
        if self.ctx.is_main:
            self.store = self.inbox.store = opening.open_store(parts, self._store_problems.append)
        resized = length = None
        if parts.origin.state is not None:
            self.progress, self.settings, asked = opening.continue_from(parts, parts.origin.state)
            for cmd in asked:
                self.commands.put(cmd)
            length = opening.changed_length(self.config, self.settings, self.step, self.epoch)
            p, saved = self.progress, parts.origin.state.get("settings") or {}
            if p.plan_total:  # the curve a change of length planned while it trained, as it was
                parts.lr.resumed(p.plan_total, p.plan_from, p.plan_factor)
                if any(saved.get(n) != getattr(self.settings, n) for n in LENGTH_NAMES):
                    self._new_length()  # and a length given anew with --resume: planned from here
            self.settings, resized = keep_effective_batch(  # on another number of ranks
                self.settings, parts.origin.state, self.ctx.world, self.config.token_budget,
                self.config.fork_changes if parts.origin.parent else (), self.step, self.epoch)
        if self.store is not None:
            opening.record_start(self.store, parts, self.progress.step)
            self._emit_all(opening.restore_epoch_row(self.store, parts, self.progress))
        if parts.origin.state is not None:
            self._emit_all(opening.resumed_changes(parts, parts.origin.state, self.step, self.epoch))
            if length is not None:
                self._emit(length)
        if resized is not None:
            self._emit(resized)
        for note in parts.origin.skipped:
            self._emit(StoreProblem(self.step, self.epoch, problem=note))

    # -- the run --------------------------------------------------------------------------
    def run(self) -> RunResult:
        parts = self.parts
        reason, message = "completed", ""
        try:
            self._open(parts)
            self._emit(opening.run_started(parts, self.config, self.step, self.epoch))
            if self.config.find_micro_batch and parts.resume_state is None:
                try:
                    found = find_micro_batch(parts, self.progress, self.memory_model)
                except NothingFits as e:
                    raise OutOfMemoryStop(str(e)) from None
                self.settings = self.settings.with_(micro_batch=found.micro_batch, accum=found.accum)
                self._emit(found)
            if self.config.nonfinite == "rollback" or self.config.spike_factor is not None:
                self.autopilot = self.saver.autopilot = Autopilot(
                    self.config.nonfinite == "rollback", self.config.spike_factor, self.step,
                    run_state.weights_state(parts))
            scaled = scaled_to_reference(self.settings, self.config, self.ctx.world, self._emit, self.step)
            parts.lr.new_peak(self.settings.lr, scaled.lr)  # a task's scheduler moves to the scaled peak too
            self.settings = scaled
            parts.modes.train_mode(parts.model)  # train mode, except the parts the user froze in eval
            if self.settings.checkpointing and parts.switch is not None:
                parts.switch(True)
            self._emit(self._lr_planned())
            self._emit_all(BatchNormWatcher(parts.model).check(self.step, self.epoch, self.settings))
            reason = self._train_epochs(parts)
        except NonFiniteStop as e:
            reason, message = "nonfinite", str(e)
            try:
                self._save_checkpoint()
            except BaseException as failed:  # a full disk: the run failed after all
                self._fail(failed)
                raise
        except BaseException as e:
            cause = parts.feeder.explain(e, self.step)  # a DataLoader worker that exited, whatever surfaced
            if cause is not e:
                self._fail(cause)
                raise cause from e
            self._fail(e)
            if isinstance(e, SystemExit):  # task code called sys.exit(): a failed run, said in one line
                raise TrainingError(f"the task's code called sys.exit({e.code!r}) at step {self.step}") from None
            peer = isinstance(e, RuntimeError) and not isinstance(e, TrainingError) and is_peer_failure(e)
            if self.ctx.enabled and peer:  # another rank died: said in one line too
                raise TrainingError(failure_message(e, self.ctx, (TrainingError,))) from None
            raise
        self._emit(RunFinished(self.step, self.epoch, reason=reason))
        self._finish("finished")
        losses, p = self._losses, self.progress
        return RunResult(run_dir=parts.run_dir, steps=p.step, epochs_done=p.epoch - 1, reason=reason,
                         final_loss=losses[-1] if losses else None, nonfinite_steps=p.nonfinite_steps,
                         scaler_skips=p.scaler_skips, losses=losses, message=message,
                         store_lost=self._store_lost)

    def _train_epochs(self, parts: RunParts) -> str:
        cfg, p = self.config, self.progress
        if self._at_max_steps():  # resumed at or past the limit
            return "max_steps"
        while p.epoch <= self.settings.epochs or self._extended():  # epochs and max steps are live settings
            if p.epoch_offset == 0:
                self._epoch_boundary()  # pending settings apply here; waits while paused
                p.start_epoch()  # (a run resumed mid-epoch keeps the epoch's loss so far)
            if self._stop.is_set():
                return self._stopped()
            epoch_start = time.perf_counter()
            while windows := self._rest_of_epoch(parts):
                for k, window in enumerate(windows):
                    self._feed_index = k
                    if not self.step_window(window):  # stopped mid-window: the partial window is dropped
                        return self._stopped()
                    p.window += 1
                    p.epoch_offset += len(window)
                    if self._at_max_steps():
                        return self._stopped("max_steps")
                    self.inbox.poll(p.step, p.epoch, p.epoch + 1)
                    self._drain_store_problems()
                    if self._should_stop():
                        return self._stopped()
                    if cfg.checkpoint_every and p.step % cfg.checkpoint_every == 0:
                        self._save_checkpoint(step_checkpoint=True)
                    if self.autopilot is not None and self.autopilot.pending is not None:
                        self._roll_back(parts)
                    if self._step_boundary():  # the windows changed: cut the rest of the epoch anew
                        break
                else:
                    break  # the epoch's windows are done
            self._drain()
            done = EpochEnd(p.step, p.epoch, train_loss=p.epoch_train_loss,
                            val_loss=validation_loss(parts, self.settings.micro_batch),
                            seconds=time.perf_counter() - epoch_start)
            p.end_epoch(opening.epoch_row(done))  # the checkpoint holds the row: a crash before run.db has it loses nothing
            self._save_checkpoint(epoch_done=p.epoch - 1)  # before the event: what is seen is saved
            self._emit(done)
        return "completed"

    def _rest_of_epoch(self, parts: RunParts) -> list[list[int]]:
        """The windows of the epoch from the first sample not yet trained, as the current
        settings cut them; the feeder's workers start loading them."""
        windows = parts.policy.windows(self.epoch, self.settings, self.ctx.world, start=self.progress.epoch_offset)
        parts.feeder.begin_epoch([sampling.rank_share(w, self.ctx.rank, self.ctx.world) for w in windows],
                                 lambda share: parts.policy.split(share, self.settings), self.epoch)
        return windows

    def _roll_back(self, parts: RunParts) -> None:
        """The autopilot saw a divergence: back to the newest good checkpoint (autopilot.py)."""
        ap = self.autopilot
        assert ap is not None and ap.pending is not None
        self._drain()
        trouble = ap.pending
        if not ap.rolled_back():
            raise NonFiniteStop(f"gave up after {MAX_IN_A_ROW} rollbacks in a row without progress ({trouble.reason} "
                                f"at step {trouble.at_step})")
        self.progress, settings, event, notes = roll_back(parts, self.progress, self.settings, trouble, ap)
        for note in notes:
            self._emit(StoreProblem(self.step, self.epoch, problem=note))
        parts.lr.reloaded()  # the optimizer's state came back: the next window writes its lr
        self.saver.save_rolled_back(self.progress, settings)  # durable before training goes on
        if self.store is not None:
            self.store.discard_after(self.step, f"rolled back at step {trouble.at_step} ({trouble.reason})")
        self._emit(event)
        self._settings_changed(settings)

    def _stopped(self, reason: str = "stopped") -> str:
        self._save_checkpoint()
        return reason

    def _should_stop(self) -> bool:
        return self._stop_agreed if self.ctx.enabled else self._stop.is_set()

    # -- one optimizer step -----------------------------------------------------------------
    def step_window(self, window: list[int]) -> bool:
        """Train one window (False if a stop interrupted it). On out-of-memory, halve the
        micro-batch and redo the window from its first sample."""
        parts = self.parts
        t0 = time.perf_counter()
        share = sampling.rank_share(window, self.ctx.rank, self.ctx.world)
        if parts.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(parts.device)  # so mem_peak is this window's peak
        launch_settings = parts.lr.for_window(self.settings, self.progress.samples)
        while True:
            micro = parts.policy.split(share, self.settings)
            try:
                flight = self.train_window(micro, len(window))
                break
            except StopRequested:
                self.drop_window_grads()
                self._drain()
                return False
            except BaseException as e:
                if not is_oom(e):
                    raise
                self._snapshot_oom(parts)  # while the exception still holds what filled the memory
            # Out of memory: recover here, once the exception (and the frames it holds) is gone.
            self.drop_window_grads()
            free_memory(parts.device)
            self._set_shape(*halved(self.settings.micro_batch, self.settings.accum, self.config.oom_recovery))
        self.progress.step += 1
        self.progress.samples += len(window)
        parts.lr.stepped()
        if self.settings.micro_batch != launch_settings.micro_batch:  # shrunk after an out-of-memory error
            launch_settings = launch_settings.with_(micro_batch=self.settings.micro_batch, accum=self.settings.accum)
        self._in_flight.append(Launched(step=self.step, epoch=self.epoch, samples=len(window), accum=len(micro),
                                        settings=launch_settings, started=t0, mem=parts.probe.sample(),
                                        flight=flight, breakdown=parts.memory.last, device=parts.device))
        # Deferred steps are reported once the next one is launched: by then their numbers
        # reached pinned memory while this window's work queued behind them.
        while len(self._in_flight) > parts.window.stepper.depth:
            self._report(self._in_flight.popleft())
        return True

    def _lr_planned(self) -> LrPlanned:
        return self.parts.lr.planned(self.step, self.epoch, self.settings.lr, self.progress.samples)

    def train_window(self, micro: list[list[int]], global_samples: int) -> InFlight:
        """Forward/backward each micro-batch, then the optimizer step (accumulate.py)."""
        parts = self.parts
        batches = parts.feeder.take(self._feed_index, micro)  # one at a time: none outlives its backward
        s = self.settings
        return train_window(parts.window, batches, global_samples, s.clip, s.micro_batch,
                            self._stop.is_set, len(micro))

    def _snapshot_oom(self, parts: RunParts) -> None:
        if self.config.memory_snapshot != "on-oom":
            return
        path = parts.snapshots.on_oom(parts.run_dir, self.step + 1, rank=self.ctx.rank if self.ctx.enabled else None)
        self._emit(MemorySnapshot(self.step, self.epoch, path=path, reason="" if path else parts.snapshots.reason))

    def _set_shape(self, micro_batch: int, accum: int) -> None:
        """A smaller micro-batch after an out-of-memory error (here or on another rank)."""
        s = self.settings
        self.settings = s.with_(micro_batch=micro_batch, accum=accum)
        self._emit(OomRecovered(self.step, self.epoch, s.micro_batch, s.accum, micro_batch, accum))

    def drop_window_grads(self) -> None:
        """Forget a window that will not be stepped: its gradients and any fp16 inf checks."""
        parts = self.parts
        parts.optimizer.zero_grad(set_to_none=True)
        if parts.scaler is not None:
            parts.scaler._per_optimizer_states.clear()  # noqa: SLF001 - no public reset exists

    def _drain(self) -> None:
        while self._in_flight:
            self._report(self._in_flight.popleft())

    def _report(self, launched: Launched) -> None:
        """A finished step's numbers become events: metrics, alerts, agreement, stop."""
        nums = launched.flight.numbers()
        if self.ctx.enabled:
            self._agree(nums)
        parts, p = self.parts, self.progress
        skip = skip_kind(nums, parts.scaler)
        p.scaler_skips += skip == "scaler"
        p.nonfinite_steps += skip == "nonfinite"
        self._emit_all(skip_events(launched, nums, skip, parts, self.config.nonfinite))
        m = step_metrics(launched, nums, skip)
        self._emit(m)
        if not skip:
            self._losses.append(m.loss)
            p.add_loss(m.loss, nums.count)
        for w in self.watchers:
            self._emit_all(w.on_step(m, self.settings))
        if self.autopilot is not None and skip != "scaler":
            self.autopilot.observe(m.step, m.loss, skip == "nonfinite")
        if skip == "nonfinite" and self.config.nonfinite == "stop":
            self._drain()
            raise NonFiniteStop(f"non-finite loss or gradient at step {launched.step}: stopped with the last "
                                "good weights saved (--nonfinite stop)")

    def _agree(self, nums: WindowNumbers) -> None:
        """torchrun: every rank takes the same stop decision and the same (smallest) micro-batch."""
        if nums.stop_any:
            self._stop_agreed = True
        if nums.step_commands_any:
            self._step_commands_agreed = True
        if nums.min_micro < self.settings.micro_batch:  # another rank ran out of memory and fell back
            self._set_shape(*smaller_shape(self.settings.micro_batch, self.settings.accum, nums.min_micro))

    # -- checkpoints, failure, finish -------------------------------------------------------------
    def _save_checkpoint(self, epoch_done: Optional[int] = None, step_checkpoint: bool = False) -> None:
        """Checkpoints: saving.py (the autopilot's targets, rotation, a full disk named)."""
        if self.step == 0:
            return
        self._drain()  # every step launched is reported (and counted) before it is saved
        if self.store is not None:
            self.store.commit()  # metrics first: run.db never lags behind a checkpoint
        path = self.saver.save(self.progress, self.settings, epoch_done, step_checkpoint)
        if path is not None:
            self._emit(CheckpointSaved(self.step, self.epoch, path=path))

    def _fail(self, e: BaseException) -> None:
        msg, detail = failure_report(e, self.ctx, (TrainingError,))  # a peer's own, or ours told to rank 0
        try:
            # StepNotRedoable: that rank's state is half-stepped. Sharded: saving needs every rank, and
            # some may be gone: the last checkpoint is kept. CheckpointFailed: saving is what failed.
            if self.step > 0 and not isinstance(e, (StepNotRedoable, CheckpointFailed)) \
                    and not self.parts.window.strategy.sharded:
                self._save_checkpoint()
        except Exception as save_error:  # the disk may be the problem: say so, keep the old checkpoint
            msg += f" (checkpoint not written: {save_error})"
        self._emit(RunFailed(self.step, self.epoch, error=msg, detail=detail), safe=True)
        self._finish("failed", safe=True)

    def _finish(self, status: str, safe: bool = False) -> None:
        if self.notifier is not None:  # the last message goes, or its failure is written, before run.db closes
            self.notifier.close()
            self._notify_failure()
        try:
            if self.store is not None:
                closing.close_inbox(self.inbox, self.ctx, self.step, self.epoch)
                self.store.set_info(status=status, finished=time.time(), step=self.step)
                store, self.store = self.store, None
                self.inbox.store = None
                if not store.close():  # what did not reach disk is said, and the exit code says it too
                    self._store_lost = store.lost
                self._drain_store_problems()  # the writer's last words (a loss, run.db written back)
        except Exception:
            if not safe:
                raise
        finally:
            closing.release(self.parts, self.ctx, clean=status == "finished")

    # -- events ---------------------------------------------------------------------------
    def _emit(self, event: Event, safe: bool = False) -> None:
        try:
            if self.store is not None:
                self.store.record(event)
        except Exception:
            if not safe:
                raise
        if self.sink is not None and self.ctx.is_main:
            self.sink(event)
        if self.notifier is not None:
            self.notifier.on_event(event)  # queued: the sending happens on the notifier's thread
            self._notify_failure()

    def _notify_failure(self) -> None:
        failed = self.notifier.failure(self.step, self.epoch) if self.notifier is not None else None
        if failed is not None:  # once a run: the notifier gives it only once
            self._emit(failed, safe=True)

    def _drain_store_problems(self) -> None:
        while self._store_problems:
            self._emit(StoreProblem(self.step, self.epoch, problem=self._store_problems.pop(0)))

    def _emit_all(self, events: Sequence[Event]) -> None:
        for e in events:
            self._emit(e)
