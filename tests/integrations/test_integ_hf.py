"""HeadroomCallback on a real Hugging Face Trainer (CPU, a tiny model built here, offline)."""
from __future__ import annotations

import math
import os

import pytest

pytest.importorskip("transformers", reason="the 'hf' extra is not installed (pip install -e '.[hf]')")
pytest.importorskip("accelerate", reason="the 'hf' extra is not installed (pip install -e '.[hf]')")

from integ_helpers import ExactTokenModel, TokenModel, pad_collate, token_data, windows  # noqa: E402 - after the importorskip of an optional extra above
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402 - after the importorskip of an optional extra above

from engine.declarations.commands import Pause, Resume, SetAccum, SetClip, SetLr, Stop  # noqa: E402 - after the importorskip of an optional extra above
from engine.integrations.loop import IntegrationError  # noqa: E402 - after the importorskip of an optional extra above
from engine.integrations.transformers import HeadroomCallback  # noqa: E402 - after the importorskip of an optional extra above
from engine.store import RunReader, send_command  # noqa: E402 - after the importorskip of an optional extra above

MICRO, ACCUM = 4, 4  # 48 samples: 12 micro-batches, 3 optimizer steps an epoch


def _args(tmp_path, **kw) -> TrainingArguments:
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=MICRO, gradient_accumulation_steps=ACCUM,
                num_train_epochs=2, learning_rate=0.02, max_grad_norm=0.5, report_to="none", use_cpu=True,
                disable_tqdm=True, logging_steps=1, save_strategy="no", eval_strategy="epoch",
                per_device_eval_batch_size=8, dataloader_num_workers=0, seed=0)
    base.update(kw)
    return TrainingArguments(**base)


class Sender(TrainerCallback):
    """Sends commands from inside the run at given steps: they arrive deterministically."""

    def __init__(self, headroom: HeadroomCallback, at: dict) -> None:
        self.headroom, self.at = headroom, at

    def on_step_end(self, args, state, control, **kwargs):
        for cmd in self.at.get(state.global_step, ()):
            send_command(self.headroom.run_dir, cmd)


def test_rows_per_optimizer_step_match_the_trainer(tmp_path):
    model = TokenModel()
    data = token_data(48)
    cb = HeadroomCallback(run_dir=str(tmp_path / "run"))
    trainer = Trainer(model=model, args=_args(tmp_path), train_dataset=data, eval_dataset=data[:16],
                      data_collator=pad_collate)
    assert cb.attach(trainer) is cb and trainer.callback_handler.callbacks[-1] is cb
    trainer.train()
    assert "training_step" not in trainer.__dict__  # the Trainer is left as it was
    r = RunReader(str(tmp_path / "run"))
    rows = r.metrics()
    logs = [h for h in trainer.state.log_history if "grad_norm" in h]
    assert [x["step"] for x in rows] == [h["step"] for h in logs] == list(range(1, 7))
    # The Trainer's own numbers: its pre-clip norm and the lr it stepped with.
    assert [x["grad_norm"] for x in rows] == pytest.approx([h["grad_norm"] for h in logs], rel=1e-6)
    assert [x["lr"] for x in rows] == pytest.approx([h["learning_rate"] for h in logs])
    assert any(x["grad_norm"] > 0.5 for x in rows)  # before clipping (clip 0.5)
    assert [x["clipped"] for x in rows] == [int(x["grad_norm"] > 0.5) for x in rows]
    assert all(x["accum"] == ACCUM and x["micro_batch"] == MICRO and x["samples"] == MICRO * ACCUM
               and x["clip"] == 0.5 and x["step_time"] > 0 for x in rows)
    # The loss is the window's token-weighted loss; the Trainer's (mean of means) is beside it.
    expected = windows(model.log, ACCUM)
    assert [x["tokens"] for x in rows] == [n for _, n in expected]
    assert [x["loss"] for x in rows] == pytest.approx([l for l, _ in expected], rel=1e-5)
    assert [h["loss"] for h in logs] != pytest.approx([x["loss"] for x in rows], rel=1e-4)
    gap = r.events(kinds=["loss_weighting"])
    assert gap and gap[0]["data"]["framework_loss"] == pytest.approx(logs[0]["loss"], rel=1e-5)
    # Measured on the gradients (the first window of each epoch is compared), with its cause; a
    # summary for every epoch that had a step off the exact one.
    first = gap[0]["data"]
    assert first["measured"] == "gradients" and first["grad_error"] > 1e-3 and "mean of means" in first["cause"]
    assert [e["epoch"] for e in gap if e["data"]["epoch_summary"]] == [1, 2]
    epochs = r.epochs()
    evals = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    assert [(e["epoch"], e["step"]) for e in epochs] == [(1, 3), (2, 6)]
    assert [e["val_loss"] for e in epochs] == pytest.approx(evals)
    assert [x["epoch"] for x in rows] == [1, 1, 1, 2, 2, 2]
    info = r.info()
    assert info["status"] == "finished" and info["task"] == "hf-TokenModel" and info["pid"] == os.getpid()
    assert info["integration"] == "transformers" and info["config"]["accum"] == ACCUM
    assert info["config"]["epochs"] == 2 and info["step"] == 6
    assert r.events(kinds=["run_finished"])[0]["data"]["reason"] == "completed"


