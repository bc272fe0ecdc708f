"""What HeadroomCallback changes on a Hugging Face Trainer, and how it finds it.

The callback API does not pass the Trainer (module doc of engine/integrations/transformers.py):
the Trainer is found (`training_trainer`) or handed over, its train() guarded
(`guard_train`), and for a run four attributes are replaced by wrappers on the instance
(`MARK` says which); `unwrap` puts the class's own back. `host_norm_clip` is the clip that
reads the norm to the host once. What the Trainer computes is not changed.
"""
from __future__ import annotations

import sys
from types import FrameType
from typing import Any, Callable, Optional

import torch
import transformers
from transformers import Trainer

from engine.accumulation.grads import clip_params_by_host_norm_

from .loop import clean

MARK = "_headroom_wrapped"  # on a Trainer whose attributes are wrapped: (trainer, accelerator)
_TRAINER_FRAMES = 6  # on_train_begin is 3 frames below the training loop in transformers 4.46-5.x


def unwrap(trainer: Any) -> None:
    """The Trainer's and its Accelerator's own methods back (the wrappers are instance attributes)."""
    wrapped = trainer.__dict__.pop(MARK, None)
    if wrapped is not None:
        trainer.__dict__.pop("training_step", None)
        trainer.__dict__.pop("compute_loss", None)
        wrapped[1].__dict__.pop("clip_grad_norm_", None)
        wrapped[1].__dict__.pop("backward", None)


def unwrapped_model(trainer: Trainer) -> Any:
    """The model itself: out of Accelerate's wrapper and a PEFT adapter."""
    m = trainer.model
    try:
        m = trainer.accelerator.unwrap_model(m)
    except Exception:
        pass
    base = getattr(m, "get_base_model", None)
    return base() if callable(base) else m


def training_trainer(state: Any) -> Optional[Trainer]:
    """The Trainer whose train() (or __init__) is calling a hook, for a callback given as
    `callbacks=[HeadroomCallback()]` without attach(). The hook runs a fixed few frames
    below the Trainer's method (CallbackHandler.on_... -> call_event -> the hook); a frame
    counts only if its `self` is a Trainer whose state is the very `state` the hook was
    given, so no other Trainer can be taken for it."""
    frame: Optional[FrameType] = sys._getframe(2)
    for _ in range(_TRAINER_FRAMES):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer) and owner.state is state:
            return owner
        frame = frame.f_back
    return None


def guard_train(trainer: Trainer, owner: object, on_failure: Callable[[BaseException], None]) -> None:
    """Whatever raises in trainer.train() (the collator, an evaluation, compute_metrics, not
    only training_step) is given to on_failure before it goes on up. Once per owner."""
    if getattr(trainer.train, "_headroom_guard", None) is owner:
        return
    train = trainer.train

    def guarded_train(*a: Any, **kw: Any) -> Any:
        try:
            return train(*a, **kw)
        except BaseException as e:
            on_failure(e)
            raise

    guarded_train._headroom_guard = owner  # type: ignore[attr-defined]  # a marker on the function object
    trainer.train = guarded_train  # type: ignore[method-assign]  # an instance attribute: the class's method is untouched


def run_config(args: Any, state: Any, extra: dict) -> dict:
    """The run table's settings, in the engine's names, from the TrainingArguments."""
    precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    epochs = getattr(state, "num_train_epochs", None) or args.num_train_epochs
    cfg = dict(micro_batch=args.per_device_train_batch_size, accum=args.gradient_accumulation_steps,
               lr=args.learning_rate, clip=args.max_grad_norm or 0.0, epochs=clean(epochs),
               max_steps=state.max_steps if state.max_steps and state.max_steps > 0 else None,
               optimizer=clean(args.optim), precision=precision, device=str(args.device), seed=args.seed,
               lr_schedule=clean(args.lr_scheduler_type), warmup=clean(args.warmup_steps),
               output_dir=args.output_dir, framework="transformers",
               framework_version=transformers.__version__)
    cfg.update(extra)
    return cfg


def host_norm_clip(acc: Any, plain: bool, before: Callable[[], None],
                   seen: Callable[[Any, Optional[float]], None]) -> Callable[..., Any]:
    """A replacement for Accelerate's clip_grad_norm_, which on one device or under DDP is
    torch's (get_total_norm, then clip_grads_with_norm_): the same here, bit for bit, with
    the norm read to the host once (the row needs it) and the clip coefficient computed
    there. FSDP, DeepSpeed, XLA, DTensor gradients, another norm: Accelerate's own.
    before() runs first (the gradient probe, before the unscale and the clip); seen(norm,
    norm as a float or None) gets the norm."""
    clip_fn = acc.clip_grad_norm_

    def clip_grad_norm_(parameters: Any, max_norm: Any, norm_type: Any = 2, *a: Any, **kw: Any) -> Any:
        params = list(parameters)
        grads = [p.grad for p in params if p.grad is not None]
        before()
        if not (plain and grads and norm_type == 2 and not a and not kw
                and all(type(g) is torch.Tensor for g in grads)):
            norm = clip_fn(params, max_norm, norm_type, *a, **kw)
            seen(norm, None)
            return norm
        acc.unscale_gradients()  # fp16: what Accelerate does first (nothing without a scaler)
        norm = torch.nn.utils.get_total_norm(grads)
        norm_f = float(norm)
        clip_params_by_host_norm_(params, float(max_norm), norm, norm_f)
        seen(norm, norm_f)
        return norm

    return clip_grad_norm_


__all__ = ["MARK", "guard_train", "host_norm_clip", "run_config", "training_trainer", "unwrap", "unwrapped_model"]
