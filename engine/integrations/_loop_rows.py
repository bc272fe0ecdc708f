"""The rows a training loop's steps and epochs become (behind `HeadroomRun.log_step` and co.).

`StepRows` turns what a loop knows about an optimizer step (tensors or floats, defaults
left out) into one `StepMetrics` row with the device's memory figures, times the steps,
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
from ._loop_events import IntegrationError, LossWeighting

if TYPE_CHECKING:  # torch-free at import: the check is built by the adapters
    from ._exactness import WindowCheck

GAP_NOTE = 1e-3  # relative gap between the framework's loss and the token-weighted one worth an event


def _num(v: Any, what: str, allow_none: bool = True) -> Optional[float]:
    """A float from a float, int or 0-d tensor (read to the host here)."""
    if type(v) is float:  # the per-step fast path
        return v
    if v is None:
        if allow_none:
            return None
        raise IntegrationError(f"log_step: {what} is required")
    if isinstance(v, bool):
        raise IntegrationError(f"log_step: {what} must be a number, got {v!r}")
    if isinstance(v, (int, float)):
        return float(v)
    item = getattr(v, "item", None)
    if callable(item) and getattr(v, "numel", lambda: 1)() == 1:
        return float(item())
    raise IntegrationError(f"log_step: {what} must be a number or a one-element tensor, got {type(v).__name__}")


def _int(v: Any, what: str, minimum: int = 0) -> Optional[int]:
    if type(v) is int and v >= minimum:  # the per-step fast path
        return v
    if v is None:
        return None
    if not isinstance(v, bool):
        item = getattr(v, "item", None)
        if callable(item) and not isinstance(v, int):
            v = item()
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, int) and v >= minimum:
            return int(v)
    raise IntegrationError(f"{what} must be an integer >= {minimum}, got {v!r}")


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

    Writes through the run's store and keeps the run's `step` and `epoch` current."""

    def __init__(self, run: Any) -> None:  # the HeadroomRun (engine.integrations.loop)
        self.run = run
        self.probe: Any = None  # the device's MemoryProbe, while the run is open
        self.cuda = False
        self.t_last = 0.0  # perf_counter when the last step ended (or the start, a reset)
        self.epoch_t0 = 0.0
        self._epoch_sum = 0.0
        self._epoch_count = 0.0
        self._gap_first = False
        self._gap_epoch: Optional[_Gap] = None  # this epoch's largest gap
        self.last: Optional[StepMetrics] = None  # the last row written
        self.watchers: list[Any] = []  # the engine's watchers that need only the rows (engine.loop.watchers)

    def open(self, device: Any) -> None:
        from engine.declarations.config import TrainConfig
        from engine.loop.watchers import ClipSaturationWatcher, VramLowWatcher
        from engine.memory.telemetry import MemoryProbe
        self.probe = MemoryProbe(device)
        self.cuda = device.type == "cuda"
        # The engine's alerts that follow from the rows alone: every step clipped (the clip is too
        # low), the device's memory running out. The others need the engine's model and settings.
        self.watchers = [ClipSaturationWatcher(), VramLowWatcher(TrainConfig.vram_low_fraction)]

    def start_timers(self) -> None:
        self.t_last = self.epoch_t0 = time.perf_counter()

    def close(self) -> None:
        if self.probe is not None:
            self.probe.close()

    # -- steps ----------------------------------------------------------------------------------------
    def log_step(self, loss: Any, *, grad_norm: Any, lr: Any, accum: int, micro_batch: Optional[int],
                 samples: Optional[int], tokens: Optional[int], clip: Any, clipped: Optional[bool],
                 step_time: Optional[float], nonfinite: Optional[bool], scaler_skipped: bool,
                 epoch: Optional[int], step: Optional[int], framework_loss: Optional[float],
                 bad_params: tuple[str, ...], nonfinite_action: str) -> StepMetrics:
        """HeadroomRun.log_step: the checks and defaults, then record_step."""
        run = self.run
        if run._store is None:
            run._need_store()
        now = time.perf_counter()
        loss_f = loss if type(loss) is float else _num(loss, "loss", allow_none=False)
        norm = grad_norm if grad_norm is None or type(grad_norm) is float else _num(grad_norm, "grad_norm")
        lr_f = lr if lr is None or type(lr) is float else _num(lr, "lr")
        clip_f = clip if type(clip) is float else (_num(clip, "clip") or 0.0)
        accum_i = accum if type(accum) is int and accum >= 1 else _int(accum, "accum", 1)
        samples_i = samples if samples is None or type(samples) is int else _int(samples, "samples")
        micro_i = micro_batch if micro_batch is None or type(micro_batch) is int else _int(micro_batch, "micro_batch", 1)
        world = run.world_size
        if micro_i is None and samples_i is not None:
            micro_i = max(1, samples_i // max(1, accum_i * world))
        if samples_i is None and micro_i is not None:
            samples_i = micro_i * accum_i * world
        tokens_i = tokens if tokens is None or type(tokens) is int else _int(tokens, "tokens")
        if tokens_i is None:
            tokens_i = samples_i
        if step_time is None:
            step_time = now - self.t_last
        elif not isinstance(step_time, (int, float)) or isinstance(step_time, bool) or step_time < 0:
            raise IntegrationError(f"log_step: step_time must be seconds >= 0, got {step_time!r}")
        isfinite = math.isfinite
        norm_ok = norm is None or isfinite(norm)
        if nonfinite is None:
            nonfinite = not (isfinite(loss_f) and norm_ok) and not scaler_skipped
        if clipped is None:
            clipped = clip_f > 0 and norm is not None and norm_ok and norm > clip_f
        step_i = run.step + 1 if step is None else _int(step, "step", 1)
        epoch_i = run.epoch if epoch is None else _int(epoch, "epoch", 1)
        self.t_last = now
        return self.record_step(step=step_i, epoch=epoch_i, loss=loss_f, grad_norm=norm, lr=lr_f, accum=accum_i,
                                clip=clip_f, micro_batch=micro_i, samples=samples_i, tokens=tokens_i,
                                step_time=float(step_time), clipped=bool(clipped), nonfinite=bool(nonfinite),
                                scaler_skipped=bool(scaler_skipped), framework_loss=framework_loss,
                                bad_params=bad_params, nonfinite_action=nonfinite_action)

    def record_step(self, *, step: int, epoch: int, loss: float, grad_norm: Optional[float], lr: Optional[float],
                    accum: int, clip: float, micro_batch: Optional[int], samples: Optional[int],
                    tokens: Optional[int], step_time: float, clipped: bool, nonfinite: bool, scaler_skipped: bool,
                    framework_loss: Optional[float] = None, bad_params: tuple[str, ...] = (),
                    nonfinite_action: str = "not skipped (the optimizer stepped)",
                    check: "Optional[WindowCheck]" = None) -> StepMetrics:
        """HeadroomRun.record_step: one metrics row of plain values (and a nonfinite event)."""
        run = self.run
        store = run._store
        if store is None:
            store = run._need_store()
        run.step, run.epoch = step, epoch
        if self.cuda:
            mem = self.probe.sample()
            import torch
            torch.cuda.reset_peak_memory_stats(self.probe.device)  # mem_peak: this window's peak
        else:
            mem = _NO_MEMORY
        count = tokens or 0
        event = StepMetrics(step, epoch, loss=loss, grad_norm=grad_norm, clipped=clipped, lr=lr, accum=accum,
                            clip=clip, micro_batch=micro_batch, samples=samples, tokens=tokens, step_time=step_time,
                            throughput=(count / step_time) if step_time > 0 and count else 0.0,
                            nonfinite=nonfinite, scaler_skipped=scaler_skipped, mem_allocated=mem.allocated,
                            mem_reserved=mem.reserved, mem_peak=mem.peak, mem_used=mem.used, mem_total=mem.total)
        store.record(event)
        self.last = event
        for w in self.watchers:
            for alert in w.on_step(event, None):
                store.record(alert)
        loss_ok = math.isfinite(loss)
        if nonfinite:
            store.record(NonFinite(step, epoch, params=tuple(bad_params), loss_finite=loss_ok,
                                   action=nonfinite_action))
        elif not scaler_skipped and loss_ok:
            w = float(count) if count else 1.0
            self._epoch_sum += loss * w
            self._epoch_count += w
            self._note(framework_loss, loss, check)
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
            self.run.record(note)
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
        run = self.run
        if g is not None and run._store is not None:
            run.record(dataclasses.replace(g.event, steps=g.steps, epoch_summary=True))

    # -- epochs ---------------------------------------------------------------------------------------
    def log_epoch(self, val_loss: Any, train_loss: Any, seconds: Optional[float],
                  epoch: Optional[int]) -> EpochEnd:
        """HeadroomRun.log_epoch: the epochs row; the next epoch begins."""
        run = self.run
        store = run._need_store()
        now = time.perf_counter()
        ep = run.epoch if epoch is None else _int(epoch, "epoch", 1)
        tl = _num(train_loss, "train_loss")
        if tl is None:
            tl = self._epoch_sum / self._epoch_count if self._epoch_count else float("nan")
        vl = _num(val_loss, "val_loss")
        event = EpochEnd(run.step, ep, train_loss=tl, val_loss=vl,
                         seconds=float(now - self.epoch_t0 if seconds is None else seconds))
        self.flush_epoch_gap()
        store.record(event)
        run.epoch = ep + 1
        self._epoch_sum = self._epoch_count = 0.0
        self.epoch_t0 = self.t_last = time.perf_counter()
        return event

    # -- timing ---------------------------------------------------------------------------------------
    def lap(self) -> float:
        now = time.perf_counter()
        dt, self.t_last = now - self.t_last, now
        return dt

    def reset_timer(self) -> None:
        self.t_last = time.perf_counter()
