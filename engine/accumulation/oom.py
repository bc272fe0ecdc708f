"""Recognising and clearing out-of-memory errors, on any device."""
from __future__ import annotations

import gc
import math

import torch

from engine.declarations.outcome import TrainingError

_OOM_MESSAGES = ("out of memory", "cuda error: out of memory", "cudnn_status_alloc_failed",
                 "cublas_status_alloc_failed", "failed to allocate memory", "can't allocate memory",
                 "defaultcpuallocator: not enough memory")


def is_oom(e: BaseException) -> bool:
    """By type (torch.OutOfMemoryError) and by message, as Lightning and Accelerate do."""
    if isinstance(e, TrainingError):  # our own verdict on one (OutOfMemoryStop): not to be retried
        return False
    if isinstance(e, torch.OutOfMemoryError):
        return True
    if isinstance(e, (RuntimeError, MemoryError)):
        text = str(e).lower()
        return isinstance(e, MemoryError) or any(m in text for m in _OOM_MESSAGES)
    return False


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def smaller_shape(micro_batch: int, accum: int, new_micro: int) -> tuple[int, int]:
    """A smaller micro-batch, with the accumulation that keeps the effective batch."""
    return new_micro, math.ceil(micro_batch * accum / new_micro)


def halved(micro_batch: int, accum: int, recovery: bool) -> tuple[int, int]:
    """The shape to redo a window with after an out-of-memory error; OutOfMemoryStop when
    there is none (recovery off, or already at micro-batch 1)."""
    from engine.declarations.outcome import OutOfMemoryStop
    if not recovery:
        raise OutOfMemoryStop(f"out of memory at micro-batch {micro_batch} (--oom-recovery off); "
                              "try a smaller --micro-batch")
    if micro_batch == 1:
        raise OutOfMemoryStop("out of memory even at micro-batch 1: the model does not fit on this device")
    return smaller_shape(micro_batch, accum, max(1, micro_batch // 2))
