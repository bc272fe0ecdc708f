"""Where the memory of a training step goes: parameters, gradients, optimizer state, activations.

Exact bytes of the persistent parts of a run, counted from the tensors themselves,
on any device (CPU too), by dtype and by device:

- params: every parameter tensor of the model, frozen ones (requires_grad=False) too;
- grads: the `.grad` tensors held at the moment of counting (the trainer counts at the
  window's end, after the optimizer step and before zero_grad, when all of them exist);
- optimizer: every tensor in `optimizer.state` (AdamW exp_avg / exp_avg_sq / step,
  SGD momentum_buffer, ...), CPU scalar `step` tensors included. Non-tensor state
  (floats, ints) holds no tensor memory and is not counted.

Storage shared between tensors is counted once: tensors are deduplicated by
(device, untyped_storage().data_ptr()), so tied weights (a decoder head sharing the
embedding matrix) count once, and a gradient that is a view into a larger buffer
counts that buffer once. Each distinct storage counts its full size
(`untyped_storage().nbytes()`): what the allocator really holds for it; for an
ordinary tensor that is numel() * element_size(). The first part to hold a storage
owns it (params, then grads, then optimizer), so nothing is counted twice across parts.
Meta tensors hold no memory and count 0.

Nothing here synchronises with the GPU: only sizes and pointers are read, never a
value (no .item(), no .tolist()). Cost: about 1 us of host time per tensor (0.9 ms
for the 149 parameters + 149 gradients + 447 AdamW state tensors of the 135M GPT, on a
busy 2-core VM; the 16 x 4 step of that model takes ~160 ms on an H200), cheap enough
for once per optimizer step.

How the trainer calls it (one optimizer step = one accumulation window):

    # _train_window, after optimizer.step() (or the skip decision) and BEFORE
    # optimizer.zero_grad(set_to_none=True), where gradients and optimizer state exist:
    breakdown = mem_breakdown.count(self.model, self.optimizer)
    ...
    # once the window's peak is known (MemoryProbe.sample().peak, None on CPU):
    act = mem_breakdown.activations(mem.peak, breakdown, device=self.device)
    # metrics row: mem_params=breakdown.params, mem_grads=breakdown.grads,
    #              mem_optimizer=breakdown.optimizer, mem_activations=act (NULL on CPU)

Count the model itself. Under --strategy ddp the gradients are views into DDP's buckets:
their storage is counted once, as gradients. Under --strategy fsdp parameters, gradients and
optimizer state are DTensors: each counts this rank's shard (its local tensor), so the
figures are the rank's own. Workspaces and the temporaries of the step end up in the
activations figure.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional, Union

import torch

PARTS = ("params", "grads", "optimizer")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes of the persistent parts of a run (all devices together).

    by_dtype:  {part: {dtype name ("float32", "bfloat16", ...): bytes}}, parts as in PARTS
    by_device: {part: {device ("cpu", "cuda:0", ...): bytes}}
    """
    params: int
    grads: int
    optimizer: int
    by_dtype: dict[str, dict[str, int]] = field(default_factory=dict)
    by_device: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def on_device(self, device: Union[str, torch.device, None]) -> int:
        """params + grads + optimizer bytes that live on `device` (all devices if None)."""
        if device is None:
            return self.total
        key = _device_key(torch.device(device))
        return sum(self.by_device.get(part, {}).get(key, 0) for part in PARTS)

    def dtype_totals(self) -> dict[str, int]:
        """{dtype name: bytes} over the three parts."""
        out: dict[str, int] = {}
        for part in PARTS:
            for dt, n in self.by_dtype.get(part, {}).items():
                out[dt] = out.get(dt, 0) + n
        return out


def _device_key(dev: torch.device) -> str:
    if dev.type == "cuda" and dev.index is None:
        return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cuda:0"
    return str(dev)


def dtype_name(dtype: torch.dtype) -> str:
    """torch.float32 -> 'float32' (the names engine.memory.what_fits.levers uses, torch-free)."""
    return str(dtype).removeprefix("torch.")


