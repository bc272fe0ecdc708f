"""Events the engine emits: frozen dataclasses of plain Python values, no tensors.

Every event has `step` (optimizer steps done when it happened) and `epoch`.
`kind` is the name stored in run.db's `events` table and printed by `--json`.
Torch-free: the app imports this at start-up.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Optional

from ._declare import SETTING
from .config import TrainConfig, value_type


@dataclass(frozen=True)
class Event:
    step: int
    epoch: int
    kind: ClassVar[str] = "event"

    def message(self) -> str:
        return self.kind

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kind"] = self.kind
        return d


@dataclass(frozen=True)
class RunStarted(Event):
    run_dir: str
    task: str
    device: str
    device_name: str
    torch_version: str
    world_size: int
    resumed: bool  # continues from a checkpoint: its own (a resume) or its parent's (a fork)
    config: dict[str, Any] = field(default_factory=dict)
    forked_from: str = ""  # a fork: the parent's DIR@CHECKPOINT ("" for a new run or a resume)
    kind: ClassVar[str] = "run_started"

    def message(self) -> str:
        how = f"forked from {self.forked_from}:" if self.forked_from else "resumed" if self.resumed else "started"
        return f"{how} {self.task} on {self.device_name} ({self.device}), world size {self.world_size}"


def _with_setting_columns(cls: type) -> type:
    """A column for every per-step setting (a TrainConfig field declared `per_step=True`) that
    StepMetrics does not name itself: the value the step trained with, None where the row's
    writer does not know it (an integration). Added before @dataclass makes the fields."""
    notes = cls.__dict__["__annotations__"]
    added = []
    for f in fields(TrainConfig):
        declared = f.metadata.get(SETTING)
        if declared is not None and declared.per_step and f.name not in notes:
            notes[f.name] = f"Optional[{value_type(f.name).__name__}]"
            setattr(cls, f.name, None)
            added.append(f.name)
    cls.setting_columns = tuple(added)  # type: ignore[attr-defined]  # a class attribute added to the decorated class
    return cls


@dataclass(frozen=True)
@_with_setting_columns
class StepMetrics(Event):
    """One optimizer step (one accumulation window). After the fields below, a column per
    other per-step setting (_with_setting_columns)."""
    loss: float
    grad_norm: float  # total norm before clipping
    clipped: bool
    lr: float
    accum: int  # micro-batches in this window (per rank)
    clip: float
    micro_batch: int
    samples: int  # samples in the window, all ranks
    tokens: int  # the loss's count for the window, all ranks
    step_time: float  # seconds, wall clock
    throughput: float  # counted items (tokens or samples) per second
    nonfinite: bool
    scaler_skipped: bool
    mem_allocated: Optional[int] = None
    mem_reserved: Optional[int] = None
    mem_peak: Optional[int] = None
    mem_used: Optional[int] = None  # NVML: whole device, all processes
    mem_total: Optional[int] = None
    mem_params: Optional[int] = None  # bytes of every parameter tensor, frozen ones too
    mem_grads: Optional[int] = None  # bytes of the gradients held at the window's end, before zeroing
    mem_optimizer: Optional[int] = None  # bytes of the optimizer's state tensors
    mem_activations: Optional[int] = None  # CUDA: the window's peak minus the three above; None on CPU
    kind: ClassVar[str] = "step"
    setting_columns: ClassVar[tuple[str, ...]] = ()  # the columns of the other per-step settings (set below)

    def message(self) -> str:
        return f"loss {self.loss:.4g} norm {self.grad_norm:.3g}"


@dataclass(frozen=True)
class EpochEnd(Event):
    train_loss: float
    val_loss: Optional[float]
    seconds: float
    kind: ClassVar[str] = "epoch_end"

    def message(self) -> str:
        val = "n/a" if self.val_loss is None else f"{self.val_loss:.4g}"
        return f"epoch {self.epoch} done: train loss {self.train_loss:.4g}, val loss {val}"


@dataclass(frozen=True)
class NonFinite(Event):
    params: tuple[str, ...]  # parameters whose gradients were not finite
    loss_finite: bool
    action: str  # "skipped" or "stopped"
    kind: ClassVar[str] = "nonfinite"

    def message(self) -> str:
        where = ", ".join(self.params[:6]) + (" ..." if len(self.params) > 6 else "")
        what = "gradient" if self.loss_finite else "loss"
        return f"non-finite {what} at step {self.step}, {self.action}; parameters: {where or 'none (loss only)'}"


@dataclass(frozen=True)
class ScalerSkip(Event):
    scale: float
    kind: ClassVar[str] = "scaler_skip"

    def message(self) -> str:
        return f"fp16 overflow: GradScaler skipped step {self.step}, scale now {self.scale:g}"


@dataclass(frozen=True)
class SettingsApplied(Event):
    changes: tuple[tuple[str, Any, Any], ...]  # (name, old, new)
    at: str = "epoch"  # the boundary it was applied at: "epoch" or "step"
    from_step: int = 0  # the first optimizer step trained with the new settings
    by_rule: tuple[str, ...] = ()  # the settings the lr scaling rule changed (nobody asked for them)
    kind: ClassVar[str] = "settings_applied"

    def message(self) -> str:
        where = f" (from step {self.from_step})" if self.from_step else ""
        return "; ".join(f"{n} {o} -> {v}" + (" (by the lr scaling rule)" if n in self.by_rule else "")
                         for n, o, v in self.changes) + where


@dataclass(frozen=True)
class CommandRefused(Event):
    command: str
    reason: str
    kind: ClassVar[str] = "command_refused"

    def message(self) -> str:
        return f"{self.command} refused: {self.reason}"


@dataclass(frozen=True)
class CommandReceived(Event):
    """The engine took a command in and says when it will act on it: the app shows this,
    it never works the boundary out itself."""
    command: str  # the command's kind, e.g. "set_accum"
    payload: dict[str, Any]  # the command's fields
    applies: str  # "epoch" (next epoch boundary), "step" (next optimizer step) or "now" (stop)
    target_epoch: Optional[int]  # the epoch it applies from, for applies == "epoch"
    kind: ClassVar[str] = "command_received"

    def message(self) -> str:
        when = {"epoch": f"at epoch {self.target_epoch}", "step": "at the next step", "now": "now"}
        sender = self.payload.get("sent_by") if isinstance(self.payload, dict) else None  # Command.sent_by
        by = f" (sent by {'an agent' if sender == 'agent' else sender})" if isinstance(sender, str) and sender else ""
        return f"{self.command} received{by}: applies {when.get(self.applies, self.applies)}"


@dataclass(frozen=True)
class LrPlanned(Event):
    """The lr schedule ahead of the run (over samples seen), so the app can draw it dashed.
    Emitted at the start and whenever the peak changes."""
    schedule: str
    peak: float
    warmup_samples: float
    total_samples: float
    min_lr_ratio: float
    samples_now: int
    curve: tuple[tuple[float, float], ...]  # (samples seen, lr)
    # The run's length changed while it trained: the schedule was re-planned for the new
    # total_samples at samples_now (False: the plan made at the start, or a new peak).
    replanned: bool = False
    kind: ClassVar[str] = "lr_planned"

    def message(self) -> str:
        head = (f"lr schedule {self.schedule}: peak {self.peak:.3g}, warmup {self.warmup_samples:.0f} of "
                f"{self.total_samples:.0f} samples")
        if not self.replanned:
            return head
        if self.schedule == "constant":
            return f"{head} (re-planned at {self.samples_now} samples: the run's length changed)"
        return (f"{head} (re-planned at {self.samples_now} samples for the new length: the samples trained keep "
                f"their lr, the warmup its length, and from here the {self.schedule} decay ends at "
                f"{self.min_lr_ratio:g} x peak at sample {self.total_samples:.0f})")


@dataclass(frozen=True)
class LrHint(Event):
    accum_old: int
    accum_new: int
    suggested_lr: float
    kind: ClassVar[str] = "lr_hint"

    def message(self) -> str:
        return (f"accumulation changed {self.accum_old} -> {self.accum_new} with lr unchanged; "
                f"the linear rule would give lr {self.suggested_lr:.3g}")


@dataclass(frozen=True)
class ClipSaturation(Event):
    fraction: float
    window: int
    clip: float
    kind: ClassVar[str] = "clip_saturation"

    def message(self) -> str:
        return (f"{self.fraction:.0%} of the last {self.window} steps were clipped at {self.clip:g}: "
                "the clip norm may be too low")


@dataclass(frozen=True)
class VramLow(Event):
    used: int
    total: int
    headroom: float
    kind: ClassVar[str] = "vram_low"

    def message(self) -> str:
        return f"GPU memory headroom {self.headroom:.0%} ({(self.total - self.used) / 2**30:.1f} GiB free)"


@dataclass(frozen=True)
class BatchNormSmallBatch(Event):
    micro_batch: int
    kind: ClassVar[str] = "batchnorm_small_batch"

    def message(self) -> str:
        return (f"BatchNorm in train mode sees micro-batches of {self.micro_batch}: its statistics come "
                "from the micro-batch, not the accumulation window")


@dataclass(frozen=True)
class OomRecovered(Event):
    old_micro_batch: int
    old_accum: int
    new_micro_batch: int
    new_accum: int
    kind: ClassVar[str] = "oom_recovered"

    def message(self) -> str:
        return (f"out of memory: micro-batch {self.old_micro_batch} x {self.old_accum} -> "
                f"{self.new_micro_batch} x {self.new_accum}, window redone")


@dataclass(frozen=True)
class MicroBatchFound(Event):
    micro_batch: int
    accum: int
    probes: int
    peak_bytes: int
    kind: ClassVar[str] = "micro_batch_found"

    def message(self) -> str:
        return (f"largest micro-batch that fits: {self.micro_batch}, accumulation {self.accum} "
                f"({self.probes} probes)")


@dataclass(frozen=True)
class MemoryForecast(Event):
    """From the peaks measured so far: the largest micro-batch predicted to fit."""
    micro_batch_max: int
    accum_for_effective: int  # accumulation that keeps the current effective batch
    effective_batch: int
    capacity: int  # bytes this process may use (the --vram-limit cap, or total minus others)
    fixed_bytes: int  # weights, gradients, optimizer state, workspace
    per_sample_bytes: int  # activations per sample at this precision
    precision: str
    kind: ClassVar[str] = "memory_forecast"

    def message(self) -> str:
        return (f"fits: micro-batch up to {self.micro_batch_max} (x{self.accum_for_effective} for effective "
                f"batch {self.effective_batch}); {self.per_sample_bytes / 2**20:.1f} MiB per sample in "
                f"{self.precision}")


@dataclass(frozen=True)
class MemoryLevers(Event):
    """The "what fits" table (engine/memory/what_fits/levers.py): one row per (micro-batch, precision,
    checkpointing) with the predicted peak, whether it fits, the accumulation that keeps the
    effective batch, and where the number comes from (measured, fit, extrapolated, unknown).
    Emitted on CUDA when a new micro-batch size or state was measured."""
    capacity: Optional[int]
    usable: Optional[int]
    rows: tuple[tuple[int, str, bool, Optional[int], Optional[bool], int, str, bool, bool], ...]
    # (micro_batch, precision, checkpointing, predicted_peak, fits, accum, source, current, available)
    notes: tuple[str, ...] = ()
    # The sharding levers this machine allows, estimates (engine/memory/what_fits/sharding.py ShardingRow.to_row):
    # (world, fsdp_reduce, cpu_offload, micro_batch, accum, predicted_peak, fits, largest, host_bytes,
    #  current, basis). Absent from runs before them.
    sharding: tuple[tuple[Any, ...], ...] = ()
    kind: ClassVar[str] = "memory_levers"

    def message(self) -> str:
        fits = sum(1 for r in self.rows if r[4])
        more = f"; {len(self.sharding)} sharding estimates" if self.sharding else ""
        return f"what fits: {fits} of {len(self.rows)} micro-batch x precision x checkpointing cells{more}"


@dataclass(frozen=True)
class MemorySnapshot(Event):
    """An out-of-memory error with --memory-snapshot on-oom: the allocator's history, for
    pytorch.org/memory_viz, or why none was written."""
    path: Optional[str]
    reason: str = ""
    kind: ClassVar[str] = "memory_snapshot"

    def message(self) -> str:
        if self.path:
            return f"memory snapshot at the out-of-memory error: {self.path} (open it at pytorch.org/memory_viz)"
        return f"no memory snapshot: {self.reason}"


@dataclass(frozen=True)
class RolledBack(Event):
    """The autopilot restored the newest good checkpoint: `step` is the step it went back to."""
    from_step: int  # the step at which the trouble was seen
    to_step: int
    reason: str  # "nonfinite" or "spike"
    new_lr: float  # the lr peak from here on
    windows_skipped: int  # windows trained since to_step, now discarded (their data is skipped)
    kind: ClassVar[str] = "rolled_back"

    def message(self) -> str:
        return (f"rolled back from step {self.from_step} to step {self.to_step} ({self.reason}): lr peak "
                f"{self.new_lr:.3g}, {self.windows_skipped} windows skipped")


@dataclass(frozen=True)
class NotifyFailed(Event):
    """A --notify message was not delivered (said once a run; the run goes on, at full speed)."""
    reason: str
    kind: ClassVar[str] = "notify_failed"

    def message(self) -> str:
        return f"notification not sent: {self.reason}"


@dataclass(frozen=True)
class StoreProblem(Event):
    """Something on disk is not as it should be, and the run goes on: run.db busy or failing
    (rows kept in memory until it takes them), or a damaged checkpoint passed over."""
    problem: str
    kind: ClassVar[str] = "store_problem"

    def message(self) -> str:
        return self.problem


@dataclass(frozen=True)
class Paused(Event):
    kind: ClassVar[str] = "paused"

    def message(self) -> str:
        return f"paused after epoch {self.epoch}"


@dataclass(frozen=True)
class Unpaused(Event):
    """A paused run goes on. (A run continued with --resume DIR says so in run_started.)"""
    kind: ClassVar[str] = "unpaused"

    def message(self) -> str:
        return "unpaused"


Resumed = Unpaused  # the old name; run.db rows of kind "resumed" (OLD_KINDS) mean the same
# Event kinds older versions wrote, and what they are called now.
OLD_KINDS: dict[str, str] = {"resumed": "unpaused"}


@dataclass(frozen=True)
class CheckpointSaved(Event):
    path: str
    kind: ClassVar[str] = "checkpoint"

    def message(self) -> str:
        return f"checkpoint {self.path}"


@dataclass(frozen=True)
class RunFinished(Event):
    reason: str  # completed | max_steps | stopped | nonfinite
    kind: ClassVar[str] = "run_finished"

    def message(self) -> str:
        return f"run finished ({self.reason}) at step {self.step}"


@dataclass(frozen=True)
class RunFailed(Event):
    error: str  # one line: the cause and where it was raised
    detail: str = ""  # the full traceback (a DataLoader worker's own inside it), for run.db
    kind: ClassVar[str] = "run_failed"

    def message(self) -> str:
        return self.error


class EventBuffer:
    """Thread-safe hand-off from the training thread to a reader (the GUI's timer).

    `put` is called on the training thread; `drain` on the reader's. No signal per
    event: the reader polls at its own rate and takes everything at once. Each event is
    stamped with the wall time it was put (`drain_stamped`): a reader that drains many at
    once (a busy GUI, a fast run) still knows when each happened.
    """

    def __init__(self) -> None:
        self._items: deque[tuple[float, Event]] = deque()
        self._lock = threading.Lock()

    def put(self, event: Event) -> None:
        stamped = (time.time(), event)
        with self._lock:
            self._items.append(stamped)

    __call__ = put

    def drain_stamped(self) -> list[tuple[float, Event]]:
        """Everything put since the last drain, as (wall time put, event), in order."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items

    def drain(self) -> list[Event]:
        return [e for _, e in self.drain_stamped()]

    def __len__(self) -> int:
        return len(self._items)
