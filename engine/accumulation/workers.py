"""DataLoader workers: the data set as they see it, and what it means when one is gone.

Randomness. A worker draws its augmentation from its own RNG, which PyTorch seeds once
when the worker starts and never again: with persistent workers the stream runs on over
epochs, through prefetched batches a re-aim drops, and a resumed or forked run starts it
afresh. So before each sample is read here, torch's, `random`'s and (if loaded) numpy's
global RNGs are seeded from (run seed, epoch, sample index): a sample's augmentation is a
function of those alone, whatever the number of workers, the prefetching, the split, or
the checkpoint the run continued from. (With 0 workers the samples are read in the
training process, from the RNG every checkpoint saves.) What that costs is kept small: see
SampleSeeds.

Start methods. A task file is loaded under a private module name (engine/tasks/loader.py),
which a worker started with "spawn" or "forkserver" cannot import when it unpickles the data
set. The data set therefore pickles as the task files to load by path first, then itself.

Exits. A worker that dies (the out-of-memory killer's SIGKILL, a library's exit()) shows up in
the training process as whatever broke first: PyTorch's "DataLoader worker ... exited
unexpectedly", or a FileNotFoundError / ConnectionResetError from a batch whose shared memory
the dead worker was still handing over. `exited_worker` looks at the workers themselves.
"""
from __future__ import annotations

import hashlib
import random
import re
import signal
import struct
import sys
import time
from typing import Any, Optional

import torch

from engine.declarations.outcome import TrainingError
from engine.tasks import loader
from engine.tasks.task import TaskError

Key = tuple[int, int]  # (epoch, sample index): what the window sampler hands the workers


