"""Memory the torchrun set-up adds to a model: the engine's (rank 0's model shared, the
gradient sum's buckets) against a DistributedDataParallel wrap of the same model, side by
side in one process.

    PYTHONPATH=. python bench/torchrun_memory.py [--layers 16] [--width 1024] [--device cpu|cuda]

It launches itself under torchrun (two processes, gloo on CPU, NCCL on CUDA with two GPUs).
Each rank builds the model, then measures, in this order: (1) the engine's set-up,
`engine.distributed.share_rank0_model` plus `GradSync.prepare()` (its bucket buffers and the
zero gradients it gives parameters no micro-batch reached), then the gradients one backward
makes; (2) `DistributedDataParallel(model)` on a second copy of the model, then its backward.
"Added" is what each holds beyond the model and its gradients: on CUDA
torch.cuda.memory_allocated, on CPU the resident set (statm), after a gc. Prints both and the
ratio engine / DDP (lower is better).
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402 - after the sys.path set-up above

from bench.grad_sum import GradSync  # noqa: E402 (the engine's gradient sum until issue 20)
from engine import distributed  # noqa: E402 - after the sys.path set-up above


def held(device: torch.device) -> int:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def backward(model: torch.nn.Module, width: int, device: torch.device) -> None:
    x = torch.randn(4, width, device=device)
    model(x).square().mean().backward()


def rank_main(args: argparse.Namespace) -> None:
    ctx = distributed.from_env()
    device = torch.device(f"cuda:{ctx.local_rank}" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    distributed.init(ctx, device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]).to(device)
    twin = copy.deepcopy(model)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    before = held(device)
    distributed.share_rank0_model(model, ctx, device)
    sync = GradSync([p for p in model.parameters()], list(model.buffers()))
    backward(model, args.width, device)
    sync.prepare()
    sync.reduce()
    engine_added = held(device) - before - param_bytes  # minus the gradients every setup has

    before = held(device)
    ddp = torch.nn.parallel.DistributedDataParallel(twin, device_ids=[device.index] if device.type == "cuda" else None)
    backward(ddp, args.width, device)
    ddp_added = held(device) - before - param_bytes

    if ctx.is_main:
        print(json.dumps(dict(device=str(device), machine=platform.processor() or platform.machine(),
                              torch=torch.__version__, world=ctx.world, param_mib=round(param_bytes / 2**20, 1),
                              engine_added_mib=round(engine_added / 2**20, 1),
                              ddp_added_mib=round(ddp_added / 2**20, 1),
                              ratio=round(max(engine_added, 0) / max(ddp_added, 1), 3))))
    distributed.shutdown(ctx)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = p.parse_args()
    if "RANK" in os.environ:
        rank_main(args)
        return
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.abspath(__file__)] + sys.argv[1:]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(subprocess.run(cmd, env=env).returncode)


if __name__ == "__main__":
    main()