def _add_all(tensors: Iterable[torch.Tensor], seen: set, acc: dict) -> None:
    """Add each tensor's storage to acc[(device, dtype)] unless its storage was seen.

    The hot loop of count(): plain locals and torch.device / torch.dtype keys (turned
    into strings once, at the end), about 1 us per tensor."""
    for t in tensors:
        if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
            t = getattr(t, "_local_tensor", t)  # a DTensor (--strategy fsdp): this rank holds its shard
        dev = t.device
        try:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            nbytes = storage.nbytes()
        except (RuntimeError, NotImplementedError, TypeError):
            # Tensor subclasses without a plain storage (some wrapper tensors): their own size, by identity.
            ptr, nbytes = -id(t), t.numel() * t.element_size()
        if nbytes == 0 or dev.type == "meta":  # empty, or no memory held
            continue
        key = (dev, ptr)
        if key in seen:
            continue
        seen.add(key)
        k = (dev, t.dtype)
        acc[k] = acc.get(k, 0) + nbytes


def _summarise(parts: dict[str, dict]) -> MemoryBreakdown:
    by_dtype: dict[str, dict[str, int]] = {}
    by_device: dict[str, dict[str, int]] = {}
    totals = {}
    for part in PARTS:
        acc = parts[part]
        totals[part] = sum(acc.values())
        for (dev, dt), n in acc.items():
            d = by_dtype.setdefault(part, {})
            name = dtype_name(dt)
            d[name] = d.get(name, 0) + n
            v = by_device.setdefault(part, {})
            dk = _device_key(dev)
            v[dk] = v.get(dk, 0) + n
    return MemoryBreakdown(params=totals["params"], grads=totals["grads"], optimizer=totals["optimizer"],
                           by_dtype=by_dtype, by_device=by_device)


def _state_tensors(value: object) -> Iterable[torch.Tensor]:
    """Tensors in one parameter's optimizer state: a dict of tensors and numbers, possibly nested."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _state_tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _state_tensors(v)


def count(model: Optional[torch.nn.Module], optimizer: Optional[torch.optim.Optimizer] = None,
          extra_params: Iterable[torch.Tensor] = ()) -> MemoryBreakdown:
    """Exact bytes of the model's parameters, their gradients and the optimizer's state.

    `model` may be None (count the optimizer's parameters instead). Parameters the
    optimizer holds that are not in the model (or `extra_params`) are counted as
    parameters too, so nothing the step keeps alive is missed. Never syncs the GPU.
    """
    params: list[torch.Tensor] = []
    if model is not None:
        params.extend(model.parameters())  # the module dedups tied Parameters; storages are deduped below
    params.extend(extra_params)
    if optimizer is not None:
        ids = {id(p) for p in params}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in ids:
                    ids.add(id(p))
                    params.append(p)
    seen: set = set()
    parts: dict[str, dict] = {part: {} for part in PARTS}
    _add_all(params, seen, parts["params"])
    _add_all([g for g in (p.grad for p in params) if g is not None], seen, parts["grads"])
    if optimizer is not None:
        state = []
        for s in optimizer.state.values():
            if isinstance(s, dict):
                for v in s.values():
                    if isinstance(v, torch.Tensor):
                        state.append(v)
                    elif isinstance(v, (dict, list, tuple)):
                        state.extend(_state_tensors(v))
            else:
                state.extend(_state_tensors(s))
        _add_all(state, seen, parts["optimizer"])
    return _summarise(parts)


def activations(peak_bytes: Optional[int], breakdown: MemoryBreakdown,
                device: Union[str, torch.device, None] = None) -> Optional[int]:
    """The window's CUDA peak minus params + grads + optimizer state: the memory of the
    activations (with the step's workspaces and temporaries). None without a peak (CPU).

    With `device`, only the parts that live on that device are subtracted (an optimizer
    state offloaded to the CPU, or AdamW's CPU `step` scalars, are not in the CUDA peak).
    Never below 0.
    """
    if peak_bytes is None:
        return None
    if device is not None and torch.device(device).type != "cuda":
        return None
    return max(0, int(peak_bytes) - breakdown.on_device(device))


class WindowMemory:
    """The breakdown at each window's end (called by the step before it zeroes the gradients),
    counted again only when what is held changes: which parameters hold a gradient, and how
    many parameters have optimizer state. Between such changes the bytes are the same, so
    the per-step cost is one pass over the parameters (no tensor walk)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        self.params = list(model.parameters())
        self.last: Optional[MemoryBreakdown] = None
        self._key: Optional[tuple[int, int]] = None

    def at_window_end(self) -> None:
        key = (sum(1 for p in self.params if p.grad is not None), len(self.optimizer.state))
        if key != self._key:
            self._key = key
            self.last = count(self.model, self.optimizer)
