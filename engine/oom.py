"""Recognising and clearing out-of-memory errors, on any device."""
from __future__ import annotations

import gc

import torch

_OOM_MESSAGES = ("out of memory", "cuda error: out of memory", "cudnn_status_alloc_failed",
                 "cublas_status_alloc_failed", "failed to allocate memory", "can't allocate memory",
                 "defaultcpuallocator: not enough memory")


def is_oom(e: BaseException) -> bool:
    """By type (torch.OutOfMemoryError) and by message, as Lightning and Accelerate do."""
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
