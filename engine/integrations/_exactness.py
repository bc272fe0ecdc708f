"""How far a framework's optimizer step is from the exact one, measured beside the framework.

The exact step of a window is the gradient of the whole window taken as one batch:
sum over micro-batches of S_i / N, where S_i is micro-batch i's true loss *sum* and N the
window's true count (tokens, or samples). A framework backpropagates, per micro-batch, some
v_i = a_i * S_i (a mean over the micro-batch divided by k, a sum divided by a count it made
itself, ...), so its accumulated gradient is sum a_i * grad S_i. With r_i = a_i * N, the
weight micro-batch i got relative to the exact 1/N:

- all r_i equal (r): the update is exactly r times the exact one (linearity; "scale");
- r_i unequal: the direction differs too, by an amount only the two gradients can tell.
  `GradProbe` measures it: on a probed window, a hook on every parameter adds each
  micro-batch's gradient contribution divided by a_i to a buffer, which ends as
  sum grad S_i; divided by N it is the exact gradient, compared with the framework's
  accumulated one before clipping ("gradients").

An adapter measures S_i and n_i itself (from the labels and outputs the model sees, not from
the framework's bookkeeping), and v_i as the framework backpropagates it. A `WindowCheck`
per step carries the result to the row writer, which raises `loss_weighting` events.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

TOL = 1e-3  # a relative error of the update worth an alert (0.1%)
SAME = 1e-5  # two weights this close (relative) are the same weight


@dataclass
class WindowCheck:
    """One optimizer step against the exact step, on the host."""
    ratios: list[float]  # r_i: micro-batch i's weight in the update relative to the exact 1/N
    grad_error: Optional[float]  # |update - exact| / |exact| (gradients before clipping); None: unknown
    grad_scale: Optional[float]  # <update, exact> / |exact|^2: 4.0 = four times the exact update
    measured: str  # "gradients" (compared), "scale" (one common factor), "weights" (unequal, not compared)
    cause: str = ""  # why (the adapter's diagnosis), for the alert
    fix: str = ""  # what makes the run exact, for the alert

    @property
    def off(self) -> bool:
        """Whether this step's update is off the exact one by more than TOL (or, not compared,
        its micro-batches are weighted unequally by more than that)."""
        if self.grad_error is not None:
            return self.grad_error > TOL
        return bool(self.ratios) and max(abs(r - 1.0) for r in self.ratios) > TOL


def check_window(ratios: Sequence[float], probed: Optional[tuple[float, float]] = None) -> WindowCheck:
    """The step's check from its weights r_i and, when its gradients were compared, the
    probe's (error, scale)."""
    rs = [float(r) for r in ratios]
    if probed is not None and all(math.isfinite(x) for x in probed):
        return WindowCheck(rs, grad_error=float(probed[0]), grad_scale=float(probed[1]), measured="gradients")
    if rs and all(math.isfinite(r) for r in rs) and max(rs) - min(rs) <= SAME * max(1.0, abs(max(rs))):
        r = sum(rs) / len(rs)
        return WindowCheck(rs, grad_error=abs(r - 1.0), grad_scale=r, measured="scale")
    return WindowCheck(rs, grad_error=None, grad_scale=None, measured="weights")


def same(x: float, y: float) -> bool:
    return abs(x - y) <= SAME * max(abs(x), abs(y), 1e-12)


class GradProbe:
    """The exact gradient of one window, accumulated beside the framework's (see the module
    doc). Costs one buffer the size of the gradients and one multiply-add per parameter per
    micro-batch, on the windows probed only. One device, plain tensors (no DTensor, no
    sparse gradients); anything else leaves the probe invalid, never the training changed."""

    def __init__(self) -> None:
        self._params: list[torch.Tensor] = []
        self._buf: list[torch.Tensor] = []
        self._hooks: list[Any] = []
        self._weight: Optional[torch.Tensor] = None  # 1 / a_i of the micro-batch in backward
        self.valid = False

    @property
    def active(self) -> bool:
        return bool(self._hooks)

    def start(self, params: Sequence[torch.Tensor]) -> None:
        """Hook every trainable parameter for the window about to be trained. Not on a GPU
        without room for the buffer (a second copy of the gradients) twice over: the probe
        never costs a run its memory; such a window is not compared."""
        self.stop()
        self._params = [p for p in params if p.requires_grad]
        if not self._params or any(type(p.data) is not torch.Tensor for p in self._params):
            self._params = []
            return
        dev = self._params[0].device
        if dev.type == "cuda":
            need = sum(p.numel() * p.element_size() for p in self._params)
            free, _total = torch.cuda.mem_get_info(dev)
            if 2 * need > free:
                self._params = []
                return
        self._buf = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self._params]
        self._hooks = [p.register_hook(self._hook(b)) for p, b in zip(self._params, self._buf)]
        self.valid = True

    def _hook(self, buf: torch.Tensor) -> Any:
        def hook(grad: torch.Tensor) -> None:
            w = self._weight
            if w is None or grad.is_sparse or type(grad) is not torch.Tensor:
                self.valid = False
                return None
            buf.add_(grad * w.to(grad.dtype))
            return None
        return hook

    def weigh(self, backpropagated: Optional[torch.Tensor], true_sum: Optional[torch.Tensor]) -> None:
        """The micro-batch about to be backpropagated: its loss as the framework backpropagates it
        (v_i) and its true loss sum (S_i). None for either: the window cannot be compared."""
        if not self._hooks:
            return
        if backpropagated is None or true_sum is None:
            self._weight = None
            self.valid = False
            return
        v = backpropagated.detach().float().reshape(())
        self._weight = true_sum.detach().float().reshape(()).to(v.device) / v  # 1 / a_i

    def finish(self, count: Any) -> Optional[torch.Tensor]:
        """Compare with the framework's accumulated gradients (read from the parameters now,
        before clipping; scaled by an fp16 loss scale like the buffer, so the ratio holds).
        Returns a tensor [error, scale] (not read to the host), or None if not comparable."""
        if not self._hooks:
            return None
        params, buf, valid = self._params, self._buf, self.valid
        self.stop()
        if not valid:
            return None
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if any(g.is_sparse or type(g) is not torch.Tensor for g in grads):
            return None
        n = count.float() if isinstance(count, torch.Tensor) else torch.tensor(float(count))
        dev = grads[0].device
        exact = torch._foreach_div(buf, n.to(dev))
        diff = torch._foreach_sub([g.float() for g in grads], [e.float() for e in exact])
        d2 = torch.stack([torch.dot(d.flatten(), d.flatten()) for d in diff]).sum()
        e2 = torch.stack([torch.dot(e.float().flatten(), e.float().flatten()) for e in exact]).sum()
        ge = torch.stack([torch.dot(g.float().flatten(), e.float().flatten()) for g, e in zip(grads, exact)]).sum()
        return torch.stack([torch.sqrt(d2 / e2), ge / e2])

    def stop(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks, self._buf, self._params, self._weight = [], [], [], None
        self.valid = False
