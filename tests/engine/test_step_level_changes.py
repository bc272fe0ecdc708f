"""Settings applied at the next optimizer step (at="step"): within one epoch, no window ever
split between two settings, the sample order unchanged, every update still equal to the
whole window's gradient (against a plain-torch reference, with a negative control), and
the same through run.db's payload field."""
from __future__ import annotations

import json
import sqlite3
import time

import pytest
import torch
from engine_helpers import Recorder, RecordingSGD, flat, make_task, rel_err, run_trainer
from test_accumulation import LR, reference

from engine.accumulation import sampling
from engine.declarations.commands import SetAccum, SetLr, SetMicroBatch, command_from_json
from engine.declarations.config import ConfigError

N = 48


def changing_run(tmp_path, name="run", workers=0):
    rec = Recorder()
    task = make_task(N, "variable", torch.float64, optimizer=RecordingSGD, recorder=rec)

    def on_event(e, trainer):
        if e.kind == "step" and e.step == 2:
            trainer.send(SetAccum(4, at="step"))
        if e.kind == "step" and e.step == 4:
            trainer.send(SetMicroBatch(2, at="step"))
            trainer.send(SetLr(0.25))  # at the next epoch, as before

    run = run_trainer(task, tmp_path / name, recorder=rec, on_event=on_event, micro_batch=3, accum=2, lr=LR,
                      epochs=2, workers=workers)
    return run, rec


def test_changes_apply_at_the_next_step_and_never_split_a_window(tmp_path):
    run, rec = changing_run(tmp_path)
    applied = run.of("settings_applied")
    assert [(a.at, a.step, a.from_step, a.changes) for a in applied[:2]] == [
        ("step", 2, 3, (("accum", 2, 4),)), ("step", 4, 5, (("micro_batch", 3, 2),))]
    assert applied[2].at == "epoch" and applied[2].changes == (("lr", LR, 0.25),)
    shapes = [(m.epoch, m.micro_batch, m.accum, m.samples) for m in run.steps]
    assert shapes[:4] == [(1, 3, 2, 6), (1, 3, 2, 6), (1, 3, 4, 12), (1, 3, 4, 12)]
    assert shapes[4][1:3] == (2, 4) and shapes[4][0] == 1  # still epoch 1: a step-level change
    # The epoch's sample order is the plan's, however its windows were cut.
    epoch1 = [i for w, m in zip(rec.windows, run.steps) if m.epoch == 1 for i in w]
    assert epoch1 == sampling.epoch_order(N, 0, 1)
    for w, m in zip(rec.window_micro, run.steps):  # each window trained with one micro-batch size
        assert all(len(mb) <= m.micro_batch for mb in w) and sum(map(len, w)) == m.samples
    assert [m.lr for m in run.steps if m.epoch == 2] == [0.25] * len([m for m in run.steps if m.epoch == 2])
    received = [e for e in run.of("command_received") if e.command == "set_accum"]
    assert received[0].applies == "step" and received[0].target_epoch is None


def test_every_update_still_equals_the_window_gradient(tmp_path):
    run, rec = changing_run(tmp_path)
    grads = run.trainer.optimizer.grads
    ref_grads, _, _, _ = reference(N, "variable", torch.float64, rec.windows[:len([m for m in run.steps
                                                                                  if m.epoch == 1])])
    assert len(ref_grads) >= 6
    for step, (g, r) in enumerate(zip(grads, ref_grads), start=1):
        assert rel_err(flat(g), flat(r)) < 1e-10, f"step {step}"
    # Negative control: the windows of a run that never changed differ from step 3 on, and so
    # do their gradients, by far more than the tolerance.
    fixed = [sampling.epoch_order(N, 0, 1)[i:i + 6] for i in range(0, N, 6)]
    wrong, _, _, _ = reference(N, "variable", torch.float64, fixed)
    assert rel_err(flat(grads[2]), flat(wrong[2])) > 1e-3


def test_workers_do_not_change_a_run_with_step_level_changes(tmp_path):
    a, _ = changing_run(tmp_path, "w0", workers=0)
    b, _ = changing_run(tmp_path, "w2", workers=2)
    assert [m.loss for m in a.steps] == [m.loss for m in b.steps]
    assert all(torch.equal(x, y) for x, y in zip(a.trainer.model.parameters(), b.trainer.model.parameters()))


def test_at_step_through_run_db(tmp_path):
    def on_event(e, trainer):
        if e.kind == "step" and e.step == 1:
            db = sqlite3.connect(str(tmp_path / "run" / "run.db"), timeout=10)
            db.execute("INSERT INTO commands (time, kind, payload) VALUES (?,?,?)",
                       (time.time(), "set_accum", json.dumps({"steps": 1, "at": "step"})))
            db.commit()
            db.close()

    run = run_trainer(make_task(2 * N), tmp_path / "run", on_event=on_event, micro_batch=3, accum=4, epochs=1,
                      db_interval=0)  # run.db read at every step
    accums = [m.accum for m in run.steps]
    assert accums[0] == 4 and accums[-1] == 1 and run.steps[-1].epoch == 1  # changed within the epoch
    applied = run.of("settings_applied")
    assert applied and applied[0].at == "step"


def test_at_is_validated():
    assert command_from_json("set_clip", '{"norm": 0.5, "at": "step"}') == __import__(
        "engine.declarations.commands", fromlist=["SetClip"]).SetClip(0.5, at="step")
    with pytest.raises(ConfigError, match="at must be one of epoch, step"):
        command_from_json("set_clip", '{"norm": 0.5, "at": "now"}')
    with pytest.raises(ConfigError):
        SetAccum(2, at=3)
