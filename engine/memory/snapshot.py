"""`--memory-snapshot on-oom`: record CUDA allocator history, dump it when memory runs out.

While recording, the CUDA caching allocator keeps the last `max_entries` alloc/free
events with their Python stacks (torch.cuda.memory._record_memory_history). On an
out-of-memory error the recorder writes torch.cuda.memory._dump_snapshot's pickle to

    RUN_DIR/memory/oom-step-S.pickle          (S: the step of the event that links it)

atomically (a temporary file in the same folder, then os.replace), so the app never
links a half-written file. Open it at https://pytorch.org/memory_viz (drag the file in)
or with pickle.load: a dict with "segments" and "device_traces". A second OOM in the
same step (OOM recovery halves the micro-batch and retries) writes oom-step-S-2.pickle;
under torchrun every rank writes its own, oom-step-S-rank-R.pickle. At most `max_files`
snapshots per run: each can be hundreds of MB (several KB per entry).

Cost while recording: about 2 us of host time per allocation (torch's figure for Python
stacks), plus the entries' host memory. That is why it is opt-in.

Uses the torch 2.13 API (torch/cuda/memory.py):
  _record_memory_history(enabled="all" | "state" | None, context="all", stacks="all" | "python",
                         max_entries=sys.maxsize, device=None, clear_history=False, ...)
  _dump_snapshot(filename="dump_snapshot.pickle", augment_with_fx_traces=False)

How the trainer calls it:

    # setup, when config.memory_snapshot == "on-oom" (CPU: a no-op, recorder.reason says why):
    self.snapshots = SnapshotRecorder()
    self.snapshots.start(self.device)
    # in _step's `except BaseException as e:` when is_oom(e), BEFORE dropping the window's
    # gradients and free_memory(): the frames of the exception still hold the tensors, so the
    # snapshot shows what filled the memory:
    path = self.snapshots.on_oom(self.run_dir, self.step, rank=self.ctx.rank if self.ctx.enabled else None)
    # (self.step: the same step number the OomRecovered event carries)
    # then emit an event carrying {"memory_snapshot": path} (with OomRecovered, or before
    # OutOfMemoryStop when recovery is off), which the app links.
    # finish / failure:
    self.snapshots.stop()
"""
from __future__ import annotations

import os
from typing import Callable, Optional

import torch

Dump = Callable[[str], None]


class SnapshotRecorder:
    def __init__(self, max_files: int = 5) -> None:
        self.active = False
        self.reason = "not started"
        self.max_files = max_files
        self.written: list[str] = []
        self.dump: Optional[Dump] = None  # how on_oom writes when not told: None = the CUDA allocator's dump

    def start(self, device: torch.device, max_entries: int = 100_000, stacks: str = "python") -> bool:
        """Start recording allocator history on CUDA. False (and self.reason) on CPU or when
        this torch build cannot record. stacks="python" keeps entries small; "all" adds C++ frames."""
        device = torch.device(device)
        if device.type != "cuda":
            self.reason = f"memory snapshots record CUDA allocations only (device {device})"
            return False
        if not torch.cuda.is_available():
            self.reason = "memory snapshots: CUDA is not available"
            return False
        try:
            torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks=stacks,
                                                     max_entries=int(max_entries))
        except Exception as e:  # noqa: BLE001 - a build without the recorder must not stop training
            self.reason = f"memory snapshots: recording failed to start: {type(e).__name__}: {e}"
            return False
        self.active = True
        self.reason = ""
        return True

    def stop(self) -> None:
        if self.active:
            try:
                torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:  # noqa: BLE001 - stopping the history is best effort: never fails the run
                pass
            self.active = False
            self.reason = "stopped"

    def path_for(self, run_dir: str, step: int, rank: Optional[int] = None) -> str:
        base = f"oom-step-{int(step)}" + ("" if rank is None else f"-rank-{int(rank)}")
        folder = os.path.join(run_dir, "memory")
        path = os.path.join(folder, base + ".pickle")
        n = 2
        while os.path.exists(path) or path in self.written:
            path = os.path.join(folder, f"{base}-{n}.pickle")
            n += 1
        return path

    def on_oom(self, run_dir: str, step: int, dump: Optional[Dump] = None,
               rank: Optional[int] = None) -> Optional[str]:
        """Write the snapshot for an out-of-memory error at `step`; its path, or None (self.reason).

        `dump(path)` writes the snapshot to `path`; by default torch.cuda.memory._dump_snapshot,
        which needs start() to have succeeded. Never raises: a snapshot that cannot be written
        must not turn a recoverable OOM into a crash."""
        dump = dump or self.dump
        if dump is None:
            if not self.active:
                return None
            dump = _cuda_dump
        if len(self.written) >= self.max_files:
            self.reason = f"memory snapshots: {self.max_files} written already this run; no more"
            return None
        path = self.path_for(run_dir, step, rank)
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            dump(tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except Exception as e:  # noqa: BLE001 - a snapshot not written is said (reason), never fails the run
            self.reason = f"memory snapshot not written: {type(e).__name__}: {e}"
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return None
        self.written.append(path)
        return path


def _cuda_dump(path: str) -> None:
    torch.cuda.memory._dump_snapshot(path)
