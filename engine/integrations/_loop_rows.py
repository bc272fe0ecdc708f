"""The rows a training loop's steps and epochs become (behind `HeadroomRun.log_step` and co.).

`StepRows` writes a step's record (engine.integrations._step_record: what a loop knows about
an optimizer step, checked) as one `StepMetrics` row with the device's memory figures, times the steps,
keeps the epoch's count-weighted loss for its `epochs` row, and raises `LossWeighting` when
a step's update is off the exact one (an adapter's `WindowCheck`, engine.integrations._exactness)
or, for a plain loop that gives only its framework's loss, when the two loss values differ:
at the first such step, and at the end of every epoch that had one.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from engine.declarations.events import EpochEnd, NonFinite, StepMetrics
from engine.store import RunStore

from ._loop_events import LossWeighting
from ._step_record import StepRecord, integer, number

if TYPE_CHECKING:  # torch-free at import: the check is built by the adapters
    from ._exactness import WindowCheck

GAP_NOTE = 1e-3  # relative gap between the framework's loss and the token-weighted one worth an event


def read_to_host(tensors: list[Any]) -> list[float]:
    """The values of 0-d (or one-element) tensors, read to the host at once: the adapters'
    one sync for the losses and counts of a batch of steps."""
    if not tensors:
        return []
    import torch
    try:
        return torch.stack(tensors).tolist()
    except (RuntimeError, TypeError):  # mixed devices, dtypes or shapes
        dev = tensors[0].device
        return torch.stack([t.detach().float().reshape(()).to(dev) for t in tensors]).tolist()


@dataclass
class _Gap:
    """The epoch's largest error of a step against the exact one."""
    size: float  # what "largest" compares: the update's relative error, else the weights' or the loss gap
    event: LossWeighting  # that step's note
    steps: int  # steps of the epoch off the exact update


class _NoMemory:  # the figures of a CPU run (MemoryProbe gives the same: all None)
    allocated = reserved = peak = used = total = None


_NO_MEMORY = _NoMemory()


