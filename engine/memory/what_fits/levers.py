"""The "what fits" table: micro-batch x precision x activation checkpointing, for the current run.

Pure arithmetic, torch-free. Each cell says the predicted peak memory of a training
step, whether it fits (in the device's capacity or --vram-limit, less the margin),
the accumulation that keeps the effective batch (ceil(effective / (micro x world))),
and where the number comes from.

Where the numbers come from (Cell.source), best first:

  "measured"      this very micro-batch was trained in this state: its largest peak seen.
  "fit"           this state's own measurements: engine.memory.what_fits.forecast.MemoryModel's line
                  (fixed + per_sample x micro) through two or more micro-batch sizes; with
                  one size and the persistent bytes known (engine.memory.breakdown), the
                  fixed part is taken as params + grads + optimizer and the rest of the
                  peak as activations proportional to the micro-batch (slightly high for
                  larger micro-batches, slightly low for smaller ones: workspaces that do
                  not grow with the batch are counted as if they did).
  "extrapolated"  another state's fit, moved by the factors below. Marked as such in the
                  table, replaced by the state's own fit as soon as it is measured.
  "unknown"       nothing measured yet: no prediction.

The extrapolation model (a state is (precision, checkpointing)):

  per_sample(S) = per_sample(B) x act_bytes(S) / act_bytes(B) x ckpt(B -> S)
  fixed(S)      = fixed(B) - cast(B) + cast(S)

  act_bytes(p): bytes per element of the activations: the parameters' element size for
      fp32 (no autocast: activations are in the parameters' dtype), 2 for bf16 and fp16
      (autocast). So fp32 -> bf16 halves the per-sample part of fp32 parameters. This is
      optimistic by the part of the activations autocast keeps in fp32 (layer norm,
      softmax, the loss): a bf16 prediction made from an fp32 fit runs low.
  cast(p): the low-precision copies of the weights autocast makes for the forward and
      keeps for the backward: 2 bytes per parameter element whose dtype is not the
      autocast dtype (0 for fp32, 0 for bf16 autocast over bf16 parameters). Parameters,
      gradients and optimizer state themselves do not change with autocast: they stay
      as counted, in their own dtype.
  ckpt(off -> on) = keep, ckpt(on -> off) = 1 / keep, with
      keep = (1 - inside) + inside x (1 / layers + boundary)
      inside: the fraction of the per-sample activations produced inside the
      checkpointed blocks (default 0.5: a language model's logits and loss, outside the
      blocks, can be half of it; a vision or encoder model has more inside, and is then
      predicted high, the safe side); layers: how many blocks are checkpointed (only one
      block's activations live at a time during the backward; default 4 when unknown,
      high on purpose); boundary: the block inputs kept for the recomputation, as a
      fraction of the blocks' activations (default 1/16, about one hidden state out of
      the ~16 a transformer block saves).

How the trainer calls it (at most once per optimizer step, in practice only when a new
(state, micro-batch) was measured or the user opens the table):

    # keep one MemoryModel per state instead of one per run:
    self.memory_models.setdefault((precision, ckpt_on), MemoryModel()).add(micro, peak)
    table = levers.build_table(self.memory_models,
                               Current(micro_batch=s.micro_batch, accum=s.accum, precision=self.config.precision,  # or what SetPrecision set
                                       checkpointing=self.ckpt_switch.on if self.ckpt_switch else False,
                                       world=self.ctx.world,
                                       effective_batch=self.config.effective_batch),  # None: micro x accum x world
                               capacity=capacity,            # as _forecast computes it; None on CPU
                               margin=self.config.memory_margin,
                               persistent=Persistent.from_breakdown(breakdown),   # or None
                               checkpoint=CheckpointModel(layers=self.ckpt_switch.layers if self.ckpt_switch else None),
                               can_checkpoint=self.ckpt_switch is not None)
    # a chosen cell -> commands, queued like the user's own:
    for cmd in levers.commands_for(cell, current): self.send(cmd)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from engine.declarations.commands import SetAccum, SetCheckpointing, SetMicroBatch, SetPrecision, SettingCommand
from engine.declarations.config import PRECISIONS

from . import sharding
from .forecast import MemoryModel

AUTOCAST_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
AUTOCAST_BYTES = 2
# Bytes per element by dtype name (engine.memory.breakdown.dtype_name spells them so).
DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1,
               "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "complex64": 8,
               "complex128": 16, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
FLOATING = {"float64", "float32", "float16", "bfloat16"}

DEFAULT_INSIDE = 0.5
DEFAULT_BOUNDARY = 1 / 16
DEFAULT_LAYERS = 4

State = tuple[str, bool]  # (precision, activation checkpointing on)

SOURCES = ("measured", "fit", "extrapolated", "unknown")


@dataclass(frozen=True)
class Persistent:
    """Bytes that do not depend on the micro-batch (from engine.memory.breakdown.MemoryBreakdown)."""
    params: int
    grads: int
    optimizer: int
    param_dtypes: Mapping[str, int] = field(default_factory=dict)  # params' bytes by dtype name

    @classmethod
    def from_breakdown(cls, b) -> "Persistent":
        """From a MemoryBreakdown (duck-typed: this module stays torch-free)."""
        return cls(params=int(b.params), grads=int(b.grads), optimizer=int(b.optimizer),
                   param_dtypes=dict(b.by_dtype.get("params", {})))

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def elements(self, dtype: str) -> int:
        return self.param_dtypes.get(dtype, 0) // DTYPE_BYTES.get(dtype, 4)

    def element_size(self) -> float:
        """Average bytes per floating parameter element (4 if unknown)."""
        n = sum(self.elements(d) for d in self.param_dtypes if d in FLOATING)
        b = sum(self.param_dtypes[d] for d in self.param_dtypes if d in FLOATING)
        return b / n if n else 4.0


@dataclass(frozen=True)
class CheckpointModel:
    """How much of the per-sample activations checkpointing keeps (see the module docstring)."""
    layers: Optional[int] = None
    inside: float = DEFAULT_INSIDE
    boundary: float = DEFAULT_BOUNDARY

    def __post_init__(self) -> None:
        if self.layers is not None and self.layers < 1:
            raise ValueError(f"layers must be >= 1, got {self.layers}")
        if not 0.0 <= self.inside <= 1.0:
            raise ValueError(f"inside must be in [0, 1], got {self.inside}")

    def keep(self) -> float:
        L = self.layers or DEFAULT_LAYERS
        return min(1.0, (1.0 - self.inside) + self.inside * (1.0 / L + self.boundary))


@dataclass(frozen=True)
class Current:
    """The run's settings now. effective batch = micro x accum x world unless given."""
    micro_batch: int
    accum: int
    precision: str = "fp32"
    checkpointing: bool = False
    world: int = 1
    effective_batch: Optional[int] = None  # the batch to keep (e.g. --effective-batch); default micro x accum x world

    @property
    def state(self) -> State:
        return (self.precision, self.checkpointing)

    @property
    def effective(self) -> int:
        return self.effective_batch or self.micro_batch * self.accum * self.world


