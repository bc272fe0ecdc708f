"""The Hugging Face side of exactness: the true loss of a micro-batch, the exact loss, the diagnosis.

`loss_sum` computes a micro-batch's loss *sum* and count from the logits and labels the
model saw, independently of the Trainer's bookkeeping: cross-entropy over the labels that
are not -100 (shifted by one for a causal LM, whose logits at position t predict label t+1),
or a squared error for a regression head. `exact_loss` divides that sum by the window's
count (the Trainer's `num_items_in_batch`): pass it as `Trainer(compute_loss_func=...)`.
A `compute_loss_func` replaces the Trainer's own loss, label smoothing included, so
`exact_loss` applies what the calling Trainer would have (`trainer_smoothing`), or refuses.
`diagnose` says why a window's weights are what they are, and what fixes it.
"""
from __future__ import annotations

import sys
from collections import abc
from types import FrameType
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

from ._exactness import same

IGNORE = -100
CAUSAL_FIX = ('set model.loss_type = "ForCausalLM" before Trainer(...): the Trainer then counts the '
              'shifted labels, as the loss does')
MEAN_FIX = "pass compute_loss_func=engine.integrations.transformers.exact_loss to Trainer(...)"


def is_causal_lm(model: Any) -> bool:
    """Whether `model`'s loss shifts its labels (a decoder-only LM), judged from the model
    itself, not from the Trainer's flag (which misses GPT-2 built from a config)."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "is_encoder_decoder", False):
        return False
    if getattr(model, "loss_type", None) == "ForCausalLM":
        return True
    name = type(model).__name__
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        if name in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()):
            return True
    except ImportError:  # pragma: no cover - an older or trimmed transformers
        pass
    return name.endswith(("ForCausalLM", "LMHeadModel"))


def logits_of(outputs: Any) -> Optional[torch.Tensor]:
    """The outputs' logits (a ModelOutput, a dict), or None."""
    if type(outputs) is dict:
        x = outputs.get("logits")
    elif isinstance(outputs, abc.Mapping):  # a ModelOutput (an OrderedDict) holds only what is set
        x = outputs["logits"] if "logits" in outputs else None
    else:
        x = getattr(outputs, "logits", None)
    return x if isinstance(x, torch.Tensor) else None


def loss_sum(logits: torch.Tensor, labels: torch.Tensor, causal: bool, smoothing: float = 0.0,
             chunk: int = 0) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """(loss sum, count) of one micro-batch, or None when its shapes are not a
    classification's or a regression's. Differentiable (exact_loss uses it). chunk: at most
    this many logits at a time (the measurement beside training: a large vocabulary's
    float32 copy and its log-softmax never held whole; 0 = all at once)."""
    if not isinstance(labels, torch.Tensor):
        return None
    labels = labels.to(logits.device)
    if labels.is_floating_point():
        if logits.numel() != labels.numel():
            return None
        n = torch.tensor(labels.numel(), device=logits.device)
        x, y = logits.float().reshape(-1), labels.float().reshape(-1)
        if logits.dim() >= 2 and logits.shape[-1] > 1:  # multi-label: HF's BCEWithLogitsLoss, a mean over all
            return F.binary_cross_entropy_with_logits(x, y, reduction="sum"), n
        return F.mse_loss(x, y, reduction="sum"), n  # a regression head (num_labels == 1): HF's MSELoss
    if causal:
        if logits.dim() < 3 or labels.dim() < 2:
            return None
        logits, labels = logits[..., :-1, :], labels[..., 1:]
    if logits.shape[:-1] != labels.shape:
        return None
    flat = labels.reshape(-1)
    rows = logits.reshape(-1, logits.shape[-1])
    step = max(1, chunk // max(1, rows.shape[1]) if chunk else rows.shape[0])
    if step >= rows.shape[0]:  # one chunk, the common case, measured every micro-batch: no slices, and no
        # Python sum() (its 0 + tensor is one more op)
        return F.cross_entropy(rows.float(), flat, ignore_index=IGNORE, reduction="sum",
                               label_smoothing=float(smoothing)), flat.ne(IGNORE).sum()
    s = sum(F.cross_entropy(rows[i:i + step].float(), flat[i:i + step], ignore_index=IGNORE, reduction="sum",
                            label_smoothing=float(smoothing)) for i in range(0, rows.shape[0], step))
    return s, flat.ne(IGNORE).sum()  # type: ignore[return-value]  # two chunks at least: the sum is a tensor


_CALLER_FRAMES = 8  # Trainer.compute_loss calls compute_loss_func directly; a user's wrapper adds a few


def trainer_smoothing(start: Optional[FrameType]) -> float:
    """The label smoothing the Trainer calling a `compute_loss_func` applies itself when it has
    none (its `label_smoother`), found from the call's frames: the nearest frame whose `self`
    is a transformers Trainer. 0.0 outside a Trainer. A label_smoother other than transformers'
    own LabelSmoother (whose loss is cross-entropy with label smoothing, as here) is refused by
    name: exact_loss would drop what it does."""
    try:
        from transformers import Trainer
        from transformers.trainer_pt_utils import LabelSmoother
    except ImportError:  # no transformers: no Trainer can be calling
        return 0.0
    frame = start
    for _ in range(_CALLER_FRAMES):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer):
            smoother = getattr(owner, "label_smoother", None)
            if smoother is None:
                return 0.0
            if type(smoother) is not LabelSmoother or smoother.ignore_index != IGNORE:
                raise TypeError(f"exact_loss cannot apply the Trainer's label_smoother {smoother!r}: a "
                                f"compute_loss_func replaces it; drop one of the two (exact_loss applies "
                                f"TrainingArguments(label_smoothing_factor=...) itself)")
            return float(smoother.epsilon)
        frame = frame.f_back
    return 0.0


