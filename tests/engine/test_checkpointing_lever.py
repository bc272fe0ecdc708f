"""engine.memory.activation_checkpointing: the activation-checkpointing switch (task-declared, Hugging Face, none)."""
from __future__ import annotations

import copy
import importlib.util

import engine_helpers  # noqa: F401 - for its set-up: testkit's sys.path before the engine imports
import pytest
import torch
import torch.nn as nn

from engine.memory.activation_checkpointing import checkpoint_modules, count_blocks, find_switch, why_no_switch
from engine.tasks.task import Task


class Counted(nn.Module):
    """A block whose forward counts its runs; dropout makes the RNG replay matter."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.drop = nn.Dropout(0.3)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x + self.drop(torch.tanh(self.lin(x)))


class Toy(nn.Module):
    def __init__(self, d: int = 8, L: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(4, d)
        self.blocks = nn.ModuleList(Counted(d) for _ in range(L))
        self.head = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def toy_loss(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).sum(), len(y)


def toy_task(declare: bool = True) -> Task:
    torch.manual_seed(0)
    t = Task(model=Toy(), train_data=[(torch.randn(4), torch.randn(1)) for _ in range(8)], loss=toy_loss)
    if declare:
        t.checkpointing = lambda model, on: checkpoint_modules(model.blocks, on)  # the field Task will get
    return t


def train_window(model: nn.Module, micro: int = 2, n_micro: int = 3, seed: int = 7) -> list[torch.Tensor]:
    """Accumulate n_micro micro-batches; the gradients of the window, and the same dropout draws every time."""
    model.train()
    model.zero_grad(set_to_none=True)
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(seed)
    for _ in range(n_micro):
        x, y = torch.randn(micro, 4, generator=g), torch.randn(micro, 1, generator=g)
        loss_sum, _ = toy_loss(model, (x, y))
        loss_sum.backward()
    return [p.grad.clone() for p in model.parameters()]


def calls(model: Toy) -> list[int]:
    return [b.calls for b in model.blocks]


def test_task_switch_recomputes_each_block_once_more_and_keeps_the_gradients():
    task = toy_task()
    model = task.model
    ref_model = copy.deepcopy(model)
    switch = find_switch(task, model)
    assert switch is not None and switch.source == "task" and switch.layers == 3

    ref = train_window(ref_model)  # never switched: the plain gradients
    assert calls(ref_model) == [3, 3, 3]  # one forward per micro-batch

    switch(True)
    assert switch.on
    on = train_window(model)
    assert calls(model) == [6, 6, 6]  # forward + recomputation in the backward, per micro-batch
    for a, b in zip(on, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)

    switch(False)
    for b in model.blocks:
        b.calls = 0
    off = train_window(model)
    assert calls(model) == [3, 3, 3]
    for a, b in zip(off, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_negative_control_the_gradient_comparison_can_fail():
    """Without the RNG replay the recomputed dropout masks differ, and the comparison above sees it."""
    from torch.utils.checkpoint import checkpoint
    task = toy_task(declare=False)
    model, ref_model = task.model, copy.deepcopy(task.model)
    ref = train_window(ref_model)
    for b in model.blocks:
        plain = b.forward
        b.forward = lambda x, plain=plain: checkpoint(plain, x, use_reentrant=False, preserve_rng_state=False)
    bad = train_window(model)
    assert calls(model) == [6, 6, 6]
    assert max((a - b).abs().max().item() for a, b in zip(bad, ref, strict=True)) > 1e-3


def test_switch_is_idempotent_eval_runs_plainly_and_deepcopy_rebinds():
    task = toy_task()
    model = task.model
    switch = find_switch(task, model)
    switch(True)
    switch(True)  # twice: still one checkpoint layer, not two
    train_window(model, n_micro=1)
    assert calls(model) == [2, 2, 2]
    model.eval()
    with torch.no_grad():
        model(torch.randn(2, 4))
    assert calls(model) == [3, 3, 3]  # no recomputation outside training
    clone = copy.deepcopy(model)  # e.g. a snapshot: its blocks run their own forward, not the original's
    for b in clone.blocks:
        b.calls = 0
    train_window(clone, n_micro=1)
    assert calls(clone) == [2, 2, 2] and calls(model) == [3, 3, 3]
    switch(False)
    assert all("forward" not in b.__dict__ for b in model.blocks)


def test_a_forward_set_by_another_tool_is_kept_and_restored():
    m = Counted(4)
    seen = []

    def hooked(x):
        seen.append(1)
        return type(m).forward(m, x)
    m.forward = hooked
    checkpoint_modules([m], True)
    m.train()
    m(torch.randn(2, 4, requires_grad=True)).sum().backward()
    assert len(seen) == 2 and m.calls == 2
    checkpoint_modules([m], False)
    assert m.forward is hooked


def test_no_switch_for_a_plain_model():
    task = toy_task(declare=False)
    assert find_switch(task, task.model) is None
    why = why_no_switch(task, task.model)
    assert "checkpointing=fn(model, on)" in why and "Toy" in why
    assert count_blocks(task.model) == 3


class FakeHF(nn.Module):
    """The Hugging Face surface without transformers: enable/disable and is_gradient_checkpointing."""
    supports_gradient_checkpointing = True

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.is_gradient_checkpointing = False
        self.kwargs = None

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.is_gradient_checkpointing, self.kwargs = True, gradient_checkpointing_kwargs

    def gradient_checkpointing_disable(self):
        self.is_gradient_checkpointing = False


class Wrapper(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.model = inner


def test_hf_surface_found_directly_and_one_level_down_not_two():
    direct, inner_one = FakeHF(), FakeHF()
    for outer, inner in ((direct, direct), (Wrapper(inner_one), inner_one)):
        task = toy_task(declare=False)
        switch = find_switch(task, outer)
        assert switch is not None and switch.source == "huggingface"
        switch(True)
        assert inner.is_gradient_checkpointing and inner.kwargs == {"use_reentrant": False}
        switch(False)
        assert not inner.is_gradient_checkpointing
    assert find_switch(toy_task(declare=False), Wrapper(Wrapper(FakeHF()))) is None
    unsupported = FakeHF()
    unsupported.supports_gradient_checkpointing = False
    assert find_switch(toy_task(declare=False), unsupported) is None
    assert "does not support" in why_no_switch(None, unsupported)


def test_a_declared_switch_wins_over_hf():
    task = toy_task(declare=False)
    called = []
    task.checkpointing = lambda model, on: called.append(on)
    switch = find_switch(task, FakeHF())
    switch(True)
    assert switch.source == "task" and called == [True]


HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def hf_state(m) -> bool:
    """is_activation_checkpointing (transformers 5) or is_gradient_checkpointing (older; deprecated in 5)."""
    import warnings
    if hasattr(type(m), "is_activation_checkpointing"):
        return m.is_activation_checkpointing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return m.is_gradient_checkpointing


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed in this venv (optional extra)")
def test_tiny_gpt2_from_config_is_found_and_toggled():
    import warnings

    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, use_cache=False,
                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    gpt = GPT2LMHeadModel(cfg)  # from config: no download
    wrapped = Wrapper(gpt)
    task = toy_task(declare=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the current names, not the deprecated ones
        for model in (gpt, wrapped):
            switch = find_switch(task, model)
            assert switch is not None and switch.source == "huggingface" and switch.layers == 2
            assert not hf_state(gpt) and not switch.on
            switch(True)
            assert hf_state(gpt)
            switch(False)
            assert not hf_state(gpt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert gpt.is_gradient_checkpointing is False  # the name the brief knows, still answering in 5.x

    # And it recomputes: inside each block, the MLP starts twice per micro-batch with it on
    # (transformers 5 checkpoints the block's forward, so hooks on the block itself run once; and
    # torch stops a recomputation early once the last saved tensor is back, so a post-hook on the
    # block's last module may never run: a pre-hook counts the starts).
    runs = {"n": 0}
    hooks = [b.mlp.register_forward_pre_hook(lambda *_: runs.__setitem__("n", runs["n"] + 1)) for b in gpt.transformer.h]
    ids = torch.randint(0, 64, (2, 8))
    gpt.train()

    def step() -> list[torch.Tensor]:
        gpt.zero_grad(set_to_none=True)
        runs["n"] = 0
        gpt(input_ids=ids, labels=ids).loss.backward()
        return [p.grad.clone() for p in gpt.parameters() if p.grad is not None]
    off = step()
    assert runs["n"] == 2
    switch = find_switch(task, gpt)
    switch(True)
    on = step()
    assert runs["n"] == 4
    for a, b in zip(on, off, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    switch(False)
    for h in hooks:
        h.remove()
