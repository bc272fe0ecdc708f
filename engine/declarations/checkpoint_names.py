"""Which checkpoints a run folder holds, by name only (nothing loaded). Torch-free: the app lists
a run's checkpoints with this before torch loads, and the engine resumes and forks from the
same list, so the two never disagree on what a checkpoint is.

A checkpoint is a file, checkpoints/<name>.pt, or for a sharded run (--strategy fsdp) a
torch.distributed.checkpoint folder, checkpoints/<name>/; a name (last, epoch-N, step-S) is one
or the other, never both."""
from __future__ import annotations

import os
import re

CKPT_DIR = "checkpoints"
LAST = "last.pt"
_NUMBERED = re.compile(r"(epoch|step)-(\d{1,18})(\.pt)?")
_WHICH = re.compile(r"last|epoch-\d{1,18}|step-\d{1,18}")


def split_fork(spec: str) -> tuple[str, str]:
    """'DIR@step-40' -> ('DIR', 'step-40'); 'DIR' -> ('DIR', 'last'): a --fork or an export's
    RUN_DIR[@CHECKPOINT], split by name only (torch-free: the flags are read before torch loads)."""
    folder, sep, which = str(spec).rpartition("@")
    if sep and _WHICH.fullmatch(which):
        return folder, which
    return str(spec), "last"


def name_of(path: str) -> str:
    """'.../checkpoints/step-40.pt' or '.../checkpoints/step-40' -> 'step-40'."""
    base = os.path.basename(path.rstrip(os.sep))
    return base[:-3] if base.endswith(".pt") else base


def candidates(run_dir: str) -> list[str]:
    """The run's checkpoints, newest first: last, then epoch-N by N descending, then step-S by
    S descending, each a file (name.pt) or a sharded folder (name/). (A step-S file is written
    between epoch ends, so which of an epoch-N and a step-S file is newer is known only from
    the step inside; callers that care load and compare.) Only what exists; temporary and
    other files are ignored."""
    folder = os.path.join(run_dir, CKPT_DIR)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    numbered: dict[str, list[tuple[int, str]]] = {"epoch": [], "step": []}
    for name in names:
        m = _NUMBERED.fullmatch(name)
        path = os.path.join(folder, name)
        if m and (os.path.isfile(path) if m.group(3) else os.path.isdir(path)):
            numbered[m.group(1)].append((int(m.group(2)), name))
    out = [os.path.join(folder, n) for n in (LAST, LAST[:-3])
           if (os.path.isfile if n == LAST else os.path.isdir)(os.path.join(folder, n))]
    for kind in ("epoch", "step"):
        out += [os.path.join(folder, n) for _, n in sorted(numbered[kind], reverse=True)]
    return out
