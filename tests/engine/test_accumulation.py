"""The accumulated update equals the one-batch update of the same window.

Three things are compared, step by step, over two epochs:
  A: the engine with micro-batch m x accumulation k,
  B: the engine with one micro-batch of m*k (accumulation 1),
  R: a reference written here with plain torch: the whole window as one batch,
     loss = sum(loss_sum) / total count, backward, p -= lr * grad.
The gradients the optimizer receives (RecordingSGD) and the weights after every
run must agree to 1e-10 in float64 and ~1e-6 in float32, for equal lengths,
variable lengths, a short final window and token-budget windows. A negative
control shows that the common mistake (mean per micro-batch / k) is far off on
variable lengths, so the tolerance above is able to tell the two apart.
"""
from __future__ import annotations

import pytest
import torch
from engine_helpers import (
    Recorder,
    RecordingSGD,
    flat,
    make_seqs,
    make_task,
    rel_err,
    run_trainer,
    token_collate,
    token_loss_sum,
)

from engine.accumulation import sampling

LR = 0.5
EPOCHS = 2
TOL = {torch.float64: 1e-10, torch.float32: 2e-6}

# name: (n samples, lengths, micro, accum, token_budget)
CASES = {
    "equal": (36, "equal", 3, 4, None),            # 3 full windows of 12 per epoch
    "variable": (36, "variable", 3, 4, None),      # same windows, different token counts
    "short_final": (43, "variable", 3, 4, None),   # 12, 12, 12, then 7 = 3 + 3 + 1
    "token_budget": (40, "variable", 2, 1, 60),    # windows close once they hold 60 tokens
}


def reference(n, lengths, dtype, windows):
    """Plain-torch SGD over the given windows, each taken as one batch."""
    task = make_task(n, lengths, dtype)
    model, data = task.model, task.train_data
    grads, losses, counts = [], [], []
    for w in windows:
        loss_sum, count = token_loss_sum(model, token_collate([data[i] for i in w]))
        (loss_sum / count).backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        losses.append(float(loss_sum.detach() / count))
        counts.append(int(count))
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-LR)
                p.grad = None
    return grads, [p.detach().clone() for p in model.parameters()], losses, counts


def expected_token_windows(order, budget, lengths):
    """Independent of engine.accumulation.sampling: add samples until the window holds >= budget tokens."""
    out, cur, held = [], [], 0
    for i in order:
        cur.append(i)
        held += lengths[i]
        if held >= budget:
            out.append(cur)
            cur, held = [], 0
    return out + ([cur] if cur else [])


def engine_run(tmp_path, name, n, lengths, dtype, micro, accum, budget):
    rec = Recorder()
    task = make_task(n, lengths, dtype, optimizer=RecordingSGD, recorder=rec)
    run = run_trainer(task, tmp_path / name, recorder=rec, micro_batch=micro, accum=accum, lr=LR,
                      epochs=EPOCHS, token_budget=budget)
    return run, rec


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", list(CASES))
def test_accumulated_update_equals_one_batch_update(tmp_path, case, dtype):
    n, lengths, micro, accum, budget = CASES[case]
    a, rec_a = engine_run(tmp_path, "a", n, lengths, dtype, micro, accum, budget)
    one_batch_micro = n if budget else micro * accum
    b, rec_b = engine_run(tmp_path, "b", n, lengths, dtype, one_batch_micro, 1, budget)

    # Both runs saw the same windows, and those are the windows the design promises.
    assert rec_a.windows == rec_b.windows
    seqs = make_seqs(n, lengths)
    expected = []
    for epoch in range(1, EPOCHS + 1):
        order = sampling.epoch_order(n, 0, epoch)
        assert sorted(order) == list(range(n))
        if budget:
            expected += expected_token_windows(order, budget, [len(s) - 1 for s in seqs])
        else:
            expected += [order[i:i + micro * accum] for i in range(0, n, micro * accum)]
    assert rec_a.windows == expected
    # A really accumulated: several micro-batches per window, none larger than `micro`.
    assert all(len(mb) <= micro for mb in rec_a.micro)
    assert max(len(w) for w in rec_a.window_micro) > 1
    assert all(len(w) == 1 for w in rec_b.window_micro)
    if case == "short_final":
        assert [len(w) for w in rec_a.windows[:4]] == [12, 12, 12, 7]
        assert [len(mb) for mb in rec_a.window_micro[3]] == [3, 3, 1]
    if budget:
        lens = [len(s) - 1 for s in seqs]
        tokens = [sum(lens[i] for i in w) for w in rec_a.windows]
        assert len(set(tokens)) > 1 and len(set(len(w) for w in rec_a.windows)) > 1

    r_grads, r_params, r_losses, r_counts = reference(n, lengths, dtype, expected)
    tol = TOL[dtype]
    ga, gb = a.trainer.optimizer.grads, b.trainer.optimizer.grads
    assert len(ga) == len(gb) == len(r_grads) == len(expected) == a.result.steps
    for step, (x, y, r) in enumerate(zip(ga, gb, r_grads), start=1):
        assert rel_err(flat(x), flat(r)) < tol, f"step {step}: accumulated gradient != window gradient"
        assert rel_err(flat(y), flat(r)) < tol, f"step {step}: one-batch gradient != window gradient"
    for run in (a, b):
        got = [p.detach() for p in run.trainer.model.parameters()]
        assert rel_err(flat(got), flat(r_params)) < tol
        assert [m.tokens for m in run.steps] == r_counts
        assert [m.samples for m in run.steps] == [len(w) for w in expected]
        assert [m.loss for m in run.steps] == pytest.approx(r_losses, rel=tol)
    # The weights moved: a no-op engine would not pass the comparison by accident.
    start = make_task(n, lengths, dtype).model
    assert rel_err(flat(r_params), flat(list(start.parameters()))) > 1e-2


