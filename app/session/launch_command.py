"""Run on N GPUs: the torchrun command line for the current settings, and the GPU count
(torch, loaded off the GUI thread). Pure functions, no Qt.

launcher.py starts the command as a QProcess; the session follows the run through its
run.db, like any run training in another process (Stop goes through run.db's commands table).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Optional, Union

from engine.declarations.config import TrainConfig

LOG_NAME = "torchrun.log"
MIN_GPUS = 2

# TrainConfig field -> flag, in the order they are written. run_dir is the function's argument;
# resume and vram_low_fraction have no place in a new multi-process run launched from the form.
_FLAGS = (("task", "--task"), ("micro_batch", "--micro-batch"), ("accum", "--accum"), ("lr", "--lr"),
          ("clip", "--clip"), ("lr_scaling", "--lr-scaling"), ("precision", "--precision"), ("epochs", "--epochs"),
          ("max_steps", "--max-steps"), ("optimizer", "--optimizer"), ("device", "--device"), ("seed", "--seed"),
          ("nonfinite", "--nonfinite"), ("token_budget", "--token-budget"), ("effective_batch", "--effective-batch"),
          ("memory_margin", "--memory-margin"), ("vram_limit", "--vram-limit"))


def _flag_value(v: Any) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def engine_flags(config: Union[TrainConfig, dict[str, Any]]) -> list[str]:
    """The `python -m engine` flags for these settings (validated; raises ConfigError)."""
    cfg = config if isinstance(config, TrainConfig) else TrainConfig.from_dict(dict(config))
    cfg.validate()
    out: list[str] = []
    for name, flag in _FLAGS:
        v = getattr(cfg, name)
        if v is None:
            continue
        out += [flag, _flag_value(v)]
    if cfg.find_micro_batch:
        out.append("--find-micro-batch")
    out += ["--oom-recovery", "on" if cfg.oom_recovery else "off"]
    out += ["--strategy", cfg.strategy]
    if cfg.strategy == "fsdp":  # fsdp's own flags only with it (validate refuses them under ddp)
        out += ["--fsdp-reduce", cfg.fsdp_reduce, "--cpu-offload", "on" if cfg.cpu_offload else "off"]
    return out


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
