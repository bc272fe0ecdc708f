"""The TrainConfig a Start or a Run on N GPUs sends: the command-line flags under the form's
values, with the rules for --resume and --run-dir when a window starts more than one run.
Qt-free."""
from __future__ import annotations

import os
from typing import Any

from app.core.runs import is_run_dir
from engine.declarations.config import ConfigError, TrainConfig, overlay
from engine.declarations.paths import default_run_dir


def start_config(base: dict[str, Any], form: dict[str, Any], resume_used: bool) -> TrainConfig:
    """The run Start begins in this window's engine thread. Raises ConfigError."""
    cfg = dict(base)
    if resume_used:
        cfg.pop("resume", None)  # --resume continues that run once; Start again begins a new one
    if cfg.get("run_dir") and is_run_dir(str(cfg["run_dir"])):
        cfg.pop("run_dir")  # --run-dir already holds the earlier run: a new folder under the runs folder
    if cfg.get("resume"):
        cfg.pop("run_dir", None)
    if cfg.get("fork") and "fork_changes" in cfg:  # --fork: what the form changed is a change too
        edited = tuple(k for k, v in form.items() if k in cfg and cfg[k] != v)
        cfg["fork_changes"] = tuple(dict.fromkeys((*cfg["fork_changes"], *edited)))
    return TrainConfig.from_dict(overlay(cfg, form)).validate()


def launch_config(base: dict[str, Any], form: dict[str, Any]) -> TrainConfig:
    """The run Run on N GPUs starts: always a new one, in a folder of its own."""
    cfg = {k: v for k, v in base.items() if k not in ("resume", "run_dir")}
    return TrainConfig.from_dict(overlay(cfg, form)).validate()


def launch_dir(config: TrainConfig, n: int, run_dir: str = "") -> str:
    """The folder a launch on n processes writes: the one given, else a new one named like the
    engine's own with -Nproc. Raises ConfigError if it already holds a run."""
    path = os.path.abspath(run_dir or default_run_dir(config.task, suffix=f"-{n}proc"))
    if is_run_dir(path):
        raise ConfigError(f"{path} already holds a run")
    return path
