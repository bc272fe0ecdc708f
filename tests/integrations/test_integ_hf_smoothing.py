"""exact_loss keeps the Trainer's label smoothing (a compute_loss_func replaces the Trainer's own loss).

Real transformers on the CPU, tiny BERT and GPT-2 built from configs, label_smoothing_factor=0.5,
one optimizer step of 4 micro-batches of 4 (the whole 16-sample data set), SGD, no clipping. The
gradient the Trainer accumulated is compared with the smoothed full batch's, computed here by hand;
the unsmoothed full batch is the negative control (what exact_loss trained before: 16% off). A
label_smoother exact_loss cannot reproduce is refused by name, before a step is taken.
"""
from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the 'hf' extra is not installed (pip install -e '.[hf]')")
pytest.importorskip("accelerate", reason="the 'hf' extra is not installed (pip install -e '.[hf]')")

import torch  # noqa: E402 - after the importorskip of an optional extra above
from integ_helpers import full_batch_grad, rel_diff, text_collate, text_data, tiny_bert, tiny_gpt2  # noqa: E402 - after the importorskip of an optional extra above
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402 - after the importorskip of an optional extra above
from transformers.trainer_pt_utils import LabelSmoother  # noqa: E402 - after the importorskip of an optional extra above

from engine.integrations.transformers import HeadroomCallback, exact_loss  # noqa: E402 - after the importorskip of an optional extra above
from engine.store import RunReader  # noqa: E402 - after the importorskip of an optional extra above

SMOOTHING = 0.5
CASES = {  # name: (model builder, data, causal)
    "bert": (tiny_bert, dict(n=16, seed=1, lo=3, hi=16, classes=3), False),
    "gpt2": (tiny_gpt2, dict(n=16, seed=1, lo=12, hi=36), True),
}


class Grab(TrainerCallback):
    """The gradient the Trainer accumulated, before the optimizer step."""

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grad = [p.grad.detach().clone() for p in model.parameters()]


def _args(tmp) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp / "out"), per_device_train_batch_size=4, gradient_accumulation_steps=4,
                             max_steps=1, optim="sgd", learning_rate=0.1, lr_scheduler_type="constant",
                             max_grad_norm=0.0, report_to="none", use_cpu=True, disable_tqdm=True,
                             save_strategy="no", logging_steps=1, seed=0, label_smoothing_factor=SMOOTHING)


def _full_batch(model, batch, causal: bool, smoothing: float) -> list[torch.Tensor]:
    """The whole window as one batch: mean over its true count, label-smoothed by `smoothing`."""
    return full_batch_grad(model, batch, causal, smoothing)


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HEADROOM_RUNS", str(tmp_path / "runs"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_exact_loss_keeps_the_trainers_label_smoothing(tmp_path, name):
    build, spec, causal = CASES[name]
    data = text_data(**spec)
    model = build().double()  # float64: the gradients are compared without float32 rounding
    if causal:
        model.loss_type = "ForCausalLM"  # the documented model setting: the Trainer counts shifted labels
    grab, cb = Grab(), HeadroomCallback(run_dir=str(tmp_path / "run"))
    Trainer(model=model, args=_args(tmp_path), train_dataset=data, data_collator=text_collate,
            callbacks=[grab, cb], compute_loss_func=exact_loss).train()
    batch = text_collate(data)
    smoothed = _full_batch(build().double(), batch, causal, SMOOTHING)
    plain = _full_batch(build().double(), batch, causal, 0.0)
    assert rel_diff(plain, smoothed) > 0.05  # the negative control: without smoothing the step is far off
    assert rel_diff(grab.grad, smoothed) < 1e-6  # the smoothed full batch's gradient
    r = RunReader(cb.run_dir)
    assert r.events(kinds=["loss_weighting"]) == []  # nothing to say, and no advice to pass exact_loss
    assert r.info()["status"] == "finished"


class HalfSmoother(LabelSmoother):
    """A label_smoother of the user's own: not transformers' LabelSmoother, so not reproducible."""

    def __call__(self, model_output, labels, shift_labels=False, num_items_in_batch=None):
        return super().__call__(model_output, labels, shift_labels, num_items_in_batch) / 2


def test_a_label_smoother_exact_loss_cannot_apply_is_refused_by_name(tmp_path):
    build, spec, _ = CASES["bert"]
    model = build().double()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model=model, args=_args(tmp_path), train_dataset=text_data(**spec), data_collator=text_collate,
                      compute_loss_func=exact_loss)
    trainer.label_smoother = HalfSmoother(epsilon=SMOOTHING)
    with pytest.raises(TypeError, match="exact_loss cannot apply the Trainer's label_smoother HalfSmoother"):
        trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # no step taken
