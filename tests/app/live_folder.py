"""A run folder this test process writes as a training engine would (its writer lock held, rows
committed as they come), without torch: the window follows it as a live run, here or through
tests/app/fake_ssh.py as one on another machine, and its commands land in its run.db."""
from __future__ import annotations

from pathlib import Path

from engine.declarations.events import StepMetrics
from engine.store import RunStore, runlock


def row(step: int, epoch: int = 1) -> StepMetrics:
    return StepMetrics(step, epoch, loss=2.0 / (1 + step / 20), grad_norm=1.0, clipped=False, lr=1e-3, accum=4,
                       clip=1.0, micro_batch=16, samples=64, tokens=64, step_time=0.01, throughput=1000.0,
                       nonfinite=False, scaler_skipped=False)


class LiveFolder:
    def __init__(self, run_dir: Path, steps: int = 20) -> None:
        run_dir.mkdir(parents=True)
        self.run_dir = str(run_dir)
        self.lock = runlock.acquire(self.run_dir)
        self.store = RunStore(self.run_dir, commit_interval=0.05)
        self.store.set_info(status="running", task="mlp", device="cpu",
                            config={"epochs": 400, "micro_batch": 16, "accum": 4, "lr": 1e-3, "clip": 1.0})
        self.steps = 0
        self.add(steps)

    def add(self, n: int) -> None:
        """n more steps, committed."""
        for s in range(self.steps + 1, self.steps + n + 1):
            self.store.record(row(s))
        self.steps += n
        assert self.store.commit()

    def end(self) -> None:
        self.store.set_info(status="stopped")
        self.store.close()
        self.lock.release()
