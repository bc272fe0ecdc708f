"""A run whose length changes while it trains (issue 32): epochs and max steps are live
settings. The run ends at the new length, the lr schedule is re-planned from where the run
is (LrSchedule.replanned: the samples trained keep their lr, past the warmup the decay goes
on from the lr it is at to min_lr_ratio x peak at the new end), and a length the run has
already passed is refused with the reason, nothing changed. Real in-process runs."""
from __future__ import annotations

import math
import sqlite3

import pytest
from engine_helpers import make_task, run_trainer

from engine.ctl import local
from engine.ctl.protocol import CtlError
from engine.declarations.commands import SETTING_COMMANDS
from engine.declarations.schedule import LrSchedule

SetEpochs, SetMaxSteps = SETTING_COMMANDS["epochs"], SETTING_COMMANDS["max_steps"]
N, PER_STEP = 24, 6  # 24 samples, micro-batch 2 x accum 3: 4 steps an epoch
PEAK, MIN = 0.1, 0.1


def run(tmp_path, sends, name="run", **cfg):
    """A cosine run; `sends` maps a step to the commands sent when its row comes."""
    def on_event(e, trainer):
        if e.kind == "step":
            for cmd in sends.get(e.step, ()):
                trainer.send(cmd) if not callable(cmd) else cmd(trainer)
    opts = dict(epochs=2, lr=PEAK, lr_schedule="cosine", min_lr_ratio=MIN)
    opts.update(cfg)
    return run_trainer(make_task(N), tmp_path / name, on_event=on_event, **opts)


def cosine(top, start, end, s):
    t = min(max((s - start) / (end - start), 0.0), 1.0)
    return MIN + (top - MIN) * 0.5 * (1 + math.cos(math.pi * t))


def test_extended_mid_run_trains_the_new_length_and_the_decay_ends_there(tmp_path):
    r = run(tmp_path, {5: [SetEpochs(3, at="step")]})  # in epoch 2 of 2
    assert [m.epoch for m in r.steps] == [1] * 4 + [2] * 4 + [3] * 4 and r.result.epochs_done == 3
    applied = r.of("settings_applied")
    assert [(a.step, a.at, a.changes) for a in applied] == [(5, "step", (("epochs", 2, 3),))]
    plan = r.of("lr_planned")[-1]
    assert plan.replanned and plan.samples_now == 30 and plan.total_samples == 72
    assert plan.curve[-1] == (72.0, pytest.approx(MIN * PEAK))  # the decay's end: min x peak at the new end
    assert "ends at 0.1 x peak at sample 72" in plan.message()
    top = cosine(1.0, 0, 48, 30)  # where the old plan had the lr when the length changed
    lrs = [m.lr for m in r.steps]
    assert lrs[:5] == pytest.approx([PEAK * cosine(1.0, 0, 48, s) for s in range(0, 30, PER_STEP)])
    assert lrs[5:] == pytest.approx([PEAK * cosine(top, 30, 72, s) for s in range(30, 72, PER_STEP)])
    assert lrs[5] == pytest.approx(PEAK * top)  # no jump at the change
    # The last step starts at 66 of 72 samples: one step from the min, above it, still falling
    # (the old plan would have held it at the min since sample 48: the negative control).
    assert PEAK * MIN < lrs[-1] < lrs[-2] and lrs[-1] == pytest.approx(PEAK * cosine(top, 30, 72, 66))
    assert LrSchedule("cosine", 0, 72, MIN, 30, top).factor(72) == pytest.approx(MIN)
    unchanged = run(tmp_path, {}, name="unchanged")
    assert len(unchanged.steps) == 8 and unchanged.steps[-1].lr != pytest.approx(lrs[7])


def test_extended_in_the_last_epoch_for_the_next_epoch_goes_on(tmp_path):
    """at="epoch" sent in the last epoch: applied where the run would have ended, and it goes on."""
    r = run(tmp_path, {6: [SetEpochs(3)]})
    assert r.result.epochs_done == 3 and len(r.steps) == 12 and r.result.reason == "completed"
    assert [(a.step, a.at) for a in r.of("settings_applied")] == [(8, "end")]
    plan = r.of("lr_planned")[-1]
    assert plan.replanned and plan.total_samples == 72 and plan.samples_now == 48


def test_shortened_while_in_epoch_1_ends_after_epoch_2(tmp_path):
    r = run(tmp_path, {2: [SetEpochs(2, at="step")]}, epochs=4)
    assert r.result.epochs_done == 2 and len(r.steps) == 8 and r.result.reason == "completed"
    plan = r.of("lr_planned")[-1]
    assert plan.replanned and plan.total_samples == 48 and plan.curve[-1][0] == 48.0
    assert r.steps[-1].lr < r.steps[2].lr


