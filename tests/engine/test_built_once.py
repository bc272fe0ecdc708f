"""A Trainer is its run, built once when it is made: bad input fails there (nothing in the
folder), and what the views show before run() is what run() trains."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from engine_helpers import make_task  # noqa: E402 - after the sys.path set-up above

from engine.declarations.config import ConfigError, TrainConfig
from engine.trainer import setup
from engine.trainer.trainer import Trainer


def test_the_run_is_built_when_the_trainer_is_made_and_only_then(tmp_path, monkeypatch):
    builds = []
    real = setup.build
    monkeypatch.setattr("engine.trainer.trainer.build", lambda *a: builds.append(1) or real(*a))
    task = make_task(16)
    trainer = Trainer(TrainConfig(task="tokens", device="cpu", micro_batch=4, accum=2, epochs=1, lr=0.05,
                                  run_dir=str(tmp_path / "r")), task=task)
    assert len(builds) == 1
    model, optimizer, parts = trainer.model, trainer.optimizer, trainer.parts
    assert model is task.model and trainer.run_dir == str(tmp_path / "r") and trainer.step == 0
    assert not os.path.exists(tmp_path / "r" / "run.db")  # built, nothing written yet
    result = trainer.run()
    assert len(builds) == 1 and trainer.parts is parts
    assert trainer.model is model and trainer.optimizer is optimizer and result.steps == trainer.step == 2


def test_bad_input_fails_when_the_trainer_is_made_with_nothing_written(tmp_path):
    with pytest.raises(ConfigError, match="larger than the data set"):
        Trainer(TrainConfig(task="tokens", device="cpu", micro_batch=64, run_dir=str(tmp_path / "r")),
                task=make_task(16))
    assert not os.path.exists(tmp_path / "r" / "run.db")
