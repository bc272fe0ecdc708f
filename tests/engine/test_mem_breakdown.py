"""engine.memory.breakdown: exact bytes of parameters, gradients and optimizer state.

Every expected figure below is computed by hand in the comment beside it (numbers of
elements x bytes per element), not from the tensors being counted.
"""
from __future__ import annotations

import engine_helpers  # noqa: F401 - for its set-up: testkit's sys.path before the engine imports
import pytest
import torch
import torch.nn as nn

from engine.memory.breakdown import MemoryBreakdown, activations, count

# A 3 -> 5 -> 2 network: layer a = 3*5 weights + 5 biases = 20 elements, layer b = 5*2 + 2 = 12.
A_EL, B_EL = 20, 12


def net(freeze_b: bool = False, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).to(dtype)
    if freeze_b:
        for p in m[2].parameters():
            p.requires_grad_(False)
    return m


def backward(m: nn.Module) -> None:
    x = torch.randn(4, 3, dtype=next(m.parameters()).dtype)
    m(x).pow(2).sum().backward()


def test_fp32_adamw_before_and_after_first_step():
    m = net()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    b0 = count(m, opt)
    assert (b0.params, b0.grads, b0.optimizer) == (128, 0, 0)  # 32 elements x 4 bytes, nothing else yet
    backward(m)
    b1 = count(m, opt)
    assert (b1.params, b1.grads, b1.optimizer) == (128, 128, 0)  # a gradient per parameter, no state yet
    opt.step()
    b2 = count(m, opt)
    # AdamW: exp_avg + exp_avg_sq (32 elements x 4 bytes each) + one float32 CPU `step` scalar per
    # parameter tensor (4 tensors x 4 bytes).
    assert b2.optimizer == 2 * 128 + 4 * 4
    assert b2.by_dtype["optimizer"] == {"float32": 272}
    assert b2.by_device["optimizer"] == {"cpu": 272}
    opt.zero_grad(set_to_none=True)
    assert count(m, opt).grads == 0
    backward(m)
    opt.zero_grad(set_to_none=False)  # zeroed but still allocated: still held, still counted
    assert count(m, opt).grads == 128


def test_frozen_layer_counts_as_parameter_without_grad_or_state():
    m = net(freeze_b=True)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3)
    backward(m)
    opt.step()
    b = count(m, opt)
    assert b.params == (A_EL + B_EL) * 4  # 128: the frozen 12 elements too
    assert b.grads == A_EL * 4  # 80: only layer a has gradients
    assert b.optimizer == 2 * A_EL * 4 + 2 * 4  # 168: two moments of layer a + 2 step scalars


@pytest.mark.parametrize("momentum,expected_state", [(0.0, 0), (0.9, A_EL * 4 + B_EL * 4)])
def test_sgd_with_and_without_momentum(momentum, expected_state):
    m = net()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=momentum)
    backward(m)
    assert count(m, opt).optimizer == 0  # before the first step: no momentum buffer yet
    opt.step()
    b = count(m, opt)
    assert b.optimizer == expected_state  # momentum_buffer: one fp32 copy of each parameter (128 B)
    assert (b.params, b.grads) == (128, 128)


def test_bf16_parameters_and_mixed_dtypes():
    m = net(dtype=torch.bfloat16)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    backward(m)
    opt.step()
    b = count(m, opt)
    assert (b.params, b.grads) == (64, 64)  # 32 elements x 2 bytes
    # moments in the parameters' dtype (2 x 64), step scalars stay float32 (4 x 4)
    assert b.by_dtype["optimizer"] == {"bfloat16": 128, "float32": 16}
    assert b.optimizer == 144
    mixed = net()
    mixed[2].to(torch.bfloat16)
    bm = count(mixed, None)
    assert bm.by_dtype["params"] == {"float32": A_EL * 4, "bfloat16": B_EL * 2}  # 80 + 24
    assert bm.dtype_totals() == {"float32": 80, "bfloat16": 24}


class Tied(nn.Module):
    def __init__(self, share_storage: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied: the same Parameter
        # A second Parameter object over the same memory: only storage dedup can see it.
        base = torch.zeros(6)
        self.a = nn.Parameter(base)
        self.b = nn.Parameter(base if share_storage else torch.zeros(6))

    def forward(self, x):
        return self.head(self.emb(x)).sum() + (self.a * self.b).sum()


@pytest.mark.parametrize("share", [True, False])
def test_tied_weights_and_shared_storage_count_once(share):
    m = Tied(share)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    b = count(m, opt)
    # embedding 10 x 4 = 40 floats (160 B) once, not twice; a: 6 floats (24 B); b: 24 B only if separate
    assert b.params == 160 + 24 + (0 if share else 24)
    m(torch.tensor([1, 2, 3])).backward()
    opt.step()
    b = count(m, opt)
    # gradients are separate tensors even for shared storage (a.grad and b.grad differ)
    assert b.grads == 160 + 24 + 24
    assert b.optimizer == 2 * (160 + 24 + 24) + 3 * 4  # 3 parameter tensors with state


def test_optimizer_parameters_outside_the_model_count_as_parameters():
    m = net()
    extra = nn.Parameter(torch.zeros(7))  # e.g. a learnable temperature the task keeps outside the model
    opt = torch.optim.SGD(list(m.parameters()) + [extra], lr=0.1)
    assert count(m, opt).params == 128 + 28
    assert count(m, None).params == 128


def test_meta_tensors_hold_nothing():
    with torch.device("meta"):
        m = nn.Linear(1000, 1000)
    assert count(m, None).params == 0


def test_counting_never_reads_a_value(monkeypatch):
    """No .item(), .tolist() or truth test: on a GPU each would be a host sync."""
    m = net()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    backward(m)
    opt.step()
    expected = count(m, opt)

    def boom(*_a, **_k):
        raise AssertionError("count() read a tensor value")
    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, boom)
    assert count(m, opt) == expected


def test_activations_is_peak_minus_the_parts_on_that_device():
    b = MemoryBreakdown(params=1000, grads=1000, optimizer=2016,
                        by_device={"params": {"cuda:0": 1000}, "grads": {"cuda:0": 1000},
                                   "optimizer": {"cuda:0": 2000, "cpu": 16}})
    assert activations(None, b) is None  # CPU: no peak
    assert activations(10_000, b, device="cpu") is None
    assert activations(10_000, b) == 10_000 - 4016
    assert activations(10_000, b, device="cuda:0") == 10_000 - 4000  # the CPU step scalars are not in the peak
    assert activations(3000, b, device="cuda:0") == 0  # never negative


def test_many_tensors_are_counted_once_each():
    """100 parameter tensors and their AdamW state, counted on repeated calls without drift
    (what a step costs is bench/overhead.py's to measure, not a timed test's)."""
    layers = nn.Sequential(*[nn.Linear(8, 8) for _ in range(50)])  # 100 parameter tensors
    opt = torch.optim.AdamW(layers.parameters(), lr=1e-3)
    layers(torch.randn(2, 8)).sum().backward()
    opt.step()
    first = count(layers, opt)
    for _ in range(3):
        b = count(layers, opt)
    assert b == first
    assert b.optimizer == 2 * 50 * (64 + 8) * 4 + 100 * 4
