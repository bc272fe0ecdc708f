"""A run's TrainConfig from its command line: the flags given, and for --resume or --fork the
run's (or the parent's) saved config under them. The engine (engine/cli.py), the app
(app/main.py) and `headroom-ctl start` (engine/ctl/start.py) read flags through this one
function, so the three never disagree on what a command line means.

Torch-free: the saved config is read from run.db through the run store, a --fork's checkpoint
only by name (engine/declarations/checkpoint_names.py); nothing is loaded.
"""
from __future__ import annotations

import argparse

from .declarations.checkpoint_names import split_fork
from .declarations.config import ConfigError, TrainConfig, check_one_origin, overlay
from .declarations.run_flags import given as given_flags
from .store import RunReader, StoreError

# Config keys of the saved run that are never carried into the new one.
_NOT_CARRIED = ("run_dir", "resume", "fork", "find_micro_batch", "fork_changes")


def config_from_args(ns: argparse.Namespace) -> TrainConfig:
    """Flags given on the command line; for --resume, the run's saved config under them."""
    given = given_flags(ns)
    if "task_args" in given:  # repeated KEY=VALUE pairs, the later one winning
        given["task_args"] = dict(given["task_args"])
    check_one_origin(given.get("resume"), given.get("fork"))
    source = "resume" if "resume" in given else "fork" if "fork" in given else None
    if source is None:
        return TrainConfig.from_dict(given).validate()
    folder = given["resume"] if source == "resume" else split_fork(given["fork"])[0]
    try:
        reader = RunReader(folder)
        saved = reader.info().get("config") or {}
        reader.close()
    except StoreError as e:
        raise ConfigError(f"--{source} {folder}: {e}") from None
    saved = dict(saved) if isinstance(saved, dict) else {}
    for key in _NOT_CARRIED:
        saved.pop(key, None)
    if source == "fork":  # what the user set for this fork, even to the value the parent started with
        given["fork_changes"] = tuple(k for k in given if k not in ("fork", "run_dir"))
    if source == "resume":
        saved.pop("max_steps", None)  # the limit that stopped the run is not one for its continuation
        if saved and "keep_epoch_checkpoints" not in saved:  # started before the setting: it kept them all
            saved["keep_epoch_checkpoints"] = None
    if "task_args" in given and isinstance(saved.get("task_args"), dict):  # the keys named change, the rest stay
        given["task_args"] = {**saved["task_args"], **given["task_args"]}
    base = overlay(saved, given)
    try:
        return TrainConfig.from_dict(base).validate()
    except ConfigError as e:
        try:  # the flags alone (all of them) are fine: the value out of range came from the saved config
            TrainConfig.from_dict(given).validate()
        except ConfigError:
            raise e from None
        raise ConfigError(f"--{source} {folder}: the run's saved config: {e} "
                          "(give the flag to override it)") from None


__all__ = ["config_from_args"]