def test_exact_recipe_num_items_in_batch_leaves_no_gap(tmp_path):
    """With a model taking num_items_in_batch the Trainer's loss is the token-weighted one."""
    model = ExactTokenModel()
    cb = HeadroomCallback(run_dir=str(tmp_path / "run"))
    trainer = Trainer(model=model, args=_args(tmp_path, max_steps=3, eval_strategy="no"),
                      train_dataset=token_data(48), data_collator=pad_collate, callbacks=[cb])
    cb.attach(trainer)  # already among its callbacks: not added twice
    assert [c for c in trainer.callback_handler.callbacks if c is cb] == [cb]
    assert trainer.model_accepts_loss_kwargs
    trainer.train()
    r = RunReader(str(tmp_path / "run"))
    rows = r.metrics()
    logs = [h for h in trainer.state.log_history if "grad_norm" in h]
    expected = windows(model.log, ACCUM)
    assert [x["loss"] for x in rows] == pytest.approx([l for l, _ in expected], rel=1e-5)
    assert [x["loss"] for x in rows] == pytest.approx([h["loss"] for h in logs], rel=1e-5)
    assert [x["tokens"] for x in rows] == [n for _, n in expected]
    assert r.events(kinds=["loss_weighting"]) == []


def test_commands_lr_clip_refusal_and_stop_with_the_trainers_checkpoint(tmp_path):
    model = TokenModel()
    cb = HeadroomCallback(poll_interval=0)  # a new folder under the runs root; commands read every step
    # Sent at the end of step 2 (3 steps an epoch); the Sender runs before HeadroomCallback, which
    # polls right after: the lr (at="step") applies from step 3, the clip (the app's default,
    # at="epoch") from epoch 2 (step 4). The stop sent after step 5 ends the run there.
    sender = Sender(cb, {2: [SetLr(0.05, at="step"), SetClip(0.25), SetAccum(2)], 5: [Stop()]})
    trainer = Trainer(model=model, args=_args(tmp_path, num_train_epochs=5, eval_strategy="no"),
                      train_dataset=token_data(48), data_collator=pad_collate, callbacks=[sender, cb])
    cb.attach(trainer)
    trainer.train()
    assert cb.run_dir.startswith(str(tmp_path / "runs"))
    r = RunReader(cb.run_dir)
    rows = r.metrics()
    assert [x["step"] for x in rows] == [1, 2, 3, 4, 5] and trainer.state.global_step == 5
    assert rows[1]["lr"] != pytest.approx(0.05) and rows[2]["lr"] == pytest.approx(0.05)
    assert rows[3]["lr"] < rows[2]["lr"]  # the linear decay goes on from the new lr
    assert [x["clip"] for x in rows] == [0.5, 0.5, 0.5, 0.25, 0.25]
    cmds = {c["kind"]: c for c in r.commands()}
    assert cmds["set_lr"]["status"] == "applied" and cmds["set_clip"]["status"] == "applied"
    assert cmds["set_clip"]["applied_step"] == 3  # at the start of epoch 2, after step 3
    received = {e["data"]["command"]: e["data"] for e in r.events(kinds=["command_received"])}
    assert (received["set_clip"]["applies"], received["set_clip"]["target_epoch"]) == ("epoch", 2)
    assert received["set_lr"]["applies"] == "step" and "set_accum" not in received
    assert cmds["set_accum"]["status"] == "refused" and "gradient_accumulation_steps" in cmds["set_accum"]["note"]
    [refused] = r.events(kinds=["command_refused"])
    assert refused["data"]["command"] == "set_accum" and refused["data"]["reason"] == cmds["set_accum"]["note"]
    assert refused["step"] == 2  # refused as it arrived, not when its epoch came
    ckpt = tmp_path / "out" / "checkpoint-5"
    assert (ckpt / "trainer_state.json").exists()
    assert any(f.startswith("model") or f.startswith("pytorch_model") for f in os.listdir(ckpt))
    assert r.events(kinds=["checkpoint"])[0]["data"]["path"] == str(ckpt)
    assert r.events(kinds=["run_finished"])[0]["data"]["reason"] == "stopped"
    assert r.info()["status"] == "finished" and cmds["stop"]["status"] == "applied"


