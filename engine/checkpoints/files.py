"""Checkpoints: written atomically (temporary file, fsync, rename), read with weights_only=True.

A checkpoint is a file, checkpoints/<name>.pt, or for a sharded run (--strategy fsdp) a
torch.distributed.checkpoint folder, checkpoints/<name>/ (sharded.py); a name is one or the
other, never both (writing one removes the other). Every one is put in place by `swap_in`, the
one atomic replace. What is read back is input: `load` refuses values no run can hold
(contents.py), naming the file and the field."""
from __future__ import annotations

import errno
import io
import os
import pickle
import re
import shutil
import stat
import tempfile
import warnings
import zipfile
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

# What a run folder holds, by name (torch-free, shared with the app): re-exported from here.
from engine.declarations.checkpoint_names import CKPT_DIR, LAST, candidates, name_of  # noqa: F401 - re-exported: the engine reads the names from here
from engine.declarations.outcome import first_line

from . import contents, retention
from .errors import CheckpointError, CheckpointInvalid, CheckpointRefused  # raised here; callers name them files.*

if TYPE_CHECKING:
    from engine.store.runlock import RunLock

TMP_PREFIX = ".tmp-"  # save_atomic's temporary files (and sharded.save's temporary folders)
OLD_PREFIX = ".old-"  # sharded.swap_in: the folder being replaced, for a moment
META = "meta.pt"  # a sharded checkpoint's state besides model and optimizer
PROBE_PREFIX = ".probe-"  # check_writable_dir's probe files


# A write that failed because the disk (or the quota, or the file-size limit) is full.
DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def fsync_dir(folder: str) -> None:
    """Make the renames in `folder` durable (best effort: some file systems cannot)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def swap_in(tmp: str, path: str) -> None:
    """Put the finished `tmp` (a file, or a sharded checkpoint's folder) at `path`, replacing
    what was there, durably: the one atomic replace every checkpoint goes through. A file is
    renamed over the old one. A folder cannot be, so the old folder is moved aside to
    .old-<name> first and removed after (`recover` puts it back if a crash comes between)."""
    parent, name = os.path.split(path.rstrip(os.sep))
    old = None
    if os.path.isdir(path) and not os.path.isdir(tmp):  # a file never replaces a folder
        raise CheckpointError(f"{path}: exists and is a folder; only a regular file is replaced")
    if os.path.isdir(path):
        old = os.path.join(parent, OLD_PREFIX + name)
        shutil.rmtree(old, ignore_errors=True)
        os.rename(path, old)
    os.replace(tmp, path)
    fsync_dir(parent or ".")
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_error(e: BaseException) -> Optional[OSError]:
    """The OSError under a failed torch.save (which reports a full disk as "[enforce fail at
    inline_container.cc] unexpected pos"), or None if there is none."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError):
            return e
        e = e.__cause__ or e.__context__  # type: ignore[assignment]  # the chain holds BaseException | None
        seen += 1
    return None


def check_replaceable(path: str) -> None:
    """Refuse (CheckpointError, one line) a file `path` that save_atomic must not replace: a
    name ending in a separator, or anything there that is not a regular file (a folder, a
    symbolic link, a device such as /dev/null, a pipe). Only a regular file is replaced, and
    only by a rename. Changes nothing."""
    if path.endswith((os.sep, "/")) or os.path.basename(path) in ("", ".", ".."):
        raise CheckpointError(f"{path}: not a file name (it names a folder); give the file to write")
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return  # nothing there (or its folder is not one): the write itself says why it fails
    if not stat.S_ISREG(mode):
        what = ("a symbolic link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode)
                else "a device or other special file")
        raise CheckpointError(f"{path}: exists and is {what}; only a regular file is replaced (nothing was written)")


