"""The Trainer's own accumulation errors, measured by HeadroomCallback, and the fix Headroom offers.

Real transformers on the CPU, tiny BERT and GPT-2 built from configs, one optimizer step of
4 micro-batches of 4 (the whole 16-sample data set: the window is known). SGD without
clipping, constant lr: the update is -lr x the gradient the Trainer accumulated, compared
with one full-batch step computed here by hand. Without the fix the error is real and
measured (negative control); with it the update is the full batch's to 1e-6.
"""
from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the 'hf' extra is not installed (pip install -e '.[hf]')")
pytest.importorskip("accelerate", reason="the 'hf' extra is not installed (pip install -e '.[hf]')")

import torch  # noqa: E402 - after the importorskip of an optional extra above
from integ_helpers import full_batch_grad, rel_diff, text_collate, text_data, tiny_bert, tiny_gpt2  # noqa: E402 - after the importorskip of an optional extra above
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402 - after the importorskip of an optional extra above

from engine.integrations.transformers import HeadroomCallback, exact_loss  # noqa: E402 - after the importorskip of an optional extra above
from engine.store import RunReader  # noqa: E402 - after the importorskip of an optional extra above

LR = 0.1
CASES = {  # name: (model builder, data, causal)
    "bert": (tiny_bert, dict(n=16, seed=1, lo=3, hi=16, classes=3), False),
    "gpt2": (tiny_gpt2, dict(n=16, seed=1, lo=12, hi=36), True),
}


class Grab(TrainerCallback):
    """The parameters before training, the gradient the Trainer accumulated (before the step),
    the parameters after it."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.before = [p.detach().clone() for p in model.parameters()]

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grad = [p.grad.detach().clone() for p in model.parameters()]

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.after = [p.detach().clone() for p in model.parameters()]


def _train(tmp, name: str, fixed: bool) -> dict:
    build, spec, causal = CASES[name]
    data = text_data(**spec)
    model = build().double()  # float64: the parameters' update is read without float32 rounding
    if fixed and causal:
        model.loss_type = "ForCausalLM"  # the documented model setting: the Trainer counts shifted labels
    grab, cb = Grab(), HeadroomCallback(run_dir=str(tmp / f"{name}-{fixed}"))
    args = TrainingArguments(output_dir=str(tmp / "out"), per_device_train_batch_size=4, gradient_accumulation_steps=4,
                             max_steps=1, optim="sgd", learning_rate=LR, lr_scheduler_type="constant",
                             max_grad_norm=0.0, report_to="none", use_cpu=True, disable_tqdm=True,
                             save_strategy="no", logging_steps=1, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=text_collate,
                      callbacks=[grab, cb], compute_loss_func=exact_loss if fixed and not causal else None)
    trainer.train()
    batch = text_collate(data)
    exact = full_batch_grad(build().double(), batch, causal)
    labels = batch["labels"]
    r = RunReader(cb.run_dir)
    return dict(grab=grab, exact=exact, rows=r.metrics(), events=r.events(kinds=["loss_weighting"]),
                logged=trainer.state.log_history[0]["loss"],
                true_count=int(labels[:, 1:].ne(-100).sum()) if causal else len(data),
                unshifted=int(labels.ne(-100).sum()))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf-exact")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HOME", str(tmp / "hf"))
        mp.setenv("HEADROOM_RUNS", str(tmp / "runs"))
        return {(name, fixed): _train(tmp, name, fixed) for name in CASES for fixed in (False, True)}


def _update(run: dict) -> list[torch.Tensor]:
    return [(a - b) / -LR for a, b in zip(run["grab"].after, run["grab"].before)]


def test_bert_trainer_steps_k_times_too_large_and_headroom_measures_it(runs):
    run = runs[("bert", False)]
    ratio = sum(float((g * e).sum()) for g, e in zip(run["grab"].grad, run["exact"])) / \
        sum(float(e.pow(2).sum()) for e in run["exact"])
    assert ratio == pytest.approx(4.0, rel=1e-5)  # the error is real: +300% at k=4
    [first, summary] = run["events"]
    d = first["data"]
    assert d["measured"] == "gradients" and d["grad_scale"] == pytest.approx(ratio, rel=1e-5)
    assert d["grad_error"] == pytest.approx(rel_diff(run["grab"].grad, run["exact"]), rel=1e-4)
    assert "plain mean" in d["cause"] and "4 accumulation steps" in d["cause"] and "exact_loss" in d["fix"]
    assert "+300.0%" in first["message"] and summary["data"]["epoch_summary"] and summary["data"]["steps"] == 1
    [row] = run["rows"]
    assert d["framework_loss"] == pytest.approx(run["logged"], rel=1e-4)  # the Trainer's 4x loss
    assert row["loss"] == pytest.approx(run["logged"] / 4, rel=1e-4) and row["tokens"] == 16


def test_gpt2_trainer_counts_unshifted_labels_and_headroom_measures_it(runs):
    run = runs[("gpt2", False)]
    true, unshifted = run["true_count"], run["unshifted"]
    assert unshifted - true == 16  # one label per row that the shifted loss does not count
    ratio = sum(float((g * e).sum()) for g, e in zip(run["grab"].grad, run["exact"])) / \
        sum(float(e.pow(2).sum()) for e in run["exact"])
    assert ratio == pytest.approx(true / unshifted, rel=1e-5)  # real: the update is ~4% small
    [first, _] = run["events"]
    d = first["data"]
    assert d["grad_scale"] == pytest.approx(ratio, rel=1e-5) and d["grad_error"] == pytest.approx(1 - ratio, rel=1e-3)
    assert f"= {unshifted}" in d["cause"] and f"counts {true}" in d["cause"] and "unshifted" in d["cause"]
    assert "ForCausalLM" in d["fix"]
    [row] = run["rows"]
    assert row["tokens"] == true  # not the Trainer's over-count
    assert run["logged"] == pytest.approx(row["loss"] * true / unshifted, rel=1e-4)  # the Trainer's loss is low


@pytest.mark.parametrize("name", sorted(CASES))
def test_after_the_fix_the_update_is_the_full_batch_step(runs, name):
    run = runs[(name, True)]
    assert rel_diff(run["grab"].grad, run["exact"]) < 1e-6
    assert rel_diff(_update(run), run["exact"]) < 1e-6  # the parameters moved by -lr x the full batch's gradient
    assert run["events"] == []  # nothing to say: exact
    [row] = run["rows"]
    assert row["loss"] == pytest.approx(run["logged"], rel=1e-5) and row["tokens"] == run["true_count"]
    wrong = runs[(name, False)]
    assert rel_diff(wrong["grab"].grad, wrong["exact"]) > 0.03  # the same check fails without the fix
