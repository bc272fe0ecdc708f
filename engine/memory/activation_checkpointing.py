"""Activation checkpointing as a lever: a switch the trainer can flip between windows.

With checkpointing on, a block keeps only its inputs during the forward and runs its
forward again during the backward to rebuild what the backward needs: less memory per
sample, about one more forward per step. Gradients are the same (the recomputation
replays the RNG state, so dropout masks match).

Where the switch comes from, first found wins:

1. the task declares it: Task(checkpointing=fn(model, on)). The helper
   checkpoint_modules(modules, on) below is what such a fn usually does, e.g.
   `checkpointing=lambda model, on: checkpoint_modules(model.blocks, on)`;
2. a Hugging Face model (anything with activation_checkpointing_enable / _disable, the
   transformers 5 names, or gradient_checkpointing_enable / _disable, the older ones;
   and not supports_gradient_checkpointing = False), the model itself or one level down
   (model.model, model.module, any direct child): found by itself, enabled with
   use_reentrant=False;
3. otherwise none: find_switch returns None and why_no_switch says why, for the
   command_refused event.

How the trainer calls it:

    # once, at setup (after the task is built, with the model itself):
    self.ckpt_switch = checkpointing.find_switch(self.task, self.model)
    # on SetCheckpointing(checkpointing) at a boundary (never inside a window):
    if self.ckpt_switch is None:
        refuse(checkpointing.why_no_switch(self.task, self.model))
    else:
        self.ckpt_switch(cmd.checkpointing)  # idempotent; self.ckpt_switch.on is the state now
    # for the what-fits table: CheckpointModel(layers=self.ckpt_switch.layers)

torch-importing, Qt-free.
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

_MARK = "_headroom_checkpointed"
_BEFORE = "_headroom_forward_before"


@dataclass
class CheckpointSwitch:
    """Callable: switch(True) / switch(False). `on` is the state it last set."""
    apply: Callable[[bool], None]
    source: str               # "task" or "huggingface"
    layers: Optional[int]     # how many blocks are checkpointed, if known (for engine.memory.what_fits.levers.CheckpointModel)
    on: bool = False

    def __call__(self, on: bool) -> None:
        self.apply(bool(on))
        self.on = bool(on)


# -- a generic switch for task authors ------------------------------------------------------


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    before = self.__dict__.get(_BEFORE)
    fwd = before if before is not None else types.MethodType(type(self).forward, self)
    if torch.is_grad_enabled() and self.training:
        return checkpoint(fwd, *args, use_reentrant=False, **kwargs)
    return fwd(*args, **kwargs)  # validation, no_grad: nothing to save, nothing to recompute


def checkpoint_modules(modules: Iterable[nn.Module], on: bool) -> int:
    """Run each module's forward through torch.utils.checkpoint (use_reentrant=False) when
    `on`, plainly when not. Idempotent; returns how many modules it touched. Only while
    training with gradients enabled: eval and no_grad forwards run plainly.

    It sets an instance-level forward (a bound method, so copy.deepcopy of the model
    rebinds it to the copy). The module's own hooks stay outside the checkpoint and run
    once per call either way (as transformers 5 does; FSDP2-style hooks must not run twice);
    the hooks of its submodules run again in the recomputation. a forward some other tool already set on the instance
    is kept and called through the checkpoint, and restored when switched off."""
    n = 0
    for m in modules:
        current = m.__dict__.get("forward")
        ours = current is not None and getattr(current, "__func__", None) is _checkpointed_forward
        if on and not ours:
            if current is not None:
                object.__setattr__(m, _BEFORE, current)
            object.__setattr__(m, "forward", types.MethodType(_checkpointed_forward, m))
        elif not on and ours:
            before = m.__dict__.pop(_BEFORE, None)
            del m.__dict__["forward"]
            if before is not None:
                object.__setattr__(m, "forward", before)
        n += 1
    return n


def count_blocks(model: nn.Module) -> Optional[int]:
    """The usual number of repeated blocks: a Hugging Face config's num_hidden_layers,
    else the longest nn.ModuleList in the model (None if it has none)."""
    for m in _candidates(model):
        cfg = getattr(m, "config", None)
        for name in ("num_hidden_layers", "n_layer", "num_layers"):
            v = getattr(cfg, name, None)
            if isinstance(v, int) and v > 0:
                return v
    lengths = [len(m) for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    return max(lengths) if lengths else None


# -- finding the switch ---------------------------------------------------------------------


def _candidates(model: nn.Module) -> list[nn.Module]:
    out = [model]
    for attr in ("module", "model"):  # DDP and common wrappers, even when not registered as children
        m = getattr(model, attr, None) if attr not in model._modules else model._modules[attr]
        if isinstance(m, nn.Module) and m not in out:
            out.append(m)
    for _, child in model.named_children():
        if child not in out:
            out.append(child)
    return out


# (enable, disable, kwargs name, state property): transformers 5 renamed the methods; the old
# names still work there, with a FutureWarning, until v6.
_HF_NAMES = (("activation_checkpointing_enable", "activation_checkpointing_disable",
              "activation_checkpointing_kwargs", "is_activation_checkpointing"),
             ("gradient_checkpointing_enable", "gradient_checkpointing_disable",
              "gradient_checkpointing_kwargs", "is_gradient_checkpointing"))


def _hf(model: nn.Module) -> Optional[tuple[nn.Module, tuple[str, str, str, str]]]:
    for m in _candidates(model):
        if not getattr(m, "supports_gradient_checkpointing", True):
            continue
        for names in _HF_NAMES:
            if callable(getattr(m, names[0], None)) and callable(getattr(m, names[1], None)):
                return m, names
    return None


def find_switch(task: Any, model: nn.Module) -> Optional[CheckpointSwitch]:
    """The checkpointing switch for this task's model, or None (see why_no_switch)."""
    fn = getattr(task, "checkpointing", None)
    if callable(fn):
        layers = getattr(task, "checkpointing_layers", None) or count_blocks(model)
        return CheckpointSwitch(apply=lambda on: fn(model, on), source="task", layers=layers)
    found = _hf(model)
    if found is None:
        return None
    hf, (enable, disable, kwargs_name, state) = found

    def apply(on: bool) -> None:
        if on:
            try:
                getattr(hf, enable)(**{kwargs_name: {"use_reentrant": False}})
            except TypeError:  # transformers before 4.35: no kwargs
                getattr(hf, enable)()
        else:
            getattr(hf, disable)()
    return CheckpointSwitch(apply=apply, source="huggingface", layers=count_blocks(hf),
                            on=bool(getattr(hf, state, False)))


def why_no_switch(task: Any, model: nn.Module) -> str:
    for m in _candidates(model):
        if not getattr(m, "supports_gradient_checkpointing", True) and any(
                callable(getattr(m, names[0], None)) for names in _HF_NAMES):
            return (f"activation checkpointing: {type(m).__name__} does not support gradient checkpointing "
                    "(supports_gradient_checkpointing is False)")
    return (f"activation checkpointing: the task declares no checkpointing=fn(model, on) and "
            f"{type(model).__name__} is not a Hugging Face model (no gradient_checkpointing_enable); "
            "a task can use engine.memory.activation_checkpointing.checkpoint_modules(model.blocks, on)")
