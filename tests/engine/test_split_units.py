"""Unit tests of the pieces the trainer was split into: window policies, the pure
command rules (lr arithmetic without a trainer), the Progress round trip, the named
step numbers, and a set_accum refused by a token-budget run."""
from __future__ import annotations

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from engine_helpers import make_task, run_trainer  # noqa: E402 - after the sys.path set-up above

from engine.accumulation.policy import FixedWindows, TokenBudgetWindows
from engine.accumulation.step import pack, unpack
from engine.declarations.commands import Pause, SetAccum, SetClip, SetLr, SetLrScaling, SetMicroBatch, command_for
from engine.declarations.events import CommandRefused, LrHint, SettingsApplied
from engine.declarations.rules import CommandRules
from engine.declarations.settings import LIVE_SETTINGS, LiveSettings
from engine.trainer.progress import Progress

S = LiveSettings(micro_batch=4, accum=2, lr=0.01, clip=1.0, lr_scaling="none")


# -- window policies -------------------------------------------------------------------------------
def test_fixed_windows_cover_the_epoch_in_windows_of_micro_x_accum_x_world():
    policy = FixedWindows(30, seed=1)
    windows = policy.windows(1, S, world=2)
    assert [len(w) for w in windows] == [16, 14]  # 4 x 2 x 2, the last one short
    assert sorted(i for w in windows for i in w) == list(range(30))
    assert policy.split(list(range(8)), S) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert policy.refusal("accum") is None


def test_fixed_windows_order_depends_on_seed_and_epoch_only():
    policy = FixedWindows(30, seed=1)
    flat = lambda windows: [i for w in windows for i in w]  # noqa: E731 - a one-line function, named where it is used
    assert flat(policy.windows(1, S, 1)) == flat(policy.windows(1, S.with_(micro_batch=1, accum=7), 1))
    assert flat(policy.windows(1, S, 1)) != flat(policy.windows(2, S, 1))
    assert flat(policy.windows(1, S, 1)) != flat(FixedWindows(30, seed=2).windows(1, S, 1))


def test_token_budget_windows_close_on_the_budget_and_refuse_accum():
    lengths = [3, 5, 2, 7, 1, 4, 6, 2]
    policy = TokenBudgetWindows(len(lengths), seed=0, budget=8, length=lengths.__getitem__)
    windows = policy.windows(1, S, world=1)
    for w in windows[:-1]:
        held = sum(lengths[i] for i in w)
        assert held >= 8 and held - lengths[w[-1]] < 8  # closed by its last sample, not before
    assert sorted(i for w in windows for i in w) == list(range(8))
    # The window does not depend on the settings: accumulation is not a knob here.
    assert windows == policy.windows(1, S.with_(accum=9, micro_batch=1), world=1)
    assert "token-budget" in policy.refusal("accum")
    assert policy.refusal("micro_batch") is None and policy.refusal("lr") is None


# -- command rules: a pure function ---------------------------------------------------------------
def rules(data_len=100, refusal=lambda name: None):
    return CommandRules(data_len, refusal)


def test_accum_change_with_rule_none_keeps_lr_and_hints_the_linear_lr():
    out = rules().apply(S, [SetAccum(4)], step=10, epoch=2)
    assert out.settings == S.with_(accum=4) and out.notes == [""]
    hint = [e for e in out.events if isinstance(e, LrHint)]
    assert len(hint) == 1 and hint[0].suggested_lr == pytest.approx(0.02)
    applied = [e for e in out.events if isinstance(e, SettingsApplied)]
    assert applied[0].changes == (("accum", 2, 4),) and (applied[0].step, applied[0].epoch) == (10, 2)


@pytest.mark.parametrize("rule,factor", [("linear", 4.0), ("sqrt", 2.0)])
def test_lr_scaling_rules_scale_by_the_effective_batch_ratio(rule, factor):
    out = rules().apply(S.with_(lr_scaling=rule), [SetAccum(4), SetMicroBatch(8)], step=0, epoch=1)
    assert out.settings.window_samples == 32  # 4x2 -> 8x4: ratio 4
    assert out.settings.lr == pytest.approx(0.01 * factor)
    assert not [e for e in out.events if isinstance(e, LrHint)]


def test_an_explicit_lr_wins_over_the_scaling_rule():
    out = rules().apply(S.with_(lr_scaling="linear"), [SetAccum(8), SetLr(0.5)], step=0, epoch=1)
    assert out.settings.lr == 0.5 and out.settings.accum == 8
    [applied] = [e for e in out.events if isinstance(e, SettingsApplied)]
    assert applied.by_rule == ()  # asked for: not the rule's


def test_settings_applied_names_what_the_rule_changed():
    out = rules().apply(S.with_(lr_scaling="linear"), [SetAccum(4)], step=0, epoch=1)
    [applied] = [e for e in out.events if isinstance(e, SettingsApplied)]
    assert applied.by_rule == ("lr",) and "lr" in dict((n, v) for n, _o, v in applied.changes)
    assert "(by the lr scaling rule)" in applied.message()
    out = rules().apply(S, [SetAccum(4)], step=0, epoch=1)  # rule none: a hint, no change by the rule
    [applied] = [e for e in out.events if isinstance(e, SettingsApplied)]
    assert applied.by_rule == ()


