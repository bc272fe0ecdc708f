"""Run by the DDP tests under torchrun: trains tests/ddp/varlen_task.py (or config_task.py) with
the engine, once per scenario, and writes what each rank saw to each scenario's folder (weights,
steps, how each micro-batch ran).

usage: python -m torch.distributed.run --nproc-per-node 2 tests/ddp/worker.py SCENARIOS.json

SCENARIOS.json is a list of {"out": folder, "opts": {key: value}, "env": {HEADROOM_TEST_*: value}}
(tests/ddp/harness.py writes it). The scenarios run one after another in the same ranks, each
a whole run with its own process group (started by the engine, torn down at its end): a
torchrun launch costs each rank its torch and engine imports (seconds), a scenario's training
a fraction of that. Each scenario's patches and switches are undone before the next one.
HEADROOM_TEST_HANG_DUMP=S: a rank stuck S seconds in one scenario prints its threads' stacks and
exits. Each rank prints what each scenario took to stderr.

Options: task=varlen|config, strategy=ddp|fsdp, fsdp_reduce=last|every, micro=, accum=, epochs=,
samples= (data set size), momentum=1 (SGD with momentum), clip=C, count_hook=1 (record how each
micro-batch ran), run= (the run folder, under the scenario's folder unless absolute), fork=,
resume=1, max_steps=, checkpoint_every=, nonfinite=, nan_by_call=1, lr=, find_micro_batch=N (with
that effective batch), by_rank={option: [rank 0's, rank 1's, ...]} (JSON: each rank its own value),
refused=1 (the run must be refused on every rank while it is built: each rank writes the message
to its file "refused-R" (R its rank, a .txt) once it checked that the process group and its threads are gone), and the
negative controls local_count=1, no_share=1, no_buffer_sync=1, no_sum_hook=1, local_norm=1 (fsdp).
"""
from __future__ import annotations

import faulthandler
import gc
import json
import os
import signal
import sys
import time
from contextlib import ExitStack
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402 - after the sys.path set-up above
import torch.distributed as dist  # noqa: E402 - after the sys.path set-up above
from torch.distributed import distributed_c10d  # noqa: E402 - after the sys.path set-up above
from torch.nn.parallel import DistributedDataParallel  # noqa: E402 - after the sys.path set-up above

from engine import distributed  # noqa: E402 - after the sys.path set-up above
from engine.declarations.config import ConfigError, TrainConfig  # noqa: E402 - after the sys.path set-up above
from engine.trainer.trainer import Trainer  # noqa: E402 - after the sys.path set-up above
from tests.ddp import config_task, varlen_task  # noqa: E402 - after the sys.path set-up above

TASKS = {"varlen": ("tests/ddp/varlen_task.py", varlen_task), "config": ("tests/ddp/config_task.py", config_task)}
_MISSING = object()


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state on every rank, whole (fsdp: gathered; a collective on every rank)."""
    from torch.distributed.tensor import DTensor
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in model.state_dict().items()}


def patch(undo: ExitStack, owner: Any, name: str, value: Any) -> None:
    """owner.name = value for this scenario only: the next scenario in this process sees the
    original again (an attribute the owner only inherited is deleted, not copied onto it)."""
    old = vars(owner).get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    undo.callback(lambda: delattr(owner, name) if old is _MISSING else setattr(owner, name, old))


def set_env(undo: ExitStack, values: dict[str, str]) -> None:
    """This scenario's HEADROOM_TEST_* switches (the tasks read them when built), and no other
    scenario's."""
    def switches() -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k.startswith("HEADROOM_TEST_") and k != "HEADROOM_TEST_HANG_DUMP"}

    def replace(new: dict[str, str]) -> None:
        for k in switches():
            del os.environ[k]
        os.environ.update(new)
    undo.callback(replace, switches())
    replace(values)


def fresh_group_names(index: int) -> None:
    """Scenario `index`'s process group under its own keys in torchrun's store, and no cached
    DTensor plan holding the last scenario's device mesh. Destroying the default group resets
    torch's group counter, so a second group would read the first one's keys (the peers' old,
    closed addresses: "Connection refused"); and the sharding caches key on meshes by value, so
    an equal mesh of this scenario would get results naming the last one's destroyed group."""
    from torch.distributed.tensor import _redistribute
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    distributed_c10d._world.group_count = 1000 * index
    _clear_sharding_prop_cache()
    _redistribute._gen_transform_infos.cache_clear()


def main() -> None:
    scenarios = json.load(open(sys.argv[1]))
    hang = os.environ.get("HEADROOM_TEST_HANG_DUMP")
    for index, scenario in enumerate(scenarios):
        if hang:  # a rank stuck this long in one scenario prints every thread's stack and exits
            faulthandler.dump_traceback_later(float(hang), exit=True)  # (its watchdog thread is counted below)
        started, cpu = time.monotonic(), time.process_time()
        fresh_group_names(index)
        with ExitStack() as undo:
            run_scenario(undo, scenario["out"], {k: str(v) for k, v in scenario["opts"].items()}, scenario["env"])
        gc.collect()  # this scenario's trainer and model go now, not during the next one
        print(f"rank {os.environ['RANK']}: {os.path.basename(scenario['out'])} took {time.monotonic() - started:.1f} s, "
              f"{time.process_time() - cpu:.1f} s of CPU", file=sys.stderr, flush=True)


