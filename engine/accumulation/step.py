"""The optimizer step after a window's last backward, in two variants behind one interface.

Both get the window's numbers as device tensors (totals, torchrun agreement, norm, per-parameter
norms), clip the gradients and step, and return an `InFlight` whose `numbers()` gives the
`WindowNumbers` on the host:

- `SyncStep` (CPU, or an optimizer that cannot skip on the device): reads the
  numbers to the host now, the step's one CPU-GPU sync, and clips, steps or skips
  there: with the norm a host number, a window under the clip norm is not touched.
- `DeferredStep` (CUDA with a fused optimizer): no sync at all. The fused
  optimizer skips a bad window on the device through `found_inf` (weights and
  state bit-identical), and the numbers go to pinned memory, read one step later
  (`depth` = 1: the run loop reports step N after it has launched step N+1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .grads import clip_, clip_by_host_norm_

# Host numbers of the ranks' agreement, when a job has several ranks (see accumulate.py); on
# CUDA followed by each rank's GPU memory, MEM_N numbers a rank in its own slot (the others 0),
# so the one max all-reduce gathers them all.
AGREE_STOP, AGREE_MICRO, AGREE_COMMANDS, AGREE_N = 0, 1, 2, 3
MEM_N = 5  # allocated, reserved, peak, used (NVML, whole device), total


@dataclass(frozen=True)
class WindowNumbers:
    """A window's numbers on the host, all ranks combined."""
    loss_sum: float
    count: float
    norm: float  # total gradient norm before clipping
    per_param: tuple[float, ...]  # per-parameter norms, in grads.dtype_order of the gradients held
    stop_any: bool = False  # torchrun: some rank was asked to stop
    min_micro: int = 0  # torchrun: the smallest micro-batch any rank trained with (0: single process)
    step_commands_any: bool = False  # torchrun: rank 0 holds commands for the next step boundary
    memory: tuple[int, ...] = ()  # torchrun on CUDA: the tightest rank's (allocated, reserved, peak, used, total)

    @property
    def loss(self) -> float:
        return self.loss_sum / self.count if self.count else float("nan")

    @property
    def finite(self) -> bool:
        return math.isfinite(self.loss_sum) and math.isfinite(self.norm) and self.count > 0


def pack(totals: torch.Tensor, agree: Optional[torch.Tensor], norm: torch.Tensor,
         per_param: torch.Tensor) -> torch.Tensor:
    """The window's numbers as one float64 device tensor, so they reach the host in one copy."""
    parts = [totals] + ([agree] if agree is not None else []) + [norm.double().reshape(1), per_param.double()]
    return torch.cat(parts)


def _n_agree(agree: "Optional[torch.Tensor] | int | bool") -> int:
    """How many numbers the agreement holds: a tensor's length, a count, or (True) the flags alone."""
    if isinstance(agree, bool):
        return AGREE_N if agree else 0
    if isinstance(agree, int):
        return agree
    return 0 if agree is None else agree.numel()


def device_bad(packed: torch.Tensor, n_agree: "int | bool") -> torch.Tensor:
    """On the device, no sync: loss sum or norm not finite, or no count."""
    norm = packed[2 + _n_agree(n_agree)]
    return ~(torch.isfinite(norm) & torch.isfinite(packed[0]) & (packed[1] > 0))


def tightest(slots: list[float]) -> tuple[int, ...]:
    """The memory of the rank with the least headroom (NVML's used / total; else the peak)."""
    ranks = [tuple(int(v) for v in slots[i:i + MEM_N]) for i in range(0, len(slots) - MEM_N + 1, MEM_N)]
    if not ranks:
        return ()
    return max(ranks, key=lambda m: (m[3] / m[4] if m[4] else 0.0, m[2]))


def _agreement(values: Optional[list[float]]) -> tuple[bool, int, bool, tuple[int, ...]]:
    if not values:
        return False, 0, False, ()
    return (values[AGREE_STOP] > 0, int(-values[AGREE_MICRO]), values[AGREE_COMMANDS] > 0,
            tightest(values[AGREE_N:]))


def unpack(values: list[float], n_agree: "int | bool") -> WindowNumbers:
    """The inverse of pack, the one place that knows the layout. n_agree: the agreement's
    length (True: the flags alone; False or 0: one process)."""
    n = _n_agree(n_agree)
    loss_sum, count = values[0], values[1]
    agreed = _agreement(values[2:2 + n])
    rest = values[2 + n:]
    return WindowNumbers(loss_sum, count, rest[0], tuple(rest[1:]), *agreed)


def _nothing() -> None:
    pass