def save_atomic(obj: dict[str, Any], path: str) -> None:
    """torch.save to a temporary file beside `path`, fsync, then `swap_in`.

    A crash or a full disk leaves either the old file or the new one, never half of one. A
    write that fails raises the OSError itself (errno ENOSPC for a full disk), not torch's
    RuntimeError around it. Only a regular file (or nothing) at `path` is replaced:
    check_replaceable, before anything is written.
    """
    check_replaceable(path)
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".pt", dir=folder)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # as open() would, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            try:
                torch.save(obj, f)
                f.flush()
            except RuntimeError as e:
                cause = write_error(e)
                if cause is None:
                    raise
                raise cause from None
            os.fsync(f.fileno())
        swap_in(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def save_checkpoint(state: dict[str, Any], path: str) -> None:
    """A single-file checkpoint at `path` (atomically); a sharded folder of the same name
    (from a sharded part of the run) goes."""
    save_atomic(state, path)
    if path.endswith(".pt") and os.path.isdir(path[:-3]):
        shutil.rmtree(path[:-3], ignore_errors=True)


def load(path: str, map_location: Any = "cpu", mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint with weights_only=True: pickled code is refused, never run; values no
    run can hold are refused too (CheckpointInvalid, contents.py). A sharded checkpoint (a
    folder) gives its meta data, with state["sharded"] the folder (sharded.py). mmap: the
    tensors stay on disk until used (a check that reads the file back costs no memory)."""
    if os.path.isdir(path):
        return read_meta(path)
    obj = _load_file(path, map_location, mmap)
    if "model" not in obj:
        raise CheckpointError(f"checkpoint {path} is not a Headroom checkpoint")
    return obj


def _load_file(path: str, map_location: Any = "cpu", mmap: bool = False) -> dict[str, Any]:
    """torch.load with weights_only=True of a dict with a "step", its values in range;
    one-line errors."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path}: no such file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 5": the error below says it all
            obj = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        what = f"it refers to {found.group(1)}" if found else "it holds more than tensors and plain data"
        raise CheckpointRefused(f"checkpoint {path} refused: {what}; Headroom loads weights only and never "
                              "runs code from a checkpoint") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} is damaged or truncated: {first_line(e)}") from None
    if not isinstance(obj, dict) or "step" not in obj:
        raise CheckpointError(f"checkpoint {path} is not a Headroom checkpoint")
    why = contents.problem(obj)
    if why:
        raise CheckpointInvalid(f"checkpoint {path} refused: {why} (a damaged or edited file; it is left as it is)")
    return obj


def round_trip_problem(state: dict[str, Any]) -> Optional[str]:
    """Why a checkpoint holding `state` would be refused when read back (torch.load with
    weights_only=True, as `load` reads it), or None. The plain tensors are written empty: what
    this checks is everything else (a model's get_extra_state, the optimizer's and the
    scheduler's own values), in memory, before a run writes a checkpoint it could never load."""
    buf = io.BytesIO()
    try:
        torch.save(_skeleton(state), buf)
    except Exception as e:
        return f"it cannot be saved ({type(e).__name__}: {str(e)[:200]})"
    buf.seek(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.load(buf, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        if not found:
            return "it holds more than tensors and plain data"
        where = _where(state, found.group(1))
        return f"{where + ' is' if where else 'it holds'} an object of class {found.group(1)}"
    except Exception as e:
        return f"it cannot be read back ({type(e).__name__}: {str(e)[:200]})"
    return None


def _skeleton(obj: Any, depth: int = 0) -> Any:
    """`obj` with every plain tensor replaced by an empty one of its dtype (subclasses kept)."""
    if type(obj) in (torch.Tensor, torch.nn.Parameter):
        return torch.empty(0, dtype=obj.dtype)
    if depth > 32:
        return obj
    if type(obj) in (dict, OrderedDict):  # other mappings are the task's own classes: kept, and checked
        return type(obj)((k, _skeleton(v, depth + 1)) for k, v in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(_skeleton(v, depth + 1) for v in obj)
    return obj


def _where(obj: Any, qualname: str, path: str = "", depth: int = 0) -> str:
    """The key path (model['0._extra_state']) of the first object of class `qualname` in obj."""
    cls = type(obj)
    if f"{cls.__module__}.{cls.__qualname__}" == qualname:
        return path or "the checkpoint"
    if depth > 8:
        return ""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for k, v in items:
        found = _where(v, qualname, f"{path}[{k!r}]" if path else str(k), depth + 1)
        if found:
            return found
    return ""


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


def step_of(path: str) -> Optional[int]:
    """The step a checkpoint (file or sharded folder) was written at, or None if it does not load."""
    try:
        state = load(path, mmap=not os.path.isdir(path))
    except CheckpointError:
        return None
    step = state.get("step")
    return step if isinstance(step, int) else None


def newest_first(paths: list[str], notes: list[str]) -> list[str]:
    """`paths` (candidates' order) with the two checkpoints of one name (name.pt and name/: a
    crash between writing one and removing the other, files.save_checkpoint / sharded.swap_in)
    put newer first, by the step inside; `notes` gets a line saying so. Any other order is kept."""
    out = list(paths)
    for i, path in enumerate(out):
        twin = next((j for j in range(i + 1, len(out)) if name_of(out[j]) == name_of(path)), None)
        if twin is None:
            continue
        a, b = step_of(path), step_of(out[twin])
        if a is None or b is None:
            continue  # one does not load: the usual skip says why
        if b > a:
            out[i], out[twin] = out[twin], out[i]
        newer, older = out[i], out[twin]
        notes.append(f"checkpoints {newer} (step {max(a, b)}) and {older} (step {min(a, b)}) are both there (a "
                     "crash between writing one and removing the other): the newer one is used")
    return out


def load_newest(run_dir: str, matches: Optional[Callable[[dict[str, Any]], Optional[str]]] = None,
                map_location: Any = "cpu") -> tuple[Optional[str], Optional[dict[str, Any]], list[str]]:
    """The newest checkpoint of the run that loads and matches: (path, state, skipped), where
    `skipped` says, one line each, why newer files were passed over (damaged or truncated,
    or `matches(state)` returned a reason), and which of two checkpoints of one name was taken
    (newest_first). (None, None, skipped) if none is usable.
    A checkpoint that holds pickled code raises CheckpointRefused: it is a tampered file,
    not a damaged one, and is never stepped over in silence."""
    skipped: list[str] = []
    for path in newest_first(candidates(run_dir), skipped):
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
            if retention.remove([os.path.join(folder, name)]):  # a file, or a sharded checkpoint being written
                removed.append(name)
    recover(run_dir)
    return removed


def recover(run_dir: str) -> list[str]:
    """The writer at start: an .old-<name>/ whose <name>/ is missing (a crash between the two
    renames of swap_in) goes back; other .old-* folders are removed. Returns what it did."""
    folder = os.path.join(run_dir, CKPT_DIR)
    done: list[str] = []
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
    state["sharded"] is the folder, and the weights stay on disk until `load_into`. Its
    .metadata and shards are checked here (dcp_input.check): a cut or crafted folder is
    refused as a damaged file is, before anything is loaded or written."""
    meta_path = os.path.join(folder, META)
    if not os.path.isfile(meta_path) or not os.path.isfile(os.path.join(folder, ".metadata")):
        raise CheckpointError(f"checkpoint {folder} is not a complete sharded checkpoint (no {META} "
                              "or .metadata)")
    from . import dcp_input  # torch.distributed.checkpoint: only for a sharded run's folder
    state = _load_file(meta_path)
    dcp_input.check(folder)  # .metadata read as input, every shard it names there: refused before any use
    state["sharded"] = folder
    return state