class ModelCalls:
    """With count_hook=1: for each micro-batch of the current step, whether the user's forward ran
    inside DistributedDataParallel's forward and whether that forward would sync gradients
    (False under no_sync); and how many DDP wrappers were built."""

    def __init__(self) -> None:
        self.depth, self.sync, self.wrappers = 0, None, 0
        self.micro: list[dict] = []

    def hook(self, undo: ExitStack) -> None:
        calls = self
        original_forward = DistributedDataParallel.forward
        original_init = DistributedDataParallel.__init__
        user_forward = varlen_task.TinyLM.forward

        def init(self, *a, **k):
            calls.wrappers += 1
            original_init(self, *a, **k)

        def forward(self, *a, **k):
            calls.depth += 1
            calls.sync = bool(self.require_backward_grad_sync)
            try:
                return original_forward(self, *a, **k)
            finally:
                calls.depth -= 1

        def model_forward(self, x):
            if self.training:
                calls.micro.append(dict(inside_ddp=calls.depth > 0, sync=calls.sync if calls.depth else None,
                                        dtensor=type(self.head.weight).__name__))
            return user_forward(self, x)

        patch(undo, DistributedDataParallel, "__init__", init)
        patch(undo, DistributedDataParallel, "forward", forward)
        patch(undo, varlen_task.TinyLM, "forward", model_forward)


def negative_controls(undo: ExitStack, opts: dict[str, str]) -> None:
    """Each one this scenario names: the engine without one piece, which the tests show matters."""
    if opts.get("no_buffer_sync") == "1":
        # No buffers from rank 0 after each window.
        import engine.distributed.strategy as ST
        patch(undo, ST.Replicated, "after_window", lambda self: None)
    if opts.get("no_sum_hook") == "1":
        # DDP's default hook, which averages the buckets over the ranks.
        patch(undo, DistributedDataParallel, "register_comm_hook", lambda self, state, hook: None)
    if opts.get("no_share") == "1":
        # Each rank keeps the model it built (no rank 0 values at the start).
        patch(undo, distributed, "share_rank0_model", lambda model, ctx, device: None)
    if opts.get("local_count") == "1":
        # Normalise by each rank's own count, not the all-reduced one.
        patch(undo, distributed, "all_reduce_sum", lambda t, ctx: t)
    if opts.get("local_norm") == "1":
        # fsdp's norm of this rank's shards alone, not over all ranks.
        import engine.distributed.fsdp as FS
        patch(undo, FS.Fsdp, "global_norms", lambda self, per_param: per_param)


def run_folder(out: str, opts: dict[str, str]) -> str:
    return os.path.join(out, opts.get("run", "run"))  # an absolute `run` stands alone


def train_config(out: str, opts: dict[str, str]) -> TrainConfig:
    extra: dict = {}
    for key in ("checkpoint_every", "max_steps"):
        if key in opts:
            extra[key] = int(opts[key])
    if "checkpoint_every" in opts:
        extra["keep_checkpoints"] = 100
    for key in ("nonfinite", "fork", "strategy", "fsdp_reduce"):
        if key in opts:
            extra[key] = opts[key]
    if "find_micro_batch" in opts:
        extra.update(find_micro_batch=True, effective_batch=int(opts["find_micro_batch"]))
    run_dir = run_folder(out, opts)
    if opts.get("resume") == "1":
        extra["resume"] = run_dir
    return TrainConfig(task=TASKS[opts.get("task", "varlen")][0], micro_batch=int(opts.get("micro", 2)),
                       accum=int(opts.get("accum", 2)), epochs=int(opts.get("epochs", 1)), lr=float(opts.get("lr", 0.05)),
                       clip=float(opts.get("clip", 0.0)), run_dir=run_dir, device="cpu", seed=3, **extra)