def test_pause_holds_the_trainer_between_steps_until_resume(tmp_path):
    import threading
    cb = HeadroomCallback(run_dir=str(tmp_path / "run"), poll_interval=0)

    class PauseThenResume(Sender):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                send_command(cb.run_dir, Pause())
                threading.Timer(1.5, send_command, (cb.run_dir, Resume())).start()

    trainer = Trainer(model=TokenModel(), args=_args(tmp_path, max_steps=4, eval_strategy="no", logging_steps=50),
                      train_dataset=token_data(48), data_collator=pad_collate, callbacks=[PauseThenResume(cb, {}), cb])
    cb.attach(trainer)
    trainer.train()
    r = RunReader(str(tmp_path / "run"))
    ev = {e["kind"]: e for e in r.events()}
    assert ev["paused"]["step"] == 2 and ev["unpaused"]["step"] == 2
    held = ev["unpaused"]["time"] - ev["paused"]["time"]
    assert held >= 1.4  # held between steps 2 and 3
    rows = r.metrics()
    assert [x["step"] for x in rows] == [1, 2, 3, 4]
    # The pause is not training: step 3 takes about what the others take, not that plus the pause
    # (relative to the others, so a loaded machine's slow steps do not decide it).
    others = max(rows[i]["step_time"] for i in (0, 1, 3))
    assert rows[2]["step_time"] < others + held / 2


def test_nonfinite_loss_is_an_event(tmp_path):
    model = TokenModel()
    model.nan_at = 6  # the second micro-batch of step 2
    cb = HeadroomCallback(run_dir=str(tmp_path / "run"))
    trainer = Trainer(model=model, args=_args(tmp_path, max_steps=2, eval_strategy="no", logging_steps=50),
                      train_dataset=token_data(48), data_collator=pad_collate)
    cb.attach(trainer)
    trainer.train()
    r = RunReader(str(tmp_path / "run"))
    rows = r.metrics()
    assert [x["nonfinite"] for x in rows] == [0, 1]
    assert rows[1]["loss"] is None or math.isnan(rows[1]["loss"])  # SQLite keeps a NaN as NULL
    [ev] = r.events(kinds=["nonfinite"])
    assert ev["step"] == 2 and ev["data"]["loss_finite"] is False and "Trainer stepped" in ev["message"]
    assert r.events(kinds=["run_finished"])[0]["data"]["reason"] == "max_steps"


def test_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="run_dir"):
        HeadroomCallback(run_dir=5)
    with pytest.raises(TypeError, match="config"):
        HeadroomCallback(config="lr=1")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "run.db").write_bytes(b"")
    cb = HeadroomCallback(run_dir=str(tmp_path / "taken"))
    trainer = Trainer(model=TokenModel(), args=_args(tmp_path, max_steps=1, eval_strategy="no"),
                      train_dataset=token_data(16), data_collator=pad_collate)
    cb.attach(trainer)
    with pytest.raises(IntegrationError, match="already holds a run"):
        trainer.train()
    with pytest.raises(IntegrationError, match="transformers.Trainer"):
        HeadroomCallback().attach(object())
    with pytest.raises(IntegrationError, match="another Trainer"):
        cb.attach(Trainer(model=TokenModel(), args=_args(tmp_path, max_steps=1, eval_strategy="no"),
                          train_dataset=token_data(16), data_collator=pad_collate))