def test_refusals_leave_settings_and_say_why():
    out = rules(data_len=6).apply(S, [SetMicroBatch(7), SetClip(0.5)], step=3, epoch=1)
    assert out.settings == S.with_(clip=0.5)
    assert "larger than the data set" in out.notes[0] and out.notes[1] == ""
    refused = [e for e in out.events if isinstance(e, CommandRefused)]
    assert [e.command for e in refused] == ["set_micro_batch"]
    policy = TokenBudgetWindows(4, 0, 8, [1, 2, 3, 4].__getitem__)
    out = rules(refusal=policy.refusal).apply(S.with_(lr_scaling="linear"), [SetAccum(8)], step=0, epoch=1)
    assert out.settings == S.with_(lr_scaling="linear")  # not applied, and so no lr rescale either
    assert "token-budget" in out.notes[0]
    assert not [e for e in out.events if isinstance(e, SettingsApplied)]


def test_non_setting_commands_pass_through_and_nothing_changed_means_no_event():
    out = rules().apply(S, [Pause(), SetLrScaling("none")], step=0, epoch=1)
    assert out.settings == S and out.notes == ["", ""] and out.events == []


def test_every_live_setting_has_a_command_and_round_trips():
    for s in LIVE_SETTINGS:
        value = getattr(S, s.name)
        cmd = command_for(s.name, value)
        assert rules().apply(S, [cmd], 0, 1).settings == S
        assert s.name in LiveSettings.__dataclass_fields__


# -- progress round trip ----------------------------------------------------------------------------
def test_progress_round_trips_through_a_checkpoint_including_the_rng():
    p = Progress(step=17, epoch=3, window=5, epoch_loss=12.5, epoch_count=40.0, nonfinite_steps=2, scaler_skips=1)
    torch.manual_seed(123)
    state = p.to_checkpoint(torch.device("cpu"))
    expected_draw = torch.rand(3)
    torch.manual_seed(999)  # the RNG moves on; from_checkpoint puts it back
    q = Progress.from_checkpoint(state, torch.device("cpu"))
    assert q == p
    assert torch.equal(torch.rand(3), expected_draw)
    # Saved with torch.save / weights_only like a real checkpoint: plain types only.
    import io
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    assert Progress.from_checkpoint(torch.load(buf, weights_only=True), torch.device("cpu")) == p


def test_progress_reads_older_checkpoints_epoch_sums():
    q = Progress.from_checkpoint({"step": 4, "epoch": 1, "window": 4, "epoch_sums": [3.0, 6.0]}, torch.device("cpu"))
    assert (q.step, q.window, q.epoch_loss, q.epoch_count) == (4, 4, 3.0, 6.0)
    assert q.epoch_train_loss == 0.5


# -- named step numbers ------------------------------------------------------------------------------
@pytest.mark.parametrize("ddp", [False, True])
def test_pack_and_unpack_name_every_number(ddp):
    totals = torch.tensor([6.0, 3.0], dtype=torch.float64)
    agree = torch.tensor([1.0, -2.0, 1.0], dtype=torch.float64) if ddp else None
    per_param = torch.tensor([3.0, 4.0])
    nums = unpack(pack(totals, agree, torch.linalg.vector_norm(per_param), per_param).tolist(), ddp)
    assert (nums.loss_sum, nums.count, nums.loss, nums.norm, nums.per_param) == (6.0, 3.0, 2.0, 5.0, (3.0, 4.0))
    assert (nums.stop_any, nums.min_micro, nums.step_commands_any) == ((True, 2, True) if ddp else (False, 0, False))
    assert nums.finite
    bad = unpack(pack(totals, agree, torch.tensor(float("nan")), per_param).tolist(), ddp)
    assert not bad.finite and math.isnan(bad.norm)


# -- the whole trainer: set_accum under a token budget ----------------------------------------------
def test_set_accum_during_a_token_budget_run_is_refused(tmp_path):
    def on_event(e, trainer):
        if e.kind == "step" and e.step == 1:
            trainer.send(SetAccum(5))

    run = run_trainer(make_task(24), tmp_path / "run", on_event=on_event, micro_batch=2, accum=1, epochs=2,
                      token_budget=40)
    refused = run.of("command_refused")
    assert len(refused) == 1 and refused[0].command == "set_accum" and "token-budget" in refused[0].reason
    assert not run.of("settings_applied") and not run.of("lr_hint")
    received = run.of("command_received")
    assert received and received[0].applies == "epoch" and received[0].target_epoch == 2
    # Windows of epoch 2 are the token budget's, as before: same sizes as a run never sent the command.
    plain = run_trainer(make_task(24), tmp_path / "plain", micro_batch=2, accum=1, epochs=2, token_budget=40)
    assert [(m.samples, m.accum) for m in run.steps] == [(m.samples, m.accum) for m in plain.steps]
    assert all(m.lr == plain.steps[0].lr for m in run.steps)