class InFlight:
    """A launched step whose numbers may still be on their way to the host."""

    def __init__(self, host: Optional[torch.Tensor], ready: Optional["torch.cuda.Event"], n_agree: int,
                 numbers: Optional[WindowNumbers] = None) -> None:
        self._host, self._ready, self._n_agree, self._numbers = host, ready, n_agree, numbers

    def numbers(self) -> WindowNumbers:
        if self._numbers is None:
            if self._ready is not None:
                self._ready.synchronize()  # the step's one wait, usually long over
            assert self._host is not None
            self._numbers = unpack(self._host.tolist(), self._n_agree)
        return self._numbers


class SyncStep:
    depth = 0  # numbers are known when finish returns

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: Optional[torch.amp.GradScaler], ddp: bool) -> None:
        self.optimizer, self.scaler, self.ddp = optimizer, scaler, ddp
        self.before_zero: Callable[[], None] = _nothing  # sees the gradients and state before they go
        self.set_to_none = True  # False under ddp: the gradients are views into its buckets, zeroed in place

    def finish(self, totals: torch.Tensor, agree: Optional[torch.Tensor], norm: torch.Tensor,
               per_param: torch.Tensor, clip: float, grads: list[torch.Tensor]) -> InFlight:
        if totals.device.type == "cpu":  # no device to wait for: read the numbers as they are
            loss_sum, count = totals.tolist()
            nums = WindowNumbers(loss_sum, count, norm.item(), tuple(per_param.tolist()),
                                 *_agreement(agree.tolist() if agree is not None else None))
        else:  # the one CPU-GPU sync point of the step: one copy of all the numbers, then decide
            nums = unpack(pack(totals, agree, norm, per_param).tolist(), _n_agree(agree))
        if nums.finite:
            if clip > 0:
                clip_by_host_norm_(grads, clip, norm, nums.norm)
            self.optimizer.step()
            if self.scaler is not None:
                self.scaler.update()
        elif self.scaler is not None:
            if math.isfinite(nums.loss_sum):
                self.scaler.update()  # fp16 overflow: lower the scale
            else:
                self.scaler.update(self.scaler.get_scale())  # a NaN loss is no overflow: keep the scale
        # A skipped window leaves weights and optimizer state untouched: its gradients just go.
        self.before_zero()
        self.optimizer.zero_grad(set_to_none=self.set_to_none)
        return InFlight(None, None, _n_agree(agree), nums)


class DeferredStep:
    depth = 1  # numbers are read one step later

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: Optional[torch.amp.GradScaler], ddp: bool,
                 device: torch.device) -> None:
        self.optimizer, self.scaler, self.ddp, self.device = optimizer, scaler, ddp, device
        self._pinned: dict[int, list[torch.Tensor]] = {}
        self.before_zero: Callable[[], None] = _nothing
        self.set_to_none = True  # False under ddp: the gradients are views into its buckets, zeroed in place

    def finish(self, totals: torch.Tensor, agree: Optional[torch.Tensor], norm: torch.Tensor,
               per_param: torch.Tensor, clip: float, grads: list[torch.Tensor]) -> InFlight:
        if clip > 0:
            clip_(grads, clip, norm)  # on the device: the norm is not on the host yet
        packed = pack(totals, agree, norm, per_param)
        opt = self.optimizer
        n_agree = _n_agree(agree)
        opt.found_inf = device_bad(packed, n_agree).float()  # type: ignore[attr-defined]  # read by the fused step; 0-dim, as GradScaler passes it: the kernel skips on the device
        opt.grad_scale = None  # type: ignore[attr-defined]  # read by the fused step, as GradScaler sets it
        try:
            opt.step()
        finally:
            del opt.found_inf, opt.grad_scale  # type: ignore[attr-defined]  # set above for the fused step
        if self.scaler is not None:
            self.scaler.update()  # backs off on the overflow unscale_ found; no sync
        self.before_zero()
        opt.zero_grad(set_to_none=self.set_to_none)
        if self.device.type != "cuda":
            return InFlight(packed, None, n_agree)  # CPU (tests): nothing is in flight
        buf = self._pinned_buffer(packed.numel())
        buf.copy_(packed, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return InFlight(buf, ready, n_agree)

    def _pinned_buffer(self, n: int) -> torch.Tensor:
        """Two pinned buffers used in turn: one may still be unread when the next is filled."""
        pool = self._pinned.setdefault(n, [torch.empty(n, dtype=torch.float64, pin_memory=True) for _ in range(2)])
        pool.reverse()
        return pool[0]


def choose(optimizer: torch.optim.Optimizer, scaler: Optional[torch.amp.GradScaler], ddp: bool,
           device: torch.device, mode: str) -> "SyncStep | DeferredStep":
    """Deferred where the optimizer can skip on the device: on CUDA by default;
    mode (HEADROOM_STEP_MODE) 'sync' or 'deferred' forces one (benchmarks; tests run deferred on CPU)."""
    fused = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
    if fused and (mode == "deferred" or (mode == "auto" and device.type == "cuda")):
        return DeferredStep(optimizer, scaler, ddp, device)
    return SyncStep(optimizer, scaler, ddp)
