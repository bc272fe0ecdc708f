"""Checkpoints of sharded runs (--strategy fsdp): a torch.distributed.checkpoint folder.

RUN_DIR/checkpoints/<name>/ (name: last, epoch-N, step-S) holds DCP's files (each rank writes
its own shards, rank 0 the .metadata) and meta.pt: everything else a resume needs (progress,
settings, config, scaler, scheduler, RNG, world size), a small torch.save file read with
weights_only=True. Model and optimizer go through torch.distributed.checkpoint.state_dict
(get/set_state_dict): optimizer state keyed by parameter names, so a checkpoint loads on any
number of ranks, sharded or not, and into a plain model in one process.

Atomic: every rank writes into .tmp-<name>-<step>/; once all have (a barrier), rank 0 moves
an existing <name>/ aside to .old-<name>/, renames the new folder in and removes the old one.
A crash between the two renames leaves .old-<name>/ with no <name>/: files.recover (run by
the folder's one writer at start) puts it back.
"""
from __future__ import annotations

import os
import shutil
import warnings
from typing import Any, Optional

import torch
import torch.distributed as dist

# Re-exported: a resume catches it as sharded.CheckpointException (engine/trainer/setup.py).
from torch.distributed.checkpoint.api import CheckpointException as CheckpointException

from . import dcp_input
from . import files as ckpt

META = ckpt.META


def is_sharded(path: str) -> bool:
    return os.path.isdir(path)


def tensor_shapes(folder: str) -> dict[str, tuple[int, ...]]:
    """{model state key: shape} from the folder's DCP metadata (nothing loaded)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    meta = dcp_input.read_metadata(folder)
    out = {}
    for key, md in meta.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(md, TensorStorageMetadata):
            out[key[len("model."):]] = tuple(md.size)
    return out


def has_optimizer_state(folder: str) -> bool:
    return any(k.startswith("optimizer.") for k in dcp_input.read_metadata(folder).state_dict_metadata)


def save(folders: list[str], model: torch.nn.Module, optimizer: torch.optim.Optimizer, meta: dict[str, Any],
         step: int, is_main: bool) -> None:
    """Every rank: its shards of model and optimizer into `folders[0]` (atomically, see
    above); the other folders (last beside epoch-N) are hard-linked copies of it (DCP's files
    are never written again)."""
    from torch.distributed.checkpoint import save as dcp_save
    from torch.distributed.checkpoint.state_dict import get_state_dict
    folder = folders[0]
    parent, name = os.path.split(folder.rstrip(os.sep))
    tmp = os.path.join(parent, f"{ckpt.TMP_PREFIX}{name}-{step}")
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    dist.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp_save({"model": model_state, "optimizer": optim_state}, checkpoint_id=tmp)
    if is_main:
        ckpt.save_atomic(meta, os.path.join(tmp, META))
    dist.barrier()  # every rank's shards are on disk
    if is_main:
        swap_in(tmp, folder)
        for other in folders[1:]:
            copy = os.path.join(parent, f"{ckpt.TMP_PREFIX}{os.path.basename(other)}-{step}")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(folder, copy, copy_function=os.link)
            swap_in(copy, other)
    dist.barrier()  # nobody reads or writes the next one before the renames


def swap_in(tmp: str, folder: str) -> None:
    """Put the finished folder `tmp` at `folder`, replacing what was there (files.swap_in, the
    one atomic replace); a single-file checkpoint of the same name (folder + '.pt', from a part
    of the run that was not sharded) goes too, so each name is one checkpoint."""
    ckpt.swap_in(tmp, folder)
    try:
        os.unlink(folder + ".pt")
    except OSError:
        pass


def load_into(folder: str, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer]) -> None:
    """A sharded checkpoint into this run's model and optimizer, whatever their layout: FSDP
    shards on any number of ranks (DCP reshards), or whole tensors (DDP, one process)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
        state: dict[str, Any] = {"model": get_model_state_dict(model)}
        read(state, folder)
        set_model_state_dict(model, state["model"])
        return
    model_state, optim_state = get_state_dict(model, optimizer)  # the layout to load into
    state = {"model": model_state, "optimizer": optim_state}
    read(state, folder)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def read(state: dict[str, Any], folder: str) -> None:
    """DCP's load of `folder` into `state`. Without a process group (a sharded run forked or
    resumed in one process) every shard is read here: said with no_dist, and DCP's warning that
    it assumes so (given even then) is not passed on to the user. A damaged or crafted folder
    raises CheckpointError (dcp_input.py), whichever rank found it."""
    from torch.distributed.checkpoint import load as dcp_load
    single = not (dist.is_available() and dist.is_initialized())
    with warnings.catch_warnings():
        if single:
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        try:  # read as input (dcp_input.py): DCP's own reader would unpickle whatever .metadata holds
            dcp_load(state, storage_reader=dcp_input.Reader(folder), planner=dcp_input.Planner(folder),
                     no_dist=single)
        except CheckpointException as e:
            raise dcp_input.as_error(folder, e) from None


def load_weights(state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 model_sharded: bool) -> None:
    """Model and optimizer from a checkpoint (a file's state, or a sharded folder's meta) into
    this run's model and optimizer, sharded or not."""
    if state.get("sharded"):
        load_into(state["sharded"], model, optimizer)
    elif model_sharded:
        load_whole_into(state, model, optimizer)
    else:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])


def load_whole_into(state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """A single-file checkpoint (whole tensors, the optimizer's state by parameter index) into
    a sharded model: each rank keeps its shards of it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict
    whole = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, state["model"], options=whole)
    set_optimizer_state_dict(model, optimizer, by_name(state["optimizer"], model, optimizer), options=whole)


def by_name(saved: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """torch.optim's state_dict (parameters by index, in the optimizer's order) keyed by the
    parameters' names instead, as torch.distributed.checkpoint.state_dict writes it. The
    optimizer was built by the same factory on the same model, so its groups list the same
    parameters in the same order."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = []
    state = {}
    for mine, theirs in zip(optimizer.param_groups, saved["param_groups"]):
        fqns = [names[id(p)] for p in mine["params"]]
        for fqn, index in zip(fqns, theirs["params"]):
            if index in saved["state"]:
                state[fqn] = saved["state"][index]
        groups.append({**{k: v for k, v in theirs.items() if k != "params"}, "params": fqns})
    return {"state": state, "param_groups": groups}
