"""Launching the engine under torchrun on CPU (gloo) for the tests, and the one-process reference."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from engine.declarations.config import TrainConfig
from engine.trainer.trainer import Trainer
from testkit import ROOT
from tests.ddp import varlen_task


def torchrun(n: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n)]


TORCHRUN = torchrun(2)


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("HEADROOM_TEST_")}
    e.update(extra)
    e["PYTHONPATH"] = ROOT
    e["OMP_NUM_THREADS"] = "1"
    return e


def torchrun_worker(out, timeout=180, extra_env=None, nproc=2, **opts):
    """tests/ddp/worker.py on `nproc` ranks: each rank's log and its whole weights at the end."""
    args = torchrun(nproc) + [os.path.join(ROOT, "tests", "ddp", "worker.py"), str(out)]
    args += [f"{k}={v}" for k, v in opts.items()]
    # A hung rank dumps its threads' stacks and exits 30 s before the timeout: the failure says where.
    dump = {"HEADROOM_TEST_HANG_DUMP": str(max(10, timeout - 30))}
    r = subprocess.run(args, cwd=ROOT, env=env(**dump, **(extra_env or {})), capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-6000:]
    logs = [json.load(open(out / f"log-{rank}.json")) for rank in range(nproc)]
    weights = [torch.load(out / f"weights-{rank}.pt", weights_only=True) for rank in range(nproc)]
    return logs, weights


def single_process(run_dir, micro=8, accum=1, epochs=1, samples=64, momentum=False, clip=0.0, **extra):
    """The reference: one process, no torchrun, on the same data."""
    old = {k: os.environ.get(k) for k in ("HEADROOM_TEST_SAMPLES", "HEADROOM_TEST_MOMENTUM")}
    os.environ["HEADROOM_TEST_SAMPLES"] = str(samples)
    if momentum:
        os.environ["HEADROOM_TEST_MOMENTUM"] = "1"
    try:
        cfg = TrainConfig(task="varlen", micro_batch=micro, accum=accum, epochs=epochs, lr=0.05, clip=clip,
                          device="cpu", seed=3, run_dir=str(run_dir), **extra)
        t = Trainer(cfg, task=varlen_task.build_task(cfg.seed))
        t.run()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {k: v.detach() for k, v in t.model.state_dict().items()}


def max_diff(a, b):
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)
