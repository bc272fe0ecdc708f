"""Clipping: the reported grad_norm is the norm before clipping; the update uses the clipped
gradient, whose norm is the clip value; clip 0 is off."""
from __future__ import annotations

import pytest
import torch
from engine_helpers import RecordingSGD, flat, make_task, params_of, rel_err, run_trainer, token_collate, token_loss_sum

from engine.accumulation import sampling
from engine.store import RunReader

N, MICRO, ACCUM = 12, 3, 4  # one window of 12 samples = one step per epoch


def window_gradient():
    """The true gradient of the first window, by hand."""
    task = make_task(N)
    window = sampling.epoch_order(N, 0, 1)[: MICRO * ACCUM]
    loss_sum, count = token_loss_sum(task.model, token_collate([task.train_data[i] for i in window]))
    (loss_sum / count).backward()
    return flat([p.grad for p in task.model.parameters()])


@pytest.mark.parametrize("how", ["below", "above", "off"])
def test_reported_norm_is_pre_clip_and_update_is_clipped(tmp_path, how):
    g = window_gradient()
    norm = float(g.norm())
    assert norm > 0.05
    clip = {"below": norm / 4, "above": norm * 4, "off": 0.0}[how]
    task = make_task(N, optimizer=RecordingSGD)
    w0 = flat(params_of(task.model))
    run = run_trainer(task, tmp_path / "run", micro_batch=MICRO, accum=ACCUM, lr=1.0, clip=clip, max_steps=1)
    (m,) = run.steps
    assert m.grad_norm == pytest.approx(norm, rel=1e-10)  # before clipping, whatever the clip
    assert m.clip == clip
    applied = flat(run.trainer.optimizer.grads[0])
    w1 = flat(params_of(run.trainer.model))
    assert rel_err(w0 - w1, applied) < 1e-12  # SGD lr 1: the update is the applied gradient
    if how == "below":
        assert m.clipped is True
        assert float(applied.norm()) == pytest.approx(clip, rel=1e-5)  # torch's clip adds eps 1e-6
        assert rel_err(applied, g * (clip / norm)) < 1e-5  # same direction, scaled down
    else:
        assert m.clipped is False
        assert rel_err(applied, g) < 1e-10  # untouched
    row = RunReader(run.run_dir).metrics()[0]
    assert row["grad_norm"] == pytest.approx(norm, rel=1e-10)
    assert row["clipped"] == (how == "below") and row["clip"] == clip


def test_clip_saturation_event(tmp_path):
    """A clip far below every step's norm: one clip_saturation event after 50 clipped steps."""
    run = run_trainer(make_task(60), tmp_path / "run", micro_batch=1, accum=1, lr=0.01, clip=1e-6)
    assert all(m.clipped for m in run.steps) and len(run.steps) == 60
    (ev,) = run.of("clip_saturation")
    assert ev.step == 50 and ev.fraction == 1.0 and ev.clip == 1e-6
    assert [e["step"] for e in RunReader(run.run_dir).events(kinds=["clip_saturation"])] == [50]


def test_host_clip_is_bit_identical_to_the_device_clip():
    """The synchronous step clips with a coefficient computed on the host (grads.clip_by_host_norm_);
    the deferred step with one computed on the device (grads.clip_). For float32 norms they must
    give the same bits, at the clip boundary too; a plain float64 coefficient does not (the
    negative control: the emulated float32 rounding is what makes them agree)."""
    from engine.accumulation.grads import clip_, clip_by_host_norm_, scale_by_
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(257, generator=gen), torch.randn(3, 5, generator=gen)]
    cases = [(c, n) for c in (1.0, 0.5, 3.0, 1e-3) for n in (c * 0.5, c * 4.0, c, c - 1e-6, c + 1e-6,
                                                               c * (1 + 2**-23), c * (1 - 2**-23))]
    cases += [(float(torch.rand(1, generator=gen)) * 5, float(torch.rand(1, generator=gen)) * 5) for _ in range(300)]
    naive_differs = 0
    for clip, n in cases:
        norm = torch.tensor(n, dtype=torch.float32)
        device, host, naive = ([g.clone() for g in grads] for _ in range(3))
        clip_(device, clip, norm)
        clip_by_host_norm_(host, clip, norm, norm.item())
        for a, b in zip(device, host):
            assert torch.equal(a, b), (clip, n)
        coef = clip / (norm.item() + 1e-6)
        if coef < 1:
            scale_by_(naive, coef)
        naive_differs += any(not torch.equal(a, b) for a, b in zip(device, naive))
    assert naive_differs > 0  # float64 arithmetic is not float32's: the emulation matters


def test_host_clip_of_parameters_is_bit_identical_to_torch():
    """The integrations clip with grads.clip_params_by_host_norm_ in place of torch's
    clip_grads_with_norm_: the same bits, for finite norms on either side of the clip norm and
    for a NaN or inf norm (handed to torch)."""
    from engine.accumulation.grads import clip_params_by_host_norm_
    gen = torch.Generator().manual_seed(1)
    shapes = [(64, 33), (33,), (7, 3, 2)]
    cases = [(1.0, 0.3), (1.0, 4.0), (1.0, 1.0), (0.25, 0.2500001), (2.0, float("nan")), (2.0, float("inf"))]
    cases += [(float(torch.rand(1, generator=gen)) * 3, float(torch.rand(1, generator=gen)) * 3) for _ in range(100)]
    for clip, n in cases:
        grads = [torch.randn(s, generator=gen) for s in shapes]
        mine, theirs = ([torch.nn.Parameter(torch.zeros(s)) for s in shapes] for _ in range(2))
        for a, b, g in zip(mine, theirs, grads):
            a.grad, b.grad = g.clone(), g.clone()
        norm = torch.tensor(n, dtype=torch.float32)
        torch.nn.utils.clip_grads_with_norm_(theirs, clip, norm)
        clip_params_by_host_norm_(mine, clip, norm, norm.item())
        for a, b in zip(mine, theirs):
            assert torch.equal(a.grad, b.grad) or (a.grad.isnan().all() and b.grad.isnan().all()), (clip, n)
