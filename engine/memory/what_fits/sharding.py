"""The "what fits" table's sharding levers: what FSDP over N of this machine's GPUs, FSDP's
reduction on every micro-batch and CPU offload would do to the run's peak memory per GPU.
Estimates from the measured breakdown, never measurements: the table marks them so.

Pure arithmetic, torch-free. The bytes a rank holds besides activations, for a model whose
parameters, gradients and optimizer state take P, G and O bytes whole (engine/distributed/fsdp.py
says why each term is there):

  ddp, or one process      P + G + O                      (a replica; DDP's buckets are the grads)
  fsdp, reduce every       (P + G + O) / N                (+ one block gathered at a time: not counted)
  fsdp, reduce last        (P + G + O) / N + P + G        (whole parameters and gradients through the
                                                           window, beside the shards)
  CPU offload              the shards, (P + G + O) / N, move to host memory: on the GPU stays only
                           what the window gathers (P + G under `last`, a block under `every`)

P, G and O come from the run's rows: under fsdp over W ranks a row holds the rank's shards, so
whole = row x W (padding ignored); otherwise whole = row. The rest of the measured peak
(activations, workspaces, autocast's weight copies) is the same at the same micro-batch under
any layout: peak(lever) = peak(now) - resident(now) + resident(lever); with the run's line
(fixed + per_sample x micro) the largest micro-batch that fits moves the same way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

FSDP = "fsdp"
# The levers offered for each N: (reduction, CPU offload).
LEVERS = (("last", False), ("every", False), ("every", True))
ESTIMATE = "estimate"  # every row's source: never measured


@dataclass(frozen=True)
class Layout:
    """How the ranks of a run hold the model."""
    world: int = 1
    strategy: str = "ddp"
    fsdp_reduce: str = "last"
    cpu_offload: bool = False

    @property
    def sharded(self) -> bool:
        return self.strategy == FSDP

    def words(self) -> str:
        if not self.sharded:
            return "one process" if self.world == 1 else f"ddp over {self.world}"
        return f"FSDP over {self.world} GPUs, reduce {self.fsdp_reduce}" + (", CPU offload" if self.cpu_offload
                                                                             else "")


@dataclass(frozen=True)
class Whole:
    """Bytes of the whole model's parameters, gradients and optimizer state (not a rank's shards)."""
    params: float
    grads: float
    optimizer: float

    @classmethod
    def from_rank(cls, params: float, grads: float, optimizer: float, layout: Layout) -> "Whole":
        """From a row's per-rank bytes under `layout` (a shard under fsdp)."""
        k = layout.world if layout.sharded else 1
        return cls(params * k, grads * k, optimizer * k)

    def resident(self, layout: Layout) -> tuple[float, float]:
        """(GPU bytes, host bytes) a rank holds besides activations during a window."""
        if not layout.sharded:
            return self.params + self.grads + self.optimizer, 0.0
        shards = (self.params + self.grads + self.optimizer) / layout.world
        gathered = self.params + self.grads if layout.fsdp_reduce == "last" else 0.0
        return (gathered, shards) if layout.cpu_offload else (shards + gathered, 0.0)


@dataclass(frozen=True)
class ShardingRow:
    """One lever: the layout, the predicted peak per GPU at the run's micro-batch, whether it fits,
    the largest micro-batch predicted to fit and the accumulation that keeps the effective batch."""
    world: int
    fsdp_reduce: str
    cpu_offload: bool
    micro_batch: int
    accum: int
    predicted_peak: Optional[int]  # bytes per GPU
    fits: Optional[bool]  # None without a capacity
    largest: Optional[int]  # largest micro-batch predicted to fit (None: not known)
    host_bytes: int  # per rank, in the host's memory (CPU offload)
    current: bool  # the run's own layout
    basis: str  # in words, for the tooltip
    source: str = ESTIMATE

    @property
    def layout(self) -> Layout:
        return Layout(self.world, FSDP, self.fsdp_reduce, self.cpu_offload)

    @property
    def label(self) -> str:
        return self.layout.words()

    def to_row(self) -> tuple:
        """As a memory_levers event stores it (JSON-able)."""
        return (self.world, self.fsdp_reduce, self.cpu_offload, self.micro_batch, self.accum, self.predicted_peak,
                self.fits, self.largest, self.host_bytes, self.current, self.basis)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> "ShardingRow":
        """From an event's row (a JSON list from run.db). Raises TypeError or ValueError on a damaged one."""
        world, reduce, offload, micro, accum, peak, fits, largest, host, current, basis = row
        return cls(int(world), str(reduce), bool(offload), int(micro), int(accum),
                   None if peak is None else int(peak), None if fits is None else bool(fits),
                   None if largest is None else int(largest), int(host), bool(current), str(basis))


def worlds(gpus: int, layout: Layout) -> list[int]:
    """N = 2 .. this machine's GPUs, and the run's own world when it is distributed."""
    out = set(range(2, gpus + 1))
    if layout.world > 1:
        out.add(layout.world)
    return sorted(out)


def rows(whole: Whole, now: Layout, *, gpus: int, micro_batch: int, effective: int, peak: Optional[float],
         usable: Optional[float], line: Optional[tuple[float, float]] = None) -> tuple[ShardingRow, ...]:
    """The sharding levers for a run measured under `now`: `peak` at its `micro_batch`, `line`
    (fixed, per_sample) its fit if known; `effective` the batch to keep; `usable` a GPU's bytes
    less the margin (None: no capacity known). Nothing when fewer than 2 GPUs and the run is not
    distributed, or nothing is measured."""
    if peak is None:
        return ()
    res_now, _host = whole.resident(now)
    out: list[ShardingRow] = []
    for n in worlds(gpus, now):
        layouts = [Layout(n, FSDP, r, o) for r, o in LEVERS]
        if now.sharded and now.world == n and now not in layouts:
            layouts.append(now)
        for lay in layouts:
            gpu, host = whole.resident(lay)
            delta = gpu - res_now
            est = peak + delta
            largest = None
            if line is not None and usable is not None and line[1] > 0:
                largest = max(0, min(math.ceil(effective / n), math.floor((usable - line[0] - delta) / line[1])))
            basis = (f"estimate: {_gib(peak)} measured at micro-batch {micro_batch} ({now.words()}), "
                     f"params+grads+optimizer {_gib(res_now)} -> {_gib(gpu)} per GPU"
                     + (f", {_gib(host)} per rank in host memory" if host else "")
                     + ("; plus one block's gathered parameters, not counted" if lay.fsdp_reduce == "every" else "")
                     + "; activations as measured")
            accum = max(1, math.ceil(effective / (micro_batch * n)))
            out.append(ShardingRow(n, lay.fsdp_reduce, lay.cpu_offload, micro_batch, accum, int(round(est)),
                                   None if usable is None else est <= usable, largest, int(round(host)),
                                   lay == now, basis))
    return tuple(out)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n:.0f} B"