@dataclass(frozen=True)
class Line:
    """peak(micro) = fixed + per_sample x micro, for one state, and where it comes from."""
    fixed: float
    per_sample: float
    source: str  # "fit" or "extrapolated"
    basis: str   # in words, for the table's tooltip

    def at(self, micro: int) -> float:
        return self.fixed + self.per_sample * micro


@dataclass(frozen=True)
class Cell:
    micro_batch: int
    precision: str
    checkpointing: bool
    predicted_peak: Optional[int]  # bytes; None when nothing is known
    fits: Optional[bool]           # None without a capacity (CPU) or a prediction
    accum: int                     # keeps the effective batch: ceil(effective / (micro x world))
    effective_batch: int           # micro x accum x world (>= the target when it does not divide)
    source: str                    # one of SOURCES
    basis: str = ""
    current: bool = False          # the run's own settings
    available: bool = True         # False: checkpointing has no switch for this model

    @property
    def state(self) -> State:
        return (self.precision, self.checkpointing)

    @property
    def measured(self) -> bool:
        """True when the number comes from this state's own measurements (not extrapolated)."""
        return self.source in ("measured", "fit")


@dataclass(frozen=True)
class LeverTable:
    cells: tuple[Cell, ...]
    current: Current
    capacity: Optional[int]
    usable: Optional[int]                     # capacity x (1 - margin)
    largest: Mapping[State, Optional[int]]    # largest micro-batch predicted to fit, per state
    notes: tuple[str, ...] = ()
    sharding: tuple[sharding.ShardingRow, ...] = ()  # FSDP over N GPUs, reduction, offload: estimates

    def cell(self, micro_batch: int, precision: str, checkpointing: bool) -> Optional[Cell]:
        for c in self.cells:
            if (c.micro_batch, c.precision, c.checkpointing) == (micro_batch, precision, checkpointing):
                return c
        return None

    def state_cells(self, precision: str, checkpointing: bool) -> list[Cell]:
        return [c for c in self.cells if c.state == (precision, checkpointing)]


# -- the model ---------------------------------------------------------------------------