class StepRows:
    """The metrics and epochs rows of one HeadroomRun: its steps' timing, memory and losses.

    Writes through the store given to open() and keeps the run's `step` and `epoch` current."""

    def __init__(self, run: Any) -> None:  # the HeadroomRun (engine.integrations.loop)
        self.run = run
        self.store: Optional[RunStore] = None  # the run's, while it is open (set by HeadroomRun)
        self.probe: Any = None  # the device's MemoryProbe, while the run is open
        self.cuda = False
        self.t_last = 0.0  # perf_counter when the last step ended (or the start, a reset)
        self.epoch_t0 = 0.0
        self._epoch_sum = 0.0
        self._epoch_count = 0.0
        self._gap_first = False
        self._gap_epoch: Optional[_Gap] = None  # this epoch's largest gap
        self.last: Optional[StepMetrics] = None  # the last row written
        self.watchers: list[Any] = []  # the engine's watchers that need only the rows (engine.trainer.watchers)

    def open(self, device: Any) -> None:
        from engine.declarations.config import TrainConfig
        from engine.memory.telemetry import MemoryProbe
        from engine.trainer.watchers import ClipSaturationWatcher, VramLowWatcher
        self.probe = MemoryProbe(device)
        self.cuda = device.type == "cuda"
        # The engine's alerts that follow from the rows alone: every step clipped (the clip is too
        # low), the device's memory running out. The others need the engine's model and settings.
        self.watchers = [ClipSaturationWatcher(), VramLowWatcher(TrainConfig.vram_low_fraction)]

    def start_timers(self) -> None:
        self.t_last = self.epoch_t0 = time.perf_counter()

    def close(self) -> None:
        self.store = None
        if self.probe is not None:
            self.probe.close()

    # -- steps ----------------------------------------------------------------------------------------
    def write(self, r: StepRecord, check: "Optional[WindowCheck]" = None) -> StepMetrics:
        """One metrics row (and a nonfinite event) for the record; `check`: the step against the
        exact one, if an adapter measured it (engine.integrations._exactness.WindowCheck)."""
        run = self.run
        store = self.store
        if store is None:
            store = run.store  # raises: not started, or finished
        step, epoch, loss = r.step, r.epoch, r.loss
        run.step, run.epoch = step, epoch
        if self.cuda:
            mem = self.probe.sample()
            import torch
            torch.cuda.reset_peak_memory_stats(self.probe.device)  # mem_peak: this window's peak
        else:
            mem = _NO_MEMORY
        count = r.tokens or 0
        step_time = r.step_time
        event = StepMetrics(step, epoch, loss=loss, grad_norm=r.grad_norm, clipped=bool(r.clipped), lr=r.lr,  # type: ignore[arg-type]  # None: the loop did not say (NULL in run.db)
                            accum=r.accum, clip=r.clip, micro_batch=r.micro_batch, samples=r.samples, tokens=r.tokens,  # type: ignore[arg-type]  # as above
                            step_time=step_time, throughput=(count / step_time) if step_time > 0 and count else 0.0,
                            nonfinite=bool(r.nonfinite), scaler_skipped=r.scaler_skipped, mem_allocated=mem.allocated,
                            mem_reserved=mem.reserved, mem_peak=mem.peak, mem_used=mem.used, mem_total=mem.total)
        store.record(event)
        self.last = event
        for w in self.watchers:
            for alert in w.on_step(event, None):
                store.record(alert)
        loss_ok = math.isfinite(loss)
        if r.nonfinite:
            store.record(NonFinite(step, epoch, params=tuple(r.bad_params), loss_finite=loss_ok,
                                   action=r.nonfinite_action))
        elif not r.scaler_skipped and loss_ok:
            w = float(count) if count else 1.0
            self._epoch_sum += loss * w
            self._epoch_count += w
            self._note(r.framework_loss, loss, check)
        return event

    def _note(self, fw: Optional[float], weighted: float, check: "Optional[WindowCheck]") -> None:
        """A LossWeighting note for a step off the exact one: written at the first, and kept for
        the epoch's summary when it is the epoch's largest."""
        fw = float(fw) if fw is not None and math.isfinite(fw) else None
        gap = (fw - weighted) / abs(weighted) if fw is not None and weighted != 0 else None
        if check is not None:
            if not check.off:
                return
            spread = max((abs(r - 1.0) for r in check.ratios), default=0.0)
            size = check.grad_error if check.grad_error is not None else spread
            weights = (min(check.ratios), max(check.ratios)) if check.measured == "weights" and check.ratios else ()
            note = LossWeighting(self.run.step, self.run.epoch, framework_loss=fw, weighted_loss=weighted, gap=gap,
                                 steps=1, grad_error=check.grad_error, grad_scale=check.grad_scale,
                                 measured=check.measured, weights=weights, cause=check.cause, fix=check.fix)
        else:  # a plain loop's framework loss: the loss values only
            if gap is None or abs(gap) <= GAP_NOTE:
                return
            size = abs(gap)
            note = LossWeighting(self.run.step, self.run.epoch, framework_loss=fw, weighted_loss=weighted, gap=gap,
                                 steps=1)
        if not self._gap_first:
            self._gap_first = True
            self.run.store.record(note)
        g = self._gap_epoch
        if g is None:
            self._gap_epoch = _Gap(size=size, event=note, steps=1)
        else:
            g.steps += 1
            if size > g.size:
                g.size, g.event = size, note

    def flush_epoch_gap(self) -> None:
        """The epoch's LossWeighting summary (its largest error), for every epoch that had one."""
        g, self._gap_epoch = self._gap_epoch, None
        if g is not None and self.store is not None:
            self.store.record(dataclasses.replace(g.event, steps=g.steps, epoch_summary=True))

    # -- epochs ---------------------------------------------------------------------------------------
    def log_epoch(self, val_loss: Any, train_loss: Any, seconds: Optional[float],
                  epoch: Optional[int]) -> EpochEnd:
        """HeadroomRun.log_epoch: the epochs row; the next epoch begins."""
        run = self.run
        store = run.store
        now = time.perf_counter()
        given = integer(epoch, "epoch", 1)  # None only when not given
        ep = run.epoch if given is None else given
        tl = number(train_loss, "train_loss")
        if tl is None:
            tl = self._epoch_sum / self._epoch_count if self._epoch_count else float("nan")
        vl = number(val_loss, "val_loss")
        event = EpochEnd(run.step, ep, train_loss=tl, val_loss=vl,
                         seconds=float(now - self.epoch_t0 if seconds is None else seconds))
        self.flush_epoch_gap()
        store.record(event)
        run.epoch = ep + 1
        self._epoch_sum = self._epoch_count = 0.0
        self.epoch_t0 = self.t_last = time.perf_counter()
        return event

    # -- timing ---------------------------------------------------------------------------------------
    def since_last(self, now: float) -> float:
        return now - self.t_last

    def restart(self, now: float) -> None:
        """The next step's time runs from `now` (a step just ended)."""
        self.t_last = now

    def lap(self) -> float:
        now = time.perf_counter()
        dt, self.t_last = now - self.t_last, now
        return dt

    def reset_timer(self) -> None:
        self.t_last = time.perf_counter()
