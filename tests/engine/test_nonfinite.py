"""A non-finite loss or gradient: with --nonfinite skip the window is dropped and the weights
and optimizer state stay bit-identical to before it; one `nonfinite` event per skipped step
names the parameters; the run goes on. With --nonfinite stop the run ends with a checkpoint
of the last good weights."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from engine_helpers import TokenModel, adamw, assert_same_tree, make_task, run_trainer, snapshot, token_loss_sum

from engine.checkpoints import files as ckpt
from engine.store import RunReader

N, MICRO, ACCUM = 24, 2, 3  # 4 steps per epoch, 3 micro-batches (loss calls) per step
PARAMS = ("emb.weight", "hidden.weight", "hidden.bias", "head.weight", "head.bias")


def poisoned_loss(bad_steps, kind="loss"):
    """NaN on the second micro-batch of each step in bad_steps (1-based): the first micro-batch's
    gradients are already accumulated and must be dropped too."""
    calls = {(s - 1) * ACCUM + 1 for s in bad_steps}
    state = {"n": 0}

    def loss(model, batch):
        loss_sum, count = token_loss_sum(model, batch)
        if not model.training:  # the engine's pre-flight check of the loss (eval mode): not a step
            return loss_sum, count
        k = state["n"]
        state["n"] += 1
        if k in calls:
            if kind == "loss":
                loss_sum = loss_sum * float("nan")
            else:  # finite loss, NaN gradient in one parameter only: d/dg sqrt(0 * g) = 0 * inf
                loss_sum = loss_sum + torch.sqrt(model.gate * 0.0)
        return loss_sum, count
    return loss


class GatedModel(TokenModel):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.ones(()))


def snapshots_run(tmp_path, task, **cfg):
    snaps = {}

    def on_event(e, trainer):
        if e.kind == "run_started":
            snaps[0] = snapshot(trainer)
        elif e.kind == "step":
            snaps[e.step] = snapshot(trainer)

    run = run_trainer(task, tmp_path / "run", on_event=on_event, micro_batch=MICRO, accum=ACCUM, lr=0.01,
                      clip=1.0, epochs=2, **cfg)
    return run, snaps


def differs(a, b) -> bool:
    try:
        assert_same_tree(a, b)
        return False
    except AssertionError:
        return True


@pytest.mark.parametrize("bad", [(3,), (1, 6)], ids=["step3", "steps1and6"])
def test_nan_loss_skips_step_bit_identically(tmp_path, bad):
    task = make_task(N, optimizer=adamw, loss=poisoned_loss(bad))
    run, snaps = snapshots_run(tmp_path, task)
    total = 2 * N // (MICRO * ACCUM)
    assert run.result.reason == "completed" and run.result.steps == total  # the run went on
    assert run.result.nonfinite_steps == len(bad)
    for s in range(1, total + 1):
        m = run.steps[s - 1]
        assert m.step == s and m.nonfinite == (s in bad)
        if s in bad:
            # Weights and optimizer state (AdamW moments and step counts) exactly as before the window.
            assert_same_tree(snaps[s][0], snaps[s - 1][0])
            assert_same_tree(snaps[s][1], snaps[s - 1][1])
            assert m.loss != m.loss  # NaN reported as such
        else:
            assert differs(snaps[s][0], snaps[s - 1][0]), f"step {s} did not train"
    events = run.of("nonfinite")
    assert [e.step for e in events] == list(bad)  # exactly one per skipped step
    for e in events:
        assert e.action == "skipped" and e.loss_finite is False
        assert set(e.params) == set(PARAMS)  # a NaN loss poisons every gradient
    reader = RunReader(run.run_dir)
    rows = reader.metrics()
    assert [r["step"] for r in rows if r["nonfinite"]] == list(bad)
    assert [e["step"] for e in reader.events(kinds=["nonfinite"])] == list(bad)
    # Training losses of good steps stay finite after the skip.
    assert all(r["loss"] == r["loss"] for r in rows if not r["nonfinite"])


@pytest.mark.parametrize("clip", [0.0, 1.0], ids=["clip_off", "clip_on"])
def test_nonfinite_gradient_names_only_the_bad_parameter(tmp_path, clip):
    """Finite loss, NaN gradient in `gate` only: the event names `gate` and nothing else,
    with or without clipping (clipping by a NaN norm must not smear NaN over every gradient
    before the check), and the step is skipped bit-identically."""
    torch.manual_seed(0)
    task = make_task(N, optimizer=adamw, loss=poisoned_loss((2,), kind="grad"), model=GatedModel())
    snaps = {}

    def on_event(e, trainer):
        if e.kind == "step":
            snaps[e.step] = snapshot(trainer)

    run = run_trainer(task, tmp_path / "run", on_event=on_event, micro_batch=MICRO, accum=ACCUM, lr=0.01,
                      clip=clip, max_steps=3)
    (ev,) = run.of("nonfinite")
    assert ev.step == 2 and ev.loss_finite is True and ev.action == "skipped"
    assert ev.params == ("gate",)
    assert run.steps[1].nonfinite and run.steps[1].loss == run.steps[1].loss  # loss itself finite
    assert_same_tree(snaps[2][0], snaps[1][0])
    assert_same_tree(snaps[2][1], snaps[1][1])
    assert differs(snaps[3][0], snaps[2][0])


def test_nonfinite_stop_checkpoints_last_good_weights(tmp_path):
    task = make_task(N, optimizer=adamw, loss=poisoned_loss((3,)))
    run, snaps = snapshots_run(tmp_path, task, nonfinite="stop")
    assert run.result.reason == "nonfinite"
    assert [m.step for m in run.steps] == [1, 2, 3]  # nothing trained after the bad step
    (ev,) = run.of("nonfinite")
    assert ev.step == 3 and ev.action == "stopped"
    assert run.of("run_finished")[0].reason == "nonfinite"
    state = torch.load(ckpt.last_path(run.run_dir), weights_only=True)
    assert_same_tree(state["model"], snaps[2][0])  # last good weights
    assert_same_tree(state["optimizer"], snaps[2][1])
    assert RunReader(run.run_dir).info()["status"] == "finished"