def _window_grad(model, batches, mode):
    model.zero_grad(set_to_none=True)
    if mode == "exact":
        total = sum(int(token_loss_sum(model, b)[1]) for b in batches)
    for b in batches:
        loss_sum, count = token_loss_sum(model, b)
        if mode == "exact":
            (loss_sum / total).backward()
        else:  # the common mistake: mean over each micro-batch's own tokens, divided by k
            (loss_sum / count / len(batches)).backward()
    return flat([p.grad for p in model.parameters()])


@pytest.mark.parametrize("lengths", ["equal", "variable"])
def test_negative_control_mean_per_micro_batch(tmp_path, lengths):
    """The naive normalisation differs from the window gradient on variable lengths by a
    large margin, so the 1e-10 agreement above is not a property of any normalisation."""
    n, micro, accum = 16, 2, 4
    task = make_task(n, lengths, torch.float64)
    data = task.train_data
    window = sampling.epoch_order(n, 0, 1)[: micro * accum]
    batches = [token_collate([data[i] for i in window[j:j + micro]]) for j in range(0, len(window), micro)]
    whole = token_collate([data[i] for i in window])
    task.model.zero_grad()
    loss_sum, count = token_loss_sum(task.model, whole)
    (loss_sum / count).backward()
    true = flat([p.grad for p in task.model.parameters()])
    exact = _window_grad(task.model, batches, "exact")
    naive = _window_grad(task.model, batches, "naive")
    assert rel_err(exact, true) < 1e-12
    # The engine's first-step gradient on the same window (micro x accum) is the true one.
    run = run_trainer(make_task(n, lengths, torch.float64, optimizer=RecordingSGD), tmp_path / "run",
                      micro_batch=micro, accum=accum, lr=LR, max_steps=1)
    engine_grad = flat(run.trainer.optimizer.grads[0])
    assert rel_err(engine_grad, true) < 1e-10
    if lengths == "equal":
        assert rel_err(naive, true) < 1e-12
    else:
        err = rel_err(naive, true)
        assert err > 0.05, f"naive normalisation only {err:.3g} off: the control cannot tell them apart"
        assert rel_err(engine_grad, naive) > 0.05


def test_count_as_python_int(tmp_path):
    """A task may return count as a Python int: same exact result."""
    def int_loss(model, batch):
        loss_sum, count = token_loss_sum(model, batch)
        return loss_sum, int(count)

    a = run_trainer(make_task(36, optimizer=RecordingSGD, loss=int_loss), tmp_path / "a",
                    micro_batch=3, accum=4, lr=LR)
    b = run_trainer(make_task(36, optimizer=RecordingSGD), tmp_path / "b", micro_batch=12, accum=1, lr=LR)
    for x, y in zip(a.trainer.optimizer.grads, b.trainer.optimizer.grads):
        assert rel_err(flat(x), flat(y)) < 1e-10