def run_scenario(undo: ExitStack, out: str, opts: dict[str, str], env: dict[str, str]) -> None:
    rank = int(os.environ["RANK"])
    opts.update({k: str(v[rank]) for k, v in json.loads(opts.get("by_rank", "{}")).items()})
    threads_before = os_threads()  # before the process group: gloo's threads must be gone again after the run
    switches = dict(env)
    if "samples" in opts:
        switches["HEADROOM_TEST_SAMPLES"] = opts["samples"]
    if opts.get("momentum") == "1":
        switches["HEADROOM_TEST_MOMENTUM"] = "1"
    set_env(undo, switches)
    model_calls = ModelCalls()
    if opts.get("count_hook") == "1":
        model_calls.hook(undo)
    negative_controls(undo, opts)
    cfg = train_config(out, opts)
    varlen_task._window[0] = 0
    if opts.get("refused") == "1":
        return refused(undo, out, cfg, opts, threads_before)
    trainer = Trainer(cfg, task=TASKS[opts.get("task", "varlen")][1].build_task(cfg.seed))
    undo.callback(signal.signal, signal.SIGTERM, signal.signal(signal.SIGTERM, lambda *_: trainer.request_stop()))
    log = []
    original_step = trainer.step_window
    calls = {"n": 0}

    def step(window):
        calls["n"] += 1  # nan_by_call=1: NaN by the window's place in the data, not the step counter
        varlen_task._window[0] = calls["n"] if opts.get("nan_by_call") == "1" else trainer.step + 1
        skipped_before = trainer.nonfinite_steps
        model_calls.micro.clear()
        trained = original_step(window)  # on CPU a step's numbers are resolved at once
        model = trainer.model
        local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
        log.append(dict(step=trainer.step, epoch=trainer.epoch, micro=trainer.settings.micro_batch,
                        accum=trainer.settings.accum, lr=trainer.settings.lr, micro_batches=list(model_calls.micro),
                        ddp_wrappers=model_calls.wrappers, local_numel=local,
                        total_numel=sum(p.numel() for p in model.parameters()),
                        nonfinite=trainer.nonfinite_steps > skipped_before if trained else None,
                        wsum=float(sum((p.to_local() if hasattr(p, "to_local") else p).detach().double().sum()
                                       for p in model.parameters()))))
        return trained

    trainer.step_window = step
    weights: dict = {}
    original_shutdown = distributed.shutdown

    wrappers_at_shutdown = []

    def shutdown(ctx, clean=True):  # the whole weights while the process group still lives
        if clean and dist.is_initialized():
            weights.update(full_state(trainer.model))
        # DDP's reducer holds the group too: dropped after the group, its destructor joins gloo's
        # threads with the GIL held, and hangs when one of them waits for the GIL (seen in CI)
        wrappers_at_shutdown.extend(o for o in gc.get_objects() if isinstance(o, DistributedDataParallel))
        original_shutdown(ctx, clean)

    patch(undo, distributed, "shutdown", shutdown)
    trainer.run()
    assert not dist.is_initialized()
    assert not wrappers_at_shutdown, "a DDP wrapper still lived when the process group was torn down"
    # The run released the process group for real (the DDP wrapper holds it): no gloo thread
    # lives on into the interpreter's exit, where one that frees a tensor aborts the process.
    # (Not under fsdp: FSDP2's parameter groups keep the process group, and gloo's 3 threads, alive
    # until the process exits; every fsdp test checks that the job exits cleanly.)
    if opts.get("strategy") != "fsdp":
        left = threads_left(threads_before)
        assert left <= threads_before, f"{left} OS threads after the run, {threads_before} before"
    checkpoints = os.path.join(run_folder(out, opts), "checkpoints")
    # Written last: a scenario whose files exist passed every check above (the harness relies on it).
    torch.save(weights, os.path.join(out, f"weights-{rank}.pt"))
    with open(os.path.join(out, f"log-{rank}.json"), "w") as f:
        json.dump(dict(steps=log, checkpoints=sorted(os.listdir(checkpoints)) if os.path.isdir(checkpoints) else []),
                  f)


def refused(undo: ExitStack, out: str, cfg: TrainConfig, opts: dict[str, str], threads_before: int) -> None:
    """A run every rank must refuse while it is built: refused together, the process group torn
    down (no gloo thread left to abort the process at its exit), nothing in the run folder."""
    rank = int(os.environ["RANK"])
    undo.callback(signal.signal, signal.SIGTERM, signal.getsignal(signal.SIGTERM))  # a refusal ignores it
    try:
        Trainer(cfg, task=TASKS[opts.get("task", "varlen")][1].build_task(cfg.seed))
    except ConfigError as e:
        message = str(e)
    else:
        raise AssertionError(f"rank {rank}: the run was not refused")
    assert not dist.is_initialized(), f"rank {rank}: the refusal left the process group up"
    left = threads_left(threads_before)
    assert left <= threads_before, f"rank {rank}: {left} OS threads after the refusal, {threads_before} before"
    assert not os.path.exists(os.path.join(run_folder(out, opts), "run.db"))
    with open(os.path.join(out, f"refused-{rank}.txt"), "w") as f:
        f.write(message)
    torch.save({}, os.path.join(out, f"weights-{rank}.pt"))
    with open(os.path.join(out, f"log-{rank}.json"), "w") as f:
        json.dump(dict(steps=[], checkpoints=[]), f)


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def threads_left(expected: int, within: float = 5.0) -> int:
    """The OS threads once the joined ones are gone: Python's join() returns when a thread's
    state is released, a moment before the OS thread itself exits and leaves /proc (a loaded
    CI machine counted one more on rank 0, which alone has run.db's flusher thread: "2 after,
    1 before"). A thread that lives on is still counted after `within` seconds."""
    deadline = time.monotonic() + within
    while os_threads() > expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return os_threads()


if __name__ == "__main__":
    main()
