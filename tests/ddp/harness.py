"""Launching the engine under torchrun on CPU (gloo) for the tests, and the one-process reference.

Cheap to import: the first test phase collects tests/ddp on every xdist worker (the `ddp` marker
deselects these tests only after collection), so torch and the engine load inside the functions
that need them, not here.

One torchrun launch costs each rank seconds of imports before it trains for a fraction of that:
`torchrun_scenarios` trains several independent runs in one launch (tests/ddp/worker.py), and
tests/ddp/conftest.py shares such a launch between the tests of every file that only read
their results. A launch's scenarios run one after another: one that fails ends the job, and
the tests of those after it fail too, each showing the job's output.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Optional

from testkit import ROOT

if TYPE_CHECKING:
    import torch

    Weights = dict[str, torch.Tensor]


def torchrun(n: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n)]


TORCHRUN = torchrun(2)


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("HEADROOM_TEST_")}
    e.update(extra)
    e["PYTHONPATH"] = str(ROOT)
    return e


@dataclass(frozen=True)
class Scenario:
    """One run of tests/ddp/worker.py: its options (see the worker's docstring), the
    HEADROOM_TEST_* switches of tests/ddp/varlen_task.py it runs under, and optionally a command
    to send through its run.db once it has logged so many steps (while the launch runs)."""
    opts: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    send: Optional[tuple[int, Any]] = None


def scenario(env: Optional[Mapping[str, str]] = None, send: Optional[tuple[int, Any]] = None, **opts: Any) -> Scenario:
    return Scenario(opts, env or {}, send)


class Ran(NamedTuple):
    """What every rank of one scenario saw: its steps (worker.py's log), its whole weights at the
    end, and the names in its run's checkpoints folder when it ended."""
    logs: list[list[dict[str, Any]]]
    weights: list[Weights]
    checkpoints: list[str]
    out: Path


class Launch:
    """The scenarios of one torchrun launch, by name. A scenario's results exist only if it passed
    the worker's own checks; each is handed out only if the whole job also exited cleanly (the
    gloo teardown at the interpreter's exit is part of what every test checks)."""

    def __init__(self, outs: dict[str, Path], nproc: int, returncode: int, output: str,
                 unsent: frozenset[str] = frozenset()) -> None:
        self.outs, self.nproc, self.returncode, self.output, self.unsent = outs, nproc, returncode, output, unsent

    def __getitem__(self, name: str) -> Ran:
        import torch
        assert name in self.outs, f"scenario {name!r} was not in this launch (its set-up failed?)"
        assert name not in self.unsent, f"scenario {name!r} never logged the steps to get its command"
        out = self.outs[name]
        logs = [out / f"log-{rank}.json" for rank in range(self.nproc)]
        assert all(p.exists() for p in logs), f"scenario {name!r} did not finish:\n{self.output[-6000:]}"
        assert self.returncode == 0, f"scenario {name!r} finished, the job did not:\n{self.output[-6000:]}"
        saved = [json.loads(p.read_text()) for p in logs]
        weights = [torch.load(out / f"weights-{rank}.pt", weights_only=True) for rank in range(self.nproc)]
        return Ran([s["steps"] for s in saved], weights, saved[0]["checkpoints"], out)

    def within(self, group: str) -> Launch:
        """The scenarios named `group/...`, by the rest of their names (tests/ddp/conftest.py
        names each test file's scenarios after the file)."""
        prefix = group + "/"
        return Launch({n[len(prefix):]: p for n, p in self.outs.items() if n.startswith(prefix)}, self.nproc,
                      self.returncode, self.output, frozenset(n[len(prefix):] for n in self.unsent if n.startswith(prefix)))


def group(module_name: str) -> str:
    """The name under which tests/ddp/conftest.py launches a test file's scenarios: the file's."""
    return module_name.rsplit(".", 1)[-1]


def worker_args(base: Path, scenarios: Mapping[str, Scenario]) -> tuple[list[str], dict[str, Path]]:
    """tests/ddp/worker.py's arguments (after torchrun's own) for training `scenarios` in turn,
    each in base/<name> (its run folder base/<name>/run unless its `run` option says otherwise),
    and those folders by name."""
    outs = {name: base / name for name in scenarios}
    for out in outs.values():
        out.mkdir(parents=True, exist_ok=True)
    spec = base / "scenarios.json"
    spec.write_text(json.dumps([dict(out=str(outs[name]), opts=dict(s.opts), env=dict(s.env))
                                for name, s in scenarios.items()]))
    return [os.path.join(ROOT, "tests", "ddp", "worker.py"), str(spec)], outs


def worker_launch(base: Path, scenarios: Mapping[str, Scenario], nproc: int = 2) -> tuple[list[str], dict[str, Path]]:
    """torchrun's command line for worker_args(base, scenarios) on `nproc` ranks, and the folders."""
    args, outs = worker_args(base, scenarios)
    return torchrun(nproc) + args, outs


SCENARIO_TIMEOUT = 150  # s: a rank stuck this long in one scenario prints its threads' stacks and exits


class Running:
    """worker_launch(base, scenarios, nproc) started; `finish()` sends the scenarios' commands as
    their runs get to them, then waits for the job. Leaving the `with` block kills whatever of
    the job still runs (its own process group)."""

    def __init__(self, base: Path, scenarios: Mapping[str, Scenario], nproc: int = 2) -> None:
        args, self.outs = worker_launch(base, scenarios, nproc)
        self.nproc = nproc
        self.sends = {name: (self.outs[name] / str(s.opts.get("run", "run")), *s.send)
                      for name, s in scenarios.items() if s.send}
        self.deadline = time.monotonic() + 60 + SCENARIO_TIMEOUT * len(scenarios)
        self.output = base / "output.txt"  # a file, not a pipe nobody reads while the job runs
        with open(self.output, "w") as f:
            self.proc = subprocess.Popen(args, cwd=ROOT, env=env(HEADROOM_TEST_HANG_DUMP=str(SCENARIO_TIMEOUT)),
                                         stdout=f, stderr=subprocess.STDOUT, start_new_session=True)

    def finish(self) -> Launch:
        unsent = frozenset(name for name, (run_dir, steps, command) in self.sends.items()
                           if not send_once_logged(run_dir, steps, command, self.proc))
        self.proc.wait(timeout=max(1.0, self.deadline - time.monotonic()))
        return Launch(self.outs, self.nproc, self.proc.returncode, self.output.read_text(errors="replace"), unsent)

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def send_once_logged(run_dir: Path, steps: int, command: Any, proc: subprocess.Popen) -> bool:
    """Send `command` through run.db once the run there has logged `steps` steps; False if the
    job ended (or a scenario's time went by) first."""
    from engine.store import RunReader, send_command

    def logged() -> bool:
        try:
            return len(RunReader(str(run_dir)).metrics()) >= steps
        except Exception:  # no run.db yet, or not its tables
            return False
    deadline = time.monotonic() + SCENARIO_TIMEOUT
    while not logged():
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    send_command(str(run_dir), command)
    return True


def torchrun_scenarios(base: Path, scenarios: Mapping[str, Scenario], nproc: int = 2) -> Launch:
    """worker_launch(base, scenarios, nproc), run to its end."""
    with Running(base, scenarios, nproc) as running:
        return running.finish()


def single_process(run_dir: Path, micro: int = 8, accum: int = 1, epochs: int = 1, samples: int = 64,
                   momentum: bool = False, clip: float = 0.0, task: str = "varlen", **extra: Any) -> Weights:
    """The reference: one process, no torchrun, on the same data (tests/ddp/varlen_task.py or,
    task="config", config_task.py)."""
    from engine.declarations.config import TrainConfig
    from engine.trainer.trainer import Trainer
    from tests.ddp import config_task, varlen_task

    old = {k: os.environ.get(k) for k in ("HEADROOM_TEST_SAMPLES", "HEADROOM_TEST_MOMENTUM")}
    os.environ["HEADROOM_TEST_SAMPLES"] = str(samples)
    if momentum:
        os.environ["HEADROOM_TEST_MOMENTUM"] = "1"
    try:
        cfg = TrainConfig(task=task, micro_batch=micro, accum=accum, epochs=epochs, lr=0.05, clip=clip,
                          device="cpu", seed=3, run_dir=str(run_dir), **extra)
        build = {"varlen": varlen_task, "config": config_task}[task].build_task
        t = Trainer(cfg, task=build(cfg.seed))
        t.run()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {k: v.detach() for k, v in t.model.state_dict().items()}


def exit_codes(torchrun_stderr: str) -> list[int]:
    """Each failed rank's exit code, from torchrun's summary (a rank that exited 0 is not listed)."""
    return [int(c) for c in re.findall(r"^\s*exitcode\s*:\s*(-?\d+) \(pid", torchrun_stderr, re.MULTILINE)]


def max_diff(a: Weights, b: Weights) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)