class WorkerExited(TrainingError):
    """A DataLoader worker process ended while the run still needed it."""


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed for one sample's draws in one epoch (a hash: no two pairs collide in practice)."""
    digest = hashlib.blake2b(struct.pack("<qqq", seed, epoch, index), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def seed_everything(value: int) -> None:
    """Seed the global RNGs a sample's augmentation draws from. torch's CPU generator is seeded
    directly: torch.manual_seed also seeds every accelerator's generators (and queues that for
    CUDA), 57 of the 80 us this took per sample, for nothing a worker reads (workers draw on the
    CPU); the CPU stream is the same number for number."""
    torch.default_generator.manual_seed(value)
    random.seed(value)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(value % 2**32)


WATCH_FROM = 4  # samples in a micro-batch: below, `random` is seeded anyway (two getstate() cost more)


class SampleSeeds:
    """One worker's seeding of each sample's draws, paying only for the RNGs its data set uses.

    Seeding `random` before a sample costs ~9 us (its seed runs Mersenne Twister's init_by_array),
    torch's CPU generator ~2 us, numpy's ~4 us: on a sample that loads in half a millisecond the
    three were most of the worker's own CPU time, and most data sets never draw from `random`.
    So `random` is seeded before each sample only once this worker's data set has been seen to
    draw from it: a micro-batch (of WATCH_FROM samples or more) read without seeding it compares
    `random.getstate()` before and after (one pair a micro-batch); if the state moved, `random` is seeded from then on and the
    micro-batch is read again, seeded. Every sample that draws from an RNG therefore draws from the
    state seeded for it, as if all three were seeded before every sample: the same bits, whatever
    the worker's past. (A cheap check of numpy's state does not exist: get_state copies it, ~100 us.)
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.random_used = False  # this worker's data set drew from `random`: seed it before each sample

    def read(self, dataset: Any, keys: list[Key]) -> list[Any]:
        seed_random = self.random_used or len(keys) < WATCH_FROM
        before = None if seed_random else random.getstate()
        out = [self.read_one(dataset, k, seed_random) for k in keys]
        if before is not None and random.getstate() != before:
            self.random_used = True  # drawn from unseeded: read the micro-batch again, every RNG seeded
            out = [self.read_one(dataset, k, True) for k in keys]
        return out

    def read_one(self, dataset: Any, key: Key, seed_random: bool) -> Any:
        epoch, i = key
        value = sample_seed(self.seed, epoch, i)
        torch.default_generator.manual_seed(value)
        if seed_random:
            random.seed(value)
        np = sys.modules.get("numpy")
        if np is not None:
            np.random.seed(value % 2**32)
        return dataset[i]


class WorkerData(torch.utils.data.Dataset):
    """The task's data set, read by (epoch, index) keys, each sample's draws seeded first."""

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset, self.seed = dataset, seed
        self._seeds = SampleSeeds(seed)  # each worker process has its own copy

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Key) -> Any:
        return self._seeds.read(self.dataset, [key])[0]

    def __getitems__(self, keys: list[Key]) -> list[Any]:
        """A micro-batch: a data set with its own batched read (Hugging Face datasets) is read
        once, seeded from the micro-batch's first sample; else sample by sample (SampleSeeds)."""
        batched = getattr(self.dataset, "__getitems__", None)
        if batched is None:
            return self._seeds.read(self.dataset, keys)
        seed_everything(sample_seed(self.seed, keys[0][0], keys[0][1]))
        return batched([i for _, i in keys])

    def __getattr__(self, name: str) -> Any:  # get_worker_info().dataset.<attr> still finds the task's
        if name.startswith("__") or name in ("dataset", "seed", "_seeds"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __reduce__(self) -> Any:
        """Spawn / forkserver: the task files first (by path), then the data set itself."""
        from multiprocessing.reduction import ForkingPickler  # torch's shared-memory reductions apply
        payload = bytes(ForkingPickler.dumps((self.dataset, self.seed)))
        needed = {name: path for name, path in loader.TASK_FILES.items() if name.encode() in payload}
        return _rebuild, (needed, payload)


def _rebuild(task_files: dict[str, str], payload: bytes) -> WorkerData:
    for name, path in task_files.items():
        if name not in sys.modules:
            try:
                loader.import_task_file(path, name)
            except TaskError:  # then unpickling says which name it could not find
                pass
    import pickle
    dataset, seed = pickle.loads(payload)
    return WorkerData(dataset, seed)


def worker_started(worker_id: int, bind_kernel: bool = False) -> None:
    """worker_init_fn: the worker ends with the training process (bound_to_parent), and its
    file-descriptor server (the thread that hands the training process a batch's shared memory)
    stays quiet when the training process stops reading mid-handover (it is ending the run, and
    says why): no stray traceback on the console."""
    import threading
    bound_to_parent(bind_kernel)
    previous = threading.excepthook

    def hook(args: Any) -> None:
        name = getattr(args.thread, "name", "") or ""
        if name.endswith("(_serve)") and issubclass(args.exc_type, OSError):
            return
        previous(args)
    threading.excepthook = hook


PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_CHECK_SECONDS = 0.5


def bound_to_parent(bind_kernel: bool) -> None:
    """A worker lives no longer than the process that started it, however that process ends:
    an exit, an uncaught error, a second Ctrl-C (os._exit, which runs no clean-up), SIGKILL. The
    DataLoader's own check of its parent runs only between batches, so a worker hung in a
    sample's read (a network read, a lock, signals ignored) outlived the engine. Here a thread
    of the worker's own kills it once its parent is gone (its parent pid changes), and on Linux
    the kernel does it at once (PR_SET_PDEATHSIG, SIGKILL), even while the worker holds the GIL
    in C code. The kernel's is asked for only when `bind_kernel` (the worker was started from
    the parent's main thread): it fires when the *thread* that started the worker ends, and a
    run trained in another thread (the app's) may end that thread and go on."""
    import os
    import threading
    parent = os.getppid()
    if bind_kernel and sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no prctl in this libc: the thread below still ends it
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os.kill(os.getpid(), signal.SIGKILL)  # not an exit: a hung main thread would hold that up
    if os.getppid() != parent:  # gone before the kernel was asked
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, name="headroom-parent-watch", daemon=True).start()


# -- a worker that is gone ----------------------------------------------------------------------
_TORCH_EXIT = re.compile(r"DataLoader worker \(pids?(?:\(s\))? ([\d, ]+)\)")
_MASKS = (OSError, EOFError, RuntimeError)  # what a dead worker's last batch surfaces as


def exited_worker(dl: Optional[torch.utils.data.DataLoader], error: BaseException, step: int,
                  wait: float = 0.0) -> Optional[WorkerExited]:
    """The WorkerExited that explains `error`, if a worker of `dl` is gone; else None. A
    worker that died may still be exiting when its half-delivered batch fails: for an error
    of the kinds that can mask an exit, wait up to `wait` seconds for it to show."""
    it = getattr(dl, "_iterator", None) if dl is not None else None
    procs = list(getattr(it, "_workers", None) or [])
    if not procs or "Original Traceback" in str(error):  # a worker's own exception: not an exit
        return None
    masks = isinstance(error, _MASKS) and not isinstance(error, TrainingError)  # ours say what they are
    deadline = time.monotonic() + (wait if masks else 0.0)
    found: Optional[tuple[int, int]] = None
    while found is None:
        try:
            found = next(((wid, p.exitcode) for wid, p in enumerate(procs) if p.exitcode is not None), None)
            if found is None:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
        except RuntimeError:  # PyTorch's SIGCHLD handler, raised here as the worker exits: look again
            if time.monotonic() >= deadline + 1.0:
                break
    if found is not None:
        _let_signal_handlers_run()  # its SIGCHLD handler's error lands here, not in the failure's report
        wid, code = found
        return WorkerExited(f"DataLoader worker {wid} exited unexpectedly ({exit_reason(code)}) "
                            f"at step {step}{_hint(code)}")
    m = _TORCH_EXIT.search(str(error))  # PyTorch saw it go but it was reaped: name it by pid
    if m is None:
        return None
    pids = [p.strip() for p in m.group(1).split(",") if p.strip()]
    named = [f"{wid}" for wid, proc in enumerate(procs) if str(proc.pid) in pids] or [f"(pid {', '.join(pids)})"]
    what = "killed by a signal" if "signal" in str(error) else "exit code unknown"
    return WorkerExited(f"DataLoader worker {', '.join(named)} exited unexpectedly ({what}) at step {step}")


def _let_signal_handlers_run() -> None:
    """PyTorch raises "DataLoader worker ... exited unexpectedly" from its SIGCHLD handler, in
    whatever the main thread runs next: give it a moment here, where it is expected."""
    for _ in range(3):
        try:
            time.sleep(0.01)
        except RuntimeError:
            pass


def exit_reason(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by signal {name}"
    return f"exit code {code}"


def _hint(code: int) -> str:
    if code == -signal.SIGKILL:
        return "; SIGKILL is what the out-of-memory killer sends: fewer --workers or a smaller data set in memory"
    return "; --workers 0 reads the data in the training process, where any error shows in full"
