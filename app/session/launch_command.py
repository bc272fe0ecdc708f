"""Run on N GPUs: the torchrun command line for the current settings, and the GPU count
(torch, loaded off the GUI thread). Pure functions, no Qt.

launcher.py starts the command as a QProcess; the session follows the run through its
run.db, like any run training in another process (Stop goes through run.db's commands table).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Optional, Union

from engine.declarations.config import TrainConfig
from engine.declarations.settings import BY_NAME, SETTINGS, Setting

LOG_NAME = "torchrun.log"
MIN_GPUS = 2

# Settings written on every command line (so the log and the dialog show them), in this order;
# every other declared setting is written when it is not its default (engine/declarations/settings.py).
# run_dir is the function's argument; resume and fork have no place in a new multi-process run.
ALWAYS = ("task", "micro_batch", "accum", "lr", "clip", "lr_scaling", "precision", "epochs", "max_steps",
          "optimizer", "device", "seed", "nonfinite", "token_budget", "effective_batch", "memory_margin",
          "vram_limit", "find_micro_batch", "oom_recovery", "strategy")
NOT_LAUNCHED = ("run_dir", "resume", "fork")


def _flag_value(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return repr(v) if isinstance(v, float) else str(v)


def _setting_flags(s: Setting, v: Any) -> list[str]:
    """One setting's flags as the engine's command line reads them back."""
    if v is None:  # the default's None is no flag; a None that is not the default is its word (`all`)
        return [s.option, s.none_means] if s.default is not None and s.none_means else []
    if s.switch:
        return [s.option] if v else []
    if s.repeat and isinstance(v, dict):  # --task-arg KEY=VALUE, the value as JSON (the engine reads it back as JSON)
        return [part for key, val in v.items() for part in (s.option, f"{key}={json.dumps(val)}")]
    if s.repeat:  # --notify URL: once per value
        return [part for val in v for part in (s.option, str(val))]
    return [s.option, _flag_value(v)]


def engine_flags(config: Union[TrainConfig, dict[str, Any]]) -> list[str]:
    """The `python -m engine` flags for these settings (validated; raises ConfigError): every
    declared setting, so a launch trains with what the form and the flags say."""
    cfg = config if isinstance(config, TrainConfig) else TrainConfig.from_dict(dict(config))
    cfg.validate()
    always = ALWAYS + (("fsdp_reduce", "cpu_offload") if cfg.strategy == "fsdp" else ())
    chosen = [BY_NAME[n] for n in always] + [s for s in SETTINGS if s.name not in always + NOT_LAUNCHED
                                             and getattr(cfg, s.name) != s.default]
    return [part for s in chosen for part in _setting_flags(s, getattr(cfg, s.name))]


def torchrun_command(config: Union[TrainConfig, dict[str, Any]], n: int, run_dir: str,
                     python: Optional[str] = None) -> list[str]:
    """[python, -m, torch.distributed.run, --standalone, --nproc-per-node, N, -m, engine, <flags>, --run-dir, DIR]."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"number of processes must be an integer >= 1, got {n!r}")
    if not run_dir:
        raise ValueError("a run folder is needed")
    return [python or sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
            "-m", "engine", *engine_flags(config), "--run-dir", str(run_dir)]


def engine_pythonpath() -> str:
    """PYTHONPATH for the child: the folder holding the engine package first, then the caller's."""
    import engine
    here = os.path.dirname(os.path.dirname(os.path.abspath(engine.__file__)))
    rest = os.environ.get("PYTHONPATH", "")
    return here + (os.pathsep + rest if rest else "")


def cuda_device_count() -> tuple[int, str]:
    """(GPUs torch sees, why none when 0). Imports torch: call it off the GUI thread."""
    try:
        import torch
        n = int(torch.cuda.device_count())
        if n:
            return n, ""
        if not torch.version.cuda:
            return 0, "this torch is a CPU build"
        return 0, "torch sees no CUDA device"
    except Exception as e:
        return 0, f"torch is not available ({type(e).__name__}: {e})"


def gate_tooltip(count: int, why: str = "") -> str:
    if count >= MIN_GPUS:
        return f"Start this run with torchrun on up to {count} GPUs (one process per GPU)"
    seen = f"{count} GPU" + ("" if count == 1 else "s")
    return f"Needs {MIN_GPUS} or more CUDA GPUs: torch sees {seen} here" + (f" ({why})" if why else "")
