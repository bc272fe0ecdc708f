"""`headroom-export RUN_DIR[@CHECKPOINT] OUT.pt` (also `python -m engine.export`): any checkpoint
of a run, a single file or a sharded folder (--strategy fsdp), as one file that
`torch.load(OUT.pt, weights_only=True)` reads, with the model's state_dict under "model".

CHECKPOINT is last (the default), epoch-N or step-S. A sharded checkpoint is read without a
process group, whole tensors on the CPU (torch.distributed.checkpoint); its optimizer state,
kept by parameter name there, is written by index as torch.optim's state_dict has it, so the
file is a Headroom checkpoint like any last.pt (a run continues from it in one process or
under --strategy ddp). Bad input: one `error:` line, exit 2, nothing written.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Any, Optional, Sequence

from .declarations.config import ConfigError

EXIT_OK, EXIT_BAD_INPUT = 0, 2


def export(spec: str, out: str) -> str:
    """Write the checkpoint `spec` (RUN_DIR[@CHECKPOINT]) to `out`; returns what was read."""
    from .checkpoints import files as ckpt
    from .checkpoints.run_tree import checkpoint_for, split_fork
    run_dir, which = split_fork(spec)
    check_out(out)  # before anything is read: a folder, a link or a device is never replaced
    if not os.path.isdir(run_dir):
        raise ConfigError(f"{run_dir}: no such run folder")
    notes: list[str] = []
    path = checkpoint_for(run_dir, which, notes)
    for note in notes:
        sys.stderr.write(f"note: {note}\n")
    if not os.path.exists(path):
        have = ", ".join(ckpt.name_of(p) for p in ckpt.candidates(run_dir)) or "none"
        raise ConfigError(f"{spec}: no checkpoint {which} in {run_dir} (it has: {have})")
    state = ckpt.load(path)
    if state.get("sharded"):
        state = {**{k: v for k, v in state.items() if k != "sharded"}, **whole_from_folder(path)}
    check_out(out)  # again: the reading took a while
    ckpt.save_atomic(state, out)
    return path


def check_out(out: str) -> None:
    """OUT must be a new file or a regular file (replaced atomically), in a folder that exists."""
    from .checkpoints import files as ckpt
    ckpt.check_replaceable(out)
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise ConfigError(f"{out}: the folder {folder} does not exist")


def whole_from_folder(folder: str) -> dict[str, Any]:
    """A sharded checkpoint's model and optimizer as whole CPU tensors, the optimizer's state by
    index (torch.optim's layout)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict  # as dcp_to_torch_save reads one

    from .checkpoints import dcp_input
    from .checkpoints.sharded import CheckpointException
    whole: dict[str, Any] = {}
    try:  # no process group: every shard read here, as input (dcp_input.py), never DCP's plain unpickling
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            _load_state_dict(whole, storage_reader=dcp_input.Reader(folder), planner=dcp_input.WholePlanner(folder),
                             no_dist=True)
    except CheckpointException as e:
        raise dcp_input.as_error(folder, e) from None
    return {"model": whole["model"], "optimizer": by_index(whole.get("optimizer") or {})}


def by_index(named: dict[str, Any]) -> dict[str, Any]:
    """torch.distributed.checkpoint's optimizer state (by parameter name) as torch.optim's
    state_dict: parameters numbered across the groups in their order."""
    groups, state, index = [], {}, 0
    for g in named.get("param_groups", []):
        ids = []
        for fqn in g.get("params", []):
            if fqn in named.get("state", {}):
                state[index] = named["state"][fqn]
            ids.append(index)
            index += 1
        groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": ids})
    return {"state": state, "param_groups": groups}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]  # one line, exit 2, no usage dump
        raise ConfigError(message)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = _Parser(prog="headroom-export", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", metavar="RUN_DIR[@CHECKPOINT]", help="a run folder; CHECKPOINT: last (default), "
                   "epoch-N or step-S")
    p.add_argument("out", metavar="OUT.pt", help="the file to write")
    try:
        ns = p.parse_args(argv)
        path = export(ns.checkpoint, ns.out)
    except ConfigError as e:
        sys.stderr.write("error: " + " ".join(str(e).split()) + "\n")
        return EXIT_BAD_INPUT
    except OSError as e:
        sys.stderr.write(f"error: could not write {getattr(e, 'filename', None) or 'the file'}: {e.strerror or e}\n")
        return EXIT_BAD_INPUT
    sys.stdout.write(f"exported {path} to {ns.out}\n")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
