"""An interrupted then resumed run reproduces the uninterrupted run: the same loss at every
step (bit for bit on CPU), the same epoch losses, the same final weights, and run.db's step
rows run 1..N with no gap and no duplicate. The model has dropout, so the RNG state must be
restored too, and AdamW, so the optimizer state must be."""
from __future__ import annotations

import sqlite3

import pytest
import torch
from engine_helpers import adamw, assert_same_tree, make_task, run_trainer

from engine.checkpoints import files as ckpt
from engine.declarations.commands import Stop
from engine.store import RunReader

N, MICRO, ACCUM, EPOCHS = 30, 2, 3, 3  # 5 steps per epoch, 15 in all
CFG = dict(micro_batch=MICRO, accum=ACCUM, lr=0.01, clip=1.0, epochs=EPOCHS)


def fresh_task():
    return make_task(N, optimizer=adamw, dropout=0.3, val=True)


def stopper(at_step):
    def on_event(e, trainer):
        if e.kind == "step" and e.step == at_step:
            trainer.send(Stop())
    return on_event


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run = run_trainer(fresh_task(), tmp_path_factory.mktemp("a") / "run", **CFG)
    reader = RunReader(run.run_dir)
    return dict(rows=reader.metrics(), epochs=reader.epochs(),
                weights={k: v.clone() for k, v in run.trainer.model.state_dict().items()},
                optimizer=run.trainer.optimizer.state_dict(), result=run.result)


def check_same_as_uninterrupted(a, run_dir, final_run):
    reader = RunReader(run_dir)
    rows = reader.metrics()
    assert [r["step"] for r in rows] == list(range(1, EPOCHS * 5 + 1))  # no gap, no duplicate
    assert [r["loss"] for r in rows] == [r["loss"] for r in a["rows"]]  # bit-identical
    assert [r["grad_norm"] for r in rows] == [r["grad_norm"] for r in a["rows"]]
    assert [r["epoch"] for r in rows] == [r["epoch"] for r in a["rows"]]
    # Epoch losses: the train loss over the whole epoch, and the validation loss.
    got = [(e["epoch"], e["step"], e["train_loss"], e["val_loss"]) for e in reader.epochs()]
    want = [(e["epoch"], e["step"], e["train_loss"], e["val_loss"]) for e in a["epochs"]]
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert [g[3] for g in got] == pytest.approx([w[3] for w in want], rel=1e-12)
    assert [g[2] for g in got] == pytest.approx([w[2] for w in want], rel=1e-12)
    assert_same_tree(dict(final_run.trainer.model.state_dict()), a["weights"])
    assert_same_tree(final_run.trainer.optimizer.state_dict(), a["optimizer"])
    assert final_run.result.steps == a["result"].steps and final_run.result.reason == "completed"
    starts = reader.events(kinds=["run_started"])
    assert [e["data"]["resumed"] for e in starts] == [False] + [True] * (len(starts) - 1)


@pytest.mark.parametrize("interrupt", ["max_steps_epoch_end", "max_steps_mid_epoch", "stop_mid_epoch",
                                       "stop_first_step_of_epoch", "twice"])
def test_resume_reproduces_uninterrupted_run(tmp_path, uninterrupted, interrupt):
    run_dir = tmp_path / "run"
    if interrupt == "max_steps_epoch_end":
        first = run_trainer(fresh_task(), run_dir, max_steps=5, **CFG)
        assert first.result.reason == "max_steps"
    elif interrupt == "max_steps_mid_epoch":
        first = run_trainer(fresh_task(), run_dir, max_steps=8, **CFG)
    elif interrupt == "stop_mid_epoch":
        first = run_trainer(fresh_task(), run_dir, on_event=stopper(7), **CFG)
        assert first.result.reason == "stopped"
    elif interrupt == "stop_first_step_of_epoch":
        first = run_trainer(fresh_task(), run_dir, on_event=stopper(6), **CFG)
    else:
        run_trainer(fresh_task(), run_dir, on_event=stopper(3), **CFG)
        first = run_trainer(fresh_task(), run_dir, on_event=stopper(11), resume=str(run_dir),
                            **{k: v for k, v in CFG.items()})
        assert first.result.steps == 11
    state = torch.load(ckpt.last_path(str(run_dir)), weights_only=True)
    assert state["step"] == first.result.steps
    final = run_trainer(fresh_task(), None, resume=str(run_dir), **CFG)
    assert final.steps[0].step == first.result.steps + 1
    check_same_as_uninterrupted(uninterrupted, str(run_dir), final)


def test_resume_after_crash_supersedes_rows_past_the_checkpoint(tmp_path, uninterrupted):
    """Rows logged after the last checkpoint (a crash between checkpoint and exit) are replaced
    by the rerun's: still one row per step, with the uninterrupted losses."""
    run_dir = tmp_path / "run"
    run_trainer(fresh_task(), run_dir, max_steps=5, **CFG)
    db = sqlite3.connect(str(run_dir / "run.db"))
    for step in (6, 7):  # what a crashed process could have committed after the checkpoint
        db.execute("INSERT INTO metrics (step, epoch, loss) VALUES (?, 2, 123.0)", (step,))
    db.commit()
    db.close()
    final = run_trainer(fresh_task(), None, resume=str(run_dir), **CFG)
    check_same_as_uninterrupted(uninterrupted, str(run_dir), final)


def test_resume_keeps_settings_changed_by_commands(tmp_path):
    """Settings changed at a boundary before the stop are the ones the resumed run trains with."""
    from engine.declarations.commands import SetAccum, SetLr

    def on_event(e, trainer):
        if e.kind == "epoch_end" and e.epoch == 1:
            trainer.send(SetAccum(5))
            trainer.send(SetLr(0.002))
        if e.kind == "step" and e.step == 6:
            trainer.send(Stop())

    run_dir = tmp_path / "run"
    run_trainer(fresh_task(), run_dir, on_event=on_event, **CFG)
    final = run_trainer(fresh_task(), None, resume=str(run_dir), **CFG)
    assert {(m.accum, m.lr, m.samples) for m in final.steps} == {(5, 0.002, 10)}


@pytest.mark.parametrize("limit, trained", [(5, []), (3, []), (8, [6, 7, 8])])
def test_resume_honours_max_steps_as_a_step_counter_limit(tmp_path, limit, trained):
    """Resuming a run at step 5 with max_steps=5 (or less) trains nothing more; with 8, exactly 6..8."""
    run_dir = tmp_path / "run"
    run_trainer(fresh_task(), run_dir, max_steps=5, **CFG)
    again = run_trainer(fresh_task(), None, resume=str(run_dir), **{**CFG, "max_steps": limit})
    assert [m.step for m in again.steps] == trained
    assert again.result.reason == "max_steps"
    assert [r["step"] for r in RunReader(str(run_dir)).metrics()] == list(range(1, 6 + len(trained)))