def act_bytes(precision: str, persistent: Optional[Persistent]) -> float:
    if precision in AUTOCAST_DTYPE:
        return float(AUTOCAST_BYTES)
    return persistent.element_size() if persistent is not None else 4.0


def cast_bytes(precision: str, persistent: Optional[Persistent]) -> int:
    """Autocast's low-precision weight copies held from forward to backward (0 for fp32)."""
    if persistent is None or precision not in AUTOCAST_DTYPE:
        return 0
    target = AUTOCAST_DTYPE[precision]
    return sum(persistent.elements(d) * AUTOCAST_BYTES for d in persistent.param_dtypes
               if d in FLOATING and d != target)


def own_line(model: Optional[MemoryModel], persistent: Optional[Persistent]) -> Optional[Line]:
    """A state's line from its own measurements, or None."""
    if model is None or not model.points:
        return None
    f = model.fit()
    if f is not None:
        sizes = ", ".join(str(m) for m in sorted(model.points))
        return Line(f[0], f[1], "fit", f"fit through micro-batches {sizes}")
    if persistent is None:
        return None
    (m, peak), = model.points.items()
    per = (peak - persistent.total) / m
    if per <= 0:
        return None
    return Line(float(persistent.total), per, "fit",
                f"one size measured (micro-batch {m}): params+grads+optimizer fixed, the rest per sample")


def extrapolate(base: Line, base_state: State, target: State, persistent: Optional[Persistent],
                ckpt: CheckpointModel) -> Line:
    (bp, bc), (tp, tc) = base_state, target
    per = base.per_sample * act_bytes(tp, persistent) / act_bytes(bp, persistent)
    words = []
    if tp != bp:
        words.append(f"activations x {act_bytes(tp, persistent):g}/{act_bytes(bp, persistent):g} bytes "
                     f"per element, weight copies {cast_bytes(bp, persistent)} -> {cast_bytes(tp, persistent)} B")
    if tc != bc:
        k = ckpt.keep()
        per = per * k if tc else per / k
        words.append(f"checkpointing {'keeps' if tc else 'undoes'} {k:.3f} of activations "
                     f"(layers {ckpt.layers or f'{DEFAULT_LAYERS}?'}, inside {ckpt.inside:g}, "
                     f"boundary {ckpt.boundary:.3g})")
    fixed = base.fixed - cast_bytes(bp, persistent) + cast_bytes(tp, persistent)
    return Line(fixed, per, "extrapolated",
                f"extrapolated from {_state_name(base_state)} ({base.basis}): " + "; ".join(words))


def _state_name(state: State) -> str:
    return f"{state[0]}, checkpointing {'on' if state[1] else 'off'}"


def lines_for(models: Mapping[State, MemoryModel], current: State, persistent: Optional[Persistent],
              ckpt: CheckpointModel, precisions: Sequence[str] = PRECISIONS) -> dict[State, Optional[Line]]:
    """Every state's line: its own fit when measured, else extrapolated from the nearest
    measured state (fewest axes changed; the current state first among equals)."""
    fitted = {s: own_line(m, persistent) for s, m in models.items()}
    own = {s: ln for s, ln in fitted.items() if ln is not None}
    out: dict[State, Optional[Line]] = {}
    for p in precisions:
        for c in (False, True):
            s = (p, c)
            if s in own:
                out[s] = own[s]
                continue
            if not own:
                out[s] = None
                continue

            def rank(b: State, p: str = p, c: bool = c) -> tuple:
                dist = (b[0] != p) + (b[1] != c)
                n = len(models[b].points)
                return (dist, b != current, -n, PRECISIONS.index(b[0]) if b[0] in PRECISIONS else 9, b[1])
            base = min(own, key=rank)
            out[s] = extrapolate(own[base], base, s, persistent, ckpt)
    return out


def accum_for(effective: int, micro: int, world: int = 1) -> int:
    return max(1, math.ceil(effective / (micro * world)))


def largest_fitting(line: Optional[Line], usable: Optional[float], upper: int) -> Optional[int]:
    """Largest micro-batch in [1, upper] the line predicts to fit; 0 if none; None if unknown."""
    if line is None or usable is None:
        return None
    if line.per_sample <= 0:
        return upper if line.fixed <= usable else 0
    return max(0, min(upper, int(math.floor((usable - line.fixed) / line.per_sample))))


