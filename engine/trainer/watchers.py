"""Watchers: small observers that see each step's metrics (and each settings change)
and return the alerts that follow. Like Lightning callbacks, they hold their own
state and never touch the trainer; the run loop passes their events on.
"""
from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Optional, Protocol

import torch

from engine.declarations.events import (
    BatchNormSmallBatch,
    ClipSaturation,
    Event,
    MemoryForecast,
    MemoryLevers,
    StepMetrics,
    VramLow,
)
from engine.declarations.settings import LiveSettings
from engine.memory.what_fits import levers, sharding
from engine.memory.what_fits.forecast import MemoryModel

if TYPE_CHECKING:
    from .setup import RunParts

BN_SMALL_BATCH = 16
CLIP_SATURATION_WINDOW = 50
CLIP_SATURATION_FRACTION = 0.9


class Watcher(Protocol):
    def on_step(self, m: StepMetrics, settings: LiveSettings) -> list[Event]: ...

    def on_settings(self, step: int, epoch: int, settings: LiveSettings, changed: set[str]) -> list[Event]: ...


class _Quiet:
    def on_step(self, m: StepMetrics, settings: LiveSettings) -> list[Event]:
        return []

    def on_settings(self, step: int, epoch: int, settings: LiveSettings, changed: set[str]) -> list[Event]:
        return []


class ClipSaturationWatcher(_Quiet):
    """Most of the last 50 steps clipped: the clip norm is probably too low."""

    def __init__(self) -> None:
        self.recent: deque[bool] = deque(maxlen=CLIP_SATURATION_WINDOW)
        self.last_alert = -CLIP_SATURATION_WINDOW

    def on_step(self, m: StepMetrics, settings: LiveSettings) -> list[Event]:
        if m.clip <= 0 or m.nonfinite:
            return []
        self.recent.append(m.clipped)
        clipped = sum(self.recent)
        if (len(self.recent) == CLIP_SATURATION_WINDOW and m.step - self.last_alert >= CLIP_SATURATION_WINDOW
                and clipped >= CLIP_SATURATION_FRACTION * CLIP_SATURATION_WINDOW):
            self.last_alert = m.step
            return [ClipSaturation(m.step, m.epoch, fraction=clipped / CLIP_SATURATION_WINDOW,
                                   window=CLIP_SATURATION_WINDOW, clip=m.clip)]
        return []


class VramLowWatcher(_Quiet):
    """Device memory headroom fell under a fraction: said once per crossing."""

    def __init__(self, low_fraction: float) -> None:
        self.low_fraction = low_fraction
        self.low = False

    def on_step(self, m: StepMetrics, settings: LiveSettings) -> list[Event]:
        if not m.mem_total or m.mem_used is None:
            return []
        headroom = (m.mem_total - m.mem_used) / m.mem_total
        low = headroom < self.low_fraction
        out: list[Event] = []
        if low and not self.low:
            out.append(VramLow(m.step, m.epoch, used=m.mem_used, total=m.mem_total, headroom=headroom))
        self.low = low
        return out


class MemoryForecastWatcher(_Quiet):
    """'What fits': refit when a new micro-batch size was measured, say so if the answer moved."""

    def __init__(self, model: MemoryModel, vram_limit: Optional[int], margin: float, world: int,
                 precision: str) -> None:
        self.model = model
        self.vram_limit, self.margin, self.world, self.precision = vram_limit, margin, world, precision
        self.key: Optional[tuple[int, int]] = None

    def on_step(self, m: StepMetrics, settings: LiveSettings) -> list[Event]:
        if not m.mem_peak:
            return []
        known = m.micro_batch in self.model.points
        self.model.add(m.micro_batch, m.mem_peak)
        if known and self.key is not None:
            return []
        fit = self.model.fit()
        if fit is None or m.mem_total is None:
            return []
        others = max(0, (m.mem_used or 0) - (m.mem_reserved or 0))  # other processes and the CUDA context
        capacity = int(min(self.vram_limit or m.mem_total, m.mem_total - others))
        best = self.model.largest_fitting(capacity, self.margin) or 0
        eff = settings.micro_batch * settings.accum * self.world
        accum = math.ceil(eff / max(1, best * self.world)) if best else 0
        if (best, accum) == self.key:
            return []
        self.key = (best, accum)
        return [MemoryForecast(m.step, m.epoch, micro_batch_max=best, accum_for_effective=accum,
                               effective_batch=eff, capacity=capacity, fixed_bytes=int(fit[0]),
                               per_sample_bytes=int(fit[1]), precision=self.precision)]


