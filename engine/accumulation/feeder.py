"""Micro-batches on their way to the model: the epoch's micro-batches, fetched and collated
by `torch.utils.data.DataLoader` workers ahead of the step that needs them.

The DataLoader's batch sampler yields exactly the epoch's micro-batches of this rank, in
training order, for the rest of the epoch, so workers prefetch the next window while this
one trains. The sample order is the epoch's: the weights after a run do not depend on the
number of workers. When the split changes (an out-of-memory redo, a micro-batch changed at
a step boundary) the sampler is re-aimed from the current window and the workers, kept
alive (`persistent_workers`), start over from there; batches fetched for the old split
are dropped, never trained on.

With 0 workers the batches are fetched in the training thread, as a plain loop would:
no DataLoader machinery on the hot path of a model that loads from memory. How workers
seed each sample's draws, start under "spawn", and fail: workers.py.
"""
from __future__ import annotations

import functools
import os
import signal
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from engine.distributed.devices import to_device

from .workers import WorkerData, exited_worker, worker_started

Split = Callable[[Sequence[int]], list[list[int]]]
AUTO_MAX_WORKERS = 4
AUTO_LOAD_SECONDS = 0.5e-3  # per micro-batch: above this, loading competes with the step


class _WindowSampler:
    """A batch sampler over a list of micro-batches that the feeder replaces as it goes."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.epoch = 1

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch = self.epoch  # each sample's key: its draws are seeded from (seed, epoch, index)
        return iter([[(epoch, i) for i in b] for b in self.batches])

    def __len__(self) -> int:
        return len(self.batches)


class Feeder:
    def __init__(self, dataset: Any, collate: Callable[[list], Any], device: torch.device, workers: int,
                 seed: int, prefetch: int = 2) -> None:
        self.dataset, self.collate, self.device, self.workers = dataset, collate, device, workers
        self._sampler = _WindowSampler()
        self._loader: Optional[torch.utils.data.DataLoader] = None
        if workers > 0:
            # Its own generator: creating an iterator draws a seed from it, and drawing from the
            # global RNG would change the model's dropout masks with the number of workers.
            self._loader = torch.utils.data.DataLoader(
                WorkerData(dataset, seed), batch_sampler=self._sampler, collate_fn=collate, num_workers=workers,
                pin_memory=device.type == "cuda", persistent_workers=True, prefetch_factor=prefetch,
                generator=torch.Generator().manual_seed(seed), worker_init_fn=worker_started)
        self._it: Optional[Iterator[Any]] = None
        self._expected: list[list[int]] = []  # what the iterator will yield next, in order
        self._shares: list[list[int]] = []  # this epoch's windows (this rank's share of each)
        self._split: Optional[Split] = None
        self._fetch_failed = False
        self._gone: Optional[BaseException] = None  # what PyTorch's SIGCHLD handler said, kept for take()
        self._sigchld: Any = None  # the handler that was there before ours (restored by close())

    def begin_epoch(self, shares: list[list[int]], split: Split, epoch: int = 1) -> None:
        """This rank's share of each of the epoch's windows, and how a share splits now."""
        self._shares, self._split = shares, split
        self._sampler.epoch = epoch
        self._it, self._expected = None, []

    def take(self, k: int, micro: list[list[int]]) -> Iterator[Any]:
        """The micro-batches of window k (split as `micro`), on the device, one at a time."""
        if self._loader is None:
            for idx in micro:
                yield self._fetch(idx)
            return
        if self._it is None or self._expected[:len(micro)] != micro:
            self._aim(k, micro)
        for _ in micro:
            self._expected.pop(0)
            assert self._it is not None
            try:
                if self._gone is not None:  # a worker exited (its SIGCHLD came while the step ran)
                    raise self._gone
                batch = next(self._it)
            except Exception:
                self._fetch_failed = True  # a dead worker's batch fails here: explain() waits for its exit
                raise
            yield to_device(batch, self.device)

    def _aim(self, k: int, micro: list[list[int]]) -> None:
        """Point the workers at window k (split as `micro`) and the windows after it."""
        assert self._loader is not None and self._split is not None
        rest = [mb for share in self._shares[k + 1:] for mb in self._split(share)]
        self._sampler.batches = list(micro) + rest
        self._expected = list(self._sampler.batches)
        if getattr(self._loader, "_iterator", None) is None:  # the workers start now: bound to this process
            self._loader.worker_init_fn = functools.partial(
                worker_started, bind_kernel=threading.current_thread() is threading.main_thread())
        self._it = iter(self._loader)  # persistent workers: a reset, not a new pool
        self._hold_sigchld()

    def _hold_sigchld(self) -> None:
        """PyTorch's SIGCHLD handler raises "DataLoader worker ... exited unexpectedly" in
        whatever the main thread runs when a worker dies: half-way through a backward, a
        checkpoint's write, or the report of another failure. Ours keeps that error for the
        next batch taken (a worker that dies is then seen there, or by the DataLoader's own
        liveness check while it waits for a batch)."""
        if self._sigchld is not None or threading.current_thread() is not threading.main_thread():
            return
        torch_handler = signal.getsignal(signal.SIGCHLD)
        if not callable(torch_handler):
            return

        def held(signum: int, frame: Any) -> None:
            try:
                torch_handler(signum, frame)
            except RuntimeError as e:
                self._gone = self._gone or e
        signal.signal(signal.SIGCHLD, held)
        self._sigchld = torch_handler

    def explain(self, error: BaseException, step: int) -> BaseException:
        """What ended the run: a worker that exited, if one did (whatever `error` surfaced as
        in this process), else `error` itself. Call before close()."""
        if self._loader is None or isinstance(error, (KeyboardInterrupt, SystemExit)):
            return error
        wait = 3.0 if self._fetch_failed or "DataLoader worker" in str(error) else 0.0
        exited = exited_worker(self._loader, error, step, wait)
        if exited is None:
            return error
        exited.__cause__ = error  # run_failed's traceback shows what it surfaced as, too
        return exited

    def _fetch(self, indices: list[int]) -> Any:
        data = self.dataset
        return to_device(self.collate([data[j] for j in indices]), self.device)

    def close(self) -> None:
        """Stop the workers (they are daemons, but a run that ends should not leave them)."""
        self._it = None
        if self._sigchld is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGCHLD, self._sigchld)
            self._sigchld = None
        if self._loader is not None:
            it = getattr(self._loader, "_iterator", None)
            if it is not None and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()  # noqa: SLF001 - the documented way to end persistent workers early
            self._loader._iterator = None  # noqa: SLF001 - the loader then starts a new iterator
            self._loader = None


def auto_workers(dataset: Any, micro_batch: int, cpus: Optional[int] = None) -> int:
    """Workers for `--workers auto`: none for data that loads from memory, else up to 4
    (leaving a core to the training thread) when a micro-batch takes over 0.5 ms to load."""
    n = min(len(dataset), 8)
    t0 = time.perf_counter()
    for i in range(n):
        dataset[i]
    per_sample = (time.perf_counter() - t0) / max(n, 1)
    if per_sample * micro_batch <= AUTO_LOAD_SECONDS:
        return 0
    cpus = cpus or os.cpu_count() or 1
    return max(1, min(AUTO_MAX_WORKERS, cpus - 1))
