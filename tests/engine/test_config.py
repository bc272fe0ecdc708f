"""TrainConfig validation and parse_size: every out-of-range value is a one-line ConfigError."""
from __future__ import annotations

import math

import pytest

from engine.declarations.config import ConfigError, TrainConfig, format_bytes, parse_size


@pytest.mark.parametrize("text, expected", [
    ("24GiB", 24 * 2**30), ("24 GiB", 24 * 2**30), ("24gib", 24 * 2**30), ("24Gi", 24 * 2**30),
    ("24GB", 24 * 10**9), ("24G", 24 * 10**9), ("1.5GiB", int(1.5 * 2**30)), ("512MiB", 512 * 2**20),
    ("100", 100), ("100B", 100), ("2KiB", 2048), ("2K", 2000), ("1TiB", 2**40), ("1T", 10**12),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "abc", "-1GiB", "0", "0GiB", "0.5", "1PB", "1 2GiB", "1e9", "nan",
                                  "24 GiBs", "1.GiB"])
def test_parse_size_rejects(text):
    with pytest.raises(ConfigError) as info:
        parse_size(text)
    assert "\n" not in str(info.value)


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(24 * 2**30) == "24.0 GiB"


def test_defaults_validate():
    cfg = TrainConfig().validate()
    assert (cfg.task, cfg.micro_batch, cfg.accum, cfg.clip, cfg.nonfinite) == ("mlp", 16, 4, 1.0, "skip")


@pytest.mark.parametrize("changes", [
    dict(micro_batch=0), dict(micro_batch=-1), dict(micro_batch=2.0), dict(micro_batch=True),
    dict(accum=0), dict(accum="4"), dict(epochs=0), dict(max_steps=0), dict(token_budget=0),
    dict(effective_batch=0), dict(lr=-1.0), dict(lr=math.nan), dict(lr=math.inf), dict(lr="0.1"), dict(lr=True),
    dict(clip=-1.0), dict(clip=math.inf), dict(clip=math.nan), dict(optimizer="lion"), dict(precision="fp8"),
    dict(lr_scaling="cubic"), dict(nonfinite="ignore"), dict(device="tpu"), dict(device="cuda:x"),
    dict(device="cpu "), dict(find_micro_batch=True), dict(memory_margin=1.0), dict(memory_margin=-0.1),
    dict(vram_limit=0), dict(seed=-1), dict(seed=1.5),
])
def test_validate_rejects(changes):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**changes).validate()
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("changes", [
    dict(lr=0.0), dict(clip=0.0), dict(device="cpu"), dict(device="cuda"), dict(device="cuda:1"),
    dict(find_micro_batch=True, effective_batch=64), dict(token_budget=1), dict(max_steps=1),
])
def test_validate_accepts(changes):
    TrainConfig(**changes).validate()


def test_dict_round_trip_ignores_unknown_keys():
    cfg = TrainConfig(accum=7, lr=0.5)
    assert TrainConfig.from_dict({**cfg.to_dict(), "not_a_field": 1}) == cfg
    assert cfg.with_(accum=2).accum == 2 and cfg.accum == 7
