"""The data path through DataLoader workers: the same weights bit for bit with 0, 1 and 2
workers; exact against the full batch under workers and micro-token windows (with a
negative control); resume mid-epoch and out-of-memory redo under workers; a worker that
raises ends the run with one clean run_failed line; --workers auto."""
from __future__ import annotations

import os
import sys
import time

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from engine_helpers import TokenData, make_seqs, make_task, run_trainer, sample_length  # noqa: E402 - after the sys.path set-up above

from engine.accumulation.feeder import auto_workers
from engine.accumulation.policy import TokenBudgetWindows
from engine.declarations.settings import LiveSettings


def weights(trainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in trainer.model.parameters()])


def test_weights_do_not_depend_on_the_number_of_workers(tmp_path):
    common = dict(micro_batch=3, accum=2, epochs=2, lr=0.1, optimizer="adamw", clip=1.0)
    runs = {w: run_trainer(make_task(30, dropout=0.3), tmp_path / f"w{w}", workers=w, **common) for w in (0, 1, 2)}
    assert all(r.result.reason == "completed" and r.result.steps == 10 for r in runs.values())
    for w in (1, 2):
        assert torch.equal(weights(runs[0].trainer), weights(runs[w].trainer))
        assert [m.loss for m in runs[0].steps] == [m.loss for m in runs[w].steps]
    # Negative control: another seed's order does change the weights.
    other = run_trainer(make_task(30, dropout=0.3), tmp_path / "seed", workers=2, seed=5, **common)
    assert not torch.equal(weights(runs[0].trainer), weights(other.trainer))


def sgd_update(run) -> torch.Tensor:
    return torch.cat([g.flatten() for g in run.trainer.optimizer.grads[0]])


def test_exact_against_the_full_batch_under_workers_and_micro_tokens(tmp_path):
    from engine_helpers import RecordingSGD
    seqs = make_seqs(12, "variable", seed=2)
    full = run_trainer(make_task(seqs=seqs, optimizer=RecordingSGD), tmp_path / "full", micro_batch=12, accum=1,
                       max_steps=1, workers=0)
    acc = run_trainer(make_task(seqs=seqs, optimizer=RecordingSGD), tmp_path / "acc", micro_batch=3, accum=4,
                      max_steps=1, workers=2)
    g_full, g_acc = sgd_update(full), sgd_update(acc)
    assert float((g_acc - g_full).norm() / g_full.norm()) < 1e-12
    assert acc.steps[0].accum == 4
    # Token-budget windows split by counted items: exact too, and more micro-batches.
    budget = sum(len(s) for s in seqs)
    tok = run_trainer(make_task(seqs=seqs, optimizer=RecordingSGD), tmp_path / "tok", micro_batch=12, accum=1,
                      max_steps=1, workers=2, token_budget=budget, micro_tokens=20)
    assert float((sgd_update(tok) - g_full).norm() / g_full.norm()) < 1e-12
    assert tok.steps[0].accum > 1 and tok.steps[0].samples == 12
    # Negative control: mean per micro-batch / k is measurably off on variable lengths.
    def mean_loss(model, batch):
        from engine_helpers import token_loss_sum
        s, c = token_loss_sum(model, batch)
        return s / c * 3, 3  # per-micro-batch mean, weighted as if each micro-batch had 3 items
    bad = run_trainer(make_task(seqs=seqs, optimizer=RecordingSGD, loss=mean_loss), tmp_path / "bad", micro_batch=3,
                      accum=4, max_steps=1, workers=2)
    assert float((sgd_update(bad) - g_full).norm() / g_full.norm()) > 1e-3


def test_micro_tokens_bound_each_micro_batch():
    lengths = [5, 9, 2, 2, 7, 3, 11, 1]
    policy = TokenBudgetWindows(8, 0, 100, lengths.__getitem__, micro_tokens=10)
    micro = policy.split(list(range(8)), LiveSettings(3, 1, 0.1, 0.0, "none"))
    assert [i for mb in micro for i in mb] == list(range(8))
    for mb in micro:
        assert len(mb) <= 3 and (sum(lengths[i] for i in mb) <= 10 or len(mb) == 1)
    assert [11] in [[lengths[i] for i in mb] for mb in micro]  # longer than the bound: alone


def test_resume_mid_epoch_under_workers_equals_an_uninterrupted_run(tmp_path):
    common = dict(micro_batch=2, accum=2, epochs=2, lr=0.1, optimizer="adamw", workers=2)
    whole = run_trainer(make_task(24), tmp_path / "whole", **common)
    first = run_trainer(make_task(24), tmp_path / "part", max_steps=4, **common)
    assert first.result.reason == "max_steps"
    rest = run_trainer(make_task(24), tmp_path / "unused", resume=str(tmp_path / "part"), **common)
    assert torch.equal(weights(whole.trainer), weights(rest.trainer))


class OomOnce(torch.nn.Module):
    """Raises a real torch.OutOfMemoryError on one forward of a micro-batch larger than 2."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 4 and x.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return self.inner(x)


def test_out_of_memory_redo_under_workers_equals_a_clean_run(tmp_path):
    from engine_helpers import TokenModel
    torch.manual_seed(0)
    model = OomOnce(TokenModel().double())
    rec = run_trainer(make_task(24, model=model), tmp_path / "rec", micro_batch=4, accum=2, epochs=1, workers=2)
    assert len(rec.of("oom_recovered")) == 1
    torch.manual_seed(0)
    clean = run_trainer(make_task(24, model=OomOnce(TokenModel().double())), tmp_path / "clean", micro_batch=2,
                        accum=4, epochs=1, workers=0)
    assert torch.allclose(weights(rec.trainer), weights(clean.trainer), rtol=0, atol=1e-12)


class Broken(TokenData):
    def __getitem__(self, i):
        if i == 7:
            raise ValueError("sample 7 is corrupt")
        return super().__getitem__(i)


def test_a_worker_that_raises_ends_the_run_with_one_clean_line(tmp_path):
    task = make_task(24)
    task.train_data = Broken(make_seqs(24))
    with pytest.raises(ValueError):
        run_trainer(task, tmp_path / "run", micro_batch=2, accum=2, epochs=1, workers=2)
    from engine.store import RunReader
    failed = RunReader(str(tmp_path / "run")).events(kinds={"run_failed"})
    assert len(failed) == 1
    msg = failed[0]["message"]
    assert "sample 7 is corrupt" in msg and "\n" not in msg and "worker" in msg


class Slow(TokenData):
    def __getitem__(self, i):
        time.sleep(0.002)
        return super().__getitem__(i)


def test_auto_workers_only_for_slow_loading():
    assert auto_workers(TokenData(make_seqs(16)), micro_batch=16) == 0
    assert auto_workers(Slow(make_seqs(16)), micro_batch=16, cpus=8) == 4
    assert auto_workers(Slow(make_seqs(16)), micro_batch=16, cpus=2) == 1
    assert sample_length  # the helpers' token task is what the other tests train
