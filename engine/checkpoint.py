"""Checkpoints: written atomically (temporary file, fsync, rename), read with weights_only=True."""
from __future__ import annotations

import os
import pickle
import re
import tempfile
import warnings
import zipfile
from typing import Any

import torch

from .config import ConfigError

CKPT_DIR = "checkpoints"
LAST = "last.pt"


class CheckpointError(ConfigError):
    pass


def save_atomic(obj: dict[str, Any], path: str) -> None:
    """torch.save to a temporary file beside `path`, fsync, then rename over it.

    A crash or a full disk leaves either the old file or the new one, never half of one.
    """
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=folder)
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


def load(path: str, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint with weights_only=True: pickled code is refused, never run."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path}: no such file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 5": the error below says it all
            obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        what = f"it refers to {found.group(1)}" if found else "it holds more than tensors and plain data"
        raise CheckpointError(f"checkpoint {path} refused: {what}; Headroom loads weights only and never "
                              "runs code from a checkpoint") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path} is damaged or truncated: {first}") from None
    if not isinstance(obj, dict) or "model" not in obj or "step" not in obj:
        raise CheckpointError(f"checkpoint {path} is not a Headroom checkpoint")
    return obj


def last_path(run_dir: str) -> str:
    return os.path.join(run_dir, CKPT_DIR, LAST)


def epoch_path(run_dir: str, epoch: int) -> str:
    return os.path.join(run_dir, CKPT_DIR, f"epoch-{epoch}.pt")