def test_a_length_already_passed_is_refused_and_nothing_changes(tmp_path):
    r = run(tmp_path, {5: [SetEpochs(1, at="step")], 4: [SetMaxSteps(4, at="step")]})
    reasons = [(e.command, e.reason) for e in r.of("command_refused")]
    assert reasons == [("set_max_steps", "max_steps=4 refused: the run has done 4 steps; give at least 5"),
                       ("set_epochs", "epochs=1 refused: the run has finished 1 epoch; give at least 2")]
    assert r.of("settings_applied") == [] and len(r.steps) == 8 and r.result.epochs_done == 2
    assert [p.replanned for p in r.of("lr_planned")] == [False]


def test_max_steps_extended_and_lowered(tmp_path):
    longer = run(tmp_path, {2: [SetMaxSteps(6, at="step")]}, name="longer", max_steps=3)
    assert len(longer.steps) == 6 and longer.result.reason == "max_steps"
    plan = longer.of("lr_planned")[-1]
    assert plan.replanned and plan.total_samples == 36  # 12 seen + 4 steps left x 6
    shorter = run(tmp_path, {2: [SetMaxSteps(3, at="step")]}, name="shorter")
    assert len(shorter.steps) == 3 and shorter.result.reason == "max_steps"


def test_headroom_ctl_set_epochs_reaches_the_run_through_run_db(tmp_path):
    assert [type(c) for c in local.parse_changes(["epochs=3", "max-steps=20"], "step")] == [SetEpochs, SetMaxSteps]
    with pytest.raises(CtlError, match="set epochs"):
        local.parse_changes(["epochs=0"], "epoch")
    run_dir = tmp_path / "ctl"

    def ctl(*pairs):
        return lambda trainer: list(local.send(str(run_dir), local.parse_changes(list(pairs), "step")))
    r = run(tmp_path, {2: [ctl("epochs=3")], 6: [ctl("epochs=1")]}, name="ctl", db_interval=0)
    assert r.result.epochs_done == 3 and len(r.steps) == 12
    db = sqlite3.connect(run_dir / "run.db")
    rows = db.execute("select kind, status, note from commands order by id").fetchall()
    db.close()
    assert rows == [("set_epochs", "applied", ""),
                    ("set_epochs", "refused", "epochs=1 refused: the run has finished 1 epoch; give at least 2")]


def test_a_run_extended_then_stopped_resumes_with_its_length_and_its_curve(tmp_path):
    """The checkpoint keeps the new length and the re-planned curve: a resume goes on to the
    new end with the lr the uninterrupted run had (the config's own plan would differ)."""
    from engine.declarations.commands import Stop
    whole = run(tmp_path, {5: [SetEpochs(3, at="step")]}, name="whole")
    first = run(tmp_path, {5: [SetEpochs(3, at="step")], 7: [Stop()]}, name="cut")
    assert len(first.steps) == 7 and first.result.reason == "stopped"
    again = run_trainer(make_task(N), None, resume=str(tmp_path / "cut"), epochs=2, lr=PEAK,
                        lr_schedule="cosine", min_lr_ratio=MIN)  # the run's config, as --resume reads it
    assert [m.step for m in again.steps] == list(range(8, 13)) and again.result.epochs_done == 3
    assert [m.lr for m in again.steps] == pytest.approx([m.lr for m in whole.steps[7:]], rel=1e-12)
    said = again.of("settings_applied")
    assert [(a.at, a.changes) for a in said] == [("start", (("epochs", 2, 3),))]


def test_the_console_line_counts_to_the_new_epochs(tmp_path):
    import engine.cli as cli
    r = run(tmp_path, {5: [SetEpochs(3, at="step")]})
    sink = cli.ConsoleSink(False, 2)
    for e in r.events:
        sink(e)
    assert sink.total_epochs == 3


def test_the_rule_in_the_warmup_and_for_a_linear_decay():
    """Pure LrSchedule: in the warmup the warmup keeps its length and the decay spans the new
    total; past it a linear decay goes on from the lr it is at, with no jump, to the min."""
    warm = LrSchedule.for_run("cosine", MIN, 100, warmup_samples=20)
    longer = warm.replanned(10, 200)
    assert (longer.warmup, longer.total, longer.from_samples) == (20.0, 200.0, 0.0)
    assert longer.factor(10) == warm.factor(10) and longer.factor(200) == pytest.approx(MIN)
    lin = LrSchedule.for_run("linear", MIN, 100)
    cut = lin.replanned(40, 60)
    assert cut.factor(40) == pytest.approx(lin.factor(40)) and cut.factor(60) == pytest.approx(MIN)
    assert cut.factor(50) == pytest.approx((lin.factor(40) + MIN) / 2)  # a straight line from here
    assert cut.factor(20) == lin.factor(20)  # the samples trained keep their lr (the plot's past)
    assert LrSchedule.for_run("constant", MIN, 100).replanned(40, 300).factor(250) == 1.0
