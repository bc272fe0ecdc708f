"""A sharded checkpoint's files read as input: nothing in them is ever run.

torch.distributed.checkpoint reads a folder's `.metadata` with plain pickle.load and the
non-tensor values of a state (the optimizer's lr, betas, ...) with torch.load(weights_only=False):
a crafted folder would run code on --resume, --fork and headroom-export. Every read of a
sharded folder goes through `Reader` and `Planner` here instead: `.metadata` is unpickled
with only DCP's own metadata classes allowed, the values with weights_only=True. `check`
reads the metadata and checks that every shard file it names is a regular file inside the
folder, large enough for what it holds: a damaged folder is refused (one line naming the
file) before anything is loaded or written.
"""
from __future__ import annotations

import io
import os
import pickle
import re
import stat
import warnings
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from engine.declarations.outcome import first_line

from .errors import CheckpointError, CheckpointRefused

METADATA = ".metadata"

# The classes a .metadata written by torch.distributed.checkpoint holds; nothing else is built.
_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "MetadataIndex", "TensorStorageMetadata",
                                              "BytesStorageMetadata", "ChunkStorageMetadata",
                                              "TensorProperties", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint.planner": {"LoadItemType", "WriteItemType"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.memory_format)):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}")


def _refused(path: str, e: pickle.UnpicklingError) -> CheckpointRefused:
    found = re.search(r"GLOBAL ([\w.]+)", str(e))  # ours and torch's weights-only message alike
    what = f"it refers to {found.group(1)}" if found else "it holds more than tensors and plain data"
    return CheckpointRefused(f"checkpoint {path} refused: {what}; Headroom loads weights only and never runs "
                             "code from a checkpoint")


def read_metadata(folder: str) -> Metadata:
    """The folder's .metadata, unpickled with DCP's metadata classes only."""
    path = os.path.join(folder, METADATA)
    try:
        with open(path, "rb") as f:
            meta = _MetadataUnpickler(f).load()
    except pickle.UnpicklingError as e:
        if "Unsupported global" in str(e):
            raise _refused(path, e) from None
        raise CheckpointError(f"checkpoint {path} is damaged or truncated: {e}") from None
    except OSError as e:
        raise CheckpointError(f"checkpoint {path}: cannot be read ({e.strerror or e})") from None
    except Exception as e:  # a cut file: EOFError, or a half-built object (TypeError, ...)
        raise CheckpointError(f"checkpoint {path} is damaged or truncated ({type(e).__name__})") from None
    if not isinstance(meta, Metadata) or not isinstance(meta.state_dict_metadata, dict) \
            or not isinstance(meta.storage_data, dict):
        raise CheckpointError(f"checkpoint {path} is not a sharded checkpoint's metadata")
    return meta


def check(folder: str) -> Metadata:
    """The folder's metadata, once every shard file it names is there: a plain name in the
    folder (never a path out of it), a regular file, as long as the data it holds."""
    meta = read_metadata(folder)
    ends: dict[str, int] = {}
    for info in meta.storage_data.values():
        name = getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if (not isinstance(name, str) or not name or os.sep in name or "/" in name or name in (".", "..")
                or not isinstance(offset, int) or not isinstance(length, int) or offset < 0 or length < 0):
            raise CheckpointError(f"checkpoint {os.path.join(folder, METADATA)} is damaged: it names a shard "
                                  f"{name!r} that is not a file of the folder")
        ends[name] = max(ends.get(name, 0), offset + length)
    for name, end in sorted(ends.items()):
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
        except OSError:
            raise CheckpointError(f"checkpoint {folder} is incomplete: its shard {path} is missing") from None
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"checkpoint {folder}: its shard {path} is not a regular file")
        if st.st_size < end:
            raise CheckpointError(f"checkpoint {folder} is damaged: its shard {path} is cut short "
                                  f"({st.st_size} of {end} bytes)")
    return meta


class Reader(FileSystemReader):
    """FileSystemReader whose metadata is read by `check` (restricted unpickling)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        meta = check(str(self.path))
        storage = meta.storage_meta if isinstance(meta.storage_meta, StorageMeta) else StorageMeta()
        storage.load_id = self.load_id  # as FileSystemReader.read_metadata does
        meta.storage_meta = storage
        return meta


def _load_value(value: io.BytesIO, folder: str) -> Any:
    """A non-tensor value of the state (torch.load with weights_only=True)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(value, weights_only=True)
    except pickle.UnpicklingError as e:
        raise _refused(folder, e) from None


def _put(planner: DefaultLoadPlanner, folder: str, read_item: ReadItem, value: io.BytesIO) -> None:
    """DefaultLoadPlanner.load_bytes, the value read weights-only (DCP's own uses weights_only=False)."""
    obj = _load_value(value, folder)
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[read_item.dest_index.fqn], obj)
    else:
        planner.state_dict[read_item.dest_index.fqn] = obj


class Planner(DefaultLoadPlanner):
    """DCP's load planner, its non-tensor values read weights-only."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = folder

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _put(self, self.folder, read_item, value)


class WholePlanner(_EmptyStateDictLoadPlanner):
    """The planner that rebuilds the whole state from the metadata (export), values weights-only."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = folder

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _put(self, self.folder, read_item, value)


def as_error(folder: str, failure: BaseException) -> CheckpointError:
    """One line for a failed DCP load of `folder`: the CheckpointError under it (DCP wraps each
    rank's failure), else the first rank's error, said as a damaged checkpoint."""
    found = [exc for exc, _ in getattr(failure, "failures", {}).values()]
    for exc in found:
        if isinstance(exc, CheckpointError):
            return exc
    cause = found[0] if found else failure
    return CheckpointError(f"checkpoint {folder} is damaged: {type(cause).__name__}: {first_line(cause)}")
