"""Checkpoints: written atomically (temporary file, fsync, rename), read with weights_only=True.

A checkpoint is a file, checkpoints/<name>.pt, or for a sharded run (--strategy fsdp) a
torch.distributed.checkpoint folder, checkpoints/<name>/ (sharded.py); a name is one or the
other, never both (writing one removes the other)."""
from __future__ import annotations

import os
import pickle
import re
import shutil
import tempfile
import warnings
import zipfile
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from engine.declarations.config import ConfigError
# What a run folder holds, by name (torch-free, shared with the app): re-exported from here.
from .names import CKPT_DIR, LAST, candidates, name_of  # noqa: F401

if TYPE_CHECKING:
    from engine.store.runlock import RunLock

TMP_PREFIX = ".tmp-"  # save_atomic's temporary files (and sharded.save's temporary folders)
OLD_PREFIX = ".old-"  # sharded.swap_in: the folder being replaced, for a moment
META = "meta.pt"  # a sharded checkpoint's state besides model and optimizer
PROBE_PREFIX = ".probe-"  # check_writable_dir's probe files


class CheckpointError(ConfigError):
    pass


class CheckpointRefused(CheckpointError):
    """The file holds more than weights (pickled code): never loaded, never skipped silently."""


def save_atomic(obj: dict[str, Any], path: str) -> None:
    """torch.save to a temporary file beside `path`, fsync, then rename over it.

    A crash or a full disk leaves either the old file or the new one, never half of one.
    """
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".pt", dir=folder)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # as open() would, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def save_checkpoint(state: dict[str, Any], path: str) -> None:
    """A single-file checkpoint at `path` (atomically); a sharded folder of the same name
    (from a sharded part of the run) goes."""
    save_atomic(state, path)
    if path.endswith(".pt") and os.path.isdir(path[:-3]):
        shutil.rmtree(path[:-3], ignore_errors=True)


def load(path: str, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint with weights_only=True: pickled code is refused, never run. A sharded
    checkpoint (a folder) gives its meta data, with state["sharded"] the folder (sharded.py)."""
    if os.path.isdir(path):
        return read_meta(path)
    obj = _load_file(path, map_location)
    if "model" not in obj:
        raise CheckpointError(f"checkpoint {path} is not a Headroom checkpoint")
    return obj


def _load_file(path: str, map_location: Any = "cpu") -> dict[str, Any]:
    """torch.load with weights_only=True of a dict with a "step"; one-line errors."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path}: no such file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 5": the error below says it all
            obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        what = f"it refers to {found.group(1)}" if found else "it holds more than tensors and plain data"
        raise CheckpointRefused(f"checkpoint {path} refused: {what}; Headroom loads weights only and never "
                              "runs code from a checkpoint") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path} is damaged or truncated: {first}") from None
    if not isinstance(obj, dict) or "step" not in obj:
        raise CheckpointError(f"checkpoint {path} is not a Headroom checkpoint")
    return obj


def existing(path: str) -> str:
    """`path` (a name.pt file) if it exists, else the sharded folder of that name if that does."""
    if not os.path.exists(path) and path.endswith(".pt") and os.path.isdir(path[:-3]):
        return path[:-3]
    return path


def last_path(run_dir: str) -> str:
    return os.path.join(run_dir, CKPT_DIR, LAST)


def epoch_path(run_dir: str, epoch: int) -> str:
    return os.path.join(run_dir, CKPT_DIR, f"epoch-{epoch}.pt")


def step_path(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, CKPT_DIR, f"step-{step}.pt")


def load_newest(run_dir: str, matches: Optional[Callable[[dict[str, Any]], Optional[str]]] = None,
                map_location: Any = "cpu") -> tuple[Optional[str], Optional[dict[str, Any]], list[str]]:
    """The newest checkpoint of the run that loads and matches: (path, state, skipped), where
    `skipped` says, one line each, why newer files were passed over (damaged or truncated,
    or `matches(state)` returned a reason). (None, None, skipped) if none is usable.
    A checkpoint that holds pickled code raises CheckpointRefused: it is a tampered file,
    not a damaged one, and is never stepped over in silence."""
    skipped: list[str] = []
    for path in candidates(run_dir):
        try:
            state = load(path, map_location)
        except CheckpointRefused:
            raise
        except CheckpointError as e:
            skipped.append(str(e))
            continue
        why = matches(state) if matches is not None else None
        if why:
            skipped.append(f"checkpoint {path} skipped: {why}")
            continue
        return path, state, skipped
    return None, None, skipped


def remove_orphans(run_dir: str, lock: "RunLock") -> list[str]:
    """Remove the temporary files a killed writer left in the checkpoints folder (save_atomic's
    .tmp-*.pt, check_writable_dir's .probe-*). Safe only for the run folder's one writer:
    `lock` must be the held engine.store.runlock.RunLock of `run_dir` (taken just before), so no
    live writer's file is in flight. Returns the names removed."""
    usable = lock is not None and (lock.held or bool(lock.note))  # note: no flock here, best effort
    if not usable or os.path.realpath(lock.run_dir) != os.path.realpath(run_dir):
        raise RuntimeError(f"remove_orphans({run_dir!r}) needs the held writer lock of that folder")
    folder = os.path.join(run_dir, CKPT_DIR)
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        if name.startswith((TMP_PREFIX, PROBE_PREFIX)):
            path = os.path.join(folder, name)
            try:
                if os.path.isdir(path):  # a sharded checkpoint being written (sharded.save)
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
                removed.append(name)
            except OSError:
                pass
    recover(run_dir)
    return removed


def recover(run_dir: str) -> list[str]:
    """The writer at start: an .old-<name>/ whose <name>/ is missing (a crash between the two
    renames of swap_in) goes back; other .old-* folders are removed. Returns what it did."""
    folder = os.path.join(run_dir, CKPT_DIR)
    done = []
    try:
        names = os.listdir(folder)
    except OSError:
        return done
    for n in names:
        if not n.startswith(OLD_PREFIX):
            continue
        target = os.path.join(folder, n[len(OLD_PREFIX):])
        if os.path.exists(target) or os.path.exists(target + ".pt"):
            shutil.rmtree(os.path.join(folder, n), ignore_errors=True)
            done.append(f"removed {n}")
        else:
            os.rename(os.path.join(folder, n), target)
            done.append(f"restored {n[len(OLD_PREFIX):]}")
    return done


def read_meta(folder: str) -> dict[str, Any]:
    """A sharded checkpoint's meta.pt (weights_only), marked with the folder it came from:
    state["sharded"] is the folder, and the weights stay on disk until `load_into`."""
    meta_path = os.path.join(folder, META)
    if not os.path.isfile(meta_path) or not os.path.isfile(os.path.join(folder, ".metadata")):
        raise CheckpointError(f"checkpoint {folder} is not a complete sharded checkpoint (no {META} "
                              "or .metadata)")
    state = _load_file(meta_path)
    state["sharded"] = folder
    return state

