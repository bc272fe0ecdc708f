"""One declaration per setting (engine/declarations/settings.py): every declared setting has its
flag with help and the TrainConfig default in --help, in its option group, a validation range or
its choices, a command and a LiveSettings field if it is live, and a metrics column if every step
records it. Old spellings (flags, command kinds and fields, event kinds, saved configs) still work.
Torch-free except where a run is made."""
from __future__ import annotations

import argparse
import dataclasses
import json
import math

import pytest

from engine.cli import build_parser, config_from_args
from engine.declarations.commands import (
    COMMANDS,
    OLD_FIELDS,
    SETTING_COMMANDS,
    SetAccum,
    SetCheckpointing,
    SetClip,
    SetLr,
    SetLrScaling,
    SetMicroBatch,
    Unpause,
    command_for,
    command_from_json,
    payload_value,
    setting_change,
    setting_of,
)
from engine.declarations.config import CHOICES, RANGES, ConfigError, TrainConfig
from engine.declarations.events import SettingsApplied, StepMetrics, Unpaused
from engine.declarations.settings import GROUPS, LIVE_SETTINGS, SETTINGS, LiveSettings, scale_lr, scaled_to_reference
from engine.store import METRIC_COLUMNS


def actions_by_flag(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: a for a in parser._actions for flag in a.option_strings}