def test_the_documented_one_liner_and_attach_reach_the_right_trainer(tmp_path):
    """Trainer(..., callbacks=[HeadroomCallback()]) (the documented form) finds the Trainer whose
    train() calls it, checked by identity of its state; one attached to another Trainer refuses
    the run it was not given."""
    cb = HeadroomCallback(run_dir=str(tmp_path / "run"))
    trainer = Trainer(model=TokenModel(), args=_args(tmp_path, max_steps=2, eval_strategy="no"),
                      train_dataset=token_data(16), data_collator=pad_collate, callbacks=[cb])
    trainer.train()
    r = RunReader(str(tmp_path / "run"))
    assert r.info()["status"] == "finished" and len(r.metrics()) == 2
    other = Trainer(model=TokenModel(), args=_args(tmp_path, max_steps=1, eval_strategy="no"),
                    train_dataset=token_data(16), data_collator=pad_collate)
    cb2 = HeadroomCallback(run_dir=str(tmp_path / "run2")).attach(other)
    stray = Trainer(model=TokenModel(), args=_args(tmp_path, max_steps=1, eval_strategy="no"),
                    train_dataset=token_data(16), data_collator=pad_collate, callbacks=[cb2])
    with pytest.raises(IntegrationError, match="other than the one"):
        stray.train()
    assert not (tmp_path / "run2").exists()
    other.train()  # the Trainer it was given: a run, and the Trainer left as it was
    assert RunReader(str(tmp_path / "run2")).info()["status"] == "finished"
    assert "training_step" not in other.__dict__


def _collate_failing_at(n: int):
    calls = {"n": 0}

    def collate(batch):
        calls["n"] += 1
        if calls["n"] == n:
            raise ValueError("a broken sample in the collator")
        return pad_collate(batch)
    return collate


@pytest.mark.parametrize("where", ["collator", "compute_metrics"])
def test_an_exception_outside_training_step_ends_the_run_failed_at_once(tmp_path, where):
    """Whatever raises in train() (not only training_step) ends the run as failed, with the
    steps done on disk and the writer lock released - the process goes on (a notebook)."""
    from engine.store import runlock
    run_dir = tmp_path / "run"
    if where == "collator":  # the 10th micro-batch: two whole steps done before it
        kw = dict(data_collator=_collate_failing_at(10), args=_args(tmp_path, eval_strategy="no"))
    else:
        def bad_metrics(_pred):
            raise RuntimeError("compute_metrics failed")
        kw = dict(data_collator=pad_collate, compute_metrics=bad_metrics, eval_dataset=token_data(8),
                  args=_args(tmp_path, eval_strategy="steps", eval_steps=2))
    trainer = Trainer(model=TokenModel(), train_dataset=token_data(48),
                      callbacks=[HeadroomCallback(run_dir=str(run_dir))], **kw)
    with pytest.raises((ValueError, RuntimeError)):
        trainer.train()
    r = RunReader(str(run_dir))
    assert r.info()["status"] == "failed"
    assert [m["step"] for m in r.metrics()] == [1, 2]
    failed = r.events(kinds=["run_failed"])
    assert failed and ("collator" in failed[-1]["message"] or "compute_metrics" in failed[-1]["message"])
    r.close()
    assert runlock.holder(str(run_dir)) is None  # free for the next writer now, not at process exit


def test_two_headroom_callbacks_in_one_trainer_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(IntegrationError, match="two HeadroomCallbacks"):
        Trainer(model=TokenModel(), args=_args(tmp_path, max_steps=2, eval_strategy="no"),
                train_dataset=token_data(16), data_collator=pad_collate,
                callbacks=[HeadroomCallback(run_dir=str(tmp_path / "a")), HeadroomCallback(run_dir=str(tmp_path / "b"))])
    trainer = Trainer(model=TokenModel(), args=_args(tmp_path, max_steps=2, eval_strategy="no"),
                      train_dataset=token_data(16), data_collator=pad_collate,
                      callbacks=[HeadroomCallback(run_dir=str(tmp_path / "c"))])
    with pytest.raises(IntegrationError, match="two HeadroomCallbacks"):
        HeadroomCallback(run_dir=str(tmp_path / "d")).attach(trainer)
    assert not any((tmp_path / n).exists() for n in "abd")
