"""Run by the DDP tests under torchrun: trains tests/ddp/varlen_task.py with the engine and
writes what each rank saw to OUT_DIR (weights, steps, all-reduce counts).

usage: python -m torch.distributed.run --nproc-per-node 2 tests/ddp/worker.py OUT_DIR [key=value ...]
"""
from __future__ import annotations

import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import engine.distributed as D  # noqa: E402
from engine.declarations.config import TrainConfig  # noqa: E402
from engine.loop.trainer import Trainer  # noqa: E402
from tests.ddp import varlen_task  # noqa: E402


def main() -> None:
    out = sys.argv[1]
    opts = dict(a.split("=", 1) for a in sys.argv[2:])
    rank = int(os.environ["RANK"])
    threads_before = os_threads()  # before the process group: gloo's threads must be gone again after the run
    allreduces = {"n": 0, "ddp": 0}
    if opts.get("count_hook") == "1":
        # Count the gradient all-reduces the engine issues (engine/distributed/grad_sync.py), and any
        # DistributedDataParallel wrapper made (its reducer would all-reduce in the backward
        # and hold a second copy of every gradient): there must be none.
        import engine.distributed.grad_sync as GS
        original_init = DistributedDataParallel.__init__
        original_all_reduce = GS.dist.all_reduce

        def init(self, *a, **k):
            allreduces["ddp"] += 1
            original_init(self, *a, **k)

        class CountingDist:
            def __getattr__(self, name):
                return getattr(dist, name)

            def all_reduce(self, *a, **k):
                allreduces["n"] += 1
                return original_all_reduce(*a, **k)

        DistributedDataParallel.__init__ = init
        GS.dist = CountingDist()
    if opts.get("no_buffer_sync") == "1":
        # Negative control: the gradient sum without the buffers' broadcast from rank 0.
        import engine.distributed.grad_sync as GS
        original_prepare = GS.GradSync.prepare

        def prepare(self):
            self.buffers = []
            return original_prepare(self)

        GS.GradSync.prepare = prepare
    if opts.get("no_share") == "1":
        # Negative control: each rank keeps the model it built (no rank 0 values at the start).
        D.share_rank0_model = lambda model, ctx, device: None
    if opts.get("local_count") == "1":
        # Negative control: normalise by each rank's own count, not the all-reduced one.
        D.all_reduce_sum = lambda t, ctx: t
    extra = {}
    if "checkpoint_every" in opts:
        extra["checkpoint_every"] = int(opts["checkpoint_every"])
        extra["keep_checkpoints"] = 100
    if "nonfinite" in opts:
        extra["nonfinite"] = opts["nonfinite"]
    if "fork" in opts:
        extra["fork"] = opts["fork"]
    cfg = TrainConfig(task="tests/ddp/varlen_task.py", micro_batch=int(opts.get("micro", 2)),
                      accum=int(opts.get("accum", 2)), epochs=int(opts.get("epochs", 1)), lr=0.05, clip=0.0,
                      run_dir=os.path.join(out, opts.get("run", "run")), device="cpu", seed=3, **extra)
    trainer = Trainer(cfg, task=varlen_task.build_task(cfg.seed))
    signal.signal(signal.SIGTERM, lambda *_: trainer.request_stop())
    log = []
    original_step = trainer.step_window

    calls = {"n": 0}

    def step(window):
        calls["n"] += 1  # nan_by_call=1: NaN by the window's place in the data, not the step counter
        varlen_task._window[0] = calls["n"] if opts.get("nan_by_call") == "1" else trainer.step + 1
        skipped_before = trainer.nonfinite_steps
        trained = original_step(window)  # on CPU a step's numbers are resolved at once
        log.append(dict(step=trainer.step, epoch=trainer.epoch, micro=trainer.settings.micro_batch,
                        accum=trainer.settings.accum, lr=trainer.settings.lr, allreduces=allreduces["n"],
                        ddp_wrappers=allreduces["ddp"],
                        nonfinite=trainer.nonfinite_steps > skipped_before if trained else None,
                        wsum=float(sum(p.detach().double().sum() for p in trainer.model.parameters()))))
        return trained

    trainer.step_window = step
    trainer.run()
    torch.save({k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
               os.path.join(out, f"weights-{rank}.pt"))
    with open(os.path.join(out, f"log-{rank}.json"), "w") as f:
        json.dump(log, f)
    assert not dist.is_initialized()
    # The run released the process group for real (the DDP wrapper holds it): no gloo thread
    # lives on into the interpreter's exit, where one that frees a tensor aborts the process.
    assert os_threads() <= threads_before, f"{os_threads()} OS threads after the run, {threads_before} before"


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


if __name__ == "__main__":
    main()