def exact_loss(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None, **_: Any) -> torch.Tensor:
    """A `compute_loss_func` that makes a Trainer's accumulation exact: the micro-batch's loss
    sum divided by the window's count (`num_items_in_batch`, which the Trainer counts over the
    whole window), so the accumulated gradient is the whole window's as one batch. Cross-entropy
    for classification, token classification, masked and causal LMs (labels shifted when the
    outputs are a causal LM's); squared error for a regression head. For a causal LM, the
    Trainer must count the shifted labels too: see CAUSAL_FIX (GPT-2 built from a config).
    The calling Trainer's label smoothing (label_smoothing_factor) is applied, as the Trainer
    would without a compute_loss_func (trainer_smoothing)."""
    smoothing = trainer_smoothing(sys._getframe(1))
    logits = logits_of(outputs)
    if logits is None:
        raise TypeError("exact_loss: the model's outputs have no `logits`")
    causal = "CausalLM" in type(outputs).__name__
    got = loss_sum(logits, labels, causal, smoothing)
    if got is None:
        raise TypeError(f"exact_loss: logits {tuple(logits.shape)} and labels "
                        f"{tuple(getattr(labels, 'shape', ()))} are neither a classification's nor a regression's")
    s, n = got
    if num_items_in_batch is None:  # no accumulation window known: this micro-batch's mean
        return s / n.clamp(min=1)
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(s.device)
    return s / num_items_in_batch


def diagnose(weights: Sequence[float], counts: Sequence[float], num_items: Optional[float], scaled: bool,
             causal: bool, unshifted: Optional[float]) -> tuple[str, str]:
    """(cause, fix) of a window whose micro-batch weights a_i (backpropagated loss / true sum)
    are not 1/N. counts: the true n_i; num_items: the Trainer's num_items_in_batch; scaled:
    whether the Trainer took the loss as already divided by it; unshifted: the window's count
    of labels != -100 before any shift (what a Trainer that does not shift counts)."""
    m = len(weights)
    total = sum(counts)
    if m and all(same(a * n, 1.0) for a, n in zip(weights, counts)):
        if scaled:
            return (f"the model's loss is a plain mean over its micro-batch, but the Trainer took it as already "
                    f"divided by num_items_in_batch (the model's forward takes **kwargs) and skipped its division "
                    f"by the {m} accumulation steps: each update is {m} times too large", MEAN_FIX)
        return "each micro-batch's mean loss is backpropagated undivided", MEAN_FIX
    if m and all(same(a * n * m, 1.0) for a, n in zip(weights, counts)):
        return (f"the Trainer divides each micro-batch's mean loss by the {m} accumulation steps (a mean of means): "
                f"micro-batches with fewer {'tokens' if causal else 'items'} weigh more", MEAN_FIX)
    if num_items and m and all(same(a * num_items, 1.0) for a in weights):
        why = f"the loss is divided by num_items_in_batch = {num_items:g}, the Trainer's count, but it counts {total:g}"
        if causal and unshifted is not None and same(num_items, unshifted):
            return (why + ": the Trainer counted the labels unshifted, and a causal LM's loss shifts them "
                    "(the Trainer does not know this model's loss shifts)", CAUSAL_FIX)
        return why, MEAN_FIX
    return ("the micro-batches' losses are weighted unlike their share of the window's count",
            MEAN_FIX + (" (and " + CAUSAL_FIX + ")" if causal else ""))
