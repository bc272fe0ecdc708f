"""The Trainer callback's exactness measurements (behind `transformers.HeadroomCallback`).

`Meter` wraps two more of the Trainer's attributes for the run: `compute_loss`, asked for
the outputs too, so each micro-batch's true loss sum and count (S_i, n_i) are computed from
the logits and labels the model saw (engine.integrations._hf_loss); and Accelerate's
`backward`, where the loss the Trainer backpropagates (v_i) is seen before its backward,
for the gradient probe of the windows `grad_check` names (engine.integrations._exactness).
`check()` turns a window's host numbers into a WindowCheck with its cause and fix.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ._exactness import GradProbe, WindowCheck, check_window
from ._hf_loss import diagnose, is_causal_lm, logits_of, loss_sum
from .loop import batch_size

GRAD_CHECKS = ("epoch", "every", "off")
MEASURE_CHUNK = 1 << 24  # logits a measurement holds at a time (64 MiB in float32)


def _field(inputs: Any, key: str) -> Any:
    """inputs[key] of a dict or a BatchEncoding, else None. (`in` first: Mapping.get on a
    UserDict raises and catches a KeyError for a missing key, tens of us a micro-batch.)"""
    try:
        return inputs[key] if key in inputs else None
    except TypeError:  # not a mapping (a tuple batch)
        return None


class Meter:
    """One callback's measurements; `in_step` is set by the callback's training_step wrapper."""

    def __init__(self, grad_check: str) -> None:
        self.grad_check = grad_check
        self.probe = GradProbe()
        self.in_step = False
        self.causal = False  # the model's loss shifts its labels
        self.smoothing = 0.0
        self.plain = False  # one process, plain tensors: the probe can run
        self._probed_epoch: Optional[int] = None
        self._model: Any = None  # set for a window to compare until its first backward
        self.reset()

    def reset(self) -> None:
        """A new window."""
        self.measured: Optional[tuple[Any, Any, Any]] = None  # (S_i, n_i, unshifted) of the micro-batch in step
        self.probe.stop()
        self.probed: Any = None  # the probe's [error, scale] for this window

    def begin(self, model: Any, args: Any) -> None:
        """A run starts: what the model's loss is, judged from the model (not the Trainer's flag)."""
        self.causal = is_causal_lm(model)
        self.smoothing = float(getattr(args, "label_smoothing_factor", 0.0) or 0.0)
        self._probed_epoch = None
        self.reset()

    def wrap(self, trainer: Any, plain: bool) -> None:
        """Wrap the Trainer's compute_loss and Accelerate's backward (instance attributes; the
        callback's unwrap pops them)."""
        meter = self
        loss_fn = trainer.compute_loss
        self.plain = plain

        def compute_loss(model: Any, inputs: Any, *a: Any, **kw: Any) -> Any:
            """The Trainer's compute_loss, asked for the outputs too (labels captured first: the
            Trainer pops them when it has a compute_loss_func)."""
            if not meter.in_step or a or kw.get("return_outputs"):
                return loss_fn(model, inputs, *a, **kw)
            labels, shifted = _field(inputs, "labels"), _field(inputs, "shift_labels")
            out = loss_fn(model, inputs, return_outputs=True, **kw)
            if not (isinstance(out, tuple) and len(out) == 2):  # a subclass that ignores return_outputs
                return out
            meter.measure(out[1], labels, shifted)
            return out[0]

        trainer.compute_loss = compute_loss
        acc = trainer.accelerator
        backward_fn = acc.backward

        def backward(loss: Any, **kw: Any) -> Any:
            """Accelerate's backward, told first to the probe: the loss as the Trainer
            backpropagates it (v_i), beside the true sum (S_i). A window to compare starts its
            probe here, at its first micro-batch, and only if that loss could be measured (a
            model without logits is never probed, so it never pays for the hooks)."""
            if meter.in_step:
                m = meter.measured
                if meter._model is not None:  # the first micro-batch of a window to compare
                    if m is not None:
                        meter.probe.start(list(meter._model.parameters()))
                    meter._model = None
                if meter.probe.active:
                    meter.probe.weigh(loss, m[0] if m is not None else None)
            return backward_fn(loss, **kw)

        acc.backward = backward

    def window_start(self, epoch: int, model: Any) -> None:
        """The window's first micro-batch: whether this window is compared (the probe starts at
        its first backward)."""
        self._model = None
        if self.plain and (self.grad_check == "every" or (self.grad_check == "epoch" and self._probed_epoch != epoch)):
            self._probed_epoch = epoch
            self._model = model

    def measure(self, outputs: Any, labels: Any, shifted: Any) -> None:
        """The micro-batch's true loss sum and count (S_i, n_i) from its outputs and labels, and
        its labels != -100 unshifted (what a Trainer that does not shift counts). Tensors."""
        logits = logits_of(outputs)
        target = shifted if shifted is not None else labels
        if logits is None or not isinstance(target, torch.Tensor):
            return
        with torch.no_grad():
            got = loss_sum(logits.detach(), target, causal=self.causal and shifted is None, smoothing=self.smoothing,
                           chunk=MEASURE_CHUNK)
        if got is None:
            return
        unshifted: Optional[torch.Tensor]
        if shifted is None and not self.causal and not labels.is_floating_point():
            unshifted = got[1]  # the labels counted as they are: that count, not a second pass over them
        else:
            unshifted = labels.ne(-100).sum() if isinstance(labels, torch.Tensor) else None
        self.measured = (got[0], got[1], unshifted)

    def finish_probe(self, counts: list[Any]) -> None:
        """The window's gradients against the exact ones, before anything (unscale, clip) changes
        them. counts: the micro-batches' true counts."""
        if self.probe.active:
            if counts and all(isinstance(c, torch.Tensor) for c in counts):
                self.probed = self.probe.finish(torch.stack([c.float() for c in counts]).sum())
            self.probe.stop()

    def count(self, inputs: Any) -> tuple[int, Any]:
        """(samples, the loss's count) of one micro-batch from its labels alone, when its loss
        could not be measured: labels != -100, shifted for a causal LM (an int, or a 0-d
        tensor read later with the losses)."""
        labels = _field(inputs, "shift_labels")
        if labels is None:
            labels = _field(inputs, "labels")
            if self.causal and isinstance(labels, torch.Tensor) and labels.ndim > 1:
                labels = labels[..., 1:]  # what a causal LM's loss counts
        if isinstance(labels, torch.Tensor) and labels.ndim >= 1:
            size = labels.shape[0]
            return size, (labels.ne(-100).sum() if labels.ndim > 1 else size)
        size = batch_size(inputs)
        return size, size

    def check(self, losses: list[float], sums: list[float], counts: list[float], num_items: Optional[float],
              scaled: bool, unshifted: float, probed: Optional[tuple[float, float]]) -> WindowCheck:
        """One step against the exact one: each micro-batch's weight a_i = v_i / S_i (what the
        Trainer backpropagated over the true sum), relative to the exact 1/N; the gradients'
        comparison when the window was probed; the cause and the fix when it is off."""
        total = sum(counts)
        pairs = [(v / s, n) for v, s, n in zip(losses, sums, counts) if s != 0 and n > 0]
        result = check_window([a * total for a, _ in pairs], probed)
        if result.off:
            result.cause, result.fix = diagnose([a for a, _ in pairs], [n for _, n in pairs], num_items, scaled,
                                                self.causal, unshifted)
        return result