class BatchNormWatcher(_Quiet):
    """BatchNorm in train mode normalises over the micro-batch, not the window: say so when
    the micro-batch is small (at the start and whenever it changes)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def check(self, step: int, epoch: int, settings: LiveSettings) -> list[Event]:
        bn = torch.nn.modules.batchnorm._BatchNorm
        if settings.micro_batch < BN_SMALL_BATCH and any(isinstance(m, bn) and m.training
                                                         for m in self.model.modules()):
            return [BatchNormSmallBatch(step, epoch, micro_batch=settings.micro_batch)]
        return []

    def on_settings(self, step: int, epoch: int, settings: LiveSettings, changed: set[str]) -> list[Event]:
        return self.check(step, epoch, settings) if "micro_batch" in changed else []


class LeversWatcher(_Quiet):
    """The "what fits" table, rebuilt when a (state, micro-batch) was measured for the first
    time. One MemoryModel per (precision, checkpointing) state, so a checkpointing change
    starts its own line instead of bending the old one."""

    def __init__(self, precision: str, world: int, vram_limit: Optional[int], margin: float,
                 effective_batch: Optional[int], layers: Optional[int], can_checkpoint: bool, *,
                 layout: Optional[sharding.Layout] = None, gpus: int = 0) -> None:
        """layout: how the ranks hold the model; gpus: this machine's, for the sharding levers."""
        self.precision, self.world, self.vram_limit, self.margin = precision, world, vram_limit, margin
        self.effective_batch, self.layers, self.can_checkpoint = effective_batch, layers, can_checkpoint
        self.layout, self.gpus = layout or sharding.Layout(world=world), gpus
        self.models: dict[tuple[str, bool], MemoryModel] = {}

    def on_step(self, m: StepMetrics, settings: LiveSettings) -> list[Event]:
        if not m.mem_peak or m.mem_total is None:  # CPU: no peak, no table
            return []
        state = (self.precision, settings.checkpointing)
        model = self.models.setdefault(state, MemoryModel())
        if m.micro_batch in model.points:
            model.add(m.micro_batch, m.mem_peak)
            return []
        model.add(m.micro_batch, m.mem_peak)
        others = max(0, (m.mem_used or 0) - (m.mem_reserved or 0))
        capacity = int(min(self.vram_limit or m.mem_total, m.mem_total - others))
        persistent = (levers.Persistent(params=m.mem_params, grads=m.mem_grads or 0, optimizer=m.mem_optimizer or 0)
                      if m.mem_params is not None else None)
        current = levers.Current(micro_batch=settings.micro_batch, accum=settings.accum, precision=self.precision,
                                 checkpointing=settings.checkpointing, world=self.world,
                                 effective_batch=self.effective_batch)
        table = levers.build_table(self.models, current, capacity=capacity, margin=self.margin,
                                   persistent=persistent, checkpoint=levers.CheckpointModel(layers=self.layers),
                                   can_checkpoint=self.can_checkpoint, layout=self.layout, gpus=self.gpus)
        rows = tuple((c.micro_batch, c.precision, c.checkpointing, c.predicted_peak, c.fits, c.accum, c.source,
                      c.current, c.available) for c in table.cells)
        return [MemoryLevers(m.step, m.epoch, capacity=table.capacity, usable=table.usable, rows=rows,
                             notes=tuple(table.notes), sharding=tuple(r.to_row() for r in table.sharding))]


def run_watchers(parts: "RunParts", memory_model: MemoryModel) -> list[Watcher]:
    """The watchers of a run: clip saturation, low VRAM, the memory forecast (fed by
    `memory_model`, which the micro-batch finder fills too), BatchNorm and the levers table."""
    cfg, world = parts.config, parts.ctx.world
    return [ClipSaturationWatcher(), VramLowWatcher(cfg.vram_low_fraction),
            MemoryForecastWatcher(memory_model, cfg.vram_limit, cfg.memory_margin, world, cfg.precision),
            BatchNormWatcher(parts.model),
            LeversWatcher(cfg.precision, world, cfg.vram_limit, cfg.memory_margin, cfg.effective_batch,
                          parts.switch.layers if parts.switch else None, parts.switch is not None,
                          layout=sharding.Layout(world, parts.window.strategy.name, cfg.fsdp_reduce, cfg.cpu_offload),
                          gpus=torch.cuda.device_count() if parts.device.type == "cuda" else 0)]
