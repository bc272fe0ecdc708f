"""Train/eval mode as the user built it.

`model.train()` would switch every module to train mode, including a BatchNorm the user
froze (eval, parameters requires_grad=False): its running statistics would drift, and
4x4 and 16x1 would no longer train the same model. And a model that arrives in eval
mode (every Hugging Face `from_pretrained` model) must still train with dropout on.

The rule: a module the task built in eval mode whose parameters are all frozen (and
that holds parameters or buffers) is a frozen part; it and everything inside it keep
the mode they were built with. Every other module trains in train mode. Validation
switches to eval and `train_mode` puts this exact state back afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TrainModes:
    kept_eval: frozenset[str]  # names of the modules that stay in eval mode while training
    built: tuple[tuple[str, bool], ...]  # every module's mode as the task built it

    @classmethod
    def record(cls, model: torch.nn.Module) -> "TrainModes":
        built = tuple((name, m.training) for name, m in model.named_modules())
        kept: set[str] = set()
        for name, m in model.named_modules():
            if m.training or any(name.startswith(k + ".") or name == k for k in kept):
                continue
            params = list(m.parameters())
            holds = bool(params) or any(True for _ in m.buffers())
            if holds and not any(p.requires_grad for p in params):
                kept.update(n if not name else (f"{name}.{n}" if n else name) for n, _ in m.named_modules())
        return cls(frozenset(kept), built)

    def train_mode(self, model: torch.nn.Module) -> None:
        """Train mode for training: everything but the frozen parts."""
        model.train()
        for name, m in model.named_modules():
            if name in self.kept_eval:
                m.eval()

    def restore_built(self, model: torch.nn.Module) -> None:
        """Exactly the modes the task built."""
        modes = dict(self.built)
        for name, m in model.named_modules():
            if name in modes:
                m.training = modes[name]