def default_micro_batches(current: Current, models: Mapping[State, MemoryModel],
                          largest: Mapping[State, Optional[int]]) -> list[int]:
    """Powers of two up to the effective batch per rank, the current micro-batch, every
    measured size and each state's largest fitting size."""
    upper = max(1, math.ceil(current.effective / current.world))
    sizes = {1 << k for k in range(upper.bit_length() + 1) if (1 << k) <= upper}
    sizes.add(current.micro_batch)
    for m in models.values():
        sizes.update(b for b in m.points if b <= upper)
    sizes.update(b for b in largest.values() if b)
    return sorted(sizes)


def build_table(models: Mapping[State, MemoryModel], current: Current, *, capacity: Optional[int] = None,
                margin: float = 0.0, persistent: Optional[Persistent] = None,
                checkpoint: CheckpointModel = CheckpointModel(), can_checkpoint: bool = True,
                micro_batches: Optional[Sequence[int]] = None,
                precisions: Sequence[str] = PRECISIONS, layout: Optional[sharding.Layout] = None,
                gpus: int = 0) -> LeverTable:
    """The table for the current run. `models`: one MemoryModel per measured state
    ((precision, checkpointing) -> MemoryModel of window peaks by micro-batch). `layout`: how
    the run's ranks hold the model (default: a replica on each of current.world); `gpus`: this
    machine's GPUs, for the sharding levers (engine/memory/what_fits/sharding.py)."""
    if current.micro_batch < 1 or current.accum < 1 or current.world < 1:
        raise ValueError(f"micro-batch, accum and world must be >= 1, got {current}")
    usable = None if capacity is None else capacity * (1.0 - margin)
    lines = lines_for(models, current.state, persistent, checkpoint, precisions)
    upper = max(1, math.ceil(current.effective / current.world))
    largest = {s: largest_fitting(ln, usable, upper) for s, ln in lines.items()}
    sizes = list(micro_batches) if micro_batches is not None else default_micro_batches(current, models, largest)
    eff = current.effective
    cells = []
    for p in precisions:
        for c in (False, True):
            s = (p, c)
            line = lines.get(s)
            points = models[s].points if s in models else {}
            for b in sizes:
                if b in points:
                    peak: Optional[float] = points[b]
                    source, basis = "measured", f"measured at micro-batch {b}"
                elif line is not None:
                    peak, source, basis = line.at(b), line.source, line.basis
                else:
                    peak, source, basis = None, "unknown", "nothing measured yet"
                fits = None if (peak is None or usable is None) else peak <= usable
                k = accum_for(eff, b, current.world)
                cells.append(Cell(micro_batch=b, precision=p, checkpointing=c,
                                  predicted_peak=None if peak is None else int(round(peak)), fits=fits,
                                  accum=k, effective_batch=b * k * current.world, source=source, basis=basis,
                                  current=(b == current.micro_batch and s == current.state),
                                  available=can_checkpoint or not c))
    notes = []
    if not can_checkpoint:
        notes.append("activation checkpointing: no switch for this model (declare Task(checkpointing=fn(model, on)))")
    if persistent is None:
        notes.append("persistent bytes unknown: no one-size fit, no weight-copy term in precision changes")
    if checkpoint.layers is None:
        notes.append(f"checkpointed layers unknown: assumed {DEFAULT_LAYERS}")
    shard_rows: tuple[sharding.ShardingRow, ...] = ()
    now = next((c for c in cells if c.current), None)
    if persistent is not None and now is not None:
        lay = layout or sharding.Layout(world=current.world)
        line = lines.get(current.state)
        shard_rows = sharding.rows(sharding.Whole.from_rank(persistent.params, persistent.grads, persistent.optimizer,
                                                            lay),
                                   lay, gpus=gpus, micro_batch=current.micro_batch, effective=eff,
                                   peak=now.predicted_peak, usable=usable,
                                   line=None if line is None else (line.fixed, line.per_sample))
    return LeverTable(cells=tuple(cells), current=current, capacity=capacity, usable=None if usable is None
                      else int(usable), largest=largest, notes=tuple(notes), sharding=shard_rows)


def commands_for(cell: Cell, current: Current) -> list[SettingCommand]:
    """The commands that move the run to `cell` (empty if it is the current setting).

    Checkpointing and precision first, then micro-batch and accumulation; all of them
    apply at the same boundary, so no window runs with half of the change."""
    if not cell.available:
        raise ValueError("activation checkpointing has no switch for this model")
    out: list[SettingCommand] = []
    if cell.checkpointing != current.checkpointing:
        out.append(SetCheckpointing(cell.checkpointing))
    if cell.precision != current.precision:
        out.append(SetPrecision(cell.precision))
    if cell.micro_batch != current.micro_batch:
        out.append(SetMicroBatch(cell.micro_batch))
    if cell.accum != current.accum:
        out.append(SetAccum(cell.accum))
    return out