def group_of(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    return next(g.title for g in parser._action_groups if action in g._group_actions)


# -- every declared setting has every surface ------------------------------------------------------
@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_every_setting_has_a_flag_with_help_and_its_default_in_its_group(s):
    parser = build_parser()
    action = actions_by_flag(parser)[s.option]
    assert action.dest == s.name and s.name in TrainConfig.__dataclass_fields__
    assert action.help and s.help in action.help.replace("%%", "%")
    assert group_of(parser, action) == s.group in GROUPS
    shown = s.default_text()
    if shown:  # the default is TrainConfig's, written into the help line
        assert action.help.endswith(f"(default {shown})")
    default = TrainConfig().to_dict()[s.name]
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        assert shown in (str(default), f"{default:g}")


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_every_number_has_a_range_and_every_word_its_choices(s):
    if s.type in (int, float):
        r = RANGES[s.name]
        assert r.flag == s.option and r.kind is s.type
        with pytest.raises(ConfigError, match=s.option):  # one below the range: refused, the flag named
            TrainConfig(**{s.name: s.type(r.low) - 1}).validate()
        needs = {"token_budget": 1} if s.name == "micro_tokens" else {}
        TrainConfig(**{s.name: s.type(r.low)}, **needs).validate()  # the end of the range: taken
    elif s.name in CHOICES:
        assert s.choices == CHOICES[s.name] and actions_by_flag(build_parser())[s.option].choices == s.choices
        with pytest.raises(ConfigError, match=s.option):
            TrainConfig(**{s.name: "no-such-word"}).validate()
    elif s.type is bool:  # (config names it by the field: --checkpointing, the old spelling, is still read)
        with pytest.raises(ConfigError, match="|".join((s.option, *s.old_flags))):
            TrainConfig(**{s.name: 1}).validate()


@pytest.mark.parametrize("s", LIVE_SETTINGS, ids=lambda s: s.name)
def test_every_live_setting_has_a_command_named_like_it_and_a_live_settings_field(s):
    value = getattr(LiveSettings(), s.name)
    assert value == TrainConfig().to_dict()[s.name]  # the default is TrainConfig's
    cmd = command_for(s.name, value, at="step")
    assert type(cmd) is SETTING_COMMANDS[s.name] is COMMANDS[f"set_{s.name}"]
    assert json.loads(cmd.to_json()) == {s.name: value, "at": "step"}  # the payload is the setting's name
    assert command_from_json(cmd.kind, cmd.to_json()) == cmd
    assert setting_change(cmd) == (s, value) and setting_of(cmd.kind) is s
    assert s.label and s.words  # the app's form and its hints name it


def test_live_settings_are_the_live_declarations_in_order():
    assert [f.name for f in dataclasses.fields(LiveSettings)] == [s.name for s in LIVE_SETTINGS]
    assert [s.name for s in LIVE_SETTINGS][:3] == ["micro_batch", "accum", "lr"]  # the batch before lr (scaling)
    assert (SetMicroBatch, SetAccum, SetLr, SetClip, SetLrScaling, SetCheckpointing) == tuple(
        SETTING_COMMANDS[n] for n in ("micro_batch", "accum", "lr", "clip", "lr_scaling", "checkpointing"))


def test_per_step_settings_are_metrics_columns_and_the_app_keeps_them_all():
    from app.model.metrics import STEP_COLUMNS
    per_step = [s.name for s in SETTINGS if s.per_step]
    assert {"micro_batch", "accum", "lr", "clip"} <= set(per_step)
    step_fields = {f.name for f in dataclasses.fields(StepMetrics)}
    assert set(per_step) <= step_fields and set(per_step) <= set(METRIC_COLUMNS)
    assert STEP_COLUMNS == METRIC_COLUMNS and "scaler_skipped" in STEP_COLUMNS and "time" in STEP_COLUMNS


def test_help_shows_the_option_groups_and_every_flag_has_help():
    parser = build_parser()
    text = parser.format_help()
    for title in (*GROUPS, "Old spellings (still read)"):
        assert f"\n{title}:\n" in text
    for a in parser._actions:
        assert a.help, a.option_strings
    for flag in ("--find-micro-batch", "--effective-batch", "--memory-margin", "--oom-recovery", "--optimizer",
                 "--precision", "--seed"):
        assert actions_by_flag(parser)[flag].help
    assert "--micro-batch B       samples per forward/backward (default 16)" in text


# -- one lr scaling rule ----------------------------------------------------------------------------
def test_the_lr_scaling_rule_is_one_function_both_paths_use():
    from engine.declarations.rules import CommandRules
    assert scale_lr(0.1, "linear", 4.0) == pytest.approx(0.4)
    assert scale_lr(0.1, "sqrt", 4.0) == pytest.approx(0.2)
    assert scale_lr(0.1, "none", 4.0) == 0.1
    for rule in ("linear", "sqrt"):
        s = LiveSettings(micro_batch=4, accum=2, lr=0.1, clip=1.0, lr_scaling=rule)
        mid_run = CommandRules(data_len=1000).apply(s, [SetAccum(8)], step=3, epoch=1).settings.lr
        events: list = []
        cfg = TrainConfig(micro_batch=4, accum=8, lr=0.1, lr_scaling=rule, reference_batch=8)
        at_start = scaled_to_reference(LiveSettings.from_config(cfg), cfg, 1, events.append, 0).lr
        assert mid_run == at_start == scale_lr(0.1, rule, 4.0)
        assert isinstance(events[0], SettingsApplied) and events[0].changes == (("lr", 0.1, at_start),)


# -- old spellings --------------------------------------------------------------------------------
def parse(*argv: str) -> TrainConfig:
    return config_from_args(build_parser().parse_args(list(argv)))


def test_old_checkpointing_flag_is_activation_checkpointing():
    assert parse("--checkpointing", "on").checkpointing is True
    assert parse("--activation-checkpointing", "on").checkpointing is True
    assert parse("--checkpointing", "off").checkpointing is False
    with pytest.raises(ConfigError, match="--checkpointing"):
        parse("--checkpointing", "maybe")


@pytest.mark.parametrize("argv, samples, fraction", [
    (("--warmup", "0.1"), 0, 0.1), (("--warmup", "0"), 0, 0.0), (("--warmup", "64"), 64, 0.0),
    (("--warmup", "1"), 1, 0.0), (("--warmup-samples", "64"), 64, 0.0), (("--warmup-fraction", "0.25"), 0, 0.25),
    (("--warmup-fraction", "1"), 0, 1.0),
])
def test_warmup_is_samples_or_a_fraction_and_the_old_flag_picks_by_value(argv, samples, fraction):
    cfg = parse(*argv)
    assert (cfg.warmup_samples, cfg.warmup_fraction) == (samples, fraction)


@pytest.mark.parametrize("argv, said", [
    (("--warmup", "-1"), "--warmup"), (("--warmup", "nan"), "--warmup"),
    (("--warmup-samples", "0.5"), "--warmup-samples"), (("--warmup-fraction", "2"), "--warmup-fraction"),
    (("--warmup-samples", "5", "--warmup-fraction", "0.1"), "give one"),
])
def test_bad_warmups_are_one_line_errors(argv, said):
    with pytest.raises(ConfigError) as info:
        parse(*argv)
    assert said in str(info.value) and "\n" not in str(info.value)


def test_old_warmup_in_python_and_in_saved_configs():
    assert (TrainConfig(warmup=0.1).warmup_fraction, TrainConfig(warmup=32).warmup_samples) == (0.1, 32)
    assert "warmup" not in TrainConfig(warmup=0.1).to_dict()
    assert TrainConfig.from_dict({"warmup": 0.05}).warmup_fraction == 0.05
    assert TrainConfig.from_dict({"warmup": 500.0}).warmup_samples == 500
    assert TrainConfig.from_dict({"warmup": 5, "warmup_fraction": 0.2}).warmup_fraction == 0.2  # today's key wins
    with pytest.raises(ConfigError):
        TrainConfig(warmup=0.1, warmup_samples=5)


def test_a_run_saved_with_the_old_warmup_resumes_with_it_or_with_the_new_flags(tmp_path):
    from engine.store import RunStore
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    old = {k: v for k, v in TrainConfig(lr_schedule="cosine").to_dict().items()
           if k not in ("warmup_samples", "warmup_fraction")}
    store = RunStore(str(run_dir))
    store.set_info(config={**old, "warmup": 0.25, "checkpointing": False})
    store.close()
    cfg = parse("--resume", str(run_dir))
    assert (cfg.lr_schedule, cfg.warmup_samples, cfg.warmup_fraction) == ("cosine", 0, 0.25)
    cfg = parse("--resume", str(run_dir), "--warmup-samples", "10")  # a warmup given replaces the saved one
    assert (cfg.warmup_samples, cfg.warmup_fraction) == (10, 0.0)


@pytest.mark.parametrize("kind, old, new", [(k, o, n) for k, m in OLD_FIELDS.items() for o, n in m.items()])
def test_old_command_fields_are_read_and_answer_to_their_old_names(kind, old, new):
    value = {"accum": 4, "micro_batch": 8, "clip": 0.5, "lr_scaling": "sqrt", "checkpointing": True}[new]
    cmd = command_from_json(kind, json.dumps({old: value, "at": "step"}))
    assert cmd == COMMANDS[kind](value, at="step") and getattr(cmd, new) == getattr(cmd, old) == value
    assert payload_value(kind, {old: value}) == payload_value(kind, {new: value}) == value


def test_old_resume_command_and_resumed_event_are_unpause():
    import engine
    from engine.declarations.commands import Resume
    from engine.declarations.events import OLD_KINDS, Resumed
    assert engine.Resume is Resume is Unpause is engine.Unpause and Unpause.kind == "unpause"
    assert command_from_json("resume", "{}") == Unpause() == command_from_json("unpause", None)
    assert Resumed is Unpaused and Unpaused(3, 2).kind == "unpaused" and OLD_KINDS["resumed"] == "unpaused"


def test_the_old_kwarg_accum_steps_is_not_an_optimizer_step_count_any_more():
    """SetAccum's field is the setting's: accum (micro-batches per optimizer step)."""
    assert [f.name for f in dataclasses.fields(SetAccum)] == ["sent_by", "at", "accum"]  # sent_by: who sent it (Command)
    with pytest.raises(ConfigError, match="set_accum accum"):
        SetAccum(0)
    assert math.isclose(SetClip(clip=0.5).clip, 0.5) and SetAccum(accum=4).accum == 4
